"""The tiled attention of helpers.flash.tiled equals naive attention, forwards and backwards.

Naive attention is helpers.model.attention.scaled_dot_product_attention; every comparison is in float64,
where the only difference left between the two is rounding.
"""

from __future__ import annotations

import inspect
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.flash import costs, profiling, tiled
from helpers.flash.tiled import flash_attention, tiled_attention_fa1, tiled_attention_fa2
from helpers.model.attention import causal_mask, scaled_dot_product_attention

SETTINGS = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def bottom_right_causal(n_q: int, n_k: int) -> torch.Tensor:
    """(n_q, n_k) bool: key j visible to query i when j <= i + n_k - n_q (any n_q, n_k)."""
    return torch.ones(n_q, n_k, dtype=torch.bool).tril(diagonal=n_k - n_q)


@st.composite
def attention_case(draw: st.DrawFn) -> dict:
    """Random shapes, tiles that need not divide N, masks, huge logits, fully masked rows."""
    lead = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    n_q, n_k = draw(st.integers(1, 33)), draw(st.integers(1, 33))
    d, d_v = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    magnitude = draw(st.sampled_from([1.0, 1e3]))
    q = torch.randn(*lead, n_q, d, generator=gen, dtype=torch.float64) * magnitude
    k = torch.randn(*lead, n_k, d, generator=gen, dtype=torch.float64)
    v = torch.randn(*lead, n_k, d_v, generator=gen, dtype=torch.float64)
    mask_kind = draw(st.sampled_from(["none", "random", "key padding", "one row hidden"]))
    mask = None
    if mask_kind == "random":
        mask = torch.rand(*lead, n_q, n_k, generator=gen) < 0.7
    elif mask_kind == "key padding":
        mask = (torch.arange(n_k) < draw(st.integers(1, n_k))).reshape(*[1] * len(lead), 1, n_k)
    elif mask_kind == "one row hidden":
        mask = torch.ones(n_q, n_k, dtype=torch.bool)
        mask[draw(st.integers(0, n_q - 1))] = False
    causal = draw(st.booleans()) and n_q <= n_k  # more queries than keys: refused (test_bad_input_newer)
    return dict(q=q, k=k, v=v, mask=mask, causal=causal,
                block_q=draw(st.integers(1, 12)), block_k=draw(st.integers(1, 12)))


def naive(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive output and the log-sum-exp of each query's visible scores."""
    q, k, v, mask = case["q"], case["k"], case["v"], case["mask"]
    full = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)
    if case["causal"]:
        full = bottom_right_causal(q.shape[-2], k.shape[-2])
    if mask is not None:
        full = full & mask
    out, _ = scaled_dot_product_attention(q, k, v, mask=full)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return out, scores.masked_fill(~full, -math.inf).logsumexp(dim=-1)


def close(got: torch.Tensor, expected: torch.Tensor) -> None:
    assert got.shape == expected.shape
    assert not got.isnan().any()
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


def run_kwargs(case: dict) -> dict:
    return {name: case[name] for name in ("mask", "causal", "block_q", "block_k")}


@SETTINGS
@given(attention_case())
def test_both_loop_orders_equal_naive_attention(case):
    expected_out, expected_lse = naive(case)
    close(tiled.tiled_attention_fa1(case["q"], case["k"], case["v"], **run_kwargs(case)), expected_out)
    out, lse = tiled.tiled_attention_fa2(case["q"], case["k"], case["v"], **run_kwargs(case))
    close(out, expected_out)
    torch.testing.assert_close(lse, expected_lse, rtol=1e-9, atol=1e-9)  # -inf where all hidden


