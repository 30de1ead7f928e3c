#!/usr/bin/env python3
"""The course's two commands, needing nothing but Python 3.10+:

    python3 course.py lab [DIR]   # set up .venv (first time only) and open JupyterLab on notebooks/ (or DIR)
    python3 course.py test        # set up .venv with the test tools and run the whole suite

and two for whoever changes the course's code (a contributor's loop; CI runs the whole `test`):

    python3 course.py check helpers/training/muon.py  # ruff on it, then the tests that mirror it
    python3 course.py test --package                  # lint and every test of the package: no notebooks,
                                                      # browsers, sections, nbgrader or tests marked slow

and three for instructors and whoever forks the course:

    python3 course.py student [--force] [DIR]  # the student edition to hand out; run again, it refreshes
                                               # it and keeps every file of the students'
    python3 course.py publish https://github.com/OWNER/REPO   # point Colab links and installs at it
    python3 course.py site [--student] [DIR]   # the website (default: _site/), needs `pip install .[site]`
    python3 course.py blank NOTEBOOK EXERCISE [--restore]  # live coding: live/NOTEBOOK.ipynb with
                                               # that one exercise blanked (or its answer put back)
    python3 course.py slides [NN ...] [--solutions]  # each notebook's reveal.js deck with speaker
                                               # notes, offline, in notebooks/slides/ (extra 'slides')

Both create a virtual environment in `.venv`, install PyTorch first and then the course package
(editable) with pinned versions from `constraints.txt` (the environment the stored notebook
outputs were produced with), and skip the installation when nothing it depends on has changed.
Extra arguments after `test` go to pytest, e.g. `python3 course.py test -k tokenization`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import venv
from pathlib import Path, PurePath

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
CONSTRAINTS = ROOT / "constraints.txt"
STAMP = VENV / ".course-installed"


def venv_command(venv_dir: PurePath, name: str, os_name: str = os.name) -> PurePath:
    """The path of command `name` (python, jupyter, myst) inside the virtual environment `venv_dir`.

    Windows keeps a venv's programs in `Scripts\\` and names them `.exe`; every other system
    (Linux, macOS) in `bin/`, without a suffix. `os_name` is `os.name` ("nt" or "posix")."""
    if os_name not in ("nt", "posix"):
        raise ValueError(f"os_name is {os_name!r}, expected 'nt' (Windows) or 'posix' (Linux, macOS)")
    if os_name == "nt":
        return venv_dir / "Scripts" / f"{name}.exe"
    return venv_dir / "bin" / name


BIN = venv_command(VENV, "python").parent
PYTHON = venv_command(VENV, "python")

# What `test` runs: lint, then the helpers' unit tests and strict nbval over every notebook in one
# pytest session (one summary line). No --nbval-lax: every stored output is compared.
LINT = ["-m", "ruff", "check", "--no-cache", "helpers", "tests", "notebooks", "tools", "benchmarks", "data", "course.py", "conftest.py", "nbgrader_config.py"]
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg"]
PYTEST = ["-m", "pytest", "tests", "notebooks", *NBVAL, "-q", "-rfEs"]
# `test --package`: the package's tests alone, for a contributor's loop (CI runs the whole suite).
# Left out: the notebooks (strict nbval, tests/notebooks/: their rules, student edition, nbgrader),
# a real JupyterLab (tests/browser/), and what the markers call slow: `sections` and `colab` runs,
# and tests marked `slow` (over ~10 s each on a 2-core machine, measured by pytest --durations).
PACKAGE_ONLY = ["--ignore=tests/notebooks", "--ignore=tests/browser",
                "-m", "not slow and not sections and not colab and not browser"]
PYTEST_PACKAGE = ["-m", "pytest", "tests", *PACKAGE_ONLY, "-q", "-rfEs"]
# Then strict nbval once more as a typical laptop: PyTorch's plain (non-SIMD) kernels, one
# thread, an OpenBLAS core other than this machine's (numpy's BLAS, used by Triton's
# interpreter), and training in float32 (COURSE_PRECISION=fp32: most laptops have no native
# bf16, so there the trainer's "auto" is float32). A stored output that depends on the CPU or
# on the precision fails here, not on a student's laptop.
OTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1",
             "OPENBLAS_CORETYPE": "Prescott", "COURSE_PRECISION": "fp32"}
PYTEST_OTHER_CPU = ["-m", "pytest", "notebooks", *NBVAL, "-q", "-rfEs"]


def other_cpu_env(machine: str | None = None) -> dict[str, str]:
    """OTHER_CPU for this processor (`machine`: platform.machine(), e.g. "x86_64", "AMD64",
    "arm64"). OPENBLAS_CORETYPE names an x86 core: on an ARM machine (Apple silicon) OpenBLAS
    would only warn about it, so there it is left out."""
    machine = platform.machine() if machine is None else machine
    if machine.lower() in ("x86_64", "amd64", "i386", "i686", "x86"):
        return dict(OTHER_CPU)
    return {name: value for name, value in OTHER_CPU.items() if name != "OPENBLAS_CORETYPE"}
# That second pass also runs with the network switched off (tests/offline: a Python start-up
# hook and a Node.js one that refuse every connection and name lookup outside this machine and
# log it): every notebook must run on a laptop without Wi-Fi. Loopback stays open for Jupyter's
# kernels and notebook 11's and 12's worker processes.
OFFLINE_GUARD = ROOT / "tests" / "offline"
NETWORK_LOG = VENV / "network-attempts.log"


def offline_env(env: dict[str, str], log: Path, guard: PurePath = OFFLINE_GUARD) -> dict[str, str]:
    """`env` for programs that must not reach the network: every Python started with it (a
    kernel, a worker) and every Node.js program refuses outside connections and notes each try
    in `log`."""
    python_path = os.pathsep.join(filter(None, [str(guard), env.get("PYTHONPATH", "")]))
    # Forward slashes: Node.js reads a backslash in NODE_OPTIONS as an escape (C:\\Users -> C:Users).
    node_options = " ".join(filter(None, [f'--require "{(guard / "no_network.cjs").as_posix()}"',
                                          env.get("NODE_OPTIONS", "")]))
    return {**env, "PYTHONPATH": python_path, "NODE_OPTIONS": node_options,
            "COURSE_NETWORK_LOG": str(log)}


def run(args: list[str | Path], cwd: Path = ROOT, **kwargs) -> None:
    print("+", " ".join(str(a) for a in args), flush=True)
    subprocess.run([str(a) for a in args], check=True, cwd=cwd, **kwargs)


CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
# The Pythons constraints.txt pins (tests/course/test_install.py holds the two together). A newer
# Python installs too, with the newest releases instead of the tested ones, and is told so.
TESTED_PYTHONS = ("3.10", "3.11", "3.12", "3.13")


def has_nvidia_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


def can_reach(host: str, port: int = 443, timeout: float = 3.0) -> bool:
    """True if a TCP connection to host:port opens within `timeout` seconds."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def cpu_torch_index(platform: str | None = None, gpu: bool | None = None,
                    reachable: bool | None = None) -> list[str]:
    """Extra pip arguments that make pip pick PyTorch's CPU build, the one the course is tested on.

    Which build each platform gets (`platform` is `sys.platform`; `gpu`, an NVIDIA GPU present;
    `reachable`, download.pytorch.org answers; each is found out when left None):
    - Linux without an NVIDIA GPU: PyPI's Linux torch is the CUDA build (several GB of CUDA
      libraries). PyTorch's CPU index is added, so pip sees `2.13.0+cpu` beside PyPI's `2.13.0`:
      both match the constraint `torch==2.13.0`, and the local label `+cpu` ranks higher, so pip
      takes the CPU build. Where the index cannot be reached (offline mirrors, closed networks)
      pip takes whatever torch it is given, and this says so.
    - Linux with an NVIDIA GPU: PyPI's CUDA build, on purpose (notebook 8 times its kernel there).
    - macOS and Windows: PyPI's wheels are CPU builds already (macOS's also drive Apple's GPU,
      MPS, which the course leaves alone unless asked): nothing to add.
    """
    platform = sys.platform if platform is None else platform
    if not isinstance(platform, str) or not platform:
        raise ValueError(f"platform is {platform!r}, expected a sys.platform name such as 'linux'")
    if not platform.startswith("linux"):
        return []
    if has_nvidia_gpu() if gpu is None else gpu:
        return []
    if not (can_reach("download.pytorch.org") if reachable is None else reachable):
        print(f"note: {CPU_TORCH_INDEX} cannot be reached, so pip installs the torch it finds; on "
              "Linux, PyPI's is the CUDA build (several GB, same results on the CPU)", flush=True)
        return []
    return ["--extra-index-url", CPU_TORCH_INDEX]


