"""helpers.model.deepseek, exactly:

Without transformers (tests/model/test_mla.py compares with it): the config's defaults and checks,
a block and the model against their parts composed by hand, the sizes read from a
DeepseekV3Config-shaped object, the loader against a state dict written here under
DeepSeek's names (every weight lands where it should, the RoPE rows de-interleaved exactly,
a missing or misshapen weight named), every error in full.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from shared_tools import full

from helpers.model.deepseek import (
    DeepSeekBlock,
    DeepSeekConfig,
    DeepSeekGPT,
    _deinterleave,
    config_from_deepseek_v3,
    from_deepseek_v3,
)
from helpers.model.layers import SwiGLUFeedForward
from helpers.model.moe import MoELayer

SMALL = dict(vocab_size=30, context_length=12, n_layers=3, d_model=16, n_heads=2, kv_rank=6, q_rank=0,
             rope_dim=4, nope_dim=6, v_dim=5, mlp_hidden=24, n_dense=1, n_experts=4, top_k=2,
             expert_hidden=8, n_shared=2, routed_scale=1.5, n_group=2, topk_group=1,
             rope_base=500.0, norm_eps=1e-5)


def test_the_config_defaults():
    c = DeepSeekConfig()
    assert (c.vocab_size, c.context_length, c.n_layers, c.d_model, c.n_heads) == (64, 64, 2, 64, 4)
    assert (c.kv_rank, c.q_rank, c.rope_dim, c.nope_dim, c.v_dim) == (16, 0, 8, 16, 16)
    assert (c.mlp_hidden, c.n_dense, c.n_experts, c.top_k, c.expert_hidden, c.n_shared) == (128, 1, 8, 2, 32, 1)
    assert (c.routed_scale, c.n_group, c.topk_group, c.rope_base, c.norm_eps) == (2.5, 1, 1, 10000.0, 1e-6)


@pytest.mark.parametrize("name", ["vocab_size", "context_length", "n_layers", "mlp_hidden", "n_experts",
                                  "top_k", "expert_hidden"])
def test_the_config_checks_its_sizes_by_name(name):
    with pytest.raises(ValueError, match=full(f"{name} is 0, expected a positive int")):
        DeepSeekConfig(**{name: 0})


@pytest.mark.parametrize("name", ["n_dense", "n_shared"])
def test_n_dense_and_n_shared_may_be_zero_not_negative(name):
    assert getattr(DeepSeekConfig(**{name: 0}), name) == 0
    with pytest.raises(ValueError, match=full(f"{name} is -1, expected an int >= 0")):
        DeepSeekConfig(**{name: -1})


def test_a_moe_block_is_deepseeks_router_with_the_configs_sizes():
    config = DeepSeekConfig(**SMALL)
    block = DeepSeekBlock(config, dense=False)
    mlp = block.mlp
    assert isinstance(mlp, MoELayer)
    assert (mlp.d_model, mlp.n_experts, mlp.top_k, mlp.experts.hidden) == (16, 4, 2, 8)
    assert (mlp.mode, mlp.normalize, mlp.balance, mlp.bias_rate, mlp.routed_scale) == ("sigmoid", True, "bias", 0.0, 1.5)
    assert (mlp.n_group, mlp.topk_group, mlp.capacity_factor) == (2, 1, None)
    assert mlp.shared.gate.out_features == 8 * 2 and mlp.shared.d_model == 16
    attn = block.attn
    assert (attn.d_model, attn.n_heads, attn.kv_rank, attn.rope_dim, attn.nope_dim, attn.v_dim, attn.q_rank) == \
        (16, 2, 6, 4, 6, 5, 0)
    assert attn.kv_a_norm.eps == block.norm1.eps == block.norm2.eps == 1e-5
    assert block.norm1.d_model == block.norm2.d_model == 16
    dense = DeepSeekBlock(config, dense=True).mlp
    assert isinstance(dense, SwiGLUFeedForward) and dense.gate.out_features == 24 and dense.d_model == 16
    assert DeepSeekBlock(DeepSeekConfig(**SMALL | {"q_rank": 7}), dense=True).attn.q_rank == 7


def test_a_block_is_two_residual_sublayers():
    torch.manual_seed(0)
    config = DeepSeekConfig(**SMALL)
    model = DeepSeekGPT(config)
    block = model.blocks[1]
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(1.0 if p.dim() == 1 else 0.0, 0.3)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        for absorbed in (False, True):
            h = block.norm1(x)
            attn = block.attn.forward_absorbed(h, model.rope)[0] if absorbed else block.attn(h, model.rope)
            y = x + attn
            expected = y + block.mlp(block.norm2(y))
            torch.testing.assert_close(block(x, model.rope, absorbed), expected, atol=1e-6, rtol=0)
        assert torch.equal(block(x, model.rope), block(x, model.rope, False))


def test_the_model_is_embedding_blocks_norm_head():
    torch.manual_seed(1)
    config = DeepSeekConfig(**SMALL)
    model = DeepSeekGPT(config).eval()
    assert [isinstance(b.mlp, MoELayer) for b in model.blocks] == [False, True, True]   # n_dense = 1
    assert model.embed.weight.shape == (30, 16) and model.lm_head.weight.shape == (30, 16)
    assert model.lm_head.bias is None and model.norm.eps == 1e-5 and model.norm.d_model == 16
    assert model.rope.n_positions == 12 and model.rope.head_dim == 4
    angle = torch.tensor(3 * 500.0 ** (-2 / 4))                        # position 3, pair 1, base 500
    torch.testing.assert_close(model.rope.cos[3, 1], angle.cos())
    ids = torch.randint(0, 30, (2, 12))
    with torch.no_grad():
        x = model.embed(ids)
        for block in model.blocks:
            x = block(x, model.rope)
        expected = model.lm_head(model.norm(x))
        torch.testing.assert_close(model(ids), expected, atol=0, rtol=0)
        torch.testing.assert_close(model(ids, absorbed=True), expected, atol=1e-5, rtol=1e-5)
        x = model.embed(ids[:, :1])
        for block in model.blocks:
            x = block(x, model.rope, True)
        torch.testing.assert_close(model(ids[:, :1], absorbed=True), model.lm_head(model.norm(x)), atol=0, rtol=0)


@pytest.mark.parametrize("shape", [(2, 13), (2, 0), (12,)])
def test_the_model_names_a_bad_length_in_full(shape):
    model = DeepSeekGPT(DeepSeekConfig(**SMALL))
    with pytest.raises(ValueError, match=full(f"token_ids has shape {shape}, expected (B, N) with 1 <= N <= 12")):
        model(torch.zeros(shape, dtype=torch.long))
    with pytest.raises(ValueError, match="token_ids"):
        model(torch.full((1, 3), 30))                                    # past the vocabulary


# --- the sizes of a transformers config ----------------------------------------------------------

def _hf(**changes):
    fields = dict(vocab_size=31, max_position_embeddings=33, num_hidden_layers=3, hidden_size=40,
                  num_attention_heads=5, kv_lora_rank=7, q_lora_rank=9, qk_rope_head_dim=6,
                  qk_nope_head_dim=11, v_head_dim=13, intermediate_size=70, first_k_dense_replace=2,
                  n_routed_experts=12, num_experts_per_tok=3, moe_intermediate_size=17,
                  n_shared_experts=2, routed_scaling_factor=2, rms_norm_eps=1e-5, n_group=4,
                  topk_group=2, norm_topk_prob=True, rope_parameters={"rope_theta": 5000.0})
    return SimpleNamespace(**(fields | changes))


def test_config_from_deepseek_v3_reads_every_size():
    c = config_from_deepseek_v3(_hf())
    assert c == DeepSeekConfig(vocab_size=31, context_length=33, n_layers=3, d_model=40, n_heads=5, kv_rank=7,
                               q_rank=9, rope_dim=6, nope_dim=11, v_dim=13, mlp_hidden=70, n_dense=2,
                               n_experts=12, top_k=3, expert_hidden=17, n_shared=2, routed_scale=2.0,
                               n_group=4, topk_group=2, rope_base=5000.0, norm_eps=1e-5)
    assert isinstance(c.routed_scale, float) and isinstance(c.rope_base, float)


def test_config_from_deepseek_v3_fills_the_absent_ones():
    c = config_from_deepseek_v3(_hf(q_lora_rank=None, n_group=None, topk_group=None, rope_parameters=None))
    assert (c.q_rank, c.n_group, c.topk_group, c.rope_base) == (0, 1, 1, 10000.0)
    hf = _hf()
    del hf.rope_parameters
    assert config_from_deepseek_v3(hf).rope_base == 10000.0
    assert config_from_deepseek_v3(_hf(rope_parameters={})).rope_base == 10000.0
    with pytest.raises(ValueError, match=full("norm_topk_prob is False, expected True (DeepSeek-V3's setting)")):
        config_from_deepseek_v3(_hf(norm_topk_prob=False))


# --- the loader ------------------------------------------------------------------------------------

def test_deinterleave_by_hand():
    w = torch.arange(12.0)[:, None].repeat(1, 2)                         # row i holds i
    out = _deinterleave(w, 2, 6, 4)                                      # groups of 6, last 4 rope rows
    assert out[:, 0].tolist() == [0, 1, 2, 4, 3, 5, 6, 7, 8, 10, 9, 11]
    assert out.shape == (12, 2) and w[:, 0].tolist() == list(range(12))  # the input is left alone


def _their_state(model, config, interleave):
    """The state dict a DeepseekV3ForCausalLM would hold for our model's weights: DeepSeek's names,
    gate and up fused, the RoPE rows interleaved (the inverse of _deinterleave) when asked."""
    def interleave_rows(w, n_groups, width, rope_dim):
        w = w.reshape(n_groups, width, -1).clone()
        rope = w[:, width - rope_dim:].clone()
        w[:, width - rope_dim::2], w[:, width - rope_dim + 1::2] = rope[:, :rope_dim // 2], rope[:, rope_dim // 2:]
        return w.reshape(n_groups * width, -1)
    c, ours = config, {k: v.detach().clone() for k, v in model.state_dict().items()}
    sd = {"model.embed_tokens.weight": ours["embed.weight"], "model.norm.weight": ours["norm.weight"],
          "lm_head.weight": ours["lm_head.weight"]}
    for i in range(c.n_layers):
        p, b = f"model.layers.{i}.", f"blocks.{i}."
        sd[p + "input_layernorm.weight"] = ours[b + "norm1.weight"]
        sd[p + "post_attention_layernorm.weight"] = ours[b + "norm2.weight"]
        attn = {"kv_a_proj_with_mqa": "kv_a", "kv_a_layernorm": "kv_a_norm", "kv_b_proj": "kv_b", "o_proj": "o_proj"}
        attn |= {"q_a_proj": "q_a", "q_a_layernorm": "q_a_norm", "q_b_proj": "q_b"} if c.q_rank else {"q_proj": "q_proj"}
        for theirs, mine in attn.items():
            sd[f"{p}self_attn.{theirs}.weight"] = ours[f"{b}attn.{mine}.weight"]
        if interleave:
            q = f"{p}self_attn.{'q_b_proj' if c.q_rank else 'q_proj'}.weight"
            sd[q] = interleave_rows(sd[q], c.n_heads, c.nope_dim + c.rope_dim, c.rope_dim)
            kv = f"{p}self_attn.kv_a_proj_with_mqa.weight"
            sd[kv] = interleave_rows(sd[kv], 1, c.kv_rank + c.rope_dim, c.rope_dim)
        if i < c.n_dense:
            for name in ("gate", "up", "down"):
                sd[f"{p}mlp.{name}_proj.weight"] = ours[f"{b}mlp.{name}.weight"]
            continue
        sd[p + "mlp.gate.weight"] = ours[b + "mlp.router.weight"]
        sd[p + "mlp.gate.e_score_correction_bias"] = ours[b + "mlp.bias"]
        sd[p + "mlp.experts.gate_up_proj"] = torch.cat([ours[b + "mlp.experts.gate"], ours[b + "mlp.experts.up"]], 1)
        sd[p + "mlp.experts.down_proj"] = ours[b + "mlp.experts.down"]
        for name in ("gate", "up", "down"):
            sd[f"{p}mlp.shared_experts.{name}_proj.weight"] = ours[f"{b}mlp.shared.{name}.weight"]
    return sd


@pytest.mark.parametrize("q_rank, interleave", [(0, True), (7, True), (7, False), (0, False)])
def test_the_loader_puts_every_weight_back_where_it_came_from(q_rank, interleave):
    torch.manual_seed(2)
    config = DeepSeekConfig(**SMALL | {"q_rank": q_rank})
    source = DeepSeekGPT(config)
    with torch.no_grad():
        for t in list(source.parameters()) + list(source.buffers()):
            t.copy_(torch.randn_like(t))                                   # every weight and the bias distinct
    sd = _their_state(source, config, interleave)
    loaded = from_deepseek_v3(sd, config, interleave) if not interleave else from_deepseek_v3(sd, config)
    theirs = dict(source.named_parameters()) | dict(source.named_buffers())
    for name, t in list(loaded.named_parameters()) + list(loaded.named_buffers()):
        assert torch.equal(t, theirs[name]), name
    assert sd.keys() == _their_state(source, config, interleave).keys()   # the caller's dict untouched
    assert all(torch.equal(t, u) for t, u in zip(sd.values(), _their_state(source, config, interleave).values(), strict=True))


def test_the_loader_names_a_missing_or_misshapen_weight():
    config = DeepSeekConfig(**SMALL)
    sd = _their_state(DeepSeekGPT(config), config, True)
    missing = dict(sd)
    del missing["model.layers.2.mlp.experts.down_proj"]
    with pytest.raises(KeyError, match=re.escape(
            "state_dict has no 'model.layers.2.mlp.experts.down_proj', expected it for blocks.2.mlp.experts.down")):
        from_deepseek_v3(missing, config)
    no_fused = dict(sd)
    del no_fused["model.layers.1.mlp.experts.gate_up_proj"]
    with pytest.raises(KeyError, match=re.escape("model.layers.1.mlp.experts.gate_up_proj.gate")):
        from_deepseek_v3(no_fused, config)
    no_q = dict(sd)
    del no_q["model.layers.0.self_attn.q_proj.weight"]
    with pytest.raises(KeyError, match=re.escape("'model.layers.0.self_attn.q_proj.weight', expected it for blocks.0.attn.q_proj.weight")):
        from_deepseek_v3(no_q, config)
    no_kv = dict(sd)
    del no_kv["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"]
    with pytest.raises(KeyError, match=re.escape(
            "'model.layers.0.self_attn.kv_a_proj_with_mqa.weight', expected it for blocks.0.attn.kv_a.weight")):
        from_deepseek_v3(no_kv, config)
    wrong = dict(sd)
    wrong["model.norm.weight"] = torch.ones(15)
    with pytest.raises(ValueError, match=re.escape("state_dict['model.norm.weight'] has shape (15,), expected (16,) for norm.weight")):
        from_deepseek_v3(wrong, config)
