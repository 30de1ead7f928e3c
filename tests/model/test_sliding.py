"""Sliding windows, QK-norm and RoPE scaling (notebook 12, sections 3 and 4)."""

from __future__ import annotations

import importlib.util
import math
import re

import pytest
import torch
from shared_tools import full

from helpers.model.frontier import FrontierConfig, FrontierGPT
from helpers.model.sliding import (
    RingKVCache,
    banded_mask,
    layer_kinds,
    llama3_inv_freq,
    pattern_cache_bytes,
    qk_norm_attention,
    ring_slot,
    yarn_inv_freq,
)

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _banded_attention(q, k, v, window):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~banded_mask(q.shape[-2], window), float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("window", [1, 3, 5, 20])
def test_ring_buffer_decoding_equals_the_banded_mask(window):
    torch.manual_seed(window)
    q, k, v = (torch.randn(2, 3, 12, 8) for _ in range(3))
    cache = RingKVCache(2, 3, window, 8)
    outs = []
    for t in range(12):
        keys, values = cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
        outs.append(torch.softmax(q[:, :, t:t + 1] @ keys.transpose(-2, -1) / 8 ** 0.5, -1) @ values)
    torch.testing.assert_close(torch.cat(outs, 2), _banded_attention(q, k, v, window))
    assert cache.nbytes == 2 * 2 * 3 * window * 8 * 4


def test_banded_mask_counts_and_ring_slot():
    mask = banded_mask(6, 2)
    assert mask.sum(1).tolist() == [1, 2, 2, 2, 2, 2]
    assert torch.equal(banded_mask(6, 6), torch.ones(6, 6, dtype=torch.bool).tril())
    assert [ring_slot(t, 4) for t in range(9)] == [0, 1, 2, 3, 0, 1, 2, 3, 0]


def test_gemma_pattern_and_its_cache():
    kinds = layer_kinds(12)
    assert kinds.count("global") == 2 and kinds[5] == kinds[11] == "global"
    full = pattern_cache_bytes(["global"] * 12, 8192, 1024, 1, 4)
    mixed = pattern_cache_bytes(kinds, 8192, 1024, 1, 4)
    assert full == 12 * 8192 * 8 * 2 and mixed == (2 * 8192 + 10 * 1024) * 8 * 2


def test_qk_norm_bounds_the_scores_whatever_the_scale():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    mask = banded_mask(5, 5)
    ones = torch.ones(8)
    _, small = qk_norm_attention(q, k, v, ones, ones, mask)
    _, large = qk_norm_attention(100 * q, 100 * k, v, ones, ones, mask)
    assert abs(small - large) < 1e-3 and large <= 8 ** 0.5 + 1e-4


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")
def test_rope_scaling_equals_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    llama3 = LlamaConfig(hidden_size=64, num_attention_heads=2, max_position_embeddings=512,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 64})
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](llama3, "cpu")
    torch.testing.assert_close(llama3_inv_freq(32, 10000.0, 8.0, 64).float(), theirs.float())
    yarn = LlamaConfig(hidden_size=64, num_attention_heads=2, max_position_embeddings=512,
                       rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                                        "original_max_position_embeddings": 64})
    theirs, factor = ROPE_INIT_FUNCTIONS["yarn"](yarn, "cpu")
    ours, our_factor = yarn_inv_freq(32, 10000.0, 8.0, 64)
    torch.testing.assert_close(ours.float(), theirs.float())
    assert our_factor == pytest.approx(factor)


def test_sliding_model_sees_nothing_past_its_window():
    torch.manual_seed(0)
    model = FrontierGPT(FrontierConfig(n_layers=1, mlp_hidden=32, window=3, local_per_global=1)).eval()
    ids = torch.randint(0, 64, (1, 10))
    changed = ids.clone()
    changed[0, 0] = (ids[0, 0] + 1) % 64
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[0, 3:], model(changed)[0, 3:])
        assert not torch.allclose(model(ids)[0, 2], model(changed)[0, 2])