def python_is_tested(version: tuple[int, ...] | None = None) -> bool:
    """True if constraints.txt pins the versions for this Python (`version`: sys.version_info)."""
    major, minor = (sys.version_info if version is None else version)[:2]
    return f"{major}.{minor}" in TESTED_PYTHONS


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
    if not python_is_tested():
        print(f"note: Python {sys.version_info[0]}.{sys.version_info[1]} is not one the course is "
              f"tested on ({', '.join(TESTED_PYTHONS)}): constraints.txt pins nothing for it, so pip "
              "installs the newest releases", flush=True)
    pip = [PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "-c", CONSTRAINTS]
    # PyTorch first, on its own: with the pinned CPU build already present, the course package's
    # loose `torch>=2.2` is satisfied and pip never goes looking for a multi-GB CUDA build.
    run([*pip, *cpu_torch_index(), "torch>=2.2"])
    run([*pip, "-e", f".[{extras}]"])
    STAMP.write_text(f"{install_fingerprint()}\n{extras}")


def lab_folder(extra_args: list[str], root: Path = ROOT) -> tuple[Path, list[str]] | str:
    """(the folder to open, the arguments left for jupyter lab), or why the arguments are wrong.

    `lab` alone opens notebooks/; `lab DIR` opens DIR (a student edition's notebooks/ when DIR
    is the edition's folder)."""
    if not extra_args or extra_args[0].startswith("-"):
        return root / "notebooks", extra_args
    folder = Path(extra_args[0]).expanduser().resolve()
    if not folder.is_dir():
        return f"no folder {extra_args[0]!r} to open (usage: python3 course.py lab [DIR])"
    if (folder / "notebooks").is_dir():
        folder = folder / "notebooks"
    return folder, extra_args[1:]


def lab(extra_args: list[str]) -> int:
    chosen = lab_folder(extra_args)
    if isinstance(chosen, str):
        print(chosen)
        return 2
    folder, extra_args = chosen
    ensure_environment("lab")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers and CI boxes often run as root
        extra_args = ["--allow-root", *extra_args]
    return subprocess.call([str(venv_command(VENV, "jupyter")), "lab", str(folder), *extra_args], cwd=ROOT)


