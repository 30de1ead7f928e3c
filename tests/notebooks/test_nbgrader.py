"""The round trip an instructor makes with nbgrader, on two real notebooks, in a temporary course.

`nbgrader generate_assignment` turns the instructor's notebooks (answer cells with solutions
between the markers, locked test cells with points, all marked by tools/build_notebooks.py) into
the release, which must equal `course.py student`'s notebooks; `nbgrader autograde`, with the
repository's own nbgrader_config.py, then grades: one student who hands in the reference
solutions (full points), one with a typical wrong answer to one exercise (loses that test's
points, and only those), one who answered nothing (zero), students who try to pass without
writing the answer (the course's own softmax, a library softmax captured under another name, a
redefined `check`: 0 on what they touch, the feedback naming the call), and mangled submissions
(an endless loop, a cell that raises, a kernel that dies, a deleted or edited locked cell, an
empty notebook), each graded within the time bound; `nbgrader generate_feedback` writes pages
that name the failed check, what was wrong and how to fix it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
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


CELL_LIMIT = 20  # seconds a cell may run here (the repository's config allows 180 on a slow grader)


def nbgrader(course_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """Run `nbgrader ARGS` from the repository, so that its nbgrader_config.py is the one read,
    on the course folder `course_dir`, with this Python (its `alembic` on PATH)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("NBGRADER_EXECUTION", None)
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={course_dir}",
                           f"--Execute.timeout={CELL_LIMIT}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    assert "Exception while loading config" not in done.stderr, done.stderr
    return done


def _hand_in(course_dir: Path, student: str, notebook: str, nb: nbformat.NotebookNode) -> None:
    folder = course_dir / "submitted" / student / ASSIGNMENT
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{notebook}.ipynb")


def _with_answer(nb: nbformat.NotebookNode, exercise: str, source: str) -> nbformat.NotebookNode:
    """A copy of `nb` whose answer cell for `exercise` holds `source`."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for found in exercises_in(nb.cells):
        if found.name == exercise:
            nb.cells[found.answer_index].source = source
    return nb


FIRST = GRADED[0]
# Students of the first notebook who try to pass without writing its first answer, or hand in a
# mangled notebook: (what they hand in, given the instructor's notebook).
COURSE_CALL = ("from helpers.model.attention import softmax as _ours\n\n"
               "def my_softmax(x):\n    return _ours(x)")
SUBCLASS = ("from helpers.model.attention import AttentionLayer\n\n"
            "class MyAttentionLayer(AttentionLayer):\n    pass")
ALIAS = "import torch\n\n_soft = torch.special.softmax\n\ndef my_softmax(x):\n    return _soft(x, -1)"


def _tries(full: nbformat.NotebookNode) -> dict[str, nbformat.NotebookNode]:
    found = {e.name: e for e in exercises_in(full.cells)}
    first = found[WRONG_EXERCISE]
    redefined = _with_answer(full, WRONG_EXERCISE, "def check(*args, **kwargs):\n    print('✅ correct!')\n\n"
                             + WRONG_ANSWER)
    deleted = nbformat.from_dict(json.loads(json.dumps(full)))
    del deleted.cells[first.test_index]
    edited = _with_answer(full, WRONG_EXERCISE, WRONG_ANSWER)
    edited.cells[first.test_index].source = "print('✅ correct!')"
    empty = nbformat.from_dict(json.loads(json.dumps(full)))
    empty.cells = []
    return {"course_call": _with_answer(full, WRONG_EXERCISE, COURSE_CALL),
            "subclass": _with_answer(full, "attention.attention_layer", SUBCLASS),
            "alias": _with_answer(full, WRONG_EXERCISE, ALIAS),
            "redefined_check": redefined,
            "endless_loop": _with_answer(full, WRONG_EXERCISE, "while True:\n    pass"),
            "raises": _with_answer(full, WRONG_EXERCISE, "raise ValueError('half-written')"),
            "kernel_dies": _with_answer(full, WRONG_EXERCISE, "import os\n\nos._exit(1)"),
            "deleted_test": deleted, "edited_test": edited, "empty": empty}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The course folder after generate_assignment, autograde and feedback, with the seconds autograde took."""
    course_dir = tmp_path_factory.mktemp("nbgrader_course")
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
        _hand_in(course_dir, "slip", name, _with_answer(full, WRONG_EXERCISE, WRONG_ANSWER))
    for student, nb in _tries(read(NOTEBOOKS / f"{FIRST}.ipynb")).items():
        _hand_in(course_dir, student, FIRST, nb)
    started = time.monotonic()
    nbgrader(course_dir, "autograde", ASSIGNMENT, "--create", "--force")
    seconds = time.monotonic() - started
    nbgrader(course_dir, "generate_feedback", ASSIGNMENT, "--force")
    return course_dir, seconds


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
    graded, _ = graded
    for name in GRADED:
        released = read(graded / "release" / ASSIGNMENT / f"{name}.ipynb")
        ours = course.student_notebook(json.loads((NOTEBOOKS / f"{name}.ipynb").read_text(encoding="utf-8")))
        ours_sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                        for c in ours["cells"]]
        assert [c.source for c in released.cells] == ours_sources, name


def test_the_reference_solutions_get_full_points(graded):
    graded, _ = graded
    scores = _scores(graded, "reference")
    expected = {f"{e.replace('.', '-')}-check": p for name in GRADED for e, p in _points(name).items()}
    assert scores == expected and sum(expected.values()) >= 2 * len(GRADED)


