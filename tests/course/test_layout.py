"""The package's shape: the import graph of `helpers`, drawn from the files with `ast`.

helpers/__init__.py states the order the stages depend on each other in. These tests hold the
code to it: no import circle, no arrow from a lower stage to a higher one (the model never
imports training, nothing below lab imports plots, widgets or exercises), every module short
enough to read in one sitting, and no module left at an old flat path.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parents[2] / "helpers"

# A module may import from its own stage or from a stage of a lower rank, never a higher one
# or a sibling of the same rank.
RANKS = {
    "checks": 0,
    "timing": 1, "text": 1,
    "model": 2,
    "flash": 3, "training": 3,
    "families": 4, "scale": 4, "post": 4, "serve": 4,
    "lab": 5,
}
MAX_LINES = 600  # a module holds one idea; past this it is looked at, not squeezed to fit


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


# --- the tests' own layout (issue 40): tests/ mirrors helpers/ -----------------------------------

TESTS = HELPERS.parent / "tests"
# Modules that tests import but that have no test file of their own, and why.
NO_FILE_OF_THEIR_OWN = {
    "post/tasks": "the post-training tests' data (facts, prompts); tested through sft, dpo and grpo",
    "scale/any_model": "the wrappers' shared model zoo; tested through fsdp_module's and zero's files",
}


def _modules() -> list[str]:
    """"<subpackage>/<module>" for every module one level below helpers/ (not __init__)."""
    return sorted(f"{p.parent.name}/{p.stem}" for p in HELPERS.glob("*/*.py") if p.stem != "__init__")


def _imported_by_tests(module: str) -> bool:
    sub, name = module.split("/")
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == f"helpers.{sub}.{name}":
                return True
            if isinstance(node, ast.ImportFrom) and node.module == f"helpers.{sub}" and any(
                    alias.name == name for alias in node.names):
                return True
            if isinstance(node, ast.Import) and any(a.name == f"helpers.{sub}.{name}" for a in node.names):
                return True
    return False


def test_every_tested_module_has_its_own_test_file_at_the_mirrored_path():
    missing = [m for m in _modules() if m not in NO_FILE_OF_THEIR_OWN
               and not (TESTS / m.split("/")[0] / f"test_{m.split('/')[1]}.py").exists()
               and _imported_by_tests(m)]
    assert missing == [], f"tested modules without tests/<subpackage>/test_<module>.py: {missing}"
    stale = [m for m in NO_FILE_OF_THEIR_OWN if (TESTS / m.split("/")[0] / f"test_{m.split('/')[1]}.py").exists()]
    assert stale == [], f"these have a test file now: drop them from NO_FILE_OF_THEIR_OWN: {stale}"


def test_no_test_file_is_named_after_how_its_tests_were_found():
    found = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py")
                   if p.stem.endswith("_mutants") or p.stem.startswith(("test_properties", "test_bad_input")))
    assert found == [], f"fold these into the test file of the module they test: {found}"


# The one test folder that is a package: its files mirror helpers/lab/exercises/ by name, and four
# of those names (test_attention, test_embeddings, test_gpt, test_layers) are tests/model's too.
PACKAGES = [TESTS / "lab" / "exercises"]


def test_test_file_basenames_are_unique():
    """pytest's default import mode (prepend) imports each test file by its basename, and the
    sub-folders of tests/ have no __init__.py: two files of one name would collide. A file in a
    package (PACKAGES) is imported as package.name and may share its basename with another."""
    names = [p.name for p in TESTS.rglob("test_*.py") if p.parent not in PACKAGES]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    assert [p.parent for p in TESTS.rglob("__init__.py")] == PACKAGES


EXERCISES = HELPERS / "lab" / "exercises"
EXERCISE_TESTS = TESTS / "lab" / "exercises"
# tests/lab/exercises/'s files that are not test_<module>.py (or test_<module>_use.py), and why
EXERCISE_FILES_OF_NO_MODULE = {
    "__init__.py": "makes the folder a package (see PACKAGES)",
    "judging.py": "what the checker tests share (how a case is judged); not a test module",
    "test_check.py": "the package's own __init__.py: check, evaluate, exercise's time limit",
}
# checker modules without a test file of their own, and why
EXERCISE_MODULES_WITHOUT_FILE = {
    "building_blocks": "recorded from the reference solutions; held by tests/notebooks/test_exercises.py",
}


def exercise_test_strays(modules: set[str], files: set[str]) -> list[str]:
    """The files of tests/lab/exercises/ that mirror none of `modules` (stems of the checker
    modules): a file is test_<module>.py or test_<module>_use.py, or is listed with its reason."""
    strays = []
    for name in sorted(files - set(EXERCISE_FILES_OF_NO_MODULE)):
        stem = name.removeprefix("test_").removesuffix(".py")
        if not (name.startswith("test_") and name.endswith(".py")) or (
                stem not in modules and stem.removesuffix("_use") not in modules):
            strays.append(name)
    return strays


def test_the_exercise_tests_mirror_the_checker_modules():
    modules = {p.stem for p in EXERCISES.glob("*.py") if not p.stem.startswith("_")}
    files = {p.name for p in EXERCISE_TESTS.glob("*.py")}
    missing = sorted(m for m in modules - set(EXERCISE_MODULES_WITHOUT_FILE) if f"test_{m}.py" not in files)
    assert missing == [], f"checker modules without tests/lab/exercises/test_<module>.py: {missing}"
    assert exercise_test_strays(modules, files) == [], "name each file after the checker module it tests"
    stale = [m for m in EXERCISE_MODULES_WITHOUT_FILE if f"test_{m}.py" in files]
    assert stale == [], f"these have a test file now: drop them from EXERCISE_MODULES_WITHOUT_FILE: {stale}"


def test_a_file_named_after_a_round_is_a_stray_and_a_use_file_is_not():
    modules = {"attention", "multihead_attention"}
    files = {"test_attention.py", "test_multihead_attention_use.py", "test_late_exercises.py",
             "judging.py", "cases.py"}
    assert exercise_test_strays(modules, files) == ["cases.py", "test_late_exercises.py"]


def imported_test_modules(path: Path, test_modules: set[str]) -> list[str]:
    """The test modules (stems in `test_modules`) that the file at `path` imports, however written:
    `import test_x`, `from test_x import y`, `from .test_x import y`, `from . import test_x`,
    `importlib.import_module("test_x")`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            dotted = [node.module or ""] + [f"{node.module or ''}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            dotted = [str(node.args[0].value)]
        else:
            continue
        found += [part for name in dotted for part in name.split(".") if part in test_modules]
    return sorted(set(found))




def test_no_test_module_imports_another_test_module():
    """A test module never imports another: a run of one folder would then fail on the other's
    absence or order (issue 49: test_late_exercises imported test_dpo). Shared tables and
    fixtures live in support modules (shared_tools.py, dpo_reference.py, lab/exercises/judging.py)."""
    test_modules = {p.stem for p in TESTS.rglob("test_*.py")}
    leaning = {str(p.relative_to(TESTS)): imported for p in sorted(TESTS.rglob("*.py"))
               if (imported := imported_test_modules(p, test_modules))}
    assert leaning == {}, f"move what these import into a support module: {leaning}"


def test_the_import_reader_sees_every_way_to_import_a_test_module(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import test_a\nfrom test_b import x\nfrom .test_c import y\nfrom . import test_d\n"
                      "import importlib\nimportlib.import_module('test_e')\n"
                      "from shared_tools import full\nimport test_unknown_elsewhere\n")
    names = {"test_a", "test_b", "test_c", "test_d", "test_e"}
    assert imported_test_modules(source, names) == ["test_a", "test_b", "test_c", "test_d", "test_e"]


def test_every_path_in_the_mutation_map_exists():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutation", HELPERS.parent / "benchmarks" / "mutation.py")
    mutation = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("mutation", mutation)  # its dataclasses look their module up by name
    spec.loader.exec_module(sys.modules["mutation"])
    mutation = sys.modules["mutation"]
    missing = [path for module, paths in mutation.MODULE_TESTS.items() for path in [module, *paths]
               if not (HELPERS.parent / path).is_file()]
    assert missing == []
    for module, paths in mutation.MODULE_TESTS.items():  # a module's run is its own file first
        own = f"tests/{Path(module).parent.name}/test_{Path(module).stem}.py"
        if (HELPERS.parent / own).is_file():
            assert paths[0] == own, module
    slow = [test.split("::")[0] for test in mutation.SLOW_TESTS]
    assert all((HELPERS.parent / path).is_file() for path in slow)


TEST_PATH = re.compile(r"\btests/[\w/]+\.py\b")


def stale_test_paths(root: Path) -> list[str]:
    """Every `tests/....py` path named in the package, notebooks, data scripts, benchmarks and the
    README that does not exist: the tests moved once (issue 40), and a docstring pointing at the
    old place sends a reader nowhere."""
    places = [*root.glob("helpers/**/*.py"), *root.glob("notebooks/src/*.py"), *root.glob("data/*.py"),
              *root.glob("benchmarks/*.py"), root / "README.md", root / "CONTRIBUTING.md"]
    missing = []
    for place in places:
        for path in TEST_PATH.findall(place.read_text(encoding="utf-8")):
            if not (root / path).exists():
                missing.append(f"{place.relative_to(root)}: {path}")
    return sorted(set(missing))


def test_every_named_test_path_exists():
    assert stale_test_paths(HELPERS.parent) == []


def test_a_stale_test_path_is_reported(tmp_path):
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "m.py").write_text('"""Tested in tests/model/test_gone.py."""\n')
    (tmp_path / "README.md").write_text("see tests/course/test_here.py\n")
    (tmp_path / "CONTRIBUTING.md").write_text("")
    (tmp_path / "tests" / "course").mkdir(parents=True)
    (tmp_path / "tests" / "course" / "test_here.py").write_text("")
    assert stale_test_paths(tmp_path) == ["helpers/m.py: tests/model/test_gone.py"]


def absolute_paths(value: object) -> list[str]:
    """Every string inside a loaded JSON value that is an absolute path (a writer's own machine)."""
    if isinstance(value, dict):
        return [found for item in value.values() for found in absolute_paths(item)]
    if isinstance(value, list):
        return [found for item in value for found in absolute_paths(item)]
    return [value] if isinstance(value, str) and re.match(r"^(/|[A-Za-z]:\\)\w", value) else []


def test_stored_figures_name_no_path_of_the_machine_that_wrote_them():
    import json

    found = {path.name: absolute_paths(json.loads(path.read_text(encoding="utf-8")))
             for path in sorted((HELPERS.parent / "data").glob("*.json"))}
    assert {name: paths for name, paths in found.items() if paths} == {}


def test_an_absolute_path_in_a_json_value_is_found():
    assert absolute_paths({"out": "/work/wt/data/x.json", "runs": [{"seed": 0, "file": "data/y.json"}]}) \
        == ["/work/wt/data/x.json"]
    assert absolute_paths(["C:\\Users\\me\\x.json", "1/2", "/"]) == ["C:\\Users\\me\\x.json"]
