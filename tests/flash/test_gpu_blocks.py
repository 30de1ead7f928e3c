"""helpers.flash.gpu_blocks: the launch each GPU gets fits its shared memory, by the function's
count and by the compiler's, which compiles the kernels ahead of time for sm_75, sm_80, sm_89 and
sm_90 here, with no GPU.

The compile runs in a subprocess without TRITON_INTERPRET: the other Triton tests of this run set
it before triton is imported, and an interpreted kernel cannot be compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.flash import gpu_blocks
from helpers.flash.gpu_blocks import STUDENT_GPUS, choose_blocks, shared_memory_bytes

KIB = 1024
T4, L4, A100, H100 = (STUDENT_GPUS[name] for name in STUDENT_GPUS)
H200_FORWARD = {64: (128, 64, 4, 3), 128: (128, 64, 8, 2)}  # measured in data/flash_gpu_benchmark.json
H200_BACKWARD = (64, 64, 4, 2)


# --- the choice --------------------------------------------------------------------------------

@pytest.mark.parametrize("head_dim", [16, 33, 64, 65, 80, 128])
def test_the_h100_and_h200_get_the_launches_the_h200_was_measured_with(head_dim):
    chosen = choose_blocks(*H100, head_dim)
    assert chosen.dtype == torch.bfloat16 and chosen.tensor_cores
    assert chosen.forward.launch() == H200_FORWARD[64 if head_dim <= 64 else 128]
    assert chosen.backward.launch() == H200_BACKWARD


def test_the_four_gpus_at_head_dim_128():
    got = {name: (choose_blocks(cc, shared, 128).dtype, choose_blocks(cc, shared, 128).forward.launch(),
                  choose_blocks(cc, shared, 128).backward.launch())
           for name, (cc, shared) in STUDENT_GPUS.items()}
    assert list(got.values()) == [
        (torch.float16, (64, 64, 4, 1), (32, 32, 4, 1)),     # T4: no tensor cores for tl.dot
        (torch.bfloat16, (128, 64, 8, 2), (64, 64, 4, 1)),   # L4: 99 KiB, one backward stage
        (torch.bfloat16, (128, 64, 8, 2), (64, 64, 4, 2)),   # A100
        (torch.bfloat16, (128, 64, 8, 2), (64, 64, 4, 2)),   # H100 / H200
    ]


@pytest.mark.parametrize("gpu", list(STUDENT_GPUS))
@pytest.mark.parametrize("head_dim", [16, 24, 64, 80, 128])
@pytest.mark.parametrize("dtype", [None, torch.float16, torch.float32])
def test_every_launch_fits_its_gpu_by_the_count_of_its_tiles(gpu, head_dim, dtype):
    capability, shared = STUDENT_GPUS[gpu]
    chosen = choose_blocks(capability, shared, head_dim, dtype)
    for blocks, kernels in ((chosen.forward, ("forward",)), (chosen.backward, ("dk_dv", "dq"))):
        counted = [shared_memory_bytes(capability, head_dim, k, blocks.launch(), chosen.dtype)
                   for k in kernels]
        assert blocks.shared_bytes == max(counted) <= shared
    assert chosen.tensor_cores == (capability >= (8, 0) and chosen.dtype != torch.float32)


def test_the_t4_gets_float16_and_no_pipelining():
    for head_dim in (16, 64, 128):
        chosen = choose_blocks(*T4, head_dim)
        assert chosen.dtype == torch.float16 and not chosen.tensor_cores
        assert chosen.forward.num_stages == chosen.backward.num_stages == 1


def test_tiles_are_counted_as_the_docstring_says():
    # T4, d = 128, forward 64 x 64: Q and K tiles of 64 x 128 float32 copies, 32 KiB each.
    assert shared_memory_bytes((7, 5), 128, "forward", (64, 64, 4, 1), torch.float16) == 64 * KIB
    # dK, dV at 32 x 32: K + V (16 KiB each) + 2 x Q (16 KiB).
    assert shared_memory_bytes((7, 5), 128, "dk_dv", (32, 32, 4, 1), torch.float16) == 64 * KIB
    # dQ at 32 x 32: Q + dO (16 KiB each) + K (16 KiB).
    assert shared_memory_bytes((7, 5), 128, "dq", (32, 32, 4, 1), torch.float16) == 48 * KIB
    # Tensor cores, bfloat16: Q 32 KiB + 2 stages x (K + V) 64 KiB; d = 80 is padded to 128.
    assert shared_memory_bytes((9, 0), 80, "forward", (128, 64, 8, 2), torch.bfloat16) == 96 * KIB
    # dK, dV: K + V 32 KiB + 2 stages x (Q + dO) 64 KiB + P (64 x 64) 8 KiB; one stage: 72 KiB.
    assert shared_memory_bytes((8, 9), 128, "dk_dv", (64, 64, 4, 2), torch.bfloat16) == 104 * KIB
    assert shared_memory_bytes((8, 9), 128, "dk_dv", (64, 64, 4, 1), torch.bfloat16) == 72 * KIB
    # float32 never uses the tensor cores: counted as the T4's copies, on any GPU.
    assert shared_memory_bytes((9, 0), 128, "forward", (64, 64, 4, 1), torch.float32) == 64 * KIB


def test_less_shared_memory_never_gives_bigger_tiles():
    for capability in ((7, 5), (8, 0)):
        sizes = []
        for shared in (48 * KIB, 64 * KIB, 99 * KIB, 163 * KIB, 227 * KIB):
            chosen = choose_blocks(capability, shared, 128)
            sizes.append((chosen.forward.shared_bytes, chosen.backward.shared_bytes))
        assert sizes == sorted(sizes)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_t4_refuses_the_h200s_forward_when_it_does_not_fit(head_dim):
    # d = 64: Q 128 x 64 float32 (32 KiB) + P 128 x 64 (32 KiB) = 64 KiB: it fits, just.
    # d = 128: Q 64 KiB + K 32 KiB = 96 KiB: it does not.
    if head_dim == 64:
        assert choose_blocks(*T4, 64, forward=H200_FORWARD[64]).forward.shared_bytes == 64 * KIB
        return
    with pytest.raises(ValueError, match=r"forward is \(128, 64, 8, 2\), which needs 98,304 bytes .*"
                                         r"at most the device's shared_memory, 65,536 bytes"):
        choose_blocks(*T4, 128, forward=H200_FORWARD[128])


def test_the_t4_refuses_the_h200s_backward_at_head_dim_128():
    with pytest.raises(ValueError, match=r"backward is \(64, 64, 4, 2\), which needs 131,072 bytes"):
        choose_blocks(*T4, 128, backward=H200_BACKWARD)
    assert choose_blocks(*H100, 128, backward=(32, 32, 4, 1)).backward.launch() == (32, 32, 4, 1)


def test_a_gpu_too_small_for_any_tiles_names_its_shared_memory():
    with pytest.raises(ValueError, match=r"shared_memory is 8,192 bytes, expected at least"):
        choose_blocks((8, 0), 8 * KIB, 128)


@pytest.mark.parametrize("args, error, message", [
    (("7.5", 65536, 64), TypeError, r"capability is '7.5', expected a \(major, minor\) tuple"),
    (((7,), 65536, 64), TypeError, r"capability is \(7,\), expected a \(major, minor\) tuple"),
    (((7, 0), 65536, 64), ValueError, r"capability is \(7, 0\), expected \(7, 5\) or newer"),
    (((8, 0), 0, 64), ValueError, r"shared_memory is 0, expected a positive int"),
    (((8, 0), 64.0, 64), TypeError, r"shared_memory is 64.0 \(a float\), expected a positive int"),
    (((8, 0), 65536, 8), ValueError, r"head_dim is 8, expected 16 to 128"),
    (((8, 0), 65536, 256), ValueError, r"head_dim is 256, expected 16 to 128"),
    (((8, 0), 65536, True), TypeError, r"head_dim is True \(a bool\), expected a positive int"),
])
def test_bad_arguments_are_named(args, error, message):
    with pytest.raises(error, match=message):
        choose_blocks(*args)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(dtype=torch.int32), ValueError, r"dtype is torch.int32, expected one of torch.float16"),
    (dict(dtype="float16"), ValueError, r"dtype is 'float16', expected one of torch.float16"),
    (dict(forward=(128, 64)), TypeError, r"forward is \(128, 64\), expected a \(BLOCK_Q, BLOCK_K"),
    (dict(forward=(96, 64, 4, 1)), ValueError, r"forward is \(96, 64, 4, 1\), expected .* powers of two"),
    (dict(backward=(64, 64, 3, 1)), ValueError, r"backward is \(64, 64, 3, 1\), expected"),
    (dict(backward=(64, 64, 4, 0)), ValueError, r"backward is \(64, 64, 4, 0\), expected"),
])
def test_bad_dtypes_and_launches_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        choose_blocks((8, 0), 163 * KIB, 64, **kwargs)


def test_bfloat16_is_refused_where_there_are_no_bfloat16_tensor_cores():
    with pytest.raises(ValueError, match=r"dtype is torch.bfloat16, but compute capability \(7, 5\) "
                                         r"has no bfloat16 tensor cores"):
        choose_blocks(*T4, 64, dtype=torch.bfloat16)


def test_shared_memory_bytes_names_a_bad_kernel():
    with pytest.raises(ValueError, match=r"kernel is 'backward', expected one of 'forward', 'dk_dv', 'dq'"):
        shared_memory_bytes((8, 0), 64, "backward", (64, 64, 4, 2), torch.float16)
    with pytest.raises(TypeError, match=r"capability is \[8, 0\]"):
        gpu_blocks.uses_tensor_cores([8, 0], torch.float16)


# --- the compiler agrees: the kernels compile for each GPU, within its shared memory -----------

COMPILE = r'''
import json, subprocess, sys
try:
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource
except ImportError as error:
    print(json.dumps({"skip": f"Triton with its NVIDIA backend is not installed here: {error}"}))
    sys.exit(0)
from helpers.flash import triton_kernels as kernels

jobs = json.loads(sys.argv[1])
try:  # ptxas turns the PTX into a cubin: without it nothing here can be checked
    for arch in {job["arch"] for job in jobs}:
        subprocess.run([get_ptxas(arch).path, "--version"], check=True, capture_output=True)
except (OSError, subprocess.CalledProcessError, RuntimeError) as error:
    print(json.dumps({"skip": f"ptxas cannot run here, so no cubin can be made: {error}"}))
    sys.exit(0)

KERNELS = {"forward": kernels.flash_forward_kernel, "dk_dv": kernels.flash_backward_dk_dv_kernel,
           "dq": kernels.flash_backward_dq_kernel}
TYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
results = []
for job in jobs:
    kernel, element = KERNELS[job["kernel"]], TYPES[job["dtype"]]
    block_q, block_k, warps, stages = job["launch"]
    constants = {"HEAD_DIM": job["head_dim"], "BLOCK_D": job["block_d"], "BLOCK_Q": block_q,
                 "BLOCK_K": block_k, "CAUSAL": True, "ACC_DTYPE": tl.float32,
                 "DOT_PRECISION": "ieee" if element == "fp32" else "tf32"}
    if job["kernel"] == "forward":
        constants["COUNT_TILES"] = False
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in ("Lse", "Delta"):
            signature[name] = "*fp32"
        elif name == "Visits":
            signature[name] = "*i32"
        elif name in ("Q", "K", "V", "Out", "dO", "dK", "dV", "dQ"):
            signature[name] = "*" + element
        else:
            signature[name] = "fp32" if name in ("qk_scale", "scale") else "i32"
    compiled = triton.compile(ASTSource(kernel, signature, constants),
                              target=GPUTarget("cuda", job["arch"], 32),
                              options={"num_warps": warps, "num_stages": stages})
    ptx = compiled.asm["ptx"]
    results.append(job | {"shared": compiled.metadata.shared, "cubin": len(compiled.asm["cubin"]),
                          "dot": "wgmma" if "wgmma" in ptx else "mma" if "mma.sync" in ptx
                          else "fma"})
print(json.dumps({"results": results}))
'''

ROOT = Path(__file__).resolve().parents[2]
HEAD_DIMS = (64, 128)


def compile_jobs(capability: tuple[int, int], shared: int) -> list[dict]:
    """One job per kernel and head dim: the launch and dtype choose_blocks picks for this GPU."""
    jobs = []
    for head_dim in HEAD_DIMS:
        chosen = choose_blocks(capability, shared, head_dim)
        for kernel in gpu_blocks.KERNELS:
            blocks = chosen.forward if kernel == "forward" else chosen.backward
            jobs.append({"arch": capability[0] * 10 + capability[1], "kernel": kernel,
                         "head_dim": head_dim, "block_d": head_dim, "launch": list(blocks.launch()),
                         "dtype": str(chosen.dtype).removeprefix("torch."),
                         "counted": shared_memory_bytes(capability, head_dim, kernel,
                                                        blocks.launch(), chosen.dtype)})
    return jobs


OVER_THE_T4 = {"arch": 75, "kernel": "forward", "head_dim": 128, "block_d": 128,
               "launch": list(H200_FORWARD[128]), "dtype": "float16"}


@pytest.fixture(scope="module")
def compiled_for_each_gpu():
    """Starts one compiling process per GPU at once (they take seconds to a minute each, most
    of it in ptxas), and the one for the H200's forward on a T4; returns their answers."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env |= {"TRITON_DEFAULT_FP_FUSION": "1", "PYTHONPATH": str(ROOT)}
    work = {name: compile_jobs(cc, shared) for name, (cc, shared) in STUDENT_GPUS.items()}
    work["H200 forward on a T4"] = [OVER_THE_T4]
    running = {name: subprocess.Popen([sys.executable, "-c", COMPILE, json.dumps(jobs)], cwd=ROOT,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
               for name, jobs in work.items()}
    answers = {}
    for name, process in running.items():
        out, err = process.communicate(timeout=900)
        assert process.returncode == 0, f"{name}: {err[-3000:]}"
        answers[name] = json.loads(out.splitlines()[-1])
    return answers


def skip_without_ptxas(answer: dict) -> None:
    """Skip, saying why, where the compiler cannot run (no Triton, or a ptxas that fails)."""
    if "skip" in answer:
        pytest.skip(answer["skip"])


@pytest.mark.slow
@pytest.mark.parametrize("gpu", list(STUDENT_GPUS))
def test_the_chosen_launches_compile_within_the_gpus_shared_memory(compiled_for_each_gpu, gpu):
    """Forward, dK/dV and dQ kernels, causal, at head dims 64 and 128, with the tiles and dtype
    choose_blocks picks for the GPU: a cubin comes out, the compiler's shared memory fits the
    device and never exceeds the function's count, and tl.dot runs on the tensor cores exactly
    where the function says it does: Hopper's wgmma on sm_90, mma on sm_80 and sm_89, and fused
    multiply-adds on the ordinary cores on sm_75."""
    answer = compiled_for_each_gpu[gpu]
    skip_without_ptxas(answer)
    capability, shared = STUDENT_GPUS[gpu]
    tensor_cores = choose_blocks(capability, shared, 64).tensor_cores
    dot = "wgmma" if capability >= (9, 0) else "mma" if tensor_cores else "fma"
    assert len(answer["results"]) == len(HEAD_DIMS) * len(gpu_blocks.KERNELS)
    for result in answer["results"]:
        where = f"{gpu} {result['kernel']} d={result['head_dim']} {result['launch']}"
        assert result["cubin"] > 0, where
        assert result["shared"] <= shared, f"{where}: {result['shared']} > {shared} bytes"
        assert result["shared"] <= result["counted"], f"{where}: counted {result['counted']}"
        assert result["dot"] == dot, where


@pytest.mark.slow
def test_the_h200s_forward_is_too_big_for_a_t4_by_the_compilers_count_too(compiled_for_each_gpu):
    """The launch choose_blocks refuses on a T4 (test above) would not launch there: the
    compiler asks for more shared memory than the T4 has."""
    answer = compiled_for_each_gpu["H200 forward on a T4"]
    skip_without_ptxas(answer)
    (result,) = answer["results"]
    assert result["shared"] > T4[1]
    assert result["shared"] == shared_memory_bytes((7, 5), 128, "forward", H200_FORWARD[128],
                                                   torch.float16)
