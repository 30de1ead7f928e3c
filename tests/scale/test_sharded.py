"""helpers.scale.sharded: ShardedAdamW.step in one process, as rank 0 or 1 of two, with the
broadcast recorded; its refusals read in full.

Written for the mutation run (benchmarks/mutation.py, issue 30), after @torch.no_grad()
functions were mutated too: the two-rank tests run in worker processes, which mutmut does not
count, so each test here fails in-process on a planted one-line bug of step.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.scale import sharded
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
