"""helpers.model.attention: softmax and scaled dot-product attention agree with PyTorch, are stable,
are permutation equivariant, and refuse bad input with a message naming what was wrong."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import helpers.lab.exercises as exercises
from helpers.lab.exercises import check
from helpers.model import attention
from helpers.model.attention import (
    AttentionLayer,
    bidirectional_mask,
    causal_mask,
    global_mask,
    local_mask,
    padding_mask,
    scaled_dot_product_attention,
    softmax,
    softmax_jacobian,
    strided_mask,
)
from helpers.model.multihead import MultiHeadAttention

TIGHT = {"atol": 1e-12, "rtol": 1e-12}


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def random_mask(*shape: int, seed: int = 0, p_allowed: float = 0.7) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=generator) < p_allowed


# --- softmax -------------------------------------------------------------------------------

def test_softmax_matches_torch_along_any_dim():
    x = randn(3, 4, 5)
    for dim in (0, 1, -1):
        torch.testing.assert_close(softmax(x, dim=dim), torch.softmax(x, dim=dim), **TIGHT)


def test_softmax_is_stable_for_logits_of_1e4():
    x = torch.tensor([[1e4, 0.0, -1e4], [1e4, 1e4 - 1.0, 0.0]], dtype=torch.float32)
    naive = torch.exp(x) / torch.exp(x).sum(dim=-1, keepdim=True)
    assert torch.isnan(naive).any(), "the naive formula should overflow here, or the test proves nothing"
    got = softmax(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[0], torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(got[1, :2], torch.softmax(torch.tensor([1.0, 0.0]), dim=-1))


def test_softmax_of_an_all_minus_inf_row_is_zero_and_its_gradient_is_finite():
    x = torch.tensor([[float("-inf")] * 3, [0.0, float("-inf"), 1.0]], requires_grad=True)
    a = softmax(x)
    torch.testing.assert_close(a[0], torch.zeros(3))
    torch.testing.assert_close(a[1], torch.softmax(torch.tensor([0.0, float("-inf"), 1.0]), dim=-1))
    (a * torch.arange(3.0)).sum().backward()
    assert torch.isfinite(x.grad).all()


def test_softmax_rejects_integer_input():
    with pytest.raises(TypeError, match="x has dtype torch.int64"):
        softmax(torch.tensor([1, 2, 3]))


def test_softmax_jacobian_equals_autograd():
    for logits in ([20.0, 0.0, -20.0], [2.5, 0.0, -2.5], [0.1, 0.4, -0.3, 1.0]):
        s = torch.tensor(logits, dtype=torch.float64)
        by_hand = softmax_jacobian(softmax(s))
        by_autograd = torch.autograd.functional.jacobian(softmax, s)
        torch.testing.assert_close(by_hand, by_autograd, **TIGHT)


def test_a_saturated_softmax_has_a_vanishing_jacobian():
    small = softmax_jacobian(softmax(torch.tensor([2.5, 0.0, -2.5], dtype=torch.float64)))
    large = softmax_jacobian(softmax(torch.tensor([20.0, 0.0, -20.0], dtype=torch.float64)))
    assert large.abs().max() < 1e-8 < 0.05 < small.abs().max()


# --- attention against PyTorch ---------------------------------------------------------------

@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_equals_torch_on_batched_multi_head_shapes(with_mask):
    batch, heads, n_q, n_k, d_k, d_v = 2, 3, 5, 7, 8, 4
    q, k, v = randn(batch, heads, n_q, d_k, seed=1), randn(batch, heads, n_k, d_k, seed=2), randn(batch, heads, n_k, d_v, seed=3)
    mask = random_mask(batch, heads, n_q, n_k, seed=4) if with_mask else None
    output, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(output, expected, **TIGHT)
    assert weights.shape == (batch, heads, n_q, n_k)
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(batch, heads, n_q, dtype=torch.float64), **TIGHT)


def test_attention_with_causal_and_padding_masks_equals_torch():
    q, k, v = randn(3, 2, 6, 4, seed=5), randn(3, 2, 6, 4, seed=6), randn(3, 2, 6, 4, seed=7)
    mask = causal_mask(6) & padding_mask(torch.tensor([6, 4, 1]), 6)
    output, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TIGHT)
    output, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(6))
    torch.testing.assert_close(output, F.scaled_dot_product_attention(q, k, v, is_causal=True), **TIGHT)


def test_custom_scale_equals_torch():
    q, k, v = randn(4, 3, seed=8), randn(6, 3, seed=9), randn(6, 2, seed=10)
    output, _ = scaled_dot_product_attention(q, k, v, scale=0.25)
    torch.testing.assert_close(output, F.scaled_dot_product_attention(q, k, v, scale=0.25), **TIGHT)


shapes = st.fixed_dictionaries({
    "batch": st.integers(1, 3), "heads": st.integers(1, 3), "n_q": st.integers(1, 6),
    "n_k": st.integers(1, 6), "d_k": st.integers(1, 9), "d_v": st.integers(1, 5),
})


@settings(max_examples=60, deadline=None)
@given(shape=shapes, mask_kind=st.sampled_from(["none", "full", "per_query", "per_key"]),
       seed=st.integers(0, 2**16))
def test_attention_equals_torch_for_any_shape_and_mask(shape, mask_kind, seed):
    b, h, n_q, n_k, d_k, d_v = (shape[name] for name in ("batch", "heads", "n_q", "n_k", "d_k", "d_v"))
    q, k, v = randn(b, h, n_q, d_k, seed=seed), randn(b, h, n_k, d_k, seed=seed + 1), randn(b, h, n_k, d_v, seed=seed + 2)
    mask_shape = {"none": None, "full": (b, h, n_q, n_k), "per_query": (n_q, n_k), "per_key": (b, 1, 1, n_k)}[mask_kind]
    mask = None if mask_shape is None else random_mask(*mask_shape, seed=seed + 3)
    output, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TIGHT)
    assert output.shape == (b, h, n_q, d_v) and weights.shape == (b, h, n_q, n_k)
    assert torch.isfinite(weights).all()
    if mask is not None:
        assert (weights[~mask.expand_as(weights)] == 0).all(), "a masked key received weight"


# --- properties --------------------------------------------------------------------------------

def self_attention(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor) -> torch.Tensor:
    return scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)[0]


def test_self_attention_is_permutation_equivariant():
    x, w_q, w_k, w_v = randn(6, 5, seed=11), randn(5, 4, seed=12), randn(5, 4, seed=13), randn(5, 3, seed=14)
    perm = torch.randperm(6, generator=torch.Generator().manual_seed(15))
    assert not torch.equal(perm, torch.arange(6))
    torch.testing.assert_close(self_attention(x[perm], w_q, w_k, w_v), self_attention(x, w_q, w_k, w_v)[perm], **TIGHT)


def test_permuting_keys_and_values_together_changes_nothing():
    q, k, v = randn(3, 4, seed=16), randn(5, 4, seed=17), randn(5, 2, seed=18)
    perm = torch.tensor([4, 2, 0, 1, 3])
    torch.testing.assert_close(scaled_dot_product_attention(q, k[perm], v[perm])[0],
                               scaled_dot_product_attention(q, k, v)[0], **TIGHT)


def test_attention_is_stable_for_scores_of_1e4():
    q = torch.tensor([[100.0, 0.0]])
    k = torch.tensor([[100.0, 0.0], [-100.0, 0.0], [0.0, 0.0]])
    v = torch.eye(3)
    output, weights = scaled_dot_product_attention(q, k, v, scale=1.0)  # scores 1e4, -1e4, 0
    assert torch.isfinite(output).all()
    torch.testing.assert_close(weights, torch.tensor([[1.0, 0.0, 0.0]]))


def test_fully_masked_query_gets_zero_output_and_finite_gradients():
    q, k, v = randn(3, 4, seed=19).requires_grad_(), randn(5, 4, seed=20).requires_grad_(), randn(5, 2, seed=21)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    output, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.equal(weights[1], torch.zeros(5, dtype=torch.float64))
    assert torch.equal(output[1], torch.zeros(2, dtype=torch.float64))
    output.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


def test_causal_mask_with_a_kv_cache_matches_the_last_rows_of_full_attention():
    q, k, v = randn(7, 4, seed=22), randn(7, 4, seed=23), randn(7, 3, seed=24)
    full, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(7))
    last_two, _ = scaled_dot_product_attention(q[-2:], k, v, mask=causal_mask(2, 7))
    torch.testing.assert_close(last_two, full[-2:], **TIGHT)
    assert causal_mask(2, 7)[-1].all() and not causal_mask(2, 7)[0, -1]


# --- errors ----------------------------------------------------------------------------------

def test_mismatched_d_k_names_both_shapes():
    with pytest.raises(ValueError, match=r"q has shape \(2, 4\) and k has shape \(3, 5\)"):
        scaled_dot_product_attention(randn(2, 4), randn(3, 5), randn(3, 5))


def test_mismatched_number_of_keys_and_values_names_both_shapes():
    with pytest.raises(ValueError, match=r"k has shape \(3, 4\) and v has shape \(2, 4\)"):
        scaled_dot_product_attention(randn(2, 4), randn(3, 4), randn(2, 4))


def test_leading_dims_that_do_not_broadcast_are_named():
    with pytest.raises(ValueError, match=r"q has shape \(2, 3, 4\), k has shape \(5, 3, 4\)"):
        scaled_dot_product_attention(randn(2, 3, 4), randn(5, 3, 4), randn(5, 3, 4))


def test_d_k_of_zero_is_refused():
    with pytest.raises(ValueError, match="d_k is 0"):
        scaled_dot_product_attention(randn(2, 0), randn(3, 0), randn(3, 4))


def test_wrong_mask_shape_is_refused_with_the_expected_shape():
    with pytest.raises(ValueError, match=r"mask has shape \(3, 2\), expected .*\(\.\.\., 2, 3\)"):
        scaled_dot_product_attention(randn(2, 4), randn(3, 4), randn(3, 4), mask=torch.ones(3, 2, dtype=torch.bool))


def test_a_mask_that_would_grow_the_output_is_refused():
    with pytest.raises(ValueError, match=r"mask has shape \(5, 2, 3\)"):
        scaled_dot_product_attention(randn(2, 4), randn(3, 4), randn(3, 4), mask=torch.ones(5, 2, 3, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_non_boolean_mask_is_refused(dtype):
    with pytest.raises(TypeError, match=f"mask has dtype {dtype}"):
        scaled_dot_product_attention(randn(2, 4), randn(3, 4), randn(3, 4), mask=torch.ones(2, 3, dtype=dtype))


@pytest.mark.parametrize("scale, error", [(0.0, ValueError), (-1.0, ValueError),
                                          (math.inf, ValueError), ("big", TypeError)])
def test_bad_scale_is_refused(scale, error):
    with pytest.raises(error, match="scale is"):
        scaled_dot_product_attention(randn(2, 4), randn(3, 4), randn(3, 4), scale=scale)


def test_mixed_dtypes_are_refused():
    with pytest.raises(TypeError, match="q, k, v have dtypes torch.float32, torch.float64"):
        scaled_dot_product_attention(randn(2, 4).float(), randn(3, 4), randn(3, 4))


def test_one_dimensional_q_is_refused():
    with pytest.raises(ValueError, match=r"q has shape \(4,\)"):
        scaled_dot_product_attention(randn(4), randn(3, 4), randn(3, 4))


# --- exercise checkers reject the classic mistakes -------------------------------------------

def verdict(capsys, name: str, answer) -> str:
    """The full verdict on `answer`: what is wrong and how to fix it (what `check` prints from the
    second wrong try on). The answers here are built from the course's own functions, to test how
    the checker judges them, so the call watch is off (watched=False): graded, each would be
    refused as the course's code (test_the_courses_softmax_earns_nothing_when_graded)."""
    return exercises.evaluate(name, answer, watched=False)[1]


