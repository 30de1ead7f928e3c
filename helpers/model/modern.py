"""The modern decoder (Llama, Mistral, Qwen): what changed since GPT-2, one part at a time.

In the order notebook 9 ("From GPT-2 to the modern decoder") derives them (its section 5, GQA,
uses `helpers.model.multihead.MultiHeadAttention` as it is; section 7's measurements live in the notebook):

    section 1, RoPE     rope_angles, RopeTable          the angle m * theta_i of every position m
                        rope_rotate_complex             pairs as complex numbers, times e^(i m theta)
                        rope_rotate_half                the same rotation in real numbers (x cos + rotate_half(x) sin)
    section 2, ALiBi    alibi_slopes, alibi_bias        per-head slopes, the (H, N, N) bias buffer
                        alibi_attention                 the bias added after the 1/sqrt(D_H) scaling
    section 3, RMSNorm  rms_norm, RMSNorm               LayerNorm without the mean and the bias
    section 4, SwiGLU   llama_hidden_size               8/3 x D, rounded up as Llama does
    section 6, model    ModernConfig, ModernBlock,      pre-norm RMSNorm, RoPE attention with GQA,
                        ModernGPT                       SwiGLU, no biases, tied or untied output
                        modern_generate_logits          the logits fed one token at a time (the cache)

A Hugging Face Llama's weights load into ModernGPT with `helpers.model.llama`.

Why a sibling of `helpers.model.gpt.GPT` and not a config switch inside it: the two differ in almost
every part (no position table, another norm, another MLP, rotated keys), so one class full of
`if modern:` branches would hide both. The parts that did not change are reused as they are:
`helpers.model.multihead.MultiHeadAttention` (its projections, `n_kv_heads` for GQA and its `attend`),
`helpers.model.layers.SwiGLUFeedForward`, and `helpers.model.kv_cache.KVCache` (`KVCache.for_model` works on
ModernGPT too). The cache stores keys already rotated at their own positions, so a new token
never re-rotates the past: tests/model/test_modern.py proves the cached logits equal a full pass.

Pairing convention: both RoPE forms pair feature i with feature i + D_H/2 (the "rotate half"
layout of Hugging Face's Llama), so they are equal feature for feature. Meta's original code
pairs neighbours (2i, 2i+1); that is a fixed permutation of the features of q and k, which
leaves every score q . k unchanged.

Shapes: B batch, N tokens, V vocabulary, D = d_model, H heads, H_KV key/value heads,
D_H = D / H, P rows of the RoPE table (the longest position + 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.attention import causal_mask
from helpers.model.embeddings import check_token_ids
from helpers.model.kv_cache import KVCache, check_cache
from helpers.model.layers import SwiGLUFeedForward
from helpers.model.multihead import (
    MultiHeadAttention,
    check_features,
    check_head_counts,
    split_heads,
)

# --- section 1: RoPE ------------------------------------------------------------------------

def _check_head_dim(head_dim: int) -> int:
    checks.positive_int("head_dim", head_dim)
    if head_dim % 2:
        raise ValueError(f"head_dim is {head_dim}, expected an even number: RoPE rotates pairs of "
                         "features, so every feature needs a partner")
    return head_dim


def rope_angles(head_dim: int, n_positions: int, base: float = 10000.0) -> Tensor:
    """(P, D_H/2): angle[m, i] = m * theta_i, theta_i = base^(-2i / D_H), as in the sinusoidal table."""
    _check_head_dim(head_dim)
    checks.positive_int("n_positions", n_positions)
    checks.number_in("base", base, 1.0, math.inf, True, True, "a finite number > 1 (1 gives every "
                     "position the same angle; Llama uses 10000)")
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D_H/2,)
    positions = torch.arange(n_positions, dtype=torch.float64)
    return torch.outer(positions, theta)  # float64, so that long tables keep their angles exact


@dataclass
class RopeTable:
    """cos and sin of every angle, each (P, D_H/2), computed once; `complex` is cos + i sin."""

    cos: Tensor
    sin: Tensor

    @classmethod
    def build(cls, head_dim: int, n_positions: int, base: float = 10000.0,
              dtype: torch.dtype = torch.float32) -> RopeTable:
        angles = rope_angles(head_dim, n_positions, base)
        return cls(angles.cos().to(dtype), angles.sin().to(dtype))

    @property
    def n_positions(self) -> int:
        return self.cos.shape[0]

    @property
    def head_dim(self) -> int:
        return 2 * self.cos.shape[1]

    @property
    def complex(self) -> Tensor:
        return torch.complex(self.cos, self.sin)

    def rows(self, x: Tensor, positions: Tensor | None, start: int = 0) -> tuple[Tensor, Tensor]:
        """cos and sin for x's tokens, each (N, D_H/2): positions (N,) given, else start ... start + N - 1."""
        if not isinstance(x, Tensor) or x.dim() < 2 or x.shape[-1] != self.head_dim:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x has shape {got}, expected (..., N, {self.head_dim}): the table "
                             f"was built for head_dim = {self.head_dim}")
        if positions is None:
            checks.non_negative_int("start", start)
            positions = torch.arange(start, start + x.shape[-2], device=self.cos.device)
        elif not isinstance(positions, Tensor) or positions.shape != (x.shape[-2],) \
                or positions.dtype not in (torch.int64, torch.int32):
            got = (f"{tuple(positions.shape)} {positions.dtype}" if isinstance(positions, Tensor)
                   else type(positions).__name__)
            raise ValueError(f"positions is {got}, expected an integer tensor of shape "
                             f"({x.shape[-2]},): one position for each of x's {x.shape[-2]} tokens")
        if positions.numel() and (positions.min() < 0 or positions.max() >= self.n_positions):
            raise ValueError(f"positions reach {int(positions.max())} (lowest {int(positions.min())}), "
                             f"expected 0 <= position < {self.n_positions}, the rows of the RoPE "
                             "table: build it with more n_positions")
        return self.cos[positions], self.sin[positions]