@SETTINGS
@given(attention_case())
def test_backward_equals_autograd_through_naive_attention(case):
    inputs = [case[name].clone().requires_grad_() for name in ("q", "k", "v")]
    mine = tiled.flash_attention(*inputs, **run_kwargs(case))
    upstream = torch.randn(mine.shape, generator=torch.Generator().manual_seed(1), dtype=mine.dtype)
    my_grads = torch.autograd.grad(mine, inputs, upstream)
    reference = [case[name].clone().requires_grad_() for name in ("q", "k", "v")]
    theirs, _ = naive({**case, "q": reference[0], "k": reference[1], "v": reference[2]})
    their_grads = torch.autograd.grad(theirs, reference, upstream)
    for got, expected in zip(my_grads, their_grads, strict=True):
        close(got, expected)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_in_float64(causal):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 4, generator=gen, dtype=torch.float64, requires_grad=True)
               for n in (5, 7, 7))
    mask = torch.rand(2, 5, 7, generator=gen) < 0.8

    def attend(q, k, v):
        return tiled.flash_attention(q, k, v, mask=mask, causal=causal, block_q=2, block_k=3)

    assert torch.autograd.gradcheck(attend, (q, k, v))


def test_a_fully_masked_row_gives_zero_output_and_zero_gradients():
    q, k, v = (torch.randn(1, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False
    out = tiled.flash_attention(q, k, v, mask=mask, block_q=2, block_k=2)
    out.sum().backward()
    assert torch.equal(out[0, 2], torch.zeros(3, dtype=torch.float64))
    assert torch.equal(q.grad[0, 2], torch.zeros(3, dtype=torch.float64))
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()


def test_more_queries_than_keys_is_refused_when_causal_as_causal_mask_does():
    q, k, v = (torch.randn(n, 4, dtype=torch.float64) for n in (6, 4, 4))
    with pytest.raises(ValueError, match=r"n_k is 4, expected n_k >= n_q = 6"):
        tiled.tiled_attention_fa2(q, k, v, causal=True, block_q=4, block_k=2)
    with pytest.raises(ValueError, match=r"n_k is 4, expected n_k >= n_q = 6"):
        causal_mask(6, 4)
    out, lse = tiled.tiled_attention_fa2(q, k, v, causal=False, block_q=4, block_k=2)
    assert lse.isfinite().all()  # without causality every query sees every key


def test_causal_flag_matches_the_course_causal_mask():
    q, k, v = (torch.randn(n, 8, dtype=torch.float64) for n in (5, 9, 9))
    out, _ = tiled.tiled_attention_fa2(q, k, v, causal=True, block_q=2, block_k=4)
    expected, _ = scaled_dot_product_attention(q, k, v, mask=causal_mask(5, 9))
    close(out, expected)
    assert torch.equal(causal_mask(5, 9), bottom_right_causal(5, 9))


# --- the online softmax ----------------------------------------------------------------------

@SETTINGS
@given(st.integers(1, 20), st.integers(1, 20), st.integers(0, 1000), st.sampled_from([1.0, 1e3]))
def test_merging_two_partial_states_equals_one_pass(n_a, n_b, seed, magnitude):
    gen = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(3, n, generator=gen, dtype=torch.float64) * magnitude for n in (n_a, n_b))
    merged = tiled.merge_softmax_states(tiled.softmax_state(a), tiled.softmax_state(b))
    whole = tiled.softmax_state(torch.cat([a, b], dim=-1))
    torch.testing.assert_close(merged.row_max, whole.row_max, rtol=0, atol=0)
    torch.testing.assert_close(merged.row_sum, whole.row_sum, rtol=1e-12, atol=0)
    torch.testing.assert_close(tiled.log_sum_exp(merged), torch.cat([a, b], -1).logsumexp(-1))


def test_a_fully_masked_block_merges_without_nan():
    hidden = torch.full((2, 3), -math.inf, dtype=torch.float64)
    seen = torch.tensor([[0.5, -1.0, 2.0], [-math.inf, 1.0, 0.0]], dtype=torch.float64)
    state = tiled.merge_softmax_states(tiled.softmax_state(hidden), tiled.softmax_state(seen))
    assert not state.row_sum.isnan().any()
    torch.testing.assert_close(state.row_sum, tiled.softmax_state(seen).row_sum)
    empty = tiled.merge_softmax_states(tiled.softmax_state(hidden), tiled.softmax_state(hidden))
    assert torch.equal(empty.row_sum, torch.zeros(2, dtype=torch.float64))
    assert empty.row_max.eq(-math.inf).all()
    plain = torch.exp(hidden - hidden.amax(-1, keepdim=True))  # what the guard protects against
    assert plain.isnan().all()


def test_trace_tiles_ends_at_the_attention_output():
    q, k, v = (torch.randn(n, 4, dtype=torch.float64) for n in (10, 10, 10))
    for causal, expected_steps in ((False, 3 * 3), (True, 1 + 2 + 3)):
        steps = tiled.trace_tiles(q, k, v, block_q=4, block_k=4, causal=causal)
        assert len(steps) == expected_steps
        mask = causal_mask(10) if causal else None
        expected, _ = scaled_dot_product_attention(q, k, v, mask=mask)
        last_of_each_row_tile = [s for s, nxt in zip(steps, steps[1:] + [None], strict=True)
                                 if nxt is None or nxt.rows != s.rows]
        close(torch.cat([s.output for s in last_of_each_row_tile]), expected)


# --- counting memory traffic ---------------------------------------------------------------------

def test_traffic_counts_follow_their_formulas_at_the_extremes():
    n, d = 1024, 64
    assert costs.hbm_elements_naive(n, d) == 4 * n * d + 4 * n * n
    # One key tile holding all keys: Q, O, l, m visited once, K and V read once.
    assert costs.hbm_elements_fa1(n, d, block_k=n) == 2 * n * d + 3 * n * d + 4 * n
    # One query tile holding all queries: every tensor read or written exactly once.
    assert costs.hbm_elements_fa2(n, d, block_q=n) == 4 * n * d + n
    assert costs.hbm_elements_fa1(n, d, block_k=384) < costs.hbm_elements_naive(n, d) / 5
    assert costs.hbm_elements_fa1(n, d, block_k=128) > costs.hbm_elements_fa1(n, d, block_k=256)


def test_algorithm1_block_sizes_and_flops():
    assert costs.algorithm1_block_sizes(98304, 64) == (64, 384)
    assert costs.algorithm1_block_sizes(1000, 64) == (4, 4)
    assert costs.attention_flops(2, 3, 8, 8, 4) == 4 * 2 * 3 * 8 * 8 * 4
    assert costs.attention_flops(2, 3, 8, 8, 4, causal=True) == 2 * 2 * 3 * 8 * 8 * 4
    with pytest.raises(ValueError, match="d is 0"):
        costs.hbm_elements_naive(16, 0)


# --- measuring memory ----------------------------------------------------------------------------

def test_peak_memory_sees_a_temporary_and_is_repeatable():
    def make_and_drop() -> None:
        scratch = torch.ones(1_000_000)  # 4 MB, freed on return
        del scratch

    peak = profiling.peak_memory_bytes(make_and_drop)
    assert 4_000_000 <= peak < 4_200_000
    assert profiling.peak_memory_bytes(make_and_drop) == peak
    assert profiling.peak_memory_bytes(lambda: None) == 0


def test_naive_attention_holds_an_n_by_n_matrix_and_tiles_do_not():
    q, k, v = (torch.randn(1, 2, 1024, 32) for _ in range(3))
    naive_peak = profiling.peak_memory_bytes(lambda: scaled_dot_product_attention(q, k, v))
    tiled_peak = profiling.peak_memory_bytes(
        lambda: tiled.tiled_attention_fa2(q, k, v, block_q=128, block_k=128))
    scores_bytes = 2 * 1024 * 1024 * 4
    assert naive_peak >= 2 * scores_bytes  # the scores and their softmax coexist
    assert tiled_peak < scores_bytes / 4


# --- errors name what went wrong -----------------------------------------------------------------

def test_the_in_place_forward_refuses_tensors_that_need_gradients():
    q = torch.randn(4, 8, requires_grad=True)
    with pytest.raises(ValueError, match="call flash_attention"):
        tiled.tiled_attention_fa2(q, q.detach(), q.detach())
    with torch.no_grad():
        out, _ = tiled.tiled_attention_fa2(q, q.detach(), q.detach())
    assert out.shape == (4, 8)


@pytest.mark.parametrize("change, error, message", [
    (dict(k=torch.randn(2, 5, 3)), ValueError, r"q has shape \(2, 4, 8\) and k has shape \(2, 5, 3\)"),
    (dict(v=torch.randn(2, 6, 8)), ValueError, r"k has shape \(2, 5, 8\) and v has shape \(2, 6, 8\)"),
    (dict(q=torch.ones(2, 4, 8, dtype=torch.long)), TypeError, "q has dtype torch.int64"),
    (dict(mask=torch.ones(4, 5)), TypeError, "mask has dtype torch.float32, expected torch.bool"),
    (dict(mask=torch.ones(3, 5, dtype=torch.bool)), ValueError, r"mask has shape \(3, 5\)"),
    (dict(block_q=0), ValueError, "block_q is 0"),
    (dict(scale=-1.0), ValueError, "scale is -1.0"),
    (dict(q=torch.randn(8)), ValueError, r"q has shape \(8,\)"),
])
def test_bad_input_names_the_argument(change, error, message):
    args = dict(q=torch.randn(2, 4, 8), k=torch.randn(2, 5, 8), v=torch.randn(2, 5, 8))
    args.update(change)
    with pytest.raises(error, match=message):
        tiled.flash_attention(**args)


@pytest.mark.parametrize("function", [tiled.flash_attention, tiled.tiled_attention_fa1,
                                      lambda q, k, v, **kw: tiled.tiled_attention_fa2(q, k, v, **kw)[0]])
def test_a_string_causal_flag_is_refused(function):
    q, k, v = (torch.randn(2, 4, 8) for _ in range(3))
    with pytest.raises(TypeError, match=r"causal is 'no' \(str\), expected True or False"):
        function(q, k, v, causal="no")


@pytest.mark.parametrize("scale", [0, 0.0, -1, float("nan"), True])
def test_scales_that_are_not_positive_numbers_are_refused(scale):
    q, k, v = (torch.randn(2, 4, 8) for _ in range(3))
    with pytest.raises((ValueError, TypeError), match=rf"scale is {re.escape(repr(scale))}.* expected a finite number > 0"):
        tiled.flash_attention(q, k, v, scale=scale)


def test_a_numpy_scale_is_accepted():
    q, k, v = (torch.randn(2, 4, 8, dtype=torch.float64) for _ in range(3))
    out = tiled.flash_attention(q, k, v, scale=np.float32(0.25), block_q=3, block_k=3)
    expected, _ = scaled_dot_product_attention(q, k, v, scale=0.25)
    close(out, expected)


def test_q_and_k_on_different_devices_are_refused():
    q, k, v = (torch.randn(2, 4, 8) for _ in range(3))
    with pytest.raises(ValueError, match=r"q is on cpu, k on meta and v on cpu: expected all three"):
        tiled.flash_attention(q, k.to("meta"), v)


def test_an_empty_query_sequence_names_q():
    q, k, v = torch.randn(2, 0, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"q has shape \(2, 0, 8\): N_q is 0, expected at least one query"):
        tiled.flash_attention(q, k, v)
    with pytest.raises(ValueError, match=r"k has shape \(2, 0, 8\): N_k is 0, expected at least one key"):
        tiled.flash_attention(k, q, q)


@pytest.mark.parametrize("path", ["fa1", "fa2", "flash", "plain"])
def test_causal_attention_with_more_queries_than_keys_is_refused_alike(path):
    q, k = torch.randn(1, 1, 5, 4), torch.randn(1, 1, 3, 4)
    call = {"fa1": lambda: tiled.tiled_attention_fa1(q, k, k, causal=True),
            "fa2": lambda: tiled.tiled_attention_fa2(q, k, k, causal=True),
            "flash": lambda: tiled.flash_attention(q, k, k, causal=True),
            "plain": lambda: causal_mask(5, 3)}[path]  # the Triton path: tests/flash/test_triton_kernels.py
    with pytest.raises(ValueError, match=r"n_k is 3, expected n_k >= n_q = 5"):
        call()


TILED_PATHS = {
    "fa1": lambda q, k, v, causal, mask=None: tiled_attention_fa1(q, k, v, mask=mask, causal=causal,
                                                                  block_q=4, block_k=4),
    "fa2": lambda q, k, v, causal, mask=None: tiled_attention_fa2(q, k, v, mask=mask, causal=causal,
                                                                  block_q=4, block_k=4)[0],
    "autograd": lambda q, k, v, causal, mask=None: flash_attention(q, k, v, mask=mask, causal=causal,
                                                                   block_q=4, block_k=4),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("path", list(TILED_PATHS))
def test_tiled_attention_is_causal_exactly(dtype, path):
    q, k, v = (torch.randn(2, 13, 8, dtype=dtype, generator=torch.Generator().manual_seed(s))
               for s in range(3))
    k2, v2 = k.clone(), v.clone()
    k2[:, 9], v2[:, 9] = torch.randn(8, dtype=dtype), torch.randn(8, dtype=dtype)
    with torch.no_grad():
        before = TILED_PATHS[path](q, k, v, True)
        after = TILED_PATHS[path](q, k2, v2, True)
    assert torch.equal(before[:, :9], after[:, :9]) and not torch.equal(before[:, 9:], after[:, 9:])


def padding_mask(lengths: list[int], n: int) -> torch.Tensor:
    """(B, 1, N) bool: key j of row b is real when j < lengths[b]."""
    return (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None])[:, None, :]


@pytest.mark.parametrize("path", list(TILED_PATHS))
def test_padded_keys_change_nothing_in_tiled_attention(path):
    n, lengths = 11, [11, 5, 2]
    mask = padding_mask(lengths, n)
    q, k, v = (torch.randn(3, n, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
               for s in range(3))
    k2, v2 = k.clone(), v.clone()
    for row, length in enumerate(lengths):
        k2[row, length:], v2[row, length:] = 50.0, -50.0
    with torch.no_grad():
        assert torch.equal(TILED_PATHS[path](q, k, v, False, mask), TILED_PATHS[path](q, k2, v2, False, mask))


@pytest.mark.parametrize("block_q,block_k", [(4, 4), (4, 8), (8, 4)])
def test_tiled_attention_equals_plain_attention_for_every_remainder_and_offset(block_q, block_k):
    generator = torch.Generator().manual_seed(0)
    for n_q in range(1, 2 * block_q + 2):
        for n_k in range(n_q, n_q + block_k + 2):  # causal needs n_k >= n_q; every offset mod block_k
            q = torch.randn(n_q, 8, dtype=torch.float64, generator=generator)
            k, v = (torch.randn(n_k, 8, dtype=torch.float64, generator=generator) for _ in range(2))
            for causal in (False, True):
                mask = causal_mask(n_q, n_k) if causal else None
                expected, _ = scaled_dot_product_attention(q, k, v, mask)
                fa1 = tiled_attention_fa1(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
                fa2, _ = tiled_attention_fa2(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
                for name, out in (("fa1", fa1), ("fa2", fa2)):
                    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12,
                                               msg=f"{name} n_q={n_q} n_k={n_k} causal={causal}")


def test_the_tiled_backward_equals_autograd_on_ragged_sizes():
    generator = torch.Generator().manual_seed(1)
    for n_q, n_k in ((5, 5), (3, 7), (9, 14), (1, 6)):
        q = torch.randn(2, n_q, 8, dtype=torch.float64, generator=generator, requires_grad=True)
        k, v = (torch.randn(2, n_k, 8, dtype=torch.float64, generator=generator, requires_grad=True)
                for _ in range(2))
        grad_out = torch.randn(2, n_q, 8, dtype=torch.float64, generator=generator)
        tiled = torch.autograd.grad(flash_attention(q, k, v, causal=True, block_q=4, block_k=4),
                                    (q, k, v), grad_out)
        plain = torch.autograd.grad(scaled_dot_product_attention(q, k, v, causal_mask(n_q, n_k))[0],
                                    (q, k, v), grad_out)
        for name, a, b in zip("qkv", tiled, plain, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10, msg=f"d{name}, n_q={n_q} n_k={n_k}")


PATHS = {
    "fa1": tiled.tiled_attention_fa1,
    "fa2": lambda q, k, v, **kw: tiled.tiled_attention_fa2(q, k, v, **kw)[0],
    "flash": tiled.flash_attention,
}


def qkv(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=generator, dtype=dtype) for _ in range(3))


def reference(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, **kw)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_attention_ignores_the_default_device(path, causal):
    """Every buffer is made on q's device: under a `meta` default device a buffer made with
    device=None would be a meta tensor, and mixing it with the CPU inputs would fail."""
    q, k, v = qkv(2, 7, 4)
    mask = torch.rand(2, 7, 9, generator=torch.Generator().manual_seed(1)) > 0.3
    k, v = torch.cat([k, k[:, :2]], 1), torch.cat([v, v[:, :2]], 1)
    with torch.no_grad():
        expected = PATHS[path](q, k, v, mask=mask, causal=causal, block_q=3, block_k=4)
        with torch.device("meta"):
            got = PATHS[path](q, k, v, mask=mask, causal=causal, block_q=3, block_k=4)
    assert got.device == q.device and torch.equal(got, expected)


@pytest.mark.parametrize("causal", [False, True])
def test_the_log_sum_exp_and_the_backward_ignore_the_default_device(causal):
    q, k, v = qkv(2, 7, 4)
    with torch.no_grad():
        expected = tiled.tiled_attention_fa2(q, k, v, causal=causal, block_q=3, block_k=4)
        with torch.device("meta"):
            got = tiled.tiled_attention_fa2(q, k, v, causal=causal, block_q=3, block_k=4)
    for a, b in zip(got, expected, strict=True):
        assert a.device == q.device and torch.equal(a, b)
    # the backward itself (autograd runs it outside the default-device context)
    args = (q, k, v, *expected, torch.ones_like(expected[0]), None, causal, 0.5, 3, 4)
    grads = tiled.tiled_attention_backward(*args)
    with torch.device("meta"):
        grads_meta = tiled.tiled_attention_backward(*args)
    for a, b in zip(grads_meta, grads, strict=True):
        assert a.device == q.device and torch.equal(a, b)


@pytest.mark.parametrize("causal", [False, True])
def test_trace_tiles_ignores_the_default_device(causal):
    q, k, v = qkv(5, 4)
    expected = tiled.trace_tiles(q, k, v, 2, 2, causal=causal)
    with torch.device("meta"):
        got = tiled.trace_tiles(q, k, v, 2, 2, causal=causal)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.output, b.output) and torch.equal(a.row_max, b.row_max)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=str)
