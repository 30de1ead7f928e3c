"""helpers.scale.sharded: ShardedAdamW.step in one process, as rank 0 or 1 of two, with the
broadcast recorded; its refusals read in full.

The two-rank tests (marked `processes`) run in worker processes; the one-rank tests run the
workers' code in this process, where a mutation run (benchmarks/mutation.py) sees it.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from shared_tools import small_gpt
from torch import nn

from helpers.scale import sharded
from helpers.scale.data_parallel import Run, make_model, max_difference, train_single
from helpers.scale.sharded import (
    ShardedAdamW,
    assign_owners,
    train_fsdp,
    train_zero_by_hand,
    train_zero_torch,
)
from helpers.training.by_hand import adamw_update


def params_with_gradients() -> list[nn.Parameter]:
    """Sizes 6, 4, 3, 2: owners by size, largest first, to the least loaded rank: [0, 1, 1, 0]."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(2, 3), (4,), (3, 1), (2,)]
    params = [nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64)
    return params


@pytest.fixture
def broadcasts(monkeypatch):
    calls = []
    monkeypatch.setattr(sharded, "check_same_shapes", lambda *args: None)  # a collective
    monkeypatch.setattr(sharded.dist, "broadcast",
                        lambda tensor, src: calls.append((tensor, src, tensor.clone())))
    return calls


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_updates_its_own_parameters_then_broadcasts_each_from_its_owner(broadcasts, rank):
    params = params_with_gradients()
    before = [p.detach().clone() for p in params]
    optimizer = sharded.ShardedAdamW(params, rank=rank, world_size=2, betas=(0.8, 0.9), eps=1e-6,
                                     weight_decay=0.3)
    assert optimizer.owner == [0, 1, 1, 0]
    optimizer.step(lr=0.01)
    assert [(tensor is p, src) for (tensor, src, _), p in zip(broadcasts, params, strict=True)] \
        == [(True, 0), (True, 1), (True, 1), (True, 0)]
    for i, (p, old) in enumerate(zip(params, before, strict=True)):
        if optimizer.owner[i] == rank:  # notebook 7's update, first step; decay on matrices only
            decay = 0.3 if p.dim() >= 2 else 0.0
            expected, _, _ = adamw_update(old, p.grad, torch.zeros_like(old), torch.zeros_like(old),
                                          1, 0.01, (0.8, 0.9), 1e-6, decay)
            assert torch.equal(p, expected)
        else:  # another rank's: left for its owner's broadcast
            assert torch.equal(p, old)
        assert torch.equal(broadcasts[i][2], p)  # broadcast after the update
    assert optimizer.t == 1 and sorted(optimizer.m) == [i for i in range(4) if optimizer.owner[i] == rank]


def test_a_single_rank_broadcasts_nothing(broadcasts):
    params = params_with_gradients()
    optimizer = sharded.ShardedAdamW(params, rank=0, world_size=1)
    optimizer.step(lr=0.01)
    optimizer.step(lr=0.01)
    assert broadcasts == [] and optimizer.t == 2


def test_a_rank_saves_and_loads_the_state_of_its_own_parameters_only(broadcasts):
    params = params_with_gradients()
    rank_1 = sharded.ShardedAdamW(params, rank=1, world_size=2, betas=(0.8, 0.9), eps=1e-6)
    rank_1.step(lr=0.01)
    state = rank_1.state_dict()
    assert state["t"] == 1 and sorted(state["state"]) == [1, 2]  # owners [0, 1, 1, 0]
    fresh = sharded.ShardedAdamW(params, rank=1, world_size=2)
    fresh.load_state_dict(state)
    assert (fresh.t, fresh.betas, fresh.eps) == (1, (0.8, 0.9), 1e-6)
    assert all(torch.equal(fresh.m[i], rank_1.m[i]) and fresh.m[i] is not rank_1.m[i] for i in (1, 2))
    with pytest.raises(ValueError, match=r"^state\['state'\] holds the moments of weights \[1, 2\], "
                                         r"expected those of weights \[0, 3\]"):
        sharded.ShardedAdamW(params, rank=0, world_size=2).load_state_dict(state)


