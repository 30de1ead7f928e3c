"""benchmarks/mutation.py checks its arguments and writes MUTATION.md from mutmut's verdicts and the
equivalence judgements, tested on a made-up result: mutmut itself is never run here (slow)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("tomllib", reason="the report reads its judgements with Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("mutation", ROOT / "benchmarks" / "mutation.py")
mutation = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = mutation
SPEC.loader.exec_module(mutation)

MODULE = "helpers/flash/tiled.py"
DIFF = """--- helpers/flash/tiled.py
+++ helpers/flash/tiled.py
@@ -1,3 +1,3 @@
 def _tiles(n, block):
-    return [slice(i, min(i + block, n)) for i in range(0, n, block)]
+    return [slice(i, max(i + block, n)) for i in range(0, n, block)]
"""


def fake_result() -> mutation.ModuleResult:
    mutants = [mutation.Mutant(f"helpers.flash.tiled.x__tiles__mutmut_{i}", "killed")
               for i in range(1, 7)]
    mutants += [
        mutation.Mutant("helpers.flash.tiled.x__tiles__mutmut_7", "survived", DIFF),
        mutation.Mutant("helpers.flash.tiled.x__tiles__mutmut_8", "survived",
                        DIFF.replace("max(", "min(i + 1 +")),
        mutation.Mutant("helpers.flash.tiled.xǁTiledAttentionǁforward__mutmut_1", "timeout", DIFF),
        mutation.Mutant("helpers.flash.tiled.x_finish__mutmut_1", "no tests", DIFF),
    ]
    return mutation.ModuleResult(MODULE, mutants, seconds=90.0, tests=["tests/flash/test_tiled.py"],
                                 date="2026-01-01")


EQUIVALENT = f"""
[[equivalent]]
module = "{MODULE}"
function = "_tiles"
before = "return [slice(i, min(i + block, n)) for i in range(0, n, block)]"
after = "return [slice(i, max(i + block, n)) for i in range(0, n, block)]"
reason = "made up for the test"

