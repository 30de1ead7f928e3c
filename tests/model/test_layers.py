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
from helpers.model.embeddings import TokenAndPositionEmbedding
from helpers.model.gpt import GPTConfig
from helpers.model.kv_cache import KVCache
from helpers.model.layers import (
    ACTIVATIONS,
    RESIDUAL_PROJECTIONS,
    Block,
    FeedForward,
    LayerNorm,
    SwiGLUFeedForward,
    distance_from_rank_one,
    init_gpt2_,
    layer_norm,
    swiglu_hidden_size,
)
from helpers.model.multihead import MultiHeadAttention


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


# helpers.model.layers against PyTorch's own pieces, with every configuration asserted.
#
# Grouped by the classes:
# hand-written pieces against the PyTorch reference (nn.LayerNorm, F.gelu, F.silu), configuration
# asserted at non-default values, exact properties, edge sizes.

def _x(*shape, dtype=torch.float64, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [1e-5, 0.5, 3.0])
@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
def test_layer_norm_matches_torch_for_every_eps_dtype_and_affine(dtype, eps, affine):
    d = 7  # odd: a D - 1 in the variance would show
    x = (_x(3, 5, d, seed=1) * 4 + 2).to(dtype)
    weight = (_x(d, seed=2) + 1).to(dtype) if affine in ("weight", "both") else None
    bias = _x(d, seed=3).to(dtype) if affine in ("bias", "both") else None
    ours = layer_norm(x, weight, bias, eps=eps)
    theirs = F.layer_norm(x, (d,), weight, bias, eps)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert ours.dtype == dtype and ours.shape == x.shape
    torch.testing.assert_close(ours.float(), theirs.float(), atol=tol, rtol=tol)


def test_layer_norm_default_eps_is_1e_5():
    x = torch.tensor([[0.0, 1e-3, -1e-3, 2e-3]], dtype=torch.float64)  # variance near eps
    torch.testing.assert_close(layer_norm(x), F.layer_norm(x, (4,), eps=1e-5), atol=1e-12, rtol=1e-12)
    assert LayerNorm(4).eps == 1e-5


@pytest.mark.parametrize("eps", [1e-5, 0.25])
def test_layer_norm_module_matches_nn_layernorm_with_trained_parameters(eps):
    d = 6
    ours, theirs = LayerNorm(d, eps=eps).double(), nn.LayerNorm(d, eps=eps).double()
    assert ours.eps == eps and ours.d_model == d
    assert torch.equal(ours.weight, torch.ones(d, dtype=torch.float64))
    assert torch.equal(ours.bias, torch.zeros(d, dtype=torch.float64))
    with torch.no_grad():
        for p in (ours.weight, theirs.weight):
            p.copy_(_x(d, seed=4) + 1)
        for p in (ours.bias, theirs.bias):
            p.copy_(_x(d, seed=5))
    x = _x(2, 3, d, seed=6) * 1e-3  # small: eps matters
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-10, rtol=1e-10)


def test_layer_norm_module_names_a_wrong_width():
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 6\)"):
        LayerNorm(6)(torch.zeros(2, 5))


@pytest.mark.parametrize("name, reference", [
    ("relu", F.relu),
    ("gelu", F.gelu),
    ("gelu_tanh", lambda z: F.gelu(z, approximate="tanh")),
])
def test_feed_forward_is_down_act_up_with_each_activation(name, reference):
    d, hidden = 4, 10
    ff = FeedForward(d, hidden, activation=name).double()
    x = _x(2, 3, d, seed=7) * 3
    expected = F.linear(reference(F.linear(x, ff.up.weight, ff.up.bias)), ff.down.weight, ff.down.bias)
    torch.testing.assert_close(ff(x), expected, atol=1e-12, rtol=1e-12)
    assert isinstance(ACTIVATIONS[name](), nn.Module)


def test_feed_forward_configuration():
    ff = FeedForward(5)
    assert ff.d_model == 5 and ff.up.weight.shape == (20, 5) and ff.down.weight.shape == (5, 20)
    assert isinstance(ff.activation, nn.GELU) and ff.activation.approximate == "none"
    assert ff.dropout.p == 0.0 and ff.up.bias is not None and ff.down.bias is not None
    ff = FeedForward(5, 7, activation="gelu_tanh", dropout=0.25, bias=False)
    assert ff.up.weight.shape == (7, 5) and ff.down.weight.shape == (5, 7)
    assert ff.activation.approximate == "tanh" and ff.dropout.p == 0.25
    assert ff.up.bias is None and ff.down.bias is None
    assert isinstance(FeedForward(5, activation="relu").activation, nn.ReLU)