def naive_softmax(x):
    return torch.exp(x) / torch.exp(x).sum(dim=-1, keepdim=True)


def test_softmax_checker_accepts_the_reference_and_rejects_overflow(capsys):
    assert verdict(capsys, "attention.stable_softmax", softmax).startswith("✅")
    out = verdict(capsys, "attention.stable_softmax", naive_softmax)
    assert out.startswith("❌") and "overflows" in out


def test_the_courses_softmax_earns_nothing_when_graded():
    passed, said = exercises.evaluate("attention.stable_softmax", softmax)
    assert not passed and "helpers.model.attention.softmax" in said and "the course's own code" in said


def test_softmax_checker_rejects_normalising_the_wrong_dim(capsys):
    def over_columns(x):
        e = (x - x.amax(dim=0, keepdim=True)).exp()
        return e / e.sum(dim=0, keepdim=True)

    out = verdict(capsys, "attention.stable_softmax", over_columns)
    assert out.startswith("❌") and "do not sum to 1" in out


@pytest.mark.parametrize("library", [lambda x: torch.softmax(x, dim=-1), lambda x: F.softmax(x, dim=-1),
                                     lambda x: x.softmax(-1)])
def test_softmax_checker_refuses_the_library_softmax_by_name(library):
    passed, said = exercises.evaluate("attention.stable_softmax", library)
    assert not passed and "softmax, which this exercise asks you to write yourself" in said
    assert torch.softmax(torch.zeros(2), dim=-1)[0] == 0.5 and torch.zeros(2).softmax(-1)[0] == 0.5  # restored


