"""Each notebook runs alone, Colab-like: the course wheel in a fresh environment, no repository.

Colab gives a student a Python with torch and nothing of ours; the notebook's set-up cell must
find everything else in the installed package. So this builds the course package as a wheel,
installs it into a fresh virtual environment that has only the pinned CPU torch, the package's
own dependencies and the kernel machinery (ipykernel, nbclient), copies one notebook into an
empty temporary folder and runs it there, top to bottom, in that environment's own kernel. A
notebook that reads a file from the checkout, or needs something the wheel does not carry or
declare, fails here.

The environment is built once per session (about a minute); every notebook then runs in it.
Leave these out locally with `-m "not colab"`; the README's test command runs them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import nbformat
import pytest
from notebook_tools import notebook_paths

pytestmark = pytest.mark.colab

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "constraints.txt"
# Not part of the wheel, and large or irrelevant: left out of the copy the wheel is built from.
NOT_SOURCE = shutil.ignore_patterns(
    ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".hypothesis", ".ruff_cache",
    ".pytest_cache", ".ipynb_checkpoints", "screenshots", "notebooks")

# Runs inside the fresh environment: execute one notebook in a kernel of that environment (the
# "python3" kernel there is its own Python), working directory = the notebook's folder. A last
# probe cell, not saved with the notebook, reports where the kernel found its Python and helpers.
RUNNER = r'''
import json, sys
from pathlib import Path
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

path = Path(sys.argv[1])
nb = nbformat.read(path, as_version=4)
nb.cells.append(nbformat.v4.new_code_cell(
    "import json as _j, sys as _s, helpers as _h\n"
    "print('PROBE' + _j.dumps({'executable': _s.executable, 'helpers': _h.__file__}))"))
client = NotebookClient(nb, timeout=600, kernel_name="python3",
                        resources={"metadata": {"path": str(path.parent)}})
status = 0
try:
    client.execute()
except CellExecutionError as error:
    print(str(error)[-4000:], file=sys.stderr)
    status = 1
nbformat.write(nb, path.with_name("executed.ipynb"))
sys.exit(status)
'''


def load_course_module():
    spec = importlib.util.spec_from_file_location("course_commands", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clean_environment(env_dir: Path, home: Path) -> dict[str, str]:
    """This process's environment minus whatever could smuggle the checkout in."""
    env = {key: value for key, value in os.environ.items()
           if key not in {"PYTHONPATH", "VIRTUAL_ENV", "MPLBACKEND", "PYTHONHOME", "JUPYTER_PATH"}
           and not key.startswith("JUPYTER_")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(env_dir)
    env["PYTHONNOUSERSITE"] = "1"
    # Kernel specs, config and runtime files of this environment only, not the user's.
    for name in ("config", "data", "runtime"):
        (home / name).mkdir(parents=True, exist_ok=True)
        env[f"JUPYTER_{name.upper()}_DIR"] = str(home / name)
    return env


def pip(python: Path, env: dict, *args: str) -> None:
    command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def torch_requirement() -> str:
    """The torch this checkout's tests run with, e.g. torch==2.13.0+cpu: the pinned CPU build.

    Pinning the local version label (+cpu) means pip finds that build or fails; it never falls
    back to PyPI's several-GB CUDA build.
    """
    return f"torch=={importlib.metadata.version('torch')}"


@pytest.fixture(scope="module")
def colab_like(tmp_path_factory) -> dict:
    """A fresh virtual environment with only torch, the course wheel and its dependencies."""
    base = tmp_path_factory.mktemp("colab-like")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    wheels = base / "wheels"
    # Build with this environment's setuptools when it has one (Python 3.11's venv does: no
    # download), else in pip's isolated build environment.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q",
                            "--disable-pip-version-check", "-w", str(wheels), str(source)],
                           cwd=base, capture_output=True, text=True)
    assert built.returncode == 0, f"building the wheel failed:\n{built.stderr[-3000:]}"
    (wheel,) = wheels.glob("transformer_course-*.whl")

    env_dir = base / "env"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / ("Scripts" if sys.platform == "win32" else "bin") / "python"
    env = clean_environment(env_dir, base / "jupyter")
    # torch first and alone, as course.py does: then the wheel's loose torch>=2.2 is satisfied.
    pip(python, env, "-c", str(CONSTRAINTS), torch_requirement(), *load_course_module().cpu_torch_index())
    pip(python, env, "-c", str(CONSTRAINTS), str(wheel), "ipykernel", "nbclient")

    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=json",
                             "--disable-pip-version-check"], env=env, capture_output=True,
                            text=True, check=True)
    installed = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout)}
    return {"python": python, "env": env, "dir": env_dir, "installed": installed, "base": base}


def test_the_environment_is_fresh_and_cpu_only(colab_like):
    installed = colab_like["installed"]
    assert "transformer-course" in installed
    assert installed["torch"] == importlib.metadata.version("torch")
    assert not [name for name in installed if name.startswith("nvidia-")], "CUDA libraries crept in"
    for tool in ("pytest", "nbval", "jupyterlab", "hypothesis", "ruff"):
        assert tool not in installed, f"{tool} is a test tool, not something Colab has"
    check = subprocess.run([str(colab_like["python"]), "-m", "pip", "check"],
                           env=colab_like["env"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


@pytest.mark.parametrize("notebook", notebook_paths(), ids=lambda path: path.stem)
def test_notebook_runs_alone_from_the_installed_package(notebook, colab_like, tmp_path):
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy2(notebook, alone / notebook.name)
    runner = tmp_path / "run_notebook.py"  # outside the notebook's folder
    runner.write_text(RUNNER)
    result = subprocess.run([str(colab_like["python"]), str(runner), str(alone / notebook.name)],
                            cwd=alone, env=colab_like["env"], capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, (
        f"{notebook.stem} failed when run alone against the installed wheel:\n{result.stderr[-5000:]}")

    executed = nbformat.read(alone / "executed.ipynb", as_version=4)
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code), "every cell ran"
    errors = [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert not errors, errors

    setup_output = "".join(o.get("text", "") for o in code[0].outputs if o.output_type == "stream")
    assert "seed: 0" in setup_output and "device: " in setup_output, (
        f"the set-up cell printed {setup_output!r}")
    probe_text = "".join(o.get("text", "") for o in code[-1].outputs if o.output_type == "stream")
    probe = json.loads(probe_text.split("PROBE", 1)[1])
    env_dir = Path(os.path.realpath(colab_like["dir"]))
    kernel_python = Path(probe["executable"])  # a link to the base Python: compare its folder
    assert Path(os.path.realpath(kernel_python.parent)).is_relative_to(env_dir), (
        f"the kernel ran {kernel_python}, not the fresh environment's Python")
    helpers_file = Path(os.path.realpath(probe["helpers"]))
    assert helpers_file.is_relative_to(env_dir) and "site-packages" in helpers_file.parts, (
        f"helpers came from {helpers_file}, not from the installed wheel")
