#!/usr/bin/env python3
"""The course's two commands, needing nothing but Python 3.10+:

    python3 course.py lab     # set up .venv (first time only) and open JupyterLab on notebooks/
    python3 course.py test    # set up .venv with the test tools and run the whole suite

Both create a virtual environment in `.venv`, install PyTorch first and then the course package
(editable) with pinned versions from `constraints.txt` (the environment the stored notebook
outputs were produced with), and skip the installation when nothing it depends on has changed.
Extra arguments after `test` go to pytest, e.g. `python3 course.py test -k tokenization`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
CONSTRAINTS = ROOT / "constraints.txt"
STAMP = VENV / ".course-installed"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")

# What `test` runs: lint, then the helpers' unit tests and strict nbval over every notebook in one
# pytest session (one summary line). No --nbval-lax: every stored output is compared.
LINT = ["-m", "ruff", "check", "helpers", "tests", "notebooks", "tools", "benchmarks", "data", "course.py"]
PYTEST = ["-m", "pytest", "tests", "notebooks", "--nbval", "--nbval-current-env",
          "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "-q", "-rfEs"]


def run(args: list[str | Path], **kwargs) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    subprocess.run([str(a) for a in args], check=True, cwd=ROOT, **kwargs)


CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"


def cpu_torch_index() -> list[str]:
    """Extra pip arguments that fetch PyTorch's CPU build on a Linux machine without a GPU.

    PyPI's Linux wheel of torch brings several GB of CUDA libraries. PyTorch's own CPU index avoids
    them; it is used only when it answers within a few seconds (offline mirrors and closed
    networks get plain pip, which then uses whatever torch they provide).
    """
    if sys.platform != "linux" or shutil.which("nvidia-smi"):
        return []
    try:
        socket.create_connection(("download.pytorch.org", 443), timeout=3).close()
    except OSError:
        return []
    return ["--extra-index-url", CPU_TORCH_INDEX]


def install_fingerprint() -> str:
    digest = hashlib.sha256()
    for path in (ROOT / "pyproject.toml", CONSTRAINTS):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def installed_extras() -> set[str]:
    """The extras the stamp says are installed, or none if the install files changed since."""
    if not STAMP.exists():
        return set()
    fingerprint, _, extras = STAMP.read_text().partition("\n")
    return set(extras.split(",")) if fingerprint == install_fingerprint() else set()


def ensure_environment(extras: str) -> None:
    """Create .venv and install the course into it, unless that was already done for `extras`.

    An install for more extras counts (after `test`, `lab` needs nothing new).
    """
    if not PYTHON.exists():
        print(f"Creating a virtual environment in {VENV.name}/ ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if set(extras.split(",")) <= installed_extras():
        return
    pip = [PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "-c", CONSTRAINTS]
    # PyTorch first, on its own: with the pinned CPU build already present, the course package's
    # loose `torch>=2.2` is satisfied and pip never goes looking for a multi-GB CUDA build.
    run([*pip, *cpu_torch_index(), "torch>=2.2"])
    run([*pip, "-e", f".[{extras}]"])
    STAMP.write_text(f"{install_fingerprint()}\n{extras}")


def lab(extra_args: list[str]) -> int:
    ensure_environment("lab")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and CI boxes often run as root
        extra_args = ["--allow-root", *extra_args]
    return subprocess.call([str(BIN / "jupyter"), "lab", "notebooks", *extra_args], cwd=ROOT)


def test(extra_args: list[str]) -> int:
    ensure_environment("lab,test,browser")
    # No MPLBACKEND here: the notebook kernels inherit this environment and must keep their
    # inline backend, whose figures are part of the stored outputs nbval compares.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("MPLBACKEND", None)
    lint = subprocess.call([str(PYTHON), *LINT], cwd=ROOT, env=env)
    suite = subprocess.call([str(PYTHON), *PYTEST, *extra_args], cwd=ROOT, env=env)
    return lint or suite


def main(argv: list[str]) -> int:
    commands = {"lab": lab, "test": test}
    if not argv or argv[0] not in commands:
        print(__doc__)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