def test_the_first_wrong_try_says_what_is_wrong_and_the_second_how_to_fix_it(capsys, monkeypatch):
    monkeypatch.setattr(exercises, "_WRONG_TRIES", {})
    check("attention.stable_softmax", naive_softmax)
    first = capsys.readouterr().out
    check("attention.stable_softmax", naive_softmax)
    second = capsys.readouterr().out
    assert "overflows" in first and "Subtract the row maximum" not in first
    assert "How to fix it: Subtract the row maximum" in second


def test_jacobian_checker_rejects_the_diagonal_alone(capsys):
    assert verdict(capsys, "attention.softmax_jacobian", softmax_jacobian).startswith("✅")
    out = verdict(capsys, "attention.softmax_jacobian", torch.diag)
    assert out.startswith("❌") and "outer product" in out


def test_attention_checker_explains_missing_scale_and_wrong_dim(capsys):
    assert verdict(capsys, "attention.scaled_attention", scaled_dot_product_attention).startswith("✅")
    unscaled = lambda q, k, v: scaled_dot_product_attention(q, k, v, scale=1.0)  # noqa: E731
    out = verdict(capsys, "attention.scaled_attention", unscaled)
    assert out.startswith("❌") and "sqrt(d_k)" in out

    def columns(q, k, v):
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2)
        return weights @ v, weights

    out = verdict(capsys, "attention.scaled_attention", columns)
    assert out.startswith("❌") and "columns sum to 1" in out


