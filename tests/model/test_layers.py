"""LayerNorm by hand, the FFNs, the Pre-LN block, GPT-2's initialisation and the rank-one
distance of helpers.model.layers, against PyTorch's own layers and the formulas the notebook quotes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from helpers.lab.exercises import ExerciseFailed, get
from helpers.model.layers import (
    Block,
    FeedForward,
    LayerNorm,
    SwiGLUFeedForward,
    distance_from_rank_one,
    init_gpt2_,
    layer_norm,
    swiglu_hidden_size,
)


def n_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=0, max_size=2), d=st.integers(1, 16),
       eps=st.sampled_from([1e-5, 1e-3, 0.1]), scale=st.floats(0.01, 100), seed=st.integers(0, 10_000))
def test_layer_norm_matches_torch(shape, d, eps, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, d, generator=g, dtype=torch.float64) * scale + 3
    weight, bias = torch.randn(d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
    torch.testing.assert_close(layer_norm(x, weight, bias, eps), F.layer_norm(x, (d,), weight, bias, eps))


def test_layer_norm_module_matches_nn_layer_norm_and_learns_the_same_parameters():
    torch.manual_seed(0)
    reference = nn.LayerNorm(10)
    with torch.no_grad():
        reference.weight.normal_()
        reference.bias.normal_()
    ours = LayerNorm(10)
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(3, 4, 10) * 5
    torch.testing.assert_close(ours(x), reference(x))
    ours(x).sum().backward()
    reference(x).sum().backward()
    torch.testing.assert_close(ours.weight.grad, reference.weight.grad, atol=1e-5, rtol=1e-5)


def test_layer_norm_uses_the_biased_variance_and_survives_constant_tokens():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    out = layer_norm(x, eps=1e-12)
    assert torch.allclose(out.pow(2).mean(), torch.tensor(1.0))  # divided by D, not D - 1
    constant = layer_norm(torch.full((2, 5), 7.0))
    assert torch.equal(constant, torch.zeros(2, 5))


def test_layer_norm_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"weight has shape \(3,\), expected \(4,\)"):
        layer_norm(torch.randn(2, 4), weight=torch.ones(3))
    with pytest.raises(ValueError, match=r"x has shape \(2, 5\), expected \(\.\.\., 4\)"):
        LayerNorm(4)(torch.randn(2, 5))


ACTIVATION_FUNCTIONS = {"relu": F.relu, "gelu": F.gelu,
                        "gelu_tanh": lambda z: F.gelu(z, approximate="tanh")}


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_feed_forward_is_linear_activation_linear_with_8d2_plus_5d_parameters(activation):
    torch.manual_seed(1)
    d = 12
    ffn = FeedForward(d, activation=activation)
    assert n_parameters(ffn) == 8 * d * d + 5 * d
    x = torch.randn(2, 3, d)
    act = ACTIVATION_FUNCTIONS[activation]
    expected = F.linear(act(F.linear(x, ffn.up.weight, ffn.up.bias)), ffn.down.weight, ffn.down.bias)
    torch.testing.assert_close(ffn(x), expected)


def test_gelu_tanh_is_the_formula_gpt2_used_and_differs_from_the_exact_gelu():
    z = torch.linspace(-4, 4, 101, dtype=torch.float64)
    tanh_formula = 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    exact = z * 0.5 * (1 + torch.erf(z / math.sqrt(2)))  # z * Phi(z)
    torch.testing.assert_close(FeedForward(1, activation="gelu_tanh").activation(z), tanh_formula)
    torch.testing.assert_close(FeedForward(1, activation="gelu").activation(z), exact)
    assert 1e-4 < (tanh_formula - exact).abs().max() < 1e-2  # close, but not the same function


def test_feed_forward_names_an_unknown_activation():
    with pytest.raises(ValueError, match="activation is 'tanh'"):
        FeedForward(4, activation="tanh")


def test_swiglu_formula_and_size():
    torch.manual_seed(2)
    d = 24
    ffn = SwiGLUFeedForward(d)
    assert swiglu_hidden_size(d) == 64 and n_parameters(ffn) == 3 * d * 64 == 8 * d * d
    x = torch.randn(5, d)
    gate, up = x @ ffn.gate.weight.T, x @ ffn.up.weight.T
    torch.testing.assert_close(ffn(x), (gate * torch.sigmoid(gate) * up) @ ffn.down.weight.T)


def test_pre_ln_block_is_the_gpt2_composition_with_12d2_plus_13d_parameters():
    torch.manual_seed(3)
    d = 16
    block = Block(d, 4)
    assert n_parameters(block) == 12 * d * d + 13 * d
    x = torch.randn(2, 5, d)
    h = x + block.attn(block.ln1(x), causal=True)
    torch.testing.assert_close(block(x), h + block.mlp(block.ln2(h)))


def test_post_ln_block_normalises_the_stream():
    torch.manual_seed(4)
    block = Block(16, 4, pre_norm=False)
    out = block(torch.randn(2, 5, 16) * 10)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.std(-1, correction=0), torch.ones(2, 5), atol=1e-3, rtol=0)


@pytest.mark.parametrize("pre_norm", [True, False])
def test_block_is_causal_unless_told_otherwise(pre_norm):
    torch.manual_seed(5)
    block = Block(16, 4, pre_norm=pre_norm)
    x = torch.randn(1, 6, 16)
    changed = x.clone()
    changed[:, 4:] += torch.randn(1, 2, 16)  # not a constant shift, which LayerNorm would erase
    assert torch.equal(block(changed)[:, :4], block(x)[:, :4])
    assert not torch.allclose(block(changed, causal=False)[:, :4], block(x, causal=False)[:, :4])


def test_gpt2_init_scales_only_the_residual_projections():
    torch.manual_seed(6)
    n_layers, d = 8, 64
    blocks = init_gpt2_(nn.ModuleList(Block(d, 4) for _ in range(n_layers)), n_layers)
    scaled = 0.02 / math.sqrt(2 * n_layers)
    for name, param in blocks.named_parameters():
        if name.endswith("bias") and ".ln" not in name:
            assert torch.equal(param, torch.zeros_like(param)), name
        elif name.endswith(("out_proj.weight", "down.weight")):
            assert abs(param.std().item() - scaled) < 0.1 * scaled, name
        elif name.endswith(("q_proj.weight", "up.weight")):
            assert abs(param.std().item() - 0.02) < 0.1 * 0.02, name
        elif ".ln" in name and name.endswith("weight"):
            assert torch.equal(param, torch.ones_like(param)), name
    with pytest.raises(ValueError, match="n_layers is 0"):
        init_gpt2_(blocks, 0)


def test_distance_from_rank_one():
    torch.manual_seed(7)
    token = torch.randn(1, 6)
    assert distance_from_rank_one(token.expand(4, 6)).item() == pytest.approx(0.0, abs=1e-6)
    x = torch.randn(3, 5, 6)
    torch.testing.assert_close(distance_from_rank_one(7 * x), distance_from_rank_one(x))
    centred = x - x.mean(dim=-2, keepdim=True)
    torch.testing.assert_close(distance_from_rank_one(centred), torch.ones(3))
    assert distance_from_rank_one(x).shape == (3,)
    with pytest.raises(ValueError, match=r"x is \(6,\)"):
        distance_from_rank_one(torch.randn(6))


def test_exercise_checkers_accept_the_solutions_and_explain_the_usual_mistakes():
    assert get("layers.layer_norm").checker(lambda x, w, b, eps: layer_norm(x, w, b, eps))
    assert get("layers.swiglu").checker(lambda x, g, u, d: (F.silu(x @ g) * (x @ u)) @ d)
    assert get("layers.distance_from_rank_one").checker(distance_from_rank_one)

    def unbiased(x, w, b, eps):
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + eps) * w + b

    def no_eps(x, w, b, eps):
        mean = x.mean(-1, keepdim=True)
        return (x - mean) / (x - mean).pow(2).mean(-1, keepdim=True).sqrt() * w + b

    with pytest.raises(ExerciseFailed, match="D - 1"):
        get("layers.layer_norm").checker(unbiased)
    with pytest.raises(ExerciseFailed, match="eps is missing"):
        get("layers.layer_norm").checker(no_eps)
    with pytest.raises(ExerciseFailed, match="wrong projection"):
        get("layers.swiglu").checker(lambda x, g, u, d: (F.silu(x @ u) * (x @ g)) @ d)
    with pytest.raises(ExerciseFailed, match="one distance per set"):
        get("layers.distance_from_rank_one").checker(lambda x: (x - x.mean(-2, keepdim=True)).norm() / x.norm())
