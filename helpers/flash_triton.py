"""FlashAttention-2 as Triton kernels, forward and backward, and the Python function that runs them.

    triton_attention(q, k, v, causal)   (B, H, N_q, d) attention -> (output, log-sum-exp); trains:
                                        gradients flow to q, k and v through the backward kernels
    key_tiles_visited(n_q, n_k, ...)    how many key tiles each query tile's program loads
    triton_available(), interpreting()  can the kernels run here, and do they run interpreted?

Forward (notebook 8, section 8): one program computes one query tile of one (batch, head): it
loads its B_r queries once, walks the key tiles with the online softmax of
`helpers.flash.tile_step`, and writes its output tile and the log-sum-exp of each row once.

Backward (notebook 8, section 9): `helpers.flash.tiled_attention_backward` on the GPU. Each tile
of P is rebuilt from q, k and the saved log-sum-exp, P = exp(S - lse), never read back. Two
kernels avoid two programs adding to the same rows: one program per *key* tile accumulates dK and
dV over the query tiles, one program per *query* tile accumulates dQ over the key tiles. Both
skip the tiles that the causal mask hides entirely, as the forward does.

Triton compiles the kernels for a CUDA GPU (float16, bfloat16, float32). Without one, set the
environment variable TRITON_INTERPRET=1 *before importing this module* (Triton reads it when
`@triton.jit` runs): the same kernels then run, slowly, on the CPU with NumPy, which is enough to
check that they are right. NumPy has no bfloat16, so the interpreter refuses it; it accepts
float64 instead (accumulating in float64), for `torch.autograd.gradcheck`.

Importing this module never fails; without Triton installed, calling the kernels raises an error
that says how to install it.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from helpers.attention import check_same_device
from helpers.flash import check_causal, checked_scale

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (macOS, Windows, a minimal install): the module still imports
    triton = None
    tl = None

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
INTERPRETER_DTYPES = (torch.float16, torch.float32, torch.float64)
GPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2_E = 1.4426950408889634  # exp(x) = 2^(x log2 e): the GPU's exp2 is its fast instruction
_INTERPRETED_AT_IMPORT = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _triton_was_imported_compiled() -> bool:
    """True when TRITON_INTERPRET=1 came too late: triton's own library functions (tl.zeros ...)
    were already defined for the compiler, and an interpreted kernel cannot call them."""
    if triton is None or not _INTERPRETED_AT_IMPORT:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return not isinstance(tl.zeros, InterpretedFunction)


_INTERPRETER_CAME_TOO_LATE = _triton_was_imported_compiled()


def triton_available() -> bool:
    """True when the triton package imported."""
    return triton is not None


def interpreting() -> bool:
    """True when the kernels were defined under TRITON_INTERPRET=1 and so run on the CPU."""
    return _INTERPRETED_AT_IMPORT


if triton is not None:

    @triton.jit
    def _fold_key_tiles(acc, row_sum, row_max, visited, q, k_start_ptr, v_start_ptr, stride_kn,
                        stride_vn, rows, dims, key_start, key_stop, n_k, causal_offset, qk_scale,
                        HEAD_DIM: tl.constexpr, BLOCK_K: tl.constexpr, MASKED: tl.constexpr,
                        CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """The online softmax over key tiles [key_start, key_stop): helpers.flash.tile_step.

        Scores are in log2 units (multiplied by log2 e), so exp2 replaces exp. MASKED is False
        for tiles that every query of this tile sees in full: they skip the mask arithmetic.
        `visited` counts the key tiles loaded (see key_tiles_visited).
        """
        dim_ok = dims < HEAD_DIM
        for start in range(key_start, key_stop, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            load_ok = dim_ok[None, :]
            if MASKED:
                load_ok = load_ok & (cols[:, None] < n_k)
            k = tl.load(k_start_ptr + cols[:, None] * stride_kn + dims[None, :], mask=load_ok, other=0.0)
            v = tl.load(v_start_ptr + cols[:, None] * stride_vn + dims[None, :], mask=load_ok, other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
            if MASKED:
                visible = cols[None, :] < n_k
                if CAUSAL:
                    visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
                scores = tl.where(visible, scores, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(scores, 1))
            # A row that has seen only hidden keys keeps max -inf: shift it by 0, so exp2 gives 0.
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            probs = tl.math.exp2(scores - shift[:, None])
            correction = tl.math.exp2(row_max - shift)
            row_sum = row_sum * correction + tl.sum(probs, 1)
            acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
            row_max = new_max
            visited += 1
        return acc, row_sum, row_max, visited

    @triton.jit
    def _flash_forward_kernel(Q, K, V, Out, Lse, Visits,
                              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                              n_heads, n_q, n_k, qk_scale,
                              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                              BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                              CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                              ACC_DTYPE: tl.constexpr, COUNT_TILES: tl.constexpr):
        """One program: query tile program_id(0) of (batch, head) number program_id(1)."""
        query_tile = tl.program_id(0)
        batch_head = tl.program_id(1)
        batch, head = batch_head // n_heads, batch_head % n_heads
        first_row = query_tile * BLOCK_Q
        rows = first_row + tl.arange(0, BLOCK_Q)
        dims = tl.arange(0, BLOCK_D)  # BLOCK_D is d rounded up to a power of two; extra dims are 0
        q_ok = (rows[:, None] < n_q) & (dims[None, :] < HEAD_DIM)
        q = tl.load(Q + batch * stride_qb + head * stride_qh + rows[:, None] * stride_qn + dims[None, :],
                    mask=q_ok, other=0.0)
        k_start = K + batch * stride_kb + head * stride_kh
        v_start = V + batch * stride_vb + head * stride_vh

        acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=ACC_DTYPE)
        row_sum = tl.zeros((BLOCK_Q,), dtype=ACC_DTYPE)
        row_max = tl.full((BLOCK_Q,), float("-inf"), dtype=ACC_DTYPE)
        visited = 0

        # Query i sees key j when j <= i + causal_offset (the course's bottom-right triangle).
        causal_offset = n_k - n_q
        if CAUSAL:
            seen_by_all = tl.minimum(first_row + causal_offset + 1, n_k)  # keys every row sees
            seen_by_any = tl.minimum(first_row + BLOCK_Q + causal_offset, n_k)  # tiles past: skipped
        else:
            seen_by_all = n_k
            seen_by_any = n_k
        unmasked_stop = tl.maximum(seen_by_all, 0) // BLOCK_K * BLOCK_K  # whole tiles only
        masked_stop = tl.maximum(seen_by_any, 0)
        acc, row_sum, row_max, visited = _fold_key_tiles(
            acc, row_sum, row_max, visited, q, k_start, v_start, stride_kn, stride_vn, rows, dims,
            0, unmasked_stop, n_k, causal_offset, qk_scale,
            HEAD_DIM, BLOCK_K, False, CAUSAL, DOT_PRECISION)
        acc, row_sum, row_max, visited = _fold_key_tiles(
            acc, row_sum, row_max, visited, q, k_start, v_start, stride_kn, stride_vn, rows, dims,
            unmasked_stop, masked_stop, n_k, causal_offset, qk_scale,
            HEAD_DIM, BLOCK_K, True, CAUSAL, DOT_PRECISION)

        # Divide once at the end; a query that saw no key keeps output 0 and lse -inf.
        safe_sum = tl.where(row_sum == 0.0, 1.0, row_sum)
        out = acc / safe_sum[:, None]
        tl.store(Out + batch * stride_ob + head * stride_oh + rows[:, None] * stride_on + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=q_ok)
        lse = tl.where(row_sum == 0.0, float("-inf"), row_max + tl.math.log2(safe_sum))
        lse = lse * 0.6931471805599453  # from log2 units back to natural log: times ln 2
        tl.store(Lse + batch_head * n_q + rows, lse, mask=rows < n_q)
        if COUNT_TILES:
            tl.store(Visits + batch_head * tl.num_programs(0) + query_tile, visited)

    @triton.jit
    def _recompute_probs(q, k, lse_log2, rows, cols, n_q, n_k, causal_offset, qk_scale,
                         CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """The tile P = exp(S - lse) (BLOCK_Q, BLOCK_K) of the forward pass, rebuilt from q, k and
        the saved log-sum-exp (in log2 units); 0 where a key is hidden or out of range."""
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        visible = (rows[:, None] < n_q) & (cols[None, :] < n_k)
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
        scores = tl.where(visible, scores, float("-inf"))
        # A query that saw no key has lse -inf and only hidden scores: shift by 0, exp2 gives 0.
        shift = tl.where(lse_log2 == float("-inf"), 0.0, lse_log2)
        return tl.math.exp2(scores - shift[:, None])

    @triton.jit
    def _flash_backward_dk_dv_kernel(Q, K, V, dO, Lse, Delta, dK, dV, n_q, n_k, qk_scale, scale,
                                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                                     BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                                     CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                                     ACC_DTYPE: tl.constexpr):
        """One program: key tile program_id(0) of (batch, head) program_id(1). It keeps its K, V
        tile on chip and walks the query tiles that see it:
            dV += P^T dO,  dP = dO V^T,  dS = P * (dP - D),  dK += scale dS^T Q.
        Tensors are contiguous (B, H, N, d); Lse and Delta are (B, H, N_q)."""
        key_tile = tl.program_id(0)
        batch_head = tl.program_id(1)
        first_col = key_tile * BLOCK_K
        cols = first_col + tl.arange(0, BLOCK_K)
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims[None, :] < HEAD_DIM
        kv_offsets = batch_head * n_k * HEAD_DIM + cols[:, None] * HEAD_DIM + dims[None, :]
        kv_ok = (cols[:, None] < n_k) & dim_ok
        k = tl.load(K + kv_offsets, mask=kv_ok, other=0.0)
        v = tl.load(V + kv_offsets, mask=kv_ok, other=0.0)
        dk = tl.zeros((BLOCK_K, BLOCK_D), dtype=ACC_DTYPE)
        dv = tl.zeros((BLOCK_K, BLOCK_D), dtype=ACC_DTYPE)

        causal_offset = n_k - n_q
        first_row = 0
        if CAUSAL:  # query i sees key j when i >= j - offset: earlier query tiles see none of ours
            first_row = tl.maximum(first_col - causal_offset, 0) // BLOCK_Q * BLOCK_Q
        for start in range(first_row, n_q, BLOCK_Q):
            rows = start + tl.arange(0, BLOCK_Q)
            row_ok = rows < n_q
            q_offsets = batch_head * n_q * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :]
            q = tl.load(Q + q_offsets, mask=row_ok[:, None] & dim_ok, other=0.0)
            do = tl.load(dO + q_offsets, mask=row_ok[:, None] & dim_ok, other=0.0)
            lse = tl.load(Lse + batch_head * n_q + rows, mask=row_ok, other=0.0) * 1.4426950408889634
            delta = tl.load(Delta + batch_head * n_q + rows, mask=row_ok, other=0.0)
            probs = _recompute_probs(q, k, lse, rows, cols, n_q, n_k, causal_offset, qk_scale,
                                     CAUSAL, DOT_PRECISION)
            dv += tl.dot(tl.trans(probs.to(do.dtype)), do, input_precision=DOT_PRECISION)
            dprobs = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
            dscores = probs * (dprobs - delta[:, None])
            dk += tl.dot(tl.trans(dscores.to(q.dtype)), q, input_precision=DOT_PRECISION)
        tl.store(dK + kv_offsets, (dk * scale).to(dK.dtype.element_ty), mask=kv_ok)
        tl.store(dV + kv_offsets, dv.to(dV.dtype.element_ty), mask=kv_ok)

    @triton.jit
    def _flash_backward_dq_kernel(Q, K, V, dO, Lse, Delta, dQ, n_q, n_k, qk_scale, scale,
                                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                                  BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                                  CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                                  ACC_DTYPE: tl.constexpr):
        """One program: query tile program_id(0) of (batch, head) program_id(1). It keeps its
        Q, dO tile on chip and walks the key tiles it sees, as the forward does:
            dP = dO V^T,  dS = P * (dP - D),  dQ += scale dS K."""
        query_tile = tl.program_id(0)
        batch_head = tl.program_id(1)
        first_row = query_tile * BLOCK_Q
        rows = first_row + tl.arange(0, BLOCK_Q)
        row_ok = rows < n_q
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims[None, :] < HEAD_DIM
        q_offsets = batch_head * n_q * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :]
        q_ok = row_ok[:, None] & dim_ok
        q = tl.load(Q + q_offsets, mask=q_ok, other=0.0)
        do = tl.load(dO + q_offsets, mask=q_ok, other=0.0)
        lse = tl.load(Lse + batch_head * n_q + rows, mask=row_ok, other=0.0) * 1.4426950408889634
        delta = tl.load(Delta + batch_head * n_q + rows, mask=row_ok, other=0.0)
        dq = tl.zeros((BLOCK_Q, BLOCK_D), dtype=ACC_DTYPE)

        causal_offset = n_k - n_q
        key_stop = n_k
        if CAUSAL:  # the key tiles past the last row's diagonal are hidden from the whole tile
            key_stop = tl.maximum(tl.minimum(first_row + BLOCK_Q + causal_offset, n_k), 0)
        for start in range(0, key_stop, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            kv_offsets = batch_head * n_k * HEAD_DIM + cols[:, None] * HEAD_DIM + dims[None, :]
            kv_ok = (cols[:, None] < n_k) & dim_ok
            k = tl.load(K + kv_offsets, mask=kv_ok, other=0.0)
            v = tl.load(V + kv_offsets, mask=kv_ok, other=0.0)
            probs = _recompute_probs(q, k, lse, rows, cols, n_q, n_k, causal_offset, qk_scale,
                                     CAUSAL, DOT_PRECISION)
            dprobs = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
            dscores = probs * (dprobs - delta[:, None])
            dq += tl.dot(dscores.to(k.dtype), k, input_precision=DOT_PRECISION)
        tl.store(dQ + q_offsets, (dq * scale).to(dQ.dtype.element_ty), mask=q_ok)


def _require_triton() -> None:
    if triton is None:
        raise ModuleNotFoundError(
            "the Triton kernel needs the triton package, which is not installed: "
            "`pip install triton` (Linux; on a machine without a CUDA GPU also set "
            "TRITON_INTERPRET=1 before importing helpers.flash_triton)")
    if _INTERPRETER_CAME_TOO_LATE:
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after triton had been imported (torch.profiler, for one, "
            "imports it), so the kernel cannot be interpreted. Set it before anything imports "
            "triton, e.g. in the first cell of the notebook, then restart the kernel")


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> None:
    """Raise naming the argument, what it is, and what the kernel supports."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} is {got}, expected a 4-D tensor (batch, heads, N, head_dim)")
    check_causal(causal)
    check_same_device(q, k, v)
    if q.shape[:2] != k.shape[:2] or k.shape != v.shape:
        raise ValueError(f"q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}: "
                         "expected (B, H, N_q, d), (B, H, N_k, d), (B, H, N_k, d)")
    d = q.shape[-1]
    if d != k.shape[-1]:
        raise ValueError(f"q has head_dim {d} and k has head_dim {k.shape[-1]}: expected equal")
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim is {d}, but the kernel supports head dims from "
                         f"{MIN_HEAD_DIM} to {MAX_HEAD_DIM}")
    for name, t, what in (("q", q, "N_q is 0, expected at least one query"),
                          ("k", k, "N_k is 0, expected at least one key")):
        if t.shape[2] == 0:
            raise ValueError(f"{name} has shape {tuple(t.shape)}: {what}")
    supported = INTERPRETER_DTYPES if interpreting() else GPU_DTYPES
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in supported:
        where = "under the Triton interpreter" if interpreting() else "on the GPU"
        names = ", ".join(str(t).replace("torch.", "") for t in supported)
        raise TypeError(f"q, k, v have dtypes {q.dtype}, {k.dtype}, {v.dtype}; {where} the kernel "
                        f"supports one of: {names}")
    if interpreting() and q.device.type != "cpu":
        raise ValueError(f"q is on {q.device}; under TRITON_INTERPRET=1 pass CPU tensors")
    if not interpreting() and q.device.type != "cuda":
        raise ValueError(f"q is on {q.device}; the compiled kernel needs CUDA tensors. Without a "
                         "GPU, set TRITON_INTERPRET=1 before importing helpers.flash_triton")