# --- AttentionLayer: learned projections around scaled dot-product attention ---------------------

def layer_in_float64(d_in: int = 6, d_k: int = 4, d_v: int = 3) -> AttentionLayer:
    torch.manual_seed(0)
    return AttentionLayer(d_in, d_k, d_v).double()


def test_attention_layer_is_attention_of_the_projected_tokens():
    layer = layer_in_float64()
    x_query, x_data = randn(2, 3, 6, seed=1), randn(2, 5, 6, seed=2)
    output, weights = layer(x_query, x_data)
    w_q, w_k, w_v = (proj.weight.T for proj in (layer.w_q, layer.w_k, layer.w_v))  # (d_in, d)
    expected_out, expected_w = scaled_dot_product_attention(x_query @ w_q, x_data @ w_k, x_data @ w_v)
    assert output.shape == (2, 3, 3) and weights.shape == (2, 3, 5)
    torch.testing.assert_close(output, expected_out, **TIGHT)
    torch.testing.assert_close(weights, expected_w, **TIGHT)
    assert all(proj.bias is None for proj in (layer.w_q, layer.w_k, layer.w_v))
    assert sum(p.numel() for p in layer.parameters()) == 6 * (2 * 4 + 3)


def test_attention_layer_self_attention_is_the_layer_on_one_input_and_broadcasts_leading_dims():
    layer = layer_in_float64()
    x = randn(4, 6, seed=3)
    output, weights = layer(x, x)
    assert output.shape == (4, 3) and weights.shape == (4, 4)
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(4, dtype=torch.float64), **TIGHT)
    batched, _ = layer(randn(2, 1, 3, 6, seed=4), randn(1, 4, 5, 6, seed=5))  # (2, 1) and (1, 4) broadcast
    assert batched.shape == (2, 4, 3, 3)


@pytest.mark.parametrize("d_in, d_k, d_v, error, words", [
    (0, 4, 3, ValueError, "d_in is 0"), (6, -1, 3, ValueError, "d_k is -1"),
    (6, 4, 2.5, TypeError, "d_v is 2.5"), (True, 4, 3, TypeError, "d_in is True"),
])
def test_attention_layer_refuses_bad_sizes(d_in, d_k, d_v, error, words):
    with pytest.raises(error, match=words):
        AttentionLayer(d_in, d_k, d_v)


@pytest.mark.parametrize("x_query, x_data, error, words", [
    ([[0.0] * 6], torch.randn(3, 6), TypeError, "x_query is a list"),
    (torch.randn(6), torch.randn(3, 6), ValueError, r"x_query has shape \(6,\), expected \(..., N, 6\)"),
    (torch.randn(2, 6), torch.randn(3, 5), ValueError, r"x_data has shape \(3, 5\), expected \(..., N, 6\)"),
    (torch.randn(2, 6), torch.randn(0, 6), ValueError, "at least one token"),
    (torch.randn(2, 6, dtype=torch.float64), torch.randn(3, 6), TypeError, "x_query has dtype torch.float64"),
    (torch.randn(2, 2, 6), torch.randn(3, 3, 6), ValueError, "leading .batch. dimensions do not broadcast"),
])
def test_attention_layer_refuses_tokens_it_cannot_attend(x_query, x_data, error, words):
    with pytest.raises(error, match=words):
        AttentionLayer(6, 4, 3)(x_query, x_data)


# helpers.model.attention's masks: causal attention never reads the future, padding is invisible,
# fully masked rows stay finite, and the sparse patterns are what they claim to be.

