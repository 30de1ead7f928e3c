"""Exercises of notebook 6 (LayerNorm, FFN and residuals): LayerNorm by hand, SwiGLU, rank collapse,
the Pre-LN block."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close
from helpers.model import layers


def _inputs(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@exercise(hint="mean = x.mean(-1, keepdim=True); variance = ((x - mean) ** 2).mean(-1, keepdim=True) "
               "(divide by D, not D - 1); then (x - mean) / sqrt(variance + eps) * weight + bias.",
          task="Write layer_norm(x, weight, bias, eps) for x (..., D). The check compares with "
               "torch's on random tokens and on a constant token.")
def layer_norm(student: Callable[..., torch.Tensor]) -> str:
    x = _inputs(0, 3, 5, 8) * 4 + 2
    weight, bias = _inputs(1, 8), _inputs(2, 8)
    eps = 1e-5
    got = student(x, weight, bias, eps)
    expected = F.layer_norm(x, (8,), weight, bias, eps)
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        unbiased = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + eps) * weight + bias
        if torch.allclose(got, unbiased, atol=1e-5):
            raise ExerciseFailed("your variance divides by D - 1 (torch.var's default); "
                                 "LayerNorm divides by D: use x.var(-1, unbiased=False) or the mean of squares.")
        without_affine = F.layer_norm(x, (8,), eps=eps)
        if torch.allclose(got, without_affine, atol=1e-5):
            raise ExerciseFailed("the standardised values are right, but weight (gamma) and bias (beta) "
                                 "are not applied.")
    expect_close(got, expected, "layer_norm(x, weight, bias, eps)", atol=1e-5)
    tiny = x * 1e-4  # variance ~1e-7: eps = 1e-5 decides the result
    got = student(tiny, weight, bias, eps)
    if isinstance(got, torch.Tensor) and got.shape == tiny.shape:
        centred = tiny - tiny.mean(-1, keepdim=True)
        outside = centred / (centred.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight + bias
        if torch.allclose(got, outside, atol=1e-5):
            raise ExerciseFailed("eps is added outside the square root: sqrt(variance) + eps. "
                                 "LayerNorm uses sqrt(variance + eps).")
        without_eps = centred / centred.pow(2).mean(-1, keepdim=True).sqrt() * weight + bias
        if torch.allclose(got, without_eps, atol=1e-5):
            raise ExerciseFailed("eps is missing: on tokens this small it decides the result, and a "
                                 "constant token would divide by 0. eps must go inside the square root, "
                                 "sqrt(variance + eps).")
    expect_close(got, F.layer_norm(tiny, (8,), weight, bias, eps), "layer_norm of tiny tokens", atol=1e-4)
    constant = torch.full((2, 8), 3.0)
    flat = student(constant, torch.ones(8), torch.zeros(8), eps)
    if not torch.isfinite(flat).all():
        raise ExerciseFailed("a token whose features are all equal gives NaN or inf: its variance is 0, "
                             "so eps must go inside the square root.")
    expect_close(flat, torch.zeros(2, 8), "layer_norm of a constant token", atol=1e-5)
    return "It matches nn.LayerNorm, constant tokens included."


@exercise(hint="Two projections of x: gate = x @ w_gate and up = x @ w_up, both (..., hidden). "
               "Multiply silu(gate) by up elementwise, then project back with w_down.",
          task="Write swiglu(x, w_gate, w_up, w_down) for x (..., D). The check compares with the "
               "course's SwiGLU on a batch.")
def swiglu(student: Callable[..., torch.Tensor]) -> str:
    d_model, hidden = 6, 16
    x = _inputs(3, 2, 4, d_model)
    w_gate, w_up, w_down = _inputs(4, d_model, hidden), _inputs(5, d_model, hidden), _inputs(6, hidden, d_model)
    got = student(x, w_gate, w_up, w_down)
    expected = (F.silu(x @ w_gate) * (x @ w_up)) @ w_down
    if isinstance(got, torch.Tensor) and got.shape == expected.shape:
        swapped = (F.silu(x @ w_up) * (x @ w_gate)) @ w_down
        if torch.allclose(got, swapped, atol=1e-4):
            raise ExerciseFailed("silu is applied to the wrong projection: it goes on x @ w_gate, "
                                 "and x @ w_up stays linear.")
        for name, act in (("sigmoid", torch.sigmoid), ("gelu", F.gelu), ("relu", F.relu)):
            if torch.allclose(got, (act(x @ w_gate) * (x @ w_up)) @ w_down, atol=1e-4):
                raise ExerciseFailed(f"the gate goes through {name}: SwiGLU's is silu(z) = z * "
                                     "sigmoid(z) (sigmoid alone is the original GLU).")
    expect_close(got, expected, "swiglu(x, w_gate, w_up, w_down)", atol=1e-4)
    return "That is the feed-forward network of Llama and most models since 2023."


@exercise(hint="Subtract the mean token, x.mean(dim=-2, keepdim=True), then divide the Frobenius "
               "norm of what is left, torch.linalg.matrix_norm(...), by that of x.",
          task="Write distance_from_rank_one(x) for x (..., N, D): one number per set of N tokens. "
               "The check tries a batch, identical tokens and a rescaled x.")
def distance_from_rank_one(student: Callable[[torch.Tensor], torch.Tensor]) -> str:
    x = _inputs(7, 3, 5, 4)
    got = student(x)
    expected = layers.distance_from_rank_one(x)
    if isinstance(got, torch.Tensor) and got.shape != expected.shape and got.numel() == 1:
        raise ExerciseFailed(f"x has shape (3, 5, 4): three sets of 5 tokens, so the answer has shape "
                             f"(3,), one distance per set, but yours has shape {tuple(got.shape)}. "
                             "Reduce over the last two dimensions only.")
    same_token = _inputs(8, 1, 4).expand(5, 4)
    alone = student(same_token)
    if isinstance(alone, torch.Tensor) and alone.numel() == 1 and abs(float(alone) - 1.0) < 1e-5:
        raise ExerciseFailed("5 copies of one token give a distance of 1, not 0: subtract the mean "
                             "token first; what is left is the part that is not rank one.")
    expect_close(got, expected, "distance_from_rank_one(x)", atol=1e-5)
    expect_close(student(same_token), torch.tensor(0.0), "the distance for 5 copies of one token", atol=1e-5)
    expect_close(student(10 * x), expected, "the distance for 10 * x (it should not change)", atol=1e-5)
    return "0 for identical tokens, and blind to the overall scale."


# --- the core exercise: a Pre-LN transformer block ---------------------------------------------

def block_variant(x: torch.Tensor, block: layers.Block, causal: bool = True, *, order: str = "pre",
                  attn_residual: str = "x", mlp_residual: bool = True, second_norm: str = "ln2",
                  activation: str = "gelu", attn_causal: bool = True, final_norm: bool = False) -> torch.Tensor:
    """A Pre-LN block's forward written out, right by default, or with a usual slip (to name it)."""
    def norm(t: torch.Tensor, ln: layers.LayerNorm) -> torch.Tensor:
        return layers.layer_norm(t, ln.weight, ln.bias, ln.eps)

    def mlp(t: torch.Tensor) -> torch.Tensor:
        act = {"gelu": F.gelu, "relu": F.relu, "tanh": lambda u: F.gelu(u, approximate="tanh")}[activation]
        return block.mlp.down(act(block.mlp.up(t)))

    def attn(t: torch.Tensor) -> torch.Tensor:
        return block.attn(t, causal=causal and attn_causal)

    if order == "post":
        x = norm(x + attn(x), block.ln1)
        return norm(x + mlp(x), block.ln2)
    h = norm(x, block.ln1)
    x = {"x": x, "none": 0.0, "normed": h}[attn_residual] + attn(h)
    h = norm(x, block.ln2 if second_norm == "ln2" else block.ln1)
    out = x + mlp(h) if mlp_residual else mlp(h)
    return norm(out, block.ln2) if final_norm else out