def finished_pytest(command: list[str], env: dict[str, str]) -> int:
    """Run pytest and return its status, or 1 if it ended without finishing every test it
    collected (a test that reached os._exit, a crash): the root conftest.py writes the counts
    of a run that reached its end into COURSE_TEST_REPORT, so no line means no finished run."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "pytest-report.jsonl"
        process = subprocess.Popen(command, cwd=ROOT, env={**env, "COURSE_TEST_REPORT": str(report)})
        status = process.wait()
        lines = report.read_text(encoding="utf-8").splitlines() if report.exists() else []
    ours = [json.loads(line) for line in lines if json.loads(line).get("pid") == process.pid]
    if not ours:
        print(f"pytest ended (status {status}) before the end of its run: some collected tests never "
              "ran. The run fails.", flush=True)
        return status or 1
    if status == 0 and ours[-1]["finished"] < ours[-1]["collected"]:
        return 1
    return status


def test(extra_args: list[str]) -> int:
    if os.environ.get("COURSE_TEST_NESTED"):  # a test that ran the real command: it would recurse
        print("course.py test was started inside its own test run (COURSE_TEST_NESTED is set): refusing "
              "to start the whole suite again")
        return 2
    package = "--package" in extra_args
    extra_args = [a for a in extra_args if a != "--package"]
    ensure_environment("lab,test" if package else "lab,test,browser,site,slides")
    # No MPLBACKEND here: the notebook kernels inherit this environment and must keep their
    # inline backend, whose figures are part of the stored outputs nbval compares.
    env = {**os.environ, "PYTHONHASHSEED": "0", "COURSE_TEST_NESTED": "1"}
    env.pop("MPLBACKEND", None)
    lint = subprocess.call([str(PYTHON), *LINT], cwd=ROOT, env=env)
    if package:
        return lint or finished_pytest([str(PYTHON), *PYTEST_PACKAGE, *extra_args], env)
    suite = finished_pytest([str(PYTHON), *PYTEST, *extra_args], env)
    print("+ strict nbval again, network off, with "
          + " ".join(f"{k}={v}" for k, v in other_cpu_env().items()), flush=True)
    log = NETWORK_LOG
    log.unlink(missing_ok=True)
    other_cpu = finished_pytest([str(PYTHON), *PYTEST_OTHER_CPU, *extra_args],
                                offline_env({**env, **other_cpu_env()}, log))
    attempts = log.read_text(encoding="utf-8") if log.exists() else ""
    if attempts:
        print(f"the notebooks tried to reach the network with it switched off:\n{attempts}")
    # pytest's 5 means "nothing collected": `test -k tokenizers` selects no notebook cell here.
    return lint or suite or (0 if other_cpu == 5 else other_cpu) or (1 if attempts else 0)


def mirrored_tests(path: str, root: Path = ROOT, _beside: bool = True) -> list[Path]:
    """The test files that check a change to the file at `path` (relative to `root` or absolute).

    A test file is its own; `helpers/<sub>/<module>.py` has `tests/<sub>/test_<module>.py` (and an
    exercise checker module `tests/lab/exercises/test_<module>.py` and `..._use.py`); a module
    without a mirrored file has the test files that import it, else (a private one, `_ranks.py`)
    those of the modules beside it that use it.
    Raises ValueError naming `path` when it is no Python file of the course or nothing tests it."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"path is {path!r}, expected a Python file of the course, e.g. helpers/training/muon.py")
    file = (root / path).resolve()
    if file.suffix != ".py" or not file.is_file() or not file.is_relative_to(root):
        raise ValueError(f"path {path!r} is not a Python file of the course, expected a module under "
                         "helpers/ (helpers/training/muon.py) or a test file under tests/")
    relative = file.relative_to(root)
    tests = root / "tests"
    if relative.parts[0] == "tests" and file.name.startswith("test_"):
        return [file]
    if relative.parts[0] != "helpers":
        raise ValueError(f"path {path!r} is not under helpers/ or a test file, expected a module under "
                         "helpers/ (helpers/training/muon.py) or a test file under tests/")
    folder = tests.joinpath(*relative.parts[1:-1])
    if relative.parts[1:-1] == ("lab", "exercises") and file.stem == "__init__":
        names = ["test_check.py"]  # the exercise package's own machinery: check, evaluate
    else:
        names = [f"test_{file.stem}.py", f"test_{file.stem}_use.py"]
    found = [folder / name for name in names if (folder / name).is_file()]
    if not found:
        dotted = ".".join(relative.with_suffix("").parts)
        found = sorted(t for t in tests.rglob("test_*.py") if re.search(
            rf"^\s*(from {re.escape(dotted)} import|import {re.escape(dotted)}\b|"
            rf"from {re.escape(dotted.rpartition('.')[0])} import .*\b{re.escape(file.stem)}\b)",
            t.read_text(encoding="utf-8"), re.M))
    if not found:  # a private helper module (_ranks.py): the tests of the modules beside it that use it
        users = [m for m in sorted(file.parent.glob("*.py")) if m != file and re.search(
            rf"\b{re.escape(file.stem)}\b", m.read_text(encoding="utf-8"))]
        for user in users if _beside else []:
            try:
                found += mirrored_tests(str(user.relative_to(root)), root, _beside=False)
            except ValueError:
                continue  # that module has no tests of its own either
        found = sorted(set(found))
    if not found:
        raise ValueError(f"path {path!r} has no test file: expected {folder.relative_to(root) / names[0]} "
                         "or a test file that imports it")
    return found