def test_the_start_state_has_the_tiles_dtype_and_device(dtype):
    q_tile = torch.randn(2, 3, 4, dtype=dtype)
    with torch.device("meta"):
        state = tiled.start_tile_state(q_tile, d_v=5)
    assert state.row_max.shape == state.row_sum.shape == (2, 3)
    assert state.acc.shape == (2, 3, 5)
    for name, tensor in state._asdict().items():
        assert (tensor.dtype, tensor.device) == (dtype, q_tile.device), name
    assert torch.all(state.row_max == float("-inf"))
    assert not state.row_sum.any() and not state.acc.any()


def test_every_traced_tile_holds_the_papers_running_statistics():
    q, k, v = qkv(5, 4, dtype=torch.float64)
    snapshots = tiled.trace_tiles(q, k, v, block_q=2, block_k=3)
    assert [(s.rows, s.cols) for s in snapshots] == [
        (rows, cols) for rows in (slice(0, 2), slice(2, 4), slice(4, 5))
        for cols in (slice(0, 3), slice(3, 5))]
    scores = q @ k.T / 2.0  # scale 1 / sqrt(4)
    for s in snapshots:
        seen = scores[s.rows, : s.cols.stop]  # every key tile up to this one
        row_max = seen.amax(dim=-1)
        torch.testing.assert_close(s.row_max, row_max)
        torch.testing.assert_close(s.row_sum, torch.exp(seen - row_max[:, None]).sum(-1))
        torch.testing.assert_close(s.output, torch.softmax(seen, -1) @ v[: s.cols.stop])


