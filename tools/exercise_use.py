"""Which later cells run on each exercise's answer, read from the notebooks' sources.

    python tools/exercise_use.py            # every exercise: the cells that use it, or why none
    python tools/exercise_use.py 04 14      # only these notebooks

A later cell uses an exercise when it calls `yours_or("notebook.name", answer, stand_in)` (the
student's answer once it passes, the course's stand-in until then) and a cell reads the name that
call binds. An exercise that no later cell uses says so in its own text, with STANDS_ALONE, so that
the README's promise ("the cells after an exercise run on your answer") is true of every other
one. tests/notebooks/test_exercise_use.py holds the rule.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_notebooks import CHECK_CALL, SOURCES, parse_cells  # noqa: E402

# What an exercise that no later cell uses says in its text (case does not matter).
STANDS_ALONE = "stands alone: no later cell runs on your answer"
SOLUTION = re.compile(r"^[ \t]*### BEGIN SOLUTION", re.M)


@dataclass(frozen=True)
class ExerciseUse:
    notebook: str  # "04_masking"
    name: str  # "masking.padding_mask"
    answer_index: int  # the answer cell's index among the notebook's cells
    text: str  # the markdown above the answer cell (exercise_text)
    bound: tuple[str, ...]  # the names later cells bind with yours_or("name", ...)
    users: tuple[int, ...]  # indices of the later cells that read one of those names

    @property
    def stands_alone(self) -> bool:
        """True when the exercise's text says that no later cell runs on the answer."""
        return STANDS_ALONE in " ".join(self.text.lower().replace("#", " ").split())


def _tree(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except SyntaxError:  # a cell with a magic or a shell line: it binds and reads nothing here
        return None


def yours_or_bindings(source: str) -> list[tuple[str, str, int]]:
    """(exercise name, bound name, line) of every `x = yours_or("name", ...)` in a cell."""
    tree = _tree(source)
    found = []
    for node in ast.walk(tree) if tree else ():
        call = node.value if isinstance(node, ast.Assign) else None
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id == "yours_or" and call.args
                and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str)):
            found += [(call.args[0].value, target.id, node.lineno)
                      for target in node.targets if isinstance(target, ast.Name)]
    return found


def names_read(source: str, after_line: int = 0) -> set[str]:
    """The names a cell reads (loads) on lines after `after_line`."""
    tree = _tree(source)
    return {node.id for node in ast.walk(tree) if tree and isinstance(node, ast.Name)
            and isinstance(node.ctx, ast.Load) and node.lineno > after_line} if tree else set()


def exercise_text(cells: list[tuple[str, str]], answer_index: int) -> str:
    """The markdown above an answer cell, back to the code cell before it (a section's
    `catch_up(...)` cell between them does not end the text)."""
    text = []
    for kind, source in reversed(cells[:answer_index]):
        if kind == "code" and not source.startswith("catch_up("):
            break
        text += [source] if kind == "markdown" else []
    return "\n".join(reversed(text))


def exercise_uses(notebook: str, cells: list[tuple[str, str]]) -> list[ExerciseUse]:
    """Every exercise of one notebook's (cell_type, source) cells, with the later cells using it."""
    if not isinstance(cells, list) or not all(isinstance(c, tuple) and len(c) == 2 for c in cells):
        raise ValueError(f"cells is {type(cells).__name__}, expected a list of (cell_type, source) "
                         "pairs as build_notebooks.parse_cells returns")
    code = [i for i, (kind, _) in enumerate(cells) if kind == "code"]
    found = []
    for position, index in enumerate(code[:-1]):
        test = code[position + 1]
        check = CHECK_CALL.search(cells[test][1])
        if not SOLUTION.search(cells[index][1]) or not check:
            continue
        name, text = check.group(1), exercise_text(cells, index)
        bound, users = [], set()
        for i in code:
            for exercise, variable, line in yours_or_bindings(cells[i][1]) if i > test else ():
                if exercise != name:
                    continue
                bound.append(variable)
                users |= {j for j in code if j > i and variable in names_read(cells[j][1])}
                users |= {i} if variable in names_read(cells[i][1], after_line=line) else set()
        found.append(ExerciseUse(notebook, name, index, text, tuple(bound), tuple(sorted(users))))
    return found


def every_exercise(notebooks: list[str] | None = None) -> list[ExerciseUse]:
    """exercise_uses of every notebook source (or those whose name starts with one of
    `notebooks`, "04" or "04_masking")."""
    if notebooks is not None and not all(isinstance(n, str) and n for n in notebooks):
        raise ValueError(f"notebooks is {notebooks!r}, expected names like '04' or '04_masking'")
    found = []
    for path in sorted(SOURCES.glob("[0-9][0-9]_*.py")):
        if notebooks is None or any(path.stem.startswith(n) for n in notebooks):
            found += exercise_uses(path.stem, parse_cells(path.read_text(encoding="utf-8")))
    return found


def main(argv: list[str]) -> int:
    uses = every_exercise(argv or None)
    for use in uses:
        where = (f"cells {', '.join(map(str, use.users))} (via {', '.join(use.bound)})"
                 if use.users else "stands alone (its text says so)" if use.stands_alone
                 else "UNUSED, and its text does not say it stands alone")
        print(f"{use.notebook:<24} {use.name:<46} {where}")
    unused = sum(not use.users for use in uses)
    marked = sum(not use.users and use.stands_alone for use in uses)
    print(f"\n{len(uses)} exercises: {len(uses) - unused} used by a later cell, {unused} not "
          f"({marked} of them say they stand alone)")
    return 0 if unused == marked else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
