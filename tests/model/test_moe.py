"""Mixture of experts (notebook 12, section 1): the loop and the sorted form agree, the router's
three conventions, capacity, the balancing losses, and a transformers Qwen3-MoE's logits."""

from __future__ import annotations

import importlib.util
import math
import re

import pytest
import torch
import torch.nn.functional as F
from shared_tools import full

from helpers.model.frontier import FrontierConfig, FrontierGPT, total_and_active_parameters
from helpers.model.moe import (
    AddAuxLoss,
    Experts,
    MoELayer,
    check_expert_indices,
    expert_capacity,
    expert_load,
    group_limit,
    route,
    switch_aux_loss,
)

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _routed(seed=0, tokens=40, experts=6, k=2, d=16):
    torch.manual_seed(seed)
    x = torch.randn(tokens, d)
    logits = torch.randn(tokens, experts) * 2
    weights, chosen = route(logits, k)
    return Experts(experts, d, 24), x, weights, chosen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sorted_form_equals_the_loop_when_dropless(seed):
    experts, x, weights, chosen = _routed(seed)
    out, dropped = experts.sorted(x, weights, chosen)
    assert dropped == 0
    torch.testing.assert_close(out, experts.loop(x, weights, chosen), atol=1e-6, rtol=1e-5)


def test_capacity_drops_exactly_the_assignments_past_it():
    experts, x, weights, chosen = _routed(3, tokens=60)
    load = expert_load(chosen, 6)
    capacity = expert_capacity(60, 2, 6, 1.0)
    out, dropped = experts.sorted(x, weights, chosen, capacity)
    assert dropped == int((load - capacity).clamp(min=0).sum()) > 0
    # the kept assignments are the first `capacity` of each expert in token order
    kept = torch.zeros_like(weights)
    for e in range(6):
        token, slot = torch.where(chosen == e)
        kept[token[:capacity], slot[:capacity]] = 1
    torch.testing.assert_close(out, experts.loop(x, weights * kept, chosen), atol=1e-6, rtol=1e-5)


def test_the_three_router_conventions():
    torch.manual_seed(0)
    logits = torch.randn(10, 8)
    w, e = route(logits, 3, "softmax_topk")
    torch.testing.assert_close(w, torch.softmax(logits, -1).topk(3).values)
    assert (w.sum(-1) < 1).all()
    w2, e2 = route(logits, 3, "topk_softmax")  # Mixtral: softmax over the k logits
    probs = torch.softmax(logits, -1).topk(3).values
    torch.testing.assert_close(w2, probs / probs.sum(-1, keepdim=True))  # transformers' way
    assert torch.equal(e, e2)
    w3, _ = route(logits, 3, "sigmoid", normalize=True)
    torch.testing.assert_close(w3.sum(-1), torch.ones(10))


def test_bias_moves_the_choice_not_the_weight():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    bias = torch.tensor([-5.0, 0.0, 0.0])
    w, e = route(logits, 1, "sigmoid", bias=bias, normalize=True)
    assert e.item() == 1 and w.item() == pytest.approx(1.0)
    w, e = route(logits, 1, "sigmoid", bias=bias, normalize=False)
    assert w.item() == pytest.approx(torch.sigmoid(torch.tensor(1.0)).item())


def test_switch_loss_is_k_when_uniform_and_larger_when_collapsed():
    uniform = torch.zeros(8, 4)
    chosen = torch.arange(8).remainder(4)[:, None]
    assert switch_aux_loss(uniform, chosen, 4).item() == pytest.approx(1.0)
    collapsed = torch.tensor([[9.0, 0, 0, 0]]).repeat(8, 1)
    assert switch_aux_loss(collapsed, torch.zeros(8, 1, dtype=torch.long), 4).item() > 3.9


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")
def test_switch_loss_equals_transformers():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
    torch.manual_seed(0)
    logits = torch.randn(30, 6)
    _, chosen = route(logits, 2)
    ours = switch_aux_loss(logits, chosen, 6)
    theirs = load_balancing_loss_func((logits,), 6, 2)
    torch.testing.assert_close(ours, theirs)


def test_add_aux_loss_adds_its_gradient_and_nothing_to_the_value():
    x = torch.randn(5, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    y = AddAuxLoss.apply(x * 2, (w ** 2).sum())
    assert torch.equal(y, x * 2)
    y.sum().backward()
    torch.testing.assert_close(w.grad, 2 * w.detach())
    torch.testing.assert_close(x.grad, torch.full((5,), 2.0))


def test_bias_balancing_lowers_an_overloaded_expert():
    torch.manual_seed(0)
    layer = MoELayer(8, 4, 1, 8, mode="sigmoid", normalize=True, balance="bias", bias_rate=0.1)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0] = 1.0   # every token prefers expert 0 when x sums positive
    x = torch.rand(32, 8)
    layer.train()
    loads = []
    for _ in range(40):
        layer(x)
        loads.append(layer.last_load.clone())
    total = torch.stack(loads).sum(0)
    assert loads[0][0] == 32                       # without the bias, expert 0 takes every token
    assert total.max() < 0.4 * total.sum()           # with it, no expert takes 40 % of them


