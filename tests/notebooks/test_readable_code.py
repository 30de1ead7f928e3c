"""Code a projector can show (issue 47): no code line over 100 characters (JupyterLab at 1280x720
shows about 100 before it scrolls sideways) and no code cell over 40 lines (CONTRIBUTING.md's
"a cell does one thing"; a 720-pixel screen shows about 25, see the report of issue 47)."""

from __future__ import annotations

import sys

import pytest
from notebook_tools import ROOT, SOURCES

sys.path.insert(0, str(ROOT / "tools"))
from build_notebooks import parse_cells  # noqa: E402

from helpers.lab.setup_cell import SETUP_CELL  # noqa: E402

LINE_CHARS, CELL_LINES = 100, 40
NAMES = [path.stem for path in sorted(SOURCES.glob("[0-9][0-9]_*.py"))]


def code_cells(name: str) -> list[str]:
    """The notebook's code cells but the set-up cell, which the house rules hold to 5 lines
    (helpers/lab/setup_cell.py) and which nobody reads on a projector."""
    return [source for kind, source in parse_cells((SOURCES / f"{name}.py").read_text(encoding="utf-8"))
            if kind == "code" and source != SETUP_CELL]


@pytest.mark.parametrize("name", NAMES)
def test_no_code_line_is_longer_than_100_characters(name):
    long = [line for source in code_cells(name) for line in source.splitlines() if len(line) > LINE_CHARS]
    assert not long, f"{name}: {len(long)} code lines over {LINE_CHARS} characters, e.g. {long[:3]}"


@pytest.mark.parametrize("name", NAMES)
def test_no_code_cell_is_longer_than_40_lines(name):
    long = [(len(source.splitlines()), source.splitlines()[0]) for source in code_cells(name)
            if len(source.splitlines()) > CELL_LINES]
    assert not long, f"{name}: code cells over {CELL_LINES} lines (length, first line): {long}"
