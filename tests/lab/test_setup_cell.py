"""Every notebook's first cell (helpers/lab/setup_cell.py), run as a Jupyter opened anywhere would.

Each run is a fresh Python started in the notebook's folder (its working directory, as Jupyter's
kernel has it), executing the cell's text: beside a course folder it uses that folder's
`helpers/`; with a stray `helpers.py` or `helpers/` in the way it stops and names it; with no
course anywhere it says the command that makes it work; at the placeholder address it installs
nothing, once published it installs from the published address.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.lab.setup_cell import COURSE_REPO, PLACEHOLDER_REPO, SETUP_CELL, setup_cell

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = "https://github.com/alice/my-course"
PROBE = "\nimport helpers\nprint('HELPERS', helpers.__file__)"


def run_cell(cell: str, folder: Path, *flags: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    """`cell` run by a fresh `python` whose working directory (and sys.path[0]) is `folder`."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "MPLBACKEND")}
    env["MPLBACKEND"] = "Agg"
    return subprocess.run([python, *flags, "-c", cell + PROBE], cwd=folder, capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def course_copy(tmp_path_factory) -> Path:
    """A course folder as a student gets it (its helpers/ and a notebooks/ folder), elsewhere."""
    folder = tmp_path_factory.mktemp("handout") / "course"
    shutil.copytree(ROOT / "helpers", folder / "helpers",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "notebooks" / "week1").mkdir(parents=True)
    return folder


def test_the_cell_is_at_most_five_lines_and_compiles_at_any_address():
    for repo in (PLACEHOLDER_REPO, PUBLISHED):
        cell = setup_cell(repo)
        assert len(cell.splitlines()) <= 5
        compile(cell, "<setup cell>", "exec")
    assert setup_cell() == SETUP_CELL and COURSE_REPO.startswith("https://github.com/")


@pytest.mark.parametrize("bad", ["alice/course", "https://gitlab.com/alice/course", None])
def test_the_cell_needs_a_github_address(bad):
    with pytest.raises(ValueError, match="repo must be a GitHub address"):
        setup_cell(bad)


def test_at_the_placeholder_address_the_cell_installs_nothing():
    cell = setup_cell(PLACEHOLDER_REPO)
    assert "pip install -q git+" not in cell and "os.system" not in cell
    assert PLACEHOLDER_REPO not in cell
    published = setup_cell(PUBLISHED)
    assert f"pip install -q git+{PUBLISHED}'" in published


@pytest.mark.parametrize("where", ["notebooks", "notebooks/week1"])
def test_beside_a_course_folder_the_cell_uses_its_helpers(course_copy, where):
    """A Jupyter (Anaconda, a JupyterHub) opened on the folder, nothing installed for it: the
    cell finds helpers/ by walking up from the notebook's folder, not the installed course."""
    ran = run_cell(SETUP_CELL, course_copy / where)
    assert ran.returncode == 0, ran.stderr
    assert "device: " in ran.stdout and "| seed: 0" in ran.stdout
    assert f"HELPERS {course_copy / 'helpers' / '__init__.py'}" in ran.stdout


def test_a_stray_helpers_py_in_the_working_folder_is_named(tmp_path):
    (tmp_path / "helpers.py").write_text("x = 1\n")
    ran = run_cell(SETUP_CELL, tmp_path)
    assert ran.returncode == 1
    assert f"{tmp_path / 'helpers.py'} hides the course's helpers: rename it" in ran.stderr


def test_a_stray_helpers_folder_is_named_and_a_course_folder_above_wins_over_it(tmp_path, course_copy):
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("")
    ran = run_cell(SETUP_CELL, tmp_path)
    assert ran.returncode == 1 and f"{tmp_path / 'helpers'}" in ran.stderr and "hides" in ran.stderr
    beside = course_copy / "notebooks" / "week1"
    (beside / "helpers.py").write_text("x = 1\n")
    try:
        ran = run_cell(SETUP_CELL, beside)
    finally:
        (beside / "helpers.py").unlink()
    assert ran.returncode == 0, ran.stderr
    assert f"HELPERS {course_copy / 'helpers' / '__init__.py'}" in ran.stdout


def test_with_no_course_anywhere_the_cell_says_the_command_that_makes_it_work(tmp_path):
    ran = run_cell(SETUP_CELL, tmp_path, "-S")  # -S: no site-packages, so no installed course
    assert ran.returncode == 1
    assert "no course folder (with helpers/) here or above, none installed" in ran.stderr
    assert "%pip install PATH/TO/COURSE" in ran.stderr
    assert "README" not in SETUP_CELL  # it names no README section a folder's README may lack


def test_a_published_cell_says_what_to_do_when_the_install_fails(tmp_path):
    """In Colab (no folder, nothing installed) the published cell installs; when pip fails it stops."""
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/pip-args\"\n"
                           "echo 'ERROR: repository not found' >&2\nexit 1\n")
    fake_python.chmod(0o755)
    cell = f"import sys; sys.executable = {str(fake_python)!r}\n" + setup_cell(PUBLISHED)
    ran = run_cell(cell, tmp_path, "-S")
    assert ran.returncode == 1
    assert f"installing {PUBLISHED} failed" in ran.stderr and "%pip install" in ran.stderr
    assert (tmp_path / "pip-args").read_text().split() == ["-m", "pip", "install", "-q",
                                                          f"git+{PUBLISHED}"]