def test_feed_forward_dropout_acts_in_training_only():
    ff = FeedForward(4, 8, dropout=0.5).double()
    x = _x(64, 4, seed=8)
    ff.eval()
    expected = ff.down(ff.activation(ff.up(x)))
    torch.testing.assert_close(ff(x), expected)
    ff.train()
    torch.manual_seed(0)
    out = ff(x)
    assert (out == 0).any() and not torch.allclose(out, expected)


def test_swiglu_hidden_size_is_8d_over_3_rounded_down():
    assert [swiglu_hidden_size(d) for d in (1, 3, 4, 5, 96)] == [2, 8, 10, 13, 256]


def test_swiglu_matches_the_formula_and_its_configuration():
    d = 5
    ff = SwiGLUFeedForward(d).double()
    assert ff.d_model == d and ff.gate.weight.shape == (13, d) and ff.up.weight.shape == (13, d)
    assert ff.down.weight.shape == (d, 13) and ff.dropout.p == 0.0
    assert ff.gate.bias is None and ff.up.bias is None and ff.down.bias is None
    x = _x(2, 3, d, seed=9) * 2
    expected = ff.down.weight @ (F.silu(x @ ff.gate.weight.T) * (x @ ff.up.weight.T)).unsqueeze(-1)
    torch.testing.assert_close(ff(x), expected.squeeze(-1), atol=1e-12, rtol=1e-12)
    ff = SwiGLUFeedForward(d, hidden=6, dropout=0.3, bias=True).double()
    assert ff.gate.weight.shape == (6, d) and ff.down.weight.shape == (d, 6) and ff.dropout.p == 0.3
    assert ff.gate.bias is not None and ff.up.bias is not None and ff.down.bias is not None
    expected = F.linear(F.silu(F.linear(x, ff.gate.weight, ff.gate.bias))
                        * F.linear(x, ff.up.weight, ff.up.bias), ff.down.weight, ff.down.bias)
    ff.eval()
    torch.testing.assert_close(ff(x), expected, atol=1e-12, rtol=1e-12)


def test_swiglu_dropout_acts_in_training():
    ff = SwiGLUFeedForward(4, 8, dropout=0.5).double().train()
    torch.manual_seed(0)
    assert (ff(_x(64, 4, seed=10)) == 0).any()


def _mlp(block, x):
    return block.mlp.down(block.mlp.activation(block.mlp.up(x)))


@pytest.mark.parametrize("pre_norm", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_block_is_the_composition_of_its_parts(pre_norm, causal):
    torch.manual_seed(0)
    block = Block(8, 2, pre_norm=pre_norm).double().eval()
    with torch.no_grad():  # LayerNorms away from (1, 0), so that swapping them shows
        for ln, seed in ((block.ln1, 11), (block.ln2, 12)):
            ln.weight.copy_(_x(8, seed=seed) + 1)
            ln.bias.copy_(_x(8, seed=seed + 10))
    x = _x(2, 5, 8, seed=13)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)  # keys 3 and 4 of the first sequence padded
    mask[0, ..., 3:] = False
    if pre_norm:
        h = x + block.attn(block.ln1(x), mask=mask, causal=causal)
        expected = h + _mlp(block, block.ln2(h))
    else:
        h = block.ln1(x + block.attn(x, mask=mask, causal=causal))
        expected = block.ln2(h + _mlp(block, h))
    torch.testing.assert_close(block(x, causal=causal, mask=mask), expected, atol=1e-12, rtol=1e-12)


def test_block_default_is_causal():
    torch.manual_seed(0)
    block = Block(8, 2).double().eval()
    x = _x(1, 4, 8, seed=14)
    y = x.clone()
    y[0, -1] += 1.0
    assert torch.equal(block(x)[0, :-1], block(y)[0, :-1])
    assert not torch.equal(block(x, causal=False)[0, :-1], block(y, causal=False)[0, :-1])


