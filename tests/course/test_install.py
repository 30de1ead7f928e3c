"""course.py's installer and constraints.txt: every Python the course supports gets the tested
versions, and pip is steered to PyTorch's CPU build where a platform's default build is CUDA's."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path, PurePosixPath, PureWindowsPath

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
TESTED_TORCH = "2.13.0"   # the torch the stored notebook outputs were made with
PLATFORMS = {"linux": "Linux", "darwin": "Darwin", "win32": "Windows"}


def load_course_module():
    spec = importlib.util.spec_from_file_location("course_install", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course = load_course_module()


def constraint_lines(text: str) -> list[Requirement]:
    return [Requirement(line) for line in text.splitlines() if line.strip() and not line.startswith("#")]


def pins_for(python: str, platform: str = "linux", text: str | None = None) -> dict[str, list[Requirement]]:
    """{package: the constraints that apply} on Python `python` ("3.12") and `platform`
    (sys.platform), evaluated with pip's own marker rules."""
    environment = {"python_version": python, "python_full_version": f"{python}.0",
                   "sys_platform": platform, "platform_system": PLATFORMS[platform],
                   "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    found: dict[str, list[Requirement]] = {}
    text = (ROOT / "constraints.txt").read_text() if text is None else text
    for requirement in constraint_lines(text):
        if requirement.marker is None or requirement.marker.evaluate(environment):
            found.setdefault(re.sub(r"[-_.]+", "-", requirement.name.lower()), []).append(requirement)
    return found


def direct_dependencies() -> set[str]:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"], *(s for extra in project["optional-dependencies"].values() for s in extra)]
    return {re.sub(r"[-_.]+", "-", Requirement(s).name.lower()) for s in specs}


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
@pytest.mark.parametrize("python", course.TESTED_PYTHONS)
def test_every_supported_python_gets_the_tested_torch_and_one_pin_per_package(python, platform):
    pins = pins_for(python, platform)
    assert [str(r.specifier) for r in pins["torch"]] == [f"=={TESTED_TORCH}"], pins.get("torch")
    doubled = {name: [str(r) for r in found] for name, found in pins.items() if len(found) > 1}
    assert doubled == {}, f"two constraints for one package on Python {python}: {doubled}"
    missing = direct_dependencies() - set(pins)
    assert not missing, f"direct dependencies without a pin on Python {python}: {sorted(missing)}"
    assert not any(name.startswith(("nvidia-", "cuda-")) for name in pins), "the CPU build needs no CUDA packages"


def test_the_newer_pythons_get_exactly_the_versions_the_outputs_were_made_with():
    made_with = {name: [str(r.specifier) for r in found] for name, found in pins_for("3.11").items()}
    for python in ("3.12", "3.13"):
        pins = {name: [str(r.specifier) for r in found] for name, found in pins_for(python).items()}
        assert {name: pins.get(name) for name in made_with} == made_with
        assert set(pins) - set(made_with) <= {"pyyaml-ft"}, "3.13's PyYAML build, which 3.11 has no use for"


def test_python_3_10_never_gets_a_newer_release_than_the_outputs_were_made_with():
    made_with, oldest = pins_for("3.11"), pins_for("3.10")
    assert set(made_with) - set(oldest) <= {"ipython-pygments-lexers"}  # only 3.11's IPython needs it
    assert [str(r.specifier) for r in oldest["torch"]] == [str(r.specifier) for r in made_with["torch"]]
    for name in set(oldest) & set(made_with):
        if name != "triton":
            older, newer = (Version(str(pins[name][0].specifier).lstrip("=")) for pins in (oldest, made_with))
            assert older <= newer, f"{name}: 3.10 gets {older}, newer than the tested {newer}"


def test_every_constraint_is_an_exact_pin_but_triton():
    for requirement in constraint_lines((ROOT / "constraints.txt").read_text()):
        if requirement.name != "triton":
            assert str(requirement.specifier).startswith("==") and len(requirement.specifier) == 1, str(requirement)
        assert requirement.marker is not None, f"{requirement}: every pin names the Pythons it is for"


def test_a_python_newer_than_the_tested_ones_meets_no_pin():
    assert pins_for("3.14") == {} and pins_for("3.9") == {}
    assert not course.python_is_tested((3, 14, 0)) and course.python_is_tested((3, 10, 13))


def test_the_pinned_pythons_are_the_ones_course_py_calls_tested():
    text = (ROOT / "constraints.txt").read_text()
    named = {f"3.{minor}" for minor in range(8, 20) if pins_for(f"3.{minor}", text=text)}
    assert named == set(course.TESTED_PYTHONS)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'requires-python = ">={course.TESTED_PYTHONS[0]}"' in pyproject


def test_triton_is_a_range_that_holds_the_cpu_and_the_cuda_build():
    """PyPI's (CUDA) torch 2.13.0 requires triton 3.7.1; the CPU build none, and the outputs were
    made with 3.9.0. A range lets pip take the one that fits the build it installs."""
    (triton,) = pins_for("3.11")["triton"]
    assert triton.specifier.contains("3.7.1") and triton.specifier.contains("3.9.0")
    assert not triton.specifier.contains("3.10.0")
    assert pins_for("3.11", "darwin").get("triton", []) == [triton]  # harmless where torch needs none


def test_the_cpu_build_satisfies_the_pin_and_ranks_above_pypis_build():
    """Why adding PyTorch's CPU index is enough: `2.13.0+cpu` matches `torch==2.13.0`, and pip
    takes the highest matching version, which the local label `+cpu` makes the CPU build."""
    assert SpecifierSet(f"=={TESTED_TORCH}").contains(f"{TESTED_TORCH}+cpu")
    assert Version(f"{TESTED_TORCH}+cpu") > Version(TESTED_TORCH)


@pytest.mark.parametrize(("platform", "gpu", "reachable", "expected"), [
    ("linux", False, True, ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]),
    ("linux", True, True, []),        # a GPU machine keeps PyPI's CUDA build
    ("linux", False, False, []),      # closed network: pip's own torch, and a note says so
    ("darwin", False, True, []),      # PyPI's macOS and Windows wheels are CPU builds already
    ("win32", False, True, []),
])
def test_the_cpu_index_is_added_only_where_pypi_would_bring_cuda(platform, gpu, reachable, expected, capsys):
    assert course.cpu_torch_index(platform, gpu=gpu, reachable=reachable) == expected
    said = capsys.readouterr().out
    assert ("cannot be reached" in said) == (platform == "linux" and not gpu and not reachable)


