"""The Triton kernels equal PyTorch's attention, forwards and backwards, and say clearly what they
cannot do.

Without a CUDA GPU the kernel runs under Triton's interpreter: TRITON_INTERPRET=1 must be set
before helpers.flash.triton_attention is imported, because @triton.jit reads it when the kernel is defined.
Sizes are small: the interpreter runs each tile with NumPy, far slower than a GPU.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

if importlib.util.find_spec("triton") is None:  # find_spec: importing triton now would be too early
    pytest.skip("the Triton kernel needs the triton package (Linux)", allow_module_level=True)
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from helpers.flash import tiled  # noqa: E402
from helpers.flash.triton_attention import (  # noqa: E402
    interpreting,
    key_tiles_visited,
    triton_attention,
    triton_attention_backward,
)
from helpers.model.attention import causal_mask, scaled_dot_product_attention  # noqa: E402

DEVICE = "cpu" if interpreting() else "cuda"
TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3}
GRAD_TOLERANCE = {torch.float32: 2e-5, torch.float16: 6e-3}


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
    _, expected_lse = tiled.tiled_attention_fa2(*(t.double() for t in (q, k, v)), causal=causal)
    torch.testing.assert_close(lse.double(), expected_lse, rtol=0, atol=1e-4)


def test_head_dim_128_and_several_heads():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 3, 40, 128, generator=gen).to(DEVICE) for _ in range(3))
    out, _ = triton_attention(q, k, v, causal=True)
    torch.testing.assert_close(out.double(), reference(q, k, v, True), rtol=0, atol=2e-5)


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


# NumPy, which runs the interpreter, has no bfloat16; float64 runs there only (for gradcheck).
UNSUPPORTED = [torch.int32, torch.bfloat16] if interpreting() else [torch.int32, torch.float64]


@pytest.mark.parametrize("dtype", UNSUPPORTED)
def test_unsupported_dtypes_name_the_supported_ones(dtype):
    q, k, v = (t.to(dtype) for t in random_qkv(16, 16, 16, torch.float32))
    with pytest.raises(TypeError, match=r"supports one of: float16.* float32"):
        triton_attention(q, k, v)


@pytest.mark.parametrize("kwargs, message", [
    (dict(block_q=24), "block_q is 24, expected a power of two >= 16"),
    (dict(block_k=8), "block_k is 8, expected a power of two >= 16"),
])
def test_bad_block_sizes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        triton_attention(*random_qkv(16, 16, 16, torch.float32), **kwargs)


def test_three_dimensional_input_is_refused():
    q, k, v = (t[0] for t in random_qkv(16, 16, 16, torch.float32))
    with pytest.raises(ValueError, match=r"q is \(1, 16, 16\), expected a 4-D tensor"):
        triton_attention(q, k, v)


# --- the backward kernels ----------------------------------------------------------------------

def bottom_right_causal(n_q: int, n_k: int) -> torch.Tensor:
    """(n_q, n_k) bool: key j visible to query i when j <= i + n_k - n_q, for any n_q and n_k."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=DEVICE).tril(diagonal=n_k - n_q)


def naive_gradients(q, k, v, upstream, causal: bool):
    """dQ, dK, dV by autograd through naive attention, in float64, on the same (rounded) inputs."""
    inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    mask = bottom_right_causal(q.shape[2], k.shape[2]) if causal else None
    out, _ = scaled_dot_product_attention(*inputs, mask=mask)
    return torch.autograd.grad(out, inputs, upstream.double())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_q, n_k, d", [
    (45, 45, 16),    # ragged: 45 is not a multiple of the 32-row tile
    (20, 50, 32),    # fewer queries than keys
    (50, 20, 16),    # more queries than keys (not causal: refused there, as on the plain path)
    (33, 33, 80),    # head dim padded to 128 inside
    (16, 40, 128),   # the largest head dim
])
def test_gradients_match_autograd_through_naive_attention(dtype, causal, n_q, n_k, d):
    if causal and n_q > n_k:
        pytest.skip("causal with more queries than keys is refused, as on the plain path")
    q, k, v = (t.requires_grad_() for t in random_qkv(n_q, n_k, d, dtype, seed=1))
    upstream = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    out, _ = triton_attention(q, k, v, causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), upstream)
    for name, got, expected in zip("qkv", grads, naive_gradients(q, k, v, upstream, causal), strict=True):
        assert got.dtype == dtype and got.shape == expected.shape, name
        torch.testing.assert_close(got.double(), expected, rtol=0, atol=GRAD_TOLERANCE[dtype],
                                   msg=lambda message, name=name: f"d{name}: {message}")


