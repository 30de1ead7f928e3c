"""benchmarks/bench_grpo.py: a short rerun has the committed JSON's shape, and the JSON holds
what notebook 13 reads (twelve seeds, the three normalisations, one reward per step)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

from helpers.post import grpo

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_grpo", ROOT / "benchmarks" / "bench_grpo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_short_rerun_has_the_committed_shape():
    bench = load_bench()
    result = bench.run(steps=2, seeds=[0], pretrain_steps=5, sft_steps=2)
    assert set(result["runs"]) == {"sequence/0", "token/0", "constant/0"}
    for run in result["runs"].values():
        assert len(run["reward"]) == 2 and all(0.0 <= r <= 1.0 for r in run["reward"])
        assert all(math.isfinite(k) and k >= 0 for k in run["kl"])
    # one seed's three runs sample the same first step: same model, same generator
    assert len({run["reward"][0] for run in result["runs"].values()}) == 1


def test_the_methods_are_the_three_papers():
    """GRPO per sequence and DAPO per token both scale by the group's std; Dr. GRPO divides by a
    constant and does not."""
    methods = load_bench().METHODS
    assert {m["normalise"] for m in methods.values()} == set(grpo.NORMALISATIONS)
    assert {m["paper"]: (m["normalise"], m["scale_rewards"]) for m in methods.values()} == {
        "GRPO": ("sequence", True), "DAPO": ("token", True), "Dr. GRPO": ("constant", False)}


def test_committed_json_has_twelve_seeds_of_the_three_methods():
    data = json.loads((ROOT / "data" / "grpo_rewards.json").read_text())
    assert data["command"] == "python benchmarks/bench_grpo.py" and data["seeds"] == list(range(12))
    assert data["methods"] == load_bench().METHODS
    for method in data["methods"]:
        first_steps = set()
        for seed in data["seeds"]:
            run = data["runs"][f"{method}/{seed}"]
            assert len(run["reward"]) == data["steps"] >= 10
            # each step's reward is a count of right answers out of 4 x 8, rounded to 4 digits
            assert all(0.0 <= r <= 1.0 and abs(r * 32 - round(r * 32)) < 0.01 for r in run["reward"])
            assert 0.0 <= run["train_accuracy"] <= 1.0 and 0.0 <= run["held_accuracy"] <= 1.0
            first_steps.add(run["reward"][0])
        assert len(first_steps) > 1  # the seeds differ
    for seed in data["seeds"]:  # the three methods of one seed share their first step
        assert len({data["runs"][f"{m}/{seed}"]["reward"][0] for m in data["methods"]}) == 1