@pytest.mark.parametrize("path", PATHS)
def test_attention_is_not_causal_unless_asked(path):
    q, k, v = qkv(1, 6, 4, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(PATHS[path](q, k, v, block_q=4, block_k=4), reference(q, k, v))


def test_trace_tiles_is_not_causal_unless_asked():
    q, k, v = qkv(4, 4)
    assert len(tiled.trace_tiles(q, k, v, 2, 2)) == 4  # the causal trace skips the top-right tile
    assert len(tiled.trace_tiles(q, k, v, 2, 2, causal=True)) == 3


def test_the_algorithm_1_loop_tiles_by_64_unless_told():
    """Another tile size changes the bits (the merge order), so the default is seen exactly."""
    q, k, v = qkv(1, 130, 16)
    default = tiled.tiled_attention_fa1(q, k, v)
    assert torch.equal(default, tiled.tiled_attention_fa1(q, k, v, block_q=64, block_k=64))
    assert not torch.equal(default, tiled.tiled_attention_fa1(q, k, v, block_q=65))
    assert not torch.equal(default, tiled.tiled_attention_fa1(q, k, v, block_k=65))


def test_the_documented_tile_sizes_are_the_defaults():
    defaults = {name: p.default for name, p in
                inspect.signature(tiled.tiled_attention_fa1).parameters.items()}
    assert (defaults["block_q"], defaults["block_k"]) == (64, 64)
    for fn in (tiled.tiled_attention_fa2, tiled.flash_attention):
        parameters = inspect.signature(fn).parameters
        assert parameters["block_q"].default == tiled.DEFAULT_BLOCK_Q == 512
        assert parameters["block_k"].default == tiled.DEFAULT_BLOCK_K == 1024


@pytest.mark.parametrize("path", PATHS)
def test_a_non_default_scale_reaches_every_path(path):
    q, k, v = qkv(2, 5, 4, dtype=torch.float64)
    with torch.no_grad():
        got = PATHS[path](q, k, v, scale=0.9, block_q=2, block_k=3)
    torch.testing.assert_close(got, reference(q, k, v, scale=0.9))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mask, error, message", [
    (torch.ones(4, 5), TypeError, "mask has dtype torch.float32, expected torch.bool"),
    (torch.ones(3, 5, dtype=torch.bool), ValueError, r"mask has shape \(3, 5\)"),
])
def test_every_path_checks_the_mask(path, mask, error, message):
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    with pytest.raises(error, match=message):
        PATHS[path](q, k, v, mask=mask)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("k_batch, v_batch", [(1, 2), (2, 1)])
