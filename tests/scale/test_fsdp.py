"""FSDP by hand on 2 real processes (gloo, CPU): equal to one process in float64, a shard of
everything per rank; the ZeRO paper's memory accounting."""

from __future__ import annotations

import pytest
import torch

from helpers.scale.data_parallel import Run, max_difference
from helpers.scale.fsdp import (
    GPT3,
    FlatShard,
    ShardAdamW,
    gpt_units,
    memory_table,
    reduce_scatter_mean,
    train_fsdp_by_hand,
    train_reference,
)
from helpers.scale.parallelism import memory_per_rank


@pytest.fixture
def workers(scale_workers):
    return scale_workers  # one pool for the session (tests/conftest.py)


def test_fsdp_by_hand_ends_with_the_weights_of_one_process(workers):
    run = Run(model="gpt", steps=3, lr=0.01)
    results = workers.run(train_fsdp_by_hand, run)
    reference = train_reference(run)
    for result in results:
        gap = max_difference(result["weights"], reference)
        print(f"FSDP by hand vs one process after {run.steps} AdamW steps (float64): {gap:.1e}")
        assert gap < 1e-12
    assert max_difference(reference, train_reference(Run(model="gpt", steps=2, lr=0.01))) > 1e-3
    # a rank keeps weights, gradients, m and v of half the model (plus < 2 padding values a unit)
    for result in results:
        print(f"bytes held per rank {result['held_bytes']}, one process {result['single_bytes']}, "
              f"peak full weights {result['peak_full_bytes']}")
        assert 0 <= result["held_bytes"] - result["single_bytes"] / 2 < 4 * 8 * 2 * 3
        assert result["peak_full_bytes"] < result["single_bytes"] / 4  # never all the weights at once


def test_the_zero_paper_figure_1_numbers():
    # ZeRO (Rajbhandari et al., 2020), figure 1: Psi = 7.5B parameters, N_d = 64 GPUs, K = 12
    memory = memory_per_rank(7_500_000_000, 64, precision="mixed")
    assert round(memory["data parallel"] / 1e9, 1) == 120.0
    assert round(memory["ZeRO-1 (optimizer state)"] / 1e9, 1) == 31.4
    assert round(memory["ZeRO-2 (+ gradients)"] / 1e9, 1) == 16.6
    assert round(memory["ZeRO-3 / FSDP (+ weights)"] / 1e9, 2) == 1.88


def test_memory_table_for_gpt2_and_gpt3():
    table = memory_table(64)
    assert set(table) == {"GPT-2 small", "GPT-3 175B"}
    gpt3 = table["GPT-3 175B"]
    assert 174e9 < gpt3["data parallel"] / 16 < 176e9  # 175B parameters
    assert 2.7e12 < gpt3["data parallel"] < 2.9e12 and 42e9 < gpt3["ZeRO-3 / FSDP (+ weights)"] < 45e9
    assert GPT3.d_model == 12288
    with pytest.raises(ValueError, match="world_size"):
        memory_table(0)


def test_fsdp_arguments_are_checked():
    with pytest.raises(ValueError, match="flat"):
        reduce_scatter_mean(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="multiple of world_size"):
        reduce_scatter_mean(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="params"):
        FlatShard([], 0, 2)
    with pytest.raises(ValueError, match="rank"):
        FlatShard([torch.nn.Parameter(torch.zeros(3))], 2, 2)
    with pytest.raises(ValueError, match="shards"):
        ShardAdamW([], 0.1)
    with pytest.raises(TypeError, match="course GPT"):
        gpt_units(torch.nn.Linear(2, 2), 0, 1)
    with pytest.raises(ValueError, match="run.model"):
        train_fsdp_by_hand(0, 1, Run(model="mlp"))


def test_a_shard_keeps_its_piece_and_frees_the_weights():
    p, q = torch.nn.Parameter(torch.arange(6.0).view(2, 3)), torch.nn.Parameter(torch.arange(3.0))
    shard = FlatShard([p, q, p], rank=1, world_size=2)  # p twice (tied): kept once
    assert shard.total == 9 and shard.size == 5
    assert shard.shard.tolist() == [5.0, 0.0, 1.0, 2.0, 0.0]  # values 5..8 and one zero of padding
    assert shard.decay.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert p.numel() == 0 and q.numel() == 0  # freed


def test_gradient_piece_checks_its_arguments_before_any_collective():
    from helpers.scale.fsdp import gradient_piece
    with pytest.raises(ValueError, match="rank"):
        gradient_piece(2, 2, [torch.zeros(4), torch.zeros(4)])
    with pytest.raises(ValueError, match="grads has 1 entries, expected one per rank \\(2\\)"):
        gradient_piece(0, 2, [torch.zeros(4)])
    with pytest.raises(ValueError, match="grads has tensor entries|grads has Tensor"):
        gradient_piece(0, 2, torch.zeros(2, 4))
