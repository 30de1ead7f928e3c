"""Offline, proven: the network switch (tests/offline) refuses what leaves the machine and keeps
loopback open, a notebook that reaches out fails under it, `course.py test` runs every notebook
with it, the website builds with it, and the website's external links are listed and answer."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers.lab.setup_cell import COURSE_REPO

ROOT = Path(__file__).resolve().parents[2]
GUARD = ROOT / "tests" / "offline"
LINKS = ROOT / "tests" / "course" / "site_links.txt"


def load_course_module():
    spec = importlib.util.spec_from_file_location("course_offline", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course = load_course_module()

REACH_OUT = """
import socket, urllib.request
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
socket.create_connection(server.getsockname(), timeout=5).close()
print("loopback open")
for attempt in (lambda: socket.create_connection(("192.0.2.123", 443), timeout=1),
                lambda: socket.getaddrinfo("pypi.org", 443),
                lambda: urllib.request.urlopen("https://pypi.org/simple/", timeout=1)):
    try:
        attempt()
        print("reached")
    except OSError as error:
        print("refused:", error)
"""


def test_the_switch_refuses_connections_and_lookups_outside_and_logs_each(tmp_path):
    log = tmp_path / "attempts.log"
    env = course.offline_env(dict(os.environ), log)
    result = subprocess.run([sys.executable, "-c", REACH_OUT], env=env, capture_output=True,
                            text=True, timeout=60)
    lines = result.stdout.splitlines()
    assert lines[0] == "loopback open", result.stderr
    assert len(lines) == 4 and all(line.startswith("refused:") and "the network is switched off"
                                   in line for line in lines[1:]), lines
    written = log.read_text()
    assert "connect to ('192.0.2.123', 443)" in written and "name lookup of 'pypi.org'" in written


def test_the_switch_is_on_exactly_where_its_folder_is_on_the_python_path(tmp_path):
    """The check above is about the switch: without its folder, socket.connect is Python's own."""
    code = "import socket; print(type(socket.socket.connect).__name__)"
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    switched = course.offline_env(plain, tmp_path / "log")
    kinds = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                            timeout=60).stdout.strip() for env in (plain, switched)]
    assert kinds == ["method_descriptor", "function"]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_the_switch_holds_for_node_programs_too(tmp_path):
    log = tmp_path / "attempts.log"
    script = ('const net = require("net");'
              'const server = net.createServer(c => c.end()).listen(0, "127.0.0.1", () => {'
              '  net.connect(server.address().port, "127.0.0.1", () => { console.log("loopback open");'
              '    require("https").get("https://registry.npmjs.org/").on("error", e => {'
              '      console.log("refused: " + e.message); server.close(); }); }); });')
    result = subprocess.run(["node", "-e", script], env=course.offline_env(dict(os.environ), log),
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.splitlines() == [
        "loopback open", "refused: the network is switched off in this run (tests/offline): "
        "connect to registry.npmjs.org"], result.stderr
    assert "connect to registry.npmjs.org" in log.read_text()


def test_a_notebook_cell_that_reaches_out_fails_with_the_network_off(tmp_path):
    """What `course.py test`'s second pass relies on: a kernel started with the switch's
    environment has no network, and a cell that catches the error is still logged."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("import socket\ntry:\n    socket.create_connection(('pypi.org', 443))\n"
                                  "except OSError:\n    pass  # caught, yet logged"),
        nbformat.v4.new_code_cell("import urllib.request\nurllib.request.urlopen('https://pypi.org')"),
    ]
    log = tmp_path / "attempts.log"
    saved = dict(os.environ)
    os.environ.update(course.offline_env(saved, log))  # the kernel inherits this process's environment
    try:
        client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3")
        with pytest.raises(nbclient.exceptions.CellExecutionError, match="network is switched off"):
            client.execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert log.read_text().count("name lookup of 'pypi.org'") == 2


def test_the_test_command_runs_every_notebook_a_second_time_with_the_network_off(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(course, "ensure_environment", lambda extras: None)
    monkeypatch.delenv("COURSE_TEST_NESTED", raising=False)
    monkeypatch.setattr(course, "NETWORK_LOG", tmp_path / "attempts.log")
    monkeypatch.setattr(course.subprocess, "call", lambda args, cwd, env: calls.append((args, env)) or 0)
    monkeypatch.setattr(course, "finished_pytest", lambda args, env: calls.append((args, env)) or 0)
    assert course.test([]) == 0
    (_, first_env), (other, other_env) = calls[1], calls[2]
    assert other[-len(course.PYTEST_OTHER_CPU):] == course.PYTEST_OTHER_CPU and "notebooks" in other
    assert str(GUARD) in other_env["PYTHONPATH"].split(os.pathsep)
    assert str(GUARD / "no_network.cjs") in other_env["NODE_OPTIONS"]
    assert other_env["COURSE_NETWORK_LOG"] == str(tmp_path / "attempts.log")
    assert "COURSE_NETWORK_LOG" not in first_env, "the unit tests may install packages: network on"


def test_the_test_command_fails_when_a_notebook_reached_out_even_if_every_cell_passed(monkeypatch, tmp_path, capsys):
    log = tmp_path / "attempts.log"

    def call(args, cwd, env):
        if "COURSE_NETWORK_LOG" in env:
            Path(env["COURSE_NETWORK_LOG"]).write_text("pid 1: name lookup of 'pypi.org'\n")
        return 0

    monkeypatch.setattr(course, "ensure_environment", lambda extras: None)
    monkeypatch.delenv("COURSE_TEST_NESTED", raising=False)
    monkeypatch.setattr(course, "NETWORK_LOG", log)
    monkeypatch.setattr(course.subprocess, "call", call)
    monkeypatch.setattr(course, "finished_pytest", lambda args, env: call(args, None, env))
    assert course.test([]) == 1
    assert "name lookup of 'pypi.org'" in capsys.readouterr().out
    log.write_text("an earlier run's attempt\n")
    monkeypatch.setattr(course.subprocess, "call", lambda args, cwd, env: 0)
    monkeypatch.setattr(course, "finished_pytest", lambda args, env: 0)
    assert course.test([]) == 0, "the log starts empty on every run"


def test_the_switch_keeps_an_earlier_python_path_and_node_options(tmp_path):
    env = course.offline_env({"PYTHONPATH": "/a b/c", "NODE_OPTIONS": "--max-old-space-size=512"},
                             tmp_path / "log", guard=Path("/course with spaces/tests/offline"))
    assert env["PYTHONPATH"].split(os.pathsep) == ["/course with spaces/tests/offline", "/a b/c"]
    assert env["NODE_OPTIONS"] == ('--require "/course with spaces/tests/offline/no_network.cjs" '
                                   "--max-old-space-size=512")


@pytest.fixture(scope="module")
def offline_site(tmp_path_factory):
    """The instructor's website, built by `course.py site` with the network switched off."""
    if course.find_myst() is None or (course.node_major() or 0) < 18:
        pytest.skip("the site needs mystmd (pip install .[site]) and Node.js 18+")
    target, log = tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("log") / "attempts.log"
    env = course.offline_env({k: v for k, v in os.environ.items() if k != "npm_config_registry"}, log)
    result = subprocess.run([sys.executable, str(ROOT / "course.py"), "site", str(target)], env=env,
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    return target / "_build" / "html", result, log


def test_the_site_builds_with_the_network_off(offline_site):
    html, result, log = offline_site
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (html / "index.html").exists()
    assert not log.exists(), f"the site build tried to reach the network:\n{log.read_text()[:3000]}"


def shown_links(html: Path) -> set[str]:
    return {link for page in html.rglob("*.html")
            for link in re.findall(r'(?:href|src)="(https?://[^"]+)"', page.read_text(encoding="utf-8"))}


def listed_links() -> list[str]:
    return [line for line in LINKS.read_text().splitlines() if line and not line.startswith("#")]


def own_links() -> set[str]:
    """The course's Colab links, one per notebook, at the address `course.py publish` writes."""
    slug = COURSE_REPO.removeprefix("https://github.com/")
    return {f"https://colab.research.google.com/github/{slug}/blob/main/notebooks/{path.name}"
            for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}


def test_every_external_link_the_site_shows_is_listed(offline_site):
    html, result, _ = offline_site
    assert result.returncode == 0
    shown, listed = shown_links(html), set(listed_links())
    assert own_links() <= shown, "every notebook's page links to Colab"
    others = shown - own_links()
    assert others - listed == set(), f"add these to {LINKS.name}: {sorted(others - listed)}"
    assert listed - others == set(), f"no page shows these any more: {sorted(listed - others)}"


def online() -> bool:
    """True where the open internet answers (not only a package mirror): a link that does not
    answer then is a dead link, not a closed network."""
    for host in ("example.com", "www.wikipedia.org"):
        try:
            socket.create_connection((host, 443), timeout=3).close()
        except OSError:
            continue
        return True
    return False


def answers(link: str) -> int:
    """The HTTP status `link` answers with (following redirects)."""
    request = urllib.request.Request(link, headers={"User-Agent": "course-link-check"})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.parametrize("link", sorted({*listed_links(), *own_links()}))
def test_each_link_the_site_shows_answers(link):
    if not online():
        pytest.skip("offline: the link check needs the internet")
    if link in own_links():
        # Colab answers any address; what must exist is the notebook on GitHub it opens.
        if answers(COURSE_REPO) == 404:
            pytest.skip(f"{COURSE_REPO} is not published yet (README: 'they do not work yet')")
        link = link.replace("https://colab.research.google.com/github/", "https://github.com/")
    assert answers(link) < 400, f"{link} does not answer"
