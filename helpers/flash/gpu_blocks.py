"""Which tiles, warps, pipeline stages and dtype the Triton kernels get on a given NVIDIA GPU.

    choose_blocks(capability, shared_memory, head_dim)   the forward's and the backward's launch
                                                         and the dtype, for one GPU (GpuBlocks)
    shared_memory_bytes(capability, head_dim, kernel, launch, dtype)
                                                         the shared memory one program's tiles take
    uses_tensor_cores(capability, dtype)                 does Triton's tl.dot run on them there
    STUDENT_GPUS                                         the GPUs students meet: T4, L4, A100,
                                                         H100 / H200

A pure function of three numbers, so a laptop can print what a T4 would get (notebook 8, section
8) and a test can compile the kernels for each GPU ahead of time, without one
(tests/flash/test_gpu_blocks.py). On a GPU, `helpers.flash.triton_attention` asks it with the
numbers `torch.cuda.get_device_properties` reports.

Two things decide the launch. **Shared memory**: each program stages tiles there, and a program
that asks for more than the device allows per block (the opt-in limit, e.g. 64 KiB on a T4) is
refused at launch. **Tensor cores**: in the Triton the course uses, `tl.dot` runs on the tensor
cores (`mma`, `wgmma` on Hopper) only from compute capability 8.0 (Ampere) on; below it, on a
T4, it falls back to fused multiply-adds on the ordinary cores, with both operands converted to
float32 first (triton-lang/triton pull request 5066). The compile test reads the compiled code's
instructions to check which path each GPU gets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from helpers import checks

KERNELS = ("forward", "dk_dv", "dq")  # the three kernels of helpers.flash.triton_kernels
DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what the compiled kernels take
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128  # as helpers.flash.triton_attention supports
TENSOR_CORE_CAPABILITY = (8, 0)  # Triton's tl.dot uses the tensor cores from here on
ASYNC_COPY_CAPABILITY = (8, 0)   # cp.async: loads in flight while the products run (num_stages)

# The most shared memory one program (block) may use, in bytes, after opting in: the "maximum
# amount of shared memory per thread block" of the CUDA C++ Programming Guide's table of
# compute capabilities (64 KB on 7.5, 163 KB on 8.0, 99 KB on 8.6 and 8.9, 227 KB on 9.0), which
# is torch.cuda.get_device_properties(...).shared_memory_per_block_optin on the device.
STUDENT_GPUS = {
    "T4 (Colab's free GPU)": ((7, 5), 64 * 1024),
    "L4": ((8, 9), 99 * 1024),
    "A100": ((8, 0), 163 * 1024),
    "H100 / H200": ((9, 0), 227 * 1024),
}


@dataclass(frozen=True)
class Blocks:
    """One kernel's launch: BLOCK_Q queries by BLOCK_K keys per tile, the warps that run one
    program, the pipeline stages (K/V tiles in flight at once), and the shared memory it needs."""

    block_q: int
    block_k: int
    num_warps: int
    num_stages: int
    shared_bytes: int

    def launch(self) -> tuple[int, int, int, int]:
        """(BLOCK_Q, BLOCK_K, num_warps, num_stages), as triton_attention.default_blocks returns."""
        return self.block_q, self.block_k, self.num_warps, self.num_stages


@dataclass(frozen=True)
class GpuBlocks:
    """What choose_blocks picks for one GPU and head dimension."""

    capability: tuple[int, int]
    shared_memory: int     # the device's opt-in limit per block, bytes
    head_dim: int
    dtype: torch.dtype     # bfloat16 where the tensor cores have it, else float16
    tensor_cores: bool     # does Triton's tl.dot use them here, for this dtype
    forward: Blocks
    backward: Blocks       # both backward kernels (dK, dV and dQ) launch with these


# Tried in this order; the first that fits the device's shared memory is taken. The first row
# of each is what a sweep on an NVIDIA H200 chose (see choose_blocks); the rest are smaller.
_TENSOR_CORE_FORWARD = {64: [(128, 64, 4, 3), (64, 64, 4, 2), (64, 32, 4, 1), (32, 32, 4, 1)],
                        128: [(128, 64, 8, 2), (64, 64, 4, 2), (64, 32, 4, 1), (32, 32, 4, 1)]}
_TENSOR_CORE_BACKWARD = [(64, 64, 4, 2), (64, 64, 4, 1), (32, 32, 4, 1), (16, 16, 4, 1)]
_FMA_FORWARD = [(64, 64, 4, 1), (64, 32, 4, 1), (32, 32, 4, 1), (16, 16, 4, 1)]
_FMA_BACKWARD = [(64, 64, 4, 1), (32, 32, 4, 1), (16, 16, 4, 1)]


def _padded(head_dim: int) -> int:
    """The tile width for a head dimension: the next power of two, at least 16 (as the kernels)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def _check_capability(capability: Any) -> tuple[int, int]:
    if (not isinstance(capability, tuple) or len(capability) != 2
            or not all(checks._is_int(part) for part in capability)):
        raise TypeError(f"capability is {capability!r}, expected a (major, minor) tuple of ints "
                        "such as (7, 5) for a T4")
    capability = (int(capability[0]), int(capability[1]))
    if capability < (7, 5):
        raise ValueError(f"capability is {capability}, expected (7, 5) or newer: Triton compiles "
                         "for NVIDIA GPUs from the Turing generation (T4) on")
    return capability