def test_tiles_need_equal_leading_dimensions_not_broadcast_ones(path, k_batch, v_batch):
    """Plain attention broadcasts (1, ...) against (2, ...); tiling does not, for k or v alike."""
    q, k, v = torch.randn(2, 4, 8), torch.randn(k_batch, 5, 8), torch.randn(v_batch, 5, 8)
    shapes = rf"\(2, 4, 8\), \({k_batch}, 5, 8\), \({v_batch}, 5, 8\)"
    with pytest.raises(ValueError, match=rf"^q, k, v have shapes {shapes}: expected the same "
                       r"leading \(batch, head\) dimensions$"):
        PATHS[path](q, k, v)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("blocks, message", [
    (dict(block_k=0), "block_k is 0"),
    (dict(block_q=True), "block_q is True"),
    (dict(block_k=2.5), "block_k is 2.5"),
])
def test_every_path_names_a_bad_tile_size(path, blocks, message):
    q, k, v = qkv(2, 4, 8)
    with pytest.raises(ValueError, match=rf"^{message}, expected a positive int \(rows per tile\)$"):
        PATHS[path](q, k, v, **blocks)


def test_check_causal_alone_checks_the_type_only():
    """Without sizes (the Triton wrapper's first call) it checks the flag's type, nothing else."""
    tiled.check_causal(True)
    tiled.check_causal(False)
    with pytest.raises(TypeError, match="causal is 1"):
        tiled.check_causal(1)


