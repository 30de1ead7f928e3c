"""The course installs the way the README says: pinned for CI, loose for users, a real package."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from helpers.lab.setup_cell import COURSE_REPO

# tomllib is in the standard library from Python 3.11 (the CI Python) on.
tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# conda-forge spells a few packages differently from PyPI
CONDA_NAMES = {"pytorch": "torch", "python-build": "build"}


def requirement_name(spec: str) -> str:
    return re.split(r"[<>=!~ ;\[]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def pyproject_requirements() -> dict[str, str]:
    project = PYPROJECT["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    return {requirement_name(s): s.replace(" ", "") for s in specs}


def environment_yml_requirements() -> dict[str, str]:
    found = {}
    text = (ROOT / "environment.yml").read_text()
    for line in text.split("dependencies:", 1)[1].splitlines():
        # top-level conda packages ("  - name>=x") and the pip section's ("      - name>=x; marker")
        match = re.match(r"^(?:  |      )- ([A-Za-z][A-Za-z0-9_.-]*)([<>=!~][^;]*)?(;.*)?$", line)
        if not match or match.group(1) in {"python", "pip"}:
            continue
        name = CONDA_NAMES.get(match.group(1), match.group(1)).lower()
        found[name] = name + (match.group(2) or "")
    return found


def test_environment_yml_names_the_same_dependencies_as_pyproject():
    pip_side, conda_side = pyproject_requirements(), environment_yml_requirements()
    assert set(conda_side) == set(pip_side), (
        f"only in environment.yml: {sorted(set(conda_side) - set(pip_side))}; "
        f"only in pyproject.toml: {sorted(set(pip_side) - set(conda_side))}")
    for name, spec in pip_side.items():
        assert conda_side[name] == spec.split(";")[0].strip(), f"{name}: {conda_side[name]} vs {spec}"


def test_users_get_lower_bounds_only():
    for spec in pyproject_requirements().values():
        version = spec.split(";")[0]  # an environment marker may say ==, a version may not
        assert "==" not in version and "<" not in version, f"{spec}: users get lower bounds, pins live in constraints.txt"
    assert "torch>=2.2" in PYPROJECT["project"]["dependencies"]


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 course.py lab" in readme and "python3 course.py test" in readme
    assert re.search(r"^exec python3 course\.py test$", ci, re.M)


def test_readme_colab_links_use_the_one_repository_address():
    readme = (ROOT / "README.md").read_text()
    slug = COURSE_REPO.removeprefix("https://github.com/")
    links = re.findall(r"https://colab\.research\.google\.com/github/([^)\s]+)", readme)
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(link.split("/")[-1] for link in links) == notebooks, "one Colab link per notebook"
    assert all(link.startswith(f"{slug}/blob/main/notebooks/") for link in links)
    assert PYPROJECT["project"]["urls"]["Source"] == COURSE_REPO


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_environment_and_finds_the_corpus(tmp_path):
    wheels = tmp_path / "wheels"
    # A checkout on PYTHONPATH would win: pip would call the package installed and skip it.
    clean_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels), str(ROOT)], check=True, cwd=tmp_path)
    (wheel,) = wheels.glob("transformer_course-*.whl")
    env_dir = tmp_path / "fresh-env"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / ("Scripts" if sys.platform == "win32" else "bin") / "python"
    # --no-deps: this checks the package's own files (code and data), not PyPI's; the corpus
    # module needs only the standard library.
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True,
                   env=clean_env)
    elsewhere = tmp_path / "somewhere-else"
    elsewhere.mkdir()
    probe = ("import helpers, helpers.lab.exercises, helpers.text.corpus as c, helpers.text.corpus_rich as r; "
             "t = c.load_corpus(); rich = r.load_rich_corpus()[:100_000]; "
             "print(helpers.__file__); print(len(t.encode()), c.well_formed_fraction(t)); "
             "print(len(rich), r.rich_well_formed_fraction(rich.rsplit(chr(10), 1)[0]))")
    result = subprocess.run([str(python), "-c", probe], cwd=elsewhere, capture_output=True, text=True,
                            env=clean_env)
    assert result.returncode == 0, result.stderr
    out = result.stdout.split("\n")
    assert str(env_dir) in out[0], "imported from the fresh environment, not the checkout"
    size, fraction = out[1].split()
    assert int(size) >= 1_000_000 and float(fraction) == 1.0
    rich_size, rich_fraction = out[2].split()
    assert int(rich_size) == 100_000 and float(rich_fraction) == 1.0


def test_readme_run_times_are_the_measured_ones():
    rows = re.findall(r"^\| (\d\d_\w+) \| (\d+ s) \| (\d+ s|-) \|(?: (?:\d+ MB|-) \|)?$",
                      (ROOT / "notebooks" / "TIMES.md").read_text(), re.M)
    measured = {name: fp32 if bf16 == "-" else f"{fp32} (bf16: {bf16})" for name, fp32, bf16 in rows}
    readme = dict(re.findall(r"\(notebooks/(\d\d_\w+)\.ipynb\) \| [^|]+ \| ([^|]+?) \|", (ROOT / "README.md").read_text()))
    notebooks = {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert set(readme) == notebooks, "one README row per notebook"
    assert readme == {name: measured.get(name) for name in readme}
