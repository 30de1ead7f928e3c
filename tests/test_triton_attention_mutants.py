"""helpers.flash.triton_attention's Python side: the checks, the tile and option choices, and the
arguments each kernel launch gets, with the kernels replaced by recorders (no kernel runs); then a
few tiny interpreted runs (16 to 40 rows) that hold the wrapper's results to PyTorch's attention.

Written for the mutation run (benchmarks/mutation.py, issue 30): each test fails on a planted
one-line bug in the wrapper. The kernels themselves (triton_kernels.py) are measured on a GPU.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("the Triton kernel needs the triton package (Linux)", allow_module_level=True)
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
else:  # the recorders below stand in for kernels launched on CPU tensors
    pytest.skip("written for a CPU-only machine (the interpreter)", allow_module_level=True)

from helpers.flash import triton_attention as ta  # noqa: E402
from helpers.flash import triton_kernels as kernels  # noqa: E402


def qkv(n_q=16, n_k=16, d=16, dtype=torch.float32, batch=1, heads=1, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, d, generator=gen).to(dtype) for n in (n_q, n_k, n_k)]


class Recorder:
    """Stands in for a @triton.jit kernel: kernel[grid](*args, **kwargs) records one launch."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, args, kwargs))


@pytest.fixture
def recorders(monkeypatch):
    found = {}
    for name in ("flash_forward_kernel", "flash_backward_dk_dv_kernel", "flash_backward_dq_kernel"):
        found[name] = Recorder()
        monkeypatch.setattr(kernels, name, found[name])
    return found


def test_the_backward_checks_out_lse_and_grad_out():
    q, k, v = qkv(4, 6, 16)
    out, lse, grad = torch.zeros(1, 1, 4, 16), torch.zeros(1, 1, 4), torch.zeros(1, 1, 4, 16)
    ta._check_saved(q, out, lse, grad)
    ta._check_saved(q.double(), out.double(), lse.double(), grad.double())
    ta._check_saved(q.half(), out.half(), lse, grad.half())
    expected = "expected a torch.float32 tensor of shape (1, 1, 4, 16) on cpu, to match q"
    cases = [
        ((q, out[:, :, :3], lse, grad), "out is a torch.float32 tensor of shape (1, 1, 3, 16) on cpu, "),
        ((q, out.half(), lse, grad), "out is a torch.float16 tensor of shape (1, 1, 4, 16) on cpu, "),
        ((q, out.to("meta"), lse, grad), "out is a torch.float32 tensor of shape (1, 1, 4, 16) on meta, "),
        ((q, out, lse, grad[..., :8]), "grad_out is a torch.float32 tensor of shape (1, 1, 4, 8) on cpu, "),
        ((q, out, lse, grad.double()), "grad_out is a torch.float64 tensor of shape (1, 1, 4, 16) on cpu, "),
    ]
    for args, start in cases:
        with pytest.raises(ValueError) as error:
            ta._check_saved(*args)
        assert str(error.value) == start + expected
    lse_expected = "expected a torch.float32 tensor of shape (1, 1, 4) on cpu, to match q"
    for bad, got in ((lse[..., :3], "torch.float32 tensor of shape (1, 1, 3)"),
                     (lse.double(), "torch.float64 tensor of shape (1, 1, 4)"),
                     (lse[..., None], "torch.float32 tensor of shape (1, 1, 4, 1)")):
        with pytest.raises(ValueError) as error:
            ta._check_saved(q, out, bad, grad)
        assert str(error.value) == f"lse is a {got} on cpu, {lse_expected}"
    with pytest.raises(ValueError, match=r"^lse is a torch.float32 tensor of shape \(1, 1, 4\) on cpu, "
                                         r"expected a torch.float64 tensor"):
        ta._check_saved(q.double(), out.double(), lse, grad.double())
    with pytest.raises(TypeError) as error:
        ta._check_saved(q, out, lse, None)
    assert str(error.value) == f"grad_out is a NoneType, {expected}"
    with pytest.raises(TypeError, match=r"^out is a list, expected"):
        ta._check_saved(q, [0.0], lse, grad)


@pytest.mark.parametrize("call, error, message", [
    (dict(n_q=0), ValueError, "n_q is 0, expected a positive int"),
    (dict(n_k=-3), ValueError, "n_k is -3, expected a positive int"),
    (dict(head_dim=2.0), TypeError, r"head_dim is 2.0 \(a float\), expected a positive int"),
    (dict(head_dim=8), ValueError, "head_dim is 8, but the kernel supports head dims from 16 to 128"),
    (dict(causal="yes"), TypeError, r"causal is 'yes' \(str\), expected True or False"),
    (dict(n_q=40, causal=True), ValueError, "n_k is 32, expected n_k >= n_q = 40 for causal"),
    (dict(block_q=48), ValueError, "block_q is 48, expected a power of two"),
    (dict(block_k=True), ValueError, "block_k is True, expected a power of two"),
])
def test_key_tiles_visited_names_a_bad_argument_before_any_launch(recorders, call, error, message):
    args = dict(n_q=32, n_k=32, causal=False) | call
    with pytest.raises(error, match="^" + message):
        ta.key_tiles_visited(**args)
    assert not recorders["flash_forward_kernel"].launches
