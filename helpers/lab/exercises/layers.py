"""Exercises of notebook 6 (LayerNorm, FFN and residuals): LayerNorm by hand, SwiGLU, rank collapse,
GPT-2's initialisation, the transformer block (Pre-LN and Post-LN)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close, reseed, seeded
from helpers.model import layers


def _inputs(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=seeded(seed))


@exercise(hint="Standardise each token over its own D features: subtract their mean, divide by the "
               "square root of their variance plus eps (the variance divides by D, not D - 1), then "
               "scale by weight and shift by bias.",
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
            raise ExerciseFailed("your variance divides by D - 1 (torch.var's default); LayerNorm "
                                 "divides by D.",
                                 fix="take the variance as the mean of the squared deviations, or ask "
                                     "var for the biased version (correction 0).")
        without_affine = F.layer_norm(x, (8,), eps=eps)
        if torch.allclose(got, without_affine, atol=1e-5):
            raise ExerciseFailed("the standardised values are right, but weight (gamma) and bias (beta) "
                                 "are not applied.",
                                 fix="multiply the standardised values by weight, then add bias.")
    expect_close(got, expected, "layer_norm(x, weight, bias, eps)", atol=1e-5)
    tiny = x * 1e-4  # variance ~1e-7: eps = 1e-5 decides the result
    got = student(tiny, weight, bias, eps)
    if isinstance(got, torch.Tensor) and got.shape == tiny.shape:
        centred = tiny - tiny.mean(-1, keepdim=True)
        outside = centred / (centred.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight + bias
        if torch.allclose(got, outside, atol=1e-5):
            raise ExerciseFailed("eps is added outside the square root: sqrt(variance) + eps. "
                                 "LayerNorm uses sqrt(variance + eps).",
                                 fix="add eps to the variance first, then take the square root.")
        without_eps = centred / centred.pow(2).mean(-1, keepdim=True).sqrt() * weight + bias
        if torch.allclose(got, without_eps, atol=1e-5):
            raise ExerciseFailed("eps is missing: on tokens this small it decides the result, and a "
                                 "constant token would divide by 0.",
                                 fix="eps must go inside the square root: the square root of the "
                                     "variance plus eps.")
    expect_close(got, F.layer_norm(tiny, (8,), weight, bias, eps), "layer_norm of tiny tokens", atol=1e-4)
    constant = torch.full((2, 8), 3.0)
    flat = student(constant, torch.ones(8), torch.zeros(8), eps)
    if not torch.isfinite(flat).all():
        raise ExerciseFailed("a token whose features are all equal gives NaN or inf: its variance is 0.",
                             fix="eps must go inside the square root, so that the division stays finite.")
    expect_close(flat, torch.zeros(2, 8), "layer_norm of a constant token", atol=1e-5)
    return "It matches nn.LayerNorm, constant tokens included."


@exercise(hint="Two projections of x, both to the hidden size: the gate projection goes through SiLU "
               "and multiplies the other one element by element; a third matrix projects back to D.",
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
            raise ExerciseFailed("silu is applied to the wrong projection: x @ w_up goes through it "
                                 "and x @ w_gate stays linear.",
                                 fix="put SiLU on the gate projection (with w_gate) and keep the up "
                                     "projection linear.")
        for name, act in (("sigmoid", torch.sigmoid), ("gelu", F.gelu), ("relu", F.relu)):
            if torch.allclose(got, (act(x @ w_gate) * (x @ w_up)) @ w_down, atol=1e-4):
                raise ExerciseFailed(f"the gate goes through {name}, not SiLU.",
                                     fix="SwiGLU's gate is silu(z) = z * sigmoid(z) (sigmoid alone is "
                                         "the original GLU); F.silu computes it.")
    expect_close(got, expected, "swiglu(x, w_gate, w_up, w_down)", atol=1e-4)
    return "That is the feed-forward network of Llama and most models since 2023."


@exercise(hint="Subtract the mean token (the average over the token axis) from every token, then "
               "divide the Frobenius norm of what is left by the Frobenius norm of x, both taken over "
               "the last two axes only.",
          task="Write distance_from_rank_one(x) for x (..., N, D): one number per set of N tokens. "
               "The check tries a batch, identical tokens and a rescaled x.")
def distance_from_rank_one(student: Callable[[torch.Tensor], torch.Tensor]) -> str:
    x = _inputs(7, 3, 5, 4)
    got = student(x)
    expected = layers.distance_from_rank_one(x)
    if isinstance(got, torch.Tensor) and got.shape != expected.shape and got.numel() == 1:
        raise ExerciseFailed(f"x has shape (3, 5, 4): three sets of 5 tokens, so the answer has shape "
                             f"(3,), one distance per set, but yours has shape {tuple(got.shape)}.",
                             fix="Reduce over the last two dimensions only (a matrix norm per set), "
                                 "not over the whole tensor.")
    same_token = _inputs(8, 1, 4).expand(5, 4)
    alone = student(same_token)
    if isinstance(alone, torch.Tensor) and alone.numel() == 1 and abs(float(alone) - 1.0) < 1e-5:
        raise ExerciseFailed("5 copies of one token give a distance of 1, not 0.",
                             fix="subtract the mean token first; what is left is the part that is "
                                 "not rank one.")
    expect_close(got, expected, "distance_from_rank_one(x)", atol=1e-5)
    expect_close(student(same_token), torch.tensor(0.0), "the distance for 5 copies of one token", atol=1e-5)
    expect_close(student(10 * x), expected, "the distance for 10 * x (it should not change)", atol=1e-5)
    return "0 for identical tokens, and blind to the overall scale."


# --- the core exercise: a transformer block, Pre-LN and Post-LN ---------------------------------

def block_variant(x: torch.Tensor, block: layers.Block, causal: bool = True, *, order: str | None = None,
                  attn_residual: str = "x", mlp_residual: bool = True, second_norm: str = "ln2",
                  activation: str = "gelu", attn_causal: bool = True, final_norm: bool = False) -> torch.Tensor:
    """A block's forward written out in its own order (block.pre_norm), right by default, or with a
    usual slip (to name it); `order` "pre" or "post" forces one order."""
    order = order or ("pre" if block.pre_norm else "post")

    def norm(t: torch.Tensor, ln: layers.LayerNorm) -> torch.Tensor:
        return layers.layer_norm(t, ln.weight, ln.bias, ln.eps)

    def mlp(t: torch.Tensor) -> torch.Tensor:
        act = {"gelu": F.gelu, "relu": F.relu, "tanh": lambda u: F.gelu(u, approximate="tanh")}[activation]
        return block.mlp.down(act(block.mlp.up(t)))

    def attn(t: torch.Tensor) -> torch.Tensor:
        return block.attn(t, causal=causal and attn_causal)

    second = block.ln2 if second_norm == "ln2" else block.ln1
    if order == "post":
        x = norm({"none": 0.0}.get(attn_residual, x) + attn(x), block.ln1)
        return norm(x + mlp(x) if mlp_residual else mlp(x), second)
    h = norm(x, block.ln1)
    x = {"x": x, "none": 0.0, "normed": h}[attn_residual] + attn(h)
    h = norm(x, second)
    out = x + mlp(h) if mlp_residual else mlp(h)
    return norm(out, block.ln2) if final_norm else out


# Each usual slip: (what is wrong, how to fix it, the knobs that make it, the block orders it fits).
BLOCK_SLIPS = [
    ("normalises after each residual add (Post-LN, 2017), but this block is Pre-LN (its pre_norm is True)",
     "Pre-LN normalises only the branch's input: add the attention of the normalised x to x itself, "
     "and the same for the FFN.", {"order": "post"}, ("pre",)),
    ("uses the Pre-LN order, but this block is Post-LN (its pre_norm is False)",
     "when the block's pre_norm is false, add each branch's output to x first and normalise the sum: "
     "ln1 after attention, ln2 after the FFN.", {"order": "pre"}, ("post",)),
    ("has no residual around attention",
     "add the attention branch's output to x rather than replacing x with it.",
     {"attn_residual": "none"}, ("pre", "post")),
    ("adds the attention branch to the normalised x",
     "the residual stream carries x itself: add the branch to the x that came in, not to its "
     "normalised copy.", {"attn_residual": "normed"}, ("pre",)),
    ("has no residual around the FFN",
     "add the FFN branch's output to the stream, not just the FFN branch alone.",
     {"mlp_residual": False}, ("pre", "post")),
    ("uses ln1 for the FFN too",
     "each branch has its own LayerNorm: ln2 goes with the FFN.", {"second_norm": "ln1"}, ("pre", "post")),
    ("uses ReLU in the FFN", "this block's activation is the exact GELU.", {"activation": "relu"},
     ("pre", "post")),
    ("uses the tanh approximation of GELU",
     "this block's activation is the exact GELU, without the tanh approximation.",
     {"activation": "tanh"}, ("pre", "post")),
    ("ignores causal=True", "pass causal on to the attention.", {"attn_causal": False}, ("pre", "post")),
    ("normalises the block's output",
     "Pre-LN leaves the residual stream as it is (GPT-2 normalises once, after the last block): return "
     "the sum without a LayerNorm.", {"final_norm": True}, ("pre",)),
]


@exercise(hint="Read the block's pre_norm. Pre-LN: two residual branches in turn, each reading a "
               "normalised copy of the stream and adding its result back onto it, first attention "
               "after ln1, then the FFN (up, exact GELU, down) after ln2. Post-LN: add each branch, "
               "computed on the stream itself, and normalise the sum, with ln1 after attention and "
               "ln2 after the FFN.",
          task="Write block_forward(x, block, causal) returning the (B, N, D) output of the Block "
               "`block`, Pre-LN or Post-LN as its pre_norm says, from its ln1, attn, ln2 and mlp. The "
               "check compares with block(x) on random weights, both orders, causal and not, one "
               "token included.",
          points=3, forbidden=("helpers.model.layers.Block.forward",))
def block_forward(student: Callable[..., torch.Tensor]) -> str:
    cases = ((2, 5, 8, 2, True, True), (1, 4, 12, 3, False, True), (2, 1, 8, 2, True, True),
             (2, 5, 8, 2, True, False), (1, 4, 12, 3, False, False))
    for seed, (batch, n, d, h, causal, pre_norm) in enumerate(cases):
        with torch.random.fork_rng():  # leave the notebook's random numbers as they were
            reseed(seed)
            block = layers.Block(d, h, pre_norm=pre_norm).double()
            with torch.no_grad():  # LayerNorms that differ, so that ln1 and ln2 cannot be swapped
                for ln in (block.ln1, block.ln2):
                    ln.weight.normal_(1.0, 0.3)
                    ln.bias.normal_(0.0, 0.3)
            x = torch.randn(batch, n, d, dtype=torch.float64) * 2 + 1
        kind = "pre" if pre_norm else "post"
        what = f"x {tuple(x.shape)}, causal={causal}, a {'Pre' if pre_norm else 'Post'}-LN block"
        with torch.no_grad():
            got = student(x.clone(), block, causal)
            want = block(x, causal=causal)
            if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.allclose(got.double(), want, atol=1e-6):
                for wrong, fix, knobs, kinds in BLOCK_SLIPS:
                    if kind in kinds and torch.allclose(got.double(), block_variant(x, block, causal, **knobs), atol=1e-6):
                        raise ExerciseFailed(f"for {what}, your block {wrong}.", fix=fix)
        expect_close(got, want, f"the block's output for {what}", atol=1e-6)
    return "Both orders of the block; notebook 7 stacks twelve Pre-LN ones into GPT-2."


# --- the core exercise: GPT-2's initialisation ---------------------------------------------------

def _std_problem(name: str, got: float, want: float, n_layers: int, std: float) -> tuple[str, str] | None:
    """(what is wrong, how to fix it) when a weight's measured std is not `want`, or None."""
    if abs(got / want - 1) < 0.1:
        return None
    what = f"{name} has standard deviation {got:.4f}, expected {want:.4f}"
    for guess, why, fix in (
            (std, "that is std without the 1/sqrt(2N) factor of the residual projections",
             "draw the two projections that write into the stream with std divided by the square "
             "root of 2 times the number of blocks."),
            (std / math.sqrt(n_layers), "that is std / sqrt(N): each block adds to the stream twice",
             "divide std by the square root of 2N, two additions per block, not of N."),
            (std / math.sqrt(2 * n_layers), "that is the residual projections' std",
             "only attention's out_proj and the FFN's down write into the stream; every other weight "
             "is drawn with std itself."),
            (std**2, "that is the variance, std squared", "pass the standard deviation to the normal "
             "draw, not the variance."),
            (std / (2 * n_layers), "that divides by 2N, not by its square root",
             "the variance is divided by 2N, so the standard deviation by the square root of 2N.")):
        if abs(got / guess - 1) < 0.1:
            return f"{what}: {why}", fix
    return what, None