def _check_block(name: str, block: int) -> None:
    if isinstance(block, bool) or not isinstance(block, int) or block < 16 or block & (block - 1):
        raise ValueError(f"{name} is {block!r}, expected a power of two >= 16 "
                         "(Triton tiles are powers of two; tl.dot needs at least 16)")


def padded_head_dim(head_dim: int) -> int:
    """The tile width used for a head dimension: the next power of two, at least 16 (tl.dot)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def default_blocks(head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_Q, BLOCK_K, num_warps, num_stages) of the forward kernel for this head dim.

    Interpreted, small tiles keep the NumPy arrays small. On a GPU, 128 queries by 64 keys keeps
    the tensor cores busy while q, the accumulator and one K/V tile still fit in registers and
    shared memory; larger head dims use more warps to share the bigger accumulator.
    """
    if interpreting():
        return 32, 32, 1, 1
    if head_dim <= 64:
        return 128, 64, 4, 3
    return 128, 64, 8, 2


def default_backward_blocks(head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_Q, BLOCK_K, num_warps, num_stages) of the backward kernels for this head dim.

    A backward program holds two tiles and two accumulators (K, V, dK, dV, or Q, dO, dQ), so its
    tiles are smaller than the forward's. Untuned: a first choice that compiles within the shared
    memory of an A100 and an H100 (tests/test_flash_triton.py checks it ahead of time).
    """
    if interpreting():
        return 32, 32, 1, 1
    if head_dim <= 64:
        return 64, 64, 4, 2
    return 64, 64, 8, 1


def _kernel_options(q: Tensor) -> dict[str, Any]:
    """The dtype-dependent constants every kernel takes: dot precision and accumulator dtype."""
    exact = q.dtype in (torch.float32, torch.float64)  # full-precision products, never TF32
    return {"DOT_PRECISION": "ieee" if exact else "tf32",
            "ACC_DTYPE": tl.float64 if q.dtype == torch.float64 else tl.float32}


def _forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, block_q: int,
             block_k: int, visits: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Launch the forward kernel: (output (B, H, N_q, d), lse (B, H, N_q)). With `visits`, an int32
    (B * H, number of query tiles) tensor, each program also writes how many key tiles it loaded."""
    batch, heads, n_q, d = q.shape
    _, _, num_warps, num_stages = default_blocks(d)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = torch.empty(batch, heads, n_q, dtype=lse_dtype, device=q.device)
    grid = (triton.cdiv(n_q, block_q), batch * heads)
    _flash_forward_kernel[grid](
        q, k, v, out, lse, lse if visits is None else visits,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        heads, n_q, k.shape[2], scale * LOG2_E,
        HEAD_DIM=d, BLOCK_D=padded_head_dim(d), BLOCK_Q=block_q, BLOCK_K=block_k, CAUSAL=causal,
        COUNT_TILES=visits is not None, **_kernel_options(q),
        num_warps=num_warps, num_stages=num_stages)
    return out, lse


