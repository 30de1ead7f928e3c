"""A DeepSeek-V3-shaped decoder: latent attention plus a sigmoid-routed MoE with a shared expert.

Defined in notebook 12, "The decoder of 2025-2026", section 2, to prove `helpers.model.mla` and
`helpers.model.moe` equal to transformers' DeepseekV3ForCausalLM:

    DeepSeekConfig          the sizes (DeepSeek's names where it helps)
    DeepSeekGPT             embedding -> blocks (RMSNorm, LatentAttention, RMSNorm, MLP or MoE)
                            -> RMSNorm -> logits; the first `n_dense` blocks have a dense MLP
    config_from_deepseek_v3, from_deepseek_v3   a transformers model's sizes and weights

Expert groups as DeepSeek-V3 has them (n_group = 8 of which each token reaches topk_group = 4:
a limit on how many nodes a token's hidden state travels to). DeepSeek lays RoPE pairs out interleaved (x0, x1), (x2, x3), ...; the
loader permutes those rows so the course's rotate-half RoPE computes the same scores.
Shapes: B batch, N tokens, V vocabulary, D d_model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.embeddings import check_token_ids
from helpers.model.frontier import copy_named_weights
from helpers.model.layers import SwiGLUFeedForward
from helpers.model.mla import LatentAttention
from helpers.model.modern import RMSNorm, RopeTable
from helpers.model.moe import MoELayer


@dataclass(frozen=True)
class DeepSeekConfig:
    vocab_size: int = 64
    context_length: int = 64
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    kv_rank: int = 16
    q_rank: int = 0
    rope_dim: int = 8
    nope_dim: int = 16
    v_dim: int = 16
    mlp_hidden: int = 128
    n_dense: int = 1
    n_experts: int = 8
    top_k: int = 2
    expert_hidden: int = 32
    n_shared: int = 1
    routed_scale: float = 2.5
    n_group: int = 1
    topk_group: int = 1
    rope_base: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "n_layers", "mlp_hidden", "n_experts",
                     "top_k", "expert_hidden"):
            checks.positive_int(name, getattr(self, name))
        checks.non_negative_int("n_dense", self.n_dense)
        checks.non_negative_int("n_shared", self.n_shared)


class DeepSeekBlock(nn.Module):
    def __init__(self, config: DeepSeekConfig, dense: bool) -> None:
        super().__init__()
        c = config
        self.norm1 = RMSNorm(c.d_model, c.norm_eps)
        self.attn = LatentAttention(c.d_model, c.n_heads, c.kv_rank, c.rope_dim, c.nope_dim,
                                    c.v_dim, c.q_rank, c.norm_eps)
        self.norm2 = RMSNorm(c.d_model, c.norm_eps)
        self.mlp = SwiGLUFeedForward(c.d_model, c.mlp_hidden) if dense else MoELayer(
            c.d_model, c.n_experts, c.top_k, c.expert_hidden, mode="sigmoid", normalize=True,
            shared_hidden=c.expert_hidden * c.n_shared, balance="bias", bias_rate=0.0,
            routed_scale=c.routed_scale, n_group=c.n_group, topk_group=c.topk_group)

    def forward(self, x: Tensor, table: RopeTable, absorbed: bool = False) -> Tensor:
        h = self.norm1(x)
        x = x + (self.attn.forward_absorbed(h, table)[0] if absorbed else self.attn(h, table))
        return x + self.mlp(self.norm2(x))


class DeepSeekGPT(nn.Module):
    """Token ids (B, N) -> logits (B, N, V); absorbed=True runs every attention in its absorbed form."""

    def __init__(self, config: DeepSeekConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(DeepSeekBlock(config, i < config.n_dense)
                                    for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.rope = RopeTable.build(config.rope_dim, config.context_length, config.rope_base)

    def forward(self, token_ids: Tensor, absorbed: bool = False) -> Tensor:
        check_token_ids(token_ids, self.config.vocab_size)
        checks.tensor_shape("token_ids", token_ids, (None, range(1, self.config.context_length + 1)),
                            f"(B, N) with 1 <= N <= {self.config.context_length}")
        x = self.embed(token_ids)
        for block in self.blocks:
            x = block(x, self.rope, absorbed)
        return self.lm_head(self.norm(x))


def config_from_deepseek_v3(hf) -> DeepSeekConfig:
    """A DeepSeekConfig with the sizes of a `transformers.DeepseekV3Config`."""
    if not hf.norm_topk_prob:
        raise ValueError("norm_topk_prob is False, expected True (DeepSeek-V3's setting)")
    theta = (getattr(hf, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return DeepSeekConfig(
        vocab_size=hf.vocab_size, context_length=hf.max_position_embeddings,
        n_layers=hf.num_hidden_layers, d_model=hf.hidden_size, n_heads=hf.num_attention_heads,
        kv_rank=hf.kv_lora_rank, q_rank=hf.q_lora_rank or 0, rope_dim=hf.qk_rope_head_dim,
        nope_dim=hf.qk_nope_head_dim, v_dim=hf.v_head_dim, mlp_hidden=hf.intermediate_size,
        n_dense=hf.first_k_dense_replace, n_experts=hf.n_routed_experts,
        top_k=hf.num_experts_per_tok, expert_hidden=hf.moe_intermediate_size,
        n_shared=hf.n_shared_experts, routed_scale=float(hf.routed_scaling_factor),
        rope_base=float(theta), norm_eps=hf.rms_norm_eps, n_group=hf.n_group or 1,
        topk_group=hf.topk_group or 1)


def _deinterleave(w: Tensor, n_groups: int, width: int, rope_dim: int) -> Tensor:
    """Rows of w viewed as n_groups x width; in each group the last rope_dim rows go from
    (x0, x1, x2, ...) pairs to (x0, x2, ..., x1, x3, ...), rotate-half's layout."""
    w = w.reshape(n_groups, width, -1).clone()
    rope = w[:, width - rope_dim:]
    w[:, width - rope_dim:] = torch.cat([rope[:, 0::2], rope[:, 1::2]], dim=1)
    return w.reshape(n_groups * width, -1)


