"""The course.py commands: `test` runs strict nbval on two CPU personalities; `publish URL` points
every Colab link and install at a new GitHub address."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.lab.setup_cell import COURSE_REPO, SETUP_CELL, setup_cell

ROOT = Path(__file__).resolve().parents[2]
OLD_SLUG = COURSE_REPO.removeprefix("https://github.com/")


def load_course_module():
    spec = importlib.util.spec_from_file_location("course_commands", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course = load_course_module()


def copy_address_files(root: Path) -> None:
    for pattern in course.ADDRESS_FILES:
        for path in ROOT.glob(pattern):
            target = root / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)


def test_every_file_that_names_the_address_is_one_publish_rewrites():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout
    if not tracked:
        pytest.skip("not a git checkout")
    covered = {p.relative_to(ROOT).as_posix() for pattern in course.ADDRESS_FILES
               for p in ROOT.glob(pattern)}
    naming = [name for name in tracked.split()
              if (ROOT / name).is_file() and OLD_SLUG in (ROOT / name).read_text(errors="ignore")]
    assert naming, "the address is written somewhere"
    # This test file and course.py's docs only speak about the address; they do not use it.
    assert set(naming) - covered - {"tests/course/test_course_commands.py"} == set()


def with_current_setup_cell(root: Path) -> None:
    """Give the copied notebooks today's set-up cell, as the next build writes it."""
    for path in (root / "notebooks").glob("*.ipynb"):
        notebook = json.loads(path.read_text())
        assert notebook["cells"][1]["cell_type"] == "code", f"{path.name}: the set-up cell is the second cell"
        notebook["cells"][1]["source"] = SETUP_CELL.splitlines(keepends=True)
        path.write_text(json.dumps(notebook, sort_keys=True, indent=1, ensure_ascii=False) + "\n")


def test_publish_rewrites_links_installs_and_setup_cells_without_touching_outputs(tmp_path):
    copy_address_files(tmp_path)
    with_current_setup_cell(tmp_path)
    before = {p.name: json.loads(p.read_text()) for p in (tmp_path / "notebooks").glob("*.ipynb")}
    assert course.publish(["https://github.com/alice/my-course.git"], root=tmp_path) == 0

    for pattern in course.ADDRESS_FILES:
        for path in tmp_path.glob(pattern):
            assert OLD_SLUG not in path.read_text(), f"{path.name} still names the old address"
    assert course.current_address(tmp_path) == "alice/my-course"
    readme = (tmp_path / "README.md").read_text()
    assert readme.count("colab.research.google.com/github/alice/my-course/blob/main/notebooks/") == len(before)
    assert 'Source = "https://github.com/alice/my-course"' in (tmp_path / "pyproject.toml").read_text()

    # At the placeholder the cell installs nothing; published, it installs from the new address.
    published = setup_cell("https://github.com/alice/my-course")
    assert "pip install -q git+https://github.com/alice/my-course'" in published
    for path in (tmp_path / "notebooks").glob("*.ipynb"):
        after, old = json.loads(path.read_text()), before[path.name]
        assert "".join(after["cells"][1]["source"]) == published, path.name
        assert [c.get("outputs") for c in after["cells"]] == [c.get("outputs") for c in old["cells"]]
        assert [c["source"] for c in after["cells"][2:]] == [c["source"] for c in old["cells"][2:]]
    assert course.publish(["https://github.com/bob/course"], root=tmp_path) == 0  # and again
    notebook = json.loads(next((tmp_path / "notebooks").glob("*.ipynb")).read_text())
    assert "".join(notebook["cells"][1]["source"]) == setup_cell("https://github.com/bob/course")


def test_publish_refuses_what_is_not_a_github_repository_address(tmp_path, capsys):
    copy_address_files(tmp_path)
    for args in ([], ["https://gitlab.com/alice/course"], ["alice/course"], ["a", "b"]):
        assert course.publish(args, root=tmp_path) == 2
        assert "usage: python3 course.py publish https://github.com/OWNER/REPO" in capsys.readouterr().out
    assert course.current_address(tmp_path) == OLD_SLUG


def test_publish_does_not_touch_a_longer_name_that_starts_with_the_old_one(tmp_path):
    copy_address_files(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text() + f"\nA fork: https://github.com/{OLD_SLUG}-fork\n")
    course.publish(["https://github.com/alice/my-course"], root=tmp_path)
    assert f"https://github.com/{OLD_SLUG}-fork" in readme.read_text()


def test_test_command_runs_nbval_a_second_time_as_another_cpu(monkeypatch):
    calls = []

    def fake_call(args, cwd, env):
        calls.append((args, env))
        return 0

    monkeypatch.setattr(course, "ensure_environment", lambda extras: None)
    monkeypatch.delenv("COURSE_TEST_NESTED", raising=False)
    monkeypatch.setattr(course.subprocess, "call", fake_call)
    monkeypatch.setattr(course, "finished_pytest", lambda args, env: fake_call(args, None, env))
    assert course.test(["-k", "masking"]) == 0
    lint, suite, other = calls
    assert "ruff" in lint[0] and "--nbval" in suite[0] and "tests" in suite[0]
    assert "--nbval" in other[0] and "tests" not in other[0] and other[0][-2:] == ["-k", "masking"]
    assert other[1]["ATEN_CPU_CAPABILITY"] == "default" and other[1]["OMP_NUM_THREADS"] == "1"
    assert other[1]["OPENBLAS_CORETYPE"]
    assert other[1]["COURSE_PRECISION"] == "fp32"  # as a laptop without native bf16 trains


