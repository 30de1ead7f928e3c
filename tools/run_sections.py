"""Run every `##` section of a notebook alone, as an instructor who jumps in after a restart would.

    python tools/run_sections.py                 # every notebook
    python tools/run_sections.py 07_gpt 12       # only those whose name contains one of these

A notebook's set-up cells are the cells before its first `##` heading (title, set-up cell,
imports). Each section runs after them with nothing else defined: the section must recompute or
load what it needs: its first code cell, `catch_up(...)` (helpers/lab/sections.py), runs the
earlier sections' cells again when what the section reads from them is missing, and says so. A widget check (a cell that moves a
control with `.set(...)`) runs twice, as a student who re-runs it would.

All sections of one notebook share one kernel, wiped with `%reset -f` between sections and the
set-up cells run again: a fresh kernel per section would start Python and import torch 133
times (3-4 s each on the 2-core machine) for nothing that `%reset` leaves behind except
imported modules, which the set-up cells import anyway. All 133 sections took about 14 minutes
on the shared 2-core machine (notebook 7: 3 min, against 35 s from the top).
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from build_notebooks import NOTEBOOKS, SOURCES, to_notebook  # noqa: E402

from helpers.lab.sections import split_sections  # noqa: E402

WIDGET_CHECK = re.compile(r"^\w+ = \w+\.(set|reset)\(", re.M)


def is_widget_check(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and bool(WIDGET_CHECK.search(cell.source))


def run_sections(source: Path, only: str | None = None, timeout: int = 600) -> dict[str, str | None]:
    """Run each section of `source` alone; return {section title: None, or the error it met}."""
    if only is not None and not isinstance(only, str):
        raise TypeError(f"only must be a section title or None, got {type(only).__name__}")
    nb = to_notebook(source)
    setup, sections = split_sections(nb.cells)
    if only is not None:
        sections = [(title, cells) for title, cells in sections if title == only]
        if not sections:
            raise ValueError(f"only={only!r}: {source.stem} has no section of that title")
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    results: dict[str, str | None] = {}
    # %reset also deletes __main__.__spec__, which a fresh kernel has (None) and worker
    # processes (multiprocessing's spawn, notebooks 11 and 12) read.
    reset = nbformat.v4.new_code_cell("%reset -f\n__spec__ = None")
    with client.setup_kernel():
        for title, section in sections:
            cells = [reset, *setup]
            for cell in section:
                cells += [cell, cell] if is_widget_check(cell) else [cell]
            # nbclient finds a cell by its index in client.nb when a progress bar updates its
            # display, so the cells run are the notebook's cells, copies of the originals.
            client.nb.cells = cells = [copy.deepcopy(cell) for cell in cells]
            client._display_id_map.clear()
            results[title] = None
            for index, cell in enumerate(cells):
                if cell.cell_type != "code":
                    continue
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError as error:
                    last = str(error).strip().splitlines()[-1]
                    results[title] = re.sub(r"\x1b\[[0-9;]*m", "", last)
                    break
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="only notebooks whose name contains one of these")
    args = parser.parse_args(argv)
    sources = sorted(SOURCES.glob("[0-9][0-9]_*.py"))
    if args.names:
        sources = [s for s in sources if any(name in s.stem for name in args.names)]
    failed = 0
    for source in sources:
        started = time.perf_counter()
        results = run_sections(source)
        for title, error in results.items():
            failed += error is not None
            print(f"{source.stem} | {title} | {'ok' if error is None else error}", flush=True)
        print(f"{source.stem}: {len(results)} sections alone in {time.perf_counter() - started:.0f} s",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
