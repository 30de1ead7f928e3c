"""The GPT's fused forward: the same Block, computed with PyTorch's fused kernels.

Nothing here is a new idea; each function computes what `Block.forward` and `LayerNorm` in
`helpers.model.layers` define, and tests/model/test_gpt.py checks each against that definition.
Notebook 7 (section 4) shows the plain block and then `GPT.forward(fast=True)`, which uses:

    fused_layer_norm, fused_causal_attention   PyTorch's fused kernels for LayerNorm, attention
    fast_block                                 `Block.forward` with them and one product for
                                               Q, K and V

The model owns both of its forwards; the training-speed machinery (bf16 working copy, one
buffer for every weight) is in `helpers.training.speed`.

Shapes (the legend of `helpers`): B batch, N tokens (M keys, cached ones first), V vocabulary,
D = d_model, H heads, H_KV key/value heads, D_H = head_dim.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from helpers.model.attention import causal_mask
from helpers.model.layers import Block, LayerNorm
from helpers.model.multihead import (
    KVStore,
    MultiHeadAttention,
    merge_heads,
    repeat_kv_heads,
    split_heads,
)

# --- the forward pass with fused kernels ---------------------------------------------------

def fused_layer_norm(norm: LayerNorm, x: Tensor) -> Tensor:
    """`norm(x)` computed by PyTorch's fused kernel: x (..., D) -> (..., D)."""
    return F.layer_norm(x, (norm.d_model,), norm.weight, norm.bias, norm.eps)


def fused_causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal softmax(q k^T / sqrt(D_H)) v: q (B, H, N, D_H), k, v (B, H, M, D_H) -> (B, H, N, D_H).

    With M > N (cached keys first) query i sees keys up to M - N + i, as in `causal_mask`.
    PyTorch's `scaled_dot_product_attention` is fastest in float32 and on GPUs. In bfloat16 on
    a CPU its kernel was slower here than three plain products (a training step of the
    benchmark's model took about 1.5x as long with it), so those are used there.
    """
    n_q, n_k = q.shape[-2], k.shape[-2]
    if n_q == n_k and q.device.type == "cpu" and q.dtype != torch.float32:
        return _attention_in_three_products(q, k, v)
    if n_q == n_k:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # is_causal would align the triangle to the top left; a single query sees every key.
    mask = None if n_q == 1 else causal_mask(n_q, n_k, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _causal_bias(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(n, n): 0 where query i may see key j (j <= i), -inf above the diagonal.

    Made once per size and kept; torch.compile builds it into its graph instead.
    """
    if torch.compiler.is_compiling():
        return _build_causal_bias(n, dtype, device)
    return _kept_causal_bias(n, dtype, device)


def _build_causal_bias(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    future = torch.ones(n, n, dtype=torch.bool, device=device).triu_(1)
    return torch.zeros(n, n, dtype=dtype, device=device).masked_fill_(future, float("-inf"))


_kept_causal_bias = functools.cache(_build_causal_bias)


def _attention_in_three_products(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The causal attention as baddbmm (mask added in the same op), softmax, bmm."""
    *lead, n, head_dim = q.shape
    q, k, v = (t.reshape(-1, n, head_dim) for t in (q, k, v))  # (B * H, N, D_H)
    # bias + q k^T / sqrt(D_H) in one operation: the mask and the scale cost no extra pass.
    scores = torch.baddbmm(_causal_bias(n, q.dtype, q.device), q, k.transpose(1, 2),
                           alpha=1.0 / math.sqrt(head_dim))
    weights = F.softmax(scores, dim=-1)
    return (weights.to(v.dtype) @ v).view(*lead, n, head_dim)


def _project_qkv(attn: MultiHeadAttention, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q (B, H, N, D_H) and k, v (B, H_KV, N, D_H) from one product with W_Q, W_K, W_V stacked.

    For a single token (a generation step) stacking the weights costs more than it saves, so
    the three projections run apart.
    """
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    if h.shape[-2] == 1:
        return split_heads(attn.q_proj(h), attn.n_heads), *attn.project_keys_values(h)
    weight = torch.cat([p.weight for p in projections])
    bias = None if attn.q_proj.bias is None else torch.cat([p.bias for p in projections])
    sizes = [p.out_features for p in projections]
    q, k, v = F.linear(h, weight, bias).split(sizes, dim=-1)
    return split_heads(q, attn.n_heads), split_heads(k, attn.n_kv_heads), split_heads(v, attn.n_kv_heads)


def fast_block(block: Block, x: Tensor, kv_store: KVStore | None = None) -> Tensor:
    """`block(x, causal=True, kv_store=kv_store)` for a Pre-LN block, with fused kernels and one
    Q/K/V product. x: (B, N, D) -> (B, N, D).

    Uses the block's own parameters; attention weights are not kept. tests/model/test_gpt.py checks
    it against `Block.forward`, the definition it must follow.
    """
    if not block.pre_norm:
        raise ValueError("fast_block computes a Pre-LN block (GPT-2's order); this block is "
                         "Post-LN (pre_norm=False): call block(x) instead")
    attn = block.attn
    q, k, v = _project_qkv(attn, fused_layer_norm(block.ln1, x))
    if kv_store is not None:
        k, v = kv_store(k, v)  # (B, H_KV, earlier + N, D_H)
    groups = attn.n_heads // attn.n_kv_heads
    heads = fused_causal_attention(q, repeat_kv_heads(k, groups), repeat_kv_heads(v, groups))
    x = x + attn.dropout(attn.out_proj(merge_heads(heads)))
    return x + block.mlp(fused_layer_norm(block.ln2, x))