def test_block_configuration_is_passed_through():
    block = Block(12, 4)
    assert block.pre_norm is True and block.ln1.d_model == 12 and block.ln2.d_model == 12
    assert block.ln1 is not block.ln2
    assert block.attn.n_heads == 4 and block.attn.n_kv_heads == 4 and block.attn.dropout.p == 0.0
    assert block.attn.q_proj.bias is not None and block.mlp.up.bias is not None
    assert block.mlp.up.weight.shape == (48, 12) and block.mlp.dropout.p == 0.0
    assert isinstance(block.mlp.activation, nn.GELU) and block.mlp.activation.approximate == "none"
    block = Block(12, 4, dropout=0.25, n_kv_heads=2, bias=False, pre_norm=False, activation="gelu_tanh")
    assert block.pre_norm is False
    assert block.attn.n_kv_heads == 2 and block.attn.k_proj.weight.shape == (6, 12)
    assert block.attn.dropout.p == 0.25 and block.mlp.dropout.p == 0.25
    assert block.attn.q_proj.bias is None and block.mlp.up.bias is None and block.mlp.down.bias is None
    assert block.mlp.activation.approximate == "tanh"
    assert isinstance(Block(12, 4, activation="relu").mlp.activation, nn.ReLU)


@pytest.mark.parametrize("pre_norm", [True, False])
def test_block_passes_the_kv_store_through(pre_norm):
    calls = []
    block = Block(8, 2, pre_norm=pre_norm).eval()
    original = block.attn.forward

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    block.attn.forward = spy
    def sentinel(k, v):  # a store that keeps nothing
        return k, v

    block(torch.randn(1, 3, 8), kv_store=sentinel)
    assert calls and "kv_store" in calls[0] and calls[0]["kv_store"] is sentinel
    assert calls[0]["causal"] is True and calls[0]["mask"] is None


def test_block_names_a_wrong_input():
    with pytest.raises(ValueError, match="x has shape"):
        Block(8, 2)(torch.zeros(1, 3, 6))


def test_init_gpt2_sets_every_std_and_zeroes_every_bias():
    n_layers, std = 3, 0.05
    torch.manual_seed(0)
    model = nn.ModuleDict({
        "emb": nn.Embedding(400, 64),
        "block": Block(64, 4),
        "head": nn.Linear(64, 400),
    })
    assert init_gpt2_(model, n_layers, std=std) is model
    residual = std / math.sqrt(2 * n_layers)
    for name, p in model.named_parameters():
        if name.endswith(RESIDUAL_PROJECTIONS):
            assert abs(p.std().item() - residual) < 0.15 * residual, name
            assert abs(p.mean().item()) < 0.2 * residual, name
        elif name.endswith("bias") and "ln" not in name:
            assert torch.equal(p, torch.zeros_like(p)), name
        elif "ln" in name:  # LayerNorm parameters are left as they were
            expected = torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p)
            assert torch.equal(p, expected), name
        else:
            assert abs(p.std().item() - std) < 0.15 * std, name
            assert abs(p.mean().item()) < 0.2 * std, name
    assert RESIDUAL_PROJECTIONS == ("out_proj.weight", "down.weight")


def test_init_gpt2_default_std_is_0_02():
    torch.manual_seed(0)
    layer = nn.Linear(200, 200)
    init_gpt2_(layer, 1)
    assert abs(layer.weight.std().item() - 0.02) < 0.002


def test_init_gpt2_leaves_a_linear_without_bias_alone():
    layer = nn.Linear(4, 4, bias=False)
    init_gpt2_(layer, 2)
    assert layer.bias is None


def test_init_gpt2_rejects_a_bad_n_layers():
    with pytest.raises(ValueError, match=r"^n_layers is 0, expected a positive int$"):
        init_gpt2_(nn.Linear(2, 2), 0)


def test_distance_from_rank_one_exact_values():
    same = torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    assert distance_from_rank_one(same).item() == 0.0
    x = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)  # mean 0: distance 1
    assert distance_from_rank_one(x).item() == pytest.approx(1.0, abs=1e-12)
    x = torch.tensor([[3.0, 0.0], [1.0, 0.0]], dtype=torch.float64)  # residual (+-1, 0), norm sqrt 10
    assert distance_from_rank_one(x).item() == pytest.approx(math.sqrt(2 / 10), abs=1e-12)
    batch = torch.stack([x, 2 * x, torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)])
    torch.testing.assert_close(
        distance_from_rank_one(batch),
        torch.tensor([math.sqrt(0.2), math.sqrt(0.2), 1.0], dtype=torch.float64))
    # the mean is over tokens (dim -2), not features: tokens equal, features differ
    assert distance_from_rank_one(torch.tensor([[1.0, 5.0, -2.0]] * 4)).item() == 0.0


@pytest.mark.parametrize("bad", [torch.zeros(3), torch.zeros(2, 2, dtype=torch.long), [[1.0]]])
def test_distance_from_rank_one_rejects_bad_input(bad):
    with pytest.raises(ValueError, match=r"expected a floating-point tensor \(\.\.\., N, D\)"):
        distance_from_rank_one(bad)
    if isinstance(bad, list):
        with pytest.raises(ValueError, match=r"^x is list, expected"):
            distance_from_rank_one(bad)


