"""Every exercise's published solution passes its checker, and the untouched stub does not.

Each notebook is run in a fresh kernel with every stub cell (a code cell calling `check(...)`
followed by a solution block) replaced by that solution, in strict mode, where a failing check
raises. Running the real notebook, rather than the solution alone, gives each solution the
variables the cells above it defined.
"""

from __future__ import annotations

import pytest
from nbclient import NotebookClient
from notebook_tools import NOTEBOOKS, notebook_paths, read, solution_after

import helpers.exercises as exercises

NOTEBOOK_IDS = [p.stem for p in notebook_paths()]
STRICT_CELL = "import helpers.exercises\nhelpers.exercises.STRICT = True"


def with_solutions(name: str):
    nb = read(NOTEBOOKS / f"{name}.ipynb")
    replaced = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and 'check("' in cell.source:
            solution = solution_after(nb.cells, index)
            assert solution is not None, f"{name} cell {index}: an exercise without a solution block after it"
            cell.source = solution
            replaced += 1
    first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells.insert(first_code + 1, type(nb.cells[first_code])(cell_type="code", source=STRICT_CELL,
                                                                metadata={}, outputs=[], execution_count=None))
    return nb, replaced


@pytest.mark.parametrize("name", NOTEBOOK_IDS)
def test_every_solution_passes_its_check(name):
    nb, replaced = with_solutions(name)
    assert replaced >= 1, f"{name} has no checked exercise"
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    passed = sum("✅" in "".join(o.get("text", "") for o in c.get("outputs", []))
                 for c in nb.cells if c.cell_type == "code")
    assert passed >= replaced


@pytest.mark.parametrize("name", NOTEBOOK_IDS)
def test_stored_stubs_say_not_attempted(name):
    cells = read(NOTEBOOKS / f"{name}.ipynb").cells
    for cell in cells:
        if cell.cell_type == "code" and 'check("' in cell.source:
            text = "".join(o.get("text", "") for o in cell.outputs)
            assert "not attempted yet" in text, f"{name}: a stub's stored output is {text!r}"


def test_every_registered_exercise_is_used_by_a_notebook():
    used = "\n".join(c.source for p in notebook_paths() for c in read(p).cells if c.cell_type == "code")
    for name in exercises.all_exercises():
        if name.startswith("test_"):
            continue  # registered by this file's own tests
        assert f'check("{name}"' in used, f"exercise {name} is registered but no notebook uses it"


def test_check_reports_problems_without_a_traceback(capsys):
    from helpers.exercises import ExerciseFailed, check, exercise

    @exercise(hint="return 42")
    def answer_is_42(fn):
        if fn() != 42:
            raise ExerciseFailed(f"got {fn()!r}, expected 42")

    def stub():
        raise NotImplementedError

    verdicts = {}
    for label, answer in [("right", lambda: 42), ("wrong", lambda: 41), ("crash", lambda: 1 / 0),
                          ("stub", stub)]:
        assert check("test_exercises.answer_is_42", answer) is None
        verdicts[label] = capsys.readouterr().out
    assert verdicts["right"].startswith("✅")
    assert verdicts["wrong"].startswith("❌") and "got 41, expected 42" in verdicts["wrong"]
    assert "ZeroDivisionError" in verdicts["crash"] and "Traceback" not in verdicts["crash"]
    assert "not attempted yet" in verdicts["stub"] and "Hint: return 42" in verdicts["stub"]
    with pytest.raises(KeyError, match="no exercise"):
        check("test_exercises.nope", stub)


def test_strict_mode_raises_on_a_wrong_answer(monkeypatch):
    from helpers.exercises import ExerciseFailed, check, exercise

    @exercise(hint="return 7")
    def answer_is_7(fn):
        if fn() != 7:
            raise ExerciseFailed("not 7")

    monkeypatch.setattr(exercises, "STRICT", True)
    check("test_exercises.answer_is_7", lambda: 7)
    with pytest.raises(AssertionError, match="not 7"):
        check("test_exercises.answer_is_7", lambda: 8)
