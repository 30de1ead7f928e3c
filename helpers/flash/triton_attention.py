"""FlashAttention-2 as Triton kernels, forward and backward, and the Python function that runs them.

    triton_attention(q, k, v, causal)   (B, H, N_q, d) attention -> (output, log-sum-exp); trains:
                                        gradients flow to q, k and v through the backward kernels
    key_tiles_visited(n_q, n_k, ...)    how many key tiles each query tile's program loads
    triton_available(), interpreting()  can the kernels run here, and do they run interpreted?
    default_blocks(head_dim, dtype)     the launch on this GPU (helpers.flash.gpu_blocks)

The kernels themselves are in `helpers.flash.triton_kernels`; this module checks the inputs,
picks the tiles, launches the kernels and wraps them in a torch.autograd.Function.

Forward (notebook 8, section 8): one program computes one query tile of one (batch, head): it
loads its B_r queries once, walks the key tiles with the online softmax of
`helpers.flash.tiled.tile_step`, and writes its output tile and the log-sum-exp of each row once.

Backward (notebook 8, section 9): `helpers.flash.tiled.tiled_attention_backward` on the GPU. Each tile
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

from helpers import checks
from helpers.flash import gpu_blocks
from helpers.flash import triton_kernels as kernels
from helpers.flash.tiled import check_causal, checked_scale
from helpers.flash.triton_kernels import LOG2_E, tl, triton
from helpers.model.attention import check_same_device

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
INTERPRETER_DTYPES = (torch.float16, torch.float32, torch.float64)
GPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
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


def _require_triton() -> None:
    if triton is None:
        raise ModuleNotFoundError(
            "the Triton kernel needs the triton package, which is not installed: "
            "`pip install triton` (Linux; on a machine without a CUDA GPU also set "
            "TRITON_INTERPRET=1 before importing helpers.flash.triton_attention)")
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
    check_causal(causal, q.shape[-2], k.shape[-2])
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
                         "GPU, set TRITON_INTERPRET=1 before importing helpers.flash.triton_attention")


def _check_block(name: str, block: int) -> None:
    if isinstance(block, bool) or not isinstance(block, int) or block < 16 or block & (block - 1):
        raise ValueError(f"{name} is {block!r}, expected a power of two >= 16 "
                         "(Triton tiles are powers of two; tl.dot needs at least 16)")


def padded_head_dim(head_dim: int) -> int:
    """The tile width used for a head dimension: the next power of two, at least 16 (tl.dot)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def gpu_launches(head_dim: int, dtype: torch.dtype = torch.float16,
                 device: torch.device | str | None = None) -> gpu_blocks.GpuBlocks:
    """gpu_blocks.choose_blocks for a CUDA device (the current one by default): its compute
    capability and shared memory per block from torch.cuda.get_device_properties."""
    props = torch.cuda.get_device_properties(device)
    return gpu_blocks.choose_blocks((props.major, props.minor), props.shared_memory_per_block_optin,
                                    head_dim, dtype)


