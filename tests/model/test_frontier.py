"""helpers.model.frontier, exactly:

The attention against a float64 reference written here (GQA, QK-norm, RoPE by its angles, the
banded mask), a token outside the window changing nothing bit for bit, the RoPE table with
each scaling, the model's init, devices and dtypes, every config field reaching its layer, the
parameter count, the Qwen3-MoE sizes and loader without transformers, every error in full.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
import torch
from shared_tools import full

from helpers.model.frontier import (
    FrontierAttention,
    FrontierBlock,
    FrontierConfig,
    FrontierGPT,
    config_from_qwen3_moe,
    from_qwen3_moe,
    rope_table,
    total_and_active_parameters,
)
from helpers.model.layers import SwiGLUFeedForward
from helpers.model.moe import MoELayer
from helpers.model.sliding import llama3_inv_freq, yarn_inv_freq

SMALL = dict(vocab_size=20, context_length=10, n_layers=2, n_heads=4, n_kv_heads=2, d_model=16, mlp_hidden=24)


# --- attention against a float64 reference -------------------------------------------------------

def _rope(x, position, table):
    """Rotate-half RoPE of one vector by the table's row `position` (cos, sin of each pair)."""
    half = x.shape[0] // 2
    cos, sin = table.cos[position].double(), table.sin[position].double()
    a, b = x[:half], x[half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin])


def _norm(x, gain, eps):
    return x / torch.sqrt((x * x).mean() + eps) * gain


def attention_reference(attn, x, table, window, qk_norm, eps=1e-6):
    b, n, _ = x.shape
    d_h = attn.q_proj.weight.shape[0] // attn.n_heads
    group = attn.n_heads // attn.n_kv_heads
    out = torch.zeros(b, n, attn.n_heads * d_h, dtype=torch.float64)
    for i in range(b):
        q_all, k_all, v_all = (x[i] @ proj.weight.T for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        for h in range(attn.n_heads):
            g = h // group                                              # its key/value head
            qs = [q_all[t, h * d_h:(h + 1) * d_h] for t in range(n)]
            ks = [k_all[t, g * d_h:(g + 1) * d_h] for t in range(n)]
            if qk_norm:
                qs = [_norm(q, attn.q_norm, eps) for q in qs]
                ks = [_norm(k, attn.k_norm, eps) for k in ks]
            qs = [_rope(q, t, table) for t, q in enumerate(qs)]
            ks = [_rope(k, t, table) for t, k in enumerate(ks)]
            for t in range(n):
                seen = [s for s in range(n) if s <= t and (not window or s > t - window)]
                scores = torch.stack([qs[t] @ ks[s] for s in seen]) / math.sqrt(d_h)
                p = torch.softmax(scores, 0)
                out[i, t, h * d_h:(h + 1) * d_h] = sum(p[j] * v_all[s, g * d_h:(g + 1) * d_h] for j, s in enumerate(seen))
    return out @ attn.o_proj.weight.T


@pytest.mark.parametrize("window, qk_norm, head_dim", [(0, False, None), (3, True, None), (2, True, 6)])
def test_attention_equals_the_reference(window, qk_norm, head_dim):
    torch.manual_seed(0)
    config = FrontierConfig(**SMALL | {"qk_norm": qk_norm, "head_dim": head_dim, "norm_eps": 0.01})
    attn = FrontierAttention(config, window).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn_like(p) * 0.4 + (1.0 if p.dim() == 1 else 0.0))
    table = rope_table(config, 6)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    out = attn(x, table)
    torch.testing.assert_close(out, attention_reference(attn, x, table, window, qk_norm, eps=0.01), atol=1e-10, rtol=1e-10)
    assert attn.last_max_logit > 0 and isinstance(attn.last_max_logit, float)


def test_last_max_logit_is_the_largest_unmasked_or_masked_score():
    torch.manual_seed(1)
    config = FrontierConfig(**SMALL)
    attn = FrontierAttention(config, 2).double()
    table = rope_table(config, 5)
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    attn(x, table)
    from helpers.model.modern import rope_rotate_half
    from helpers.model.multihead import split_heads
    q = rope_rotate_half(split_heads(attn.q_proj(x), 4), table)
    k = rope_rotate_half(split_heads(attn.k_proj(x), 2), table).repeat_interleave(2, dim=1)
    assert attn.last_max_logit == pytest.approx(float((q @ k.transpose(-2, -1)).detach().abs().max() / 2), rel=1e-12)
    assert FrontierAttention(config).last_max_logit == 0.0