def test_moe_model_trains_a_step_and_counts_active_parameters():
    config = FrontierConfig(n_experts=4, top_k=1, expert_hidden=16, balance="aux_loss")
    model = FrontierGPT(config)
    total, active = total_and_active_parameters(model)
    expert = 3 * 16 * config.d_model
    assert total - active == config.n_layers * 3 * expert
    loss = model(torch.randint(0, 64, (2, 10))).logsumexp(-1).mean()
    loss.backward()
    assert model.blocks[0].mlp.router.weight.grad.abs().sum() > 0


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")
@pytest.mark.parametrize("normalize", [False, True])
def test_qwen3_moe_logits_equal_transformers(normalize):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from helpers.model.frontier import config_from_qwen3_moe, from_qwen3_moe
    torch.manual_seed(0)
    hf_config = Qwen3MoeConfig(vocab_size=50, hidden_size=32, intermediate_size=64,
                               moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=8, num_experts=6, num_experts_per_tok=2,
                               max_position_embeddings=32, norm_topk_prob=normalize)
    hf = Qwen3MoeForCausalLM(hf_config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.normal_(1, 0.1)
    ids = torch.randint(0, 50, (2, 12))
    ours = from_qwen3_moe(hf.state_dict(), config_from_qwen3_moe(hf_config)).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("call, message", [
    (lambda: route(torch.randn(4, 3), 4), "top_k is 4, expected at most n_experts = 3"),
    (lambda: route(torch.randn(4), 1), "logits has shape"),
    (lambda: route(torch.randn(4, 3), 1, "softmax"), "mode is 'softmax'"),
    (lambda: expert_capacity(10, 2, 4, 0.0), "capacity_factor is 0.0"),
    (lambda: expert_capacity(10, 2, 4, -1.0), "capacity_factor is -1.0"),
    (lambda: MoELayer(8, 4, 5, 8), "top_k is 5"),
    (lambda: MoELayer(8, 4, 1, 8, capacity_factor=0), "capacity_factor is 0"),
    (lambda: MoELayer(8, 4, 1, 8, balance="loss"), "balance is 'loss'"),
    (lambda: FrontierConfig(n_experts=2, top_k=3), "top_k is 3"),
    (lambda: FrontierConfig(n_experts=0, mlp_hidden=0), "mlp_hidden is 0 and n_experts is 0"),
    (lambda: Experts(3, 4, 8).loop(torch.randn(2, 4), torch.ones(2, 1), torch.tensor([[0], [3]])),
     "experts holds 0 .. 3"),
    (lambda: Experts(3, 4, 8).sorted(torch.randn(2, 5), torch.ones(2, 1), torch.zeros(2, 1).long()),
     "x has shape"),
])
def test_bad_input_raises_a_clear_error(call, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


@pytest.mark.processes
@pytest.mark.slow
def test_expert_parallel_on_two_processes_equals_one_process():
    from helpers.scale.expert_parallel import expert_parallel_step
    from helpers.scale.workers import launch
    results = launch(expert_parallel_step, 2, 3, 20, 8, 4, 2, 16, timeout=180.0)
    assert all(r["max_error"] < 1e-6 for r in results)
    assert sum(r["rows_computed"] for r in results) == sum(r["rows_sent"] for r in results) == 2 * 20 * 2


def test_dispatch_plan_sends_each_assignment_to_its_experts_rank():
    from helpers.scale.expert_parallel import dispatch_plan
    experts = torch.tensor([[3, 0], [1, 2], [2, 3]])
    order, counts = dispatch_plan(experts, 4, 2)
    assert counts.tolist() == [2, 4]
    assert (experts.flatten()[order] // 2).tolist() == [0, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="n_experts is 4, expected a multiple of world_size = 3"):
        dispatch_plan(experts, 4, 3)


def test_copy_named_weights_names_a_missing_entry_and_a_wrong_shape():
    from helpers.model.frontier import copy_named_weights

    ours = {"w": torch.zeros(2, 3)}
    copy_named_weights(ours, {"their.w": torch.ones(2, 3)}, {"w": "their.w"})
    assert torch.equal(ours["w"], torch.ones(2, 3))
    with pytest.raises(KeyError, match="state_dict has no 'their.w', expected it for w"):
        copy_named_weights(ours, {}, {"w": "their.w"})
    with pytest.raises(ValueError, match=r"has shape \(3, 2\), expected \(2, 3\) for w"):
        copy_named_weights(ours, {"their.w": torch.ones(3, 2)}, {"w": "their.w"})


def test_group_limited_routing_keeps_every_choice_inside_the_best_groups():
    """DeepSeek-V3's groups: a group's score is the sum of its two best; only the topk_group
    best groups may be chosen. Checked by brute force, on logits where the limit decides."""
    torch.manual_seed(0)
    logits = torch.randn(64, 8)
    free_w, free_e = route(logits, 2, "sigmoid", normalize=True)
    weights, experts = route(logits, 2, "sigmoid", normalize=True, n_group=4, topk_group=1)
    scores = logits.sigmoid().view(64, 4, 2)
    best_group = scores.topk(2, dim=-1).values.sum(-1).argmax(-1)            # (T,)
    assert torch.equal(experts // 2, best_group[:, None].expand(-1, 2))
    assert (experts.sort(-1).values != free_e.sort(-1).values).any(-1).sum() > 10  # the limit decided
    torch.testing.assert_close(weights.sum(-1), torch.ones(64))


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_group=3), "n_group is 3, expected a divisor of n_experts = 8"),
    (dict(n_group=8), "n_group is 8, expected a divisor .* at least 2 experts per group"),
    (dict(n_group=4, topk_group=5), "topk_group is 5"),
    (dict(n_group=4, topk_group=0), "topk_group"),
    (dict(mode="softmax_topk", n_group=2), "expected mode 'sigmoid'"),
])
def test_bad_expert_groups_raise_a_clear_error(kwargs, message):
    args = dict(mode="sigmoid") | kwargs
    with pytest.raises(ValueError, match=message):
        route(torch.randn(4, 8), 2, **args)
    with pytest.raises(ValueError, match=message.split(",")[0]):
        MoELayer(16, 8, 2, 8, **args)


def test_check_group_mode_allows_no_groups_in_any_mode_and_groups_only_with_sigmoid():
    from helpers.model.moe import check_group_mode

    for mode in ("softmax_topk", "topk_softmax", "sigmoid"):
        check_group_mode(mode, 1, 1, 8, 2)  # one group of all experts: nothing to limit
    check_group_mode("sigmoid", 4, 2, 8, 2)
    with pytest.raises(ValueError, match="^n_group is 4 with mode 'topk_softmax', expected mode 'sigmoid': why$"):
        check_group_mode("topk_softmax", 4, 2, 8, 2, why=": why")
    with pytest.raises(ValueError, match="^n_group is 3, expected a divisor of n_experts = 8"):
        check_group_mode("sigmoid", 3, 1, 8, 2)


def test_group_limit_and_the_parameter_count_check_their_arguments():
    from helpers.model.moe import group_limit
    with pytest.raises(ValueError, match="choice has shape"):
        group_limit(torch.randn(8), 2, 1)
    with pytest.raises(ValueError, match="n_group is 3"):
        group_limit(torch.randn(4, 8), 3, 1)
    with pytest.raises(TypeError, match="model is a dict"):
        total_and_active_parameters({})