def _backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor,
              causal: bool, scale: float, block_q: int | None, block_k: int | None
              ) -> tuple[Tensor, Tensor, Tensor]:
    """Launch the two backward kernels: (dQ, dK, dV), shaped and typed like q, k, v."""
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    default_m, default_n, num_warps, num_stages = default_backward_blocks(d)
    block_q = default_m if block_q is None else block_q
    block_k = default_n if block_k is None else block_k
    # The backward kernels index (B, H, N, d) tensors as laid out contiguously.
    q, k, v, out, grad_out = (t.contiguous() for t in (q, k, v, out, grad_out))
    delta = (grad_out.to(lse.dtype) * out.to(lse.dtype)).sum(dim=-1)  # D = rowsum(dO * O)
    grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    constants = dict(HEAD_DIM=d, BLOCK_D=padded_head_dim(d), BLOCK_Q=block_q, BLOCK_K=block_k,
                     CAUSAL=causal, **_kernel_options(q), num_warps=num_warps, num_stages=num_stages)
    _flash_backward_dk_dv_kernel[(triton.cdiv(n_k, block_k), batch * heads)](
        q, k, v, grad_out, lse, delta, grad_k, grad_v, n_q, n_k, scale * LOG2_E, scale, **constants)
    _flash_backward_dq_kernel[(triton.cdiv(n_q, block_q), batch * heads)](
        q, k, v, grad_out, lse, delta, grad_q, n_q, n_k, scale * LOG2_E, scale, **constants)
    return grad_q, grad_k, grad_v


