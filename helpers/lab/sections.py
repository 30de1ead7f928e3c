"""Start a notebook at any `##` section after a restart: `catch_up` runs what the earlier ones made.

A notebook builds its objects section by section (a tokenizer in section 4, a trained model in
section 4 of notebook 7, ...). An instructor who restarts the kernel and jumps to section 7 runs
the set-up cells, then the section's first code cell, `catch_up("07_gpt", "7.")`. When every
name the earlier sections define and this section reads is already there (the notebook was run
from the top) it does nothing and prints nothing; otherwise it runs the earlier sections' code
cells again, from the notebook file itself (the student's own answers included), with their
output hidden, and says so in one line. `tools/run_sections.py` runs every section this way.
"""

from __future__ import annotations

import ast
import json
import math
import re
import time
from pathlib import Path
from typing import Any

SECTION_HEADING = re.compile(r"^## ", re.M)
CATCH_UP_CALL = "catch_up("
# What only the grader runs: the hidden tests of a test cell.
HIDDEN_TESTS = re.compile(r"^### BEGIN HIDDEN TESTS$.*?^### END HIDDEN TESTS$\n?", re.M | re.S)


def split_sections(cells: list[dict]) -> tuple[list[dict], list[tuple[str, list[dict]]]]:
    """(set-up cells, [(section title, its cells)]) of a notebook's cells (nbformat dicts).

    The set-up cells are those before the first `## ` heading; a section starts at the markdown
    cell holding its `## ` line (the heading may sit below other text in that cell)."""
    if not isinstance(cells, list) or not all(isinstance(c, dict) and "cell_type" in c for c in cells):
        raise TypeError(f"cells must be a list of notebook cells (dicts with a cell_type), got "
                        f"{type(cells).__name__}")
    setup: list[dict] = []
    sections: list[tuple[str, list[dict]]] = []
    for cell in cells:
        source = _source(cell)
        heading = SECTION_HEADING.search(source) if cell["cell_type"] == "markdown" else None
        if heading:
            sections.append((source[heading.end():].splitlines()[0].strip(), [cell]))
        elif sections:
            sections[-1][1].append(cell)
        else:
            setup.append(cell)
    return setup, sections


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def defined_names(source: str) -> set[str]:
    """The names a code cell surely binds at its top level: assignments, defs, classes, imports,
    a loop's variable, `with ... as`. Not what an `if`, `try` or loop body may bind, nor a
    comprehension's variable: after a run from the top those can be absent, and catch_up would
    then run the cells above again for nothing."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a cell's source as a str, got {type(source).__name__}")
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a cell with IPython magics: it defines nothing we look for
        return set()
    return set().union(*map(_bound_by, tree.body)) - _deleted(source) if tree.body else set()


def _deleted(source: str) -> set[str]:
    """The names a cell deletes (`del x`) anywhere in it."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Del)}


def _bound_by(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For)):
        targets = [node.target]
    elif isinstance(node, ast.With):
        targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
        inner = set().union(*map(_bound_by, node.body)) if node.body else set()
        return inner | _names_in(targets)
    return _names_in(targets)


def _names_in(targets: list[ast.AST]) -> set[str]:
    """Plain names among assignment targets (`a, (b, *c) = ...`), not `x[i]` or `obj.attr`."""
    found: set[str] = set()
    for target in targets:
        if isinstance(target, ast.Name):
            found.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            found |= _names_in(target.elts)
        elif isinstance(target, ast.Starred):
            found |= _names_in([target.value])
    return found


