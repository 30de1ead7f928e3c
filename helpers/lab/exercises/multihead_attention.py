"""Exercises of notebook 5 (multi-head attention): splitting and merging heads, fusing a list of
heads into one module, the forward pass, sizing a KV cache."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.lab.exercises import (
    ExerciseFailed,
    exercise,
    expect_close,
    expect_count,
    hidden_round,
    reseed,
    seeded,
)
from helpers.model import multihead


def _numbered(*shape: int) -> torch.Tensor:
    """A tensor whose entries are 0, 1, 2, ...: a wrong reshape shows up as wrong values."""
    return torch.arange(float(torch.Size(shape).numel())).view(*shape)


@exercise(hint="Each token's D features are H blocks of D_H side by side: first give the feature "
               "axis two axes, heads then features, and only then swap the token and head axes.",
          task="Write split_heads(x, n_heads): (B, N, D) -> (B, H, N, D_H). The check uses numbered "
               "entries, so a wrong order of features shows.")
def split_heads(student: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    cases = [(_numbered(*shape), n_heads)
             for shape, n_heads in (((2, 3, 8), 4), ((1, 5, 6), 2), ((3, 1, 4), 1))]
    if hidden_round():  # random float64 values of a shape drawn from the hidden seed: the dtype is kept
        batch, tokens, n_heads, head_dim = torch.randint(1, 7, (4,), generator=seeded(63)).tolist()
        cases.insert(0, (torch.randn(batch, tokens, n_heads * head_dim, generator=seeded(64),
                                     dtype=torch.float64), n_heads))
    for x, n_heads in cases:
        shape = tuple(x.shape)
        got = student(x, n_heads)
        expected = multihead.split_heads(x, n_heads)
        if isinstance(got, torch.Tensor) and got.shape == (shape[0], shape[1], n_heads, shape[2] // n_heads) \
                and got.shape != expected.shape:
            raise ExerciseFailed(f"for x of shape {shape} you return {tuple(got.shape)}, (B, N, H, D_H): "
                                 "the features are cut into heads, but the head axis must come before "
                                 "the token axis, (B, H, N, D_H).",
                                 fix="after cutting the features into heads, swap the token axis and "
                                     "the head axis (axes 1 and 2).")
        interleaved = x.view(shape[0], shape[1], shape[2] // n_heads, n_heads).permute(0, 3, 1, 2)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and n_heads > 1 \
                and torch.equal(got, interleaved):
            raise ExerciseFailed(f"for x of shape {shape} and {n_heads} heads your heads are interleaved: head "
                                 f"h got features h, h + {n_heads}, h + {2 * n_heads}, ..., but each head owns "
                                 "a block of D_H features side by side (head 0: features 0 to D_H - 1).",
                                 fix="cut the feature axis into H blocks of D_H (the head axis first, the "
                                     "features within a head second), not into D_H blocks of H.")
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not torch.equal(got, expected):
            raise ExerciseFailed(
                f"for x of shape {shape} and {n_heads} heads the shape {tuple(got.shape)} is right, "
                "but the values are in the wrong places: reading (B, N, D) straight as (B, H, N, D_H) "
                "mixes features of different tokens into one head.",
                fix="View as (B, N, H, D_H) first, so that each token keeps its own features, then "
                    "swap the token and head axes.")
        expect_close(got, expected, f"split_heads(x of shape {shape}, n_heads={n_heads})")
    return "Every head now sees its own D_H features of every token."


@exercise(hint="Undo split_heads in reverse order: move the head axis back behind the token axis, "
               "then join the last two axes into one of H times D_H features.",
          task="Write merge_heads(heads): (B, H, N, D_H) -> (B, N, H * D_H), the inverse of "
               "split_heads. The check uses numbered entries.")
def merge_heads(student: Callable[[torch.Tensor], torch.Tensor]) -> str:
    cases = [_numbered(*shape) for shape in ((2, 4, 3, 2), (1, 2, 5, 3), (3, 1, 2, 4))]
    if hidden_round():  # random float64 values of a shape drawn from the hidden seed: the dtype is kept
        shape = torch.randint(1, 7, (4,), generator=seeded(61)).tolist()
        cases.insert(0, torch.randn(shape, generator=seeded(62), dtype=torch.float64))
    for heads in cases:
        shape = tuple(heads.shape)
        try:
            got = student(heads)
        except RuntimeError as error:
            if "view" in str(error):
                raise ExerciseFailed("your .view fails: after a transpose the tensor is no longer "
                                     "contiguous in memory, and view cannot regroup it.",
                                     fix="use .reshape, which copies when it has to (or make the "
                                         "tensor contiguous before the view).") from None
            raise
        expected = multihead.merge_heads(heads)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not torch.equal(got, expected):
            raise ExerciseFailed(
                f"for heads of shape {shape} the shape {tuple(got.shape)} is right but the values "
                "are not: reshaping (B, H, N, D_H) straight to (B, N, H * D_H) interleaves tokens.",
                fix="Transpose first: put the token axis back before the head axis, then join the "
                    "heads' features.")
        expect_close(got, expected, f"merge_heads(heads of shape {shape})")
    x = _numbered(2, 3, 8)
    expect_close(student(multihead.split_heads(x, 4)), x, "merge_heads(split_heads(x, 4))")
    return "merge_heads undoes split_heads exactly."


@exercise(hint="Count the numbers one token leaves in the cache: in every layer, for every key/value "
               "head, one key vector and one value vector of head_dim numbers; then multiply by the "
               "bytes of one number.",
          task="Write kv_cache_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_value) "
               "returning an int. The check tries four model shapes.")
def kv_cache_bytes_per_token(student: Callable[[int, int, int, int], int]) -> str:
    cases = ((32, 1, 64, 4), (96, 96, 128, 2), (80, 8, 128, 2), (12, 12, 64, 1))  # 4 bytes first: unambiguous
    if hidden_round():  # sizes drawn from the hidden seed, 4 bytes again first
        n_layers, n_kv_heads, head_dim = torch.randint(2, 100, (3,), generator=seeded(60)).tolist()
        cases = ((n_layers, n_kv_heads, head_dim, 4),) + cases
    for n_layers, n_kv_heads, head_dim, n_bytes in cases:
        got = expect_count(student(n_layers, n_kv_heads, head_dim, n_bytes),
                           f"the result for ({n_layers}, {n_kv_heads}, {head_dim}, {n_bytes})")
        expected = multihead.kv_cache_bytes_per_token(n_layers, n_kv_heads, head_dim, n_bytes)
        if got == expected:
            continue
        call = f"({n_layers}, {n_kv_heads}, {head_dim}, {n_bytes})"
        if got == expected // 2:
            raise ExerciseFailed(f"{call} gave {got}, half of {expected}: the cache keeps both K and V.",
                                 fix="count a key and a value for every head of every layer: a "
                                     "factor 2.")
        if got == expected // n_bytes:
            raise ExerciseFailed(f"{call} gave {got}: that counts numbers, not bytes "
                                 f"(each is {n_bytes} bytes).",
                                 fix="multiply the count of numbers by bytes_per_value.")
        raise ExerciseFailed(f"{call} gave {got!r}, expected {expected}.")
    gpt3 = multihead.kv_cache_bytes_per_token(96, 96, 128, 2) / 2**20
    return f"GPT-3 (96 layers, 96 heads of 128, fp16) keeps {gpt3:.1f} MiB for every token."


# --- the core exercise: the forward pass of multi-head attention -------------------------------

def mha_variant(x: torch.Tensor, mha: multihead.MultiHeadAttention, causal: bool = False, *,
                scale: str = "head", split: str = "transpose", merge: str = "transpose",
                out_proj: bool = True, mask: bool = True) -> torch.Tensor:
    """The forward of `mha` on x (B, N, D), right by default, or with a usual slip (to name it)."""
    batch, n, d = x.shape
    h = mha.n_heads

    def split_(t: torch.Tensor) -> torch.Tensor:
        if split == "view":  # (B, N, D) read straight as (B, H, N, D_H): tokens and heads mixed
            return t.reshape(batch, h, n, d // h)
        return t.view(batch, n, h, d // h).transpose(1, 2)

    q, k, v = (split_(proj(x)) for proj in (mha.q_proj, mha.k_proj, mha.v_proj))
    size = {"head": d // h, "model": d, "none": 1}[scale]
    scores = q @ k.transpose(-2, -1) / size ** 0.5
    if causal and mask:
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    heads = torch.softmax(scores, dim=-1) @ v                       # (B, H, N, D_H)
    merged = heads.reshape(batch, n, d) if merge == "view" else heads.transpose(1, 2).reshape(batch, n, d)
    return mha.out_proj(merged) if out_proj else merged


MHA_SLIPS = {  # what the slip looks like: (what is wrong, how to fix it)
    "scale_model": ("scales the scores by 1/sqrt(d_model)",
                    "each head's dot products have D_H terms, so divide the scores by the square root "
                    "of head_dim, not of d_model."),
    "scale_none": ("forgot the 1/sqrt(head_dim) scale of the scores",
                   "divide the scores by the square root of the head size before the softmax."),
    "split_view": ("splits the heads by reading (B, N, D) straight as (B, H, N, D_H), which mixes tokens",
                   "cut the features into heads first, (B, N, H, D_H), then move the head axis in "
                   "front of the tokens."),
    "merge_view": ("merges the heads by reading (B, H, N, D_H) straight as (B, N, D), which mixes tokens",
                   "move the head axis back behind the tokens first, then join the heads' features."),
    "no_out_proj": ("forgot the output projection W_O (mha.out_proj) after merging the heads",
                    "pass the merged heads through the module's output projection."),
    "no_mask": ("ignores causal=True: with it, query i sees keys 0 ... i only",
                "when causal is true, set the scores above the diagonal to minus infinity before "
                "the softmax."),
}
MHA_KNOBS = {"scale_model": {"scale": "model"}, "scale_none": {"scale": "none"},
             "split_view": {"split": "view"}, "merge_view": {"merge": "view"},
             "no_out_proj": {"out_proj": False}, "no_mask": {"mask": False}}


@exercise(hint="The four steps of the table in section 3: project x to queries, keys and values; cut "
               "each into heads; attend inside each head, scaled by the square root of the head size "
               "and masked when causal; then merge the heads and apply the output projection.",
          task="Write mha_forward(x, mha, causal) returning the (B, N, D) output of the "
               "MultiHeadAttention module mha, using its q_proj, k_proj, v_proj and out_proj. The "
               "check compares with mha(x) for 1 to 4 heads, with and without causal, a single "
               "token included.",
          points=3,
          forbidden=("helpers.model.multihead.MultiHeadAttention.forward",
                     "helpers.model.multihead.MultiHeadAttention.attend"))
def mha_forward(student: Callable[..., torch.Tensor]) -> str:
    for seed, (batch, n, d, h, causal) in enumerate(((2, 5, 8, 2, False), (2, 5, 8, 2, True),
                                                      (1, 6, 12, 4, True), (3, 1, 6, 1, True))):
        with torch.random.fork_rng():  # leave the notebook's random numbers as they were
            reseed(seed)
            mha = multihead.MultiHeadAttention(d, h).double()
            x = torch.randn(batch, n, d, dtype=torch.float64)
        what = f"x {tuple(x.shape)}, {h} heads, causal={causal}"
        with torch.no_grad():
            got = student(x.clone(), mha, causal)
            want = mha(x, causal=causal)
            if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.allclose(got.double(), want):
                for slip, (wrong, fix) in MHA_SLIPS.items():
                    if torch.allclose(got.double(), mha_variant(x, mha, causal, **MHA_KNOBS[slip])):
                        raise ExerciseFailed(f"for {what}, your forward {wrong}.", fix=fix)
        expect_close(got, want, f"the output for {what}", atol=1e-6)
    return "Your forward equals MultiHeadAttention's; the next cell proves it equals PyTorch's too."


# --- the core exercise: one fused module from a list of heads ------------------------------------

def _separate(seed: int, d_model: int, n_heads: int, bias: bool) -> multihead.SeparateHeadsAttention:
    """A SeparateHeadsAttention with random weights (and biases far from 0, so a lost one shows).
    It seeds the global generator: call it inside torch.random.fork_rng."""
    reseed(seed)
    separate = multihead.SeparateHeadsAttention(d_model, n_heads, bias=bias)
    with torch.no_grad():
        for param in separate.parameters():
            param.normal_(0.0, 0.5)
    return separate


def _fuse_mistake(got: multihead.MultiHeadAttention, separate: multihead.SeparateHeadsAttention) -> tuple[str, str] | None:
    """(what is wrong, how to fix it) for a usual slip in fusing `separate`'s heads, or None."""
    right = multihead.fuse_heads(separate)
    d, h, d_h = separate.d_model, separate.n_heads, separate.head_dim
    has_bias = separate.out_proj.bias is not None
    if (got.out_proj.bias is not None) != has_bias:
        have = "has no biases" if not has_bias else "has biases"
        return (f"separate {have} (bias={has_bias}), but your fused module "
                f"{'has' if got.out_proj.bias is not None else 'has none'}",
                "build the MultiHeadAttention with the same bias setting as the heads (look at "
                "whether separate's output projection has a bias).")
    for name in ("q_proj", "k_proj", "v_proj"):
        mine, want = getattr(got, name).weight, getattr(right, name).weight
        if torch.equal(mine, want):
            if has_bias and not torch.equal(getattr(got, name).bias, getattr(right, name).bias):
                return (f"the weights of {name} are right but its bias is not the heads' biases",
                        "stack the heads' biases in the same order as their weights.")
            continue
        per_head = want.view(h, d_h, d)
        if torch.equal(mine, per_head.transpose(0, 1).reshape(d, d)):
            return (f"the rows of {name}'s weight interleave the heads: head h must own rows "
                    "h*D_H ... (h+1)*D_H - 1",
                    "stack the heads' weight matrices one after another along the output axis, "
                    "not row by row.")
        if torch.equal(mine, want.T.contiguous()):
            return (f"{name}'s weight is transposed: nn.Linear stores it as (out x in), and each "
                    "head's weight is already (D_H x D)",
                    "stack the heads' weights as they are, along the first axis.")
        others = [o for o in ("q_proj", "k_proj", "v_proj") if o != name]
        for other in others:
            if torch.equal(mine, getattr(right, other).weight):
                return (f"{name} holds the heads' {other} weights",
                        "copy each head's query weights into the fused query projection, keys into "
                        "keys, values into values.")
        return (f"the weight of {name} is not the heads' weights stacked", None)
    if not torch.equal(got.out_proj.weight, right.out_proj.weight) or (
            has_bias and not torch.equal(got.out_proj.bias, right.out_proj.bias)):
        return ("the output projection W_O is not the one of separate",
                "copy separate's output projection (weight and bias) as it is: the concatenated "
                "heads go through the same W_O in both modules.")
    return None


