"""helpers.scale.expert_parallel in the pytest process: one to four ranks as threads
(tests/ranks_in_threads.py), the split MoE layer against the whole one, the rows each rank receives against
a count made here from the router, the dispatch plan against its definition.

tests/model/test_moe.py runs the step in two spawned processes.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from ranks_in_threads import SeedTurns, run_ranks

from helpers.model.moe import MoELayer, route
from helpers.scale import expert_parallel as ep
from helpers.scale.expert_parallel import dispatch_plan

DEFAULTS = dict(seed=0, n_tokens=16, d_model=16, n_experts=4, top_k=2, hidden=32)


@pytest.fixture
def layers(monkeypatch):
    """Each rank seeds the shared generator and builds its layer in turn (its route() call ends
    its turn); the layers' settings, as built, are recorded."""
    turns, built = SeedTurns(), []
    monkeypatch.setattr(torch, "manual_seed", turns.manual_seed(torch.manual_seed))
    monkeypatch.setattr(ep, "route", turns.release_before(ep.route))

    def recording(*args):
        built.append(args)
        return MoELayer(*args)

    monkeypatch.setattr(ep, "MoELayer", recording)
    return built


def _expected_rows(world_size, seed, n_tokens, d_model, n_experts, top_k, hidden):
    """Rows each rank sends (its tokens x k) and receives (the assignments to its experts),
    counted from the router of the layer every rank builds from `seed`."""
    torch.manual_seed(seed)
    layer = MoELayer(d_model, n_experts, top_k, hidden).eval()
    received = [0] * world_size
    for rank in range(world_size):
        x = torch.randn(n_tokens, d_model, generator=torch.Generator().manual_seed(seed + 1 + rank))
        _, experts = route(layer.router(x), top_k, layer.mode)
        for e in experts.flatten().tolist():
            received[e // (n_experts // world_size)] += 1
    return [{"rows_sent": n_tokens * top_k, "rows_computed": r} for r in received]


@pytest.mark.parametrize("world_size, settings", [
    (1, {}),
    (2, {}),
    (4, {}),
    (2, dict(seed=3, n_tokens=20, d_model=8, n_experts=4, top_k=2, hidden=16)),
    (2, dict(seed=1, n_tokens=12, d_model=8, n_experts=8, top_k=3, hidden=8)),
    (4, dict(seed=2, n_tokens=9, d_model=4, n_experts=8, top_k=1, hidden=8)),
])
def test_the_split_layer_is_the_whole_layer_and_each_rank_computes_its_experts_rows(
        layers, world_size, settings):
    results = run_ranks(world_size, ep.expert_parallel_step, *settings.values())
    full = {**DEFAULTS, **settings}
    for result, expected in zip(results, _expected_rows(world_size, *full.values()), strict=True):
        assert result["max_error"] < 1e-6
        assert {k: result[k] for k in ("rows_sent", "rows_computed")} == expected
    assert sum(r["rows_computed"] for r in results) == world_size * full["n_tokens"] * full["top_k"]
    s = full
    assert layers == [(s["d_model"], s["n_experts"], s["top_k"], s["hidden"])] * world_size


def test_the_layer_of_every_rank_comes_from_the_seed(layers, monkeypatch):
    """A rank that built another layer would route and compute differently: the split layer
    would then differ from the whole one each rank compares with."""
    seeds = []
    seeding = torch.manual_seed
    monkeypatch.setattr(torch, "manual_seed", lambda seed: seeds.append(seed) or seeding(seed))
    run_ranks(2, ep.expert_parallel_step, 7)
    assert seeds == [7, 7]


def test_the_result_is_the_largest_difference_as_a_float():
    result = run_ranks(1, lambda rank, ws: ep.expert_parallel_step(rank, ws, 0, 4, 4, 2, 1, 4))[0]
    assert type(result["max_error"]) is float and result["max_error"] < 1e-6
    assert (type(result["rows_sent"]), type(result["rows_computed"])) == (int, int)
    assert result["rows_sent"] == result["rows_computed"] == 4


def test_each_assignment_goes_to_the_rank_holding_its_expert_in_a_stable_order():
    experts = torch.tensor([[5, 0], [2, 7], [4, 1], [6, 3]])  # E = 8 over 4 ranks: 2 each
    order, counts = dispatch_plan(experts, 8, 4)
    flat = experts.flatten()
    assert order.tolist() == [1, 5, 2, 7, 0, 4, 3, 6]
    assert (flat[order] // 2).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert counts.tolist() == [2, 2, 2, 2]
    order, counts = dispatch_plan(torch.tensor([[0, 1], [1, 0]]), 8, 4)
    assert order.tolist() == [0, 1, 2, 3] and counts.tolist() == [4, 0, 0, 0]  # idle ranks counted


def test_a_stable_order_keeps_each_ranks_assignments_in_token_order():
    experts = torch.tensor([[3, 2], [1, 0], [2, 3], [0, 1]] * 8)
    order, counts = dispatch_plan(experts, 4, 2)
    assert order.tolist() == [i for i in range(64) if experts.flatten()[i] < 2] + \
        [i for i in range(64) if experts.flatten()[i] >= 2]
    assert counts.tolist() == [32, 32]


@pytest.mark.parametrize("n_experts, world_size, error, message", [
    (4, 0, ValueError, "^world_size is 0, expected a positive int$"),
    (4, 3, ValueError, "^n_experts is 4, expected a multiple of world_size = 3: every rank holds the "
                       "same number of experts$"),
])
def test_the_plan_names_a_split_that_does_not_divide(n_experts, world_size, error, message):
    with pytest.raises(error, match=message):
        dispatch_plan(torch.zeros(2, 1, dtype=torch.long), n_experts, world_size)


@pytest.mark.parametrize("experts, error, message", [
    (torch.tensor([[0, 4]]), ValueError, r"^experts holds 0 \.\. 4, expected indices in 0 \.\. 3$"),
    (torch.tensor([[-1, 2]]), ValueError, r"^experts holds -1 \.\. 2, expected indices in 0 \.\. 3$"),
    (torch.tensor([[0.0, 1.0]]), TypeError, r"^experts is torch.float32, expected an integer tensor"),
    ([[0, 1]], TypeError, r"^experts is list, expected an integer tensor"),
])
def test_the_plan_refuses_expert_ids_it_cannot_send(experts, error, message):
    with pytest.raises(error, match=message):
        dispatch_plan(experts, 4, 2)


@pytest.mark.parametrize("name", ["n_tokens", "d_model", "n_experts", "top_k", "hidden"])
def test_the_step_refuses_an_empty_size_before_starting(name):
    from helpers.scale.expert_parallel import expert_parallel_step

    with pytest.raises(ValueError, match=f"^{name} is 0, expected a positive int$"):
        expert_parallel_step(0, 2, **{name: 0})


def test_each_rank_runs_only_the_experts_it_holds(layers, monkeypatch):
    """Rank r holds experts r E/W ... (r+1) E/W - 1: it never runs another rank's expert, not
    even on no rows."""
    from helpers.model.moe import Experts

    ran = []
    real_one = Experts.one
    monkeypatch.setattr(Experts, "one", lambda self, e, x: ran.append((dist.get_rank(), e)) or real_one(self, e, x))
    run_ranks(4, ep.expert_parallel_step, 0, 16, 8, 8, 2, 8)
    assert sorted(ran) == [(rank, e) for rank in range(4) for e in (2 * rank, 2 * rank + 1)]
