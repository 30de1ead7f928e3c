"""Reading the course notebooks in tests: their cells, their sources, their exercises."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SOURCES = NOTEBOOKS / "src"

SOLUTION = re.compile(r"<summary>\s*Solution\s*</summary>\s*```python\n(.*?)```", re.S)


def notebook_paths() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def solution_after(cells: list, index: int) -> str | None:
    """The solution block in the first markdown cell after code cell `index`, if any."""
    for cell in cells[index + 1:]:
        if cell.cell_type == "markdown":
            found = SOLUTION.search(cell.source)
            if found:
                return found.group(1)
        elif cell.cell_type == "code":
            return None
    return None