@pytest.mark.parametrize("block_q, block_k", [(16, 32), (32, 16)])
def test_backward_tiles_of_other_sizes(block_q, block_k):
    """The causal loop bounds of both backward kernels, with query and key tiles of unequal size."""
    q, k, v = random_qkv(37, 53, 16, torch.float32, seed=4)
    upstream = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    out, lse = triton_attention(q, k, v, causal=True)
    grads = triton_attention_backward(q, k, v, out, lse, upstream, causal=True,
                                      block_q=block_q, block_k=block_k)
    for got, expected in zip(grads, naive_gradients(q, k, v, upstream, True), strict=True):
        torch.testing.assert_close(got.double(), expected, rtol=0, atol=2e-5)


@pytest.mark.skipif(not interpreting(), reason="float64 runs under the interpreter only")
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_equal_finite_differences_in_float64(causal):
    """gradcheck's fast mode, written out: for a random direction u of each input and a random
    upstream w, w . (f(x + eps u) - f(x - eps u)) / 2 eps must equal grad_x(w . f) . u. Under the
    interpreter the kernels accept float64 and accumulate in it. torch.autograd.gradcheck with
    fast_mode=True passes too, but when it fails it computes the whole Jacobian for its message,
    two kernel runs per input element: minutes under the interpreter, so it is not used here."""
    gen = torch.Generator().manual_seed(6)
    inputs = [torch.randn(1, 2, n, 16, generator=gen, dtype=torch.float64) for n in (19, 37, 37)]
    upstream = torch.randn(1, 2, 19, 16, generator=gen, dtype=torch.float64)

    def attend(q, k, v):
        return triton_attention(q, k, v, causal=causal, block_q=16, block_k=16)[0]

    leaves = [t.clone().requires_grad_() for t in inputs]
    grads = torch.autograd.grad(attend(*leaves), leaves, upstream)
    eps = 1e-6
    for i, name in enumerate("qkv"):
        direction = torch.randn(inputs[i].shape, generator=gen, dtype=torch.float64)
        plus, minus = list(inputs), list(inputs)
        plus[i], minus[i] = inputs[i] + eps * direction, inputs[i] - eps * direction
        numerical = ((attend(*plus) - attend(*minus)) * upstream).sum() / (2 * eps)
        analytical = (grads[i] * direction).sum()
        assert abs(numerical - analytical) <= 1e-6 * (1 + abs(analytical)), \
            f"d{name}: finite differences {numerical.item()}, backward kernels {analytical.item()}"


def test_only_the_inputs_that_need_gradients_get_them():
    q, k, v = random_qkv(20, 30, 16, torch.float32)
    q.requires_grad_()
    out, lse = triton_attention(q, k, v, causal=True)
    assert out.requires_grad and not lse.requires_grad  # lse is returned for the backward, not trained
    out.sum().backward()
    assert q.grad is not None and k.grad is None and v.grad is None


# --- the causal forward skips the tiles it cannot see ------------------------------------------

def expected_key_tiles(n_q: int, n_k: int, causal: bool, block_q: int, block_k: int) -> list[int]:
    """Per query tile: the key tiles holding at least one key that some query of the tile sees."""
    counts = []
    for first_row in range(0, n_q, block_q):
        last_row = min(first_row + block_q, n_q) - 1
        last_key = min(last_row + n_k - n_q, n_k - 1) if causal else n_k - 1
        counts.append(max(0, -(-(last_key + 1) // block_k)))
    return counts


def test_causal_forward_skips_the_tiles_above_the_diagonal():
    # 4 x 4 tiles: without a mask all 16 are loaded; causal loads 1 + 2 + 3 + 4 = 10, skips 6.
    assert key_tiles_visited(128, 128, causal=False) == [4, 4, 4, 4]
    assert key_tiles_visited(128, 128, causal=True) == [1, 2, 3, 4]


@pytest.mark.parametrize("n_q, n_k, block_q, block_k", [
    (45, 45, 16, 32), (40, 100, 32, 32), (100, 40, 32, 16), (64, 64, 32, 64), (1, 77, 16, 16)])
@pytest.mark.parametrize("causal", [False, True])
def test_key_tiles_counted_by_the_kernel_follow_the_diagonal(n_q, n_k, block_q, block_k, causal):
    if causal and n_q > n_k:
        pytest.skip("causal with more queries than keys is refused, as on the plain path")
    counted = key_tiles_visited(n_q, n_k, causal, block_q=block_q, block_k=block_k)
    assert counted == expected_key_tiles(n_q, n_k, causal, block_q, block_k)


@pytest.mark.parametrize("offset", range(16))
def test_causal_tiles_whose_last_visible_key_opens_a_new_key_tile(offset):
    """N_k - N_q = offset, for every remainder modulo the 16-wide key tile: at offset 1 the last
    key the first query tile sees is the first key of its next key tile (N_q = 32, N_k = 33), the
    case a loop bound one tile short would drop. Outputs and tile counts, each offset."""
    n_q, n_k, block = 32, 32 + offset, 16
    gen = torch.Generator().manual_seed(offset)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen, dtype=torch.float64) for n in (n_q, n_k, n_k))
    out, _ = triton_attention(*(t.float().to(DEVICE) for t in (q, k, v)), causal=True,
                              block_q=block, block_k=block)
    torch.testing.assert_close(out.double().cpu(), reference(q, k, v, True), rtol=0, atol=2e-5)
    assert key_tiles_visited(n_q, n_k, True, block_q=block, block_k=block) == \
        expected_key_tiles(n_q, n_k, True, block, block)


def test_every_batch_and_head_counts_its_own_key_tiles():
    # The forward kernel's count is a (B * H, query tiles) table, one row per (batch, head) program
    # row; key_tiles_visited launches one (batch, head), so only this reads the other rows.
    from helpers.flash.triton_attention import _forward

    q = torch.zeros(2, 3, 40, 16, device=DEVICE)
    k = torch.zeros(2, 3, 70, 16, device=DEVICE)
    visits = torch.full((6, 3), -1, dtype=torch.int32, device=DEVICE)
    _forward(q, k, k, True, 1.0, 16, 16, visits=visits)
    assert visits.tolist() == [expected_key_tiles(40, 70, True, 16, 16)] * 6


@pytest.mark.parametrize("causal", [False, True])
def test_each_query_row_is_shifted_by_its_own_largest_score(causal):
    # Every other query is 1000 times longer, so its scores reach about 3000 while its neighbours'
    # stay near 3, in the same tile: shifting a row by the tile's largest score instead of its own
    # would underflow the short rows' exponentials to 0.
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 1, n, 32, generator=gen, dtype=torch.float64) for n in (8, 40, 40))
    q[:, :, 1::2] *= 1000.0
    expected = reference(q, k, v, causal)
    out, lse = triton_attention(*(t.float().to(DEVICE) for t in (q, k, v)), causal=causal)
    torch.testing.assert_close(out.double().cpu(), expected.cpu(), rtol=0, atol=2e-5)
    _, expected_lse = tiled.tiled_attention_fa2(q, k, v, causal=causal)
    torch.testing.assert_close(lse.double().cpu(), expected_lse, rtol=1e-6, atol=1e-4)