def masked_self_attention(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Self-attention of x (..., n, 6) through fixed random projections."""
    w_q, w_k, w_v = randn(6, 4, seed=100), randn(6, 4, seed=101), randn(6, 3, seed=102)
    return scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, mask=mask)[0]


def test_causal_mask_is_the_lower_triangle():
    assert torch.equal(causal_mask(5), torch.tril(torch.ones(5, 5, dtype=torch.bool)))
    assert causal_mask(3).dtype == torch.bool


@pytest.mark.parametrize("changed_from", [1, 3, 5])
def test_changing_future_tokens_leaves_past_outputs_unchanged(changed_from):
    x = randn(6, 6, seed=1)
    edited = x.clone()
    edited[changed_from:] = randn(6 - changed_from, 6, seed=2)
    before, after = masked_self_attention(x, causal_mask(6)), masked_self_attention(edited, causal_mask(6))
    torch.testing.assert_close(after[:changed_from], before[:changed_from], **TIGHT)
    assert not torch.allclose(after[changed_from:], before[changed_from:]), "the edit should show"


def test_without_the_mask_the_future_leaks_into_the_past():
    x = randn(6, 6, seed=1)
    edited = x.clone()
    edited[5] = randn(6, seed=3)
    assert not torch.allclose(masked_self_attention(edited, None)[0], masked_self_attention(x, None)[0])


def test_filling_with_zero_instead_of_minus_inf_leaks_the_future():
    scores = torch.tensor([[-3.0, -2.0, -1.0]])
    future = ~causal_mask(3)[:1]
    with_zero = torch.softmax(scores.masked_fill(future, 0.0), dim=-1)
    with_inf = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    assert with_zero[0, 1:].sum() > 0.5 and with_inf[0, 1:].sum() == 0


def test_causal_mask_refuses_more_queries_than_keys_and_non_positive_sizes():
    with pytest.raises(ValueError, match="n_k is 2, expected n_k >= n_q = 3"):
        causal_mask(3, 2)
    with pytest.raises(ValueError, match="n_q is 0"):
        causal_mask(0)


def test_bidirectional_mask_equals_no_mask():
    x = randn(5, 6, seed=4)
    torch.testing.assert_close(masked_self_attention(x, bidirectional_mask(5)), masked_self_attention(x, None), **TIGHT)


def test_padding_mask_shape_and_values():
    mask = padding_mask(torch.tensor([3, 1, 0]), 4)
    assert mask.shape == (3, 1, 1, 4) and mask.dtype == torch.bool
    assert mask[:, 0, 0].tolist() == [[True, True, True, False], [True, False, False, False], [False] * 4]


def test_padding_content_never_reaches_real_tokens():
    lengths = torch.tensor([5, 3])
    x = randn(2, 5, 6, seed=5)
    noisy = x.clone()
    noisy[1, 3:] = 1e3 * randn(2, 6, seed=6)  # garbage in the padding slots
    mask = causal_mask(5) & padding_mask(lengths, 5)[:, 0]  # (2, 5, 5): no head dim here
    before, after = masked_self_attention(x, mask), masked_self_attention(noisy, mask)
    torch.testing.assert_close(after[1, :3], before[1, :3], **TIGHT)
    torch.testing.assert_close(after[0], before[0], **TIGHT)


def test_padding_mask_broadcasts_over_heads_and_queries():
    q, k, v = randn(2, 3, 4, 5, seed=7), randn(2, 3, 6, 5, seed=8), randn(2, 3, 6, 2, seed=9)
    _, weights = scaled_dot_product_attention(q, k, v, mask=padding_mask(torch.tensor([6, 2]), 6))
    assert (weights[1, :, :, 2:] == 0).all() and (weights[0] > 0).all()


@pytest.mark.parametrize(("lengths", "match"), [
    (torch.tensor([[3, 2]]), r"lengths is \(1, 2\), expected a 1-D tensor"),
    (torch.tensor([3, 7]), r"lengths is \[3, 7\], expected values in 0..5"),
    ([3, 2], "lengths is list"),
])
def test_padding_mask_refuses_bad_lengths(lengths, match):
    with pytest.raises(ValueError, match=match):
        padding_mask(lengths, 5)


def test_left_padding_with_a_causal_mask_gives_a_fully_masked_row_without_nan():
    real = torch.tensor([False, False, True, True, True])  # two pad tokens on the left
    mask = causal_mask(5) & real  # row 0 and row 1 see only padding: fully masked
    assert not mask[0].any() and not mask[1].any()
    q, k, v = randn(5, 4, seed=10), randn(5, 4, seed=11), randn(5, 3, seed=12)
    output, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.isfinite(output).all()
    assert (output[:2] == 0).all() and torch.allclose(weights[2:].sum(-1), torch.ones(3, dtype=torch.float64))
    naive = torch.softmax((q @ k.T).masked_fill(~mask, float("-inf")), dim=-1)
    assert torch.isnan(naive[:2]).all(), "plain softmax gives NaN here, which the helper avoids"


def test_local_mask_sees_exactly_window_plus_one_earlier_keys():
    mask = local_mask(8, 2)
    assert mask.sum(-1).tolist() == [1, 2, 3, 3, 3, 3, 3, 3]
    assert not (mask & ~causal_mask(8)).any()
    assert torch.equal(local_mask(8, 2, causal=False), local_mask(8, 2, causal=False).T)
    assert torch.equal(local_mask(6, 5), causal_mask(6))


def test_strided_mask_sees_every_stride_th_earlier_key():
    mask = strided_mask(9, 3)
    assert mask[8].nonzero().flatten().tolist() == [2, 5, 8]
    assert not (mask & ~causal_mask(9)).any()
    assert torch.equal(strided_mask(5, 1), causal_mask(5))


def test_local_and_strided_reach_every_earlier_key_in_two_hops():
    n, stride = 16, 4
    local, strided = local_mask(n, stride - 1), strided_mask(n, stride)
    two_hops = (local.double() @ strided.double() > 0) | (strided.double() @ local.double() > 0)
    assert torch.equal(two_hops | local | strided, causal_mask(n))


def test_global_mask_rows_and_columns():
    mask = global_mask(6, [0, 4])
    assert mask[0].all() and mask[4].all() and mask[:, 0].all() and mask[:, 4].all()
    assert mask.sum() == 6 * 6 - 4 * 4
    with pytest.raises(ValueError, match=r"global_tokens is \[6\], expected positions in 0..5"):
        global_mask(6, [6])


def test_patterns_refuse_bad_sizes():
    with pytest.raises(ValueError, match="window is -1"):
        local_mask(4, -1)
    with pytest.raises(ValueError, match="stride is 0"):
        strided_mask(4, 0)


def test_a_pattern_used_in_attention_puts_no_weight_outside_it():
    mask = local_mask(10, 2) | global_mask(10, [0])
    q, k, v = randn(10, 4, seed=13), randn(10, 4, seed=14), randn(10, 4, seed=15)
    _, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    assert (weights[~mask] == 0).all() and (weights[mask] > 0).all()


def reference_causal_softmax(scores):
    n_q, n_k = scores.shape[-2:]
    return torch.softmax(scores.masked_fill(~causal_mask(n_q, n_k), float("-inf")), dim=-1)


def test_causal_softmax_checker(capsys):
    assert verdict(capsys, "masking.causal_softmax", reference_causal_softmax).startswith("✅")
    zero_fill = lambda s: torch.softmax(s.masked_fill(~causal_mask(*s.shape[-2:]), 0.0), dim=-1)  # noqa: E731
    out = verdict(capsys, "masking.causal_softmax", zero_fill)
    assert out.startswith("❌") and "exp(0) = 1" in out
    upside_down = lambda s: torch.softmax(s.masked_fill(causal_mask(5).T.logical_not(), float("-inf")), dim=-1)  # noqa: E731
    out = verdict(capsys, "masking.causal_softmax", upside_down)
    assert out.startswith("❌") and "upside down" in out


def test_causal_softmax_checker_wants_the_last_queries_to_see_the_cache(capsys):
    def top_left(scores):
        n_q, n_k = scores.shape[-2:]
        return torch.softmax(scores.masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool).tril(), float("-inf")), -1)

    out = verdict(capsys, "masking.causal_softmax", top_left)
    assert out.startswith("❌") and "(2, 5)" in out and "top left corner" in out and "i + n_k - n_q" in out


def test_padding_and_sparse_mask_checkers(capsys):
    right = lambda lengths, n, side="right": padding_mask(lengths, n)[:, 0, 0].flip(-1 if side == "left" else ())  # noqa: E731
    assert verdict(capsys, "masking.padding_mask", right).startswith("✅")
    out = verdict(capsys, "masking.padding_mask", lambda lengths, n, side="right": right(lengths, n, side).int())
    assert out.startswith("❌") and "dtype torch.int32" in out

    def from_helpers(n, window=None, stride=None, global_tokens=(), causal=False):
        parts = [local_mask(n, window, causal=causal)] if window is not None else []
        parts += [strided_mask(n, stride, causal=causal)] if stride is not None else []
        if len(global_tokens):
            parts.append(global_mask(n, global_tokens) & (causal_mask(n) if causal else True))
        return torch.stack(parts).any(dim=0) if parts else torch.zeros(n, n, dtype=torch.bool)

    assert verdict(capsys, "masking.sparse_mask", from_helpers).startswith("✅")
    two_sided = lambda n, window=None, stride=None, global_tokens=(), causal=False: from_helpers(  # noqa: E731
        n, window, stride, global_tokens)
    out = verdict(capsys, "masking.sparse_mask", two_sided)
    assert out.startswith("❌") and "later keys" in out


def test_padding_mask_refuses_float_lengths():
    with pytest.raises(TypeError, match="lengths has dtype torch.float32, expected an integer tensor"):
        padding_mask(torch.tensor([2.5, 1.0]), 4)


def test_attention_refuses_tensors_on_different_devices():
    q = torch.randn(3, 4)
    k = torch.randn(3, 4, device="meta")
    with pytest.raises(ValueError, match="q is on cpu, k on meta and v on cpu"):
        scaled_dot_product_attention(q, k, torch.randn(3, 4))


def test_numpy_scales_are_accepted_when_positive():
    q, k, v = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5, 4)
    out, _ = scaled_dot_product_attention(q, k, v, scale=np.float32(0.5))
    assert torch.allclose(out, scaled_dot_product_attention(q, k, v, scale=0.5)[0])
    with pytest.raises(ValueError, match="scale is np.float32"):
        scaled_dot_product_attention(q, k, v, scale=np.float32(-1.0))


DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def padding_mask_by_hand(lengths: list[int], n: int) -> torch.Tensor:
    """(B, 1, N) bool: key j of row b is real when j < lengths[b]."""
    return (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None])[:, None, :]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_padded_keys_change_nothing_in_plain_and_multihead_attention(dtype):
    n, lengths = 10, [10, 6, 3]
    mask = padding_mask_by_hand(lengths, n)
    q, k, v = (torch.randn(3, n, 8, generator=torch.Generator().manual_seed(s)).to(dtype) for s in range(3))
    k2, v2 = k.clone(), v.clone()
    for row, length in enumerate(lengths):
        k2[row, length:] += 100.0  # anything at all in the padded slots
        v2[row, length:] -= 100.0
    assert torch.equal(scaled_dot_product_attention(q, k, v, mask)[0],
                       scaled_dot_product_attention(q, k2, v2, mask)[0])
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).to(dtype).eval()
    x, x2 = q, q.clone()
    for row, length in enumerate(lengths):
        x2[row, length:] = torch.randn(n - length, 8).to(dtype)
    with torch.no_grad():
        out, out2 = mha(x, mask=mask), mha(x2, mask=mask)
    for row, length in enumerate(lengths):  # the real queries see the real keys only
        assert torch.equal(out[row, :length], out2[row, :length])


MASKS = {  # each mask function with arguments that give a (4, 4) or (4, 6) mask, and device
    "causal": lambda device: attention.causal_mask(4, 6, device=device),
    "bidirectional": lambda device: attention.bidirectional_mask(4, 6, device=device),
    "local": lambda device: attention.local_mask(4, 1, device=device),
    "strided": lambda device: attention.strided_mask(4, 2, device=device),
    "global": lambda device: attention.global_mask(4, [1], device=device),
}


@pytest.mark.parametrize("name", MASKS)
def test_masks_are_made_on_the_device_asked_for_not_the_default_one(name):
    expected = MASKS[name]("cpu")
    with torch.device("meta"):
        got = MASKS[name]("cpu")
    assert got.device.type == "cpu" and torch.equal(got, expected)


def test_the_padding_mask_follows_the_lengths_device():
    lengths = torch.tensor([2, 0, 3])
    expected = attention.padding_mask(lengths, 3)
    with torch.device("meta"):
        got = attention.padding_mask(lengths, 3)
    assert got.device.type == "cpu" and torch.equal(got, expected)


def test_the_softmax_jacobian_of_a_batch_is_autograds_row_by_row():
    a = torch.softmax(torch.randn(3, 4, dtype=torch.float64), -1)
    got = attention.softmax_jacobian(a)
    assert got.shape == (3, 4, 4)
    for row, jacobian in zip(a, got, strict=True):
        expected = torch.autograd.functional.jacobian(
            lambda s: torch.softmax(s, -1), torch.log(row))  # softmax(log a) = a
        torch.testing.assert_close(jacobian, expected)


@pytest.mark.parametrize("call, error, message", [
    (lambda: attention.causal_mask(0), ValueError, "^n_q is 0, expected a positive int$"),
    (lambda: attention.causal_mask(2, 0), ValueError, "^n_k is 0, expected a positive int$"),
    (lambda: attention.bidirectional_mask(0), ValueError, "^n_q is 0, expected a positive int$"),
    (lambda: attention.bidirectional_mask(2, 0), ValueError, "^n_k is 0, expected a positive int$"),
    (lambda: attention.local_mask(0, 1), ValueError, "^n is 0, expected a positive int$"),
    (lambda: attention.strided_mask(0, 1), ValueError, "^n is 0, expected a positive int$"),
    (lambda: attention.global_mask(0, []), ValueError, "^n is 0, expected a positive int$"),
    (lambda: attention.padding_mask(torch.tensor([1]), 0), ValueError,
     "^n_k is 0, expected a positive int$"),
    (lambda: attention.padding_mask(torch.tensor([True]), 2), TypeError,
     r"^lengths has dtype torch.bool, expected an integer tensor of token counts \(a length of "
     r"2.5 tokens means nothing\): use lengths.long\(\)$"),
    (lambda: attention.softmax([1.0]), TypeError, "^x is a list, expected a torch.Tensor$"),
    (lambda: attention.softmax_jacobian([0.5]), ValueError,
     r"^a is list, expected a tensor of probabilities of shape \(\.\.\., n\)$"),
    (lambda: attention.softmax_jacobian(torch.tensor(1.0)), ValueError,
     r"^a is \(\), expected a tensor of probabilities"),
    (lambda: attention.check_scale(-1.0), ValueError,
     r"^scale is -1.0, expected a finite number > 0 such as 1/sqrt\(d_k\)$"),
])
def test_mask_and_softmax_helpers_name_the_bad_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("change, error, message", [
    (dict(k=[1.0]), TypeError, "^k is a list, expected a torch.Tensor$"),
    (dict(v=torch.ones(3)), ValueError, r"^v has shape \(3,\), expected \(\.\.\., N, d\) with 2\+ dims$"),
    (dict(k=torch.ones(2, 5, 8, dtype=torch.long)), TypeError,
     "^k has dtype torch.int64, expected a floating-point tensor$"),
    (dict(q=torch.ones(2, 4, 0), k=torch.ones(2, 5, 0)), ValueError,
     r"^q has shape \(2, 4, 0\): d_k is 0, expected d_k >= 1$"),
    (dict(k=torch.ones(2, 0, 8), v=torch.ones(2, 0, 8)), ValueError,
     r"^k has shape \(2, 0, 8\): N_k is 0, expected at least one key$"),
    (dict(k=torch.ones(2, 5, 3)), ValueError, "must match, got 8 and 3$"),
    (dict(k=torch.ones(3, 5, 8)), ValueError, "do not broadcast$"),
    (dict(v=torch.ones(3, 5, 8)), ValueError, "do not broadcast$"),
    (dict(k=torch.ones(2, 5, 8, device="meta")), ValueError,
     r"^q is on cpu, k on meta and v on cpu: expected all three on one device \(move them with "
     r"\.to\(device\)\)$"),
    (dict(mask=[True]), TypeError, "^mask is a list, expected a boolean torch.Tensor$"),
    (dict(mask=torch.ones(4, 5)), TypeError, r"expected torch.bool \(True = may attend\); for a "
     r"0/1 mask use mask.bool\(\)$"),
    (dict(mask=torch.ones(3, 5, dtype=torch.bool)), ValueError,
     r"^mask has shape \(3, 5\), expected a shape broadcastable to \(\.\.\., 4, 5\) to match "
     r"scores of shape \(2, 4, 5\)$"),
])
def test_attention_names_the_bad_argument_exactly(change, error, message):
    args = dict(q=torch.ones(2, 4, 8), k=torch.ones(2, 5, 8), v=torch.ones(2, 5, 8))
    args.update(change)
    with pytest.raises(error, match=message):
        attention.scaled_dot_product_attention(**args)


def test_a_mask_of_another_shape_is_named_with_the_scores_last_two_sizes():
    """(..., N_q, N_k) are the scores' last two sizes, also in 4-D."""
    q, k = torch.ones(1, 2, 4, 8), torch.ones(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"broadcastable to \(\.\.\., 4, 5\)"):
        attention.scaled_dot_product_attention(q, k, k, mask=torch.ones(3, 5, dtype=torch.bool))


def test_the_mask_shapes_follow_their_arguments():
    assert attention.bidirectional_mask(2, 3).shape == (2, 3)
    assert attention.bidirectional_mask(2).shape == (2, 2)
    assert attention.strided_mask(4, 2, causal=False)[0].tolist() == [True, False, True, False]
    assert attention.strided_mask(4, 2)[0].tolist() == [True, False, False, False]


def test_global_tokens_given_as_a_small_integer_tensor_are_positions():
    """A uint8 tensor would index as a boolean mask; the positions are made long first."""
    expected = attention.global_mask(4, [0, 2])
    assert torch.equal(attention.global_mask(4, torch.tensor([0, 2], dtype=torch.uint8)), expected)