@exercise(hint="Every linear layer's weight is drawn from a normal distribution of mean 0 and "
               "standard deviation std and its bias set to zero; then the two projections of each "
               "block that write into the residual stream (attention's output projection and the "
               "FFN's down projection) are drawn again with std divided by the square root of twice "
               "the number of blocks. The LayerNorms keep their ones and zeros.",
          task="Write gpt2_init(blocks, n_layers, std) initialising a stack of Pre-LN Blocks in place "
               "as GPT-2 does. The check measures the standard deviation of every weight of stacks of "
               "2 and 12 blocks, and their biases and LayerNorms.",
          points=3, forbidden=("helpers.model.layers.init_gpt2_",))
def gpt2_init(student: Callable[..., Any]) -> str:
    for n_layers, std in ((2, 0.02), (12, 0.05)):
        with torch.random.fork_rng():  # the student's draws leave the notebook's random numbers alone
            reseed(n_layers)
            blocks = torch.nn.ModuleList(layers.Block(48, 4) for _ in range(n_layers))
            before = [p.clone() for p in blocks.parameters()]
            student(blocks, n_layers, std)
        if all(torch.equal(old, new) for old, new in zip(before, blocks.parameters(), strict=True)):
            raise ExerciseFailed("your function changed no parameter: the blocks still have PyTorch's "
                                 "default initialisation.",
                                 fix="fill the parameters of the blocks you are given, in place, with "
                                     "the init functions of torch.nn.init.")
        for index, block in enumerate(blocks):
            where = f"block {index} of {n_layers}"
            for name, module in block.named_modules():
                if isinstance(module, layers.LayerNorm):
                    if not (torch.all(module.weight == 1) and torch.all(module.bias == 0)):
                        raise ExerciseFailed(f"in {where}, {name} no longer has weight 1 and bias 0.",
                                             fix="leave the LayerNorms alone: only the linear layers "
                                                 "are drawn at random.")
                if not isinstance(module, torch.nn.Linear):
                    continue
                if module.bias is not None and not torch.all(module.bias == 0):
                    raise ExerciseFailed(f"in {where}, the bias of {name} is not zero.",
                                         fix="set every linear layer's bias to zero.")
                residual = f"{name}.weight".endswith(layers.RESIDUAL_PROJECTIONS)
                want = std / math.sqrt(2 * n_layers) if residual else std
                got = module.weight.double().std().item()
                problem = _std_problem(f"{name}.weight in {where}", got, want, n_layers, std)
                if problem is not None:
                    raise ExerciseFailed(problem[0] + ".", fix=problem[1])
                if abs(module.weight.double().mean().item()) > 5 * want / math.sqrt(module.weight.numel()):
                    raise ExerciseFailed(f"{name}.weight in {where} does not have mean 0.",
                                         fix="draw from a normal distribution of mean 0.")
    return "The stream's growth no longer depends on the depth: the next cell measures it."