def _check_head_dim(head_dim: Any) -> int:
    head_dim = checks.positive_int("head_dim", head_dim)
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim is {head_dim}, expected {MIN_HEAD_DIM} to {MAX_HEAD_DIM} "
                         "(the kernels' range)")
    return head_dim


def _check_launch(name: str, launch: Any) -> tuple[int, int, int, int]:
    expected = ("a (BLOCK_Q, BLOCK_K, num_warps, num_stages) tuple: tiles powers of two >= 16, "
                "num_warps a power of two from 1 to 16, num_stages >= 1")
    if not isinstance(launch, tuple) or len(launch) != 4 or not all(
            checks._is_int(part) for part in launch):
        raise TypeError(f"{name} is {launch!r}, expected {expected}")
    block_q, block_k, warps, stages = (int(part) for part in launch)
    if (any(b < 16 or b & (b - 1) for b in (block_q, block_k)) or warps not in (1, 2, 4, 8, 16)
            or stages < 1):
        raise ValueError(f"{name} is {launch!r}, expected {expected}")
    return block_q, block_k, warps, stages


def uses_tensor_cores(capability: tuple[int, int], dtype: torch.dtype) -> bool:
    """Does Triton's tl.dot run on the tensor cores for this GPU and dtype? From compute
    capability 8.0 on for float16 and bfloat16; never for float32, which the kernels multiply
    exactly (input_precision="ieee", not TF32) on the ordinary cores."""
    capability = _check_capability(capability)
    checks.one_of("dtype", dtype, DTYPES)
    return capability >= TENSOR_CORE_CAPABILITY and dtype != torch.float32


