"""benchmarks/bench_grpo.py: a short rerun has the committed JSON's shape, and the JSON holds
what notebook 13 reads (three seeds, both normalisations, one reward per step)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_grpo", ROOT / "benchmarks" / "bench_grpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_short_rerun_has_the_committed_shape():
    bench = load_bench()
    result = bench.run(steps=2, seeds=[0], pretrain_steps=5, sft_steps=2)
    assert set(result["runs"]) == {"sequence/0", "token/0"}
    for run in result["runs"].values():
        assert len(run["reward"]) == 2 and all(0.0 <= r <= 1.0 for r in run["reward"])
        assert all(math.isfinite(k) and k >= 0 for k in run["kl"])


def test_committed_json_has_three_seeds_of_both_normalisations():
    data = json.loads((ROOT / "data" / "grpo_rewards.json").read_text())
    assert data["command"] == "python benchmarks/bench_grpo.py" and data["seeds"] == [0, 1, 2]
    for normalise in ("sequence", "token"):
        for seed in data["seeds"]:
            run = data["runs"][f"{normalise}/{seed}"]
            assert len(run["reward"]) == data["steps"]
            assert 0.0 <= run["train_accuracy"] <= 1.0
