"""The Triton kernel equals F.scaled_dot_product_attention, and says clearly what it cannot do.

Without a CUDA GPU the kernel runs under Triton's interpreter: TRITON_INTERPRET=1 must be set
before helpers.flash_triton is imported, because @triton.jit reads it when the kernel is defined.
Sizes are small: the interpreter runs each tile with NumPy, far slower than a GPU.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

if importlib.util.find_spec("triton") is None:  # find_spec: importing triton now would be too early
    pytest.skip("the Triton kernel needs the triton package (Linux)", allow_module_level=True)
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from helpers import flash  # noqa: E402
from helpers.attention import causal_mask  # noqa: E402
from helpers.flash_triton import interpreting, triton_attention  # noqa: E402

DEVICE = "cpu" if interpreting() else "cuda"
TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3}


def random_qkv(n_q: int, n_k: int, d: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((2, 1, n_q, d), (2, 1, n_k, d), (2, 1, n_k, d))
    return [torch.randn(*s, generator=gen).to(device=DEVICE, dtype=dtype) for s in shapes]


def reference(q, k, v, causal: bool) -> torch.Tensor:
    """PyTorch's attention in float64 on the same (rounded) inputs."""
    q, k, v = (t.double() for t in (q, k, v))
    if causal and q.shape[2] != k.shape[2]:
        mask = causal_mask(q.shape[2], k.shape[2], device=q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k, d", [
    (45, 45, 16),    # ragged: 45 is not a multiple of the 32-row tile
    (64, 64, 64),    # whole tiles only
    (20, 50, 32),    # fewer queries than keys (decoding with a cache when causal)
    (33, 33, 80),    # a head dim that is not a power of two: padded to 128 inside
])
def test_kernel_matches_pytorch_sdpa(dtype, causal, n_q, n_k, d):
    q, k, v = random_qkv(n_q, n_k, d, dtype)
    out, lse = triton_attention(q, k, v, causal=causal)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.double(), reference(q, k, v, causal),
                               rtol=0, atol=TOLERANCE[dtype])
    _, expected_lse = flash.tiled_attention_fa2(*(t.double() for t in (q, k, v)), causal=causal)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=0, atol=1e-4)


def test_head_dim_128_and_several_heads():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 3, 40, 128, generator=gen).to(DEVICE) for _ in range(3))
    out, _ = triton_attention(q, k, v, causal=True)
    torch.testing.assert_close(out.double(), reference(q, k, v, True), rtol=0, atol=2e-5)


def test_queries_that_see_no_key_get_zeros_not_nan():
    q, k, v = random_qkv(40, 24, 16, torch.float32)
    out, lse = triton_attention(q, k, v, causal=True, block_m=16, block_n=16)
    hidden = 40 - 24  # query i sees keys j <= i - 16: the first 16 queries see none
    assert not out.isnan().any()
    assert torch.equal(out[:, :, :hidden], torch.zeros_like(out[:, :, :hidden]))
    assert lse[:, :, :hidden].eq(float("-inf")).all() and lse[:, :, hidden:].isfinite().all()
    expected, _ = flash.tiled_attention_fa2(*(t.double() for t in (q, k, v)), causal=True)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=2e-5)


def test_non_contiguous_inputs_are_read_through_their_strides():
    gen = torch.Generator().manual_seed(5)
    # (B, N, H, d), as a fused projection lays heads out, viewed as (B, H, N, d) without a copy
    q, k, v = (torch.randn(2, 40, 3, 32, generator=gen).to(DEVICE).transpose(1, 2) for _ in range(3))
    assert not q.is_contiguous()
    out, _ = triton_attention(q, k, v)
    torch.testing.assert_close(out.double(), reference(q, k, v, False), rtol=0, atol=2e-5)


@pytest.mark.parametrize("d", [8, 256])
def test_unsupported_head_dims_name_the_supported_range(d):
    q, k, v = random_qkv(16, 16, d, torch.float32)
    with pytest.raises(ValueError, match=f"head_dim is {d}, but the kernel supports head dims from 16 to 128"):
        triton_attention(q, k, v)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32] + ([torch.bfloat16] if interpreting() else []))
def test_unsupported_dtypes_name_the_supported_ones(dtype):
    q, k, v = (t.to(dtype) for t in random_qkv(16, 16, 16, torch.float32))
    with pytest.raises(TypeError, match=r"supports one of: float16.* float32"):
        triton_attention(q, k, v)


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_m=24), "block_m is 24, expected a power of two >= 16"),
    (dict(block_n=8), "block_n is 8, expected a power of two >= 16"),
])
def test_bad_block_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        triton_attention(*random_qkv(16, 16, 16, torch.float32), **kwargs)


def test_three_dimensional_input_is_refused():
    q, k, v = (t[0] for t in random_qkv(16, 16, 16, torch.float32))
    with pytest.raises(ValueError, match=r"q is \(1, 16, 16\), expected a 4-D tensor"):
        triton_attention(q, k, v)


COMPILE_FOR_GPUS = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from helpers.flash_triton import _flash_forward_kernel

ints = ["stride_qb", "stride_qh", "stride_qn", "stride_kb", "stride_kh", "stride_kn", "stride_vb",
        "stride_vh", "stride_vn", "stride_ob", "stride_oh", "stride_on", "n_heads", "n_q", "n_k"]
for dtype, head_dim, causal, arch in (("fp16", 64, False, 80), ("fp16", 128, True, 90),
                                      ("fp32", 80, True, 80)):
    constants = {"HEAD_DIM": head_dim, "BLOCK_D": triton.next_power_of_2(head_dim), "BLOCK_M": 128,
                 "BLOCK_N": 64, "CAUSAL": causal, "DOT_PRECISION": "tf32" if dtype == "fp16" else "ieee"}
    signature = {name: f"*{dtype}" for name in ("Q", "K", "V", "Out")} | {"Lse": "*fp32"}
    signature |= dict.fromkeys(ints, "i32") | {"qk_scale": "fp32"} | dict.fromkeys(constants, "constexpr")
    compiled = triton.compile(ASTSource(_flash_forward_kernel, signature, constants),
                              target=GPUTarget("cuda", arch, 32), options={"num_warps": 8, "num_stages": 2})
    assert ".entry _flash_forward_kernel" in compiled.asm["ptx"]
    print(f"sm_{arch} {dtype} d={head_dim} causal={causal}: compiled")
"""


def test_kernel_compiles_for_a100_and_h100_without_a_gpu():
    """The interpreter does not compile: this does, ahead of time, to PTX and cubin for sm_80
    (A100) and sm_90 (H100), so type and shape errors of the GPU path show up in CI too."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPUS], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("compiled") == 3


def test_module_imports_without_triton_and_fails_only_when_called():
    script = (
        "import sys; sys.modules['triton'] = None; sys.modules['triton.language'] = None\n"
        "import torch, helpers.flash_triton as ft\n"
        "assert not ft.triton_available()\n"
        "try:\n"
        "    ft.triton_attention(*(torch.randn(1, 1, 16, 16) for _ in range(3)))\n"
        "except ModuleNotFoundError as error:\n"
        "    print('raised:', error)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "raised:" in result.stdout and "pip install triton" in result.stdout