def shared_memory_bytes(capability: tuple[int, int], head_dim: int, kernel: str,
                        launch: tuple[int, int, int, int], dtype: torch.dtype) -> int:
    """Bytes of shared memory one program of `kernel` ("forward", "dk_dv" or "dq") keeps, for a
    launch (BLOCK_Q, BLOCK_K, num_warps, num_stages) on a GPU of this compute capability.

    It counts the tiles the program stages in shared memory. D is head_dim padded to a power of
    two; a tile of r rows by c columns takes r * c * (bytes per element); Q, dO are BLOCK_Q x D,
    K, V are BLOCK_K x D, and P (or dS) is BLOCK_Q x BLOCK_K.

    Without tensor cores (a T4; float32 anywhere) `tl.dot` multiplies float32 copies of its
    operands, 4 bytes each. A T4 has no asynchronous copies to pipeline loads with, so its
    num_stages changes nothing; for float32 on newer GPUs only 1 stage is counted (and chosen).
    The tiles a program loads once stay for the whole loop; the loop's operands pass through one
    at a time, two in the dK, dV kernel:
        forward  Q + the largest of K, V and P
        dk_dv    K + V + 2 x the largest of Q, dO and P
        dq       Q + dO + the largest of K, V and dS

    With tensor cores the operands keep the input dtype (2 bytes), and each tile the loop loads
    may be in flight num_stages times (loaded ahead while the current ones are multiplied):
        forward  Q + num_stages x (K + V)
        dk_dv    K + V + num_stages x (Q + dO) + P   (P transposed goes through shared memory)
        dq       Q + dO + num_stages x (K + V) + dS

    Both were written from what Triton 3.9 allocates (`compiled.metadata.shared`) for these
    kernels on sm_75, sm_80, sm_89 and sm_90. The first is what it allocates; the second is an
    upper bound (the compiler shares some buffers between stages). tests/flash/test_gpu_blocks.py
    compiles the chosen launches and checks that the count is never below the compiler's.
    """
    capability = _check_capability(capability)
    head_dim = _check_head_dim(head_dim)
    checks.one_of("kernel", kernel, KERNELS)
    block_q, block_k, _, stages = _check_launch("launch", launch)
    d = _padded(head_dim)
    q, kv, p = block_q * d, block_k * d, block_q * block_k  # elements of one tile
    if not uses_tensor_cores(capability, dtype):
        if stages != 1 and capability >= ASYNC_COPY_CAPABILITY:
            raise ValueError(f"launch is {launch!r}: for float32 only num_stages 1 is counted "
                             "here (more stages pipeline float32 tiles too), expected 1")
        tiles = {"forward": q + max(kv, p), "dk_dv": 2 * kv + 2 * max(q, p),
                 "dq": 2 * q + max(kv, p)}
        return 4 * tiles[kernel]
    tiles = {"forward": q + stages * 2 * kv, "dk_dv": 2 * kv + stages * 2 * q + p,
             "dq": 2 * q + stages * 2 * kv + p}
    return dtype.itemsize * tiles[kernel]


def _first_fitting(capability: tuple[int, int], shared_memory: int, head_dim: int,
                   dtype: torch.dtype, name: str, launches: list[tuple[int, int, int, int]]
                   ) -> Blocks:
    """The first launch in `launches` whose every kernel of `name` fits in shared_memory."""
    kernels = ("forward",) if name == "forward" else ("dk_dv", "dq")
    for launch in launches:
        needed = max(shared_memory_bytes(capability, head_dim, k, launch, dtype) for k in kernels)
        if needed <= shared_memory:
            return Blocks(*launch, shared_bytes=needed)
    if len(launches) == 1:
        raise ValueError(f"{name} is {launches[0]}, which needs {needed:,} bytes of shared memory "
                         f"on compute capability {capability} at head_dim {head_dim} in {dtype}, "
                         f"expected at most the device's shared_memory, {shared_memory:,} bytes")
    raise ValueError(f"shared_memory is {shared_memory:,} bytes, expected at least {needed:,}: "
                     f"even the smallest {name} tiles {launches[-1]} need that on compute "
                     f"capability {capability} at head_dim {head_dim} in {dtype}")