def rope_rotate_complex(x: Tensor, table: RopeTable, positions: Tensor | None = None,
                        start: int = 0) -> Tensor:
    """x: (..., N, D_H) -> the same shape, pair (x_i, x_{i+D_H/2}) read as x_i + i x_{i+D_H/2}
    and multiplied by e^(i m theta_i): a rotation by the angle m theta_i."""
    cos, sin = table.rows(x, positions, start)
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    turned = z * torch.complex(cos.double(), sin.double())
    return torch.cat([turned.real, turned.imag], dim=-1).to(x.dtype)


def rotate_half(x: Tensor) -> Tensor:
    """(a, b) -> (-b, a) for the two halves of the last axis: a quarter turn of every pair."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rope_rotate_half(x: Tensor, table: RopeTable, positions: Tensor | None = None,
                     start: int = 0) -> Tensor:
    """x: (..., N, D_H) -> x cos + rotate_half(x) sin: the complex product in real numbers."""
    cos, sin = table.rows(x, positions, start)
    cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)  # (N, D_H)
    return x * cos + rotate_half(x) * sin


# --- section 2: ALiBi -----------------------------------------------------------------------

def alibi_slopes(n_heads: int) -> Tensor:
    """(H,) slopes of ALiBi (Press et al., 2022).

    A power of two: the geometric sequence 2^(-8/H), 2^(-16/H), ..., 2^(-8). Any other head
    count: the paper's own rule, the slopes of the nearest power of two below H, then every
    other slope of twice that power, until H slopes (12 heads: the 8 slopes of 8 heads, then
    slopes 1, 3, 5, 7 of the 16-head sequence).
    """
    checks.positive_int("n_heads", n_heads)

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    below = 2 ** int(math.log2(n_heads))
    slopes = geometric(below) + geometric(2 * below)[0::2][: n_heads - below]
    return torch.tensor(slopes)


def alibi_bias(n_heads: int, n_tokens: int) -> Tensor:
    """(H, N, N): bias[h, i, j] = -slope_h * (i - j) for keys j <= i; 0 above the diagonal,
    where the causal mask rules anyway. The textbook's buffer, with its geometric schedule."""
    checks.positive_int("n_tokens", n_tokens)
    positions = torch.arange(n_tokens)
    behind = (positions[None, :] - positions[:, None]).clamp(max=0)  # (N, N): j - i, 0 above
    return alibi_slopes(n_heads)[:, None, None] * behind  # (written so, no -0.0 above the diagonal)