@pytest.mark.parametrize("needs_grad", ["q", "k", "v"])
def test_the_in_place_forward_refuses_any_one_input_that_needs_gradients(needs_grad):
    args = dict(zip("qkv", qkv(4, 8), strict=True))
    args[needs_grad].requires_grad_(True)
    with pytest.raises(ValueError, match=r"^q, k or v requires grad, but tiled_attention_fa2 reuses "
                       r"its tiles in place and has no autograd graph: call "
                       r"flash_attention\(q, k, v, \.\.\.\) instead$"):
        tiled.tiled_attention_fa2(**args)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad, error, message", [
    (dict(causal="no", scale=-1.0), TypeError, "causal is 'no'"),
    (dict(scale=-1.0, mask=torch.ones(4, 5)), ValueError, "scale is -1.0"),
])
def test_with_two_bad_arguments_every_path_names_the_same_one_first(path, bad, error, message):
    """The checks run in one order (q, k, v, tiles, causal, scale, mask) on every entry point, so
    a wrong call gets the same message whichever function it reached."""
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    with pytest.raises(error, match=message):
        PATHS[path](q, k, v, **bad)


def test_a_bad_scale_is_named_before_the_gradient_rule():
    q, k, v = qkv(4, 8)
    with pytest.raises(ValueError, match="scale is -1.0"):
        tiled.tiled_attention_fa2(q.requires_grad_(True), k, v, scale=-1.0)


