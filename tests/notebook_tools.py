"""Reading the course notebooks in tests: their cells, their sources, their exercises."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SOURCES = NOTEBOOKS / "src"

# An exercise in a notebook: an answer cell with the solution between nbgrader's markers,
# followed by its test cell, `check("notebook.name", answer)` (tools/build_notebooks.py).
CHECK_CALL = re.compile(r'^check\("([\w.]+)"', re.M)
SOLUTION_REGION = re.compile(r"^[ \t]*### BEGIN SOLUTION\n(.*?)^[ \t]*### END SOLUTION", re.S | re.M)


@dataclass(frozen=True)
class NotebookExercise:
    name: str  # "attention.stable_softmax"
    answer_index: int  # of the answer cell in nb.cells
    test_index: int  # of the test cell
    solution: str  # the lines between the markers (several regions joined)

    def solution_lines(self) -> list[str]:
        """The solution's lines that hold code (no blank lines, no comment-only lines)."""
        return [line for line in self.solution.splitlines()
                if line.strip() and not line.strip().startswith("#")]


def notebook_paths() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def exercises_in(cells: list) -> list[NotebookExercise]:
    """Every exercise of a notebook's cells, in order."""
    found = []
    code = [i for i, cell in enumerate(cells) if cell.cell_type == "code"]
    for position, index in enumerate(code):
        regions = SOLUTION_REGION.findall(cells[index].source)
        if not regions or position + 1 >= len(code):
            continue
        test_index = code[position + 1]
        name = CHECK_CALL.search(cells[test_index].source)
        if name:
            found.append(NotebookExercise(name.group(1), index, test_index, "".join(regions)))
    return found