def check(extra_args: list[str]) -> int:
    """`check PATH... [-- PYTEST ARGS]`: ruff on the files, then the tests that mirror them, but
    those marked slow."""
    paths, pytest_args = extra_args, []
    if "--" in extra_args:
        cut = extra_args.index("--")
        paths, pytest_args = extra_args[:cut], extra_args[cut + 1:]
    if not paths:
        print("usage: python3 course.py check PATH [PATH ...] [-- PYTEST ARGS], e.g. "
              "python3 course.py check helpers/training/muon.py")
        return 2
    try:
        tests = [t for p in paths for t in mirrored_tests(p)]
    except ValueError as error:
        print(f"check: {error}")
        return 2
    tests = list(dict.fromkeys(tests))
    ensure_environment("lab,test")
    env = {**os.environ, "PYTHONHASHSEED": "0", "COURSE_TEST_NESTED": "1"}
    shown = [str(t.relative_to(ROOT)) for t in tests]
    print("+ ruff and pytest on " + " ".join(shown), flush=True)
    lint = subprocess.call([str(PYTHON), "-m", "ruff", "check", "--no-cache", *paths, *shown], cwd=ROOT, env=env)
    # the slow tests are left out here as in `test --package` (`-- -m ""` puts them back)
    return lint or finished_pytest([str(PYTHON), "-m", "pytest", *shown, "-m", "not slow", "-q", "-rfEs",
                                    *pytest_args], env)


# Where the course says its own address: the set-up cell's install (helpers/lab/setup_cell.py),
# the package metadata, the README's Colab links and every notebook's first cell (written from
# the set-up cell, so the notebooks are rewritten in place, their outputs untouched).
SETUP_CELL_FILE = "helpers/lab/setup_cell.py"
ADDRESS_FILES = [SETUP_CELL_FILE, "pyproject.toml", "README.md", "notebooks/*.ipynb"]
GITHUB_ADDRESS = re.compile(r"https://github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?/?")


def current_address(root: Path = ROOT) -> str:
    """The `owner/repo` the course installs from, as `helpers/lab/setup_cell.py` writes it."""
    text = (root / SETUP_CELL_FILE).read_text(encoding="utf-8")
    match = re.search(r'^COURSE_REPO = "https://github\.com/([^"]+)"$', text, re.M)
    if match is None:
        raise SystemExit(f"{SETUP_CELL_FILE} has no COURSE_REPO line to rewrite")
    return match.group(1)


