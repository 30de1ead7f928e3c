"""Multi-head attention: heads one by one, then all heads in one batched product, and GQA.

Defined in notebook 5, "Multi-head attention", in the order it derives them:

    section 2  AttentionHead, SeparateHeadsAttention   heads as a list of single-head modules
    section 3  split_heads, merge_heads                (B, N, H * D_H) <-> (B, H, N, D_H)
               MultiHeadAttention                      one projection for all heads, batched
               fuse_heads                              the batched module with a list's weights
    section 6  repeat_kv_heads                         H_KV key/value heads serving H query heads
               (MultiHeadAttention's n_kv_heads)       n_kv_heads < n_heads: GQA; 1: MQA
               kv_cache_bytes_per_token                2 x L x H_KV x D_H x bytes
    at the end attention_mask                          the caller's mask and the causal one, combined
               check_head_counts, check_features       the checks every module built on these shares

Every attention here calls `helpers.model.attention.scaled_dot_product_attention`: the modules only
decide what goes in (projections, head layout, masks) and what comes out (W_O).

Shapes (the legend of `helpers`): B batch, N queries (tokens), M keys (N for self-attention,
the source's length for cross-attention), D = d_model, H heads, H_KV key/value heads,
D_H = D / H per head.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.attention import causal_mask, scaled_dot_product_attention

# A KV cache's hook into attention: new keys and values in, all keys and values kept so far out.
KVStore = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


# --- notebook 5: heads as separate modules -------------------------------------------------

class AttentionHead(nn.Module):
    """One attention head with its own W_Q, W_K, W_V: D -> D_H each (the `Head` of the Matrix Magic notes)."""

    def __init__(self, d_model: int, head_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.d_model = checks.positive_int("d_model", d_model)
        self.head_dim = checks.positive_int("head_dim", head_dim)
        checks.boolean("bias", bias)
        self.q_proj = nn.Linear(d_model, head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, head_dim, bias=bias)
        self.last_weights: Tensor | None = None  # (B, N, M), kept for plotting

    def forward(self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None,
                causal: bool = False) -> Tensor:
        """x: (B, N, D); context: (B, M, D) for cross-attention, else x. Returns (B, N, D_H).

        mask: (N, M) or (B, N, M), True = may attend.
        """
        check_sequence("x", x, self.d_model, self.q_proj.weight.dtype)
        source = x if context is None else context
        if context is not None:
            check_sequence("context", context, self.d_model, self.q_proj.weight.dtype)
            _check_context(x, context)
        if isinstance(mask, Tensor) and mask.dim() == 4:
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected (N, M) or (B, N, M): "
                             "a single head has no head axis")
        mask = attention_mask(mask, causal, x.shape[1], source.shape[1], x.device, batch=x.shape[0])
        if mask is not None and mask.dim() == 4:
            mask = mask.squeeze(1)
        q, k, v = self.q_proj(x), self.k_proj(source), self.v_proj(source)  # (B, N|M, D_H)
        out, weights = scaled_dot_product_attention(q, k, v, mask=mask)
        self.last_weights = weights.detach()
        return out


class SeparateHeadsAttention(nn.Module):
    """Multi-head attention as H independent heads, concatenated, then W_O (the Matrix Magic notes' style).

    Clear, but it runs H small projections and H attentions one after another.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True) -> None:
        super().__init__()
        check_head_counts(d_model, n_heads, n_heads)
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.heads = nn.ModuleList(AttentionHead(d_model, self.head_dim, bias) for _ in range(n_heads))
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W_O: (H * D_H) -> D

    def forward(self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None,
                causal: bool = False) -> Tensor:
        """x: (B, N, D), context: (B, M, D) or None -> (B, N, D)."""
        per_head = [head(x, context, mask, causal) for head in self.heads]  # H x (B, N, D_H)
        return self.out_proj(torch.cat(per_head, dim=-1))  # (B, N, H * D_H) -> (B, N, D)

    @property
    def last_weights(self) -> Tensor | None:
        """The heads' last attention weights side by side: (B, H, N, M)."""
        if any(head.last_weights is None for head in self.heads):
            return None
        return torch.stack([head.last_weights for head in self.heads], dim=1)


# --- notebook 5: all heads at once ---------------------------------------------------------

def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(B, N, H * D_H) -> (B, H, N, D_H): give each head its own slice of the features.

    The reshape splits the last axis into (H, D_H); the transpose moves heads in front of the
    tokens so that one batched matrix multiply handles every (batch, head) pair.
    """
    if not isinstance(x, Tensor) or x.dim() != 3:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x has shape {got}, expected (B, N, H * D_H)")
    batch, n_tokens, width = x.shape
    checks.positive_int("n_heads", n_heads)
    if width % n_heads:
        raise ValueError(f"n_heads is {n_heads!r}, expected a positive int dividing the "
                         f"feature size {width} of x, shape {tuple(x.shape)}")
    return x.view(batch, n_tokens, n_heads, width // n_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, N, D_H) -> (B, N, H * D_H): the heads' outputs side by side for each token."""
    if not isinstance(x, Tensor) or x.dim() != 4:
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x has shape {got}, expected (B, H, N, D_H)")
    batch, n_heads, n_tokens, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, n_tokens, n_heads * head_dim)