@pytest.mark.parametrize("call, message", [
    (lambda: banded_mask(4, 0), "window is 0"),
    (lambda: RingKVCache(1, 1, 0, 4), "window is 0"),
    (lambda: ring_slot(-1, 4), "position is -1"),
    (lambda: RingKVCache(1, 2, 3, 4).append(torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4)), "expected both"),
    (lambda: pattern_cache_bytes(["local", "sliding"], 8, 2, 1, 4), "kinds is"),
    (lambda: llama3_inv_freq(32, 10000.0, 0.5, 64), "factor is 0.5"),
    (lambda: llama3_inv_freq(32, 10000.0, 2.0, 64, 4.0, 1.0), "high_freq_factor is 1.0"),
    (lambda: FrontierConfig(mlp_hidden=8, rope_scaling="ntk"), "rope_scaling is 'ntk'"),
])
def test_bad_input_raises_a_clear_error(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


def test_qk_norm_attention_names_bad_shapes_and_masks():
    from helpers.model.sliding import qk_norm_attention

    q = k = v = torch.randn(1, 2, 4, 8)
    gain, mask = torch.ones(8), torch.ones(4, 4, dtype=torch.bool)
    out, largest = qk_norm_attention(q, k, v, gain, gain, mask)
    assert out.shape == (1, 2, 4, 8) and largest <= 8 ** 0.5 + 1e-4  # |q.k| <= D_H after RMS-norm
    with pytest.raises(ValueError, match=r"expected \(B, H, N, D_H\)"):
        qk_norm_attention(q[0], k, v, gain, gain, mask)
    with pytest.raises(ValueError, match=r"q_weight has shape \(4,\), expected \(8,\)"):
        qk_norm_attention(q, k, v, torch.ones(4), gain, mask)
    with pytest.raises(ValueError, match="expected bool"):
        qk_norm_attention(q, k, v, gain, gain, mask.float())
    with pytest.raises(ValueError, match="eps"):
        qk_norm_attention(q, k, v, gain, gain, mask, eps=0.0)


# helpers.model.sliding, exactly:
#
# Exact properties of the window (a key outside it changes nothing, bit for bit; the ring buffer
# returns exactly the last W keys, oldest first), the masks at their edges, QK-norm attention
# against a float64 reference, both RoPE scalings against the formulas of Meta's and YaRN's code
# written here with non-default arguments, the cache arithmetic, every error message read in full.

def test_banded_mask_by_its_definition():
    for n_q, window, n_k in ((5, 2, None), (3, 2, 7), (4, 10, 4), (1, 1, 6), (6, 6, 6)):
        mask = banded_mask(n_q, window, n_k)
        m = n_q if n_k is None else n_k
        assert mask.shape == (n_q, m) and mask.dtype == torch.bool
        for i in range(n_q):
            q = m - n_q + i
            assert mask[i].tolist() == [q - window < j <= q for j in range(m)], (n_q, window, n_k, i)


def test_banded_mask_accepts_n_k_equal_to_n_q_and_refuses_less():
    assert torch.equal(banded_mask(3, 2, 3), banded_mask(3, 2))
    with pytest.raises(ValueError, match=full("n_k is 2, expected at least n_q = 3")):
        banded_mask(3, 2, 2)
    with pytest.raises(ValueError, match="^n_k is 0"):
        banded_mask(3, 2, 0)
    with pytest.raises(ValueError, match="^n_q is 0"):
        banded_mask(0, 2)


def test_a_key_outside_the_window_changes_nothing_bit_for_bit():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 8) for _ in range(3))
    gain = torch.rand(8) + 0.5
    window = 3
    mask = banded_mask(9, window)
    out, _ = qk_norm_attention(q, k, v, gain, gain, mask)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 2], v2[:, :, 2] = 100.0, -100.0                             # token 2: seen by queries 2, 3, 4
    out2, _ = qk_norm_attention(q, k2, v2, gain, gain, mask)
    assert torch.equal(out[:, :, :2], out2[:, :, :2]) and torch.equal(out[:, :, 5:], out2[:, :, 5:])
    assert not torch.equal(out[:, :, 4], out2[:, :, 4]) and not torch.equal(out[:, :, 2], out2[:, :, 2])


