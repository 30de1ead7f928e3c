"""Sliding windows, QK-norm and RoPE scaling (notebook 12, sections 3 and 4)."""

import importlib.util

import pytest
import torch

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