def test_attention_layers_have_the_configs_sizes():
    config = FrontierConfig(**SMALL | {"head_dim": 6, "qk_norm": True, "norm_eps": 0.25})
    attn = FrontierAttention(config, 3)
    assert attn.q_proj.weight.shape == (24, 16) and attn.k_proj.weight.shape == attn.v_proj.weight.shape == (12, 16)
    assert attn.o_proj.weight.shape == (16, 24)
    assert all(m.bias is None for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj))
    assert torch.equal(attn.q_norm, torch.ones(6)) and torch.equal(attn.k_norm, torch.ones(6))
    assert (attn.window, attn.n_heads, attn.n_kv_heads, attn.eps) == (3, 4, 2, 0.25)
    plain = FrontierAttention(FrontierConfig(**SMALL))
    assert plain.q_norm is None and plain.k_norm is None and plain.window == 0


# --- the window, bit for bit ----------------------------------------------------------------------

def test_a_token_outside_every_window_changes_nothing_bit_for_bit():
    torch.manual_seed(3)
    model = FrontierGPT(FrontierConfig(**SMALL | {"n_layers": 2, "window": 3, "local_per_global": 2})).eval()
    assert model.config.kinds() == ["local", "local"]
    ids = torch.randint(0, 20, (1, 10))
    changed = ids.clone()
    changed[0, 1] = (ids[0, 1] + 7) % 20
    with torch.no_grad():
        a, b = model(ids), model(changed)
    # two local layers of window 3: token 1 reaches positions 1 .. 1 + 2 + 2 = 5 and no further
    assert torch.equal(a[0, :1], b[0, :1]) and torch.equal(a[0, 6:], b[0, 6:])
    assert not torch.equal(a[0, 5], b[0, 5]) and not torch.equal(a[0, 1], b[0, 1])


def test_the_pattern_gives_local_layers_the_window_and_global_ones_none():
    model = FrontierGPT(FrontierConfig(**SMALL | {"n_layers": 4, "window": 3, "local_per_global": 1}))
    assert [block.attn.window for block in model.blocks] == [3, 0, 3, 0]
    config = FrontierConfig(**SMALL | {"n_layers": 7, "window": 2})
    assert config.kinds() == ["local"] * 5 + ["global", "local"]           # 5 per global by default
    assert FrontierConfig(**SMALL | {"n_layers": 3}).kinds() == ["global"] * 3


# --- the RoPE table --------------------------------------------------------------------------------

def test_rope_table_with_each_scaling():
    base = dict(SMALL, rope_base=500.0, original_context=8)
    plain = rope_table(FrontierConfig(**base), 7)
    angles = torch.arange(7.0)[:, None] * 500.0 ** (-torch.arange(0, 4, 2.0) / 4)
    torch.testing.assert_close(plain.cos, angles.cos()) and torch.testing.assert_close(plain.sin, angles.sin())
    assert plain.cos.dtype == torch.float32 and plain.cos.shape == (7, 2)
    llama = rope_table(FrontierConfig(**base | {"rope_scaling": "llama3", "rope_factor": 4.0}), 7)
    angles = torch.outer(torch.arange(7, dtype=torch.float64), llama3_inv_freq(4, 500.0, 4.0, 8))
    torch.testing.assert_close(llama.cos, angles.cos().float()) and torch.testing.assert_close(llama.sin, angles.sin().float())
    yarn = rope_table(FrontierConfig(**base | {"rope_scaling": "yarn", "rope_factor": 4.0}), 7)
    inv, scale = yarn_inv_freq(4, 500.0, 4.0, 8)
    angles = torch.outer(torch.arange(7, dtype=torch.float64), inv)
    assert scale > 1
    torch.testing.assert_close(yarn.cos, (angles.cos() * scale).float())
    torch.testing.assert_close(yarn.sin, (angles.sin() * scale).float())


def test_the_config_defaults():
    c = FrontierConfig(mlp_hidden=8)
    assert (c.vocab_size, c.context_length, c.n_layers, c.n_heads, c.n_kv_heads, c.d_model) == (64, 64, 2, 4, 2, 64)
    assert (c.head_dim, c.resolved_head_dim, c.n_experts, c.top_k, c.expert_hidden) == (None, 16, 0, 2, 32)
    assert (c.router_mode, c.normalize_topk, c.capacity_factor, c.balance) == ("softmax_topk", False, None, "none")
    assert (c.aux_coef, c.bias_rate, c.qk_norm, c.window, c.local_per_global) == (0.01, 1e-3, False, 0, 5)
    assert (c.rope_base, c.rope_scaling, c.rope_factor, c.original_context, c.norm_eps) == (10000.0, None, 1.0, 64, 1e-6)
    assert FrontierConfig(mlp_hidden=8, head_dim=10).resolved_head_dim == 10


