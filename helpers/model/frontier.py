"""The decoder of 2025-2026: notebook 9's modern decoder with a MoE MLP, QK-norm, sliding windows.

Defined in notebook 12, "The decoder of 2025-2026"; one class for the dense and the MoE model so
the two compare with everything else equal:

    FrontierConfig      ModernConfig's sizes plus head_dim, qk_norm, the MoE's sizes
                        (n_experts = 0: a dense SwiGLU MLP), a sliding window and the pattern
                        of local and global layers, RoPE scaling ("llama3", "yarn")
    FrontierAttention   q, k, v projections (GQA), QK-norm, RoPE, a causal or banded mask;
                        it keeps the largest |score| of its last call (`last_max_logit`)
    FrontierGPT         token embedding -> blocks (RMSNorm, attention, RMSNorm, MLP or MoE) -> logits
    from_qwen3_moe      a transformers Qwen3MoeForCausalLM's weights in a FrontierGPT

Model code: it imports torch and the course's model modules, never training, plots or lab.
Shapes: B batch, N tokens, V vocabulary, D = d_model, H heads, H_KV key/value heads, D_H head_dim.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.embeddings import check_token_ids
from helpers.model.layers import SwiGLUFeedForward
from helpers.model.modern import RMSNorm, RopeTable, rms_norm, rope_angles, rope_rotate_half
from helpers.model.moe import ROUTER_MODES, MoELayer, check_top_k
from helpers.model.multihead import check_features, merge_heads, repeat_kv_heads, split_heads
from helpers.model.sliding import banded_mask, layer_kinds, llama3_inv_freq, yarn_inv_freq


@dataclass(frozen=True)
class FrontierConfig:
    """Sizes. head_dim defaults to d_model / n_heads; mlp_hidden is the dense MLP's width
    (n_experts = 0) or the shared expert's (n_experts > 0; 0 = none); expert_hidden each
    expert's. window = 0: every layer global; else `local_per_global` sliding layers of that
    window per global layer (Gemma 3: 5). rope_scaling: None, "llama3" or "yarn" by
    rope_factor over original_context."""

    vocab_size: int = 64
    context_length: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    d_model: int = 64
    head_dim: int | None = None
    mlp_hidden: int = 0
    n_experts: int = 0
    top_k: int = 2
    expert_hidden: int = 32
    router_mode: str = "softmax_topk"
    normalize_topk: bool = False
    capacity_factor: float | None = None
    balance: str = "none"
    aux_coef: float = 0.01
    bias_rate: float = 1e-3
    qk_norm: bool = False
    window: int = 0
    local_per_global: int = 5
    rope_base: float = 10000.0
    rope_scaling: str | None = None
    rope_factor: float = 1.0
    original_context: int = 64
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "n_layers", "n_heads", "n_kv_heads", "d_model"):
            checks.positive_int(name, getattr(self, name))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: give head_dim")
        if self.resolved_head_dim % 2:
            raise ValueError(f"head_dim is {self.resolved_head_dim}, expected an even number for RoPE")
        checks.non_negative_int("mlp_hidden", self.mlp_hidden)
        checks.non_negative_int("n_experts", self.n_experts)
        if self.n_experts:
            check_top_k(self.top_k, self.n_experts)
            checks.positive_int("expert_hidden", self.expert_hidden)
            checks.one_of("router_mode", self.router_mode, ROUTER_MODES)
        elif not self.mlp_hidden:
            raise ValueError("mlp_hidden is 0 and n_experts is 0, expected one of them positive: "
                             "the block needs a dense MLP or experts")
        checks.non_negative_int("window", self.window)
        checks.one_of("rope_scaling", self.rope_scaling, (None, "llama3", "yarn"))
        checks.number_in("rope_factor", self.rope_factor, 1.0, math.inf, high_open=True)
        checks.positive_int("original_context", self.original_context)
        checks.boolean("qk_norm", self.qk_norm)

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    def kinds(self) -> list[str]:
        """'local' or 'global' for each layer."""
        if self.window == 0:
            return ["global"] * self.n_layers
        return layer_kinds(self.n_layers, self.local_per_global)


def rope_table(config: FrontierConfig, n_positions: int) -> RopeTable:
    """cos and sin (P, D_H/2) with the config's RoPE scaling (YaRN's attention factor folded in)."""
    if not isinstance(config, FrontierConfig):
        raise TypeError(f"config is a {type(config).__name__}, expected a FrontierConfig")
    d_h, scale = config.resolved_head_dim, 1.0
    if config.rope_scaling is None:
        angles = rope_angles(d_h, n_positions, config.rope_base)
    else:
        if config.rope_scaling == "llama3":
            inv = llama3_inv_freq(d_h, config.rope_base, config.rope_factor, config.original_context)
        else:
            inv, scale = yarn_inv_freq(d_h, config.rope_base, config.rope_factor, config.original_context)
        angles = torch.outer(torch.arange(n_positions, dtype=torch.float64), inv)
    return RopeTable((angles.cos() * scale).float(), (angles.sin() * scale).float())


class FrontierAttention(nn.Module):
    """GQA attention with optional QK-norm (RMSNorm over each head's D_H, before RoPE, as in
    Qwen3) and an optional sliding window."""

    def __init__(self, config: FrontierConfig, window: int = 0) -> None:
        super().__init__()
        checks.non_negative_int("window", window)
        d_h, self.window = config.resolved_head_dim, window
        self.n_heads, self.n_kv_heads, self.eps = config.n_heads, config.n_kv_heads, config.norm_eps
        self.q_proj = nn.Linear(config.d_model, config.n_heads * d_h, bias=False)
        self.k_proj = nn.Linear(config.d_model, config.n_kv_heads * d_h, bias=False)
        self.v_proj = nn.Linear(config.d_model, config.n_kv_heads * d_h, bias=False)
        self.o_proj = nn.Linear(config.n_heads * d_h, config.d_model, bias=False)
        self.q_norm = nn.Parameter(torch.ones(d_h)) if config.qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(d_h)) if config.qk_norm else None
        self.last_max_logit = 0.0

    def forward(self, x: Tensor, table: RopeTable) -> Tensor:
        """x: (B, N, D) -> (B, N, D)."""
        check_features("x", x, self.q_proj.in_features, self.q_proj.weight.dtype)
        q = split_heads(self.q_proj(x), self.n_heads)                   # (B, H, N, D_H)
        k = split_heads(self.k_proj(x), self.n_kv_heads)                # (B, H_KV, N, D_H)
        v = split_heads(self.v_proj(x), self.n_kv_heads)
        if self.q_norm is not None:
            q, k = rms_norm(q, self.q_norm, self.eps), rms_norm(k, self.k_norm, self.eps)
        q, k = rope_rotate_half(q, table), rope_rotate_half(k, table)
        repeats = self.n_heads // self.n_kv_heads
        k, v = repeat_kv_heads(k, repeats), repeat_kv_heads(v, repeats)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])      # (B, H, N, N)
        self.last_max_logit = float(scores.detach().abs().max())
        n = x.shape[1]
        mask = banded_mask(n, self.window if self.window else n).to(x.device)
        attn = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return self.o_proj(merge_heads(attn @ v))


class FrontierBlock(nn.Module):
    """x + attn(norm1(x)), then x + mlp(norm2(x)); mlp is a SwiGLU or a MoELayer."""

    def __init__(self, config: FrontierConfig, window: int = 0) -> None:
        super().__init__()
        self.norm1 = RMSNorm(config.d_model, config.norm_eps)
        self.attn = FrontierAttention(config, window)
        self.norm2 = RMSNorm(config.d_model, config.norm_eps)
        if config.n_experts:
            self.mlp = MoELayer(config.d_model, config.n_experts, config.top_k, config.expert_hidden,
                                mode=config.router_mode, normalize=config.normalize_topk,
                                shared_hidden=config.mlp_hidden,
                                capacity_factor=config.capacity_factor, balance=config.balance,
                                aux_coef=config.aux_coef, bias_rate=config.bias_rate)
        else:
            self.mlp = SwiGLUFeedForward(config.d_model, config.mlp_hidden)

    def forward(self, x: Tensor, table: RopeTable) -> Tensor:
        x = x + self.attn(self.norm1(x), table)
        return x + self.mlp(self.norm2(x))


class FrontierGPT(nn.Module):
    """Token ids (B, N) -> logits (B, N, V). The Trainer trains it like a GPT (the interface
    of `helpers.model.gpt.GPT`: `config.vocab_size`, `config.context_length`)."""

    def __init__(self, config: FrontierConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(
            FrontierBlock(config, config.window if kind == "local" else 0) for kind in config.kinds())
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
        table = rope_table(config, config.context_length)
        # Buffers, so .to() and .double() move them with the weights; not persistent, so the
        # state dict (and every checkpoint) holds the weights only.
        self.register_buffer("rope_cos", table.cos, persistent=False)     # (context_length, D_H/2)
        self.register_buffer("rope_sin", table.sin, persistent=False)

    @property
    def rope(self) -> RopeTable:
        """The stored table, context_length rows."""
        return RopeTable(self.rope_cos, self.rope_sin)

    @rope.setter
    def rope(self, table: RopeTable) -> None:
        self.rope_cos, self.rope_sin = table.cos, table.sin

    def rope_rows(self, n: int) -> RopeTable:
        """The table's first n rows: the stored table's, or past it (the length experiments
        evaluate there) a longer one built for the purpose and not kept."""
        if n > self.rope_cos.shape[0]:
            return self._built_rope(n)
        return RopeTable(self.rope_cos[:n], self.rope_sin[:n])

    def to_empty(self, *, device: torch.device | str | None, recurse: bool = True) -> FrontierGPT:
        """nn.Module.to_empty, then the RoPE table's values again: it is not in the state dict,
        so a model built on the meta device and then loaded would otherwise keep empty memory."""
        super().to_empty(device=device, recurse=recurse)
        self.rope = self._built_rope(self.config.context_length)
        return self

    def _built_rope(self, n: int) -> RopeTable:
        """The one rule that computes table values: n rows from the config, in the stored
        table's dtype and on its device."""
        table = rope_table(self.config, n)
        return RopeTable(table.cos.to(self.rope_cos), table.sin.to(self.rope_sin))

    def moe_layers(self) -> list[MoELayer]:
        return [block.mlp for block in self.blocks if isinstance(block.mlp, MoELayer)]

    def forward(self, token_ids: Tensor) -> Tensor:
        """token_ids: (B, N) -> logits (B, N, V). N may exceed context_length (see rope_rows)."""
        checks.tensor_shape("token_ids", token_ids, (None, checks.AT_LEAST_ONE), "(B, N) with N >= 1")
        check_token_ids(token_ids, self.config.vocab_size)
        table = self.rope_rows(token_ids.shape[1])
        x = self.embed(token_ids)
        for block in self.blocks:
            x = block(x, table)
        return self.lm_head(self.norm(x))


