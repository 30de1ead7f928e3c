"""Every `##` section of every notebook runs alone after a restart (issue 47): the set-up cells,
then the section, whose `catch_up(...)` cell re-runs what it needs from the sections above; each
widget check runs twice. About 14 minutes for the 133 sections on the shared 2-core machine
(notebook 3: 21 s, against 7 s from the top; notebook 7: 3 min; a late section re-runs the ones
before it), so the sections carry their own mark: `pytest -m sections` runs them (a CI job of
its own), `-m "not sections"` leaves them out."""

from __future__ import annotations

import sys

import pytest
from notebook_tools import NOTEBOOKS, ROOT, SOURCES, notebook_paths, read

sys.path.insert(0, str(ROOT / "tools"))
from run_sections import run_sections  # noqa: E402

NAMES = [path.stem for path in notebook_paths()]


@pytest.mark.sections
@pytest.mark.parametrize("name", NAMES)
def test_every_section_runs_alone_after_a_restart(name):
    failed = {title: error for title, error in run_sections(SOURCES / f"{name}.py").items() if error}
    assert not failed, f"{name}: sections that fail when started alone: {failed}"


@pytest.mark.parametrize("name", NAMES)
def test_catch_up_prints_nothing_in_a_run_from_the_top(name):
    """In "Restart and Run All" every catch_up finds what it needs and stays silent."""
    loud = [cell.source for cell in read(NOTEBOOKS / f"{name}.ipynb").cells
            if cell.cell_type == "code" and cell.source.startswith("catch_up(") and cell.outputs]
    assert not loud, f"{name}: catch_up re-ran cells in a run from the top: {loud}"
