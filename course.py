#!/usr/bin/env python3
"""The course's two commands, needing nothing but Python 3.10+:

    python3 course.py lab [DIR]   # set up .venv (first time only) and open JupyterLab on notebooks/ (or DIR)
    python3 course.py test        # set up .venv with the test tools and run the whole suite

and three for instructors and whoever forks the course:

    python3 course.py student [DIR]    # the student edition: a folder to hand out, no solutions in it
    python3 course.py publish https://github.com/OWNER/REPO   # point Colab links and installs at it
    python3 course.py site [--student] [DIR]   # the website (default: _site/), needs `pip install .[site]`

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
LINT = ["-m", "ruff", "check", "helpers", "tests", "notebooks", "tools", "benchmarks", "data", "course.py"]
NBVAL = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg"]
PYTEST = ["-m", "pytest", "tests", "notebooks", *NBVAL, "-q", "-rfEs"]
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


def test(extra_args: list[str]) -> int:
    ensure_environment("lab,test,browser,site")
    # No MPLBACKEND here: the notebook kernels inherit this environment and must keep their
    # inline backend, whose figures are part of the stored outputs nbval compares.
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("MPLBACKEND", None)
    lint = subprocess.call([str(PYTHON), *LINT], cwd=ROOT, env=env)
    suite = subprocess.call([str(PYTHON), *PYTEST, *extra_args], cwd=ROOT, env=env)
    print("+ strict nbval again, network off, with "
          + " ".join(f"{k}={v}" for k, v in other_cpu_env().items()), flush=True)
    log = NETWORK_LOG
    log.unlink(missing_ok=True)
    other_cpu = subprocess.call([str(PYTHON), *PYTEST_OTHER_CPU, *extra_args], cwd=ROOT,
                                env=offline_env({**env, **other_cpu_env()}, log))
    attempts = log.read_text(encoding="utf-8") if log.exists() else ""
    if attempts:
        print(f"the notebooks tried to reach the network with it switched off:\n{attempts}")
    # pytest's 5 means "nothing collected": `test -k tokenizers` selects no notebook cell here.
    return lint or suite or (0 if other_cpu == 5 else other_cpu) or (1 if attempts else 0)


# Where the course says its own address: the set-up cell's install, the package metadata, the
# README's Colab links and every notebook's first cell (written from the set-up cell, so the
# notebooks are rewritten in place, their outputs untouched).
ADDRESS_FILES = ["helpers/lab/environment.py", "pyproject.toml", "README.md", "notebooks/*.ipynb"]
GITHUB_ADDRESS = re.compile(r"https://github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?/?")


def current_address(root: Path = ROOT) -> str:
    """The `owner/repo` the course installs from, as `helpers/lab/environment.py` writes it."""
    text = (root / "helpers" / "lab" / "environment.py").read_text(encoding="utf-8")
    match = re.search(r'^COURSE_REPO = "https://github\.com/([^"]+)"$', text, re.M)
    if match is None:
        raise SystemExit("helpers/lab/environment.py has no COURSE_REPO line to rewrite")
    return match.group(1)


def publish(extra_args: list[str], root: Path = ROOT) -> int:
    """Rewrite the course's GitHub address everywhere it appears; notebooks are not re-run."""
    match = GITHUB_ADDRESS.fullmatch(extra_args[0]) if len(extra_args) == 1 else None
    if match is None:
        print("usage: python3 course.py publish https://github.com/OWNER/REPO "
              f"(got {' '.join(extra_args) or 'nothing'})")
        return 2
    old, new = current_address(root), match.group(1)
    changed = []
    for pattern in ADDRESS_FILES:
        for path in sorted(root.glob(pattern)):
            text = path.read_text(encoding="utf-8")
            rewritten = re.sub(rf"(github\.com/|colab\.research\.google\.com/github/){re.escape(old)}(?![\w.-])",
                               lambda m: m.group(1) + new, text)
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
wrong answer is told what is wrong; a second wrong try also says how to fix it. Until your
answer passes, the cells after it use the course's own version, and say so.
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


def student_notebook(notebook: dict) -> dict:
    """The student's copy of a notebook (its JSON): solutions blanked, hidden tests gone, no outputs."""
    for cell in notebook["cells"]:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "code":
            cell["source"] = blank_solutions(source)
            cell["outputs"], cell["execution_count"] = [], None
    notebook.get("metadata", {}).pop("widgets", None)  # saved widget state is an output too
    return notebook


def is_student_edition(root: Path = ROOT) -> bool:
    """True in a folder written by `student`: it has notebooks but not their sources."""
    return not (root / "notebooks" / "src").is_dir()


def student(extra_args: list[str], root: Path = ROOT) -> int:
    """Write the student edition into DIR (default: student/): a folder that runs on its own."""
    if len(extra_args) > 1 or any(arg.startswith("-") for arg in extra_args):
        print(f"usage: python3 course.py student [DIR] (got {' '.join(extra_args)})")
        return 2
    target = Path(extra_args[0] if extra_args else root / STUDENT_DIR).resolve()
    home = root.resolve()
    inside = target.relative_to(home).parts[0] if home in target.parents else None
    if target in (home, *home.parents) or inside in ("notebooks", "helpers", "data", "tests",
                                                     "tools", "benchmarks", ".git", ".venv"):
        print(f"the student edition goes in a folder of its own, not {target}: name another "
              f"folder (default {STUDENT_DIR}/)")
        return 2
    earlier = (target / "notebooks").is_dir() and is_student_edition(target) \
        and not (target / ".git").exists()
    if target.exists() and any(target.iterdir()) and not earlier:
        print(f"{target} holds other files: name an empty folder or an earlier student edition's")
        return 2
    if target.exists():
        shutil.rmtree(target)
    (target / "notebooks").mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in STUDENT_FILES:
        source = root / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=ignore)
        else:
            shutil.copy2(source, target / name)
    (target / "README.md").write_text(STUDENT_README, encoding="utf-8")
    written = []
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        notebook = student_notebook(json.loads(path.read_text(encoding="utf-8")))
        (target / "notebooks" / path.name).write_text(
            json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        written.append(path.name)
    print(f"student edition of {len(written)} notebooks in {target}; hand out the folder, and the "
          f"students run: python3 course.py lab")
    return 0


# The website: a MyST project (Jupyter Book 2's engine, mystmd) written from the committed
# notebooks and the README by tools/site/project.py, built by `myst build --html` with the
# course's own small theme (tools/site/render.py), so that nothing is downloaded or executed.
SITE_DIR = "_site"
MYST_REGISTRY = "http://127.0.0.1:9/"
SITE_INSTALL = "pip install .[site]  (or: .venv/bin/python -m pip install -e '.[site]' -c constraints.txt)"


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
    names = project.write_project(root, target, current_address(root), render_python(),
                                  student_notebook if student_site else None)
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


def main(argv: list[str]) -> int:
    commands = {"lab": lab, "test": test, "publish": publish, "student": student, "site": site}
    if not argv or argv[0] not in commands:
        print(__doc__)
        return 2
    if argv[0] != "lab" and is_student_edition():
        print("this is the student edition of the course: its one command is  python3 course.py lab")
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