@pytest.mark.parametrize("cls", [FeedForward, SwiGLUFeedForward])
def test_mlps_name_a_bad_dropout_and_bias(cls):
    for p in (1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=rf"^dropout is {p}, expected a number in \[0, 1\)$"):
            cls(4, 8, dropout=p)
    with pytest.raises(TypeError, match=r"^bias is .*, expected True or False"):
        cls(4, 8, bias="yes")
    assert cls(4, 8, dropout=0.999).dropout.p == 0.999

_EPS_MESSAGE = r"^eps is 0, expected a finite number > 0 such as 1e-5 \(it keeps a constant token finite\)$"


def test_layer_norm_and_its_module_name_a_bad_eps():
    with pytest.raises(ValueError, match=_EPS_MESSAGE):
        layer_norm(torch.zeros(2, 3), eps=0)
    with pytest.raises(ValueError, match=_EPS_MESSAGE):
        LayerNorm(3, eps=0)


@pytest.mark.parametrize("bad, got", [
    ([1.0, 2.0], "list"),
    (torch.tensor(1.0), r"\(torch.float32, \(\)\)"),  # 0-dim, floating point: no feature axis
    (torch.arange(3), r"\(torch.int64, \(3,\)\)"),
    (torch.zeros(0, dtype=torch.long), r"\(torch.int64, \(0,\)\)"),
])
def test_layer_norm_names_a_bad_x(bad, got):
    with pytest.raises(ValueError, match=rf"^x is {got}, expected a floating-point tensor of shape \(\.\.\., D\)$"):
        layer_norm(bad)


def test_layer_norm_names_a_weight_or_bias_of_the_wrong_width():
    x = torch.zeros(2, 3, 5)  # shape[1] != shape[-1]: the message must read the last one
    with pytest.raises(ValueError, match=r"^weight has shape \(4,\), expected \(5,\) to match the last "
                                         r"dimension of x, shape \(2, 3, 5\)$"):
        layer_norm(x, weight=torch.ones(4))
    with pytest.raises(ValueError, match=r"^bias has shape \(3,\), expected \(5,\) "):
        layer_norm(x, bias=torch.zeros(3))


@pytest.mark.parametrize("make", [lambda: LayerNorm(8, eps=0), lambda: LayerNorm(8, eps=-1),
                                  lambda: layer_norm(torch.ones(2, 8), eps=0.0)])
def test_layer_norm_refuses_an_eps_that_is_not_positive(make):
    with pytest.raises(ValueError, match="eps is .*expected a finite number > 0"):
        make()


@pytest.mark.parametrize("make", [lambda: FeedForward(8, hidden=0), lambda: SwiGLUFeedForward(8, hidden=0)])
def test_feed_forward_refuses_an_empty_hidden_layer(make):
    with pytest.raises(ValueError, match="hidden is 0, expected a positive int"):
        make()


@pytest.mark.parametrize("module", [MultiHeadAttention(8, 2), FeedForward(8), SwiGLUFeedForward(8), Block(8, 2)])
def test_wrong_width_is_named_before_the_matrix_product(module):
    with pytest.raises(ValueError, match=r"x has shape \(1, 3, 6\), expected \((B, N|\.\.\.), 8\)"):
        module(torch.randn(1, 3, 6))


@pytest.mark.parametrize("module", [MultiHeadAttention(8, 2), FeedForward(8), SwiGLUFeedForward(8), Block(8, 2)])
def test_wrong_dtype_is_named_before_the_matrix_product(module):
    with pytest.raises(TypeError, match="x has dtype torch.float64, expected torch.float32"):
        module(torch.randn(1, 3, 8, dtype=torch.float64))


@pytest.mark.parametrize("make, name", [
    (lambda: MultiHeadAttention(-8, 2), "d_model"), (lambda: LayerNorm(-1), "d_model"),
    (lambda: FeedForward(-4), "d_model"), (lambda: SwiGLUFeedForward(-6), "d_model"),
    (lambda: Block(8, -2), "n_heads"), (lambda: GPTConfig(d_model=-8), "d_model"),
    (lambda: KVCache(-1, 1, 1, 4, 4), "n_layers"),
    (lambda: TokenAndPositionEmbedding(-3, 4, 4), "vocab_size"),
])
def test_negative_sizes_are_named(make, name):
    with pytest.raises(ValueError, match=f"{name} is -"):
        make()
