"""benchmarks/bench_post_seeds.py: a short rerun has the committed JSON's shape, and the JSON
holds what notebook 13 reads (the ladder and the stages over several pretraining seeds)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from helpers.post import classify

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_post_seeds",
                                                  ROOT / "benchmarks" / "bench_post_seeds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_shape(result: dict) -> None:
    assert result["finetune_seeds"] == [0, 1, 2]
    rows = result["ladder_rows"]
    assert {r["which"] for r in rows.values()} == set(classify.WHICH)
    assert [rows[w]["lr"] for w in classify.WHICH] == [2e-3] * 3  # the notebook's rate for all three
    assert rows["all_lr_5e-4"] == {"which": "all", "lr": 5e-4}
    n_test = result["n_test_statements"]
    for p in result["pretrain_seeds"]:
        for row in result["ladder_rows"]:
            accs = result["ladder"][f"{p}/{row}"]
            assert len(accs) == 3
            # an accuracy is a count of right statements out of n_test
            assert all(0.0 <= a <= 1.0 and abs(a * n_test - round(a * n_test)) < 1e-4 for a in accs)
        stages = result["stages"][str(p)]
        assert list(stages) == ["prose", "pretrained", "sft", "dpo", "grpo"]
        for split, n in (("train", result["n_train_questions"]), ("held", result["n_held_questions"])):
            for acc in stages.values():
                assert abs(acc[split] * n - round(acc[split] * n)) < 1e-6


def test_short_rerun_has_the_committed_shape():
    result = load_bench().run([3], pretrain_steps=3, sft_steps=1, dpo_steps=1, grpo_steps=1)
    assert result["pretrain_seeds"] == [3]
    check_shape(result)


def test_committed_json_has_several_pretraining_seeds():
    data = json.loads((ROOT / "data" / "post_seeds.json").read_text())
    assert data["command"] == "python benchmarks/bench_post_seeds.py"
    assert len(data["pretrain_seeds"]) >= 4
    check_shape(data)
    # the pretraining seeds give different models: their ladders are not all the same
    assert len({tuple(data["ladder"][f"{p}/all"]) for p in data["pretrain_seeds"]}) > 1
    # SFT teaches the chat format: every seed answers more training questions after it
    for stages in data["stages"].values():
        assert stages["sft"]["train"] > stages["pretrained"]["train"]
