"""The stored notebooks are exactly their plain-text sources, each opens with the set-up cell,
and each follows the house rules a reader can see without running it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from notebook_tools import NOTEBOOKS, ROOT, SOURCES, notebook_paths, read

sys.path.insert(0, str(ROOT / "tools"))
from build_notebooks import to_notebook  # noqa: E402

from helpers.lab.environment import SETUP_CELL  # noqa: E402

NOTEBOOK_IDS = [p.stem for p in notebook_paths()]


def test_there_are_notebooks_and_each_has_a_source():
    assert NOTEBOOK_IDS, "no notebooks found"
    stems = {p.stem for p in SOURCES.glob("[0-9][0-9]_*.py")}
    assert stems == set(NOTEBOOK_IDS), "every notebooks/src/*.py must have its built .ipynb and vice versa"


@pytest.mark.parametrize("name", NOTEBOOK_IDS)
def test_stored_cells_equal_the_source(name):
    stored = [(c.cell_type, c.source) for c in read(NOTEBOOKS / f"{name}.ipynb").cells]
    built = [(c.cell_type, c.source) for c in to_notebook(SOURCES / f"{name}.py").cells]
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
    assert "<summary>Solution</summary>" in markdown, "at least one checked exercise with a solution"
    assert 'check("' in "\n".join(c.source for c in cells if c.cell_type == "code")


def test_nbcheck_reports_no_errors():
    nbcheck = ROOT.parent / "shared" / "tools" / "nbcheck.py"
    if not nbcheck.exists():
        pytest.skip("../shared/tools/nbcheck.py is not beside this checkout")
    result = subprocess.run([sys.executable, str(nbcheck), str(NOTEBOOKS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


MAX_CELL_LINES = 40  # a cell does one thing; the set-up cell is the course's, not the notebook's
MAX_CELLS = {"07_gpt": 100}


@pytest.mark.parametrize("name", NOTEBOOK_IDS)
def test_every_cell_does_one_thing(name):
    cells = read(NOTEBOOKS / f"{name}.ipynb").cells
    long = [(index, cell.cell_type, len(cell.source.splitlines())) for index, cell in enumerate(cells)
            if cell.source != SETUP_CELL and len(cell.source.splitlines()) > MAX_CELL_LINES]
    assert not long, f"{name}: cells over {MAX_CELL_LINES} lines (index, kind, lines): {long}"
    assert len(cells) <= MAX_CELLS.get(name, len(cells)), f"{name} has {len(cells)} cells"
