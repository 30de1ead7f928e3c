"""`python3 course.py student [DIR]`: the student edition, with nbgrader's markers honoured."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("course_for_student", ROOT / "course.py")
course = importlib.util.module_from_spec(spec)
spec.loader.exec_module(course)

SOLVED = '''def f(x):
    """Square x."""
    ### BEGIN SOLUTION
    y = x * x
    return y
    ### END SOLUTION


check("x.f", f)
### BEGIN HIDDEN TESTS
assert f(3) == 9
### END HIDDEN TESTS
'''


def test_solutions_are_blanked_with_nbgraders_stub_at_their_indent():
    blanked = course.blank_solutions(SOLVED)
    assert "y = x * x" not in blanked and "assert f(3)" not in blanked and "###" not in blanked
    assert '    """Square x."""\n    # YOUR CODE HERE\n    raise NotImplementedError\n' in blanked
    assert blanked.endswith('check("x.f", f)\n')


@pytest.mark.parametrize("broken, message", [
    ("### BEGIN SOLUTION\nx = 1\n", "without its END line"),
    ("x = 1\n### END SOLUTION\n", "without its BEGIN line"),
    ("### BEGIN SOLUTION\n### BEGIN HIDDEN TESTS\n", "inside another marked region"),
    ("### BEGIN SOLUTION\nx = 1\n### END HIDDEN TESTS\n", "without its BEGIN line"),
])
def test_unbalanced_markers_are_refused(broken, message):
    with pytest.raises(ValueError, match=message):
        course.blank_solutions(broken)


def test_a_markdown_solution_reveal_goes_and_the_hints_stay():
    notebook = {"cells": [
        {"cell_type": "markdown", "source": "<details><summary>Hint 1</summary>\nthe idea\n</details>\n\n"
                                            "<details><summary>Solution</summary>\n\n```python\nx = 1\n```\n</details>\n"},
        {"cell_type": "code", "source": ["x = 2\n"], "outputs": [{"output_type": "stream"}],
         "execution_count": 3}], "metadata": {"widgets": {"state": {}}}}
    student = course.student_notebook(notebook)
    assert "Hint 1" in student["cells"][0]["source"] and "x = 1" not in student["cells"][0]["source"]
    assert student["cells"][1]["outputs"] == [] and student["cells"][1]["execution_count"] is None
    assert "widgets" not in student["metadata"]


def test_the_edition_of_every_notebook_keeps_its_exercises_and_loses_its_solutions(tmp_path):
    assert course.main(["student", str(tmp_path)]) == 0
    names = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(p.name for p in tmp_path.glob("*.ipynb")) == names
    for name in names:
        full = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))
        cells = json.loads((tmp_path / name).read_text(encoding="utf-8"))["cells"]
        text = "".join(c["source"] for c in cells)
        assert "Solution</summary>" not in text and "### BEGIN SOLUTION" not in text, name
        assert all(c.get("outputs", []) == [] for c in cells if c["cell_type"] == "code"), name
        stubs = sum('check("' in "".join(c["source"]) for c in full["cells"] if c["cell_type"] == "code")
        assert stubs >= 1 and sum('check("' in c["source"] for c in cells if c["cell_type"] == "code") == stubs


def test_a_student_notebook_runs_top_to_bottom_and_says_not_attempted(tmp_path):
    course.main(["student", str(tmp_path)])
    notebook = json.loads((tmp_path / "04_masking.ipynb").read_text(encoding="utf-8"))
    import nbformat

    nb = nbformat.reads(json.dumps(notebook), as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    stubs = [c for c in nb.cells if c.cell_type == "code" and 'check("' in c.source]
    for cell in stubs:
        assert "not attempted yet" in "".join(o.get("text", "") for o in cell.outputs)


def test_the_edition_never_overwrites_the_notebooks(capsys):
    assert course.main(["student", str(ROOT / "notebooks")]) == 2
    assert "must not overwrite" in capsys.readouterr().out


# --- every student notebook, top to bottom --------------------------------------------------
# Running all fourteen student notebooks costs about seven minutes on a 2-core CPU, on top of
# the two strict nbval passes that already run each notebook. The student edition changes a
# notebook's code only where a code cell holds `### BEGIN SOLUTION` (markdown reveals and outputs
# do not run), so: a notebook whose student code differs from the full edition's is run here,
# top to bottom; one whose code is the same cell for cell is the very program strict nbval runs
# (twice), whose stored outputs say "not attempted yet" at every stub (test_exercises.py's
# test_stored_stubs_say_not_attempted) and "using ... instead" at every fallback (below), and is
# skipped here saying so. COURSE_STUDENT_RUN=all runs every one of them here anyway.
FULL_NAMES = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
FALLBACK = "yours_or("


def _code(cells: list) -> list[str]:
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def _said(cell) -> str:
    """What a code cell printed (its stream outputs), from nbformat or raw JSON."""
    return "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))


@pytest.fixture(scope="module")
def edition(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("student")
    assert course.main(["student", str(folder)]) == 0
    return folder


@pytest.mark.parametrize("name", FULL_NAMES)
def test_student_code_is_the_full_code_with_only_its_solutions_blanked(name, edition):
    full = _code(json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"])
    student = _code(json.loads((edition / name).read_text(encoding="utf-8"))["cells"])
    assert len(student) == len(full), name
    for mine, theirs in zip(student, full, strict=True):
        assert mine == course.blank_solutions(theirs), name


@pytest.mark.parametrize("name", FULL_NAMES)
def test_stored_fallbacks_say_the_helper_runs_instead(name):
    """The full edition's stubs are unanswered, so every cell that needs a student's function
    runs the helper's and its stored output says so (nbval then checks a fresh run says it too)."""
    cells = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"]
    for cell in cells:
        if cell["cell_type"] == "code" and FALLBACK in "".join(cell["source"]):
            said = _said(cell)
            assert "using the course's" in said and "not attempted yet" in said, (name, said)


@pytest.mark.parametrize("name", FULL_NAMES)
def test_every_student_notebook_runs_top_to_bottom_and_says_not_attempted(name, edition):
    import os

    import nbformat

    full = _code(json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"])
    nb = nbformat.read(edition / name, as_version=4)
    same_code = [c.source for c in nb.cells if c.cell_type == "code"] == full
    if same_code and os.environ.get("COURSE_STUDENT_RUN") != "all":
        pytest.skip("its student code is the full edition's cell for cell, which strict nbval runs "
                    "top to bottom; COURSE_STUDENT_RUN=all runs it here too")
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    stubs = [c for c in nb.cells if c.cell_type == "code" and 'check("' in c.source]
    assert stubs, f"{name} has no exercise"
    for cell in stubs:
        assert "not attempted yet" in _said(cell), (name, cell.source[:80], _said(cell))
    for cell in nb.cells:
        if cell.cell_type == "code" and FALLBACK in cell.source:
            assert "not attempted yet: using" in _said(cell), (name, _said(cell))