@pytest.mark.parametrize("edit, message", [
    (lambda s: {"t": 1}, r"^state has keys \['t'\], expected a state_dict\(\) with 't', 'state' and 'param_groups'"),
    (lambda s: {**s, "t": -1}, r"^state\['t'\] is -1, expected an int >= 0"),
    (lambda s: {**s, "state": {0: {"m": torch.zeros(3), "v": torch.zeros(2, 3)}, **{i: s["state"][i] for i in (1, 2, 3)}}},
     r"^state\['state'\]\[0\]\['m'\] is of shape \(3,\), expected a floating-point tensor of weight 0's shape \(2, 3\)"),
    (lambda s: {**s, "param_groups": [{**s["param_groups"][0], "params": [0, 1]}]},
     r"^state\['param_groups'\] has groups of sizes \[2\], expected \[4\]"),
    (lambda s: {**s, "param_groups": [{**s["param_groups"][0], "eps": 0.0}]},
     r"^state\['param_groups'\]\[0\]\['eps'\] is 0.0"),
])
def test_loading_a_state_of_other_weights_or_settings_is_refused_by_name(edit, message):
    optimizer = sharded.ShardedAdamW(params_with_gradients(), rank=0, world_size=1)
    optimizer.step(lr=0.01)
    state = optimizer.state_dict()
    m = dict(optimizer.m)
    with pytest.raises(ValueError, match=message):
        optimizer.load_state_dict(edit(state))
    assert optimizer.t == 1 and all(optimizer.m[i] is m[i] for i in m)  # nothing changed


@pytest.mark.parametrize("lr, message", [
    (-0.1, r"^lr is -0.1, expected a finite number >= 0$"),
    (float("inf"), r"^lr is inf, expected a finite number >= 0$"),
])
def test_step_refuses_a_learning_rate_by_name(lr, message):
    optimizer = sharded.ShardedAdamW(params_with_gradients(), rank=0, world_size=1)
    with pytest.raises(ValueError, match=message):
        optimizer.step(lr)
    assert optimizer.t == 0
    optimizer.step(0.0)  # zero is a learning rate: nothing moves but the step count
    assert optimizer.t == 1


def test_step_names_at_most_three_of_its_own_parameters_without_a_gradient(broadcasts):
    params = [nn.Parameter(torch.ones(n)) for n in (5, 4, 3, 2, 1)]
    optimizer = sharded.ShardedAdamW(params, rank=0, world_size=1)
    with pytest.raises(ValueError) as error:
        optimizer.step(0.1)
    assert str(error.value) == ("params [0, 1, 2] of rank 0 have no .grad, expected backward() to "
                                "have run before step()")
    # as rank 1 of 2 it owns parameters 1 and 2 (sizes 4, 3) only: those, and only those, count
    params[0].grad = None
    optimizer = sharded.ShardedAdamW(params, rank=1, world_size=2)
    assert optimizer.mine == [1, 2]
    with pytest.raises(ValueError, match=r"^params \[1, 2\] of rank 1 have no \.grad"):
        optimizer.step(0.1)
    params[1].grad, params[2].grad = torch.zeros(4), torch.zeros(3)
    optimizer.step(0.1)  # parameter 0, another rank's, has no gradient: not this rank's business
    assert optimizer.t == 1 and len(broadcasts) == 5


@pytest.mark.parametrize("kwargs, words", [
    ({"betas": (0.9, 1.0)}, "betas[1] is 1.0, expected a number in [0, 1)"),
    ({"betas": (1.0, 0.99)}, "betas[0] is 1.0"),
    ({"betas": (0.9,)}, "betas is (0.9,), expected two numbers"),
    ({"eps": 0.0}, "eps is 0.0"),
    ({"rank": 2}, "rank is 2, expected 0 <= rank < world_size = 2"),
    ({"rank": -1}, "rank is -1"),
])
def test_sharded_adamw_refuses_nonsense(kwargs, words):
    params = [torch.nn.Parameter(torch.ones(3))]
    with pytest.raises(ValueError, match=re.escape(words)):
        ShardedAdamW(params, **{"rank": 0, "world_size": 2, **kwargs})
    optimizer = ShardedAdamW(params, rank=0, world_size=1)
    with pytest.raises(ValueError, match="have no .grad"):
        optimizer.step(0.1)
    params[0].grad = torch.ones(3)
    with pytest.raises(ValueError, match="lr is nan"):
        optimizer.step(float("nan"))