@pytest.mark.parametrize("window", [1, 2, 4])
def test_the_ring_returns_exactly_the_last_window_keys_oldest_first(window):
    torch.manual_seed(window)
    k, v = torch.randn(2, 3, 9, 5, dtype=torch.float64), torch.randn(2, 3, 9, 5, dtype=torch.float64)
    cache = RingKVCache(2, 3, window, 5, dtype=torch.float64)
    assert cache.keys.dtype == cache.values.dtype == torch.float64
    for t in range(9):
        keys, values = cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
        first = max(0, t + 1 - window)
        assert torch.equal(keys, k[:, :, first:t + 1]) and torch.equal(values, v[:, :, first:t + 1])
        assert cache.length == t + 1 and cache.window == window
    assert cache.keys.shape == cache.values.shape == (2, 3, window, 5)
    assert cache.nbytes == 2 * 2 * 3 * window * 5 * 8


def test_the_ring_starts_empty_in_float32_and_keeps_keys_and_values_apart():
    cache = RingKVCache(1, 1, 2, 2)
    assert cache.length == 0 and cache.keys.dtype == torch.float32
    assert torch.equal(cache.keys, torch.zeros(1, 1, 2, 2)) and torch.equal(cache.values, torch.zeros(1, 1, 2, 2))
    keys, values = cache.append(torch.ones(1, 1, 1, 2), torch.full((1, 1, 1, 2), 2.0))
    assert keys.tolist() == [[[[1.0, 1.0]]]] and values.tolist() == [[[[2.0, 2.0]]]]
    assert cache.nbytes == 2 * 2 * 2 * 4


@pytest.mark.parametrize("k_shape, v_shape", [
    ((1, 2, 1, 4), (1, 2, 1, 5)),      # k and v differ
    ((1, 2, 2, 4), (1, 2, 2, 4)),      # two tokens
    ((2, 2, 1, 4), (2, 2, 1, 4)),      # another batch
    ((1, 3, 1, 4), (1, 3, 1, 4)),      # other heads
    ((1, 2, 1, 3), (1, 2, 1, 3)),      # another head size
])
def test_append_names_the_shape_it_expects(k_shape, v_shape):
    cache = RingKVCache(1, 2, 3, 4)
    with pytest.raises(ValueError, match=full(f"k {k_shape} and v {v_shape}, expected both (1, 2, 1, 4)")):
        cache.append(torch.randn(k_shape), torch.randn(v_shape))
    assert cache.length == 0


@pytest.mark.parametrize("position, name", list(enumerate(["batch", "n_heads", "window", "head_dim"])))
def test_ring_sizes_are_checked_by_name(position, name):
    args = [1, 2, 3, 4]
    args[position] = 0
    with pytest.raises(ValueError, match=full(f"{name} is 0, expected a positive int")):
        RingKVCache(*args)


