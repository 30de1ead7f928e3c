"""The stored notebooks are exactly their plain-text sources, each opens with the set-up cell,
and each follows the house rules a reader can see without running it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from notebook_tools import NOTEBOOKS, ROOT, SOURCES, notebook_paths, read

sys.path.insert(0, str(ROOT / "tools"))
from build_notebooks import parse_cells, to_notebook  # noqa: E402

from helpers.lab.setup_cell import SETUP_CELL  # noqa: E402

NOTEBOOK_IDS = [p.stem for p in notebook_paths()]


def test_there_are_notebooks_and_each_has_a_source():
    assert NOTEBOOK_IDS, "no notebooks found"
    stems = {p.stem for p in SOURCES.glob("[0-9][0-9]_*.py")}
    assert stems == set(NOTEBOOK_IDS), "every notebooks/src/*.py must have its built .ipynb and vice versa"


@pytest.mark.parametrize("name", NOTEBOOK_IDS)
def test_stored_cells_equal_the_source(name):
    stored = [(c.cell_type, c.source, c.metadata.get("nbgrader"), c.metadata.get("slideshow"))
              for c in read(NOTEBOOKS / f"{name}.ipynb").cells]
    built = [(c.cell_type, c.source, c.metadata.get("nbgrader"), c.metadata.get("slideshow"))
             for c in to_notebook(SOURCES / f"{name}.py").cells]
    assert stored == built, f"{name}.ipynb differs from src/{name}.py: rebuild it with tools/build_notebooks.py"


@pytest.mark.parametrize("name", NOTEBOOK_IDS)
def test_opens_with_title_and_setup_cell(name):
    cells = read(NOTEBOOKS / f"{name}.ipynb").cells
    assert cells[0].cell_type == "markdown" and cells[0].source.startswith("# ")
    first_code = next(c for c in cells if c.cell_type == "code")
    assert first_code.source == SETUP_CELL


@pytest.mark.parametrize("name", NOTEBOOK_IDS)
def test_house_rules_visible_in_the_text(name):
    cells = read(NOTEBOOKS / f"{name}.ipynb").cells
    markdown = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    assert "## Check your understanding" in markdown
    assert "<summary>Answer</summary>" in markdown, "answers the student can reveal"
    assert "<summary>Solution</summary>" not in markdown, "solutions live in the answer cells"
    assert 'check("' in "\n".join(c.source for c in cells if c.cell_type == "code")


def test_nbcheck_reports_no_errors():
    nbcheck = ROOT / "tools" / "nbcheck.py"
    result = subprocess.run([sys.executable, str(nbcheck), str(NOTEBOOKS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


MAX_CELL_LINES = 40  # a cell does one thing; the set-up cell is the course's, not the notebook's
MAX_CELLS = {"07_gpt": 145}  # the longest notebook; 115 before each section got its catch-up cell
# and long cells were split, 137 once no code cell was longer than a screen (25 lines)


@pytest.mark.parametrize("name", NOTEBOOK_IDS)
def test_every_cell_does_one_thing(name):
    cells = read(NOTEBOOKS / f"{name}.ipynb").cells
    long = [(index, cell.cell_type, len(cell.source.splitlines())) for index, cell in enumerate(cells)
            if cell.source != SETUP_CELL and len(cell.source.splitlines()) > MAX_CELL_LINES]
    assert not long, f"{name}: cells over {MAX_CELL_LINES} lines (index, kind, lines): {long}"
    lesson = [cell for cell in cells if cell.metadata.get("slideshow", {}).get("slide_type") != "notes"]
    assert len(lesson) <= MAX_CELLS.get(name, len(lesson)), f"{name} has {len(lesson)} cells besides its speaker notes"


EXERCISE_SOURCE = '''# %% [markdown]
# # A title

# %% [setup]

# %%
def double(x):
    """Twice x."""
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION

# %%
check("attention.stable_softmax", double)
'''


def _built(tmp_path, source: str):
    path = tmp_path / "99_test.py"
    path.write_text(source, encoding="utf-8")
    return to_notebook(path)


def test_the_build_marks_answer_and_test_cells_for_nbgrader(tmp_path):
    cells = _built(tmp_path, EXERCISE_SOURCE).cells
    answer, test = cells[2].metadata["nbgrader"], cells[3].metadata["nbgrader"]
    assert answer == {"grade": False, "grade_id": "attention-stable_softmax-answer", "locked": False,
                      "schema_version": 3, "solution": True, "task": False}
    assert test["grade"] and test["locked"] and test["points"] >= 1
    assert "nbgrader" not in cells[1].metadata


@pytest.mark.parametrize("change, message", [
    (lambda s: s.replace("    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n",
                         "### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n"), "top level"),
    (lambda s: s.replace('# %%\ncheck(', 'check('), "no check"),
    (lambda s: s.replace('check("attention.stable_softmax", double)', 'print(1)'), "must be its test cell"),
    (lambda s: s.replace("    ### END SOLUTION\n", ""), "matched"),
    (lambda s: s + "\n# %%\ncheck(\"attention.scaled_attention\", double)\n", "has no answer cell"),
    (lambda s: s.replace("# # A title", "# # A title\n# <details><summary>Solution</summary>x</details>"),
     "'Solution' reveal"),
    (lambda s: s.replace("# # A title", "# # A title\n#\n# ### BEGIN SOLUTION\n# x = 1\n# ### END SOLUTION"),
     r"cell 0 \(id 99-000\), a markdown cell starting '# A title.*holds '### BEGIN SOLUTION'"),
    (lambda s: s.replace("# # A title", "# # A title\n#\n# ### BEGIN HIDDEN TESTS"),
     "a markdown cell .* holds '### BEGIN HIDDEN TESTS', which belongs in a graded test code cell"),
    (lambda s: s + "\n# %%\nx = 1\n### BEGIN HIDDEN TESTS\nassert x\n### END HIDDEN TESTS\n",
     "a code cell starting 'x = 1'.* belongs in a graded test code cell only"),
])
def test_the_build_refuses_a_malformed_exercise(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        _built(tmp_path, change(EXERCISE_SOURCE))


SLIDES_SOURCE = '''# %% [markdown] slideshow={"slide_type": "slide"}
# # A title

# %% [markdown] slideshow={"slide_type": "notes"}
# Say hello.

# %% [setup]

# %% slideshow={"slide_type": "fragment"}
x = 1

# %%
y = 2
'''


def test_the_build_keeps_slide_marks_and_the_lesson_leaves_out_speaker_notes(tmp_path):
    cells = _built(tmp_path, SLIDES_SOURCE).cells
    assert [c.metadata.get("slideshow", {}).get("slide_type") for c in cells] == [
        "slide", "notes", None, "fragment", None]
    assert cells[1].cell_type == "markdown" and cells[1].source == "Say hello."
    lesson = parse_cells(SLIDES_SOURCE)
    assert [source for _, source in lesson] == ["# A title", SETUP_CELL, "x = 1", "y = 2"]


@pytest.mark.parametrize("change, message", [
    (lambda s: s.replace('"fragment"', '"frament"'),
     r"cell 3 \('x = 1'\) has slideshow=\{'slide_type': 'frament'\}; expected .*one of slide, subslide"),
    (lambda s: s.replace('# %%\ny = 2', '# %% tags=["x"]\ny = 2'),
     r"cell 4 \('y = 2'\) has options \['tags'\] after '# %%'"),
    (lambda s: s.replace('# %% slideshow={"slide_type": "fragment"}', '# %% slideshow={"slide_type": "notes"}'),
     r"cell 3 \('x = 1'\) is a code cell marked as speaker notes; expected a markdown cell"),
])
def test_the_build_refuses_a_slide_mark_it_cannot_keep(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        _built(tmp_path, change(SLIDES_SOURCE))


DECKS = ("03_attention", "07_gpt", "12_frontier_decoder")  # the decks tests/browser/test_slides.py steps through


@pytest.mark.parametrize("name", NOTEBOOK_IDS)
def test_every_notebook_marks_a_slide_at_each_section(name):
    cells = to_notebook(SOURCES / f"{name}.py").cells
    sections = [c for c in cells if c.cell_type == "markdown" and re.search(r"^##? ", c.source, re.M)]
    unmarked = [c.source.splitlines()[0] for c in sections
                if c.metadata.get("slideshow", {}).get("slide_type") != "slide"]
    assert sections and unmarked == [], f"{name}: headings without a slide mark: {unmarked}"
    notes = [c for c in cells if c.metadata.get("slideshow", {}).get("slide_type") == "notes"]
    if name in DECKS:
        assert len(notes) >= 5, f"{name} has {len(notes)} speaker-notes cells, expected at least 5"


def jupyterlab_kernelspec() -> dict[str, str]:
    """What JupyterLab writes into a notebook it opens on the python3 kernel: ipykernel's own
    kernel.json (name, display name, language), which it compares with the stored metadata."""
    from ipykernel.kernelspec import get_kernel_dict

    spec = get_kernel_dict()
    return {"display_name": spec["display_name"], "language": spec["language"], "name": "python3"}


def test_the_build_writes_the_kernelspec_jupyterlab_writes():
    built = to_notebook(SOURCES / f"{NOTEBOOK_IDS[0]}.py").metadata["kernelspec"]
    assert dict(built) == jupyterlab_kernelspec(), (
        f"the build writes {dict(built)}, JupyterLab would rewrite it to {jupyterlab_kernelspec()} "
        "on opening, marking the notebook modified")


@pytest.mark.parametrize("name", NOTEBOOK_IDS)
def test_opening_a_stored_notebook_in_jupyterlab_does_not_modify_it(name):
    stored = read(NOTEBOOKS / f"{name}.ipynb").metadata["kernelspec"]
    assert dict(stored) == jupyterlab_kernelspec(), (
        f"{name}.ipynb stores {dict(stored)}: rebuild it with tools/build_notebooks.py")