def setup_cell_of(root: Path = ROOT):
    """`setup_cell(repo)` of the course at `root`: the first cell's text for a course at `repo`
    (helpers/lab/setup_cell.py, standard library only, read without importing `helpers`)."""
    spec = importlib.util.spec_from_file_location("course_setup_cell", root / SETUP_CELL_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.setup_cell


def with_setup_cell(text: str, old: str, new: str) -> str:
    """A notebook's JSON text with its set-up cell `old` made `new` (at the placeholder address
    the cell has no install, so its text changes, not only its address); all else as it was."""
    notebook = json.loads(text)
    changed = False
    for cell in notebook["cells"]:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "code" and source == old:
            cell["source"] = new.splitlines(keepends=True)
            changed = True
    if not changed:
        return text
    return json.dumps(notebook, sort_keys=True, indent=1, ensure_ascii=False) + "\n"  # as nbformat writes


def publish(extra_args: list[str], root: Path = ROOT) -> int:
    """Rewrite the course's GitHub address everywhere it appears; notebooks are not re-run."""
    match = GITHUB_ADDRESS.fullmatch(extra_args[0]) if len(extra_args) == 1 else None
    if match is None:
        print("usage: python3 course.py publish https://github.com/OWNER/REPO "
              f"(got {' '.join(extra_args) or 'nothing'})")
        return 2
    old, new = current_address(root), match.group(1)
    setup_cell = setup_cell_of(root)
    cells = setup_cell(f"https://github.com/{old}"), setup_cell(f"https://github.com/{new}")
    changed = []
    for pattern in ADDRESS_FILES:
        for path in sorted(root.glob(pattern)):
            text = path.read_text(encoding="utf-8")
            rewritten = with_setup_cell(text, *cells) if path.suffix == ".ipynb" else text
            rewritten = re.sub(rf"(github\.com/|colab\.research\.google\.com/github/){re.escape(old)}(?![\w.-])",
                               lambda m: m.group(1) + new, rewritten)
            if rewritten != text:
                path.write_text(rewritten, encoding="utf-8")
                changed.append(path.relative_to(root).as_posix())
    print(f"{old} -> {new} in {len(changed)} files: {', '.join(changed) or 'none'}")
    return 0


# The student edition: nbgrader's conventions, so that instructors meet the markers they know
# and `nbgrader generate_assignment` writes the same notebooks. In an answer cell the lines
# between `### BEGIN SOLUTION` and `### END SOLUTION` become nbgrader's stub (`# YOUR CODE HERE`,
# `raise NotImplementedError()`, at the marker's indent); in a test cell the lines between
# `### BEGIN HIDDEN TESTS` and `### END HIDDEN TESTS` go; every output is cleared.
STUDENT_DIR = "student"
CODE_STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
# What the student folder holds besides its notebooks: the package and data the notebooks
# import, the files that install them, and this script (whose `lab` opens the notebooks).
STUDENT_FILES = ["helpers", "data", "pyproject.toml", "constraints.txt", "course.py"]
STUDENT_README = """# The Transformer, from a matrix product to a FlashAttention kernel: student edition

Fourteen Jupyter notebooks with exercises for you to write. You need Python 3.10 or newer:

```bash
python3 course.py lab
```

installs the course into `.venv/` (the first time only) and opens JupyterLab on `notebooks/`.
Run each notebook top to bottom. Every exercise is a code cell that says `# YOUR CODE HERE`:
replace `raise NotImplementedError()` with your code and run the `check(...)` cell after it. A
wrong answer is told what is wrong; a second wrong try also says how to fix it. The cells
after most exercises run on your answer once it passes; until then they use the course's own
version, and say so. An exercise no later cell uses says that it stands alone.

## What the folder holds

- `notebooks/`: the fourteen notebooks, your copy to work in.
- `helpers/`: the course's own library. The notebooks import it, and each notebook builds on
  what the earlier ones wrote, so it holds the course's version of many ideas you write in the
  exercises (attention, masks, the GPT, its training loop...). Read it when you like; the
  grader does not accept it as an answer: an answer that calls the course's own version of the
  idea, under any name, or subclasses it, scores nothing for that exercise.
- `data/`: the texts and the stored measurements the notebooks read.
- `course.py`, `pyproject.toml`, `constraints.txt`: the `lab` command above and what it installs
  (`constraints.txt` pins the versions the course was tested with).
- `.course-edition.json`: the list of files your instructor's `course.py student` wrote here, so
  that a refreshed edition never overwrites a file you changed.

## In another Jupyter (Anaconda, a JupyterHub)

Open a notebook from `notebooks/`: its first cell finds `helpers/` in the folder above and uses
it. If that Python lacks what the course needs (PyTorch, ...), the cell says so; the one command
that installs it, run once in a notebook of this folder, is `%pip install -e ..` (then restart
the kernel). Name your own files anything but `helpers`: where a `helpers.py` or a `helpers/`
of yours hides the course's library, the first cell stops and names it.
"""


def blank_solutions(source: str) -> str:
    """A code cell's source with every solution region replaced by nbgrader's stub and every
    hidden-test region removed."""
    out, skipping = [], None
    for line in source.splitlines(keepends=True):
        marker = line.strip()
        if marker in ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS"):
            if skipping is not None:
                raise ValueError(f"a {marker!r} inside another marked region")
            skipping = marker
            if marker == "### BEGIN SOLUTION":
                indent = line[: len(line) - len(line.lstrip())]
                out += [f"{indent}{stub}\n" for stub in CODE_STUB]
        elif marker in ("### END SOLUTION", "### END HIDDEN TESTS"):
            if skipping is None or skipping.split()[-1] != marker.split()[-1]:
                raise ValueError(f"{marker!r} without its BEGIN line")
            skipping = None
        elif skipping is None:
            out.append(line)
    if skipping is not None:
        raise ValueError(f"{skipping!r} without its END line")
    text = "".join(out)
    return text.rstrip("\n") if not source.endswith("\n") else text


# nbgrader's markers anywhere in a line, as nbgrader itself finds them.
MARKER = re.compile(r"### (?:BEGIN|END) (?:SOLUTION|HIDDEN TESTS)")


def misplaced_marker(cell: dict, index: int, graded: bool = True) -> str | None:
    """Why `cell` (the notebook's `index`-th) holds an nbgrader marker it must not, or None.

    Solution markers belong in an answer cell and hidden-test markers in a graded test cell, both
    code cells with nbgrader's metadata; anywhere else (a markdown cell, a plain code cell) nbgrader
    would not blank them and they would reach the student. graded: False for a notebook without
    any of nbgrader's metadata, whose code cells the markers alone make answer and test cells."""
    source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    found = MARKER.search(source)
    if found is None:
        return None
    grader = cell.get("metadata", {}).get("nbgrader", {})
    wanted = "solution" if "SOLUTION" in found.group(0) else "grade"
    if cell["cell_type"] == "code" and (grader.get(wanted) or not graded):
        return None
    where = f"cell {index}" + (f" (id {cell['id']})" if cell.get("id") else "")
    first = source.strip().splitlines()[0][:60]
    kind = "an answer" if wanted == "solution" else "a graded test"
    return (f"{where}, a {cell['cell_type']} cell starting {first!r}, holds {found.group(0)!r}, "
            f"which belongs in {kind} code cell only: move it there or remove it")


def is_speaker_notes(cell: dict) -> bool:
    """True for a cell of the instructor's speaker notes (RISE's slide_type "notes")."""
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type") == "notes"


def student_notebook(notebook: dict) -> dict:
    """The student's copy of a notebook (its JSON): solutions blanked, hidden tests gone, no outputs,
    no speaker notes (the instructor's cells marked slide_type "notes").

    Refuses (ValueError naming the cell) an nbgrader marker outside an answer or test code cell."""
    graded = any("nbgrader" in cell.get("metadata", {}) for cell in notebook["cells"])
    for index, cell in enumerate(notebook["cells"]):
        problem = misplaced_marker(cell, index, graded)
        if problem:
            raise ValueError(problem)
    notebook["cells"] = [cell for cell in notebook["cells"] if not is_speaker_notes(cell)]
    for cell in notebook["cells"]:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "code":
            cell["source"] = blank_solutions(source)
            cell["outputs"], cell["execution_count"] = [], None
    notebook.get("metadata", {}).pop("widgets", None)  # saved widget state is an output too
    return notebook


MANIFEST = ".course-edition.json"  # what `student` wrote into an edition, with each file's hash
KEPT_SUFFIX = ".before-refresh"  # `student --force` keeps a student's changed file under this name


def is_student_edition(root: Path = ROOT) -> bool:
    """True in a folder written by `student`: it has its manifest, or notebooks but not their sources."""
    return (root / MANIFEST).is_file() or not (root / "notebooks" / "src").is_dir()


def edition_files(root: Path = ROOT) -> dict[str, bytes]:
    """Every file of the student edition, by its path in the edition ("notebooks/01_x.ipynb"),
    with its content; nothing is written."""
    skipped = ("__pycache__", ".egg-info", ".ipynb_checkpoints")
    files: dict[str, bytes] = {}
    for name in STUDENT_FILES:
        source = root / name
        paths = sorted(source.rglob("*")) if source.is_dir() else [source]
        for path in paths:
            parts = path.relative_to(root).parts
            if path.is_file() and path.suffix != ".pyc" and not any(p.endswith(skipped) for p in parts):
                files["/".join(parts)] = path.read_bytes()
    files["README.md"] = STUDENT_README.encode("utf-8")
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        try:
            notebook = student_notebook(json.loads(path.read_text(encoding="utf-8")))
        except ValueError as error:
            raise ValueError(f"notebooks/{path.name}: {error}") from None
        files[f"notebooks/{path.name}"] = (json.dumps(notebook, indent=1, ensure_ascii=False)
                                           + "\n").encode("utf-8")
    return files


def digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def kept_name(target: Path, relative: str) -> str:
    """Where `--force` keeps a student's version of `relative` in the edition `target`:
    `notebooks/04_x.before-refresh.ipynb`, or `...before-refresh-2.ipynb` if that is taken."""
    path, count = Path(relative), 1
    while True:
        suffix = KEPT_SUFFIX if count == 1 else f"{KEPT_SUFFIX}-{count}"
        name = path.with_name(f"{path.stem}{suffix}{path.suffix}").as_posix()
        if not (target / name).exists():
            return name
        count += 1


def refresh_plan(target: Path, files: dict[str, bytes], recorded: dict[str, str]
                 ) -> tuple[list[str], list[str], list[str], list[str]]:
    """What a refresh of the edition in `target` does, file by file, before anything is written.

    recorded: the manifest's {path: hash of what `student` wrote there last time} ({} for a folder
    it never wrote). Returns (to write: absent, or still as `student` wrote them; to delete: files
    `student` wrote that the edition no longer has, unchanged since; changed: files in the way
    that are not as `student` wrote them, the student's work, which stay; unchanged: already equal).
    """
    write, delete, changed, unchanged = [], [], [], []
    for relative, content in files.items():
        path = target / relative
        if not path.exists():
            write.append(relative)
        elif path.is_file() and digest(path.read_bytes()) == digest(content):
            unchanged.append(relative)
        elif path.is_file() and recorded.get(relative) == digest(path.read_bytes()):
            write.append(relative)
        else:
            changed.append(relative)
    for relative, written in recorded.items():
        path = target / relative
        outside = Path(relative).is_absolute() or ".." in Path(relative).parts  # a hand-edited list
        if relative not in files and not outside and path.is_file():
            (delete if digest(path.read_bytes()) == written else changed).append(relative)
    return write, delete, changed, unchanged


def student(extra_args: list[str], root: Path = ROOT) -> int:
    """Write the student edition into DIR (default: student/), or refresh an earlier one there.

    Nothing of the students' is lost: the edition's manifest (`.course-edition.json`) records
    every file this command wrote and its hash, and a refresh replaces or deletes only files
    still exactly as written; every other file (their answers, their own notebooks, `.venv`, a
    `.git`) stays. A file of the edition that the student changed is kept and listed; `--force`
    replaces it, keeping their version beside it (`NAME.before-refresh.EXT`). A folder without
    the manifest is written into only when empty, or with `--force` (under the same rule)."""
    force = "--force" in extra_args
    extra_args = [arg for arg in extra_args if arg != "--force"]
    if len(extra_args) > 1 or any(arg.startswith("-") for arg in extra_args):
        print(f"usage: python3 course.py student [--force] [DIR] (got {' '.join(extra_args)})")
        return 2
    target = Path(extra_args[0] if extra_args else root / STUDENT_DIR).resolve()
    home = root.resolve()
    inside = target.relative_to(home).parts[0] if home in target.parents else None
    if target in (home, *home.parents) or inside in ("notebooks", "helpers", "data", "tests",
                                                     "tools", "benchmarks", ".git", ".venv"):
        print(f"the student edition goes in a folder of its own, not {target}: name another "
              f"folder (default {STUDENT_DIR}/)")
        return 2
    if target.exists() and not target.is_dir():
        print(f"{target} is a file: name a folder for the student edition")
        return 2
    manifest = target / MANIFEST
    try:
        recorded = json.loads(manifest.read_text(encoding="utf-8"))["files"] if manifest.is_file() else {}
    except (ValueError, KeyError, TypeError) as error:
        print(f"{manifest} is not the list `course.py student` writes ({error}): restore it from "
              "where the folder came from, or name another folder")
        return 2
    if not manifest.is_file() and target.is_dir() and any(target.iterdir()) and not force:
        print(f"{target} holds files that `course.py student` did not write (an edition it writes "
              f"has a {MANIFEST} that lists them): name an empty folder, or add --force to write "
              f"the edition into this one (nothing in it is deleted; a file in the way is kept "
              f"as NAME{KEPT_SUFFIX}.EXT)")
        return 2
    try:
        files = edition_files(root)
    except ValueError as error:
        print(f"no student edition written: {error}")
        return 1
    write, delete, changed, unchanged = refresh_plan(target, files, recorded)
    in_the_way = [relative for relative in changed if relative in files]
    moved = {}
    for relative in in_the_way if force else []:
        path = target / relative
        if path.is_file():
            moved[relative] = kept_name(target, relative)
            path.replace(target / moved[relative])
            write.append(relative)
    for relative in write:
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / relative).write_bytes(files[relative])
    for relative in delete:
        (target / relative).unlink()
    kept = [relative for relative in changed if relative not in moved]
    written = {relative: digest(files[relative]) for relative in [*write, *unchanged]}
    # A kept file stays recorded with what was written there, so it still counts as changed.
    written |= {relative: recorded[relative] for relative in kept if relative in recorded}
    manifest.write_text(json.dumps({"written_by": "python3 course.py student", "files": written},
                                   indent=1, sort_keys=True) + "\n", encoding="utf-8")
    notebooks = sum(name.startswith("notebooks/") for name in files)
    print(f"student edition of {notebooks} notebooks in {target}: {len(write)} files written, "
          f"{len(unchanged)} already up to date, {len(delete)} old ones removed")
    if moved:
        print("replaced, with the student's version kept beside each: "
              + ", ".join(f"{relative} (now {kept})" for relative, kept in moved.items()))
    if kept:
        print(f"kept as they are, since they are not as `course.py student` wrote them: "
              f"{', '.join(kept)}; to replace them with the new edition's (keeping each one as "
              f"NAME{KEPT_SUFFIX}.EXT), run: python3 course.py student --force {target}")
    print("hand out the folder; the students run: python3 course.py lab")
    return 0