def default_blocks(head_dim: int, dtype: torch.dtype = torch.float16,
                   device: torch.device | str | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_Q, BLOCK_K, num_warps, num_stages) of the forward kernel for this head dim.

    Interpreted, small tiles keep the NumPy arrays small. On a GPU, what
    `helpers.flash.gpu_blocks.choose_blocks` picks for the device and dtype (its docstring says
    why): 128 queries by 64 keys with tensor cores, smaller tiles where they do not fit.
    """
    if interpreting():
        return 32, 32, 1, 1
    return gpu_launches(head_dim, dtype, device).forward.launch()


def default_backward_blocks(head_dim: int, dtype: torch.dtype = torch.float16,
                            device: torch.device | str | None = None) -> tuple[int, int, int, int]:
    """(BLOCK_Q, BLOCK_K, num_warps, num_stages) of the backward kernels for this head dim: a
    backward program holds two tiles and two accumulators, so its tiles are smaller than the
    forward's (64 x 64 with tensor cores); `gpu_blocks.choose_blocks` has the H200 sweep that
    chose them."""
    if interpreting():
        return 32, 32, 1, 1
    return gpu_launches(head_dim, dtype, device).backward.launch()


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
    _, _, num_warps, num_stages = default_blocks(d, q.dtype, q.device)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = torch.empty(batch, heads, n_q, dtype=lse_dtype, device=q.device)
    grid = (triton.cdiv(n_q, block_q), batch * heads)
    kernels.flash_forward_kernel[grid](
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
    default_m, default_n, num_warps, num_stages = default_backward_blocks(d, q.dtype, q.device)
    block_q = default_m if block_q is None else block_q
    block_k = default_n if block_k is None else block_k
    # The backward kernels index (B, H, N, d) tensors as laid out contiguously.
    q, k, v, out, grad_out = (t.contiguous() for t in (q, k, v, out, grad_out))
    delta = (grad_out.to(lse.dtype) * out.to(lse.dtype)).sum(dim=-1)  # D = rowsum(dO * O)
    grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    constants = dict(HEAD_DIM=d, BLOCK_D=padded_head_dim(d), BLOCK_Q=block_q, BLOCK_K=block_k,
                     CAUSAL=causal, **_kernel_options(q), num_warps=num_warps, num_stages=num_stages)
    kernels.flash_backward_dk_dv_kernel[(triton.cdiv(n_k, block_k), batch * heads)](
        q, k, v, grad_out, lse, delta, grad_k, grad_v, n_q, n_k, scale * LOG2_E, scale, **constants)
    kernels.flash_backward_dq_kernel[(triton.cdiv(n_q, block_q), batch * heads)](
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
    block_m_default, block_n_default, _, _ = default_blocks(q.shape[-1], q.dtype, q.device)
    block_q = block_m_default if block_q is None else block_q
    block_k = block_n_default if block_k is None else block_k
    _check_block("block_q", block_q)
    _check_block("block_k", block_k)
    return TritonAttention.apply(q, k, v, causal, scale, block_q, block_k)


def _check_saved(q: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor) -> None:
    """out and grad_out shaped, typed and placed like q, lse like the log-sum-exp triton_attention
    returns for q: the backward kernels index them with q's sizes, so a smaller tensor would be
    read past its end."""
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    for name, t, shape, dtype in (("out", out, q.shape, q.dtype), ("lse", lse, q.shape[:3], lse_dtype),
                                  ("grad_out", grad_out, q.shape, q.dtype)):
        expected = f"expected a {dtype} tensor of shape {tuple(shape)} on {q.device}, to match q"
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} is a {type(t).__name__}, {expected}")
        if t.shape != shape or t.dtype != dtype or t.device != q.device:
            raise ValueError(f"{name} is a {t.dtype} tensor of shape {tuple(t.shape)} on {t.device}, "
                             f"{expected}")


def triton_attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                              grad_out: Tensor, causal: bool = False, scale: float | None = None,
                              block_q: int | None = None, block_k: int | None = None
                              ) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV from the backward kernels alone, for the output and lse that triton_attention
    returned and the upstream gradient grad_out (B, H, N_q, d). The tile sizes can be chosen here
    (triton_attention's backward uses default_backward_blocks)."""
    _require_triton()
    _check_inputs(q, k, v, causal)
    _check_saved(q, out, lse, grad_out)
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
    for name, size in (("n_q", n_q), ("n_k", n_k), ("head_dim", head_dim)):
        checks.positive_int(name, size)
    check_causal(causal, n_q, n_k)
    device = "cpu" if interpreting() else "cuda"
    q = torch.zeros(1, 1, n_q, head_dim, device=device)
    k = torch.zeros(1, 1, n_k, head_dim, device=device)
    _check_inputs(q, k, k, causal)
    _check_block("block_q", block_q)
    _check_block("block_k", block_k)
    visits = torch.full((1, triton.cdiv(n_q, block_q)), -1, dtype=torch.int32, device=device)
    _forward(q, k, k, causal, 1.0, block_q, block_k, visits=visits)
    return visits[0].tolist()