def test_a_typical_wrong_answer_loses_the_points_of_its_test_only(graded):
    graded, _ = graded
    scores = _scores(graded, "slip")
    wrong = f"{WRONG_EXERCISE.replace('.', '-')}-check"
    assert scores[wrong] == 0
    for name in GRADED:
        for exercise, points in _points(name).items():
            grade = f"{exercise.replace('.', '-')}-check"
            if grade != wrong:
                assert scores[grade] == points, (grade, scores[grade])


def test_an_unanswered_assignment_scores_zero(graded):
    graded, _ = graded
    scores = _scores(graded, "blank")
    assert scores and all(score == 0 for score in scores.values()), scores


def test_the_feedback_names_the_failed_check_and_what_was_wrong(graded):
    graded, _ = graded
    page = (graded / "feedback" / "slip" / ASSIGNMENT / f"{GRADED[0]}.html").read_text(encoding="utf-8")
    assert f"❌ {WRONG_EXERCISE}" in page and WRONG_SAYS in page and "How to fix it" in page
    # the message at once, and no traceback (the page's stylesheet names a "Generic.Traceback" style)
    assert "second wrong try" not in page and "most recent call last" not in page
    assert "Cell In[" not in page and str(ROOT) not in page
    blank = (graded / "feedback" / "blank" / ASSIGNMENT / f"{GRADED[0]}.html").read_text(encoding="utf-8")
    assert "not attempted yet" in blank


def _first_check(exercise: str = WRONG_EXERCISE) -> str:
    return f"{exercise.replace('.', '-')}-check"


def _others_as_reference(graded_dir: Path, student: str) -> None:
    """Every exercise of the first notebook but the tried one scores as the reference does."""
    scores, reference = _scores(graded_dir, student), _scores(graded_dir, "reference")
    for exercise in _points(FIRST):
        if exercise != WRONG_EXERCISE:
            assert scores[_first_check(exercise)] == reference[_first_check(exercise)], (student, exercise)


@pytest.mark.parametrize("student, names", [("course_call", "helpers.model.attention.softmax"),
                                            ("alias", "torch.special.softmax")])
def test_an_answer_that_calls_someone_elses_softmax_scores_zero_and_is_told_the_call(graded, student, names):
    graded_dir, _ = graded
    assert _scores(graded_dir, student)[_first_check()] == 0
    _others_as_reference(graded_dir, student)  # its stand-in carries the later exercises
    page = (graded_dir / "feedback" / student / ASSIGNMENT / f"{FIRST}.html").read_text(encoding="utf-8")
    assert f"your code calls {names}" in page


def test_a_subclass_of_the_courses_layer_scores_zero_for_that_exercise_only(graded):
    graded_dir, _ = graded
    scores, reference = _scores(graded_dir, "subclass"), _scores(graded_dir, "reference")
    assert scores[_first_check("attention.attention_layer")] == 0
    others = {_first_check(e) for e in _points(FIRST)} - {_first_check("attention.attention_layer")}
    assert {k: scores[k] for k in others} == {k: reference[k] for k in others}  # it handed in FIRST only
    page = (graded_dir / "feedback" / "subclass" / ASSIGNMENT / f"{FIRST}.html").read_text(encoding="utf-8")
    assert "helpers.model.attention.AttentionLayer" in page


def test_a_redefined_check_scores_zero_on_the_exercises_after_it(graded):
    graded_dir, _ = graded
    scores = _scores(graded_dir, "redefined_check")
    assert all(scores[_first_check(e)] == 0 for e in _points(FIRST)), scores
    page = (graded_dir / "feedback" / "redefined_check" / ASSIGNMENT / f"{FIRST}.html").read_text(encoding="utf-8")
    assert "redefines or wraps `check`" in page


@pytest.mark.parametrize("student", ["endless_loop", "raises", "kernel_dies", "deleted_test", "edited_test", "empty"])
def test_a_mangled_submission_is_graded_and_scores_nothing_for_the_mangled_exercise(graded, student):
    graded_dir, _ = graded
    scores = _scores(graded_dir, student)
    assert {_first_check(e) for e in _points(FIRST)} <= set(scores)  # graded: every test cell has a score
    assert scores[_first_check()] == 0
    if student in ("deleted_test", "edited_test"):  # nbgrader puts the locked cell back: the rest counts
        _others_as_reference(graded_dir, student)


def test_autograde_stays_within_its_time_bound(graded):
    _, seconds = graded
    runs = 3 * len(GRADED) + len(_tries(read(NOTEBOOKS / f"{FIRST}.ipynb")))
    # every notebook's cells are bounded by CELL_LIMIT; the endless loop alone uses one limit
    assert seconds < runs * 60 + CELL_LIMIT, seconds


def test_the_release_leaves_out_the_speaker_notes_as_the_student_edition_does():
    """nbgrader_config.py runs tools/nbgrader_notes.py's step first in generate_assignment."""
    sys.path.insert(0, str(ROOT / "tools"))
    from nbgrader_notes import DropSpeakerNotes

    notes = nbformat.v4.new_markdown_cell("Ask the room.", metadata={"slideshow": {"slide_type": "notes"}})
    kept = nbformat.v4.new_markdown_cell("## 1. A section", metadata={"slideshow": {"slide_type": "slide"}})
    nb = nbformat.v4.new_notebook(cells=[kept, notes, nbformat.v4.new_code_cell("x = 1")])
    released, _ = DropSpeakerNotes().preprocess(nb, {})
    assert [cell.source for cell in released.cells] == ["## 1. A section", "x = 1"]
    config = (ROOT / "nbgrader_config.py").read_text(encoding="utf-8")
    assert "c.GenerateAssignment.preprocessors = [\n    DropSpeakerNotes," in config