@pytest.mark.parametrize(("codes", "result"), [((0, 0, 0), 0), ((0, 0, 5), 0), ((0, 0, 1), 1),
                                               ((0, 1, 0), 1), ((1, 0, 0), 1)])
def test_test_command_fails_when_any_part_fails(monkeypatch, codes, result):
    returned = iter(codes)
    monkeypatch.setattr(course, "ensure_environment", lambda extras: None)
    monkeypatch.delenv("COURSE_TEST_NESTED", raising=False)
    monkeypatch.setattr(course.subprocess, "call", lambda *a, **k: next(returned))
    monkeypatch.setattr(course, "finished_pytest", lambda *a, **k: next(returned))
    assert course.test([]) == result


def _suite(folder: Path, body: str) -> list[str]:
    """A pytest command over a folder holding the course's root conftest.py and one test file."""
    import sys

    shutil.copy(ROOT / "conftest.py", folder / "conftest.py")
    (folder / "test_run.py").write_text(body, encoding="utf-8")
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(folder), str(folder)]


def test_a_run_that_exits_partway_with_status_0_fails(tmp_path):
    import os

    command = _suite(tmp_path, "import os\n\ndef test_a():\n    pass\n\n"
                               "def test_b():\n    os._exit(0)\n\ndef test_c():\n    pass\n")
    assert subprocess.run(command, capture_output=True).returncode == 0  # pytest alone calls it green
    assert course.finished_pytest(command, dict(os.environ)) == 1


def test_a_run_that_finishes_every_test_keeps_its_status(tmp_path):
    import os

    green = _suite(tmp_path, "def test_a():\n    pass\n")
    assert course.finished_pytest(green, dict(os.environ)) == 0
    red = _suite(tmp_path, "def test_a():\n    assert False\n")
    assert course.finished_pytest(red, dict(os.environ)) == 1


def test_the_test_command_refuses_to_start_inside_its_own_run(monkeypatch, capsys):
    started = []
    monkeypatch.setenv("COURSE_TEST_NESTED", "1")
    monkeypatch.setattr(course, "ensure_environment", lambda extras: started.append(extras))
    assert course.test([]) == 2 and started == []
    assert "inside its own test run" in capsys.readouterr().out


def test_a_deselected_test_is_not_counted_as_one_that_never_finished(tmp_path):
    import os

    command = _suite(tmp_path, "import pytest\n\n@pytest.mark.slow\ndef test_a():\n    pass\n\n"
                               "def test_b():\n    pass\n")
    assert course.finished_pytest([*command, "-m", "not slow"], dict(os.environ)) == 0
    listing = subprocess.run([*command, "--collect-only"], capture_output=True, text=True)
    assert listing.returncode == 0 and "never finished" not in listing.stdout


@pytest.mark.parametrize("path, expected", [
    ("helpers/training/muon.py", ["tests/training/test_muon.py"]),
    ("helpers/lab/exercises/gpt.py", ["tests/lab/exercises/test_gpt.py"]),
    ("helpers/lab/exercises/__init__.py", ["tests/lab/exercises/test_check.py"]),
    ("helpers/lab/exercises/_post_slips.py", ["tests/lab/exercises/test_post_training.py"]),
    ("helpers/checks.py", ["tests/test_checks.py"]),
    ("tests/model/test_gpt.py", ["tests/model/test_gpt.py"]),
])
def test_check_maps_a_module_to_the_tests_that_mirror_it(path, expected):
    assert [str(t.relative_to(ROOT)) for t in course.mirrored_tests(path)] == expected


def test_check_maps_a_module_without_a_file_to_the_tests_that_import_it(tmp_path):
    (tmp_path / "helpers" / "post").mkdir(parents=True)
    (tmp_path / "tests" / "post").mkdir(parents=True)
    (tmp_path / "helpers" / "post" / "tasks.py").write_text("FACTS = 1\n")
    (tmp_path / "tests" / "post" / "test_sft.py").write_text("from helpers.post.tasks import FACTS\n")
    (tmp_path / "tests" / "post" / "test_dpo.py").write_text("from helpers.post import dpo\n")
    found = course.mirrored_tests("helpers/post/tasks.py", root=tmp_path)
    assert found == [tmp_path / "tests" / "post" / "test_sft.py"]