def test_the_cpu_index_check_does_not_ask_the_network_off_linux(monkeypatch):
    monkeypatch.setattr(course, "can_reach", lambda *a, **k: pytest.fail("asked the network"))
    monkeypatch.setattr(course, "has_nvidia_gpu", lambda: pytest.fail("looked for a GPU"))
    assert course.cpu_torch_index("darwin") == [] and course.cpu_torch_index("win32") == []


@pytest.mark.parametrize("platform", ["", None, 3])
def test_the_cpu_index_refuses_a_platform_that_is_not_a_name(platform):
    if platform is None:
        assert isinstance(course.cpu_torch_index(None, gpu=True), list)  # None: this machine's
        return
    with pytest.raises(ValueError, match=r"platform is .*, expected a sys.platform name"):
        course.cpu_torch_index(platform)


@pytest.mark.parametrize(("os_name", "pure", "expected"), [
    ("nt", PureWindowsPath, r"C:\Users\Ada Lovelace\course\.venv\Scripts\python.exe"),
    ("posix", PurePosixPath, "/home/ada lovelace/course/.venv/bin/python"),
])
def test_the_venv_python_is_where_each_system_puts_it(os_name, pure, expected):
    home = r"C:\Users\Ada Lovelace\course" if os_name == "nt" else "/home/ada lovelace/course"
    assert str(course.venv_command(pure(home) / ".venv", "python", os_name)) == expected
    jupyter = course.venv_command(pure(home) / ".venv", "jupyter", os_name)
    assert jupyter.name == ("jupyter.exe" if os_name == "nt" else "jupyter")


def test_the_venv_layout_refuses_an_unknown_system():
    with pytest.raises(ValueError, match=r"os_name is 'java', expected 'nt'"):
        course.venv_command(PurePosixPath(".venv"), "python", "java")


def test_this_machines_venv_python_follows_its_system():
    assert course.PYTHON == course.venv_command(course.VENV, "python")
    assert course.PYTHON.parent.name == ("Scripts" if sys.platform == "win32" else "bin")


@pytest.fixture
def fake_venv(tmp_path, monkeypatch):
    """course.py pointed at a virtual environment in tmp_path whose python exists; pip recorded."""
    venv_dir = tmp_path / "a folder with spaces" / ".venv"
    python = Path(course.venv_command(venv_dir, "python"))
    python.parent.mkdir(parents=True)
    python.touch()
    commands = []
    monkeypatch.setattr(course, "VENV", venv_dir)
    monkeypatch.setattr(course, "PYTHON", python)
    monkeypatch.setattr(course, "STAMP", venv_dir / ".course-installed")
    monkeypatch.setattr(course, "run", lambda args, **kwargs: commands.append([str(a) for a in args]))
    return commands


def test_the_install_takes_torch_first_with_the_cpu_index_then_the_course(fake_venv, monkeypatch):
    monkeypatch.setattr(course, "cpu_torch_index", lambda: ["--extra-index-url", course.CPU_TORCH_INDEX])
    course.ensure_environment("lab")
    torch_step, course_step = fake_venv
    assert torch_step[-3:] == ["--extra-index-url", course.CPU_TORCH_INDEX, "torch>=2.2"]
    assert course_step[-2:] == ["-e", ".[lab]"]
    for step in fake_venv:
        assert step[step.index("-c") + 1] == str(course.CONSTRAINTS)
    course.ensure_environment("lab")  # installed: nothing runs again
    assert len(fake_venv) == 2


def test_the_install_says_when_this_python_has_no_pins(fake_venv, monkeypatch, capsys):
    monkeypatch.setattr(course, "cpu_torch_index", lambda: [])
    monkeypatch.setattr(course, "python_is_tested", lambda: False)
    course.ensure_environment("lab")
    assert "constraints.txt pins nothing for it" in capsys.readouterr().out