# --- blocks, the model ---------------------------------------------------------------------------

def test_every_moe_field_reaches_the_layer():
    config = FrontierConfig(**SMALL | {"n_experts": 6, "top_k": 3, "expert_hidden": 5, "router_mode": "sigmoid",
                                       "normalize_topk": True, "capacity_factor": 1.5, "balance": "bias",
                                       "aux_coef": 0.2, "bias_rate": 0.3, "mlp_hidden": 7})
    mlp = FrontierBlock(config).mlp
    assert isinstance(mlp, MoELayer)
    assert (mlp.d_model, mlp.n_experts, mlp.top_k, mlp.experts.hidden) == (16, 6, 3, 5)
    assert (mlp.mode, mlp.normalize, mlp.capacity_factor, mlp.balance, mlp.aux_coef, mlp.bias_rate) == \
        ("sigmoid", True, 1.5, "bias", 0.2, 0.3)
    assert mlp.shared.gate.out_features == 7
    assert FrontierBlock(FrontierConfig(**SMALL | {"n_experts": 6, "mlp_hidden": 0})).mlp.shared is None
    dense = FrontierBlock(FrontierConfig(**SMALL)).mlp
    assert FrontierBlock(FrontierConfig(**SMALL)).attn.window == 0          # global unless told
    assert isinstance(dense, SwiGLUFeedForward) and dense.gate.out_features == 24


def test_a_block_is_two_residual_sublayers_with_the_configs_eps():
    torch.manual_seed(4)
    config = FrontierConfig(**SMALL | {"norm_eps": 0.5})
    block = FrontierBlock(config, window=2)
    assert block.norm1.eps == block.norm2.eps == 0.5 and block.attn.window == 2
    with torch.no_grad():
        block.norm1.weight.normal_(1, 0.3)
        block.norm2.weight.normal_(1, 0.3)
    table = rope_table(config, 5)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        y = x + block.attn(block.norm1(x), table)
        torch.testing.assert_close(block(x, table), y + block.mlp(block.norm2(y)), atol=0, rtol=0)


def test_the_model_initialises_matrices_at_002_and_norms_at_one():
    torch.manual_seed(5)
    model = FrontierGPT(FrontierConfig(**SMALL | {"vocab_size": 200, "d_model": 64, "n_heads": 4, "mlp_hidden": 128}))
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            assert 0.018 < p.std().item() < 0.022 and abs(p.mean().item()) < 2e-3, name
        else:
            assert torch.equal(p, torch.ones_like(p)), name
    assert model.lm_head.bias is None and model.norm.eps == 1e-6 and model.rope.n_positions == 10
    assert model.moe_layers() == []


def test_the_model_is_embedding_blocks_norm_head():
    torch.manual_seed(6)
    model = FrontierGPT(FrontierConfig(**SMALL | {"n_experts": 4, "n_layers": 2})).eval()
    assert model.moe_layers() == [model.blocks[0].mlp, model.blocks[1].mlp]
    ids = torch.randint(0, 20, (2, 7))
    with torch.no_grad():
        table = rope_table(model.config, 7)
        x = model.embed(ids)
        for block in model.blocks:
            x = block(x, table)
        torch.testing.assert_close(model(ids), model.lm_head(model.norm(x)), atol=0, rtol=0)


def test_past_the_context_the_table_is_rebuilt_with_the_scaling():
    torch.manual_seed(7)
    config = FrontierConfig(**SMALL | {"rope_scaling": "yarn", "rope_factor": 2.0, "original_context": 4})
    model = FrontierGPT(config).eval()
    ids = torch.randint(0, 20, (1, 13))                                 # context_length is 10
    with torch.no_grad():
        table = rope_table(config, 13)
        x = model.embed(ids)
        for block in model.blocks:
            x = block(x, table)
        torch.testing.assert_close(model(ids), model.lm_head(model.norm(x)), atol=0, rtol=0)
        torch.testing.assert_close(model(ids[:, :10]), model(ids)[:, :10], atol=1e-6, rtol=0)
    assert model.rope.n_positions == 10                                  # the stored table is kept


