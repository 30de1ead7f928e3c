"""Mixture of experts (notebook 12, section 1): the loop and the sorted form agree, the router's
three conventions, capacity, the balancing losses, and a transformers Qwen3-MoE's logits."""

import importlib.util

import pytest
import torch

from helpers.model.frontier import FrontierConfig, FrontierGPT, total_and_active_parameters
from helpers.model.moe import (
    AddAuxLoss,
    Experts,
    MoELayer,
    expert_capacity,
    expert_load,
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