[[equivalent]]
module = "{MODULE}"
function = "_tiles"
before = "a line no mutant changes"
after = "another"
reason = "stale"
"""


@pytest.mark.parametrize("argv, message", [
    ([], "at least one module"),
    (["--module", "helpers/nowhere.py"], "no test map"),
    (["--module", MODULE, "--report-only"], "drop --module"),
    (["--module", MODULE, "--jobs", "0"], "at least 1"),
    (["--module", MODULE, "--timeout-multiplier", "0"], "--timeout-multiplier"),
    (["--module", MODULE, "--nice", "25"], "0 to 19"),
    (["--module", MODULE, "--workdir", str(ROOT / "tmp")], "outside the repository"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        mutation.parse_args(argv)
    assert message in capsys.readouterr().err


def test_every_mapped_module_and_test_file_exists():
    for module, tests in mutation.MODULE_TESTS.items():
        assert (ROOT / module).is_file(), module
        assert tests and all((ROOT / t).is_file() for t in tests), (module, tests)
    for test in mutation.SLOW_TESTS:
        path, name = test.split("::")
        assert f"def {name}(" in (ROOT / path).read_text("utf-8"), test


def test_mutant_names_and_diffs_are_read():
    assert mutation.function_of("helpers.flash.tiled.x__tiles__mutmut_12") == "_tiles"
    assert mutation.function_of("helpers.flash.tiled.xǁTiledAttentionǁforward__mutmut_3") == \
        "TiledAttention.forward"
    before, after = mutation.changed_lines(DIFF)
    assert before.startswith("return [slice(i, min(") and after.startswith("return [slice(i, max(")


def test_report_scores_and_names_the_equivalents(tmp_path):
    (tmp_path / "eq.toml").write_text(EQUIVALENT, "utf-8")
    results = {MODULE: fake_result()}
    mutation.save_results(results, tmp_path / "results.json")
    loaded = mutation.load_results(tmp_path / "results.json")
    assert loaded[MODULE].mutants == sorted(results[MODULE].mutants, key=lambda m: m.name)
    s = mutation.summary(loaded[MODULE], mutation.load_equivalents(tmp_path / "eq.toml"))
    assert (s["total"], s["killed"], s["survived"], s["timeout"], s["equivalent"]) == (10, 6, 3, 1, 1)
    assert s["score"] == 6 / 9
    text = mutation.write_report(loaded, tmp_path / "MUTATION.md", tmp_path / "eq.toml")
    assert (tmp_path / "MUTATION.md").read_text("utf-8") == text
    assert f"| `{MODULE}` | 10 | 6 | 3 | 1 | 0 | 1 | 66.7 % | 1.5 min | 2026-01-01 |" in text
    assert "x__tiles__mutmut_7`: `return" in text and "made up for the test" in text
    assert "x__tiles__mutmut_8` (survived)" in text and "x_finish__mutmut_1` (no tests)" in text
    assert "Stale judgements" in text and "a line no mutant changes" in text
    assert "Earlier runs" not in text
    assert "not run yet: `helpers/model/attention.py`" in text


def test_a_rerun_keeps_the_earlier_score(tmp_path, monkeypatch):
    monkeypatch.setattr(mutation, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(mutation, "REPORT", tmp_path / "MUTATION.md")
    monkeypatch.setattr(mutation, "EQUIVALENT", tmp_path / "eq.toml")
    (tmp_path / "eq.toml").write_text(EQUIVALENT, "utf-8")
    mutation.save_results({MODULE: fake_result()})
    better = fake_result()
    better.mutants[7].status = "killed"  # the test written for x__tiles__mutmut_8
    monkeypatch.setattr(mutation, "run_module", lambda module, args: better)
    assert mutation.main(["--module", MODULE]) == 0
    text = (tmp_path / "MUTATION.md").read_text("utf-8")
    assert f"| `{MODULE}` | 10 | 7 | 2 | 1 | 0 | 1 | 77.8 % |" in text
    assert "Earlier runs" in text and f"| `{MODULE}` | 10 | 6 | 3 | 1 | 0 | 1 | 66.7 % |" in text


def test_an_incomplete_judgement_is_refused(tmp_path):
    (tmp_path / "eq.toml").write_text(f'[[equivalent]]\nmodule = "{MODULE}"\n', "utf-8")
    with pytest.raises(ValueError, match="lacks"):
        mutation.load_equivalents(tmp_path / "eq.toml")


def test_generated_config_mutates_one_module_with_its_tests():
    import tomllib

    config = tomllib.loads(mutation.mutmut_config(MODULE, ["tests/flash/test_tiled.py"], 5.0, 2.0))
    table = config["tool"]["mutmut"]
    assert table["only_mutate"] == [MODULE] and table["source_paths"] == ["helpers"]
    assert table["pytest_add_cli_args_test_selection"] == ["tests/flash/test_tiled.py"]
    assert (table["timeout_multiplier"], table["timeout_constant"]) == (5.0, 2.0)
    assert table["pytest_add_cli_args"][-2:] == ["--deselect", mutation.SLOW_TESTS[-1]]


def test_results_of_the_first_format_are_still_read(tmp_path):
    old = {MODULE: {"seconds": 60.0, "tests": [], "date": "2026-01-01",
                    "mutants": [{"name": "helpers.flash.tiled.x__tiles__mutmut_7",
                                 "status": "survived", "diff": DIFF}]}}
    (tmp_path / "old.json").write_text(json.dumps(old), "utf-8")
    result = mutation.load_results(tmp_path / "old.json")[MODULE]
    assert result.mutants == [mutation.Mutant("helpers.flash.tiled.x__tiles__mutmut_7", "survived", DIFF)]
    mutation.save_results({MODULE: result}, tmp_path / "new.json")
    assert mutation.load_results(tmp_path / "new.json")[MODULE].mutants == result.mutants


DECORATED = '''
import torch
from contextlib import contextmanager


class Box:
    @property
    def size(self) -> int:
        """A docstring stays first."""
        return 3

    @staticmethod
    def make() -> "Box":
        return Box()

    @functools.cache
    def cached(self) -> int:
        return 1


@torch.no_grad()
def scale_(x):
    x.mul_(2)
    return x


@contextmanager
def opened():
    yield 1


def plain(x):
    return x
'''


def test_decorators_are_moved_below_their_functions_so_mutmut_reaches_them():
    pytest.importorskip("libcst", reason="the rewrite uses mutmut's parser (the mutation extra)")
    source, moved, kept = mutation.unwrap_decorators(DECORATED)
    assert moved == ["Box.size", "scale_", "opened"]
    assert kept == ["Box.cached"]  # staticmethod is mutmut's own case, plain has no decorator
    assert "    size = property(size)\n" in source
    assert "scale_ = torch.no_grad()(scale_)\n" in source
    assert "@torch.no_grad()" not in source and "@property" not in source
    assert "@staticmethod" in source and "@functools.cache" in source
    namespace: dict = {"functools": __import__("functools")}
    exec(compile(source, "<rewritten>", "exec"), namespace)
    assert namespace["Box"]().size == 3
    leaf = torch.ones(2, requires_grad=True)
    assert namespace["scale_"](leaf).tolist() == [2.0, 2.0]  # in place on a leaf: only under no_grad
    with pytest.raises(RuntimeError, match="leaf"):
        leaf.mul_(2)
    with namespace["opened"]() as value:
        assert value == 1


def test_the_report_lists_the_same_functions_without_libcst():
    assert mutation.decorated_functions(DECORATED) == (["Box.size", "scale_", "opened"],
                                                       ["Box.cached"])
    nested = "if x:\n    class A:\n        @property\n        def b(self):\n            return 1\n"
    assert mutation.decorated_functions(nested) == (["A.b"], [])


def test_every_helpers_module_still_compiles_after_the_rewrite():
    pytest.importorskip("libcst", reason="the rewrite uses mutmut's parser (the mutation extra)")
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        source, moved, kept = mutation.unwrap_decorators(path.read_text("utf-8"))
        compile(source, str(path), "exec")
        assert (moved, kept) == mutation.decorated_functions(path.read_text("utf-8")), path