@exercise(hint="Both modules compute the same projections: the fused query projection is the heads' "
               "query projections stacked along the output axis, head 0's rows first; the same for "
               "keys and values, biases included; the output projection stays as it is.",
          task="Write fuse_heads(separate) returning a new MultiHeadAttention that computes exactly "
               "what the SeparateHeadsAttention `separate` computes. The check compares the two "
               "modules' outputs, with and without biases and the causal mask, for 1 to 4 heads.",
          points=3, forbidden=("helpers.model.multihead.fuse_heads",))
def fuse_heads(student: Callable[[multihead.SeparateHeadsAttention], multihead.MultiHeadAttention]) -> str:
    with torch.random.fork_rng():  # building modules draws random numbers: leave the notebook's alone
        _check_fuse(student)
    return "One module, one product per projection, the same numbers as the list of heads."


def _check_fuse(student: Callable[[multihead.SeparateHeadsAttention], multihead.MultiHeadAttention]) -> None:
    for seed, (d, h, bias) in enumerate(((8, 2, True), (12, 4, False), (6, 1, True), (12, 3, True))):
        separate = _separate(seed, d, h, bias)
        before = {k: v.clone() for k, v in separate.state_dict().items()}
        got = student(separate)
        what = f"a SeparateHeadsAttention with d_model={d}, {h} heads, bias={bias}"
        if any(not torch.equal(before[k], v) for k, v in separate.state_dict().items()):
            raise ExerciseFailed(f"for {what} your function changed the weights of separate",
                                 fix="copy from the heads into the new module, never the other way.")
        if not isinstance(got, multihead.MultiHeadAttention):
            raise ExerciseFailed(f"for {what} your function returns a {type(got).__name__}, "
                                 "expected a new MultiHeadAttention.",
                                 fix="build a MultiHeadAttention of the same size, copy the weights "
                                     "into it and return it.")
        if (got.d_model, got.n_heads, got.n_kv_heads) != (d, h, h):
            raise ExerciseFailed(f"for {what} you return a MultiHeadAttention with d_model="
                                 f"{got.d_model}, {got.n_heads} heads and {got.n_kv_heads} key/value "
                                 f"heads, expected {d}, {h} and {h}.")
        reseed(100 + seed)
        x = torch.randn(2, 5, d)
        with torch.no_grad():
            same = all(torch.allclose(got(x, causal=c), separate(x, causal=c), atol=1e-5, rtol=1e-5)
                       for c in (False, True))
            if not same:
                mistake = _fuse_mistake(got, separate)
                if mistake is not None:
                    raise ExerciseFailed(f"for {what}: {mistake[0]}.", fix=mistake[1])
                raise ExerciseFailed(f"for {what} the fused module's output differs from separate's.")