def alibi_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal attention with ALiBi: q, k, v (B, H, N, D_H) -> (B, H, N, D_H). No positions in q
    or k: the bias, added after the 1/sqrt(D_H) scaling, is the only place order enters."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} is a {type(tensor).__name__}, expected a tensor (B, H, N, D_H)")
    if q.dim() != 4 or k.shape != q.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, "
                         "expected q and k (B, H, N, D_H) alike and v (B, H, N, D_V): the bias "
                         "buffer is (H, N, N), for as many keys as queries")
    n_heads, n_tokens = q.shape[-3], q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, N, N)
    scores = scores + alibi_bias(n_heads, n_tokens).to(scores)
    scores = scores.masked_fill(~causal_mask(n_tokens, device=q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# --- section 3: RMSNorm ---------------------------------------------------------------------

def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """x: (..., D) divided by its root mean square, times a learned gain: no mean, no bias."""
    checks.positive_float("eps", eps, " (it keeps the division away from 0)")
    rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    y = x / rms
    return y if weight is None else y * weight


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain (D,), set to ones: what Llama uses where GPT-2 has LayerNorm."""

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.d_model = checks.positive_int("d_model", d_model)
        self.eps = checks.positive_float("eps", eps)
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., D) -> (..., D)."""
        check_features("x", x, self.d_model, self.weight.dtype)
        return rms_norm(x, self.weight, self.eps)


# --- section 4: SwiGLU's width --------------------------------------------------------------

def llama_hidden_size(d_model: int, multiple_of: int = 32) -> int:
    """8/3 x D (two thirds of GPT-2's 4 D, for three matrices instead of two), rounded up to a
    multiple of `multiple_of` as Llama's code does (it uses 256; D = 4096 gives 11008)."""
    checks.positive_int("d_model", d_model)
    checks.positive_int("multiple_of", multiple_of)
    hidden = int(2 * (4 * d_model) / 3)
    return multiple_of * math.ceil(hidden / multiple_of)


# --- section 5: the block and the model -----------------------------------------------------

@dataclass(frozen=True)
class ModernConfig:
    """The sizes of a modern decoder. GPTConfig's names where it has them.

    n_kv_heads: key/value heads (n_heads: ordinary attention, fewer: GQA, 1: MQA); mlp_hidden:
    SwiGLU's width, default `llama_hidden_size(d_model)`; rope_base: theta's base; norm_eps:
    RMSNorm's eps; tie_weights: the output matrix is the token embedding (Llama does not tie).
    """

    vocab_size: int = 64
    context_length: int = 64
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    d_model: int = 128
    mlp_hidden: int | None = None
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    tie_weights: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "n_layers"):
            checks.positive_int(name, getattr(self, name))
        check_head_counts(self.d_model, self.n_heads, self.n_kv_heads)
        _check_head_dim(self.d_model // self.n_heads)
        if self.mlp_hidden is not None:
            checks.positive_int("mlp_hidden", self.mlp_hidden)
        checks.number_in("rope_base", self.rope_base, 1.0, math.inf, True, True, "a finite number > 1")
        checks.positive_float("norm_eps", self.norm_eps)
        checks.boolean("tie_weights", self.tie_weights)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def hidden(self) -> int:
        return llama_hidden_size(self.d_model) if self.mlp_hidden is None else self.mlp_hidden


class ModernBlock(nn.Module):
    """x + attn(norm1(x)), then x + mlp(norm2(x)): RMSNorm, RoPE attention (GQA), SwiGLU, no biases."""

    def __init__(self, config: ModernConfig) -> None:
        super().__init__()
        self.norm1 = RMSNorm(config.d_model, config.norm_eps)
        self.attn = MultiHeadAttention(config.d_model, config.n_heads, config.n_kv_heads, bias=False)
        self.norm2 = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = SwiGLUFeedForward(config.d_model, config.hidden, bias=False)

    def forward(self, x: Tensor, table: RopeTable, start: int = 0, kv_store=None) -> Tensor:
        """x: (B, N, D), tokens at positions start ... start + N - 1 -> (B, N, D).

        Queries and keys are rotated at their own positions before a KV cache (kv_store) keeps
        the keys, so stored keys are never touched again.
        """
        h = self.norm1(x)
        q = split_heads(self.attn.q_proj(h), self.attn.n_heads)      # (B, H, N, D_H)
        k, v = self.attn.project_keys_values(h)                      # (B, H_KV, N, D_H)
        q, k = rope_rotate_half(q, table, start=start), rope_rotate_half(k, table, start=start)
        if kv_store is not None:
            k, v = kv_store(k, v)                                    # (B, H_KV, start + N, D_H)
        x = x + self.attn.attend(q, k, v, causal=True)
        return x + self.mlp(self.norm2(x))


class ModernGPT(nn.Module):
    """Token embedding (no position table) -> n_layers ModernBlocks -> RMSNorm -> logits (B, N, V)."""

    def __init__(self, config: ModernConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(ModernBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        if config.tie_weights:
            self.lm_head.weight = self.embed.weight
        self.rope = RopeTable.build(config.head_dim, config.context_length, config.rope_base)

    def _apply(self, fn, recurse: bool = True):  # keep the RoPE table on the model's device/dtype
        super()._apply(fn, recurse)
        self.rope = RopeTable(fn(self.rope.cos), fn(self.rope.sin))
        return self

    def forward(self, token_ids: Tensor) -> Tensor:
        """token_ids: (B, N), N <= context_length -> logits (B, N, V)."""
        self._check_ids(token_ids, 0)
        return self._run(token_ids, 0, None)

    @torch.no_grad()
    def forward_cached(self, token_ids: Tensor, cache: KVCache) -> Tensor:
        """Feed the n tokens (B, n) that follow the cache.length already in `cache`; their logits
        (B, n, V) equal the last n rows of a full pass. The cache then holds length + n tokens."""
        self._check_ids(token_ids, 0)
        check_cache(cache, self, token_ids.shape[0])
        start = cache.length
        self._check_ids(token_ids, start)
        logits = self._run(token_ids, start, cache)
        cache.length = start + token_ids.shape[1]
        return logits

    def _run(self, token_ids: Tensor, start: int, cache: KVCache | None) -> Tensor:
        x = self.embed(token_ids)  # (B, N, D): no positions added; RoPE puts them into q and k
        for layer, block in enumerate(self.blocks):
            x = block(x, self.rope, start, None if cache is None else cache.store_hook(layer))
        return self.lm_head(self.norm(x))

    def _check_ids(self, token_ids: Tensor, start: int) -> None:
        checks.tensor_shape("token_ids", token_ids, (None, checks.AT_LEAST_ONE), "(B, N) with N >= 1")
        check_token_ids(token_ids, self.config.vocab_size)
        if start + token_ids.shape[1] > self.config.context_length:
            raise ValueError(f"token_ids reach position {start + token_ids.shape[1] - 1}, expected "
                             f"at most context_length - 1 = {self.config.context_length - 1}")


def modern_generate_logits(model: ModernGPT, token_ids: Tensor) -> Tensor:
    """The logits of `token_ids` (B, N) fed one token at a time through a KVCache: (B, N, V)."""
    cache = KVCache.for_model(model, token_ids.shape[0])
    steps = [model.forward_cached(token_ids[:, t:t + 1], cache) for t in range(token_ids.shape[1])]
    return torch.cat(steps, dim=1)