@torch.no_grad()
def from_deepseek_v3(state_dict: Mapping[str, Tensor], config: DeepSeekConfig,
                     interleaved: bool = True) -> DeepSeekGPT:
    """A DeepSeekGPT holding a DeepseekV3ForCausalLM's `state_dict()` (interleaved: its
    config.rope_interleave). Raises KeyError / ValueError naming the weight."""
    c, model = config, DeepSeekGPT(config)
    src = dict(state_dict)
    names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
    attn = {"kv_a.weight": "kv_a_proj_with_mqa.weight", "kv_a_norm.weight": "kv_a_layernorm.weight",
            "kv_b.weight": "kv_b_proj.weight", "o_proj.weight": "o_proj.weight"}
    attn |= {"q_a.weight": "q_a_proj.weight", "q_a_norm.weight": "q_a_layernorm.weight",
             "q_b.weight": "q_b_proj.weight"} if c.q_rank else {"q_proj.weight": "q_proj.weight"}
    for i in range(c.n_layers):
        p, b = f"model.layers.{i}.", f"blocks.{i}."
        names |= {b + "norm1.weight": p + "input_layernorm.weight",
                  b + "norm2.weight": p + "post_attention_layernorm.weight"}
        names |= {b + "attn." + ours: p + "self_attn." + theirs for ours, theirs in attn.items()}
        if interleaved:
            q_name = p + ("self_attn.q_b_proj.weight" if c.q_rank else "self_attn.q_proj.weight")
            if q_name in src:
                src[q_name] = _deinterleave(src[q_name], c.n_heads, c.nope_dim + c.rope_dim, c.rope_dim)
            kv_name = p + "self_attn.kv_a_proj_with_mqa.weight"
            if kv_name in src:
                src[kv_name] = _deinterleave(src[kv_name], 1, c.kv_rank + c.rope_dim, c.rope_dim)
        if i < c.n_dense:
            names |= {f"{b}mlp.{ours}.weight": f"{p}mlp.{theirs}_proj.weight"
                      for ours, theirs in (("gate", "gate"), ("up", "up"), ("down", "down"))}
            continue
        fused = p + "mlp.experts.gate_up_proj"
        if fused in src:
            src[fused + ".gate"], src[fused + ".up"] = src[fused].chunk(2, dim=1)
        names |= {b + "mlp.router.weight": p + "mlp.gate.weight",
                  b + "mlp.bias": p + "mlp.gate.e_score_correction_bias",
                  b + "mlp.experts.gate": fused + ".gate", b + "mlp.experts.up": fused + ".up",
                  b + "mlp.experts.down": p + "mlp.experts.down_proj"}
        names |= {f"{b}mlp.shared.{ours}.weight": f"{p}mlp.shared_experts.{ours}_proj.weight"
                  for ours in ("gate", "up", "down")}
    ours = dict(model.named_parameters()) | dict(model.named_buffers())
    copy_named_weights(ours, src, names)
    return model