def repeat_kv_heads(x: Tensor, n_repeats: int) -> Tensor:
    """(B, H_KV, M, D_H) -> (B, H_KV * n_repeats, M, D_H): key/value head g serves query heads
    g * n_repeats ... (g + 1) * n_repeats - 1."""
    return x if n_repeats == 1 else x.repeat_interleave(n_repeats, dim=1)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with one projection per Q, K, V for all heads and batched heads.

    The four matrix multiplies of the USF notes: Q/K/V projections, Q K^T, weights V, W_O.
    n_kv_heads (default n_heads) sets how many key/value heads there are: n_heads is ordinary
    multi-head attention, fewer is grouped-query attention (GQA), 1 is multi-query (MQA).
    dropout applies to the output, as on every branch that is added to the residual stream.

    The forward pass is split so that a KV cache can reuse the pieces: `project_keys_values`
    turns a sequence into (k, v); `attend` takes queries and any stored keys and values.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None,
                 bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        check_head_counts(d_model, n_heads, n_kv_heads)
        checks.boolean("bias", bias)
        checks.number_in("dropout", dropout, 0.0, 1.0, high_open=True)
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.last_weights: Tensor | None = None  # (B, H, N, M), kept for plotting

    def forward(self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None,
                causal: bool = False, kv_store: KVStore | None = None) -> Tensor:
        """x: (B, N, D); context: (B, M, D) for cross-attention, else x. Returns (B, N, D).

        mask: (N, M), (B, N, M) or (B, H, N, M), True = may attend; causal adds the causal mask.
        kv_store: a KV cache's hook. It receives the new keys and values (B, H_KV, M, D_H), keeps
        them, and returns every key and value kept so far, earlier tokens first; the queries then
        attend to all of those. (The mask, if any, must cover all of them.)
        """
        check_sequence("x", x, self.d_model, self.q_proj.weight.dtype)
        if context is not None:
            check_sequence("context", context, self.d_model, self.q_proj.weight.dtype)
            _check_context(x, context)
        q = split_heads(self.q_proj(x), self.n_heads)                    # (B, H, N, D_H)
        k, v = self.project_keys_values(x if context is None else context)  # (B, H_KV, M, D_H)
        if kv_store is not None:
            k, v = kv_store(k, v)  # (B, H_KV, earlier + M, D_H)
        return self.attend(q, k, v, mask=mask, causal=causal)

    def project_keys_values(self, source: Tensor) -> tuple[Tensor, Tensor]:
        """source: (B, M, D) -> keys and values, each (B, H_KV, M, D_H): what a KV cache stores."""
        return split_heads(self.k_proj(source), self.n_kv_heads), split_heads(self.v_proj(source), self.n_kv_heads)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               causal: bool = False) -> Tensor:
        """q: (B, H, N, D_H); k, v: (B, H_KV, M, D_H) -> (B, N, D), through W_O.

        With causal=True and M > N (cached keys first), query i sees keys up to M - N + i.
        """
        groups = self.n_heads // self.n_kv_heads
        k, v = repeat_kv_heads(k, groups), repeat_kv_heads(v, groups)  # (B, H, M, D_H)
        mask = attention_mask(mask, causal, q.shape[-2], k.shape[-2], q.device, *q.shape[:2])
        heads, weights = scaled_dot_product_attention(q, k, v, mask=mask)  # (B, H, N, D_H)
        self.last_weights = weights.detach()
        return self.dropout(self.out_proj(merge_heads(heads)))


@torch.no_grad()
def fuse_heads(separate: SeparateHeadsAttention) -> MultiHeadAttention:
    """A MultiHeadAttention computing exactly what `separate` computes, with copies of its weights.

    Head h's W_Q (D_H x D in nn.Linear's layout) becomes rows h*D_H ... (h+1)*D_H - 1 of the fused
    W_Q; likewise for W_K and W_V. W_O is shared as is.
    """
    has_bias = separate.out_proj.bias is not None
    fused = MultiHeadAttention(separate.d_model, separate.n_heads, bias=has_bias)
    for name in ("q_proj", "k_proj", "v_proj"):
        per_head = [getattr(head, name) for head in separate.heads]
        getattr(fused, name).weight.copy_(torch.cat([p.weight for p in per_head], dim=0))
        if has_bias:
            getattr(fused, name).bias.copy_(torch.cat([p.bias for p in per_head], dim=0))
    fused.out_proj.load_state_dict(separate.out_proj.state_dict())
    return fused