def test_the_rope_table_follows_the_models_dtype():
    torch.manual_seed(8)
    model = FrontierGPT(FrontierConfig(**SMALL)).double()
    assert model.rope.cos.dtype == model.rope.sin.dtype == torch.float64
    ids = torch.randint(0, 20, (1, 12))
    assert model(ids).dtype == torch.float64                            # past the context too
    assert model.to("meta").rope.sin.device.type == "meta"


def test_the_final_norm_takes_the_configs_eps():
    assert FrontierGPT(FrontierConfig(**SMALL | {"norm_eps": 0.125})).norm.eps == 0.125


def test_to_empty_without_recursion_leaves_the_submodules_weights_alone():
    torch.manual_seed(10)
    model = FrontierGPT(FrontierConfig(**SMALL))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.to_empty(device="cpu", recurse=False)                          # the model itself holds no parameter
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name


def test_the_stored_table_is_used_up_to_its_length():
    """A table long enough is the model's own, not rebuilt: one without rotation (cos 1, sin 0)
    gives the model without RoPE at N = context_length."""
    torch.manual_seed(11)
    model = FrontierGPT(FrontierConfig(**SMALL)).eval()
    from helpers.model.modern import RopeTable
    model.rope = RopeTable(torch.ones(10, 2), torch.zeros(10, 2))
    ids = torch.randint(0, 20, (1, 10))
    with torch.no_grad():
        x = model.embed(ids)
        for block in model.blocks:
            x = block(x, model.rope)
        torch.testing.assert_close(model(ids), model.lm_head(model.norm(x)), atol=0, rtol=0)


def test_a_bfloat16_model_past_its_context_stays_in_bfloat16():
    torch.manual_seed(12)
    model = FrontierGPT(FrontierConfig(**SMALL)).to(torch.bfloat16).eval()
    ids = torch.randint(0, 20, (1, 12))                                  # past context_length = 10
    with torch.no_grad():
        out = model(ids)
        table = rope_table(model.config, 12)
        from helpers.model.modern import RopeTable
        table = RopeTable(table.cos.to(torch.bfloat16), table.sin.to(torch.bfloat16))
        x = model.embed(ids)
        for block in model.blocks:
            x = block(x, table)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, model.lm_head(model.norm(x)), atol=0, rtol=0)


@pytest.mark.parametrize("ids, message", [
    (torch.zeros(2, 0, dtype=torch.long), "token_ids has shape (2, 0), expected (B, N) with N >= 1"),
    (torch.zeros(3, dtype=torch.long), "token_ids has shape (3,), expected (B, N) with N >= 1"),
    ([[1, 2]], "token_ids has shape list, expected (B, N) with N >= 1"),
])
def test_the_model_names_bad_ids_in_full(ids, message):
    with pytest.raises(ValueError, match=full(message)):
        FrontierGPT(FrontierConfig(**SMALL))(ids)


# --- counting -------------------------------------------------------------------------------------

