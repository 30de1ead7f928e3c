"""`python3 course.py student [DIR]`: a folder to hand out, with nbgrader's markers honoured.

The folder holds the student notebooks, the `helpers` package and the data they import, the
files that install them, and a README with one command that says what each of them is; no
instructor's notebook, no notebook source, no notebook's solution in it. Written again on the same
folder, it loses nothing of the students' (their answers, their own files, `.venv`, `.git`) and
says what it kept. An nbgrader marker outside an answer or test cell stops it, naming the cell.
(Each student notebook running top to bottom, every exercise "not attempted", is
tests/notebooks/test_exercises.py's.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from notebook_tools import exercises_in, lesson_cells, notebook_paths, read

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


def test_the_student_edition_drops_the_speaker_notes_and_keeps_the_slide_marks():
    slide = {"slideshow": {"slide_type": "slide"}}
    notebook = {"cells": [
        {"cell_type": "markdown", "metadata": slide, "source": "## 1. A section (core)"},
        {"cell_type": "markdown", "metadata": {"slideshow": {"slide_type": "notes"}},
         "source": "Ask the room what a dot product measures."},
        {"cell_type": "code", "metadata": {"slideshow": {"slide_type": "fragment"}}, "source": "x = 2",
         "outputs": [], "execution_count": 1}], "metadata": {}}
    student = course.student_notebook(notebook)
    assert [cell["source"] for cell in student["cells"]] == ["## 1. A section (core)", "x = 2"]
    assert student["cells"][0]["metadata"] == slide


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
        for exercise in exercises_in(lesson_cells(full.cells)):  # the edition has no speaker notes
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


def test_the_edition_never_writes_into_a_folder_of_other_files_unasked(tmp_path, capsys):
    (tmp_path / "thesis.tex").write_text("mine")
    (tmp_path / "notebooks").mkdir()  # a folder of the user's own that merely has notebooks/
    (tmp_path / "notebooks" / "mine.ipynb").write_text("{}")
    assert course.main(["student", str(tmp_path)]) == 2
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["mine.ipynb", "notebooks", "thesis.tex"]
    said = capsys.readouterr().out
    assert "did not write" in said and "--force" in said


# A course of one notebook, small enough to write an edition of, change and write again.
def notebook_json(answer: str, markdown: str = "# 1. Tiny") -> str:
    cells = [{"cell_type": "markdown", "id": "a", "metadata": {}, "source": markdown},
             {"cell_type": "code", "id": "b", "metadata": {"nbgrader": {"solution": True, "grade": False}},
              "execution_count": 1, "outputs": [],
              "source": f"def f(x):\n    ### BEGIN SOLUTION\n    return {answer}\n    ### END SOLUTION\n"}]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


@pytest.fixture
def tiny_course(tmp_path) -> Path:
    root = tmp_path / "course"
    for name, text in {"helpers/__init__.py": "", "helpers/old.py": "OLD = 1\n",
                       "helpers/mine_later.py": "X = 1\n", "data/corpus.txt": "text\n",
                       "pyproject.toml": "", "constraints.txt": "", "course.py": "",
                       "notebooks/01_tiny.ipynb": notebook_json("x * x"),
                       "notebooks/src/01_tiny.py": ""}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def edition_of(root: Path, target: Path, *flags: str) -> int:
    return course.student([*flags, str(target)], root=root)


def test_a_refresh_keeps_every_file_of_the_students_and_updates_the_rest(tiny_course, tmp_path, capsys):
    target = tmp_path / "handout"
    assert edition_of(tiny_course, target) == 0
    written = json.loads((target / course.MANIFEST).read_text())["files"]
    assert "notebooks/01_tiny.ipynb" in written and "README.md" in written
    # The students work: answers in the notebook, files of their own, a .venv, a git repository.
    theirs = {"notebooks/01_tiny.ipynb": "my answers", "notebooks/scratch.ipynb": "mine",
              ".venv/bin/python": "venv", ".git/HEAD": "ref: refs/heads/main",
              "helpers/mine_later.py": "X = 2  # my change\n"}
    for name, text in theirs.items():
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (target / name).write_text(text)
    # The course changes: a new notebook, a module gone, two more gone (one the students changed).
    (tiny_course / "notebooks" / "02_more.ipynb").write_text(notebook_json("x + 1"))
    (tiny_course / "helpers" / "old.py").unlink()
    (tiny_course / "helpers" / "mine_later.py").unlink()
    (tiny_course / "data" / "corpus.txt").write_text("new text\n")
    capsys.readouterr()
    assert edition_of(tiny_course, target) == 0
    said = capsys.readouterr().out
    for name, text in theirs.items():
        assert (target / name).read_text() == text, f"{name} was lost"
    assert (target / "notebooks" / "02_more.ipynb").is_file()
    assert (target / "data" / "corpus.txt").read_text() == "new text\n"  # unchanged since written
    assert not (target / "helpers" / "old.py").exists()  # written, never changed, gone from the course
    assert "notebooks/01_tiny.ipynb" in said and "helpers/mine_later.py" in said
    assert f"python3 course.py student --force {target}" in said
    # Run again: still kept, still reported, since the list remembers what was written there.
    assert edition_of(tiny_course, target) == 0
    assert (target / "notebooks" / "01_tiny.ipynb").read_text() == "my answers"
    assert "notebooks/01_tiny.ipynb" in capsys.readouterr().out


def test_force_replaces_a_changed_file_keeping_the_students_version_beside_it(tiny_course, tmp_path, capsys):
    target = tmp_path / "handout"
    edition_of(tiny_course, target)
    notebook = target / "notebooks" / "01_tiny.ipynb"
    for attempt in ("first answers", "second answers"):
        notebook.write_text(attempt)
        assert edition_of(tiny_course, target, "--force") == 0
        assert "raise NotImplementedError()" in notebook.read_text()
    kept = sorted(p.name for p in notebook.parent.glob("01_tiny.before-refresh*"))
    assert kept == ["01_tiny.before-refresh-2.ipynb", "01_tiny.before-refresh.ipynb"]
    assert (notebook.parent / "01_tiny.before-refresh.ipynb").read_text() == "first answers"
    assert (notebook.parent / "01_tiny.before-refresh-2.ipynb").read_text() == "second answers"
    assert "01_tiny.before-refresh-2.ipynb" in capsys.readouterr().out


def test_force_writes_into_an_older_edition_without_its_list_and_loses_nothing(tiny_course, tmp_path):
    target = tmp_path / "handout"
    edition_of(tiny_course, target)
    (target / course.MANIFEST).unlink()  # as an edition written before the list existed
    (target / "notebooks" / "01_tiny.ipynb").write_text("my answers")
    (target / "notes.md").write_text("mine")
    assert edition_of(tiny_course, target) == 2
    assert edition_of(tiny_course, target, "--force") == 0
    assert (target / "notes.md").read_text() == "mine"
    assert (target / "notebooks" / "01_tiny.before-refresh.ipynb").read_text() == "my answers"
    assert (target / course.MANIFEST).is_file()


def test_an_edition_kept_in_git_can_be_refreshed(tiny_course, tmp_path):
    target = tmp_path / "handout"
    edition_of(tiny_course, target)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(target)]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "edition 1"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    (tiny_course / "notebooks" / "01_tiny.ipynb").write_text(notebook_json("x * x", "# 1. Tiny, fixed"))
    assert edition_of(tiny_course, target) == 0
    status = subprocess.run([*git, "status", "--short"], capture_output=True, text=True, check=True).stdout
    changed = sorted(line.split()[-1] for line in status.splitlines())
    assert changed == [course.MANIFEST, "notebooks/01_tiny.ipynb"]  # the changed notebook, its hash
    assert "Tiny, fixed" in (target / "notebooks" / "01_tiny.ipynb").read_text()


def test_a_hand_edited_list_is_refused_and_cannot_reach_outside_the_folder(tiny_course, tmp_path, capsys):
    target = tmp_path / "handout"
    edition_of(tiny_course, target)
    outside = tmp_path / "precious.txt"
    outside.write_text("keep")
    listed = json.loads((target / course.MANIFEST).read_text())
    listed["files"]["../precious.txt"] = course.digest(b"keep")
    (target / course.MANIFEST).write_text(json.dumps(listed))
    assert edition_of(tiny_course, target) == 0
    assert outside.read_text() == "keep"
    (target / course.MANIFEST).write_text("not json")
    assert edition_of(tiny_course, target) == 2
    assert "is not the list" in capsys.readouterr().out


def test_a_solution_marker_in_markdown_stops_the_edition_naming_the_cell(tiny_course, tmp_path, capsys):
    leaking = notebook_json("x * x", "# 1. Tiny\n\n```python\n### BEGIN SOLUTION\nsecret = 1\n"
                                     "### END SOLUTION\n```")
    (tiny_course / "notebooks" / "01_tiny.ipynb").write_text(leaking)
    assert edition_of(tiny_course, tmp_path / "handout") == 1
    said = capsys.readouterr().out
    assert "notebooks/01_tiny.ipynb: cell 0 (id a), a markdown cell" in said
    assert "'### BEGIN SOLUTION'" in said
    assert not (tmp_path / "handout").exists()


@pytest.mark.parametrize("cell, where", [
    ({"cell_type": "markdown", "metadata": {}, "source": "Text\n### END SOLUTION"}, "a markdown cell"),
    ({"cell_type": "code", "metadata": {}, "source": "x = 1\n### BEGIN HIDDEN TESTS\n### END HIDDEN TESTS"},
     "a code cell"),
    ({"cell_type": "code", "metadata": {"nbgrader": {"solution": True}},
      "source": "### BEGIN HIDDEN TESTS\n### END HIDDEN TESTS"}, "a code cell"),
])
def test_student_notebook_refuses_a_marker_outside_its_cell(cell, where):
    graded = {"cell_type": "code", "metadata": {"nbgrader": {"grade": True}}, "source": "check('x.f', f)"}
    with pytest.raises(ValueError, match=f"cell 1, {where} starting .* which belongs in"):
        course.student_notebook({"cells": [graded, cell], "metadata": {}})


def test_a_notebook_without_nbgraders_metadata_is_blanked_by_its_markers_alone():
    notebook = {"cells": [{"cell_type": "code", "metadata": {}, "source": SOLVED, "outputs": []},
                          {"cell_type": "code", "metadata": {}, "source": TESTED, "outputs": []}],
                "metadata": {}}
    cells = course.student_notebook(notebook)["cells"]
    assert "raise NotImplementedError()" in cells[0]["source"] and "assert" not in cells[1]["source"]


def test_the_readme_says_what_each_thing_in_the_folder_is(edition):
    readme = (edition / "README.md").read_text(encoding="utf-8")
    for entry in edition.iterdir():
        if entry.name != "README.md":
            assert f"`{entry.name}{'/' if entry.is_dir() else ''}`" in readme, entry.name
    assert "No solution is anywhere" not in readme  # helpers/ holds the course's own versions
    assert "does not accept it as an answer" in readme
    assert "%pip install -e .." in readme and "## In another Jupyter" in readme
