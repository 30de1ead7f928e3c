"""The package's shape: the import graph of `helpers`, drawn from the files with `ast`.

helpers/__init__.py states the order the stages depend on each other in. These tests hold the
code to it: no import circle, no arrow from a lower stage to a higher one (the model never
imports training, nothing below lab imports plots, widgets or exercises), every module short
enough to read in one sitting, and no module left at an old flat path.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parents[2] / "helpers"

# A module may import from its own stage or from a stage of a lower rank, never a higher one
# or a sibling of the same rank.
RANKS = {
    "checks": 0, "timing": 0,
    "text": 1,
    "model": 2,
    "flash": 3, "training": 3,
    "families": 4, "scale": 4, "post": 4, "serve": 4,
    "lab": 5,
}
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(HELPERS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def helpers_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(HELPERS.rglob("*.py"))}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Every `helpers` module that `path` imports, at the top, in a function or for typing."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from helpers.model import gpt` imports the module helpers.model.gpt
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("helpers."):
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = helpers_modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        # a package imports its own modules' names only through them; leave out the self-edge
        graph[name] = {m for m in imported_modules(path, known) if m != name}
    return graph


def stage(module: str) -> str:
    """helpers.model.gpt -> model; helpers.checks -> checks."""
    return module.split(".")[1]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a list of modules, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if state.get(nxt) is None and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if state.get(node) is None and (cycle := visit(node)):
            return cycle
    return None


def arrows_against_the_order(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for source, targets in sorted(graph.items()):
        if source == "helpers":
            continue
        for target in sorted(targets):
            a, b = stage(source), stage(target)
            if a != b and RANKS[b] >= RANKS[a]:
                wrong.append(f"{source} -> {target} ({a} may not import {b})")
    return wrong


def test_every_module_belongs_to_a_stage():
    stray = sorted(m for m in helpers_modules() if m != "helpers" and stage(m) not in RANKS
                   and stage(m) != "coursedata")
    assert not stray, f"modules outside the stages of helpers/__init__.py: {stray}"


def test_the_import_graph_has_no_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_every_arrow_runs_down_the_stages():
    wrong = arrows_against_the_order(import_graph())
    assert not wrong, "imports against the order of helpers/__init__.py:\n" + "\n".join(wrong)


def test_the_model_never_imports_training_or_lab():
    graph = import_graph()
    for module, targets in graph.items():
        if module.startswith("helpers.model"):
            assert not {t for t in targets if stage(t) in ("training", "lab")}, module


@pytest.mark.parametrize("path", sorted(HELPERS.rglob("*.py")), ids=lambda p: module_name(p))
def test_every_module_reads_in_one_sitting(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(HELPERS.parent)} has {lines} lines, over {MAX_LINES}"


def test_no_module_is_left_at_a_flat_path():
    flat = sorted(p.name for p in HELPERS.glob("*.py"))
    assert flat == ["__init__.py", "checks.py", "timing.py"], flat


def test_subpackages_say_what_they_hold_and_reexport_nothing():
    for init in sorted(HELPERS.glob("*/__init__.py")):
        if init.parent.name == "coursedata":
            continue
        tree = ast.parse(init.read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree) or ""
        modules = sorted(p.stem for p in init.parent.glob("*.py") if p.stem != "__init__")
        modules += sorted(p.name for p in init.parent.iterdir() if (p / "__init__.py").exists())
        missing = [m for m in modules if m not in doc]
        assert not missing, f"{init.relative_to(HELPERS.parent)} does not name {missing}"
        if init.parent.name != "exercises":
            imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
            assert not imports, f"{init.relative_to(HELPERS.parent)} re-exports names"


# --- the checks themselves can fail ---------------------------------------------------------

def test_the_cycle_finder_finds_a_circle_and_passes_a_line():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_an_upward_arrow_is_reported():
    graph = {"helpers.model.gpt": {"helpers.training.speed", "helpers.checks"},
             "helpers.training.speed": {"helpers.model.gpt"}}
    assert arrows_against_the_order(graph) == [
        "helpers.model.gpt -> helpers.training.speed (model may not import training)"]


def test_typing_and_lazy_imports_count(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from helpers.model.gpt import GPT\n"
                      "def f():\n    from helpers.training import speed\n")
    assert imported_modules(source, {"helpers.model.gpt", "helpers.training.speed",
                                     "helpers.training", "helpers.model"}) == {
        "helpers.model.gpt", "helpers.training.speed", "helpers.training"}
