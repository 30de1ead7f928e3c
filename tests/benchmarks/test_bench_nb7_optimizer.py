"""benchmarks/bench_nb7_optimizer.py: notebook 7's run with AdamW against Muon at equal time. The
committed JSON's summary is recomputed from its runs, and a tiny run of the script has its shape."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("bench_nb7_optimizer", ROOT / "benchmarks" / "bench_nb7_optimizer.py")
bench = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = bench
SPEC.loader.exec_module(bench)
STORED = sorted((ROOT / "data").glob("nb7_optimizer*.json"))


def check_shape(result: dict) -> None:
    settings = result["settings"]
    assert result["step_ratio"] == pytest.approx(result["step_seconds"]["muon"] / result["step_seconds"]["adamw"])
    assert result["muon_steps"] == round(settings["steps"] / result["step_ratio"])
    assert [run["seed"] for run in result["runs"]] == settings["seeds"]
    for run in result["runs"]:
        assert run["adamw"]["steps"] == settings["steps"]
        for lr in settings["muon_lr"]:
            assert run[f"muon lr {lr:g}"]["steps"] == result["muon_steps"]
        for lr in settings["adamw_lr"]:
            assert run[f"adamw lr {lr:g}"]["steps"] == settings["steps"]
    for name, summary in result["summary"].items():
        gaps = [run[name]["val_loss"] - run["adamw"]["val_loss"] for run in result["runs"]]
        assert summary["val_loss_minus_adamw"] == pytest.approx(gaps)
        assert summary["wins_every_seed"] == all(gap < 0 for gap in gaps)
        assert summary["median_gap"] == pytest.approx(statistics.median(gaps))
        best = [min(run[key]["val_loss"] for key in run if key.startswith("adamw")) for run in result["runs"]]
        assert summary["beats_every_adamw_rate_on_every_seed"] == all(
            run[name]["val_loss"] < b for run, b in zip(result["runs"], best, strict=True))


@pytest.mark.parametrize("path", STORED, ids=lambda p: p.name)
def test_the_stored_comparison_is_consistent_with_its_runs(path):
    result = json.loads(path.read_text(encoding="utf-8"))
    check_shape(result)
    assert len(result["settings"]["seeds"]) >= 3 and result["settings"]["steps"] == bench.NB7_STEPS


def test_a_tiny_run_writes_that_shape(tmp_path):
    out = tmp_path / "nb7.json"
    assert bench.main(["--steps", "3", "--seeds", "0", "--rounds", "1", "--block", "1",
                       "--muon-lr", "0.02", "--adamw-lr", "1e-2", "--out", str(out)]) == 0
    check_shape(json.loads(out.read_text(encoding="utf-8")))
