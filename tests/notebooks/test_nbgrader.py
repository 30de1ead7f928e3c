"""The round trip an instructor makes with nbgrader, on two real notebooks, in a temporary course.

`nbgrader generate_assignment` turns the instructor's notebooks (answer cells with solutions
between the markers, locked test cells with points, all marked by tools/build_notebooks.py) into
the release, which must equal `course.py student`'s notebooks; `nbgrader autograde` then grades
three students: one who hands in the reference solutions (full points), one with a typical wrong
answer to one exercise (loses that test's points, and only those), one who answered nothing
(zero); `nbgrader generate_feedback` writes pages that name the failed check and what was wrong.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from notebook_tools import NOTEBOOKS, ROOT, exercises_in, read

pytest.importorskip("nbgrader", reason="nbgrader is in the 'test' extra: pip install -e .[test]")

spec = importlib.util.spec_from_file_location("course_for_nbgrader", ROOT / "course.py")
course = importlib.util.module_from_spec(spec)
spec.loader.exec_module(course)

ASSIGNMENT = "week1"
GRADED = ["03_attention", "04_masking"]
# One typical wrong answer in the first notebook: a softmax without the shift by the row maximum
# (it overflows on logits of 1000). The cell replaces the exercise's whole answer cell.
WRONG_EXERCISE = "attention.stable_softmax"
WRONG_ANSWER = '''def my_softmax(x: torch.Tensor) -> torch.Tensor:
    exps = torch.exp(x)
    return exps / exps.sum(dim=-1, keepdim=True)'''
WRONG_SAYS = "NaN"


def nbgrader(course_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """Run `nbgrader ARGS` in the course folder with this Python (its `alembic` on PATH)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("NBGRADER_EXECUTION", None)
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course_dir, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _hand_in(course_dir: Path, student: str, notebook: str, nb: nbformat.NotebookNode) -> None:
    folder = course_dir / "submitted" / student / ASSIGNMENT
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{notebook}.ipynb")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The course folder after generate_assignment, autograde (three students) and feedback."""
    course_dir = tmp_path_factory.mktemp("nbgrader_course")
    (course_dir / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"c.CourseDirectory.root = {str(course_dir)!r}\n"
        "c.CourseDirectory.course_id = 'transformer-course'\n"
        "c.Execute.timeout = 600\n", encoding="utf-8")
    source = course_dir / "source" / ASSIGNMENT
    source.mkdir(parents=True)
    for name in GRADED:
        shutil.copy(NOTEBOOKS / f"{name}.ipynb", source / f"{name}.ipynb")
    nbgrader(course_dir, "generate_assignment", ASSIGNMENT, "--force")
    release = course_dir / "release" / ASSIGNMENT
    for name in GRADED:
        full = read(NOTEBOOKS / f"{name}.ipynb")
        _hand_in(course_dir, "reference", name, full)
        _hand_in(course_dir, "blank", name, read(release / f"{name}.ipynb"))
        wrong = read(NOTEBOOKS / f"{name}.ipynb")
        for exercise in exercises_in(wrong.cells):
            if exercise.name == WRONG_EXERCISE:
                wrong.cells[exercise.answer_index].source = WRONG_ANSWER
        _hand_in(course_dir, "slip", name, wrong)
    nbgrader(course_dir, "autograde", ASSIGNMENT, "--create", "--force")
    nbgrader(course_dir, "generate_feedback", ASSIGNMENT, "--force")
    return course_dir


def _points(notebook: str) -> dict[str, int]:
    cells = read(NOTEBOOKS / f"{notebook}.ipynb").cells
    return {e.name: cells[e.test_index].metadata["nbgrader"]["points"] for e in exercises_in(cells)}


def _scores(course_dir: Path, student: str) -> dict[str, float]:
    """Each test cell's autograded score for `student`, by grade_id."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}") as gradebook:
        submission = gradebook.find_submission(ASSIGNMENT, student)
        return {grade.name: grade.score for notebook in submission.notebooks for grade in notebook.grades}


def test_the_release_is_the_student_edition(graded):
    for name in GRADED:
        released = read(graded / "release" / ASSIGNMENT / f"{name}.ipynb")
        ours = course.student_notebook(json.loads((NOTEBOOKS / f"{name}.ipynb").read_text(encoding="utf-8")))
        ours_sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                        for c in ours["cells"]]
        assert [c.source for c in released.cells] == ours_sources, name


def test_the_reference_solutions_get_full_points(graded):
    scores = _scores(graded, "reference")
    expected = {f"{e.replace('.', '-')}-check": p for name in GRADED for e, p in _points(name).items()}
    assert scores == expected and sum(expected.values()) >= 2 * len(GRADED)


def test_a_typical_wrong_answer_loses_the_points_of_its_test_only(graded):
    scores = _scores(graded, "slip")
    wrong = f"{WRONG_EXERCISE.replace('.', '-')}-check"
    assert scores[wrong] == 0
    for name in GRADED:
        for exercise, points in _points(name).items():
            grade = f"{exercise.replace('.', '-')}-check"
            if grade != wrong:
                assert scores[grade] == points, (grade, scores[grade])


def test_an_unanswered_assignment_scores_zero(graded):
    scores = _scores(graded, "blank")
    assert scores and all(score == 0 for score in scores.values()), scores


def test_the_feedback_names_the_failed_check_and_what_was_wrong(graded):
    page = (graded / "feedback" / "slip" / ASSIGNMENT / f"{GRADED[0]}.html").read_text(encoding="utf-8")
    assert f"❌ {WRONG_EXERCISE}" in page and WRONG_SAYS in page
    blank = (graded / "feedback" / "blank" / ASSIGNMENT / f"{GRADED[0]}.html").read_text(encoding="utf-8")
    assert "not attempted yet" in blank
