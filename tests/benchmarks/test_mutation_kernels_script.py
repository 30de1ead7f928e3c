"""benchmarks/mutation_kernels.py makes mutants only inside @triton.jit kernels, checks its
arguments, and merges the verdicts of several runs (a later run's verdict wins): tested on made-up
kernels and verdicts, without Triton or a GPU (the runs themselves are slow)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("tomllib", reason="the report reads its judgements with Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
SPEC = importlib.util.spec_from_file_location("mutation_kernels",
                                              ROOT / "benchmarks" / "mutation_kernels.py")
kernels = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = kernels
SPEC.loader.exec_module(kernels)
import mutation  # noqa: E402  (benchmarks/ is on the path above)

SOURCE = '''"""Two made-up kernels and a helper that is not one."""
LIMIT = 3

if triton is not None:

    @triton.jit
    def add_kernel(x, y):
        return x + y

    def not_a_kernel(x):
        return x * 2

    @triton.jit
    def clamp_kernel(x):
        return tl.minimum(x, 4)
'''


def test_mutants_are_made_inside_the_kernels_only():
    pytest.importorskip("mutmut", reason="making mutants needs the mutation extra")
    mutants = kernels.make_mutants(SOURCE)
    assert {m["function"] for m in mutants} == {"add_kernel", "clamp_kernel"}
    for m in mutants:
        assert m["source"].count("    @triton.jit\n") == 2  # the decorators are put back
        assert "LIMIT = 3" in m["source"] and "return x * 2" in m["source"]
        before, after = mutation.changed_lines(m["diff"])
        assert before in ("return x + y", "return tl.minimum(x, 4)") and after != before
    names = [m["name"] for m in mutants if m["function"] == "add_kernel"]
    assert names[0] == "helpers.flash.triton_kernels.x_add_kernel__mutmut_1"
    assert any("return x - y" in m["source"] for m in mutants)


def test_a_module_without_kernels_is_refused():
    pytest.importorskip("mutmut", reason="making mutants needs the mutation extra")
    with pytest.raises(ValueError, match="no '@triton.jit' kernels"):
        kernels.make_mutants("def f():\n    return 1\n")


@pytest.mark.parametrize("argv, message", [
    (["run", "--jobs", "0"], "--jobs: expected a positive number, got 0"),
    (["run", "--timeout", "-1"], "--timeout: expected a positive number"),
    (["run", "--limit", "-2"], "--limit: expected 0 (all) or more, got -2"),
])
def test_bad_run_arguments_are_named(argv, message, tmp_path, capsys):
    (tmp_path / "index.json").write_text("[]")
    with pytest.raises(SystemExit):
        kernels.parse_args([*argv, "--dir", str(tmp_path)])
    assert message in capsys.readouterr().err


def test_run_needs_the_mutants_first(tmp_path, capsys):
    with pytest.raises(SystemExit):
        kernels.parse_args(["run", "--dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert "no index.json" in err and "run `make` first" in err


def test_store_merges_runs_and_a_later_verdict_wins(tmp_path):
    diff = ("--- a\n+++ b\n@@ -1 +1 @@\n-        return x + y\n+        return x - y\n")
    names = [f"helpers.flash.triton_kernels.x_add_kernel__mutmut_{i}" for i in (1, 2, 3)]
    (tmp_path / "index.json").write_text(json.dumps(
        [{"name": n, "function": "add_kernel", "diff": diff} for n in names]))

    def run(device, verdicts, seconds):
        return {"device": device, "date": "2026-01-01", "seconds": seconds, "seed": 0,
                "verdicts": {n: {"status": s, "passed": 1, "failed": 0, "seconds": 1.0}
                             for n, s in verdicts.items()}}

    first = tmp_path / "gpu.json"
    first.write_text(json.dumps(run("GPU", {names[0]: "killed", names[1]: "timeout"}, 60)))
    second = tmp_path / "cpu.json"
    second.write_text(json.dumps(run("CPU", {names[1]: "survived", names[2]: "error3"}, 30)))
    real = mutation.RESULTS.read_bytes() if mutation.RESULTS.exists() else None
    args = kernels.parse_args(["store", "--dir", str(tmp_path), "--verdicts", str(first), str(second),
                               "--results", str(tmp_path / "results.json"),
                               "--report", str(tmp_path / "MUTATION.md"),
                               "--equivalent", str(tmp_path / "none.toml")])
    assert kernels.command_store(args) == 0
    result = mutation.load_results(tmp_path / "results.json")[kernels.MODULE]
    statuses = {m.name: m.status for m in result.mutants}
    assert statuses == {names[0]: "killed", names[1]: "survived", names[2]: "suspicious"}
    assert result.seconds == 90
    assert "CPU (2 final verdicts); GPU (1 final verdicts)" in result.note
    assert "3 of 3 mutants tested" in result.note
    assert (mutation.RESULTS.read_bytes() if mutation.RESULTS.exists() else None) == real
    assert "| `helpers/flash/triton_kernels.py` | 3 | 1 |" in (tmp_path / "MUTATION.md").read_text()
    survivor = next(m for m in result.mutants if m.name == names[1])
    assert mutation.changed_lines(survivor.diff) == ("return x + y", "return x - y")
