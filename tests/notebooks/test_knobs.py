"""Every value a knob's comment suggests runs: the notebook, with the knob turned to it, ends.

A knob is a line `NAME = value  # the knob: ...` (or `# knob: ...`) in a notebook's source. The
numbers its comment names are the values a student is invited to try ("try 300", "1000 for
better models"); a factor ("5x longer"), a percentage or a section number is not one.
"""

from __future__ import annotations

import copy
import re

import pytest
from nbclient import NotebookClient

from tests.notebook_tools import NOTEBOOKS, SOURCES, read

KNOB_LINE = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*) = (?P<value>[^#\n]+?)\s*#\s*(?:the )?knob\b(?P<comment>.*)$", re.M)
# A number in the comment, unless it is a factor (5x), a share (20 %), or names a section.
SUGGESTED = re.compile(r"(?<![\w.])(?<!section )(?<!sections )(\d[\d_]*(?:\.\d+)?(?:e-?\d+)?)(?![\w.]|\s*x\b|\s*%)")


def knobs(source: str) -> list[tuple[str, str, list[str]]]:
    """(name, current value, suggested values) for every knob line of a notebook source."""
    found = []
    for match in KNOB_LINE.finditer(source):
        current = match["value"].strip()
        suggested = [v for v in SUGGESTED.findall(match["comment"]) if v != current]
        found.append((match["name"], current, suggested))
    return found


def cases() -> list[tuple[str, str, str, str]]:
    """(notebook, knob, current value, suggested value) for every suggestion in the course."""
    out = []
    for source in sorted(SOURCES.glob("[0-9][0-9]_*.py")):
        for name, current, suggested in knobs(source.read_text(encoding="utf-8")):
            out.extend((source.stem, name, current, value) for value in suggested)
    return out


def test_the_knob_reader_finds_suggestions_and_skips_factors_and_sections():
    source = ("STEPS = 200  # the knob: 1000 for better models (about 5x longer)\n"
              "SIZE = 512  # the knob: try 300, or a size past where pairs run out (section 8)\n"
              "SHARP = 1.0  # knob: scales W_Q; try 6.0 for attention far from uniform\n"
              "RATE = 1e-2  # the rate at the top of the warm-up, not a knob line\n"
              "MORE = 100  # the knob: 300 or more, 20 % of the time\n")
    assert knobs(source) == [("STEPS", "200", ["1000"]), ("SIZE", "512", ["300"]),
                             ("SHARP", "1.0", ["6.0"]), ("MORE", "100", ["300"])]


def test_the_course_has_knobs_with_suggestions():
    assert len(cases()) >= 4, cases()


@pytest.mark.parametrize("notebook,knob,current,value", cases(),
                         ids=lambda x: x if isinstance(x, str) else None)
def test_a_notebook_runs_with_its_knob_at_a_suggested_value(notebook, knob, current, value):
    nb = copy.deepcopy(read(NOTEBOOKS / f"{notebook}.ipynb"))
    line = re.compile(rf"^{knob} = {re.escape(current)}(?=\s*#)", re.M)
    cells = [cell for cell in nb.cells if cell.cell_type == "code" and line.search(cell.source)]
    assert len(cells) == 1, f"{notebook}: {knob} = {current} is set in {len(cells)} code cells, expected 1"
    cells[0].source = line.sub(f"{knob} = {value}", cells[0].source)
    # Any failing assert or error in any cell fails the run, naming the cell.
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
