"""Multi-head latent attention (notebook 12, section 2): the absorbed form equals the naive one,
the latent cache equals a full pass, the cache sizes, and a transformers DeepSeek-V3's logits."""

import importlib.util

import pytest
import torch

from helpers.model.deepseek import DeepSeekConfig, DeepSeekGPT
from helpers.model.mla import DEEPSEEK_V3, LatentAttention, cache_values_per_token
from helpers.model.modern import RopeTable

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _layer(q_rank=0, seed=0):
    torch.manual_seed(seed)
    layer = LatentAttention(d_model=32, n_heads=4, kv_rank=12, rope_dim=4, nope_dim=8, v_dim=6,
                            q_rank=q_rank)
    return layer, RopeTable.build(4, 16)


@pytest.mark.parametrize("q_rank", [0, 16])
def test_absorbed_equals_naive(q_rank):
    layer, table = _layer(q_rank)
    x = torch.randn(2, 10, 32)
    absorbed, (c, k_rope) = layer.forward_absorbed(x, table)
    torch.testing.assert_close(absorbed, layer(x, table), atol=1e-5, rtol=1e-4)
    assert c.shape == (2, 10, 12) and k_rope.shape == (2, 10, 4)


def test_latent_cache_token_by_token_equals_a_full_pass():
    layer, table = _layer()
    x = torch.randn(1, 9, 32)
    cache, steps = None, []
    for t in range(9):
        out, cache = layer.forward_absorbed(x[:, t:t + 1], table, cache)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), layer(x, table), atol=1e-5, rtol=1e-4)


def test_cache_values_follow_deepseek_v2s_table():
    d_h, layers = DEEPSEEK_V3["head_dim"], DEEPSEEK_V3["n_layers"]
    assert cache_values_per_token("mha", DEEPSEEK_V3) == 2 * 128 * d_h * layers
    assert cache_values_per_token("gqa", DEEPSEEK_V3, n_groups=8) == 2 * 8 * d_h * layers
    assert cache_values_per_token("mqa", DEEPSEEK_V3) == 2 * d_h * layers
    assert cache_values_per_token("mla", DEEPSEEK_V3) == 4.5 * d_h * layers  # (d_c + d_R) = 9/2 d_h


def test_absorbed_model_equals_naive_model():
    torch.manual_seed(0)
    model = DeepSeekGPT(DeepSeekConfig()).eval()
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, absorbed=True), model(ids), atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")
@pytest.mark.parametrize("q_rank, interleave, groups", [(None, True, (1, 1)), (24, True, (1, 1)),
                                                        (24, False, (1, 1)), (24, True, (3, 2)),
                                                        (None, True, (3, 1))])
def test_deepseek_v3_logits_equal_transformers(q_rank, interleave, groups):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from helpers.model.deepseek import config_from_deepseek_v3, from_deepseek_v3
    torch.manual_seed(0)
    hf_config = DeepseekV3Config(
        vocab_size=50, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=6,
        n_shared_experts=1, num_experts_per_tok=2, n_group=groups[0], topk_group=groups[1], first_k_dense_replace=1,
        kv_lora_rank=12, q_lora_rank=q_rank, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
        max_position_embeddings=32, rope_interleave=interleave)
    hf = DeepseekV3ForCausalLM(hf_config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.normal_(1, 0.1)
        for name, buffer in hf.named_buffers():
            if "bias" in name:
                buffer.normal_(0, 0.1)
    ids = torch.randint(0, 50, (2, 12))
    ours = from_deepseek_v3(hf.state_dict(), config_from_deepseek_v3(hf_config), interleave).eval()
    with torch.no_grad():
        expected = hf(ids).logits
        torch.testing.assert_close(ours(ids), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours(ids, absorbed=True), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("call, message", [
    (lambda: LatentAttention(32, 4, 32, 4, 8, 8), "kv_rank is 32, expected less than d_model = 32"),
    (lambda: LatentAttention(32, 4, 40, 4, 8, 8), "kv_rank is 40"),
    (lambda: LatentAttention(32, 4, 8, 3, 8, 8), "rope_dim is 3"),
    (lambda: LatentAttention(32, 4, 8, 4, 8, 8, q_rank=64), "q_rank is 64"),
    (lambda: LatentAttention(32, 0, 8, 4, 8, 8), "n_heads is 0"),
    (lambda: cache_values_per_token("mha", {}), "config has no"),
    (lambda: cache_values_per_token("mla2", DEEPSEEK_V3), "kind is 'mla2'"),
    (lambda: _layer()[0].latent(torch.randn(1, 3, 31), _layer()[1]), "x has shape"),
])
def test_bad_input_raises_a_clear_error(call, message):
    with pytest.raises((ValueError, TypeError, KeyError), match=message):
        call()


@pytest.mark.parametrize("make_cache, error, message", [
    (lambda c, k: [c, k], TypeError, "cache is list"),
    (lambda c, k: (c,), TypeError, "cache is tuple"),
    (lambda c, k: (c[:, :, :-1], k), ValueError, r"cache\[0\] \(c\) has shape \(2, 5, 11\)"),
    (lambda c, k: (c, k[:, :-1]), ValueError, r"cache\[1\] \(k_rope\) has shape \(2, 4, 4\)"),
    (lambda c, k: (c[:1], k[:1]), ValueError, r"expected \(2, M0, 12\)"),
    (lambda c, k: (c.double(), k.double()), ValueError, "dtype torch.float64"),
])
def test_a_cache_that_forward_absorbed_did_not_return_is_refused(make_cache, error, message):
    layer, table = _layer()
    x = torch.randn(2, 5, layer.d_model)
    with torch.no_grad():
        _, (c, k_rope) = layer.forward_absorbed(x, table)
        with pytest.raises(error, match=message):
            layer.forward_absorbed(x[:, :1], table, make_cache(c, k_rope))


def test_a_cache_past_the_rope_table_is_refused():
    layer, table = _layer()
    x = torch.randn(1, table.n_positions, layer.d_model)
    with torch.no_grad():
        _, cache = layer.forward_absorbed(x, table)
        with pytest.raises(ValueError, match=f"holds {table.n_positions} tokens and x adds 1"):
            layer.forward_absorbed(x[:, :1], table, cache)