class TritonAttention(torch.autograd.Function):
    """The forward kernel, saving q, k, v, the output and the log-sum-exp; the backward kernels."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float,
                block_q: int, block_k: int) -> tuple[Tensor, Tensor]:
        out, lse = _forward(q, k, v, causal, scale, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor, _grad_lse: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        grads = _backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.scale, None, None)
        return (*grads, None, None, None, None)


def triton_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                     scale: float | None = None, block_q: int | None = None,
                     block_k: int | None = None) -> tuple[Tensor, Tensor]:
    """softmax(q k^T * scale) v with the FlashAttention-2 Triton kernels; differentiable.

    q: (B, H, N_q, d), k and v: (B, H, N_k, d), with 16 <= d <= 128; float16 or float32, and
    bfloat16 on a GPU (float64 under the interpreter). `causal` hides key j from query i when
    j > i + N_k - N_q. block_q, block_k: the forward's tile sizes (powers of two >= 16).
    Returns output (B, H, N_q, d) in the input dtype and log-sum-exp (B, H, N_q) in float32
    (float64 for float64 inputs). Gradients reach q, k and v through the backward kernels.
    """
    _require_triton()
    _check_inputs(q, k, v, causal)
    scale = checked_scale(scale, q.shape[-1])
    block_m_default, block_n_default, _, _ = default_blocks(q.shape[-1])
    block_q = block_m_default if block_q is None else block_q
    block_k = block_n_default if block_k is None else block_k
    _check_block("block_q", block_q)
    _check_block("block_k", block_k)
    return TritonAttention.apply(q, k, v, causal, scale, block_q, block_k)


def triton_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                              grad_out: Tensor, causal: bool = False, scale: float | None = None,
                              block_q: int | None = None, block_k: int | None = None
                              ) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV from the backward kernels alone, for the output and lse that triton_attention
    returned and the upstream gradient grad_out (B, H, N_q, d). The tile sizes can be chosen here
    (triton_attention's backward uses default_backward_blocks)."""
    _require_triton()
    _check_inputs(q, k, v, causal)
    scale = checked_scale(scale, q.shape[-1])
    for name, block in (("block_q", block_q), ("block_k", block_k)):
        if block is not None:
            _check_block(name, block)
    return _backward(q, k, v, out, lse, grad_out, causal, scale, block_q, block_k)


def key_tiles_visited(n_q: int, n_k: int, causal: bool, block_q: int = 32, block_k: int = 32,
                      head_dim: int = MIN_HEAD_DIM) -> list[int]:
    """How many key tiles the forward kernel loads for each query tile, counted by the kernel.

    Without `causal` every query tile loads all ceil(N_k / block_k) key tiles. With it, a key
    tile that lies wholly above the diagonal of a query tile is never loaded: FlashAttention-2
    stops its loop at the last key the tile's last query sees, which halves the work at N_q = N_k.
    """
    _require_triton()
    device = "cpu" if interpreting() else "cuda"
    q = torch.zeros(1, 1, n_q, head_dim, device=device)
    k = torch.zeros(1, 1, n_k, head_dim, device=device)
    _check_inputs(q, k, k, causal)
    _check_block("block_q", block_q)
    _check_block("block_k", block_k)
    visits = torch.full((1, triton.cdiv(n_q, block_q)), -1, dtype=torch.int32, device=device)
    _forward(q, k, k, causal, 1.0, block_q, block_k, visits=visits)
    return visits[0].tolist()