def choose_blocks(capability: tuple[int, int], shared_memory: int, head_dim: int,
                  dtype: torch.dtype | None = None,
                  forward: tuple[int, int, int, int] | None = None,
                  backward: tuple[int, int, int, int] | None = None) -> GpuBlocks:
    """The kernels' launches and dtype for a GPU of compute capability `capability` (major,
    minor), `shared_memory` bytes of shared memory per block (the opt-in limit,
    torch.cuda.get_device_properties(...).shared_memory_per_block_optin) and a head dimension.

    dtype: None picks bfloat16 where the tensor cores have it (8.0 on), else float16 (a T4 has
    no bfloat16 tensor cores; torch emulates it there); float32 may be asked for, not chosen.
    forward, backward: a launch (BLOCK_Q, BLOCK_K, num_warps, num_stages) to check instead of
    choosing one; a launch that does not fit raises ValueError, as does a GPU too small for any.

    Each launch is the first of a short list whose tiles fit (shared_memory_bytes counts them):
    - With tensor cores the lists start with the launches data/flash_gpu_benchmark.json was
      measured with on an NVIDIA H200. Forward: 128 queries by 64 keys keeps the tensor cores
      busy; 4 warps and 3 stages up to d = 64, 8 warps (for the twice larger accumulator) and 2
      stages above. Backward: a program holds two tiles and two accumulators, so smaller tiles,
      64 x 64 with 4 warps and 2 stages, the best of a sweep on the H200 (2026-11-27, torch
      2.11, Triton 3.6; N = 8192, float16, batch 4, 16 heads), in % of the TFLOP/s of SDPA's
      flash backend (forward+backward, full / causal):

        (BLOCK_Q, BLOCK_K, warps, stages)   d = 128     d = 64
        (64, 64, 8, 1), the first choice     58 / 56
        (64, 64, 4, 1)                      101 / 99
        (64, 64, 4, 2), chosen              113 / 113   110 / 98
        (64, 128, 4, 2)                                 101 / 96
        (128, 128, 8, 2)                                 98 / 94
        (128, 128, 8, 1)                     95 / 91
        (128, 64, 8, 1)                      94 / 89
        (128, 64, 8, 2)                                  85 / 84

      At d = 128 in bfloat16 these need Q 32 KiB + 2 stages x (K + V) 64 KiB = 96 KiB forward
      and K, V 32 KiB + 2 x (Q, dO) 64 KiB + P 8 KiB = 104 KiB backward: they fit an A100
      (163 KiB) and an H100 (227 KiB); an L4 (99 KiB) keeps the forward and gets 1 backward
      stage (72 KiB). Only the H200 was measured.
    - Without tensor cores (a T4, or float32) operands are float32 copies and nothing is
      pipelined, so the list starts at 64 x 64, 1 stage. At d = 128 the forward needs Q 32 KiB +
      K 32 KiB = 64 KiB, just what a T4 allows; the backward's 64 x 64 would need 128 KiB, so it
      gets 32 x 32 (K, V 32 KiB + 2 x Q 16 KiB = 64 KiB). No T4 was measured: these are the
      largest tiles that fit, chosen so that the kernels run there.
    """
    capability = _check_capability(capability)
    shared_memory = checks.positive_int("shared_memory", shared_memory)
    head_dim = _check_head_dim(head_dim)
    tensor_core_gpu = capability >= TENSOR_CORE_CAPABILITY
    if dtype is None:
        dtype = torch.bfloat16 if tensor_core_gpu else torch.float16
    checks.one_of("dtype", dtype, DTYPES)
    if dtype == torch.bfloat16 and not tensor_core_gpu:
        raise ValueError(f"dtype is torch.bfloat16, but compute capability {capability} has no "
                         "bfloat16 tensor cores: expected torch.float16 or torch.float32")
    fast = uses_tensor_cores(capability, dtype)
    launches = {"forward": _TENSOR_CORE_FORWARD[64 if head_dim <= 64 else 128] if fast
                else _FMA_FORWARD,
                "backward": _TENSOR_CORE_BACKWARD if fast else _FMA_BACKWARD}
    for name, asked in (("forward", forward), ("backward", backward)):
        if asked is not None:
            launches[name] = [_check_launch(name, asked)]
    fitting = [_first_fitting(capability, shared_memory, head_dim, dtype, name, launches[name])
               for name in ("forward", "backward")]
    return GpuBlocks(capability, shared_memory, head_dim, dtype, fast, *fitting)