def used_names(source: str) -> set[str]:
    """The names a code cell reads anywhere in it."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a cell's source as a str, got {type(source).__name__}")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def earlier_and_own_code(cells: list[dict], section: str) -> tuple[list[str], list[str]]:
    """The code cells of the sections before the one whose title starts with `section`, and its own
    (without `catch_up` calls and hidden tests, which only the grader runs)."""
    _, sections = split_sections(cells)
    titles = [title for title, _ in sections]
    matches = [i for i, title in enumerate(titles) if title.startswith(section)]
    if len(matches) != 1:
        raise ValueError(f"section={section!r} starts {len(matches)} section titles, expected "
                         f"exactly one of {titles}")

    def code(bodies: list) -> list[str]:
        return [HIDDEN_TESTS.sub("", _source(cell)) for _, body in bodies for cell in body
                if cell["cell_type"] == "code" and CATCH_UP_CALL not in _source(cell)]

    return code(sections[: matches[0]]), code(sections[matches[0]: matches[0] + 1])


def find_notebook(name: str) -> Path:
    """The notebook `name` (e.g. "07_gpt") the kernel runs: beside the kernel's working folder
    (where JupyterLab starts it), else in the course's notebooks/ folder."""
    if not isinstance(name, str) or not re.fullmatch(r"\d\d_\w+", name):
        raise ValueError(f"name={name!r}, expected a notebook name such as '07_gpt'")
    for folder in (Path.cwd(), Path(__file__).resolve().parents[2] / "notebooks"):
        if (folder / f"{name}.ipynb").is_file():
            return folder / f"{name}.ipynb"
    raise FileNotFoundError(f"no {name}.ipynb in {Path.cwd()} or the course's notebooks/ folder")


def catch_up(name: str, section: str, namespace: dict[str, Any] | None = None) -> None:
    """Run the code cells before `section` of notebook `name` if a name they define and the
    section reads is missing.

    name: the notebook, "07_gpt"; section: how its `##` title starts, "7." or "Check your".
    namespace: where the names live (default: the notebook's, IPython's user namespace).
    Returns None, so that the cell shows nothing when nothing was missing."""
    if not isinstance(section, str) or not section:
        raise ValueError(f"section={section!r}, expected the start of a `##` title such as '7.'")
    shell = _shell()
    namespace = shell.user_ns if namespace is None else namespace
    cells = json.loads(find_notebook(name).read_text(encoding="utf-8"))["cells"]
    code, own = earlier_and_own_code(cells, section)
    deleted = set().union(set(), *map(_deleted, code))
    made_above = set().union(set(), *map(defined_names, code)) - deleted
    needed = set().union(*map(used_names, own)) if own else set()
    missing = (made_above & needed) - set(namespace)
    if not missing:
        return
    import matplotlib.pyplot as plt
    from IPython.utils.capture import capture_output

    from helpers.timing import format_duration

    started = time.perf_counter()
    for source in code:
        with capture_output():
            result = shell.run_cell(source, store_history=False)
            plt.close("all")
        if not result.success:
            raise RuntimeError(f"catching up {name} before section {section!r}: an earlier cell "
                               f"failed with {result.error_in_exec!r}:\n{source}")
    print(f"started here: ran the {len(code)} code cells above again for the "
          f"{len(missing)} names they define ({format_duration(time.perf_counter() - started)})")


def _shell():
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("catch_up runs inside a notebook (an IPython kernel), "
                           "not a plain script")
    return shell


UNTRAINED_SHARE = 0.8  # a loss above this share of ln V is within reach of a uniform guess


def refuse_untrained(loss: float, vocab_size: int, what: str = "the model") -> None:
    """Raise RuntimeError when `loss` (mean next-token cross-entropy, nats) says the model is not
    trained: a uniform guess over `vocab_size` tokens scores ln V, and an untrained GPT about that.

    For cells that show what training taught (attention maps, samples): on a model that is still
    at its initial weights they would run and show noise without a word."""
    if not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size={vocab_size!r}, expected an int >= 2")
    if not math.isfinite(loss) or loss < 0:
        raise ValueError(f"loss={loss!r}, expected a finite cross-entropy >= 0")
    if loss > UNTRAINED_SHARE * math.log(vocab_size):
        raise RuntimeError(f"{what} is not trained: its loss here is {loss:.2f}, a uniform guess "
                           f"scores ln {vocab_size} = {math.log(vocab_size):.2f}. Run the training "
                           "section first (or this section's catch_up cell) and then this cell.")
