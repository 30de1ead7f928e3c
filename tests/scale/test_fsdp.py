"""FSDP by hand on 2 real processes (gloo, CPU): equal to one process in float64, a shard of
everything per rank; the ZeRO paper's memory accounting."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
from ranks_in_threads import ThreadRanks
from shared_tools import full
from torch import nn

from helpers.model.gpt import GPTConfig, exact_parameters
from helpers.scale import fsdp
from helpers.scale.data_parallel import Run, make_batch, make_model, max_difference
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


@pytest.mark.processes
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


# FSDP by hand (helpers.scale.fsdp) with its ranks as threads of this process (tests/ranks_in_threads.py),
# where mutmut sees the workers' code run: equal to one process in float64 on 2 and 3 ranks (3 pads
# every unit), the bytes held and the peak exactly as the ZeRO accounting says, every check read in
# full.

def ranks(monkeypatch, world_size: int) -> ThreadRanks:
    return ThreadRanks(world_size).patch(monkeypatch, fsdp)


@pytest.mark.parametrize("world_size", [2, 3])
def test_fsdp_on_thread_ranks_ends_with_the_weights_of_one_process(monkeypatch, world_size):
    run = Run(model="gpt", steps=2, lr=0.01, batch_size=2 * world_size)
    results = ranks(monkeypatch, world_size).run(fsdp.train_fsdp_by_hand, run)
    reference = fsdp.train_reference(run)
    assert max_difference(reference, make_model(run).double().state_dict()) > 1e-3  # it trained
    model = make_model(run)
    root = [*model.embed.parameters(), *model.ln_f.parameters(), *model.lm_head.parameters()]
    totals = [sum({id(p): p.numel() for p in root}.values())] + [
        sum(p.numel() for p in block.parameters()) for block in model.blocks]
    pieces = [math.ceil(total / world_size) for total in totals]
    for result in results:
        assert max_difference(result["weights"], reference) < 1e-12
        assert result["held_bytes"] == 8 * 4 * sum(pieces)  # shard, gradient, m, v of each unit
        assert result["single_bytes"] == 8 * 4 * sum(totals)
        assert result["peak_full_bytes"] == 8 * (totals[0] + max(totals[1:]))


def test_reduce_scatter_mean_gives_each_rank_its_piece_of_the_mean(monkeypatch):
    flats = [torch.arange(6.0) * (rank + 1) + rank for rank in range(3)]
    expected = torch.stack(flats).mean(0).chunk(3)
    got = ranks(monkeypatch, 3).run(lambda rank, p: fsdp.reduce_scatter_mean(flats[rank], p))
    for rank in range(3):
        torch.testing.assert_close(got[rank], expected[rank], rtol=0, atol=1e-6)
    got = ranks(monkeypatch, 2).run(lambda rank, p: fsdp.gradient_piece(rank, p, flats[:2]))
    for rank, piece in enumerate(torch.stack(flats[:2]).mean(0).chunk(2)):
        torch.testing.assert_close(got[rank], piece, rtol=0, atol=1e-6)
    (alone,) = ranks(monkeypatch, 1).run(lambda rank, p: fsdp.reduce_scatter_mean(flats[2], p))
    assert torch.equal(alone, flats[2])  # one rank: its own gradient, whole


def test_a_shard_is_its_ranks_piece_before_any_communication():
    for rank, values, decay in ((0, [0.0, 1.0, 2.0, 3.0, 4.0], [1.0] * 5), (1, [5.0, 0.0, 1.0, 2.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0])):
        p = nn.Parameter(torch.arange(6.0, dtype=torch.float64).view(2, 3))
        q = nn.Parameter(torch.arange(3.0, dtype=torch.float64))
        shard = fsdp.FlatShard([p, q, p], rank=rank, world_size=2)  # p twice (tied): kept once
        assert (shard.total, shard.size, shard.numels, shard.shapes) == (9, 5, [6, 3], [(2, 3), (3,)])
        assert shard.shard.tolist() == values and shard.decay.tolist() == decay  # padded with one zero
        assert torch.equal(shard.grad, torch.zeros(5, dtype=torch.float64))  # a zero gradient to start
        assert shard.gathered is False
        assert p.numel() == q.numel() == 0 and p.dtype == q.dtype == torch.float64  # freed, dtype kept


def test_a_flat_shard_gathers_frees_and_reduce_scatters(monkeypatch):
    def task(rank, world_size):
        torch.manual_seed(0)
        linear, norm = nn.Linear(2, 3), nn.LayerNorm(3)  # 9 + 6 = 15 values: 8 a rank, 1 of padding
        params = [*linear.parameters(), *norm.parameters()]
        full = [p.detach().clone() for p in params]
        shard = fsdp.FlatShard(params, rank, world_size)
        assert not shard.gathered and all(p.numel() == 0 and p.grad is None for p in params)
        with pytest.raises(RuntimeError, match="^reduce_scatter_grads before gather: the unit holds "
                                               "no gradients$"):
            shard.reduce_scatter_grads()
        shard.gather()
        assert shard.gathered
        for p, expected in zip(params, full, strict=True):
            assert torch.equal(p.data, expected) and p.grad is None
        x = torch.tensor([[1.0, -2.0]]) * (rank + 1)
        (norm(linear(x)) * torch.tensor([1.0, 3.0, -2.0])).sum().backward()
        norm.weight.grad = None  # a parameter without a gradient counts as zeros
        grads = [torch.zeros(3) if p is norm.weight else p.grad.clone() for p in params]
        shard.reduce_scatter_grads()
        shard.free()
        assert not shard.gathered and all(p.numel() == 0 and p.grad is None for p in params)
        assert (shard.bytes_held(), shard.full_bytes()) == (2 * 8 * 4, 15 * 4)
        return shard.grad, torch.cat([g.flatten() for g in grads] + [torch.zeros(1)])

    results = ranks(monkeypatch, 2).run(task)
    mean = (results[0][1] + results[1][1]) / 2
    assert torch.equal(results[0][0], mean[:8]) and torch.equal(results[1][0], mean[8:])
    assert not torch.equal(results[0][1], results[1][1])  # the ranks' gradients differ
    assert results[0][1][:6].abs().min() > 0  # and the matrix's are not zero


def test_a_gather_clears_the_gradients_left_from_before(monkeypatch):
    def task(rank, world_size):
        p = nn.Parameter(torch.arange(4.0))
        shard = fsdp.FlatShard([p], rank, world_size)
        shard.gather()
        p.grad = torch.ones(4)
        shard.gather()
        return p.grad, p.data.clone()

    grad, data = ranks(monkeypatch, 1).run(task)[0]
    assert grad is None and torch.equal(data, torch.arange(4.0))


def test_the_shard_optimizer_is_torchs_adamw_on_matrices_and_vectors():
    torch.manual_seed(0)
    ours, theirs = nn.Linear(3, 2).double(), nn.Linear(3, 2).double()
    theirs.load_state_dict(ours.state_dict())
    reference = torch.optim.AdamW([{"params": [theirs.weight], "weight_decay": 0.1},
                                   {"params": [theirs.bias], "weight_decay": 0.0}],
                                  lr=0.05, betas=(0.9, 0.99), eps=1e-8, foreach=False)
    shard = fsdp.FlatShard(list(ours.parameters()), 0, 1)
    optimizer = fsdp.ShardAdamW([shard], lr=0.05)
    assert optimizer.state_bytes() == 2 * 8 * 8  # m and v of 8 float64 values
    for step in range(3):
        grads = [torch.full((2, 3), step + 1.0, dtype=torch.float64) * torch.arange(6.0).view(2, 3),
                 torch.tensor([1e-9, -2.0], dtype=torch.float64)]  # a tiny gradient sees eps
        for p, g in zip(theirs.parameters(), grads, strict=True):
            p.grad = g
        reference.step()
        shard.grad = torch.cat([g.flatten() for g in grads])
        optimizer.step()
    expected = torch.cat([p.detach().flatten() for p in theirs.parameters()])
    torch.testing.assert_close(shard.shard, expected, rtol=0, atol=1e-15)
    assert fsdp.BETAS == (0.9, 0.99) and fsdp.EPS == 1e-8 and fsdp.WEIGHT_DECAY == 0.1


def test_the_units_are_the_root_then_each_block():
    run = Run(model="gpt")
    model = make_model(run)
    root = [*model.embed.parameters(), *model.ln_f.parameters(), *model.lm_head.parameters()]
    unique, counted = sum({id(p): p.numel() for p in root}.values()), sum(p.numel() for p in root)
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    units = fsdp.gpt_units(model, 0, 1)
    assert len(units) == len(model.blocks) + 1
    assert units[0].total == unique < counted  # the tied matrix counted once
    assert [u.total for u in units[1:]] == blocks


def test_fsdp_step_refuses_units_and_rows_that_do_not_fit():
    model = make_model(Run(model="gpt"))
    units = fsdp.gpt_units(model, 0, 1)
    n = len(model.blocks) + 1
    with pytest.raises(ValueError, match=f"^units has {n - 1} entries, expected {n} "
                                         r"\(gpt_units\(model, rank, world_size\)\)$"):
        fsdp.fsdp_step(model, units[:-1], torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))
    for ids, targets in ((torch.zeros(2, 4), torch.zeros(2, 3)), (torch.zeros(8), torch.zeros(8))):
        message = f"ids {tuple(ids.shape)} and targets {tuple(targets.shape)}, expected two (b, N)"
        with pytest.raises(ValueError, match=full(message)):
            fsdp.fsdp_step(model, units, ids, targets)


def test_the_flat_checks_name_what_they_got():
    with pytest.raises(ValueError, match=r"^flat is shape \(2, 2\), torch.float32, expected a flat "
                                         r"\(P,\) floating-point tensor$"):
        fsdp.reduce_scatter_mean(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match=r"^flat is shape \(3,\), torch.int64"):
        fsdp.reduce_scatter_mean(torch.zeros(3, dtype=torch.long), 1)
    with pytest.raises(ValueError, match=r"^flat is list, expected"):
        fsdp.reduce_scatter_mean([1.0], 1)
    with pytest.raises(ValueError, match=r"^flat has 5 values, expected a multiple of world_size = 2 "
                                         r"\(pad the flat vector with zeros\)$"):
        fsdp.reduce_scatter_mean(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="^world_size is 0, expected a positive int$"):
        fsdp.reduce_scatter_mean(torch.zeros(4), 0)
    with pytest.raises(ValueError, match=r"^grads has 1 entries, expected one per rank \(2\)$"):
        fsdp.gradient_piece(0, 2, [torch.zeros(4)])
    with pytest.raises(ValueError, match=r"^grads has int entries, expected one per rank \(2\)$"):
        fsdp.gradient_piece(0, 2, 3)
    with pytest.raises(ValueError, match=r"^params is empty or holds something other than parameters, "
                                         r"expected a unit's parameters \(list\(module.parameters\(\)\)\)$"):
        fsdp.FlatShard([torch.zeros(2)], 0, 1)
    with pytest.raises(ValueError, match=r"^shards is empty or holds something other than FlatShard, "
                                         r"expected the units of gpt_units\(\)$"):
        fsdp.ShardAdamW([object()], 0.1)
    with pytest.raises(ValueError, match="^lr is 0.0"):
        fsdp.ShardAdamW(fsdp.gpt_units(make_model(Run(model="gpt")), 0, 1), 0.0)
    with pytest.raises(TypeError, match="^model is a Linear, expected the course GPT$"):
        fsdp.gpt_units(nn.Linear(2, 2), 0, 1)
    with pytest.raises(ValueError, match="^run.model is 'mlp', expected 'gpt'$"):
        fsdp.train_fsdp_by_hand(0, 1, Run(model="mlp"))


def test_the_memory_table_is_over_64_ranks_unless_told():
    table = fsdp.memory_table()
    assert table == fsdp.memory_table(64)
    assert table["GPT-3 175B"] == memory_per_rank(exact_parameters(fsdp.GPT3), 64, precision="mixed")
    assert table["GPT-2 small"] == memory_per_rank(exact_parameters(GPTConfig.gpt2_small()), 64,
                                                   precision="mixed")
    with pytest.raises(ValueError, match="^world_size is 0, expected a positive int$"):
        fsdp.memory_table(0)
    assert fsdp.memory_table(8)["GPT-3 175B"] == memory_per_rank(exact_parameters(fsdp.GPT3), 8,
                                                                 precision="mixed")
    assert (fsdp.GPT3.vocab_size, fsdp.GPT3.context_length, fsdp.GPT3.n_layers, fsdp.GPT3.n_heads,
            fsdp.GPT3.d_model) == (50257, 2048, 96, 96, 12288)


@pytest.fixture
def one_rank():
    """A one-process gloo group in this process (torch's own FSDP needs a default group)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fsdp_by_hand_trains_as_pytorchs_fully_shard(one_rank):
    """FSDP2's fully_shard with the same units (each block, then the root) and the same AdamW."""
    from torch.distributed.fsdp import fully_shard

    run = Run(model="gpt", steps=2, lr=0.01)
    ours = fsdp.train_fsdp_by_hand(0, 1, run)
    model = make_model(run).double()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                                   {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=0.01, betas=(0.9, 0.99), eps=1e-8, foreach=False)
    for step in range(run.steps):
        ids, targets = make_batch(run, step)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), targets.flatten()).backward()
        optimizer.step()
    theirs = {name: t.full_tensor().detach() for name, t in model.state_dict().items()}
    assert type(next(model.parameters())).__name__ == "DTensor"
    assert max_difference(ours["weights"], theirs) < 1e-12