BLOCK_SLIPS = {
    "normalises after each residual add (Post-LN, 2017): Pre-LN normalises the branch's input, "
    "x + attn(ln1(x))": {"order": "post"},
    "has no residual around attention: x = x + attn(ln1(x)), not attn(ln1(x))": {"attn_residual": "none"},
    "adds the attention branch to the normalised x: the residual stream carries x itself, "
    "x + attn(ln1(x))": {"attn_residual": "normed"},
    "has no residual around the FFN: the output is x + mlp(ln2(x))": {"mlp_residual": False},
    "uses ln1 before the FFN too: each branch has its own LayerNorm, ln2 for the FFN": {"second_norm": "ln1"},
    "uses ReLU in the FFN: this block's activation is the exact GELU, F.gelu": {"activation": "relu"},
    "uses the tanh approximation of GELU: this block's activation is the exact F.gelu": {"activation": "tanh"},
    "ignores causal=True: pass it on to the attention": {"attn_causal": False},
    "normalises the block's output: Pre-LN leaves the residual stream as it is (GPT-2 normalises "
    "once, after the last block)": {"final_norm": True},
}


@exercise(hint="Two residual branches in turn, each reading a normalised copy of the stream: "
               "x = x + attn(ln1(x)), then x + down(gelu(up(ln2(x)))).",
          task="Write pre_ln_block(x, block, causal) returning the (B, N, D) output of the Pre-LN "
               "Block `block`, using its ln1, attn, ln2 and mlp weights. The check compares with "
               "block(x) on random weights, causal and not, one token included.")
def pre_ln_block(student: Callable[..., torch.Tensor]) -> str:
    for seed, (batch, n, d, h, causal) in enumerate(((2, 5, 8, 2, True), (1, 4, 12, 3, False), (2, 1, 8, 2, True))):
        with torch.random.fork_rng():  # leave the notebook's random numbers as they were
            torch.manual_seed(seed)
            block = layers.Block(d, h).double()
            with torch.no_grad():  # LayerNorms that differ, so that ln1 and ln2 cannot be swapped
                for ln in (block.ln1, block.ln2):
                    ln.weight.normal_(1.0, 0.3)
                    ln.bias.normal_(0.0, 0.3)
            x = torch.randn(batch, n, d, dtype=torch.float64) * 2 + 1
        what = f"x {tuple(x.shape)}, causal={causal}"
        with torch.no_grad():
            got = student(x.clone(), block, causal)
            want = block(x, causal=causal)
            if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.allclose(got.double(), want, atol=1e-6):
                for slip, knobs in BLOCK_SLIPS.items():
                    if torch.allclose(got.double(), block_variant(x, block, causal, **knobs), atol=1e-6):
                        raise ExerciseFailed(f"for {what} your block {slip}.")
        expect_close(got, want, f"the block's output for {what}", atol=1e-6)
    return "That is GPT-2's block; notebook 7 stacks twelve of them."