def test_total_and_active_parameters_count_k_of_e_experts():
    model = FrontierGPT(FrontierConfig(**SMALL | {"n_experts": 5, "top_k": 2, "expert_hidden": 3, "mlp_hidden": 4}))
    total, active = total_and_active_parameters(model)
    assert total == sum(p.numel() for p in model.parameters())
    assert type(total) is int and type(active) is int                   # counts, not floats
    experts = 3 * 5 * 3 * 16                                            # gate, up, down of 5 experts
    assert total - active == 2 * (experts * 3 // 5)                     # 3 of 5 idle per layer
    dense = FrontierGPT(FrontierConfig(**SMALL))
    assert total_and_active_parameters(dense) == (sum(p.numel() for p in dense.parameters()),) * 2
    with pytest.raises(TypeError, match=full("model is a dict, expected a torch.nn.Module")):
        total_and_active_parameters({})


# --- config errors in full -----------------------------------------------------------------------

@pytest.mark.parametrize("changes, error, message", [
    ({"n_heads": 4, "n_kv_heads": 3}, ValueError, "n_heads=4 is not divisible by n_kv_heads=3"),
    ({"d_model": 18, "n_heads": 4}, ValueError, "d_model=18 is not divisible by n_heads=4: give head_dim"),
    ({"head_dim": 5}, ValueError, "head_dim is 5, expected an even number for RoPE"),
    ({"d_model": 12, "n_heads": 4, "n_kv_heads": 1}, ValueError, "head_dim is 3, expected an even number for RoPE"),
    ({"mlp_hidden": 0}, ValueError,
     "mlp_hidden is 0 and n_experts is 0, expected one of them positive: the block needs a dense MLP or experts"),
    ({"n_experts": 2, "top_k": 3}, ValueError,
     "top_k is 3, expected at most n_experts = 2: a token cannot be sent to more experts than there are"),
    ({"n_experts": 2, "expert_hidden": 0}, ValueError, "expert_hidden is 0, expected a positive int"),
    ({"n_experts": 2, "router_mode": "soft"}, ValueError, "router_mode is 'soft' ..."),
    ({"mlp_hidden": -1}, ValueError, "mlp_hidden is -1, expected an int >= 0"),
    ({"n_experts": -1}, ValueError, "n_experts is -1, expected an int >= 0"),
    ({"window": -1}, ValueError, "window is -1, expected an int >= 0"),
    ({"rope_scaling": "ntk"}, ValueError, "rope_scaling is 'ntk' ..."),
    ({"rope_factor": 0.5}, ValueError, "rope_factor is 0.5 ..."),
    ({"original_context": 0}, ValueError, "original_context is 0, expected a positive int"),
    ({"rope_factor": math.inf}, ValueError, "rope_factor is inf, expected a number in [1, inf)"),
    ({"qk_norm": 1}, TypeError, "qk_norm is 1 ..."),
    ({"vocab_size": 0}, ValueError, "vocab_size is 0, expected a positive int"),
    ({"context_length": 0}, ValueError, "context_length is 0, expected a positive int"),
    ({"n_layers": 0}, ValueError, "n_layers is 0, expected a positive int"),
    ({"n_heads": 0}, ValueError, "n_heads is 0, expected a positive int"),
    ({"n_kv_heads": 0}, ValueError, "n_kv_heads is 0, expected a positive int"),
    ({"d_model": 0}, ValueError, "d_model is 0, expected a positive int"),
])
def test_config_errors_are_read_in_full(changes, error, message):
    pattern = "^" + re.escape(message[:-4]) if message.endswith(" ...") else full(message)
    with pytest.raises(error, match=pattern):
        FrontierConfig(**SMALL | changes)


def test_accepted_edges_of_the_config():
    FrontierConfig(**SMALL | {"mlp_hidden": 0, "n_experts": 2, "top_k": 2})       # experts alone
    FrontierConfig(**SMALL | {"n_experts": 0, "top_k": 99, "router_mode": "x"})    # unchecked when dense
    FrontierConfig(**SMALL | {"rope_factor": 1.0, "window": 0, "head_dim": 2})
    assert FrontierConfig(**SMALL | {"d_model": 18, "head_dim": 4}).resolved_head_dim == 4   # 18 % 4 is fine with head_dim


# --- Qwen3-MoE sizes and weights without transformers --------------------------------------------

def _hf(**changes):
    fields = dict(vocab_size=21, max_position_embeddings=11, num_hidden_layers=3, num_attention_heads=6,
                  num_key_value_heads=3, hidden_size=16, head_dim=6, num_experts=5, num_experts_per_tok=3,
                  moe_intermediate_size=3, norm_topk_prob=1, rope_parameters={"rope_theta": 300.0},
                  rms_norm_eps=1e-5, mlp_only_layers=[], decoder_sparse_step=1)
    return SimpleNamespace(**(fields | changes))


def test_config_from_qwen3_moe_reads_every_size():
    c = config_from_qwen3_moe(_hf())
    assert c == FrontierConfig(vocab_size=21, context_length=11, n_layers=3, n_heads=6, n_kv_heads=3, d_model=16,
                               head_dim=6, n_experts=5, top_k=3, expert_hidden=3, router_mode="softmax_topk",
                               normalize_topk=True, qk_norm=True, rope_base=300.0, norm_eps=1e-5)
    assert c.normalize_topk is True and isinstance(c.rope_base, float)
    hf = _hf(rope_parameters=None)
    del hf.mlp_only_layers, hf.decoder_sparse_step
    assert config_from_qwen3_moe(hf).rope_base == 10000.0
    del hf.rope_parameters                                               # older configs have none
    assert config_from_qwen3_moe(hf).rope_base == 10000.0
    assert config_from_qwen3_moe(_hf(rope_parameters={})).rope_base == 10000.0


@pytest.mark.parametrize("changes", [{"mlp_only_layers": [1]}, {"decoder_sparse_step": 2}])
def test_config_from_qwen3_moe_refuses_dense_layers(changes):
    with pytest.raises(ValueError, match=full(
            "the Qwen3MoeConfig has dense layers (mlp_only_layers or decoder_sparse_step), expected every "
            "layer to be a MoE layer")):
        config_from_qwen3_moe(_hf(**changes))


def _their_state(model, n_layers):
    ours = {k: v.detach().clone() for k, v in model.state_dict().items()}
    sd = {"model.embed_tokens.weight": ours["embed.weight"], "model.norm.weight": ours["norm.weight"],
          "lm_head.weight": ours["lm_head.weight"]}
    for i in range(n_layers):
        p, b = f"model.layers.{i}.", f"blocks.{i}."
        sd |= {p + "input_layernorm.weight": ours[b + "norm1.weight"],
               p + "post_attention_layernorm.weight": ours[b + "norm2.weight"],
               p + "self_attn.q_norm.weight": ours[b + "attn.q_norm"], p + "self_attn.k_norm.weight": ours[b + "attn.k_norm"],
               p + "mlp.gate.weight": ours[b + "mlp.router.weight"],
               p + "mlp.experts.down_proj": ours[b + "mlp.experts.down"],
               p + "mlp.experts.gate_up_proj": torch.cat([ours[b + "mlp.experts.gate"], ours[b + "mlp.experts.up"]], 1)}
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[f"{p}self_attn.{proj}.weight"] = ours[f"{b}attn.{proj}.weight"]
    return sd


def test_from_qwen3_moe_puts_every_weight_back_where_it_came_from():
    torch.manual_seed(9)
    config = config_from_qwen3_moe(_hf())
    source = FrontierGPT(config)
    with torch.no_grad():
        for p in source.parameters():
            p.copy_(torch.randn_like(p))
    sd = _their_state(source, config.n_layers)
    loaded = from_qwen3_moe(sd, config)
    theirs = dict(source.named_parameters())
    for name, p in loaded.named_parameters():
        assert torch.equal(p, theirs[name]), name
    assert "model.layers.0.mlp.experts.gate_up_proj.gate" not in sd      # the caller's dict untouched
    missing = dict(sd)
    del missing["model.layers.2.mlp.experts.gate_up_proj"]
    with pytest.raises(KeyError, match=re.escape(
            "state_dict has no 'model.layers.2.mlp.experts.gate_up_proj.gate', expected it for blocks.2.mlp.experts.gate")):
        from_qwen3_moe(missing, config)


# --- the bugs the run found: checks that came late or not at all ----------------------------------

def test_attention_checks_x_and_its_window_before_any_work():
    config = FrontierConfig(**SMALL)
    attn, table = FrontierAttention(config), rope_table(config, 3)
    with pytest.raises(ValueError, match=full(
            "x has shape (1, 3, 15), expected (..., 16): the last dimension holds each token's d_model = 16 features")):
        attn(torch.randn(1, 3, 15), table)                               # was torch's "mat1 and mat2"
    with pytest.raises(TypeError, match="^x has dtype torch.float64"):
        attn(torch.randn(1, 3, 16, dtype=torch.float64), table)
    with pytest.raises(ValueError, match=full("window is -1, expected an int >= 0")):
        FrontierAttention(config, -1)                                    # was accepted, failed at forward
    with pytest.raises(ValueError, match=full("window is -2, expected an int >= 0")):
        FrontierBlock(config, -2)


def test_rope_table_names_a_config_of_another_type():
    with pytest.raises(TypeError, match=full("config is a dict, expected a FrontierConfig")):
        rope_table({}, 3)                                                # was an AttributeError
    with pytest.raises(ValueError, match="^n_positions is 0"):
        rope_table(FrontierConfig(**SMALL), 0)


def test_a_model_built_on_meta_then_loaded_has_a_real_rope_table():
    """to_empty gave the table (not a buffer, so not in the state dict) torch.empty_like's
    undefined values: the loaded model answered NaN. The table is now rebuilt from the config."""
    torch.manual_seed(13)
    config = FrontierConfig(**SMALL)
    reference = FrontierGPT(config).eval()
    with torch.device("meta"):
        model = FrontierGPT(config)
    assert model.rope.cos.device.type == "meta"
    model.to_empty(device="cpu")
    model.load_state_dict(reference.state_dict())
    model.eval()
    assert torch.equal(model.rope.cos, reference.rope.cos) and torch.equal(model.rope.sin, reference.rope.sin)
    assert model.rope.n_positions == 10
    ids = torch.randint(0, 20, (2, 10))
    with torch.no_grad():
        assert torch.equal(model(ids), reference(ids))