def kv_cache_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int,
                             bytes_per_value: int = 2) -> int:
    """Bytes of KV cache one token needs: 2 (K and V) x layers x KV heads x head size x bytes.

    bytes_per_value: 2 for fp16/bf16, 4 for fp32, 1 for an 8-bit cache.
    """
    for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads),
                        ("head_dim", head_dim), ("bytes_per_value", bytes_per_value)):
        checks.positive_int(name, value)
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_value


# --- the checks and the mask every module here shares ---------------------------------------

def check_head_counts(d_model: int, n_heads: int, n_kv_heads: int) -> None:
    """Raise a ValueError naming the numbers if the heads cannot split d_model evenly."""
    for name, value in (("d_model", d_model), ("n_heads", n_heads), ("n_kv_heads", n_kv_heads)):
        checks.positive_int(name, value)
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}: each head "
                         f"gets d_model / n_heads = {d_model / n_heads:g} features, which must "
                         "be a whole number")
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}: each "
                         f"key/value head must serve the same number of query heads, got "
                         f"{n_heads / n_kv_heads:g}")


def check_features(name: str, x: Tensor, d_model: int, dtype: torch.dtype) -> None:
    """Raise unless x is a tensor (..., d_model) in the dtype of the module's weights.

    Caught here, a wrong width or dtype gets a message naming `name`, instead of torch's
    "mat1 and mat2 shapes cannot be multiplied" from inside the first product.
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} is a {type(x).__name__}, expected a torch.Tensor (..., {d_model})")
    if x.dim() == 0 or x.shape[-1] != d_model:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected (..., {d_model}): the last "
                         f"dimension holds each token's d_model = {d_model} features")
    if x.dtype != dtype:
        raise TypeError(f"{name} has dtype {x.dtype}, expected {dtype}, the dtype of the module's "
                        f"weights: convert {name} with .to({dtype}) (or the module with .to({x.dtype}))")


def check_sequence(name: str, x: Tensor, d_model: int, dtype: torch.dtype) -> None:
    """Raise unless x is a tensor of shape (B, N, d_model), N >= 1, in the weights' dtype."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} is a {type(x).__name__}, expected a torch.Tensor (B, N, {d_model})")
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected (B, N, {d_model}) "
                         f"with d_model = {d_model}")
    if x.shape[1] == 0:
        raise ValueError(f"{name} has shape {tuple(x.shape)}: a sequence of 0 tokens, expected "
                         "at least one token (N >= 1)")
    check_features(name, x, d_model, dtype)


def _check_context(x: Tensor, context: Tensor) -> None:
    if context.shape[0] != x.shape[0]:
        raise ValueError(f"context has shape {tuple(context.shape)} and x has shape "
                         f"{tuple(x.shape)}: their batch sizes must match")


def attention_mask(mask: Tensor | None, causal: bool, n_q: int, n_k: int,
                   device: torch.device, batch: int | None = None, heads: int | None = None) -> Tensor | None:
    """The boolean mask to pass to attention: `mask` and, if `causal`, the causal mask, combined.

    mask: None, (N, M), (B, N, M) or (B or 1, H or 1, N, M); True = may attend; a size of 1
    broadcasts. A 3-D mask is given a head axis, (B, 1, N, M), so that every head uses it. Its
    shape is checked as given, against N = n_q, M = n_k and (when known) B = batch, H = heads.
    Returns None when nothing is masked.
    """
    checks.boolean("causal", causal)
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise TypeError(f"mask is {got}, expected a torch.bool tensor (True = may attend)")
        if mask.dim() not in (2, 3, 4):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected (N, M), (B, N, M) "
                             f"or (B, H, N, M) with N = {n_q}, M = {n_k}")
        sizes = {2: (n_q, n_k), 3: (batch, n_q, n_k), 4: (batch, heads, n_q, n_k)}[mask.dim()]
        if any(want is not None and got not in (1, want) for got, want in zip(mask.shape, sizes, strict=True)):
            names = {2: "NM", 3: "BNM", 4: "BHNM"}[mask.dim()]
            wanted = ", ".join(name if size is None else f"{name}={size}" for name, size in zip(names, sizes, strict=True))
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected ({wanted}) to match the "
                             f"{n_q} queries and {n_k} keys (a size of 1 broadcasts)")
        if mask.dim() == 3:
            mask = mask.unsqueeze(1)
    if not causal:
        return mask
    future_hidden = causal_mask(n_q, n_k, device=device)  # (N, M), bottom-right aligned
    return future_hidden if mask is None else mask & future_hidden
