"""helpers.flash.triton_attention's Python side: the checks, the tile and option choices, and the
arguments each kernel launch gets, with the kernels replaced by recorders (no kernel runs); then a
few tiny interpreted runs (16 to 40 rows) that hold the wrapper's results to PyTorch's attention.

 The kernels themselves (triton_kernels.py) are measured on a GPU.
"""

from __future__ import annotations

import importlib.util
import math
import os
import types

import pytest
import torch
import torch.nn.functional as F

if importlib.util.find_spec("triton") is None:
    pytest.skip("the Triton kernel needs the triton package (Linux)", allow_module_level=True)
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
else:  # the recorders below stand in for kernels launched on CPU tensors
    pytest.skip("written for a CPU-only machine (the interpreter)", allow_module_level=True)

from helpers.flash import triton_attention as ta  # noqa: E402
from helpers.flash import triton_kernels as kernels  # noqa: E402
from helpers.flash.triton_kernels import LOG2_E, tl  # noqa: E402
from helpers.model.attention import scaled_dot_product_attention  # noqa: E402


def close(got, want, atol):
    """torch.testing.assert_close(got, want, rtol=0, atol=atol), without its first call's imports
    (two seconds)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.dtype)
    assert (got - want).abs().max().item() <= atol


def qkv(n_q=16, n_k=16, d=16, dtype=torch.float32, batch=1, heads=1, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, d, generator=gen).to(dtype) for n in (n_q, n_k, n_k)]


def stand_in_gpu(monkeypatch, major: int, minor: int, shared: int) -> list:
    """torch.cuda.get_device_properties answers as a GPU of this capability and shared memory;
    returns the list of devices it was asked about."""
    asked = []

    def properties(device=None):
        asked.append(device)
        return types.SimpleNamespace(major=major, minor=minor, shared_memory_per_block_optin=shared)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    return asked


@pytest.fixture
def compiled(monkeypatch):
    """As if the kernels had been defined for a GPU (TRITON_INTERPRET unset), an H200."""
    monkeypatch.setattr(ta, "_INTERPRETED_AT_IMPORT", False)
    return stand_in_gpu(monkeypatch, 9, 0, 227 * 1024)


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


# --- can the kernels run here -----------------------------------------------------------------

def test_availability_and_interpretation(monkeypatch):
    assert ta.triton_available() is True and ta.interpreting() is True
    assert ta._triton_was_imported_compiled() is False  # the interpreter came first (conftest)
    monkeypatch.setattr(ta, "tl", types.SimpleNamespace(zeros=lambda: None))
    assert ta._triton_was_imported_compiled() is True   # tl.zeros defined for the compiler
    monkeypatch.setattr(ta, "_INTERPRETED_AT_IMPORT", False)
    assert ta._triton_was_imported_compiled() is False  # not interpreting: nothing came too late
    assert ta.interpreting() is False
    monkeypatch.setattr(ta, "_INTERPRETED_AT_IMPORT", True)
    monkeypatch.setattr(ta, "triton", None)
    assert ta._triton_was_imported_compiled() is False and ta.triton_available() is False


def test_require_triton_says_what_to_do(monkeypatch):
    ta._require_triton()  # here: nothing to say
    monkeypatch.setattr(ta, "_INTERPRETER_CAME_TOO_LATE", True)
    with pytest.raises(RuntimeError) as late:
        ta._require_triton()
    assert str(late.value) == (
        "TRITON_INTERPRET=1 was set after triton had been imported (torch.profiler, for one, "
        "imports it), so the kernel cannot be interpreted. Set it before anything imports "
        "triton, e.g. in the first cell of the notebook, then restart the kernel")
    monkeypatch.setattr(ta, "triton", None)
    with pytest.raises(ModuleNotFoundError) as missing:
        ta._require_triton()
    assert str(missing.value) == (
        "the Triton kernel needs the triton package, which is not installed: "
        "`pip install triton` (Linux; on a machine without a CUDA GPU also set "
        "TRITON_INTERPRET=1 before importing helpers.flash.triton_attention)")
    for call in (lambda: ta.triton_attention(*qkv()),
                 lambda: ta.triton_attention_backward(*qkv(), None, None, None),
                 lambda: ta.key_tiles_visited(0, 0, "no")):  # before any other check
        with pytest.raises(ModuleNotFoundError, match="pip install triton"):
            call()


# --- tiles and options ----------------------------------------------------------------------------

def test_padded_head_dim_is_the_next_power_of_two_at_least_16():
    widths = {1: 16, 15: 16, 16: 16, 17: 32, 32: 32, 33: 64, 64: 64, 65: 128, 80: 128, 128: 128}
    assert {d: ta.padded_head_dim(d) for d in widths} == widths


def test_default_tiles_interpreted():
    for d in (16, 64, 65, 128):
        assert ta.default_blocks(d) == (32, 32, 1, 1)
        assert ta.default_backward_blocks(d) == (32, 32, 1, 1)


def test_default_tiles_on_a_gpu(compiled):
    assert ta.default_blocks(16) == ta.default_blocks(64) == (128, 64, 4, 3)
    assert ta.default_blocks(65) == ta.default_blocks(128) == (128, 64, 8, 2)
    assert ta.default_backward_blocks(16) == ta.default_backward_blocks(64) == (64, 64, 4, 2)
    assert ta.default_backward_blocks(65) == ta.default_backward_blocks(128) == (64, 64, 4, 2)


def test_default_tiles_follow_the_devices_capability_and_shared_memory(monkeypatch, compiled):
    asked = stand_in_gpu(monkeypatch, 7, 5, 64 * 1024)  # a T4
    assert ta.default_blocks(128, torch.float16, "cuda:1") == (64, 64, 4, 1)
    assert ta.default_backward_blocks(128, torch.float16, "cuda:1") == (32, 32, 4, 1)
    assert asked == ["cuda:1", "cuda:1"]
    assert ta.gpu_launches(64).dtype == torch.float16  # no bfloat16 tensor cores
    with pytest.raises(ValueError, match="dtype is torch.bfloat16, but compute capability"):
        ta.default_blocks(64, torch.bfloat16)


def test_kernel_options_per_dtype():
    assert ta._kernel_options(torch.zeros(1)) == {"DOT_PRECISION": "ieee", "ACC_DTYPE": tl.float32}
    assert ta._kernel_options(torch.zeros(1, dtype=torch.float64)) == \
        {"DOT_PRECISION": "ieee", "ACC_DTYPE": tl.float64}
    for dtype in (torch.float16, torch.bfloat16):
        assert ta._kernel_options(torch.zeros(1, dtype=dtype)) == \
            {"DOT_PRECISION": "tf32", "ACC_DTYPE": tl.float32}


@pytest.mark.parametrize("block", [16, 32, 64, 128, 1024])
def test_powers_of_two_from_16_are_tiles(block):
    ta._check_block("block_q", block)


@pytest.mark.parametrize("block", [True, 16.0, "16", None, 0, 1, 2, 8, 15, 24, 48, 96, -16])
def test_other_tiles_are_refused_by_name(block):
    with pytest.raises(ValueError) as error:
        ta._check_block("block_k", block)
    assert str(error.value) == (f"block_k is {block!r}, expected a power of two >= 16 "
                                "(Triton tiles are powers of two; tl.dot needs at least 16)")


# --- the input checks, message by message --------------------------------------------------------

def check(*args, causal=False):
    ta._check_inputs(*args, causal)


def test_valid_inputs_pass_at_the_edges_of_the_range():
    for d in (16, 17, 128):
        check(*qkv(3, 5, d))
    check(*qkv(5, 5, 16), causal=True)
    check(*qkv(1, 1, 16, torch.float64))
    check(*qkv(2, 2, 16, torch.float16))


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_tensor_that_is_not_four_dimensional_is_named(which):
    name = "qkv"[which]
    for bad, got in ((torch.zeros(1, 16, 16), "(1, 16, 16)"),
                     (torch.zeros(1, 1, 1, 16, 16), "(1, 1, 1, 16, 16)"),
                     ([[1.0]], "list")):
        args = qkv()
        args[which] = bad
        with pytest.raises(ValueError) as error:
            check(*args)
        assert str(error.value) == f"{name} is {got}, expected a 4-D tensor (batch, heads, N, head_dim)"


def test_causal_is_checked_before_the_shapes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"^causal is 'no' \(str\), expected True or False$"):
        check(q, k[:, :, :, :3], v, causal="no")
    with pytest.raises(TypeError, match=r"^causal is 1 \(int\)"):
        check(q, k, v, causal=1)


def test_devices_must_agree():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^q is on cpu, k on cpu and v on meta: expected all"):
        check(q, k, v.to("meta"))


@pytest.mark.parametrize("shapes", [
    ((2, 1, 4, 16), (1, 1, 4, 16), (1, 1, 4, 16)),   # batch of q
    ((1, 2, 4, 16), (1, 1, 4, 16), (1, 1, 4, 16)),   # heads of q
    ((1, 1, 4, 16), (1, 1, 4, 16), (1, 1, 5, 16)),   # N of v
    ((1, 1, 4, 16), (1, 1, 4, 16), (1, 1, 4, 32)),   # d of v
    ((1, 1, 4, 16), (1, 1, 4, 16), (1, 2, 4, 16)),   # heads of v
])
def test_shapes_that_do_not_fit_together_are_all_named(shapes):
    q, k, v = (torch.zeros(s) for s in shapes)
    with pytest.raises(ValueError) as error:
        check(q, k, v)
    assert str(error.value) == (f"q, k, v have shapes {shapes[0]}, {shapes[1]}, {shapes[2]}: "
                                "expected (B, H, N_q, d), (B, H, N_k, d), (B, H, N_k, d)")


def test_causal_with_more_queries_than_keys_is_refused():
    with pytest.raises(ValueError, match=r"^n_k is 3, expected n_k >= n_q = 5 for causal"):
        check(*qkv(5, 3), causal=True)
    check(*qkv(5, 3), causal=False)
    check(*qkv(3, 5), causal=True)


def test_head_dims_must_match_and_lie_in_range():
    q, k, v = qkv(4, 4, 16)
    with pytest.raises(ValueError) as error:
        check(q, k[..., :8].contiguous(), v[..., :8].contiguous())
    assert str(error.value) == "q has head_dim 16 and k has head_dim 8: expected equal"
    for d in (15, 129, 8, 256):
        with pytest.raises(ValueError) as error:
            check(*qkv(4, 4, d))
        assert str(error.value) == f"head_dim is {d}, but the kernel supports head dims from 16 to 128"


def test_empty_sequences_are_named():
    q, k, v = qkv(4, 4)
    with pytest.raises(ValueError) as error:
        check(q[:, :, :0], k, v)
    assert str(error.value) == "q has shape (1, 1, 0, 16): N_q is 0, expected at least one query"
    with pytest.raises(ValueError) as error:
        check(q, k[:, :, :0], v[:, :, :0])
    assert str(error.value) == "k has shape (1, 1, 0, 16): N_k is 0, expected at least one key"


@pytest.mark.parametrize("dtypes", [
    (torch.float32, torch.float16, torch.float32),
    (torch.float32, torch.float32, torch.float16),
    (torch.float16, torch.float32, torch.float32),
    (torch.bfloat16,) * 3,
    (torch.int32,) * 3,
])
def test_dtypes_interpreted(dtypes):
    args = [t.to(dtype) for t, dtype in zip(qkv(), dtypes, strict=True)]
    with pytest.raises(TypeError) as error:
        check(*args)
    names = ", ".join(str(d) for d in dtypes)
    assert str(error.value) == (f"q, k, v have dtypes {names}; under the Triton interpreter the "
                                "kernel supports one of: float16, float32, float64")


def test_dtypes_on_a_gpu(compiled):
    with pytest.raises(TypeError) as error:
        check(*qkv(dtype=torch.float64))
    assert str(error.value) == ("q, k, v have dtypes torch.float64, torch.float64, torch.float64; on "
                                "the GPU the kernel supports one of: float16, bfloat16, float32")


def test_devices_interpreted_and_compiled(monkeypatch):
    with pytest.raises(ValueError) as error:
        check(*(t.to("meta") for t in qkv()))
    assert str(error.value) == "q is on meta; under TRITON_INTERPRET=1 pass CPU tensors"
    monkeypatch.setattr(ta, "_INTERPRETED_AT_IMPORT", False)
    with pytest.raises(ValueError) as error:
        check(*qkv())
    assert str(error.value) == ("q is on cpu; the compiled kernel needs CUDA tensors. Without a "
                                "GPU, set TRITON_INTERPRET=1 before importing helpers.flash.triton_attention")


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


def test_public_functions_check_before_launching(recorders):
    q, k, v = qkv()
    out, lse = torch.zeros_like(q), torch.zeros(1, 1, 16)
    with pytest.raises(ValueError, match="^block_q is 24, expected a power of two"):
        ta.triton_attention(q, k, v, block_q=24)
    with pytest.raises(ValueError, match="^block_k is 8, expected a power of two"):
        ta.triton_attention(q, k, v, block_k=8)
    with pytest.raises(ValueError, match="^block_q is 24, expected a power of two"):
        ta.triton_attention_backward(q, k, v, out, lse, out, block_q=24)
    with pytest.raises(ValueError, match="^block_k is 8, expected a power of two"):
        ta.triton_attention_backward(q, k, v, out, lse, out, block_k=8)
    with pytest.raises(ValueError, match="^v is list"):
        ta.triton_attention_backward(q, k, [], out, lse, out)
    with pytest.raises(ValueError, match="^lse is a torch.float32 tensor of shape \\(1, 1, 15\\)"):
        ta.triton_attention_backward(q, k, v, out, lse[..., 1:], out)
    with pytest.raises(ValueError, match=r"^scale is 0"):
        ta.triton_attention_backward(q, k, v, out, lse, out, scale=0)
    with pytest.raises(ValueError, match=r"^scale is -1"):
        ta.triton_attention(q, k, v, scale=-1)
    with pytest.raises(ValueError, match="^v is list"):
        ta.triton_attention(q, k, [])
    assert all(not r.launches for r in recorders.values())


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


# --- what each launch is given (kernels replaced by recorders) -----------------------------------

def strides3(t):
    return tuple(t.stride()[:3])


def test_forward_launch_arguments(recorders):
    q, k, v = qkv(40, 70, 20, batch=2, heads=3)
    out, lse = ta._forward(q, k, v, True, 0.25, 16, 32)
    (grid, args, kwargs), = recorders["flash_forward_kernel"].launches
    assert grid == (3, 6)  # ceil(40 / 16) query tiles, 2 x 3 (batch, head) pairs
    assert args[0] is q and args[1] is k and args[2] is v  # already unit-stride: no copies
    assert args[3] is out and args[4] is lse and args[5] is lse  # no visits: lse stands in
    assert args[6:18] == strides3(q) + strides3(k) + strides3(v) + strides3(out)
    assert args[18:21] == (3, 40, 70)
    assert args[21] == pytest.approx(0.25 * LOG2_E, rel=1e-15)
    assert kwargs == dict(HEAD_DIM=20, BLOCK_D=32, BLOCK_Q=16, BLOCK_K=32, CAUSAL=True,
                          COUNT_TILES=False, DOT_PRECISION="ieee", ACC_DTYPE=tl.float32,
                          num_warps=1, num_stages=1)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 3, 40) and lse.dtype == torch.float32
    _, lse64 = ta._forward(*(t.double() for t in (q, k, v)), False, 1.0, 32, 32)
    assert lse64.dtype == torch.float64
    (grid, args, kwargs) = recorders["flash_forward_kernel"].launches[1]
    assert grid == (2, 6) and kwargs["CAUSAL"] is False and kwargs["ACC_DTYPE"] == tl.float64


def test_forward_launch_copies_only_tensors_with_a_strided_last_dim(recorders):
    q, k, v = qkv(16, 16, 16, heads=2)
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)   # (B, H, N, d) view, last dim unit stride
    v_t = v.transpose(-1, -2).contiguous().transpose(-1, -2)  # last dim strided
    ta._forward(q_t, k, v_t, False, 1.0, 16, 16)
    _, args, _ = recorders["flash_forward_kernel"].launches[0]
    assert args[0] is q_t and args[1] is k
    assert args[2] is not v_t and args[2].is_contiguous() and torch.equal(args[2], v)
    assert args[6:9] == strides3(q_t)


def test_forward_launch_on_a_gpu_and_with_visits(recorders, compiled):
    q, k, v = qkv(33, 33, 65)
    visits = torch.zeros(1, 1, dtype=torch.int32)
    ta._forward(q.half(), k.half(), v.half(), False, 0.5, 64, 64, visits=visits)
    (grid, args, kwargs), = recorders["flash_forward_kernel"].launches
    assert args[5] is visits and kwargs["COUNT_TILES"] is True
    assert (kwargs["num_warps"], kwargs["num_stages"]) == (8, 2)  # default_blocks(65) on a GPU
    assert kwargs["DOT_PRECISION"] == "tf32" and kwargs["BLOCK_D"] == 128
    ta._forward(*(t[..., :64].half() for t in (q, k, v)), False, 0.5, 64, 64)
    assert [recorders["flash_forward_kernel"].launches[1][2][n] for n in ("num_warps", "num_stages")] == [4, 3]
    ta._forward(q[..., :64], k[..., :64], v[..., :64], False, 0.5, 64, 64)  # float32: no tensor cores
    assert [recorders["flash_forward_kernel"].launches[2][2][n] for n in ("num_warps", "num_stages")] == [4, 1]


def test_backward_launch_arguments(recorders):
    q, k, v = qkv(40, 70, 20, batch=2, heads=3)
    gen = torch.Generator().manual_seed(9)
    out, grad_out = torch.randn(q.shape, generator=gen), torch.randn(q.shape, generator=gen)
    lse = torch.randn(2, 3, 40, generator=gen)
    grads = ta._backward(q, k, v, out, lse, grad_out, True, 0.25, 16, 32)
    (grid_kv, args_kv, kw_kv), = recorders["flash_backward_dk_dv_kernel"].launches
    (grid_q, args_q, kw_q), = recorders["flash_backward_dq_kernel"].launches
    assert grid_kv == (3, 6) and grid_q == (3, 6)  # ceil(70 / 32) key tiles; ceil(40 / 16) query tiles
    for args in (args_kv, args_q):
        assert args[0] is q and args[1] is k and args[2] is v and args[3] is grad_out and args[4] is lse
        assert torch.equal(args[5], (grad_out * out).sum(-1))  # D = rowsum(dO O)
    assert args_kv[6] is grads[1] and args_kv[7] is grads[2] and args_q[6] is grads[0]
    assert args_kv[8:] == args_q[7:] == (40, 70, pytest.approx(0.25 * LOG2_E, rel=1e-15), 0.25)
    assert kw_kv == kw_q == dict(HEAD_DIM=20, BLOCK_D=32, BLOCK_Q=16, BLOCK_K=32, CAUSAL=True,
                                 DOT_PRECISION="ieee", ACC_DTYPE=tl.float32, num_warps=1, num_stages=1)
    for grad, t in zip(grads, (q, k, v), strict=True):
        assert grad.shape == t.shape and grad.dtype == t.dtype


def test_backward_launch_defaults_copies_and_dtypes(recorders, compiled):
    q, k, v = qkv(40, 50, 64, dtype=torch.float16)
    out = torch.ones(1, 1, 64, 40, dtype=torch.float16).transpose(-1, -2)  # not contiguous
    lse = torch.zeros(1, 1, 40)
    ta._backward(q, k, v, out, lse, out, False, 0.5, None, None)
    (grid_kv, args_kv, kw_kv), = recorders["flash_backward_dk_dv_kernel"].launches
    (grid_q, _, kw_q), = recorders["flash_backward_dq_kernel"].launches
    assert grid_kv == (1, 1) and grid_q == (1, 1)  # 64 x 64 tiles on a GPU
    assert (kw_kv["BLOCK_Q"], kw_kv["BLOCK_K"], kw_kv["num_warps"], kw_kv["num_stages"]) == (64, 64, 4, 2)
    assert kw_q["DOT_PRECISION"] == "tf32" and kw_q["CAUSAL"] is False
    assert args_kv[3].is_contiguous() and torch.equal(args_kv[3], out)
    assert args_kv[5].dtype == torch.float32 and torch.equal(args_kv[5], torch.full((1, 1, 40), 64.0))
    ta._backward(*qkv(40, 50, 65), torch.zeros(1, 1, 40, 65), lse, torch.zeros(1, 1, 40, 65),
                 False, 0.5, None, 16)
    _, _, kw = recorders["flash_backward_dq_kernel"].launches[1]
    assert (kw["BLOCK_Q"], kw["BLOCK_K"], kw["num_warps"], kw["num_stages"]) == (64, 16, 4, 1)  # float32
    ta._backward(*qkv(40, 50, 64), torch.zeros(1, 1, 40, 64), lse, torch.zeros(1, 1, 40, 64),
                 False, 0.5, 32, None)
    grid, _, kw = recorders["flash_backward_dq_kernel"].launches[2]
    assert (kw["BLOCK_Q"], kw["BLOCK_K"]) == (32, 64) and grid == (2, 1)


def test_defaults_reach_the_forward_launch(recorders):
    q, k, v = qkv(40, 50, 25)
    ta.triton_attention(q, k, v)
    grid, args, kwargs = recorders["flash_forward_kernel"].launches[0]
    assert args[21] == pytest.approx(LOG2_E / math.sqrt(25), rel=1e-15)  # scale 1 / sqrt(d)
    assert kwargs["CAUSAL"] is False and (kwargs["BLOCK_Q"], kwargs["BLOCK_K"]) == (32, 32)
    ta.triton_attention(q, k, v, True, 0.5, 16, 64)
    grid, args, kwargs = recorders["flash_forward_kernel"].launches[1]
    assert args[21] == pytest.approx(0.5 * LOG2_E, rel=1e-15) and grid == (3, 1)
    assert kwargs["CAUSAL"] is True and (kwargs["BLOCK_Q"], kwargs["BLOCK_K"]) == (16, 64)
    out, lse = torch.zeros_like(q), torch.zeros(1, 1, 40)
    ta.triton_attention_backward(q, k, v, out, lse, out)
    _, args, kwargs = recorders["flash_backward_dq_kernel"].launches[0]
    assert args[-1] == pytest.approx(1 / math.sqrt(25), rel=1e-15) and kwargs["CAUSAL"] is False
    assert (kwargs["BLOCK_Q"], kwargs["BLOCK_K"]) == (32, 32)
    ta.triton_attention_backward(q, k, v, out, lse, out, True, 0.5, 16, 64)
    grid, args, kwargs = recorders["flash_backward_dk_dv_kernel"].launches[1]
    assert args[-1] == 0.5 and kwargs["CAUSAL"] is True and grid == (1, 1)
    assert (kwargs["BLOCK_Q"], kwargs["BLOCK_K"]) == (16, 64)


def test_key_tiles_visited_launch(recorders):
    assert ta.key_tiles_visited(70, 70, True) == [-1, -1, -1]  # the recorder writes nothing
    (grid, args, kwargs), = recorders["flash_forward_kernel"].launches
    assert grid == (3, 1) and args[0].shape == (1, 1, 70, 16) and args[1].shape == (1, 1, 70, 16)
    assert args[1] is args[2] and args[0].device.type == "cpu" and not args[0].any()
    assert args[5].dtype == torch.int32 and args[5].shape == (1, 3)
    assert args[21] == LOG2_E and kwargs["COUNT_TILES"] is True and kwargs["CAUSAL"] is True
    assert (kwargs["BLOCK_Q"], kwargs["BLOCK_K"], kwargs["HEAD_DIM"]) == (32, 32, 16)
    ta.key_tiles_visited(20, 40, False, block_q=16, block_k=64, head_dim=24)
    grid, args, kwargs = recorders["flash_forward_kernel"].launches[1]
    assert grid == (2, 1) and args[0].shape == (1, 1, 20, 24) and args[1].shape == (1, 1, 40, 24)
    assert (kwargs["BLOCK_Q"], kwargs["BLOCK_K"], kwargs["CAUSAL"]) == (16, 64, False)


# --- tiny interpreted runs ----------------------------------------------------------------------

def interpreted_case():
    q, k, v = (t.requires_grad_() for t in qkv(20, 24, 16, dtype=torch.float64))
    out, lse = ta.triton_attention(q, k, v, causal=True, scale=0.3, block_q=16, block_k=16)
    mask = torch.ones(20, 24, dtype=torch.bool).tril(diagonal=4)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*leaves, attn_mask=mask, scale=0.3)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    return (q, k, v), out, lse, leaves, expected, mask, upstream


def test_interpreted_forward_matches_pytorch():
    (q, k, _), out, lse, leaves, expected, mask, _ = interpreted_case()
    assert not lse.requires_grad and lse.dtype == torch.float64
    close(out, expected, atol=1e-12)
    scores = (leaves[0] @ leaves[1].transpose(-1, -2) * 0.3).masked_fill(~mask, -math.inf)
    close(lse, scores.detach().logsumexp(-1), atol=1e-12)


def test_interpreted_backward_matches_pytorch():
    inputs, out, lse, leaves, expected, _, upstream = interpreted_case()
    grads = torch.autograd.grad(out, inputs, upstream)
    wanted = torch.autograd.grad(expected, leaves, upstream)
    for got, want in zip(grads, wanted, strict=True):
        close(got, want, atol=1e-12)
    q, k, v = (t.detach() for t in inputs)
    by_hand = ta.triton_attention_backward(q, k, v, out.detach(), lse, upstream, True, 0.3, 32, 16)
    for got, want in zip(by_hand, wanted, strict=True):
        close(got, want, atol=1e-12)


def test_interpreted_gradients_reach_only_the_inputs_that_ask():
    q, k, v = qkv(16, 16, 16)
    v.requires_grad_()
    out, _ = ta.triton_attention(q, k, v)
    out.sum().backward()
    assert v.grad is not None and q.grad is None and k.grad is None
    weights = scaled_dot_product_attention(q.double(), k.double(), v.double())[1]
    close(v.grad.double(), weights.sum(-2)[..., None].expand(-1, -1, -1, 16),
          atol=1e-5)


def test_interpreted_key_tile_counts():
    assert ta.key_tiles_visited(64, 64, causal=True) == [1, 2]
    assert ta.key_tiles_visited(64, 64, causal=False) == [2, 2]
    assert ta.key_tiles_visited(16, 64, True, block_q=16, block_k=16) == [4]


def test_key_tiles_visited_builds_its_tensors_on_the_cpu_whatever_the_default_device():
    with torch.device("meta"):  # torch.set_default_device for this block
        assert ta.key_tiles_visited(32, 32, True, block_q=16, block_k=16) == [1, 2]


def test_on_a_gpu_key_tiles_visited_builds_cuda_tensors(monkeypatch, compiled, recorders):
    devices, real_zeros, real_full = [], torch.zeros, torch.full

    def zeros(*size, device=None, **kwargs):
        devices.append(device)
        return real_zeros(*size, **kwargs)

    def full(*args, device=None, **kwargs):
        devices.append(device)
        return real_full(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", zeros)
    monkeypatch.setattr(torch, "full", full)
    monkeypatch.setattr(ta, "_check_inputs", lambda *args: None)  # CPU tensors stand in for CUDA
    ta.key_tiles_visited(40, 40, True)
    assert devices == ["cuda", "cuda", "cuda"]


def test_on_a_gpu_triton_attention_picks_128_by_64_tiles(monkeypatch, compiled, recorders):
    monkeypatch.setattr(ta, "_check_inputs", lambda *args: None)  # CPU tensors stand in for CUDA
    for d in (16, 80):
        ta.triton_attention(*qkv(200, 200, d, dtype=torch.float16))
    for (grid, _, kwargs), d in zip(recorders["flash_forward_kernel"].launches, (16, 80), strict=True):
        assert grid == (2, 1) and (kwargs["BLOCK_Q"], kwargs["BLOCK_K"]) == (128, 64)
        assert kwargs["num_warps"] == (4 if d <= 64 else 8)


class OnCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: enough for the checks, which read .device only."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def test_cuda_tensors_pass_the_checks_of_the_compiled_kernel(compiled):
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        q, k, v = (t.to(dtype).as_subclass(OnCuda) for t in qkv(5, 7, 16, heads=2))
        assert q.device.type == "cuda"
        check(q, k, v, causal=True)


def test_the_log_sum_exp_is_made_on_the_inputs_device_whatever_the_default_device():
    q, k, v = qkv(16, 16, 16)
    with torch.device("meta"):  # torch.set_default_device for this block
        out, lse = ta.triton_attention(q, k, v)
    assert out.device.type == "cpu" and lse.device.type == "cpu"
    scores = q.double() @ k.double().transpose(-1, -2) / 4
    close(lse.double(), scores.logsumexp(-1), atol=1e-5)
