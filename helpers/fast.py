"""The fast path: the same GPT and the same training step, computed with less work on a CPU.

Nothing here is a new idea; each function computes what a plain one in `helpers.gpt`,
`helpers.layers` or `helpers.train` defines, and tests/test_gpt.py and tests/test_train.py
check each against that definition. Notebook 7 derives the plain versions (section 4, "The
training step by hand") and then hands over to `helpers.train.Trainer`, which uses these:

    fused_layer_norm, fused_causal_attention   PyTorch's fused kernels for LayerNorm, attention
    fast_block, fast_logits                    `Block.forward` and the GPT's layers with them
                                               and one product for Q, K and V (GPT.forward(fast=True))
    cpu_has_native_bf16, pick_dtype            bfloat16 where the hardware has it, else float32
    flatten_into_one_buffer, FlatWeights       every weight and gradient in one buffer each,
                                               with the bf16 working copy
    make_optimizer                             AdamW (decay on matrices only), its fused kernel
    compile_loss                               torch.compile on top (TrainConfig(compile=True))

What each buys is measured in benchmarks/bench_train.py against a plain loop:

- bfloat16 mixed precision, on CPUs with native bf16: forward and backward run on a bf16
  working copy of the model, while the optimiser updates the float32 weights and the copy is
  refreshed from them after every step. This is what `torch.autocast` does op by op, done once
  per step: autocast re-casts weights and activations at every product, about 200 small casts
  per step for the benchmark's GPT, and a step took about 5 % longer with it on a 2-core CPU;
- fused LayerNorm and attention kernels and one Q/K/V product;
- one buffer for all the weights and one for all the gradients: copying the gradients to
  float32, clipping them, the AdamW update and refreshing the bf16 copy are then a few
  operations on long vectors, not a few hundred on small tensors;
- optionally, `torch.compile` fuses the forward and backward passes further. Compiling takes
  tens of seconds on a laptop CPU and needs a C++ compiler, so it is off by default.

Shapes (the legend of `helpers`): B batch, N tokens (M keys, cached ones first), V vocabulary,
D = d_model, H heads, H_KV key/value heads, D_H = head_dim.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from helpers import checks
from helpers.attention import causal_mask
from helpers.layers import Block, LayerNorm
from helpers.multihead import KVStore, MultiHeadAttention, merge_heads, repeat_kv_heads, split_heads

if TYPE_CHECKING:
    from helpers.generation import KVCache
    from helpers.gpt import GPT


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

    Uses the block's own parameters; attention weights are not kept. tests/test_gpt.py checks
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


def fast_logits(model: GPT, x: Tensor, cache: KVCache | None = None) -> Tensor:
    """The GPT's layers after the embedding, with `fast_block`: x (B, N, D) -> logits (B, N, V).

    What `GPT.forward(ids, fast=True)` runs; with a cache, each block's keys and values go to
    it as in `GPT.forward_cached`.
    """
    for layer, block in enumerate(model.blocks):
        x = fast_block(block, x, None if cache is None else cache.store_hook(layer))
    return model.lm_head(fused_layer_norm(model.ln_f, x))


# --- bfloat16 and one buffer for every weight ----------------------------------------------

def cpu_has_native_bf16() -> bool:
    """True on x86 CPUs with AVX512-BF16 or AMX, where bfloat16 matrix products run natively."""
    cpu = getattr(torch, "cpu", None)
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, name, lambda: False)() for name in probes)


def pick_dtype(device: torch.device, precision: str = "auto") -> torch.dtype:
    """The dtype to compute in: "bf16", "fp32", or "auto" (bf16 where it is native).

    Without native support, bf16 products still run but slowly (each one is emulated), so
    "auto" then falls back to float32.
    """
    checks.one_of("precision", precision, ("auto", "bf16", "fp32"))
    if precision != "auto":
        return torch.bfloat16 if precision == "bf16" else torch.float32
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    if device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32


def flatten_into_one_buffer(params: Sequence[Tensor], dtype: torch.dtype) -> Tensor:
    """Move `params` into one new 1-D buffer of `dtype`, in order; each becomes a view of it.

    Writing the buffer writes the parameters and the other way round, so one operation on the
    buffer reaches every parameter. Returns the buffer, (total number of entries,).
    """
    buffer = torch.cat([p.detach().reshape(-1).to(dtype) for p in params])
    for param, view in zip(params, buffer.split([p.numel() for p in params]), strict=True):
        param.data = view.view_as(param)
    return buffer


class FlatWeights:
    """A model's float32 weights in one buffer, their gradients in another, and the model that
    runs forward and backward (the working model) in the compute dtype.

    In float32 the working model is the model itself. In bfloat16 it is a copy whose weights
    and gradients are again one buffer each: backward accumulates into the bf16 gradient
    buffer, `gather_gradients` copies it into the float32 one in a single operation, the
    optimiser updates the float32 weights, and `refresh_working_copy` rounds them back into
    the copy, again in one operation.

    The weights are laid out matrices first, so that `matrices_and_vectors()` can hand AdamW
    two slices: the matrices, which get weight decay, and the biases and LayerNorm gains,
    which do not.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        if not all(p.requires_grad for p in model.parameters()):
            raise ValueError("FlatWeights trains every parameter, and this model has frozen ones "
                             "(requires_grad=False): use TrainConfig(fast=False)")
        self.params = _matrices_first(model)  # a tied matrix appears once
        self.n_matrix_entries = sum(p.numel() for p in self.params if p.dim() >= 2)
        self.weights = flatten_into_one_buffer(self.params, torch.float32)
        self.gradients = torch.zeros_like(self.weights)
        if dtype == torch.float32:
            self.working, self.working_params = model, self.params
            self.working_weights, self.working_gradients = self.weights, self.gradients
        else:
            self.working = copy.deepcopy(model).to(dtype)  # tied weights stay tied; buffers too
            self.working_params = _matrices_first(self.working)  # the same order
            self.working_weights = flatten_into_one_buffer(self.working_params, dtype)
            self.working_gradients = torch.zeros_like(self.working_weights)
        self._weight_addresses = [p.data_ptr() for p in self.params]
        self.zero_gradients()  # attaches the gradient views

    def matrices_and_vectors(self) -> tuple[list[Tensor], list[Tensor]]:
        """Two slices of the float32 weights, each with its slice of the gradients as .grad:
        every matrix entry (weight decay applies), then every vector entry (it does not)."""
        cut = self.n_matrix_entries
        matrices, vectors = self.weights[:cut], self.weights[cut:]
        matrices.grad, vectors.grad = self.gradients[:cut], self.gradients[cut:]
        return [matrices] if cut else [], [vectors] if vectors.numel() else []

    def zero_gradients(self) -> None:
        """Zero the working gradients, and (re)attach them as each parameter's .grad, in case
        something set those to None (as `model.zero_grad()` does)."""
        if self._weight_addresses != [p.data_ptr() for p in self.params]:
            raise RuntimeError("the model's parameters were moved or replaced after the Trainer "
                               "was made (by .to(), .float() or similar): make a new Trainer")
        self.working_gradients.zero_()
        sizes = [p.numel() for p in self.working_params]
        for param, view in zip(self.working_params, self.working_gradients.split(sizes), strict=True):
            if param.grad is None or param.grad.data_ptr() != view.data_ptr():
                param.grad = view.view_as(param)

    @torch.no_grad()
    def gather_gradients(self) -> None:
        """The working gradients, in float32, into the gradients of the weights."""
        if self.working_gradients is not self.gradients:
            self.gradients.copy_(self.working_gradients)

    @torch.no_grad()
    def clip_gradients(self, max_norm: float) -> Tensor:
        """Scale the float32 gradients down so that their norm (over every parameter at once)
        is at most `max_norm`, as torch.nn.utils.clip_grad_norm_ does; returns the norm before.

        On one buffer this is two operations; clip_grad_norm_, even given just the two slices,
        measured several times slower here.
        """
        norm = torch.linalg.vector_norm(self.gradients)
        self.gradients.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    @torch.no_grad()
    def refresh_working_copy(self) -> None:
        """The float32 weights, rounded to the working dtype, into the working copy."""
        if self.working_weights is not self.weights:
            self.working_weights.copy_(self.weights)


