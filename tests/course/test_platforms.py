"""What differs on macOS (Apple silicon) and Windows, checked here against simulated values:
processor names, Windows paths (spaces, backslashes, drive letters), CRLF line endings, and
worker processes started the one way every system supports (spawn). The CI workflow
(.github/workflows/ci.yml) runs the whole suite on the real systems."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path, PureWindowsPath

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def load_course_module():
    spec = importlib.util.spec_from_file_location("course_platforms", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course = load_course_module()


@pytest.mark.parametrize(("machine", "x86"), [("x86_64", True), ("AMD64", True), ("arm64", False),
                                              ("aarch64", False)])
def test_the_laptop_pass_names_an_x86_blas_core_only_on_x86(machine, x86):
    env = course.other_cpu_env(machine)
    assert ("OPENBLAS_CORETYPE" in env) == x86
    assert env["ATEN_CPU_CAPABILITY"] == "default" and env["COURSE_PRECISION"] == "fp32"
    assert env["OMP_NUM_THREADS"] == "1"


def test_node_gets_the_network_switch_with_forward_slashes_from_a_windows_folder(tmp_path):
    guard = PureWindowsPath(r"C:\Users\Ada Lovelace\My Course\tests\offline")
    env = course.offline_env({}, tmp_path / "log", guard=guard)
    assert env["NODE_OPTIONS"] == '--require "C:/Users/Ada Lovelace/My Course/tests/offline/no_network.cjs"'
    assert env["PYTHONPATH"] == str(guard)


@pytest.mark.parametrize("name", ["course with spaces", "back\\slash and space", "ünïcode kurs"])
def test_lab_opens_a_folder_whose_name_has_spaces_or_backslashes(tmp_path, name):
    folder = tmp_path / name
    (folder / "notebooks").mkdir(parents=True)
    assert course.lab_folder([str(folder), "--no-browser"], root=tmp_path) == (
        folder / "notebooks", ["--no-browser"])
    assert course.lab_folder([], root=folder) == (folder / "notebooks", [])


def test_a_windows_checkout_with_crlf_line_endings_blanks_the_same_solutions():
    source = ("def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n"
              "### BEGIN HIDDEN TESTS\nassert f(1) == 2\n### END HIDDEN TESTS\n")
    unix, windows = course.blank_solutions(source), course.blank_solutions(source.replace("\n", "\r\n"))
    assert "return x + 1" not in windows and "assert f(1)" not in windows
    assert windows.replace("\r\n", "\n") == unix


def test_a_windows_checkout_with_crlf_line_endings_reads_the_same_constraints():
    text = (ROOT / "constraints.txt").read_text()
    read = [str(Requirement(line)) for line in text.replace("\n", "\r\n").splitlines()
            if line.strip() and not line.startswith("#")]
    assert read == [str(Requirement(line)) for line in text.splitlines() if line and not line.startswith("#")]


def process_starts(path: Path) -> list[str]:
    """The calls in `path` that start a process: multiprocessing's Process/Pool, and which start
    method each asks for ("spawn", or "default" where it takes the system's)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if node.func.attr == "get_context":
                method = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else "default"
                found.append(f"get_context({method})")
            elif node.func.attr in ("Process", "Pool") and owner in ("mp", "multiprocessing"):
                found.append(f"{owner}.{node.func.attr}: default")
            elif node.func.attr == "start_processes" or (owner.endswith("multiprocessing") and node.func.attr == "spawn"):
                found.append(f"{owner}.{node.func.attr}: spawn")
    return found


def test_every_process_the_course_starts_is_spawned_as_on_macos_and_windows():
    """Linux forks by default, macOS and Windows spawn (a fresh Python that must import what it
    runs). Where the course asks for spawn everywhere, Linux runs the same path as a student's
    Mac or Windows laptop, so a function that only a fork could carry fails here too."""
    starts = {path.relative_to(ROOT).as_posix(): process_starts(path)
              for folder in ("helpers", "tools", "benchmarks") for path in (ROOT / folder).rglob("*.py")}
    starts = {path: found for path, found in starts.items() if found}
    assert starts, "the course starts worker processes somewhere (notebook 11)"
    not_spawned = {path: found for path, found in starts.items()
                   if any(not entry.endswith(("(spawn)", ": spawn")) for entry in found)}
    assert not_spawned == {}, f"processes started the system's way, not spawned: {not_spawned}"


def test_the_process_finder_sees_a_default_start(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import multiprocessing as mp\nmp.get_context('spawn').Process()\nmp.Process(target=print)\n")
    assert sorted(process_starts(module)) == ["get_context(spawn)", "mp.Process: default"]


def test_course_py_needs_nothing_but_the_standard_library():
    """`python3 course.py lab` runs before anything is installed, on any system."""
    imported = set()
    for node in ast.walk(ast.parse((ROOT / "course.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported - set(sys.stdlib_module_names) - {"__future__"} == set()




def test_ci_runs_the_readme_command_on_linux_macos_arm64_and_windows_and_the_python_range():
    yaml = pytest.importorskip("yaml", reason="reading the workflow needs PyYAML (JupyterLab brings it)")
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text())
    (job,) = workflow["jobs"].values()
    runs = {(entry["os"].split("-")[0], entry["python"]) for entry in job["strategy"]["matrix"]["include"]}
    assert {"ubuntu", "macos", "windows"} == {system for system, _ in runs}
    assert {course.TESTED_PYTHONS[0], "3.11", course.TESTED_PYTHONS[-1]} <= {py for system, py in runs if system == "ubuntu"}
    macos = [entry["os"] for entry in job["strategy"]["matrix"]["include"] if entry["os"].startswith("macos")]
    assert all(int(name.split("-")[1]) >= 14 for name in macos), "macos-14 and later run on Apple silicon"
    commands = [step.get("run", "") for step in job["steps"]]
    assert ".ci/run" in commands and "python course.py test" in commands


def test_the_weekly_job_installs_unpinned_and_reports_what_broke():
    yaml = pytest.importorskip("yaml", reason="reading the workflow needs PyYAML (JupyterLab brings it)")
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "newest.yml").read_text())
    triggers = workflow.get("on", workflow.get(True))
    assert "schedule" in triggers
    steps = {step.get("name", ""): step.get("run", "") for step in workflow["jobs"]["newest"]["steps"]}
    (install,) = [run for name, run in steps.items() if name.startswith("Install the newest")]
    assert 'pip install -e ".[lab,test,site]"' in install and "constraints" not in install
    assert "--nbval" in "".join(steps.values()) and "GITHUB_STEP_SUMMARY" in steps["Report"]