@pytest.mark.parametrize("path, words", [
    ("helpers/training/no_such.py", "'helpers/training/no_such.py' is not a Python file of the course"),
    ("README.md", "'README.md' is not a Python file of the course"),
    ("tools/lesson_plan.py", "'tools/lesson_plan.py' is not under helpers/ or a test file"),
    ("", "path is '', expected a Python file of the course"),
])
def test_check_refuses_a_path_it_cannot_map_by_name(path, words, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(course, "ensure_environment", lambda extras: started.append(extras))
    monkeypatch.setattr(course, "finished_pytest", lambda *a, **k: started.append(a))
    with pytest.raises(ValueError, match=re.escape(words)):
        course.mirrored_tests(path)
    assert course.check([path]) == 2 and started == []
    assert words in capsys.readouterr().out


def test_check_without_a_path_says_how_to_call_it(capsys):
    assert course.check([]) == 2
    assert "course.py check helpers/training/muon.py" in capsys.readouterr().out


def test_check_runs_ruff_on_the_module_and_its_tests_then_pytest_on_its_tests(monkeypatch):
    calls = []
    monkeypatch.setattr(course, "ensure_environment", lambda extras: calls.append(extras))
    monkeypatch.setattr(course.subprocess, "call", lambda args, cwd, env: calls.append(args) or 0)
    monkeypatch.setattr(course, "finished_pytest", lambda args, env: calls.append(args) or 0)
    assert course.check(["helpers/training/muon.py", "--", "-k", "newton"]) == 0
    extras, lint, suite = calls
    assert extras == "lab,test"
    assert "ruff" in lint and lint[-2:] == ["helpers/training/muon.py", "tests/training/test_muon.py"]
    assert "pytest" in suite and "tests/training/test_muon.py" in suite and suite[-2:] == ["-k", "newton"]
    assert suite[suite.index("tests/training/test_muon.py") + 1:][:2] == ["-m", "not slow"]


def test_test_package_runs_lint_and_the_package_tests_without_notebooks_browsers_or_slow_ones(monkeypatch):
    calls = []
    monkeypatch.setattr(course, "ensure_environment", lambda extras: calls.append(extras))
    monkeypatch.delenv("COURSE_TEST_NESTED", raising=False)
    monkeypatch.setattr(course.subprocess, "call", lambda args, cwd, env: calls.append(args) or 0)
    monkeypatch.setattr(course, "finished_pytest", lambda args, env: calls.append(args) or 0)
    assert course.test(["--package", "-x"]) == 0
    extras, lint, suite = calls  # no second, other-CPU nbval run
    assert extras == "lab,test" and "ruff" in lint
    assert "--nbval" not in suite and "notebooks" not in suite and suite[-1] == "-x"
    assert {"--ignore=tests/notebooks", "--ignore=tests/browser"} <= set(suite)
    marks = suite[suite.index("-m", suite.index("tests")) + 1]
    assert all(f"not {m}" in marks for m in ("slow", "sections", "colab", "browser"))


def live_copy_root(tmp_path: Path) -> Path:
    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / "07_gpt.ipynb", tmp_path / "notebooks")
    return tmp_path


def test_blank_empties_one_exercise_in_a_live_copy_and_restore_puts_it_back(tmp_path, capsys):
    root = live_copy_root(tmp_path)
    instructor = json.loads((root / "notebooks" / "07_gpt.ipynb").read_text())
    answer, test = course.exercise_cell_indices(instructor, "next_token_loss")
    assert course.blank(["07_gpt", "next_token_loss"], root=root) == 0
    assert "blanked next_token_loss in live/07_gpt.ipynb" in capsys.readouterr().out
    live = json.loads((root / "live" / "07_gpt.ipynb").read_text())
    blanked = "".join(live["cells"][answer]["source"])
    assert "raise NotImplementedError()" in blanked and "### BEGIN SOLUTION" not in blanked
    assert live["cells"][answer]["outputs"] == live["cells"][test]["outputs"] == []
    others = [i for i in range(len(instructor["cells"])) if i not in (answer, test)]
    assert [live["cells"][i] for i in others] == [instructor["cells"][i] for i in others]
    assert instructor == json.loads((root / "notebooks" / "07_gpt.ipynb").read_text())  # untouched
    live["cells"][others[-1]]["outputs"] = ["what the instructor ran meanwhile"]
    (root / "live" / "07_gpt.ipynb").write_text(json.dumps(live))
    assert course.blank(["07_gpt", "gpt.next_token_loss", "--restore"], root=root) == 0
    restored = json.loads((root / "live" / "07_gpt.ipynb").read_text())
    assert restored["cells"][answer] == instructor["cells"][answer]
    assert restored["cells"][test] == instructor["cells"][test]
    assert restored["cells"][others[-1]]["outputs"] == ["what the instructor ran meanwhile"]


def test_blank_names_the_exercises_when_asked_for_one_the_notebook_lacks(tmp_path, capsys):
    root = live_copy_root(tmp_path)
    assert course.blank(["07_gpt", "no_such_exercise"], root=root) == 2
    out = capsys.readouterr().out
    assert "'no_such_exercise' is not one of this notebook's" in out and "gpt.next_token_loss" in out
    assert course.blank(["07_gpt"], root=root) == 2
    assert "usage: python3 course.py blank NOTEBOOK EXERCISE" in capsys.readouterr().out
    assert not (root / "live").exists()
