"""`python3 course.py student [DIR]`: a folder to hand out, with nbgrader's markers honoured.

The folder holds the student notebooks, the `helpers` package and the data they import, the
files that install them, and a README with one command; no instructor's notebook, no notebook
source, no solution anywhere in it. (Each student notebook running top to bottom, every exercise
"not attempted", is tests/notebooks/test_exercises.py's.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from notebook_tools import exercises_in, notebook_paths, read

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("course_for_student", ROOT / "course.py")
course = importlib.util.module_from_spec(spec)
spec.loader.exec_module(course)

SOLVED = '''def f(x):
    """Square x."""
    ### BEGIN SOLUTION
    y = x * x
    return y
    ### END SOLUTION
'''
TESTED = '''check("x.f", f)
### BEGIN HIDDEN TESTS
assert f(3) == 9
### END HIDDEN TESTS
'''


def test_solutions_become_nbgraders_stub_at_their_indent_and_hidden_tests_go():
    assert course.blank_solutions(SOLVED) == ('def f(x):\n    """Square x."""\n    # YOUR CODE HERE\n'
                                              '    raise NotImplementedError()\n')
    assert course.blank_solutions(TESTED) == 'check("x.f", f)\n'


@pytest.mark.parametrize("broken, message", [
    ("### BEGIN SOLUTION\nx = 1\n", "without its END line"),
    ("x = 1\n### END SOLUTION\n", "without its BEGIN line"),
    ("### BEGIN SOLUTION\n### BEGIN HIDDEN TESTS\n", "inside another marked region"),
    ("### BEGIN SOLUTION\nx = 1\n### END HIDDEN TESTS\n", "without its BEGIN line"),
])
def test_unbalanced_markers_are_refused(broken, message):
    with pytest.raises(ValueError, match=message):
        course.blank_solutions(broken)


def test_outputs_and_saved_widget_state_are_cleared():
    notebook = {"cells": [
        {"cell_type": "markdown", "source": "<details><summary>Hint 1: the idea</summary>x</details>"},
        {"cell_type": "code", "source": ["x = 2\n"], "outputs": [{"output_type": "stream"}],
         "execution_count": 3}], "metadata": {"widgets": {"state": {}}}}
    student = course.student_notebook(notebook)
    assert "Hint 1" in student["cells"][0]["source"]
    assert student["cells"][1]["outputs"] == [] and student["cells"][1]["execution_count"] is None
    assert "widgets" not in student["metadata"]


@pytest.fixture(scope="module")
def edition(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("handout") / "student"
    assert course.main(["student", str(folder)]) == 0
    return folder


def test_the_folder_holds_what_runs_and_nothing_of_the_instructors(edition):
    names = sorted(p.name for p in notebook_paths())
    assert sorted(p.name for p in (edition / "notebooks").glob("*.ipynb")) == names
    assert (edition / "helpers" / "lab" / "exercises" / "__init__.py").is_file()
    assert (edition / "data" / "corpus.txt").is_file() and (edition / "pyproject.toml").is_file()
    assert "python3 course.py lab" in (edition / "README.md").read_text(encoding="utf-8")
    for absent in ("notebooks/src", "tests", "tools", "benchmarks", ".ci", "CONTRIBUTING.md", ".git"):
        assert not (edition / absent).exists(), absent
    assert not list(edition.rglob("__pycache__"))


def _normalised(text: str) -> str:
    return " ".join(text.split())


def test_no_solution_is_anywhere_in_the_folder(edition):
    """Every solution's text (whitespace aside) is searched in every file of the folder."""
    solutions = [(path.stem, exercise) for path in notebook_paths() for exercise in exercises_in(read(path).cells)]
    assert len(solutions) >= 2 * len(notebook_paths())
    files = {path: _normalised(path.read_text(encoding="utf-8", errors="replace"))
             for path in edition.rglob("*") if path.is_file() and path.suffix in (".py", ".ipynb", ".md", ".txt", ".json", ".toml")}
    for name, exercise in solutions:
        block = _normalised(exercise.solution)
        for path, text in files.items():
            assert block not in text, f"{name}: {exercise.name}'s solution is in {path}"
            if path.suffix == ".ipynb":
                for line in exercise.solution_lines():
                    code = _normalised(line)
                    assert len(code) < 25 or json.dumps(code)[1:-1] not in text, \
                        f"{name}: {exercise.name}'s line {code!r} is in {path.name}"


def test_every_exercise_keeps_its_stub_and_its_check(edition):
    for path in notebook_paths():
        full = read(path)
        student = nbformat.read(edition / "notebooks" / path.name, as_version=4)
        for exercise in exercises_in(full.cells):
            assert "raise NotImplementedError()" in student.cells[exercise.answer_index].source
            assert "### BEGIN" not in student.cells[exercise.answer_index].source
            assert student.cells[exercise.test_index].source.startswith(f'check("{exercise.name}"')
            assert student.cells[exercise.test_index].metadata["nbgrader"]["locked"]


def test_a_notebook_runs_on_the_folders_own_package(edition):
    """With the folder's copy of helpers first on the path, a student notebook runs top to bottom."""
    nb = nbformat.read(edition / "notebooks" / "04_masking.ipynb", as_version=4)
    nb.cells.insert(1, nbformat.v4.new_code_cell("import helpers\nprint(helpers.__file__)"))
    env = {**os.environ, "PYTHONPATH": str(edition)}
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(edition / "notebooks")}})
    previous = os.environ.get("PYTHONPATH")
    os.environ.update(env)
    try:
        client.execute()
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = previous
    said = "".join(o.get("text", "") for o in nb.cells[1].outputs)
    assert str(edition) in said
    checks = [c for c in nb.cells if c.cell_type == "code" and re.match(r'check\("', c.source)]
    assert checks and all("not attempted yet" in "".join(o.get("text", "") for o in c.outputs) for c in checks)


def test_the_folders_course_py_offers_only_lab(edition, capsys):
    spec = importlib.util.spec_from_file_location("student_course", edition / "course.py")
    theirs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(theirs)
    assert theirs.main(["test"]) == 2
    assert "student edition" in capsys.readouterr().out
    folder, rest = theirs.lab_folder([])
    assert folder == edition / "notebooks" and rest == []


def test_lab_opens_a_folder_given_to_it(edition, tmp_path):
    assert course.lab_folder([str(edition)]) == (edition / "notebooks", [])
    assert course.lab_folder([str(tmp_path), "--port", "9"]) == (tmp_path, ["--port", "9"])
    assert course.lab_folder(["--port", "9"]) == (ROOT / "notebooks", ["--port", "9"])
    assert "no folder" in course.lab_folder([str(tmp_path / "missing")])


@pytest.mark.parametrize("where", ["notebooks", "helpers", ".", ".."])
def test_the_edition_never_overwrites_the_course(where, capsys):
    assert course.main(["student", str(ROOT / where)]) == 2
    assert "folder of its own" in capsys.readouterr().out


def test_the_edition_never_empties_a_folder_of_other_files(tmp_path, capsys):
    (tmp_path / "thesis.tex").write_text("mine")
    assert course.main(["student", str(tmp_path)]) == 2
    assert (tmp_path / "thesis.tex").read_text() == "mine"
    assert "holds other files" in capsys.readouterr().out