# The website: a MyST project (Jupyter Book 2's engine, mystmd) written from the committed
# notebooks and the README by tools/site/project.py, built by `myst build --html` with the
# course's own small theme (tools/site/render.py), so that nothing is downloaded or executed.
SITE_DIR = "_site"
MYST_REGISTRY = "http://127.0.0.1:9/"
SITE_INSTALL = "pip install .[site]  (or: .venv/bin/python -m pip install -e '.[site]' -c constraints.txt)"


LIVE_DIR = "live"  # the live-coding copies `blank` writes (git ignores it; nbval never sees it)


def exercise_cell_indices(notebook: dict, exercise: str) -> tuple[int, int]:
    """(answer cell, test cell) indices of `exercise` ("gpt.shifted_loss" or "shifted_loss") in a
    notebook's JSON, found by the nbgrader ids the build writes; ValueError naming the choices."""
    ids = {cell.get("metadata", {}).get("nbgrader", {}).get("grade_id"): index
           for index, cell in enumerate(notebook["cells"])}
    names = sorted(grade_id.removesuffix("-answer").replace("-", ".") for grade_id in ids
                   if grade_id and grade_id.endswith("-answer"))
    chosen = [name for name in names if exercise in (name, name.split(".", 1)[-1])]
    if len(chosen) != 1:
        raise ValueError(f"exercise {exercise!r} is not one of this notebook's: {', '.join(names) or 'none'}")
    grade_id = chosen[0].replace(".", "-")
    return ids[f"{grade_id}-answer"], ids[f"{grade_id}-check"]


