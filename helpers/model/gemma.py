"""Gemma 3's text decoder: sliding and global layers, QK-norm, four norms per block.

Defined in notebook 12, "The decoder of 2025-2026", section 3, to prove the course's sliding
window and QK-norm equal to transformers' Gemma3ForCausalLM. Gemma differs from the Llama-style
block of notebook 9 in five places, each one line here:

    embedding        scaled by sqrt(D), and tied to the output layer
    RMSNorm          the gain is stored as an offset: x / rms(x) * (1 + w), so w = 0 is the identity
    block            a norm after attention and after the MLP as well as before each (four norms)
    MLP              GeGLU: gelu_tanh(x W_gate) * (x W_up) W_down
    attention        scores scaled by query_pre_attn_scalar^-1/2; local layers see `window` keys
                     and use a RoPE base of 10,000, global layers see every key, base 1,000,000

    GemmaConfig, GemmaGPT                      the sizes and the model
    config_from_gemma3, from_gemma3            a transformers model's sizes and weights

Model code: it imports torch and the course's model modules, never training, plots or lab.
Shapes: B batch, N tokens, V vocabulary, D d_model, H heads, H_KV key/value heads, D_H head_dim.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from helpers import checks
from helpers.model.embeddings import check_token_ids
from helpers.model.frontier import copy_named_weights
from helpers.model.modern import RopeTable, rms_norm, rope_rotate_half
from helpers.model.multihead import check_features, merge_heads, repeat_kv_heads, split_heads
from helpers.model.sliding import banded_mask

KINDS = ("local", "global")


@dataclass(frozen=True)
class GemmaConfig:
    """Sizes. `kinds`: 'local' or 'global' for each layer (Gemma 3: five local, one global).
    `query_scale`: the scores are divided by sqrt(query_scale) (Gemma 3: the head size)."""

    vocab_size: int = 64
    context_length: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    mlp_hidden: int = 128
    kinds: tuple[str, ...] = ("local", "global")
    window: int = 8
    query_scale: float = 16.0
    local_base: float = 10_000.0
    global_base: float = 1_000_000.0
    global_rope_factor: float = 1.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "d_model", "n_heads", "n_kv_heads",
                     "head_dim", "mlp_hidden", "window"):
            checks.positive_int(name, getattr(self, name))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim is {self.head_dim}, expected an even number for RoPE")
        if not self.kinds:
            raise ValueError("kinds is empty, expected 'local' or 'global' for each layer")
        for kind in self.kinds:
            checks.one_of("kinds[i]", kind, KINDS)
        for name in ("query_scale", "local_base", "global_base", "global_rope_factor", "norm_eps"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} is {value!r}, expected a finite number > 0")
        if self.global_rope_factor < 1:
            raise ValueError(f"global_rope_factor is {self.global_rope_factor}, expected >= 1 "
                             "(1: no scaling; Gemma 3 4B: 8)")


def gemma_norm(x: Tensor, offset: Tensor, eps: float) -> Tensor:
    """x (..., D) / rms(x) * (1 + offset): Gemma stores the gain as its difference from 1."""
    if not isinstance(offset, Tensor) or offset.dim() != 1:
        raise ValueError(f"offset is {getattr(offset, 'shape', type(offset).__name__)}, expected a (D,) tensor")
    check_features("x", x, offset.shape[0], x.dtype if isinstance(x, Tensor) else torch.float32)
    return rms_norm(x.float(), 1.0 + offset.float(), eps).type_as(x)


class GemmaNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        checks.positive_int("dim", dim)
        self.weight, self.eps = nn.Parameter(torch.zeros(dim)), eps

    def forward(self, x: Tensor) -> Tensor:
        return gemma_norm(x, self.weight, self.eps)


def gemma_rope(config: GemmaConfig, kind: str, n_positions: int) -> RopeTable:
    """cos and sin (P, D_H/2) of a local or a global layer (the global one's positions divided
    by `global_rope_factor`: "linear" RoPE scaling, which Gemma 3 4B uses with factor 8)."""
    checks.one_of("kind", kind, KINDS)
    checks.positive_int("n_positions", n_positions)
    local = kind == "local"
    base = config.local_base if local else config.global_base
    factor = 1.0 if local else config.global_rope_factor
    inv = base ** (-torch.arange(0, config.head_dim, 2, dtype=torch.float64) / config.head_dim)
    angles = torch.outer(torch.arange(n_positions, dtype=torch.float64), inv / factor)
    return RopeTable(angles.cos().float(), angles.sin().float())


class GemmaAttention(nn.Module):
    """GQA with QK-norm before RoPE; a local layer sees its last `window` keys."""

    def __init__(self, config: GemmaConfig, kind: str) -> None:
        super().__init__()
        checks.one_of("kind", kind, KINDS)
        c, self.config = config, config
        self.window = c.window if kind == "local" else 0
        self.q_proj = nn.Linear(c.d_model, c.n_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.n_heads * c.head_dim, c.d_model, bias=False)
        self.q_norm, self.k_norm = GemmaNorm(c.head_dim, c.norm_eps), GemmaNorm(c.head_dim, c.norm_eps)

    def forward(self, x: Tensor, table: RopeTable) -> Tensor:
        """x: (B, N, D) -> (B, N, D)."""
        check_features("x", x, self.config.d_model, self.q_proj.weight.dtype)
        if x.dim() != 3 or x.shape[1] > table.n_positions:
            raise ValueError(f"x has shape {tuple(x.shape)}, expected (B, N, D) with N <= "
                             f"{table.n_positions}, the RoPE table's length")
        c, n = self.config, x.shape[1]
        q = self.q_norm(split_heads(self.q_proj(x), c.n_heads))        # (B, H, N, D_H)
        k = self.k_norm(split_heads(self.k_proj(x), c.n_kv_heads))     # (B, H_KV, N, D_H)
        v = split_heads(self.v_proj(x), c.n_kv_heads)
        q, k = rope_rotate_half(q, table), rope_rotate_half(k, table)
        repeats = c.n_heads // c.n_kv_heads
        k, v = repeat_kv_heads(k, repeats), repeat_kv_heads(v, repeats)
        scores = q @ k.transpose(-2, -1) / math.sqrt(c.query_scale)   # (B, H, N, N)
        mask = banded_mask(n, self.window or n).to(x.device)
        attn = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return self.o_proj(merge_heads(attn @ v))


class GemmaBlock(nn.Module):
    """x + post_attn(attn(pre_attn(x))), then x + post_mlp(mlp(pre_mlp(x))); the MLP is GeGLU."""

    def __init__(self, config: GemmaConfig, kind: str) -> None:
        super().__init__()
        checks.one_of("kind", kind, KINDS)
        d, f, eps = config.d_model, config.mlp_hidden, config.norm_eps
        self.kind = kind
        self.pre_attn, self.post_attn = GemmaNorm(d, eps), GemmaNorm(d, eps)
        self.pre_mlp, self.post_mlp = GemmaNorm(d, eps), GemmaNorm(d, eps)
        self.attn = GemmaAttention(config, kind)
        self.gate, self.up = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.down = nn.Linear(f, d, bias=False)

    def forward(self, x: Tensor, table: RopeTable) -> Tensor:
        x = x + self.post_attn(self.attn(self.pre_attn(x), table))
        h = self.pre_mlp(x)
        return x + self.post_mlp(self.down(F.gelu(self.gate(h), approximate="tanh") * self.up(h)))


class GemmaGPT(nn.Module):
    """Token ids (B, N) -> logits (B, N, V), the output layer tied to the embedding."""

    def __init__(self, config: GemmaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(GemmaBlock(config, kind) for kind in config.kinds)
        self.norm = GemmaNorm(config.d_model, config.norm_eps)
        self.tables = {kind: gemma_rope(config, kind, config.context_length) for kind in KINDS}

    def forward(self, token_ids: Tensor) -> Tensor:
        check_token_ids(token_ids, self.config.vocab_size)
        checks.tensor_shape("token_ids", token_ids, (None, range(1, self.config.context_length + 1)),
                            f"(B, N) with 1 <= N <= {self.config.context_length}")
        n = token_ids.shape[1]
        tables = {kind: RopeTable(t.cos[:n].to(self.embed.weight), t.sin[:n].to(self.embed.weight))
                  for kind, t in self.tables.items()}
        # sqrt(D) rounded to the weights' dtype, as transformers does (a CPU scalar on any device)
        x = self.embed(token_ids) * torch.tensor(math.sqrt(self.config.d_model), dtype=self.embed.weight.dtype)
        for block in self.blocks:
            x = block(x, tables[block.kind])
        return self.norm(x) @ self.embed.weight.T


# --- loading a transformers Gemma 3 (text) ---------------------------------------------------

def config_from_gemma3(hf) -> GemmaConfig:
    """A GemmaConfig with the sizes of a `transformers.Gemma3TextConfig`. Refuses what the course's
    model does not have: soft-capping, biases, bidirectional attention, RoPE other than default
    or linear, an activation other than gelu_pytorch_tanh, untied embeddings."""
    refused = {"attn_logit_softcapping": None, "final_logit_softcapping": None,
               "attention_bias": False, "use_bidirectional_attention": False,
               "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}
    for name, expected in refused.items():
        value = getattr(hf, name, expected)
        if (bool(value) if isinstance(expected, bool) else value) != expected:
            raise ValueError(f"{name} is {getattr(hf, name)!r}, expected {expected!r}: the course's "
                             "Gemma model does not have it")
    rope = hf.rope_parameters
    for kind in ("sliding_attention", "full_attention"):
        if rope[kind].get("rope_type", "default") not in ("default", "linear"):
            raise ValueError(f"rope_parameters[{kind!r}] has rope_type {rope[kind]['rope_type']!r}, "
                             "expected 'default' or 'linear'")
    if rope["sliding_attention"].get("rope_type", "default") != "default":
        raise ValueError("rope_parameters['sliding_attention'] is scaled, expected the default RoPE")
    full = rope["full_attention"]
    kinds = tuple({"sliding_attention": "local", "full_attention": "global"}.get(t, t)
                  for t in hf.layer_types)
    return GemmaConfig(
        vocab_size=hf.vocab_size, context_length=hf.max_position_embeddings, d_model=hf.hidden_size,
        n_heads=hf.num_attention_heads, n_kv_heads=hf.num_key_value_heads, head_dim=hf.head_dim,
        mlp_hidden=hf.intermediate_size, kinds=kinds, window=hf.sliding_window,
        query_scale=float(hf.query_pre_attn_scalar),
        local_base=float(rope["sliding_attention"]["rope_theta"]), global_base=float(full["rope_theta"]),
        global_rope_factor=float(full.get("factor", 1.0)) if full.get("rope_type") == "linear" else 1.0,
        norm_eps=hf.rms_norm_eps)


@torch.no_grad()
def from_gemma3(state_dict: Mapping[str, Tensor], config: GemmaConfig) -> GemmaGPT:
    """A GemmaGPT holding a Gemma3ForCausalLM's `state_dict()`. Raises KeyError naming a missing
    weight, ValueError naming one of the wrong shape or one the model has no place for."""
    if not isinstance(config, GemmaConfig):
        raise TypeError(f"config is a {type(config).__name__}, expected a GemmaConfig (config_from_gemma3)")
    model = GemmaGPT(config)
    names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    ours_to_theirs = {"pre_attn": "input_layernorm", "post_attn": "post_attention_layernorm",
                      "pre_mlp": "pre_feedforward_layernorm", "post_mlp": "post_feedforward_layernorm",
                      "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
    ours_to_theirs |= {f"attn.{p}": f"self_attn.{p}"
                       for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")}
    for i in range(len(config.kinds)):
        names |= {f"blocks.{i}.{ours}.weight": f"model.layers.{i}.{theirs}.weight"
                  for ours, theirs in ours_to_theirs.items()}
    leftovers = set(state_dict) - set(names.values()) - {"lm_head.weight"}
    if leftovers:
        raise ValueError(f"state_dict has {len(leftovers)} entries the model has no place for, "
                         f"e.g. {sorted(leftovers)[0]!r}: expected {len(config.kinds)} layers")
    embedding, head = state_dict.get(names["embed.weight"]), state_dict.get("lm_head.weight")
    if head is not None and embedding is not None and not torch.equal(head, embedding):
        raise ValueError("state_dict['lm_head.weight'] differs from the embedding, expected them tied")
    copy_named_weights(dict(model.named_parameters()), state_dict, names)
    return model