def test_trace_tiles_checks_its_arguments():
    q, k, v = qkv(4, 8)
    with pytest.raises(ValueError, match=r"^q has shape \(2, 4, 8\), expected one head \(N_q, d\)$"):
        tiled.trace_tiles(q.expand(2, 4, 8), k, v, 2, 2)
    with pytest.raises(TypeError, match=r"causal is 'no' \(str\), expected True or False"):
        tiled.trace_tiles(q, k, v, 2, 2, causal="no")
    with pytest.raises(ValueError, match="expected n_k >= n_q = 4 for causal attention"):
        tiled.trace_tiles(q, k[:3], v[:3], 2, 2, causal=True)


def test_flash_attention_tiles_as_it_is_told():
    """The forward of flash_attention is tiled_attention_fa2 with the same tiles, bit for bit; the
    fixture is chosen so that another key tile size changes the bits (the online softmax rounds
    differently), so a tile size lost on the way would show."""
    q, k, v = qkv(2, 9, 8, seed=3)
    k, v = torch.cat([k] * 4, 1), torch.cat([v] * 4, 1)
    with torch.no_grad():
        expected, _ = tiled.tiled_attention_fa2(q, k, v, block_q=5, block_k=8)
        got = tiled.flash_attention(q, k, v, block_q=5, block_k=8)
        for block_q in (8, 5):  # one key tile, whatever the query tiles
            one_key_tile, _ = tiled.tiled_attention_fa2(q, k, v, block_q=block_q, block_k=1024)
            assert not torch.equal(one_key_tile, expected)
    assert torch.equal(got, expected)
