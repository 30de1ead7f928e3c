"""The FlashAttention-2 forward pass as a Triton kernel, and the Python function that launches it.

    triton_attention(q, k, v, causal)   (B, H, N_q, d) attention -> (output, log-sum-exp)
    triton_available(), interpreting()  can the kernel run here, and does it run interpreted?
    gpu_benchmark(...)                  TFLOP/s and peak memory against N on a CUDA GPU

One program computes one query tile of one (batch, head): it loads its B_r queries once, walks the
key tiles with the online softmax of `helpers.flash.tile_step`, and writes its output tile once.
Query tiles are independent, so the GPU runs as many programs at a time as it has room for.

Triton compiles the kernel for a CUDA GPU. Without one, set the environment variable
TRITON_INTERPRET=1 *before importing this module* (Triton reads it when `@triton.jit` runs): the
same kernel then runs, slowly, on the CPU with NumPy, which is enough to check that it is right.
The interpreter computes bfloat16 wrongly, so there only float16 and float32 are accepted.

Importing this module never fails; without Triton installed, calling the kernel raises an error
that says how to install it.
"""

from __future__ import annotations

import math
import os
from datetime import date
from typing import Any

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (macOS, Windows, a minimal install): the module still imports
    triton = None
    tl = None

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
OUR_METHOD = "triton (ours)"
INTERPRETER_DTYPES = (torch.float16, torch.float32)
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
    def _fold_key_tiles(acc, row_sum, row_max, q, k_start_ptr, v_start_ptr, stride_kn, stride_vn,
                        rows, dims, key_start, key_stop, n_k, causal_offset, qk_scale,
                        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                        CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """The online softmax over key tiles [key_start, key_stop): helpers.flash.tile_step.

        Scores are in log2 units (multiplied by log2 e), so exp2 replaces exp. MASKED is False
        for tiles that every query of this tile sees in full: they skip the mask arithmetic.
        """
        dim_ok = dims < HEAD_DIM
        for start in range(key_start, key_stop, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
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
        return acc, row_sum, row_max

    @triton.jit
    def _flash_forward_kernel(Q, K, V, Out, Lse,
                              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                              n_heads, n_q, n_k, qk_scale,
                              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """One program: query tile program_id(0) of (batch, head) number program_id(1)."""
        query_tile = tl.program_id(0)
        batch_head = tl.program_id(1)
        batch, head = batch_head // n_heads, batch_head % n_heads
        first_row = query_tile * BLOCK_M
        rows = first_row + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)  # BLOCK_D is d rounded up to a power of two; extra dims are 0
        q_ok = (rows[:, None] < n_q) & (dims[None, :] < HEAD_DIM)
        q = tl.load(Q + batch * stride_qb + head * stride_qh + rows[:, None] * stride_qn + dims[None, :],
                    mask=q_ok, other=0.0)
        k_start = K + batch * stride_kb + head * stride_kh
        v_start = V + batch * stride_vb + head * stride_vh

        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
        row_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)

        # Query i sees key j when j <= i + causal_offset (the course's bottom-right triangle).
        causal_offset = n_k - n_q
        if CAUSAL:
            seen_by_all = tl.minimum(first_row + causal_offset + 1, n_k)  # keys every row sees
            seen_by_any = tl.minimum(first_row + BLOCK_M + causal_offset, n_k)
        else:
            seen_by_all = n_k
            seen_by_any = n_k
        unmasked_stop = tl.maximum(seen_by_all, 0) // BLOCK_N * BLOCK_N  # whole tiles only
        masked_stop = tl.maximum(seen_by_any, 0)
        acc, row_sum, row_max = _fold_key_tiles(
            acc, row_sum, row_max, q, k_start, v_start, stride_kn, stride_vn, rows, dims,
            0, unmasked_stop, n_k, causal_offset, qk_scale,
            HEAD_DIM, BLOCK_N, False, CAUSAL, DOT_PRECISION)
        acc, row_sum, row_max = _fold_key_tiles(
            acc, row_sum, row_max, q, k_start, v_start, stride_kn, stride_vn, rows, dims,
            unmasked_stop, masked_stop, n_k, causal_offset, qk_scale,
            HEAD_DIM, BLOCK_N, True, CAUSAL, DOT_PRECISION)

        # Divide once at the end; a query that saw no key keeps output 0 and lse -inf.
        safe_sum = tl.where(row_sum == 0.0, 1.0, row_sum)
        out = acc / safe_sum[:, None]
        tl.store(Out + batch * stride_ob + head * stride_oh + rows[:, None] * stride_on + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=q_ok)
        lse = tl.where(row_sum == 0.0, float("-inf"), row_max + tl.math.log2(safe_sum))
        lse = lse * 0.6931471805599453  # from log2 units back to natural log: times ln 2
        tl.store(Lse + batch_head * n_q + rows, lse, mask=rows < n_q)


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


def _check_inputs(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Raise naming the argument, what it is, and what the kernel supports."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} is {got}, expected a 4-D tensor (batch, heads, N, head_dim)")
    if q.shape[:2] != k.shape[:2] or k.shape != v.shape:
        raise ValueError(f"q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}: "
                         "expected (B, H, N_q, d), (B, H, N_k, d), (B, H, N_k, d)")
    d = q.shape[-1]
    if d != k.shape[-1]:
        raise ValueError(f"q has head_dim {d} and k has head_dim {k.shape[-1]}: expected equal")
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim is {d}, but the kernel supports head dims from "
                         f"{MIN_HEAD_DIM} to {MAX_HEAD_DIM}")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError(f"q has shape {tuple(q.shape)} and k {tuple(k.shape)}: expected N >= 1")
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
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for this head dim.

    Interpreted, small tiles keep the NumPy arrays small. On a GPU, 128 queries by 64 keys keeps
    the tensor cores busy while q, the accumulator and one K/V tile still fit in registers and
    shared memory; larger head dims use more warps to share the bigger accumulator.
    """
    if interpreting():
        return 32, 32, 1, 1
    if head_dim <= 64:
        return 128, 64, 4, 3
    return 128, 64, 8, 2


def triton_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                     scale: float | None = None, block_m: int | None = None,
                     block_n: int | None = None) -> tuple[Tensor, Tensor]:
    """softmax(q k^T * scale) v with the FlashAttention-2 Triton kernel.

    q: (B, H, N_q, d), k and v: (B, H, N_k, d), with 16 <= d <= 128; float16 or float32 (and
    bfloat16 on a GPU). `causal` hides key j from query i when j > i + N_k - N_q.
    Returns output (B, H, N_q, d) in the input dtype and log-sum-exp (B, H, N_q) in float32.
    """
    _require_triton()
    _check_inputs(q, k, v)
    batch, heads, n_q, d = q.shape
    n_k = k.shape[2]
    block_m_default, block_n_default, num_warps, num_stages = default_blocks(d)
    block_m = block_m_default if block_m is None else block_m
    block_n = block_n_default if block_n is None else block_n
    _check_block("block_m", block_m)
    _check_block("block_n", block_n)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q)
    lse = torch.empty(batch, heads, n_q, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(n_q, block_m), batch * heads)
    _flash_forward_kernel[grid](
        q, k, v, out, lse, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
        heads, n_q, n_k, scale * LOG2_E,
        HEAD_DIM=d, BLOCK_D=padded_head_dim(d), BLOCK_M=block_m, BLOCK_N=block_n,
        CAUSAL=bool(causal), DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages)
    return out, lse


# --------------------------------------------------------------------------------------------
# Benchmark on a GPU (run by benchmarks/bench_flash.py --gpu, or by the notebook on a GPU)
# --------------------------------------------------------------------------------------------

def gpu_benchmark(seq_lens: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384),
                  head_dims: tuple[int, ...] = (64, 128), batch: int = 4, heads: int = 16,
                  causal_options: tuple[bool, ...] = (False, True),
                  dtype: torch.dtype = torch.float16) -> dict[str, Any]:
    """Time and peak memory of the kernel, naive attention and each SDPA backend, against N.

    TFLOP/s counts 4 B H N^2 d (halved when causal) over the median time of
    triton.testing.do_bench. Peak memory is torch.cuda.max_memory_allocated during one call, minus
    what was allocated before it (q, k, v). A method that runs out of memory, or has no kernel for
    these inputs, is recorded with None.
    """
    _require_triton()
    if interpreting() or not torch.cuda.is_available():
        raise RuntimeError("gpu_benchmark needs a CUDA GPU, with TRITON_INTERPRET unset")
    rows = []
    for causal in causal_options:
        for d in head_dims:
            for n in seq_lens:
                q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=dtype)
                           for _ in range(3))
                flops = _flops(batch, heads, n, d, causal)
                for method, fn in _benchmark_methods(q, k, v, causal).items():
                    others_may_fail = method != OUR_METHOD  # our kernel failing is a bug: raise
                    rows.append({"method": method, "causal": causal, "head_dim": d, "n": n,
                                 **_measure(fn, flops, others_may_fail)})
                del q, k, v
                torch.cuda.empty_cache()
    return {"device": torch.cuda.get_device_name(), "date": date.today().isoformat(),
            "torch": torch.__version__, "triton": triton.__version__, "dtype": str(dtype),
            "batch": batch, "heads": heads, "results": rows}


def _flops(batch: int, heads: int, n: int, d: int, causal: bool) -> int:
    flops = 4 * batch * heads * n * n * d
    return flops // 2 if causal else flops


def _benchmark_methods(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> dict[str, Any]:
    """name -> zero-argument function computing attention of q, k, v that way."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from helpers.attention import causal_mask, scaled_dot_product_attention

    def naive() -> Tensor:
        mask = causal_mask(q.shape[2], k.shape[2], device=q.device) if causal else None
        return scaled_dot_product_attention(q, k, v, mask=mask)[0]

    def sdpa_with(backend: SDPBackend) -> Any:
        def run() -> Tensor:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    return {OUR_METHOD: lambda: triton_attention(q, k, v, causal=causal)[0],
            "naive": naive,
            "sdpa flash": sdpa_with(SDPBackend.FLASH_ATTENTION),
            "sdpa mem-efficient": sdpa_with(SDPBackend.EFFICIENT_ATTENTION),
            "sdpa math": sdpa_with(SDPBackend.MATH)}


def _measure(fn: Any, flops: int, may_fail: bool) -> dict[str, float | None]:
    """{'ms', 'tflops', 'peak_mb'} of fn on the GPU; all None if it may fail and does (out of
    memory, or no SDPA kernel for these inputs on this GPU)."""
    try:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        ms = triton.testing.do_bench(fn, warmup=25, rep=100)
    except (torch.cuda.OutOfMemoryError, RuntimeError):
        if not may_fail:
            raise
        torch.cuda.empty_cache()
        return {"ms": None, "tflops": None, "peak_mb": None}
    return {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12, "peak_mb": peak / 2**20}
