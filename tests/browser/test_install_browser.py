"""tools/install_browser.py: who may install Chromium, and when the browser suite asks or skips.

Not marked `browser`: no Chromium and no apt-get run here. The environment, the user's id, stdin
and `install` itself are replaced, so each test sees what would happen without doing it.
"""

from __future__ import annotations

import io

import pytest

from conftest import load_installer, terminal_question

installer = load_installer()


class Terminal(io.StringIO):
    """A stdin that is (or is not) a terminal, with the user's answer in it."""

    def __init__(self, answer: str = "", tty: bool = True) -> None:
        super().__init__(answer)
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def missing(monkeypatch, tmp_path):
    """Chromium missing at the default path, apt-get here, root; `install` recorded, not run."""
    monkeypatch.setattr(installer, "DEFAULT_CHROMIUM", tmp_path / "chromium")
    monkeypatch.delenv("COURSE_CHROMIUM", raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(installer.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(installer.os, "geteuid", lambda: 0)
    installs = []

    def install(quiet: bool = False) -> None:
        installs.append(quiet)
        (tmp_path / "chromium").write_text("")

    monkeypatch.setattr(installer, "install", install)
    return installs


def test_in_ci_a_missing_chromium_is_installed_without_asking(missing, monkeypatch):
    monkeypatch.setenv("CI", "true")
    asked = []
    path = installer.ensure_chromium(ask=lambda question: asked.append(question) or False)
    assert path.exists() and missing == [False] and asked == []


@pytest.mark.parametrize("ci", [None, "false", "1", ""])
def test_outside_ci_with_no_terminal_nothing_is_installed_and_the_message_names_the_command(
        missing, monkeypatch, ci):
    if ci is not None:
        monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(installer.sys, "stdin", Terminal("y\n", tty=False))
    with pytest.raises(installer.BrowserNotInstalled) as why:
        installer.ensure_chromium(ask=installer.ask_on_terminal)
    assert missing == []
    assert "skipped" in str(why.value) and "python3 tools/install_browser.py" in str(why.value)


@pytest.mark.parametrize(("answer", "installed"), [("y\n", True), ("YES\n", True), ("\n", False),
                                                    ("n\n", False), ("maybe\n", False), ("", False)])
def test_outside_ci_on_a_terminal_it_asks_and_installs_only_on_yes(missing, monkeypatch, capsys,
                                                                   answer, installed):
    monkeypatch.setattr(installer.sys, "stdin", Terminal(answer))
    if installed:
        assert installer.ensure_chromium(ask=installer.ask_on_terminal).exists()
    else:
        with pytest.raises(installer.BrowserNotInstalled, match="install_browser.py"):
            installer.ensure_chromium(ask=installer.ask_on_terminal)
    assert missing == ([False] if installed else [])
    question = capsys.readouterr().out
    assert "Install it now with apt-get" in question and question.rstrip().endswith("[y/N]")


def test_not_root_it_does_not_ask_and_names_sudo(missing, monkeypatch):
    monkeypatch.setattr(installer.os, "geteuid", lambda: 1000)
    asked = []
    with pytest.raises(installer.BrowserNotInstalled) as why:
        installer.ensure_chromium(ask=lambda question: asked.append(question) or True)
    assert asked == [] and missing == []
    assert "sudo python3 tools/install_browser.py" in str(why.value)


def test_as_root_the_command_needs_no_sudo(missing):
    with pytest.raises(installer.BrowserNotInstalled) as why:
        installer.ensure_chromium()  # nobody to ask: the fixture's case with no terminal
    assert "with: python3 tools/install_browser.py" in str(why.value)


def test_without_apt_get_it_says_to_point_course_chromium_at_one(missing, monkeypatch):
    monkeypatch.setattr(installer.shutil, "which", lambda name: None)
    with pytest.raises(installer.BrowserNotInstalled, match="COURSE_CHROMIUM"):
        installer.ensure_chromium(ask=lambda question: True)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(installer.BrowserMissing, match="COURSE_CHROMIUM") as why:
        installer.ensure_chromium()
    assert not isinstance(why.value, installer.BrowserNotInstalled)  # in CI: a failure
    assert missing == []


def test_running_the_script_is_consent(missing, capsys):
    assert installer.main() == 0
    assert missing == [False] and capsys.readouterr().out.strip().endswith("chromium")


def test_an_installed_chromium_is_used_as_it_is(missing, tmp_path):
    (tmp_path / "chromium").write_text("")
    assert installer.ensure_chromium(ask=lambda question: pytest.fail("asked")) == tmp_path / "chromium"
    assert missing == []


def test_a_course_chromium_that_is_not_there_is_an_error_not_an_install(missing, monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_CHROMIUM", str(tmp_path / "nowhere"))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(installer.BrowserMissing, match="COURSE_CHROMIUM=.*nowhere"):
        installer.ensure_chromium()
    assert missing == []


@pytest.mark.parametrize("value", ["true", "TRUE", "True"])
def test_ci_means_ci_true(value):
    assert installer.in_ci({"CI": value})
    assert not installer.in_ci({}) and not installer.in_ci({"CI": "false"})


def test_the_suite_asks_with_pytests_capture_suspended_then_resumes_it(pytestconfig, monkeypatch):
    """The question reaches the real terminal even though pytest captures stdin and stdout."""
    events = []
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    monkeypatch.setattr(capture, "suspend", lambda in_=False: events.append(("suspend", in_)))
    monkeypatch.setattr(capture, "resume", lambda: events.append("resume"))
    fake = type("Installer", (), {"ask_on_terminal": staticmethod(
        lambda question: events.append(question) or True)})
    assert terminal_question(pytestconfig, fake)("Install?") is True
    assert events == [("suspend", True), "Install?", "resume"]

