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


def lesson_cells(cells: list) -> list:
    """`cells` without the instructor's speaker notes (slide_type "notes"): the cells the student
    edition, nbgrader's release and the site keep, in order."""
    return [cell for cell in cells if cell.get("metadata", {}).get("slideshow", {}).get("slide_type") != "notes"]


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


# A small notebook in the exercise form (CONTRIBUTING.md "## Exercises"), for the site's tests
# (tests/course/test_course_site.py, tests/browser/test_site.py): an answer cell, its test cell
# with a hidden test, a cell that runs on the student's answer (`yours_or`, with the line the
# instructor's run printed there), and an older-form "Solution" reveal in markdown.
SOLVED = '''def f(x):
    """Square x."""
    ### BEGIN SOLUTION
    y = x * x  # the instructor's square
    return y
    ### END SOLUTION
'''
TESTED = '''check("x.f", f)
### BEGIN HIDDEN TESTS
assert f(3) == 9  # a hidden case
### END HIDDEN TESTS
'''
REVEAL = '''<details><summary>Solution</summary>

```python
### BEGIN SOLUTION
def g():
    return "the older form's solution"
### END SOLUTION
```
</details>

After the reveal.'''


YOURS_PASSED_LINE = "using your f from here on (it passes x.f)\n"


def stream(text: str) -> dict:
    return {"output_type": "stream", "name": "stdout", "text": text}


def exercise_notebook(metadata: bool) -> dict:
    def cell(kind: str, source: str, outputs: list | None = None, grader: dict | None = None) -> dict:
        made = {"cell_type": kind, "metadata": {"nbgrader": grader} if metadata and grader else {},
                "source": source}
        if kind == "code":
            made |= {"outputs": outputs or [], "execution_count": 1}
        return made

    return {"metadata": {}, "cells": [
        cell("markdown", "# 9. A notebook"),
        cell("code", "# NBVAL_IGNORE_OUTPUT\nprint('timing')", [stream("timing 3 s\n")]),
        cell("markdown", "### Exercise 1\n<details><summary>Hint 1: the idea</summary>Square it."
                         "</details>"),
        cell("code", SOLVED, [stream("the answer cell ran\n")], {"solution": True, "grade": False}),
        cell("code", TESTED, [stream("Exercise x.f: passed\n")], {"solution": False, "grade": True,
                                                                    "points": 2}),
        cell("code", "answer = yours_or('x.f', f, None)", [stream(YOURS_PASSED_LINE)]),
        cell("markdown", REVEAL)]}
