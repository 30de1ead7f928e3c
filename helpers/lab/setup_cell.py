"""The text of every notebook's first code cell, and the course's address it may install from.

Standard library only: `course.py publish` (which runs on a bare Python) reads this file to
rewrite the cell in every notebook when the course gets its public address. The cell works in
any Jupyter opened on the course folder or a student edition of it, `course.py lab`, Anaconda or
a JupyterHub alike: it walks up from the notebook's folder to the first folder that holds the
course's `helpers/` and puts that folder first on `sys.path`, so the notebook runs on the copy
beside it. Where there is none (a notebook opened alone, as in Colab) it uses an installed
course; once the course is published it installs it from GitHub, never from the placeholder
address. When the `helpers` it would import is not the course's (a student's `helpers.py`, or a
`helpers/` folder of theirs), it stops and names that file.
"""

from __future__ import annotations

# `course.py publish https://github.com/OWNER/REPO` rewrites this line: the one place the
# course's address is written.
COURSE_REPO = "https://github.com/transformer-course/transformer-course"
# The address the course names until it has a public home. Written in two halves on purpose:
# `publish` rewrites every literal address, and this one must stay the placeholder.
PLACEHOLDER_REPO = "https://github.com/" + "transformer-course/" + "transformer-course"


def setup_cell(repo: str = COURSE_REPO) -> str:
    """The set-up cell (at most 5 lines) for a course published at `repo`, a GitHub address.

    At the placeholder address the cell installs nothing: without a course folder above it and
    without an installed course, it says how to install the folder instead."""
    if not isinstance(repo, str) or not repo.startswith("https://github.com/"):
        raise ValueError(f"repo must be a GitHub address 'https://github.com/OWNER/REPO', got {repo!r}")
    find = 'importlib.util.find_spec("helpers")'
    missing = "no course folder (with helpers/) here or above, none installed"
    imports = "importlib.util, pathlib, sys"
    if repo != PLACEHOLDER_REPO:
        find += f""" or os.system(f'"{{sys.executable}}" -m pip install -q git+{repo}') == 0 and {find}"""
        missing = f"no course folder (with helpers/) here or above, and installing {repo} failed"
        imports = "importlib.util, os, pathlib, sys"
    return "\n".join([
        f"import {imports}  # set-up: use the course's helpers/ from this folder or one above it, "
        "else an installed one; seed; pick the device",
        "sys.path[:0] = [str(p) for p in (pathlib.Path.cwd(), *pathlib.Path.cwd().parents) "
        'if (p / "helpers/lab/environment.py").is_file()][:1]',
        f"spec = {find}",
        'why = None if spec and (pathlib.Path(str(spec.origin)).parent / "lab/environment.py").is_file() '
        'else f"{spec.origin or [*spec.submodule_search_locations][0]} hides the course\'s helpers: '
        'rename it, restart the kernel" if spec else "' + missing + ': open the notebook in the course '
        'folder, or run  %pip install PATH/TO/COURSE"',
        'device = sys.exit(why) if why else importlib.import_module("helpers.lab.environment").start(seed=0)',
    ])


SETUP_CELL = setup_cell()