def make_optimizer(matrices: Sequence[Tensor], vectors: Sequence[Tensor], lr: float,
                   weight_decay: float, betas: tuple[float, float] = (0.9, 0.99),
                   fused: bool = True) -> torch.optim.AdamW:
    """AdamW that decays `matrices` and leaves `vectors` (biases, LayerNorm gains) alone.

    fused=True asks for PyTorch's single-kernel AdamW step (where this PyTorch has one);
    fused=False is the textbook per-parameter loop.
    """
    groups = [{"params": list(params), "weight_decay": decay}
              for params, decay in ((matrices, weight_decay), (vectors, 0.0)) if len(params)]
    if fused:
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
        except (RuntimeError, TypeError):  # no fused kernel for this device or PyTorch
            return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=True)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=False)


def compile_loss(loss: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """torch.compile(loss): the forward and backward passes fused further, for
    TrainConfig(compile=True). The first call compiles (tens of seconds on a laptop CPU, and it
    needs a C++ compiler); later ones run faster."""
    return torch.compile(loss)


def _matrices_first(model: nn.Module) -> list[Tensor]:
    """The parameters, matrices (dim >= 2, weight decay) before vectors, as in
    `helpers.train.matrices_and_vectors`; the sort is stable, so each group keeps its order."""
    return sorted(model.parameters(), key=lambda p: p.dim() < 2)