# helpers.model.moe, exactly:
#
# The dispatch (loop and sorted) against a per-token loop written here in float64, duplicates
# and empty experts, capacity at its edges (C = the largest load, C = 1, every drop counted),
# the router's conventions against their definitions (bias, normalisation, groups, ties, dtypes),
# the Switch loss by hand, the MoE layer's options (routed scale, shared expert, both balancings)
# and every error message read in full.

def _experts(n_experts=5, d=6, hidden=7, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    experts = Experts(n_experts, d, hidden).to(dtype)
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.5)           # large enough that silu is far from linear
    return experts


def per_token(experts, x, weights, chosen, kept=None):
    """out[t] = sum over slots j of weights[t, j] x expert_{chosen[t, j]}(x[t]), one matrix-vector
    product at a time; kept (T, k) bool drops the slots marked False."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(chosen.shape[1]):
            if kept is not None and not kept[t, j]:
                continue
            e = int(chosen[t, j])
            h = F.silu(experts.gate[e] @ x[t]) * (experts.up[e] @ x[t])
            out[t] += weights[t, j] * (experts.down[e] @ h)
    return out


def test_loop_and_sorted_equal_the_per_token_loop_with_duplicates_and_an_idle_expert():
    experts = _experts()
    x = torch.randn(7, 6, dtype=torch.float64)
    weights = torch.rand(7, 3, dtype=torch.float64)
    chosen = torch.tensor([[0, 0, 1], [1, 3, 0], [3, 3, 3], [0, 1, 3], [1, 0, 0], [3, 1, 1], [0, 3, 1]])
    expected = per_token(experts, x, weights, chosen)                   # expert 2, 4 idle; duplicates
    torch.testing.assert_close(experts.loop(x, weights, chosen), expected, atol=1e-12, rtol=0)
    out, dropped = experts.sorted(x, weights, chosen)
    assert dropped == 0
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


def test_one_expert_is_its_swiglu():
    experts = _experts()
    x = torch.randn(4, 6, dtype=torch.float64)
    for e in range(5):
        expected = torch.stack([experts.down[e] @ (F.silu(experts.gate[e] @ row) * (experts.up[e] @ row))
                                for row in x])
        torch.testing.assert_close(experts.one(e, x), expected, atol=1e-12, rtol=0)


def test_the_experts_parameters_and_their_scale():
    torch.manual_seed(0)
    experts = Experts(64, 16, 24)
    assert (experts.n_experts, experts.d_model, experts.hidden) == (64, 16, 24)
    assert experts.gate.shape == experts.up.shape == (64, 24, 16) and experts.down.shape == (64, 16, 24)
    for p in (experts.gate, experts.up, experts.down):
        assert 0.018 < p.std().item() < 0.022 and abs(p.mean().item()) < 1e-3   # randn x 0.02
    assert not torch.equal(experts.gate, experts.up)


@pytest.mark.parametrize("capacity", [1, 2, 3, 4])
def test_capacity_keeps_the_first_assignments_in_token_order(capacity):
    """Expert 0 has 4 assignments, 1 has 3, 3 has 2, 2 has 1, 4 none; C = 4 is the
    largest load, so nothing is dropped; every assignment past C of its expert is."""
    experts = _experts()
    x = torch.randn(5, 6, dtype=torch.float64)
    weights = torch.rand(5, 2, dtype=torch.float64)
    chosen = torch.tensor([[0, 1], [1, 0], [0, 3], [3, 1], [0, 2]])
    kept = torch.zeros(5, 2, dtype=torch.bool)
    for e in range(5):
        token, slot = torch.where(chosen == e)                          # token order, then slot
        kept[token[:capacity], slot[:capacity]] = True
    out, dropped = experts.sorted(x, weights, chosen, capacity)
    assert dropped == int((~kept).sum()) == {1: 6, 2: 3, 3: 1, 4: 0}[capacity]
    torch.testing.assert_close(out, per_token(experts, x, weights, chosen, kept), atol=1e-12, rtol=0)


def test_dropless_sorted_with_many_tokens_equals_the_loop():
    """Enough assignments per expert that an unstable sort would reorder them."""
    experts = _experts(n_experts=3)
    torch.manual_seed(1)
    x = torch.randn(200, 6, dtype=torch.float64)
    weights = torch.rand(200, 2, dtype=torch.float64)
    chosen = torch.randint(0, 3, (200, 2))
    out, dropped = experts.sorted(x, weights, chosen)
    assert dropped == 0
    torch.testing.assert_close(out, experts.loop(x, weights, chosen), atol=1e-12, rtol=0)
    load = expert_load(chosen, 3)
    out, dropped = experts.sorted(x, weights, chosen, int(load.min()))
    assert dropped == int((load - load.min()).sum())
    kept = torch.zeros(200, 2, dtype=torch.bool)
    for e in range(3):
        token, slot = torch.where(chosen == e)
        kept[token[:int(load.min())], slot[:int(load.min())]] = True
    torch.testing.assert_close(out, experts.loop(x, weights * kept, chosen), atol=1e-12, rtol=0)


def test_no_tokens_give_an_empty_output():
    experts = _experts()
    x, weights, chosen = torch.zeros(0, 6, dtype=torch.float64), torch.zeros(0, 2, dtype=torch.float64), \
        torch.zeros(0, 2, dtype=torch.long)
    assert experts.loop(x, weights, chosen).shape == (0, 6)
    out, dropped = experts.sorted(x, weights, chosen)
    assert out.shape == (0, 6) and dropped == 0


def test_expert_capacity_rounds_up():
    assert expert_capacity(10, 2, 4, 1.0) == 5
    assert expert_capacity(10, 2, 4, 1.1) == 6                         # 5.5 -> 6
    assert expert_capacity(10, 2, 4, 0.5) == 3                         # 2.5 -> 3
    assert expert_capacity(7, 1, 7, 2.0) == 2
    assert expert_capacity(3, 3, 3, 1.0) == 3                          # top_k = n_experts allowed


def test_expert_load_counts_every_slot_and_idle_experts():
    load = expert_load(torch.tensor([[0, 2], [2, 2], [0, 3]]), 6)
    assert load.dtype == torch.float32 and load.tolist() == [2, 0, 3, 1, 0, 0]


def test_softmax_topk_keeps_the_k_largest_probabilities():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.5, -1.0, 4.0, 4.5]])
    probs = torch.softmax(logits, -1)
    w, e = route(logits, 2)
    assert e.tolist() == [[1, 2], [3, 2]] and e.dtype == torch.long
    torch.testing.assert_close(w, probs.gather(1, e), atol=1e-7, rtol=0)
    w, _ = route(logits, 2, normalize=True)
    torch.testing.assert_close(w, probs.gather(1, e) / probs.gather(1, e).sum(-1, keepdim=True))


def test_topk_softmax_with_a_bias_weights_the_unbiased_logits():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    bias = torch.tensor([5.0, 0.0, 0.0, 0.0])
    w, e = route(logits, 2, "topk_softmax", bias=bias)
    assert e.tolist() == [[0, 1]]                                      # 6 and 3 after the bias
    torch.testing.assert_close(w, torch.softmax(torch.tensor([[1.0, 3.0]]), -1))
    w, e = route(logits, 2, "topk_softmax")
    assert e.tolist() == [[1, 2]]
    torch.testing.assert_close(w, torch.softmax(torch.tensor([[3.0, 2.0]]), -1))


def test_sigmoid_with_a_bias_weights_the_unbiased_scores():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    bias = torch.tensor([0.0, -2.0, 0.0, 3.0])
    w, e = route(logits, 2, "sigmoid", bias=bias)
    assert e.tolist() == [[3, 2]]                                      # 0.5 + 3, sigmoid(2) beat sigmoid(3) - 2
    torch.testing.assert_close(w, torch.sigmoid(torch.tensor([[0.0, 2.0]])))
    w, e = route(logits, 2, "softmax_topk", bias=bias)
    assert e.tolist() == [[3, 2]]
    torch.testing.assert_close(w, torch.softmax(logits, -1)[:, [3, 2]])


@pytest.mark.parametrize("mode", ["softmax_topk", "topk_softmax", "sigmoid"])
def test_tied_scores_give_k_distinct_experts_with_equal_weights(mode):
    logits = torch.zeros(3, 6)
    w, e = route(logits, 4, mode, normalize=True)
    assert all(len(set(row)) == 4 for row in e.tolist())
    torch.testing.assert_close(w, torch.full((3, 4), 0.25))


@pytest.mark.parametrize("mode", ["softmax_topk", "topk_softmax", "sigmoid"])
def test_route_returns_the_logits_dtype_and_computes_in_float32(mode):
    logits = (torch.randn(5, 8) * 3).to(torch.bfloat16)
    w, e = route(logits, 3, mode)
    assert w.dtype == torch.bfloat16 and e.dtype == torch.long
    w32, e32 = route(logits.float(), 3, mode)
    assert torch.equal(e, e32)
    torch.testing.assert_close(w, w32.to(torch.bfloat16), atol=0, rtol=0)


def test_group_limit_scores_a_group_by_its_two_best():
    """Groups of 3: by the best one, group 0 would win; by the sum of all three, group 1; by the
    sum of the two best, group 0 in the first row and group 1 in the second."""
    choice = torch.tensor([[0.6, 0.5, 0.0, 0.5, 0.4, 0.4],     # two best: 1.1 vs 0.9; all: 1.1 vs 1.3
                           [0.9, 0.0, 0.0, 0.5, 0.5, 0.0]])    # two best: 0.9 vs 1.0; best: 0.9 vs 0.5
    out = group_limit(choice, 2, 1)
    inf = math.inf
    assert torch.equal(out, torch.tensor([[0.6, 0.5, 0.0, -inf, -inf, -inf],
                                          [-inf, -inf, -inf, 0.5, 0.5, 0.0]]))


def test_group_limit_keeps_topk_group_groups_and_sets_the_rest_to_minus_inf():
    choice = torch.tensor([[0.1, 0.2, 0.9, 0.8, 0.5, 0.5, 0.3, 0.0]])  # group sums 0.3, 1.7, 1.0, 0.3
    out = group_limit(choice, 4, 2)
    expected = torch.tensor([[-math.inf, -math.inf, 0.9, 0.8, 0.5, 0.5, -math.inf, -math.inf]])
    assert torch.equal(out, expected)
    assert torch.equal(group_limit(choice, 4, 4), choice)              # every group kept


def test_route_limits_the_groups_only_when_asked():
    torch.manual_seed(0)
    logits = torch.randn(32, 8)
    free = route(logits, 2, "sigmoid")
    assert all(torch.equal(a, b) for a, b in zip(free, route(logits, 2, "sigmoid", n_group=1, topk_group=1), strict=True))
    w, e = route(logits, 2, "sigmoid", n_group=2, topk_group=1)
    limited = group_limit(logits.sigmoid(), 2, 1)
    assert torch.equal(e, limited.topk(2, dim=-1).indices)
    torch.testing.assert_close(w, logits.sigmoid().gather(1, e), atol=0, rtol=0)
    assert (e // 4 == e[:, :1] // 4).all()                              # one group per token


def test_switch_aux_loss_by_hand():
    logits = torch.tensor([[1.0, 0.0, -1.0], [0.0, 2.0, 0.0], [0.5, 0.5, 3.0], [1.0, 1.0, 1.0]],
                          dtype=torch.float64)
    chosen = torch.tensor([[0, 1], [1, 2], [2, 1], [0, 1]])
    counts = [2, 4, 2]
    probs = [[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in logits.tolist()]
    expected = 3 * sum(counts[i] / 4 * sum(p[i] for p in probs) / 4 for i in range(3))
    loss = switch_aux_loss(logits, chosen, 3)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    bf16 = switch_aux_loss(logits.to(torch.bfloat16), chosen, 3)
    assert bf16.dtype == torch.float32                                  # computed in float32


def test_switch_aux_loss_gradient_flows_through_the_probabilities_only():
    logits = torch.randn(6, 4, requires_grad=True)
    chosen = torch.tensor([[0], [0], [1], [0], [3], [0]])
    switch_aux_loss(logits, chosen, 4).backward()
    f = torch.tensor([4, 1, 0, 1]) / 6
    p = torch.softmax(logits.detach(), -1)
    # d/dz_tj of 4 sum_i f_i mean_t p_ti = 4 / 6 p_tj (f_j - sum_i f_i p_ti)
    expected = 4 / 6 * p * (f - (p * f).sum(-1, keepdim=True))
    torch.testing.assert_close(logits.grad, expected)


def test_add_aux_loss_gives_the_loss_a_gradient_of_its_own_shape_and_dtype():
    x = torch.randn(3, requires_grad=True)
    loss = torch.tensor([1.5, -2.0], dtype=torch.float64, requires_grad=True)
    y = AddAuxLoss.apply(x, loss)
    (3 * y).sum().backward()
    assert loss.grad.dtype == torch.float64 and torch.equal(loss.grad, torch.ones(2, dtype=torch.float64))
    assert torch.equal(x.grad, torch.full((3,), 3.0))


def _layer(**kwargs):
    torch.manual_seed(0)
    layer = MoELayer(6, 8, 2, 5, **kwargs).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.5)
    return layer


def _manual(layer, x, bias=None):
    """The layer's output by hand: the router, route(), routed_scale, the per-token loop, the
    shared expert."""
    flat = x.reshape(-1, 6)
    logits = flat @ layer.router.weight.T
    w, e = route(logits, layer.top_k, layer.mode, bias, layer.normalize, layer.n_group, layer.topk_group)
    out = per_token(layer.experts, flat, w * layer.routed_scale, e)
    if layer.shared is not None:
        out = out + layer.shared(flat)
    return out.reshape(x.shape), logits, e


def test_a_deepseek_layer_equals_its_parts_by_hand():
    layer = _layer(mode="sigmoid", normalize=True, shared_hidden=3, routed_scale=2.5, n_group=4,
                   topk_group=2, balance="bias", bias_rate=0.0)
    with torch.no_grad():
        layer.bias.copy_(torch.linspace(-1, 1, 8))
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    expected, logits, chosen = _manual(layer, x, layer.bias)
    torch.testing.assert_close(layer(x), expected, atol=1e-12, rtol=0)
    assert torch.equal(layer.last_logits, logits) and not layer.last_logits.requires_grad
    assert torch.equal(layer.last_load, expert_load(chosen, 8)) and layer.last_dropped == 0
    assert layer.shared.gate.out_features == 3 and layer.routed_scale == 2.5


def test_the_layers_defaults():
    layer = MoELayer(6, 8, 2, 5)
    assert (layer.mode, layer.normalize, layer.capacity_factor, layer.balance) == ("softmax_topk", False, None, "none")
    assert (layer.aux_coef, layer.bias_rate, layer.routed_scale) == (0.01, 1e-3, 1.0)
    assert (layer.n_group, layer.topk_group, layer.shared) == (1, 1, None)
    assert (layer.d_model, layer.n_experts, layer.top_k) == (6, 8, 2)
    assert layer.experts.hidden == 5 and layer.router.bias is None
    assert torch.equal(layer.bias, torch.zeros(8)) and "bias" in dict(layer.named_buffers())
    assert (layer.last_logits, layer.last_load, layer.last_dropped) == (None, None, 0)
    layer = _layer()
    x = torch.randn(3, 6, dtype=torch.float64)
    torch.testing.assert_close(layer(x), _manual(layer, x)[0], atol=1e-12, rtol=0)


def test_a_capacity_factor_drops_and_counts():
    layer = _layer(capacity_factor=0.5, mode="topk_softmax")
    x = torch.randn(12, 6, dtype=torch.float64)
    capacity = expert_capacity(12, 2, 8, 0.5)                           # 2 slots per expert
    out = layer(x)
    load = layer.last_load
    assert layer.last_dropped == int((load - capacity).clamp(min=0).sum()) > 0
    flat_logits = x @ layer.router.weight.T
    w, e = route(flat_logits, 2, "topk_softmax")
    expected, dropped = layer.experts.sorted(x, w, e, capacity)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


def test_bias_balancing_steps_by_the_sign_of_the_load_gap_in_training_only():
    layer = _layer(mode="sigmoid", balance="bias", bias_rate=0.25)
    x = torch.randn(10, 6, dtype=torch.float64)
    layer.eval()
    layer(x)
    assert torch.equal(layer.bias, torch.zeros(8, dtype=torch.float64))  # no update in eval
    layer.train()
    layer(x)
    load = layer.last_load.double()
    assert torch.equal(layer.bias, 0.25 * torch.sign(load.mean() - load))
    before = layer.bias.clone()
    expected = _manual(layer, x, before)[0]                              # the bias now moves the choice
    torch.testing.assert_close(layer(x), expected, atol=1e-12, rtol=0)


def test_bias_is_ignored_unless_balance_is_bias():
    layer = _layer(mode="sigmoid", balance="aux_loss")
    with torch.no_grad():
        layer.bias.fill_(100.0)
        layer.bias[0] = -100.0
    x = torch.randn(10, 6, dtype=torch.float64)
    torch.testing.assert_close(layer(x), _manual(layer, x)[0], atol=1e-12, rtol=0)
    assert layer.bias[1] == 100.0                                        # and never updated


def test_aux_loss_adds_aux_coef_times_the_switch_gradient_in_training_only():
    x = torch.randn(9, 6, dtype=torch.float64)
    grads = {}
    for balance, training in (("none", True), ("aux_loss", True), ("aux_loss", False)):
        layer = _layer(balance=balance, aux_coef=0.3)
        layer.train(training)
        layer(x).sum().backward()
        grads[balance, training] = layer.router.weight.grad
    layer = _layer()
    logits = x @ layer.router.weight.T
    _, chosen = route(logits.detach(), 2)
    w = layer.router.weight.detach().clone().requires_grad_()
    (0.3 * switch_aux_loss(x @ w.T, chosen, 8)).backward()
    torch.testing.assert_close(grads["aux_loss", True], grads["none", True] + w.grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(grads["aux_loss", False], grads["none", True], atol=0, rtol=0)


def test_the_default_aux_coef_is_a_hundredth():
    x = torch.randn(9, 6, dtype=torch.float64)
    plain, aux = _layer(), _layer(balance="aux_loss")
    plain(x).sum().backward()
    aux(x).sum().backward()
    w = plain.router.weight.detach().clone().requires_grad_()
    _, chosen = route((x @ w.T).detach(), 2)
    (0.01 * switch_aux_loss(x @ w.T, chosen, 8)).backward()
    torch.testing.assert_close(aux.router.weight.grad, plain.router.weight.grad + w.grad, atol=1e-12, rtol=0)


def test_the_default_bias_rate_is_a_thousandth():
    layer = _layer(mode="sigmoid", balance="bias")
    x = torch.randn(10, 6, dtype=torch.float64)
    layer(x)
    load = layer.last_load                                               # float32: the step is too
    assert torch.equal(layer.bias, (1e-3 * torch.sign(load.mean() - load)).double())


@pytest.mark.parametrize("call, error, message", [
    (lambda: route(torch.randn(4, 3), 4), ValueError,
     "top_k is 4, expected at most n_experts = 3: a token cannot be sent to more experts than there are"),
    (lambda: route(torch.randn(4, 3), 0), ValueError, "top_k is 0, expected a positive int"),
    (lambda: route(torch.randn(4, 0), 1), ValueError, "n_experts is 0, expected a positive int"),
    (lambda: route(torch.randn(4), 1), ValueError,
     "logits has shape (4,), expected (T, E): one score per token and expert"),
    (lambda: route([[1.0, 2.0]], 1), ValueError,
     "logits has shape list, expected (T, E): one score per token and expert"),
    (lambda: route(torch.randn(4, 8), 2, n_group=2), ValueError,
     "n_group is 2 with mode 'softmax_topk', expected mode 'sigmoid': only DeepSeek's router limits the groups"),
    (lambda: route(torch.randn(4, 8), 2, "topk_softmax", topk_group=2, n_group=4), ValueError,
     "n_group is 4 with mode 'topk_softmax', expected mode 'sigmoid': only DeepSeek's router limits the groups"),
    (lambda: route(torch.randn(4, 8), 2, "sigmoid", n_group=3), ValueError,
     "n_group is 3, expected a divisor of n_experts = 8 that leaves at least 2 experts per group"),
    (lambda: route(torch.randn(4, 8), 2, "sigmoid", n_group=8), ValueError,
     "n_group is 8, expected a divisor of n_experts = 8 that leaves at least 2 experts per group"),
    (lambda: route(torch.randn(4, 8), 2, "sigmoid", n_group=2, topk_group=3), ValueError,
     "topk_group is 3, expected at most n_group = 2 and enough groups to hold top_k = 2 experts"),
    (lambda: route(torch.randn(4, 8), 5, "sigmoid", n_group=4, topk_group=2), ValueError,
     "topk_group is 2, expected at most n_group = 4 and enough groups to hold top_k = 5 experts"),
    (lambda: route(torch.randn(4, 8), 2, "sigmoid", n_group=0), ValueError, "n_group is 0, expected a positive int"),
    (lambda: route(torch.randn(4, 8), 2, "sigmoid", n_group=2, topk_group=0), ValueError,
     "topk_group is 0, expected a positive int"),
    (lambda: group_limit([[0.0] * 4], 2, 1), ValueError, "choice has shape list, expected (T, E)"),
    (lambda: group_limit(torch.randn(3, 8), 2, 3), ValueError,
     "topk_group is 3, expected at most n_group = 2 and enough groups to hold top_k = 1 experts"),
    (lambda: expert_capacity(0, 1, 4, 1.0), ValueError, "n_tokens is 0, expected a positive int"),
    (lambda: expert_capacity(4, 5, 4, 1.0), ValueError,
     "top_k is 5, expected at most n_experts = 4: a token cannot be sent to more experts than there are"),
    (lambda: switch_aux_loss(torch.randn(4, 3), torch.zeros(4, 1, dtype=torch.long), 4), ValueError,
     "logits has shape (4, 3), expected (T, 4)"),
    (lambda: switch_aux_loss(torch.randn(3), torch.zeros(3, 1, dtype=torch.long), 3), ValueError,
     "logits has shape (3,), expected (T, 3)"),
    (lambda: switch_aux_loss("logits", torch.zeros(3, 1, dtype=torch.long), 3), ValueError,
     "logits has shape str, expected (T, 3)"),
    (lambda: switch_aux_loss(torch.randn(4, 3), torch.zeros(5, 1, dtype=torch.long), 3), ValueError,
     "experts has shape (5, 1), expected (4, k)"),
    (lambda: switch_aux_loss(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), 3), ValueError,
     "experts has shape (4,), expected (4, k)"),
    (lambda: Experts(3, 4, 8).sorted(torch.randn(2, 4), torch.ones(2, 1), torch.zeros(2, 1).long(), 0),
     ValueError, "capacity is 0, expected a positive int"),
    (lambda: Experts(3, 4, 8).loop(torch.randn(2, 4), torch.ones(2, 2), torch.zeros(2, 1).long()), ValueError,
     "x (2, 4), weights (2, 2) and experts (2, 1): expected (T, D), (T, k) and (T, k)"),
    (lambda: Experts(3, 4, 8).loop(torch.randn(2, 4), torch.ones(3, 1), torch.zeros(3, 1).long()), ValueError,
     "x (2, 4), weights (3, 1) and experts (3, 1): expected (T, D), (T, k) and (T, k)"),
    (lambda: Experts(3, 4, 8).loop(torch.randn(1, 2, 4), torch.ones(1, 1), torch.zeros(1, 1).long()), ValueError,
     "x (1, 2, 4), weights (1, 1) and experts (1, 1): expected (T, D), (T, k) and (T, k)"),
    (lambda: Experts(3, 4, 8).loop(torch.randn(2, 4), torch.ones(2, 1), torch.tensor([[0], [3]])), ValueError,
     "experts holds 0 .. 3, expected indices in 0 .. 2"),
    (lambda: Experts(3, 4, 8).sorted(torch.randn(2, 4), torch.ones(2, 1), torch.tensor([[-1], [2]])), ValueError,
     "experts holds -1 .. 2, expected indices in 0 .. 2"),
    (lambda: Experts(3, 4, 8).loop(torch.randn(2, 5), torch.ones(2, 1), torch.zeros(2, 1).long()), ValueError,
     "x has shape (2, 5), expected (..., 4): the last dimension holds each token's d_model = 4 features"),
    (lambda: Experts(0, 4, 8), ValueError, "n_experts is 0, expected a positive int"),
    (lambda: Experts(3, 0, 8), ValueError, "d_model is 0, expected a positive int"),
    (lambda: Experts(3, 4, 0), ValueError, "hidden is 0, expected a positive int"),
    (lambda: MoELayer(8, 8, 2, 8, n_group=2), ValueError,
     "n_group is 2 with mode 'softmax_topk', expected mode 'sigmoid'"),
    (lambda: MoELayer(8, 8, 2, 8, mode="topk_softmax", topk_group=2, n_group=4), ValueError,
     "n_group is 4 with mode 'topk_softmax', expected mode 'sigmoid'"),
    (lambda: MoELayer(8, 8, 2, 8, mode="sigmoid", n_group=3), ValueError,
     "n_group is 3, expected a divisor of n_experts = 8 that leaves at least 2 experts per group"),
    (lambda: MoELayer(8, 4, 5, 8), ValueError,
     "top_k is 5, expected at most n_experts = 4: a token cannot be sent to more experts than there are"),
    (lambda: MoELayer(8, 4, 2, 8, mode="softmax"), ValueError, "mode is 'softmax' ..."),
    (lambda: MoELayer(8, 4, 2, 8, normalize="yes"), TypeError, "normalize is ..."),
    (lambda: MoELayer(8, 4, 2, 8, shared_hidden=-1), ValueError, "shared_hidden is -1 ..."),
    (lambda: MoELayer(8, 4, 2, 8, capacity_factor=-1.0), ValueError, "capacity_factor is -1.0 ..."),
    (lambda: MoELayer(8, 4, 2, 8, balance="loss"), ValueError, "balance is 'loss' ..."),
    (lambda: MoELayer(8, 4, 2, 8, aux_coef=-0.1), ValueError, "aux_coef is -0.1 ..."),
    (lambda: MoELayer(8, 4, 2, 8, bias_rate=-0.1), ValueError, "bias_rate is -0.1 ..."),
    (lambda: MoELayer(8, 4, 2, 8, routed_scale=0.0), ValueError, "routed_scale is 0.0 ..."),
    (lambda: MoELayer(8, 4, 2, 8)(torch.randn(2, 7)), ValueError, "x has shape (2, 7), expected (..., 8) ..."),
])
def test_errors_are_read_in_full(call, error, message):
    """Matched whole; a message ending in " ..." (one of helpers.checks', tested there) by its start."""
    pattern = "^" + re.escape(message[:-4]) if message.endswith(" ...") else full(message)
    with pytest.raises(error, match=pattern):
        call()


def test_zero_aux_coef_and_bias_rate_and_a_hint_for_capacity():
    MoELayer(8, 4, 2, 8, aux_coef=0.0, bias_rate=0.0)                   # 0 is allowed for both
    with pytest.raises(ValueError, match=full(
            "capacity_factor is 0.0, expected a finite number > 0 or None for dropless routing")):
        MoELayer(8, 4, 2, 8, capacity_factor=0.0)
    with pytest.raises(ValueError, match=full(
            "capacity_factor is 0.0, expected a finite number > 0 (1.0 = each expert holds exactly its fair share)")):
        expert_capacity(4, 1, 4, 0.0)


def test_group_checks_run_when_either_group_argument_is_set():
    message = "topk_group is 2, expected at most n_group = 1 and enough groups to hold top_k = 2 experts"
    with pytest.raises(ValueError, match=full(message)):
        route(torch.randn(3, 8), 2, "sigmoid", n_group=1, topk_group=2)
    with pytest.raises(ValueError, match=full(message)):
        MoELayer(8, 8, 2, 8, mode="sigmoid", n_group=1, topk_group=2)


def test_one_expert_is_routed_without_groups():
    """n_group = 1 never builds groups (a group of one expert has no two best)."""
    logits = torch.randn(3, 1)
    w, e = route(logits, 1, "sigmoid")
    assert e.tolist() == [[0]] * 3
    torch.testing.assert_close(w, logits.sigmoid(), atol=0, rtol=0)


def test_infinite_rates_are_refused():
    with pytest.raises(ValueError, match=full("aux_coef is inf, expected a number in [0, inf)")):
        MoELayer(8, 4, 2, 8, aux_coef=math.inf)
    with pytest.raises(ValueError, match=full("bias_rate is inf, expected a number in [0, inf)")):
        MoELayer(8, 4, 2, 8, bias_rate=math.inf)


def test_near_ties_are_decided_by_the_probabilities_themselves():
    """Two probabilities of about 1e-8 apart by 2x: added to 1 in float32 they would tie."""
    logits = torch.tensor([[0.0, -18.0, -18.7, -30.0]])
    assert route(logits, 2)[1].tolist() == [[0, 1]]
    assert route(logits[:, [0, 2, 1, 3]], 2)[1].tolist() == [[0, 2]]


def test_group_limit_builds_its_mask_on_the_choices_device():
    out = group_limit(torch.zeros(3, 8, device="meta"), 4, 2)          # shapes only: no values
    assert out.device.type == "meta" and out.shape == (3, 8)


def test_add_aux_loss_gives_the_gradient_on_the_losss_device():
    x = torch.zeros(3, device="meta", requires_grad=True)
    loss = torch.zeros(2, device="meta", requires_grad=True)
    AddAuxLoss.apply(x, loss).sum().backward()
    assert loss.grad.device.type == "meta" and loss.grad.shape == (2,)


def test_the_layer_passes_both_group_arguments():
    """n_group = 4, topk_group = 3 of 8 experts: passed as (topk_group, 1) the route would refuse
    3 groups of 8 experts, and as anything else would choose among other groups."""
    layer = _layer(mode="sigmoid", n_group=4, topk_group=3)
    x = torch.randn(16, 6, dtype=torch.float64)
    torch.testing.assert_close(layer(x), _manual(layer, x)[0], atol=1e-12, rtol=0)
    layer = _layer(mode="sigmoid", n_group=2, topk_group=1, normalize=True)
    torch.manual_seed(3)
    x = torch.randn(32, 6, dtype=torch.float64)
    out, logits, chosen = _manual(layer, x)
    torch.testing.assert_close(layer(x), out, atol=1e-12, rtol=0)
    assert (chosen // 4 == chosen[:, :1] // 4).all()                      # one group of 4 per token


def test_a_balanced_load_leaves_the_bias_unchanged():
    """Each of 4 tokens picks its own expert: every load equals the mean, sign(0) = 0."""
    layer = MoELayer(4, 4, 1, 3, mode="sigmoid", balance="bias", bias_rate=0.5)
    with torch.no_grad():
        layer.router.weight.copy_(10 * torch.eye(4))
    layer(torch.eye(4))
    assert layer.last_load.tolist() == [1, 1, 1, 1]
    assert torch.equal(layer.bias, torch.zeros(4))


@pytest.mark.parametrize("call, error, message", [
    # group_limit printed torch.Size([8])
    (lambda: group_limit(torch.randn(8), 2, 1), ValueError, "choice has shape (8,), expected (T, E)"),
    # expert_load counted an expert that does not exist (a longer vector) or failed inside bincount
    (lambda: expert_load(torch.tensor([[5]]), 3), ValueError, "experts holds 5 .. 5, expected indices in 0 .. 2"),
    (lambda: expert_load(torch.tensor([[-1, 0]]), 3), ValueError, "experts holds -1 .. 0, expected indices in 0 .. 2"),
    (lambda: expert_load(torch.tensor([[1.0]]), 3), TypeError,
     "experts is torch.float32, expected an integer tensor (torch.long) of expert indices"),
    (lambda: expert_load([[1]], 3), TypeError, "experts is list, expected an integer tensor (torch.long) of expert indices"),
    (lambda: expert_load(torch.tensor([[0]]), 0), ValueError, "n_experts is 0, expected a positive int"),
    # switch_aux_loss: AttributeError on a list, a size mismatch deep inside for an index past E
    (lambda: switch_aux_loss(torch.randn(4, 3), [[0]] * 4, 3), TypeError,
     "experts is list, expected an integer tensor (torch.long) of expert indices"),
    (lambda: switch_aux_loss(torch.randn(4, 3), torch.full((4, 1), 5), 3), ValueError,
     "experts holds 5 .. 5, expected indices in 0 .. 2"),
    # Experts: float indices ran in loop and failed in bincount in sorted; weights in another dtype
    # failed in index_add
    (lambda: Experts(3, 4, 8).loop(torch.randn(2, 4), torch.ones(2, 1), torch.zeros(2, 1)), TypeError,
     "experts is torch.float32, expected an integer tensor (torch.long) of expert indices"),
    (lambda: Experts(3, 4, 8).sorted(torch.randn(2, 4), torch.ones(2, 1, dtype=torch.float64),
                                     torch.zeros(2, 1).long()), TypeError,
     "weights is torch.float64, expected a tensor of x's dtype torch.float32"),
    (lambda: Experts(3, 4, 8).loop(torch.randn(2, 4), [[1.0], [1.0]], torch.zeros(2, 1).long()), TypeError,
     "weights is list, expected a tensor of x's dtype torch.float32"),
    # route: AttributeError for a list bias; a non-bool normalize went unchecked
    (lambda: route(torch.randn(4, 3), 1, bias=[0.0, 0.0, 0.0]), ValueError,
     "bias is list, expected a tensor (3,): one per expert"),
    (lambda: route(torch.randn(4, 3), 1, bias=torch.zeros(4)), ValueError,
     "bias is (4,), expected a tensor (3,): one per expert"),
    (lambda: route(torch.randn(4, 3), 1, normalize=1), TypeError, "normalize is 1 ..."),
])
def test_bad_arguments_are_named_before_any_work(call, error, message):
    pattern = "^" + re.escape(message[:-4]) if message.endswith(" ...") else full(message)
    with pytest.raises(error, match=pattern):
        call()


def test_int32_indices_are_accepted():
    experts = _experts()
    x, weights = torch.randn(3, 6, dtype=torch.float64), torch.rand(3, 1, dtype=torch.float64)
    chosen = torch.tensor([[0], [4], [0]], dtype=torch.int32)
    assert expert_load(chosen, 5).tolist() == [2, 0, 0, 0, 1]
    torch.testing.assert_close(experts.loop(x, weights, chosen), per_token(experts, x, weights, chosen),
                               atol=1e-12, rtol=0)
    out, dropped = experts.sorted(x, weights, chosen, 1)
    assert dropped == 1
    torch.testing.assert_close(out, per_token(experts, x, weights, chosen, torch.tensor([[True], [True], [False]])),
                               atol=1e-12, rtol=0)


@pytest.mark.parametrize("experts, n_experts, error, message", [
    (torch.tensor([[0, 4]]), 4, ValueError, "experts holds 0 .. 4, expected indices in 0 .. 3"),
    (torch.tensor([[-1, 2]]), 4, ValueError, "experts holds -1 .. 2, expected indices in 0 .. 3"),
    (torch.tensor([[0.0, 1.0]]), 4, TypeError, "experts is torch.float32, expected an integer tensor"),
    ([[0, 1]], 4, TypeError, "experts is list, expected an integer tensor"),
])
def test_check_expert_indices_names_what_it_got(experts, n_experts, error, message):
    with pytest.raises(error, match=re.escape(message)):
        check_expert_indices(experts, n_experts)
    check_expert_indices(torch.tensor([[0, 3]]), 4)  # the edges themselves are accepted
    check_expert_indices(torch.zeros(0, 2, dtype=torch.long), 4)  # no tokens: nothing to check


@pytest.mark.parametrize("balance", ["none", "aux_loss", "bias"])
def test_a_forward_pass_trusts_its_router_and_runs_no_index_check(balance, monkeypatch):
    # The constructor checked the settings; the experts come from the router: no host sync.
    import helpers.model.moe as moe_module
    layer = MoELayer(8, 4, 2, 8, balance=balance).train()
    x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    expected = layer(x)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a public check ran inside the forward pass")

    for name in ("check_expert_indices", "check_top_k", "check_group_mode"):
        monkeypatch.setattr(moe_module, name, refuse)
    out = layer(x)
    if balance != "bias":  # the bias moves after every training pass, and the choices with it
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    assert layer.last_load.sum() == 2 * 3 * 2