def blank_one(copy: dict, instructor: dict, exercise: str, restore: bool = False) -> dict:
    """`copy` (a notebook's JSON) with one exercise's answer blanked as the student edition blanks
    it, its answer and test outputs cleared; restore=True puts the instructor's answer and test
    cells back from `instructor`, outputs included. Every other cell stays as it is in `copy`."""
    answer, test = exercise_cell_indices(copy, exercise)
    if restore:
        source_answer, source_test = exercise_cell_indices(instructor, exercise)
        copy["cells"][answer] = json.loads(json.dumps(instructor["cells"][source_answer]))
        copy["cells"][test] = json.loads(json.dumps(instructor["cells"][source_test]))
        return copy
    cell = copy["cells"][answer]
    source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    cell["source"] = blank_solutions(source)
    for index in (answer, test):
        copy["cells"][index]["outputs"], copy["cells"][index]["execution_count"] = [], None
    return copy


def blank(extra_args: list[str], root: Path = ROOT) -> int:
    """`blank NOTEBOOK EXERCISE [--restore]`: live-code one exercise in live/NOTEBOOK.ipynb."""
    restore = "--restore" in extra_args
    args = [arg for arg in extra_args if arg != "--restore"]
    found = sorted((root / "notebooks").glob(f"*{args[0]}*.ipynb")) if len(args) == 2 else []
    if len(found) != 1:
        print("usage: python3 course.py blank NOTEBOOK EXERCISE [--restore], e.g. "
              f"python3 course.py blank 07_gpt next_token_loss (got {' '.join(extra_args) or 'nothing'}; "
              f"{len(found)} notebooks match)")
        return 2
    instructor_path = found[0]
    copy_path = root / LIVE_DIR / instructor_path.name
    instructor = json.loads(instructor_path.read_text(encoding="utf-8"))
    copy = json.loads(copy_path.read_text(encoding="utf-8")) if copy_path.exists() else json.loads(
        json.dumps(instructor))
    try:
        copy = blank_one(copy, instructor, args[1], restore)
    except ValueError as error:
        print(f"{instructor_path.name}: {error}")
        return 2
    copy_path.parent.mkdir(exist_ok=True)
    copy_path.write_text(json.dumps(copy, sort_keys=True, indent=1, ensure_ascii=False) + "\n",
                         encoding="utf-8")
    done = "restored the instructor's answer of" if restore else "blanked"
    print(f"{done} {args[1]} in {copy_path.relative_to(root).as_posix()}; every other cell as it was"
          + ("" if restore else f" (put it back: python3 course.py blank {args[0]} {args[1]} --restore)"))
    return 0