# --- bad arguments name themselves -------------------------------------------------------------

def test_causal_attention_with_more_queries_than_keys_is_refused_as_the_plain_path_does():
    q, k = torch.randn(1, 1, 5, 16, device=DEVICE), torch.randn(1, 1, 3, 16, device=DEVICE)
    for call in (lambda: triton_attention(q, k, k, causal=True),
                 lambda: tiled.flash_attention(q, k, k, causal=True),
                 lambda: causal_mask(5, 3)):
        with pytest.raises(ValueError, match=r"n_k is 3, expected n_k >= n_q = 5"):
            call()
    assert triton_attention(k, q, q, causal=True)[0].shape == (1, 1, 3, 16)  # fewer queries: fine


def test_a_string_causal_flag_is_refused():
    with pytest.raises(TypeError, match=r"causal is 'no' \(str\), expected True or False"):
        triton_attention(*random_qkv(16, 16, 16, torch.float32), causal="no")


@pytest.mark.parametrize("scale", [0, -1, float("nan"), float("inf"), True])
def test_scales_that_are_not_positive_numbers_are_refused(scale):
    with pytest.raises((ValueError, TypeError), match=rf"scale is {re.escape(repr(scale))}.* expected a finite number > 0"):
        triton_attention(*random_qkv(16, 16, 16, torch.float32), scale=scale)


def test_a_numpy_scale_is_accepted():
    q, k, v = random_qkv(16, 24, 16, torch.float32)
    out, _ = triton_attention(q, k, v, scale=np.float32(0.5))
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.5)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=2e-5)


def test_q_and_k_on_different_devices_are_refused():
    q, k, v = random_qkv(16, 16, 16, torch.float32)
    with pytest.raises(ValueError, match=r"q is on .*, k on meta .*: expected all three on one device"):
        triton_attention(q, k.to("meta"), v)


@pytest.mark.parametrize("empty, message", [
    ("q", r"q has shape \(2, 1, 0, 16\): N_q is 0, expected at least one query"),
    ("k", r"k has shape \(2, 1, 0, 16\): N_k is 0, expected at least one key"),
])
def test_an_empty_sequence_names_the_argument(empty, message):
    q, k, v = random_qkv(16, 16, 16, torch.float32)
    if empty == "q":
        q = q[:, :, :0]
    else:
        k, v = k[:, :, :0], v[:, :, :0]
    with pytest.raises(ValueError, match=message):
        triton_attention(q, k, v)


# The kernels compiled ahead of time for each GPU, with no GPU: tests/flash/test_gpu_blocks.py.


def test_module_imports_without_triton_and_fails_only_when_called():
    script = (
        "import sys; sys.modules['triton'] = None; sys.modules['triton.language'] = None\n"
        "import torch, helpers.flash.triton_attention as ft\n"
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
