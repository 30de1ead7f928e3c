"""benchmarks/bench_modern_ablation.py, notebook 9's ablation: a short rerun, and the committed
table (data/modern_ablation.json) agrees with what the script builds today."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("bench_modern_ablation", ROOT / "benchmarks" / "bench_modern_ablation.py")
bench = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = bench  # dataclasses look their module up there
SPEC.loader.exec_module(bench)


@pytest.fixture(scope="module")
def data():
    return bench.load_data()


@pytest.fixture(scope="module")
def target(data):
    return bench.n_params(bench.AblationGPT(bench.GPT2, data[0], 4 * bench.D_MODEL))


def test_every_variant_has_the_gpt2_blocks_parameter_count(data, target):
    for variant in bench.VARIANTS:
        hidden = bench.equal_size_hidden(variant, data[0], target)
        count = bench.n_params(bench.AblationGPT(variant, data[0], hidden))
        assert abs(count - target) < 0.005 * target, (variant.name, count, target)


def test_each_variant_is_built_as_named(data):
    gqa = bench.AblationGPT(bench.CUMULATIVE[-1], data[0], 100)
    assert gqa.blocks[0].attn.k_proj.out_features == 2 * bench.D_MODEL // bench.N_HEADS  # 2 KV heads
    assert gqa.positions is None and isinstance(gqa.norm, bench.RMSNorm)
    assert not any(name.endswith("bias") for name, _ in gqa.named_parameters())
    gpt2 = bench.AblationGPT(bench.GPT2, data[0], 256)
    assert gpt2.positions is not None and gpt2.blocks[0].attn.k_proj.bias is not None
    assert gpt2.head.weight is gpt2.embed.weight  # tied in every variant


def test_the_same_seed_gives_the_same_initialisation_to_shared_parts(data):
    torch.manual_seed(0)
    first = bench.AblationGPT(bench.GPT2, data[0], 256)
    torch.manual_seed(0)
    second = bench.AblationGPT(bench.GPT2, data[0], 256)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters(), strict=True))
    residual = first.blocks[0].attn.out_proj.weight
    assert abs(float(residual.detach().std()) - 0.02 / math.sqrt(2 * bench.N_LAYERS)) < 0.003  # GPT-2's init


def test_a_short_run_trains_and_reports(data, target, tmp_path):
    out = tmp_path / "short.json"
    table = bench.run(steps=3, seeds=[0], variants=[bench.GPT2, bench.CUMULATIVE[-1]], out=out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(table))
    for row in table["rows"]:
        assert len(row["val_loss"]) == 1 and math.isfinite(row["val_loss"][0])
        assert row["val_loss"][0] < math.log(data[0]) + 0.5  # near ln V after 3 steps, not diverged
    assert "--rows 0 5" in table["command"]


def test_the_committed_table_matches_the_script(data, target):
    table = json.loads((ROOT / "data" / "modern_ablation.json").read_text())
    assert table["gpt2_params"] == target and len(table["seeds"]) >= 3
    names = {v.name: v for v in bench.VARIANTS}
    assert table["rows"][0]["name"] == bench.GPT2.name
    for row in table["rows"]:
        variant = names[row["name"]]
        assert row["variant"] == variant.__dict__
        assert row["hidden"] == bench.equal_size_hidden(variant, data[0], target)
        assert len(row["val_loss"]) == len(table["seeds"]) and all(0 < v < 5 for v in row["val_loss"])


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        bench.main(["--steps", "0"])
    with pytest.raises(SystemExit):
        bench.main(["--rows", "12"])