def test_ring_slot():
    assert [ring_slot(t, 3) for t in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert ring_slot(0, 1) == 0 and ring_slot(5, 1) == 0
    with pytest.raises(ValueError, match=full("window is 0, expected a positive int")):
        ring_slot(3, 0)
    with pytest.raises(ValueError, match=full("position is -1, expected an int >= 0")):
        ring_slot(-1, 2)


def test_layer_kinds_for_other_periods():
    assert layer_kinds(7, 2) == ["local", "local", "global"] * 2 + ["local"]
    assert layer_kinds(3, 0) == ["global"] * 3
    assert layer_kinds(6) == ["local"] * 5 + ["global"]                  # 5 per global by default
    assert layer_kinds(1, 1) == ["local"]
    with pytest.raises(ValueError, match="^n_layers is 0"):
        layer_kinds(0)
    with pytest.raises(ValueError, match="^local_per_global is -1"):
        layer_kinds(4, -1)


def test_pattern_cache_bytes_by_hand():
    # bytes_per_value defaults to 2 (bf16); a local layer keeps min(n_tokens, window)
    assert pattern_cache_bytes(["local", "global", "local"], 10, 4, 3, 5) == 2 * 3 * 5 * 2 * (4 + 10 + 4)
    assert pattern_cache_bytes(["local"], 3, 4, 1, 2, bytes_per_value=4) == 2 * 1 * 2 * 4 * 3
    assert pattern_cache_bytes(["local"], 4, 4, 1, 2, bytes_per_value=1) == 2 * 2 * 4


@pytest.mark.parametrize("position, name", list(enumerate(
    ["n_tokens", "window", "n_kv_heads", "head_dim", "bytes_per_value"])))
def test_pattern_cache_bytes_checks_every_size(position, name):
    args = [8, 2, 1, 4, 2]
    args[position] = 0
    with pytest.raises(ValueError, match=full(f"{name} is 0, expected a positive int")):
        pattern_cache_bytes(["local"], *args)


@pytest.mark.parametrize("kinds", [[], ["local", "sliding"], ["Global"]])
def test_pattern_cache_bytes_names_bad_kinds(kinds):
    with pytest.raises(ValueError, match=full(f"kinds is {kinds!r}, expected a non-empty list of 'local' / 'global'")):
        pattern_cache_bytes(kinds, 8, 2, 1, 4)


def _qk_reference(q, k, v, q_weight, k_weight, mask, eps):
    """One query at a time in float64: each head's vector over its RMS, times its gain."""
    def norm(x, gain):
        return x / math.sqrt(float((x * x).mean()) + eps) * gain
    b, h, n, d = q.shape
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    largest = 0.0
    for i in range(b):
        for j in range(h):
            keys = [norm(k[i, j, s], k_weight) for s in range(k.shape[2])]
            for t in range(n):
                qn = norm(q[i, j, t], q_weight)
                scores = torch.stack([qn @ key for key in keys]) / math.sqrt(d)
                largest = max(largest, float(scores.abs().max()))          # masked scores count too
                p = torch.softmax(scores.masked_fill(~mask[t], -math.inf), 0)
                out[i, j, t] = sum(p[s] * v[i, j, s] for s in range(k.shape[2]))
    return out, largest


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_qk_norm_attention_equals_the_reference(eps):
    torch.manual_seed(1)
    q = torch.randn(2, 2, 3, 4, dtype=torch.float64)
    k = torch.randn(2, 2, 5, 4, dtype=torch.float64)
    v = torch.randn(2, 2, 5, 4, dtype=torch.float64)
    q_weight, k_weight = torch.rand(4, dtype=torch.float64) + 0.5, torch.rand(4, dtype=torch.float64) + 2
    mask = banded_mask(3, 2, 5)
    kwargs = {} if eps == 1e-6 else {"eps": eps}
    out, largest = qk_norm_attention(q, k, v, q_weight, k_weight, mask, **kwargs)
    expected, expected_largest = _qk_reference(q, k, v, q_weight, k_weight, mask, eps)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    assert float(largest) == pytest.approx(expected_largest, rel=1e-12) and not largest.requires_grad


def test_the_largest_score_is_detached_and_the_output_is_not():
    q, k, v = (torch.randn(1, 1, 3, 4, requires_grad=True) for _ in range(3))
    gain = torch.ones(4, requires_grad=True)
    out, largest = qk_norm_attention(q, k, v, gain, gain, banded_mask(3, 3))
    assert out.requires_grad and not largest.requires_grad and largest.dim() == 0


def test_qk_norm_attention_names_every_bad_shape_in_full():
    q = k = v = torch.randn(1, 2, 4, 8)
    gain, mask = torch.ones(8), torch.ones(4, 4, dtype=torch.bool)
    shapes = "q, k, v have shapes {}, {}, {}, expected (B, H, N, D_H) and (B, H, M, D_H) twice"
    for qq, kk, vv in ((q[0], k, v), (q, k[0], v[0]), (q, k, v[:, :, :3]), (q[:, :1], k, v), (q[:1, :, :, :4], k, v),
                       (q, k[..., :4], v[..., :4])):
        with pytest.raises(ValueError, match=full(shapes.format(tuple(qq.shape), tuple(kk.shape), tuple(vv.shape)))):
            qk_norm_attention(qq, kk, vv, gain, gain, mask)
    with pytest.raises(ValueError, match=full("k_weight has shape (8, 1), expected (8,): one gain per feature of a head")):
        qk_norm_attention(q, k, v, gain, gain[:, None], mask)
    with pytest.raises(ValueError, match=full(
            "mask is torch.bool of shape (4, 3), expected bool (4, 4): True where a query may see a key")):
        qk_norm_attention(q, k, v, gain, gain, mask[:, :3])
    with pytest.raises(ValueError, match=full(
            "mask is torch.float32 of shape (4, 4), expected bool (4, 4): True where a query may see a key")):
        qk_norm_attention(q, k, v, gain, gain, mask.float())
    with pytest.raises(ValueError, match="^eps is -1.0"):
        qk_norm_attention(q, k, v, gain, gain, mask, eps=-1.0)


def _inv(head_dim, base):
    return torch.tensor([base ** (-2 * i / head_dim) for i in range(head_dim // 2)], dtype=torch.float64)


def _llama3_reference(head_dim, base, factor, original, low, high):
    """Meta's apply_scaling: by wavelength, three cases."""
    out = []
    for f in _inv(head_dim, base).tolist():
        wavelength = 2 * math.pi / f
        if wavelength < original / high:
            out.append(f)
        elif wavelength > original / low:
            out.append(f / factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("head_dim, base, factor, original, low, high", [
    (32, 10000.0, 8.0, 64, 1.0, 4.0),
    (64, 500000.0, 4.0, 128, 2.0, 3.0),
    (16, 100.0, 1.0, 32, 0.5, 8.0),
])
def test_llama3_inv_freq_follows_meta(head_dim, base, factor, original, low, high):
    ours = llama3_inv_freq(head_dim, base, factor, original, low, high)
    assert ours.dtype == torch.float64 and ours.shape == (head_dim // 2,)
    torch.testing.assert_close(ours, _llama3_reference(head_dim, base, factor, original, low, high),
                               atol=0, rtol=1e-12)


def test_llama3_defaults_are_one_and_four():
    torch.testing.assert_close(llama3_inv_freq(64, 500000.0, 4.0, 128),
                               _llama3_reference(64, 500000.0, 4.0, 128, 1.0, 4.0), atol=0, rtol=1e-12)


def _yarn_reference(head_dim, base, factor, original, beta_fast, beta_slow):
    def dim_of(turns):
        return head_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(dim_of(beta_fast)), 0), min(math.ceil(dim_of(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    out = []
    for i, f in enumerate(_inv(head_dim, base).tolist()):
        extrapolate = 1 - min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(f / factor * (1 - extrapolate) + f * extrapolate)
    return torch.tensor(out, dtype=torch.float64), 0.1 * math.log(factor) + 1


@pytest.mark.parametrize("head_dim, base, factor, original, beta_fast, beta_slow", [
    (32, 10000.0, 8.0, 64, 32.0, 1.0),
    (64, 10000.0, 4.0, 4096, 16.0, 2.0),
    (16, 100.0, 4.0, 4096, 32.0, 0.1),         # the ramp's top (ceil 15.25) clamped at head_dim - 1
    (32, 10000.0, 2.0, 64, 3.0, 2.9),          # a ramp of one step (low = high)
    (16, 50000.0, 16.0, 2048, 64.0, 0.5),
])
def test_yarn_inv_freq_follows_its_reference(head_dim, base, factor, original, beta_fast, beta_slow):
    ours, attention = yarn_inv_freq(head_dim, base, factor, original, beta_fast, beta_slow)
    theirs, their_attention = _yarn_reference(head_dim, base, factor, original, beta_fast, beta_slow)
    assert ours.dtype == torch.float64 and ours.shape == (head_dim // 2,)
    torch.testing.assert_close(ours, theirs, atol=0, rtol=1e-12)
    assert attention == pytest.approx(their_attention, rel=1e-15)


def test_yarn_defaults_are_32_and_1():
    # at 2048 tokens the ramp's start moves with beta_fast: floor(8.07) for 32, floor(7.97) for 33
    ours, attention = yarn_inv_freq(64, 10000.0, 4.0, 2048)
    theirs, their_attention = _yarn_reference(64, 10000.0, 4.0, 2048, 32.0, 1.0)
    torch.testing.assert_close(ours, theirs, atol=0, rtol=1e-12)
    assert attention == pytest.approx(1 + 0.1 * math.log(4.0))
    assert yarn_inv_freq(8, 10000.0, 1.0, 64)[1] == 1.0                 # factor 1: no attention change


@pytest.mark.parametrize("call, message", [
    (lambda: llama3_inv_freq(32, 10000.0, 0.99, 64), "factor is 0.99"),
    (lambda: llama3_inv_freq(32, 10000.0, 2.0, 0), "original_context is 0"),
    (lambda: llama3_inv_freq(32, 10000.0, 2.0, 64, 0.0), "low_freq_factor is 0.0"),
    (lambda: llama3_inv_freq(32, 10000.0, 2.0, 64, 1.0, 0.0), "high_freq_factor is 0.0"),
    (lambda: llama3_inv_freq(0, 10000.0, 2.0, 64), "head_dim is 0"),
    (lambda: llama3_inv_freq(32, 0.0, 2.0, 64), "base is 0.0"),
    (lambda: yarn_inv_freq(32, 10000.0, 0.5, 64), "factor is 0.5"),
    (lambda: yarn_inv_freq(32, 10000.0, 2.0, 0), "original_context is 0"),
    (lambda: yarn_inv_freq(0, 10000.0, 2.0, 64), "head_dim is 0"),
    (lambda: yarn_inv_freq(32, -1.0, 2.0, 64), "base is -1.0"),
])
def test_scaling_arguments_are_checked_by_name(call, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        call()


@pytest.mark.parametrize("scaling", [llama3_inv_freq, yarn_inv_freq])
def test_an_infinite_factor_is_refused(scaling):
    with pytest.raises(ValueError, match=full("factor is inf, expected a number in [1, inf)")):
        scaling(32, 10000.0, math.inf, 64)


def test_llama3_needs_high_above_low_and_accepts_factor_one():
    with pytest.raises(ValueError, match=full("high_freq_factor is 2.0, expected more than low_freq_factor = 2.0")):
        llama3_inv_freq(32, 10000.0, 2.0, 64, 2.0, 2.0)
    torch.testing.assert_close(llama3_inv_freq(32, 10000.0, 1.0, 64), _inv(32, 10000.0), atol=0, rtol=1e-12)


def test_append_refuses_another_dtype_instead_of_casting_it():
    cache = RingKVCache(1, 2, 3, 4)
    k64 = torch.randn(1, 2, 1, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match=full("k is torch.float64, expected a tensor of the cache's dtype torch.float32")):
        cache.append(k64, k64.float())                                   # was rounded to float32 silently
    with pytest.raises(TypeError, match=full("v is torch.float64, expected a tensor of the cache's dtype torch.float32")):
        cache.append(k64.float(), k64)
    with pytest.raises(TypeError, match=full("k is list, expected a tensor of the cache's dtype torch.float32")):
        cache.append([0.0] * 4, k64.float())                             # was an AttributeError
    assert cache.length == 0


@pytest.mark.parametrize("position, name", list(enumerate(["q", "k", "v", "q_weight", "k_weight", "mask"])))
def test_qk_norm_attention_names_an_argument_that_is_not_a_tensor(position, name):
    args = [torch.randn(1, 2, 4, 8)] * 3 + [torch.ones(8)] * 2 + [torch.ones(4, 4, dtype=torch.bool)]
    args[position] = args[position].tolist()                             # was an AttributeError
    with pytest.raises(TypeError, match=full(f"{name} is a list, expected a torch.Tensor")):
        qk_norm_attention(*args)


@pytest.mark.parametrize("scaling", [llama3_inv_freq, yarn_inv_freq])
def test_an_odd_head_dim_is_refused(scaling):
    """RoPE turns pairs: 7 features gave 4 frequencies (llama3) or a shape error (yarn)."""
    with pytest.raises(ValueError, match=full("head_dim is 7, expected an even number for RoPE")):
        scaling(7, 10000.0, 2.0, 64)
