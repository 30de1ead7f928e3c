"""helpers.model.attention's masks: causal attention never reads the future, padding is invisible,
fully masked rows stay finite, and the sparse patterns are what they claim to be."""

from __future__ import annotations

import pytest
import torch

import helpers.lab.exercises as exercises
from helpers.model.attention import (
    bidirectional_mask,
    causal_mask,
    global_mask,
    local_mask,
    padding_mask,
    scaled_dot_product_attention,
    strided_mask,
)

TIGHT = {"atol": 1e-12, "rtol": 1e-12}


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def self_attention(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Self-attention of x (..., n, 6) through fixed random projections."""
    w_q, w_k, w_v = randn(6, 4, seed=100), randn(6, 4, seed=101), randn(6, 3, seed=102)
    return scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, mask=mask)[0]


# --- causal ----------------------------------------------------------------------------------

def test_causal_mask_is_the_lower_triangle():
    assert torch.equal(causal_mask(5), torch.tril(torch.ones(5, 5, dtype=torch.bool)))
    assert causal_mask(3).dtype == torch.bool


@pytest.mark.parametrize("changed_from", [1, 3, 5])
def test_changing_future_tokens_leaves_past_outputs_unchanged(changed_from):
    x = randn(6, 6, seed=1)
    edited = x.clone()
    edited[changed_from:] = randn(6 - changed_from, 6, seed=2)
    before, after = self_attention(x, causal_mask(6)), self_attention(edited, causal_mask(6))
    torch.testing.assert_close(after[:changed_from], before[:changed_from], **TIGHT)
    assert not torch.allclose(after[changed_from:], before[changed_from:]), "the edit should show"


def test_without_the_mask_the_future_leaks_into_the_past():
    x = randn(6, 6, seed=1)
    edited = x.clone()
    edited[5] = randn(6, seed=3)
    assert not torch.allclose(self_attention(edited, None)[0], self_attention(x, None)[0])


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
    torch.testing.assert_close(self_attention(x, bidirectional_mask(5)), self_attention(x, None), **TIGHT)


# --- padding ---------------------------------------------------------------------------------

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
    before, after = self_attention(x, mask), self_attention(noisy, mask)
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


# --- sparse patterns -------------------------------------------------------------------------

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


# --- exercise checkers reject the classic mistakes -------------------------------------------

def verdict(capsys, name: str, answer) -> str:
    """The full verdict on `answer`: what is wrong and how to fix it (what `check` prints from the
    second wrong try on)."""
    return exercises.evaluate(name, answer)[1]


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