def test_the_sharded_optimizer_on_one_rank_is_torchs_adamw():
    """ZeRO-1's AdamW, owning every parameter, takes the same steps as torch.optim.AdamW with
    decay on the matrices only (sharded-vs-one-rank tests prove the sharding, this the optimizer)."""
    from helpers.scale.sharded import ShardedAdamW

    ours, theirs = small_gpt(torch.float64), small_gpt(torch.float64)
    theirs.load_state_dict(ours.state_dict())
    hand = ShardedAdamW(ours.parameters(), rank=0, world_size=1, betas=(0.8, 0.95), eps=1e-7,
                        weight_decay=0.2)
    matrices = [p for p in theirs.parameters() if p.dim() >= 2]
    vectors = [p for p in theirs.parameters() if p.dim() < 2]
    reference = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.2},
                                   {"params": vectors, "weight_decay": 0.0}],
                                  lr=3e-3, betas=(0.8, 0.95), eps=1e-7, foreach=False)
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        ids = torch.randint(0, 31, (2, 16), generator=generator)
        for model in (ours, theirs):
            model.zero_grad(set_to_none=True)
            model(ids).logsumexp(-1).mean().backward()
        hand.step(lr=3e-3)
        reference.step()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=name)


def reference(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, **kw)


@pytest.fixture
def one_rank():
    """A one-process gloo group in this process: the workers' code runs here, where a mutation
    tool (and a debugger) can see it; with one rank, sharded must equal unsharded exactly."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("task", [sharded.train_zero_by_hand, sharded.train_zero_torch])
def test_zero_on_one_rank_is_adamw_bit_for_bit(one_rank, task):
    run = Run(model="gpt", steps=2, lr=0.01)
    result = task(0, 1, run)
    assert result["max_gap"] == 0.0
    n_bytes = sum(p.numel() * p.element_size() for p in make_model(run).parameters())
    assert result["state_bytes"] == result["full_state_bytes"] == 2 * n_bytes  # m and v
    if task is sharded.train_zero_by_hand:
        assert result["owned"] == result["parameters"] == len(list(make_model(run).parameters()))


@pytest.mark.parametrize("model", ["gpt", "mlp"])
def test_fsdp_on_one_rank_holds_every_weight_and_trains_as_one_process(one_rank, model):
    run = Run(model=model, steps=2)
    result = sharded.train_fsdp(0, 1, run)
    assert result["local_bytes"] == result["full_bytes"] and result["kind"] == "DTensor"
    assert max_difference(result["weights"], train_single(run)) == 0.0


def test_torchs_zero_runs_with_the_settings_of_ours(one_rank, monkeypatch):
    """Both optimizers of train_zero_torch are AdamW with ShardedAdamW's defaults: the notebook
    compares the two implementations, so their settings must be the same ones."""
    settings = []

    class RecordingAdamW(torch.optim.AdamW):
        def __init__(self, params, **kwargs):
            settings.append(kwargs)
            super().__init__(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", RecordingAdamW)
    sharded.train_zero_torch(0, 1, Run(steps=1, lr=0.05))
    defaults = inspect.signature(sharded.ShardedAdamW).parameters
    expected = dict(lr=0.05, betas=defaults["betas"].default, eps=defaults["eps"].default,
                    weight_decay=defaults["weight_decay"].default, foreach=False)
    assert settings == [expected, expected]
    assert expected == dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, foreach=False)


def test_the_sharded_optimizers_defaults_are_torchs_adamw_with_decay_on_matrices():
    torch.manual_seed(0)
    ours, theirs = nn.Linear(4, 3).double(), nn.Linear(4, 3).double()
    theirs.load_state_dict(ours.state_dict())
    hand = sharded.ShardedAdamW(ours.parameters(), rank=0, world_size=1)
    reference = torch.optim.AdamW([{"params": [theirs.weight], "weight_decay": 0.1},
                                   {"params": [theirs.bias], "weight_decay": 0.0}],
                                  lr=0.1, betas=(0.9, 0.99), eps=1e-8, foreach=False)
    for step in range(3):
        for model in (ours, theirs):
            model.zero_grad(set_to_none=True)
            model(torch.full((2, 4), step + 1.0, dtype=torch.float64)).pow(2).sum().backward()
        hand.step(lr=0.1)
        reference.step()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)


@pytest.mark.parametrize("params, kwargs, message", [
    ([], {}, r"^params is empty or holds something other than tensors, expected the model's "
     r"parameters \(model.parameters\(\)\)$"),
    (["a"], {}, "^params is empty or holds something other than tensors"),
    (None, {"weight_decay": -1.0}, r"^weight_decay is -1.0, expected a number in \[0, inf\)$"),
    (None, {"weight_decay": float("inf")}, r"^weight_decay is inf, expected a number in \[0, inf\)$"),
])
def test_the_sharded_optimizer_names_what_is_wrong(params, kwargs, message):
    params = [nn.Parameter(torch.ones(2))] if params is None else params
    with pytest.raises(ValueError, match=message):
        sharded.ShardedAdamW(params, rank=0, world_size=1, **kwargs)


@pytest.mark.parametrize("world_size, checked", [(1, False), (2, True), (3, True)])
def test_the_sharded_optimizer_compares_shapes_across_ranks_when_there_are_several(
        monkeypatch, world_size, checked):
    """The cross-rank comparison itself needs two processes (the tests marked `processes`); here,
    that the optimizer asks for it, with its parameters, exactly when there are other ranks."""
    calls = []
    monkeypatch.setattr(sharded, "check_same_shapes", lambda *args: calls.append(args))
    params = [nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2, 2))]
    sharded.ShardedAdamW(params, rank=0, world_size=world_size)
    assert calls == ([(params, "params")] if checked else [])


def test_owners_need_a_positive_world_size():
    with pytest.raises(ValueError, match="^world_size is 0, expected a positive int$"):
        sharded.assign_owners([3, 2], 0)
    with pytest.raises(ValueError, match=r"^sizes\[1\] is -1, expected an int >= 0$"):
        sharded.assign_owners([3, -1], 2)  # it gave owners [0, 1] for a size that cannot be
    with pytest.raises(TypeError, match="^sizes is 'ab', expected a list of parameter sizes"):
        sharded.assign_owners("ab", 2)


def test_a_weight_listed_twice_is_refused_before_it_is_stepped_twice():
    params = params_with_gradients()
    with pytest.raises(ValueError, match=r"^params lists weight 4 \(shape \(2, 3\)\) a second time, expected "
                                         "each weight once"):
        sharded.ShardedAdamW([*params, params[0]], rank=0, world_size=1)


@pytest.mark.processes
@pytest.mark.slow
def test_zero_by_hand_and_torch_match_unsharded_adamw_with_half_the_state(scale_workers):
    for task in (train_zero_by_hand, train_zero_torch):
        results = scale_workers.run(task, Run(model="gpt", steps=3, lr=0.01))
        assert all(r["max_gap"] < 1e-6 for r in results)
        assert sum(r["state_bytes"] for r in results) == results[0]["full_state_bytes"]
        assert all(r["state_bytes"] < 0.6 * r["full_state_bytes"] for r in results)


@pytest.mark.processes
def test_fsdp_shards_the_weights_and_trains_like_one_process(scale_workers):
    run = Run(model="gpt", steps=2)
    results = scale_workers.run(train_fsdp, run)
    assert all(r["local_bytes"] * 2 == r["full_bytes"] for r in results)
    assert max_difference(results[0]["weights"], train_single(run)) < 1e-6


def test_owners_balance_the_values():
    owners = assign_owners([100, 10, 60, 50], 2)
    load = [sum(s for s, o in zip([100, 10, 60, 50], owners, strict=True) if o == r) for r in range(2)]
    assert sorted(load) == [110, 110]  # 100 + 10 and 60 + 50