def find_myst() -> str | None:
    """The `myst` command of the course's .venv, of this Python, or on PATH."""
    for folder in (BIN, Path(sys.executable).parent):
        for name in ("myst", "myst.exe"):
            if (folder / name).exists():
                return str(folder / name)
    return shutil.which("myst")


def node_major() -> int | None:
    node = shutil.which("node")
    if node is None:
        return None
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout
    match = re.match(r"v(\d+)", version.strip())
    return int(match.group(1)) if match else None


def render_python() -> str:
    """The Python that runs the site's theme: this one if it has Pygments (which highlights the
    code) or there is no .venv, else the course's .venv (JupyterLab brings Pygments)."""
    if importlib.util.find_spec("pygments") is not None or not PYTHON.exists():
        return sys.executable
    return str(PYTHON)


def site(extra_args: list[str], root: Path = ROOT) -> int:
    """Build the course website into DIR (default: _site/); the HTML lands in DIR/_build/html.

    `--student` builds the student's edition: no solutions, no hidden tests, no outputs of the
    answer and test cells (see tools/site/project.py)."""
    student_site = "--student" in extra_args
    extra_args = [arg for arg in extra_args if arg != "--student"]
    if len(extra_args) > 1 or any(arg.startswith("-") for arg in extra_args):
        print(f"usage: python3 course.py site [--student] [DIR] (got {' '.join(extra_args)})")
        return 2
    target = Path(extra_args[0] if extra_args else root / SITE_DIR).resolve()
    protected = [root.resolve(), *root.resolve().parents, (root / "notebooks").resolve()]
    if target in protected or (root / "notebooks").resolve() in target.parents:
        print(f"the site is built in a folder of its own, not {target}: name another folder "
              f"(default {SITE_DIR}/)")
        return 2
    if target.is_dir() and any(target.iterdir()) and not (target / "myst.yml").exists():
        print(f"{target} holds other files: name an empty folder or an earlier site's")
        return 2
    myst, node = find_myst(), node_major()
    if myst is None:
        print(f"the website needs mystmd, the course's optional extra 'site': {SITE_INSTALL}")
        return 1
    if node is None or node < 18:
        print(f"mystmd needs Node.js 18 or newer on PATH (found {node and f'v{node}'}): "
              "install it from your system's packages or nodejs.org")
        return 1
    spec = importlib.util.spec_from_file_location("site_project", root / "tools/site/project.py")
    project = importlib.util.module_from_spec(spec)  # standard library only, like this file
    spec.loader.exec_module(project)
    if (target / "_build").is_dir():  # an earlier build, maybe of the other edition: no page of it stays
        shutil.rmtree(target / "_build")
    try:
        names = project.write_project(root, target, current_address(root), render_python(),
                                      student_notebook if student_site else None)
    except ValueError as error:  # e.g. a solution marker in a markdown cell
        print(f"no site built: {error}")
        return 1
    # mystmd asks npm's registry for its newest version on every run (for an upgrade notice):
    # point that question at a closed port on this machine, so that the build never reaches out.
    os.environ.setdefault("npm_config_registry", MYST_REGISTRY)
    try:
        run([myst, "build", "--html"], cwd=target)
    except subprocess.CalledProcessError as error:
        print(f"myst build failed (exit {error.returncode}); its messages are above")
        return 1
    edition = "student" if student_site else "instructor's"
    print(f"the {edition} site of {len(names)} notebooks: {target / '_build' / 'html' / 'index.html'}")
    return 0


SLIDES_INSTALL = ".venv/bin/python -m pip install -e '.[slides]' -c constraints.txt"


def slides(extra_args: list[str], root: Path = ROOT) -> int:
    """`slides [NN ...] [--solutions]`: each notebook's reveal.js deck, with its speaker notes, in
    notebooks/slides/ (tools/build_slides.py, run in the course's .venv: nbconvert, latex2mathml)."""
    python = PYTHON if PYTHON.exists() else Path(sys.executable)
    missing = subprocess.run([str(python), "-c", "import latex2mathml, nbconvert"],
                             capture_output=True).returncode
    if missing:
        print(f"the slides need nbconvert and latex2mathml, the course's extra 'slides': {SLIDES_INSTALL}")
        return 1
    return subprocess.run([str(python), str(root / "tools" / "build_slides.py"), *extra_args],
                          cwd=root).returncode


def main(argv: list[str]) -> int:
    commands = {"lab": lab, "test": test, "check": check, "publish": publish, "student": student,
                "site": site, "blank": blank, "slides": slides}
    if not argv or argv[0] not in commands:
        print(__doc__)
        return 2
    if argv[0] != "lab" and is_student_edition():
        print("this is the student edition of the course: its one command is  python3 course.py lab")
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