def total_and_active_parameters(model: nn.Module) -> tuple[int, int]:
    """(total, active per token): a MoE layer's experts count k / E towards the active ones."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model is a {type(model).__name__}, expected a torch.nn.Module")
    total = sum(p.numel() for p in model.parameters())
    inactive = 0
    for module in model.modules():
        if isinstance(module, MoELayer):
            expert_params = sum(p.numel() for p in module.experts.parameters())
            inactive += expert_params * (module.n_experts - module.top_k) // module.n_experts
    return total, total - inactive


# --- loading a transformers Qwen3-MoE -------------------------------------------------------

def config_from_qwen3_moe(hf) -> FrontierConfig:
    """A FrontierConfig with the sizes of a `transformers.Qwen3MoeConfig` (every layer sparse)."""
    if getattr(hf, "mlp_only_layers", None) or getattr(hf, "decoder_sparse_step", 1) != 1:
        raise ValueError("the Qwen3MoeConfig has dense layers (mlp_only_layers or "
                         "decoder_sparse_step), expected every layer to be a MoE layer")
    theta = (getattr(hf, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return FrontierConfig(
        vocab_size=hf.vocab_size, context_length=hf.max_position_embeddings,
        n_layers=hf.num_hidden_layers, n_heads=hf.num_attention_heads,
        n_kv_heads=hf.num_key_value_heads, d_model=hf.hidden_size, head_dim=hf.head_dim,
        n_experts=hf.num_experts, top_k=hf.num_experts_per_tok,
        expert_hidden=hf.moe_intermediate_size, router_mode="softmax_topk",
        normalize_topk=bool(hf.norm_topk_prob), qk_norm=True, rope_base=float(theta),
        norm_eps=hf.rms_norm_eps)


@torch.no_grad()
def from_qwen3_moe(state_dict: Mapping[str, Tensor], config: FrontierConfig) -> FrontierGPT:
    """A FrontierGPT holding a Qwen3MoeForCausalLM's `state_dict()` (untied lm_head).

    Their experts keep gate and up in one (E, 2F, D) tensor, gate first; ours keep them apart.
    Raises KeyError naming a missing weight, ValueError naming one of the wrong shape.
    """
    model = FrontierGPT(config)
    ours = dict(model.named_parameters())
    names = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight"}
    for i in range(config.n_layers):
        p, b = f"model.layers.{i}.", f"blocks.{i}."
        names |= {b + "norm1.weight": p + "input_layernorm.weight",
                  b + "norm2.weight": p + "post_attention_layernorm.weight",
                  b + "attn.q_norm": p + "self_attn.q_norm.weight",
                  b + "attn.k_norm": p + "self_attn.k_norm.weight",
                  b + "mlp.router.weight": p + "mlp.gate.weight",
                  b + "mlp.experts.down": p + "mlp.experts.down_proj"}
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names[f"{b}attn.{proj}.weight"] = f"{p}self_attn.{proj}.weight"
    source = dict(state_dict)
    for i in range(config.n_layers):
        key = f"model.layers.{i}.mlp.experts.gate_up_proj"
        if key in source:
            source[f"{key}.gate"], source[f"{key}.up"] = source[key].chunk(2, dim=1)
        names[f"blocks.{i}.mlp.experts.gate"] = f"{key}.gate"
        names[f"blocks.{i}.mlp.experts.up"] = f"{key}.up"
    copy_named_weights(ours, source, names)
    return model


def copy_named_weights(ours: Mapping[str, Tensor], source: Mapping[str, Tensor],
                       names: Mapping[str, str]) -> None:
    """Copy source[their name] into ours[our name] for every pair in `names`, in place.

    A missing entry (KeyError) or a shape that differs (ValueError) is named before it is copied.
    """
    for our_name, their_name in names.items():
        if their_name not in source:
            raise KeyError(f"state_dict has no {their_name!r}, expected it for {our_name}")
        if tuple(source[their_name].shape) != tuple(ours[our_name].shape):
            raise ValueError(f"state_dict[{their_name!r}] has shape {tuple(source[their_name].shape)}, "
                             f"expected {tuple(ours[our_name].shape)} for {our_name}")
        ours[our_name].copy_(source[their_name])
