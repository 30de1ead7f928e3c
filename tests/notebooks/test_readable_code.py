"""Code a projector can show (issue 47): no code line over 100 characters (JupyterLab at 1280x720
shows about 100 before it scrolls sideways) and no code cell over 25 lines (a 720-pixel screen
shows about 25 in JupyterLab, see the report of issue 47), but for the few named below."""

from __future__ import annotations

import sys

import pytest
from notebook_tools import ROOT, SOURCES

sys.path.insert(0, str(ROOT / "tools"))
from build_notebooks import parse_cells  # noqa: E402

from helpers.lab.setup_cell import SETUP_CELL  # noqa: E402

LINE_CHARS, CELL_LINES = 100, 25
NAMES = [path.stem for path in sorted(SOURCES.glob("[0-9][0-9]_*.py"))]

# Code cells allowed past a screen, by notebook and first line, each with why. An exercise is as
# long as its idea: these answer cells hold one class or function the student writes whole, which
# a cell boundary cannot cut, and whose given scaffolding is already in a cell of its own.
LONG_CELLS = {
    ("02_embeddings", "class TokenAndPosition(nn.Module):"):
        "an exercise's answer cell: the module the student writes, refusals of bad ids included",
    ("07_gpt", "class HandAdamW:"):
        "an exercise's answer cell: the optimiser class the student writes (its imports are apart)",
    ("09_modern_decoder", "def my_modern_block(block, x: torch.Tensor, table) -> torch.Tensor:"):
        "an exercise's answer cell: the modern block written whole from its weights",
    ("13_post_training", "class MyLoRALinear(nn.Module):"):
        "an exercise's answer cell: the LoRA layer the student writes (init, forward, merge)",
}
MOST_LINES = 40  # even an allowed cell fits a screen at JupyterLab's smallest comfortable font


def code_cells(name: str) -> list[tuple[str, str]]:
    """(the `###` or `##` heading above it, source) of the notebook's code cells but the set-up
    cell, which the house rules hold to 5 lines (helpers/lab/setup_cell.py) and which nobody
    reads on a projector."""
    cells, heading = [], ""
    for kind, source in parse_cells((SOURCES / f"{name}.py").read_text(encoding="utf-8")):
        if kind == "markdown":
            headings = [line for line in source.splitlines() if line.startswith("##")]
            heading = headings[-1] if headings else heading
        elif source != SETUP_CELL:
            cells.append((heading, source))
    return cells


def allowed(name: str, source: str) -> bool:
    """Whether this cell is one of LONG_CELLS."""
    return (name, source.splitlines()[0]) in LONG_CELLS


@pytest.mark.parametrize("name", NAMES)
def test_no_code_line_is_longer_than_100_characters(name):
    long = [line for _, source in code_cells(name) for line in source.splitlines()
            if len(line) > LINE_CHARS]
    assert not long, f"{name}: {len(long)} code lines over {LINE_CHARS} characters, e.g. {long[:3]}"


@pytest.mark.parametrize("name", NAMES)
def test_no_code_cell_is_longer_than_a_screen(name):
    long = [(len(source.splitlines()), source.splitlines()[0]) for heading, source in code_cells(name)
            if len(source.splitlines()) > CELL_LINES and not allowed(name, source)]
    assert not long, f"{name}: code cells over {CELL_LINES} lines (length, first line): {long}"


@pytest.mark.parametrize("name", NAMES)
def test_an_allowed_long_cell_is_still_at_most_40_lines(name):
    long = [(len(source.splitlines()), source.splitlines()[0]) for heading, source in code_cells(name)
            if len(source.splitlines()) > MOST_LINES]
    assert not long, f"{name}: code cells over {MOST_LINES} lines (length, first line): {long}"


@pytest.mark.parametrize(("name", "first_line"), sorted(LONG_CELLS))
def test_every_allowed_long_cell_is_still_there_and_long(name, first_line):
    lengths = [len(source.splitlines()) for _, source in code_cells(name)
               if source.splitlines()[0] == first_line]
    assert lengths, f"{name}: no code cell starts with {first_line!r}: drop it from LONG_CELLS"
    assert max(lengths) > CELL_LINES, (f"{name}: the cell {first_line!r} has {max(lengths)} lines, "
                                       f"within a screen now: drop it from LONG_CELLS")
