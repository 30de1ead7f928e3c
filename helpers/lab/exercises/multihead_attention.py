"""Exercises of notebook 5 (multi-head attention): splitting and merging heads, the forward pass,
sizing a KV cache."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close, expect_count
from helpers.model import multihead


def _numbered(*shape: int) -> torch.Tensor:
    """A tensor whose entries are 0, 1, 2, ...: a wrong reshape shows up as wrong values."""
    return torch.arange(float(torch.Size(shape).numel())).view(*shape)


@exercise(hint="x.view(B, N, H, D_H) cuts each token's features into H pieces; "
               ".transpose(1, 2) then puts the head axis before the token axis.",
          task="Write split_heads(x, n_heads): (B, N, D) -> (B, H, N, D_H). The check uses numbered "
               "entries, so a wrong order of features shows.")
def split_heads(student: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    for shape, n_heads in (((2, 3, 8), 4), ((1, 5, 6), 2), ((3, 1, 4), 1)):
        x = _numbered(*shape)
        got = student(x, n_heads)
        expected = multihead.split_heads(x, n_heads)
        if isinstance(got, torch.Tensor) and got.shape == (shape[0], shape[1], n_heads, shape[2] // n_heads) \
                and got.shape != expected.shape:
            raise ExerciseFailed(f"for x of shape {shape} you return {tuple(got.shape)}, (B, N, H, D_H): "
                                 "the features are cut into heads, but the head axis must come before "
                                 "the token axis, (B, H, N, D_H).")
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not torch.equal(got, expected):
            raise ExerciseFailed(
                f"for x of shape {shape} and {n_heads} heads the shape {tuple(got.shape)} is right, "
                "but the values are in the wrong places: a single .view(B, H, N, D_H) mixes "
                "features of different tokens into one head. View as (B, N, H, D_H) first.")
        expect_close(got, expected, f"split_heads(x of shape {shape}, n_heads={n_heads})")
    return "Every head now sees its own D_H features of every token."


@exercise(hint="Undo split_heads: .transpose(1, 2) back to (B, N, H, D_H), then "
               ".reshape(B, N, H * D_H). (.view fails after a transpose; .reshape copies when needed.)",
          task="Write merge_heads(heads): (B, H, N, D_H) -> (B, N, H * D_H), the inverse of "
               "split_heads. The check uses numbered entries.")
def merge_heads(student: Callable[[torch.Tensor], torch.Tensor]) -> str:
    for shape in ((2, 4, 3, 2), (1, 2, 5, 3), (3, 1, 2, 4)):
        heads = _numbered(*shape)
        try:
            got = student(heads)
        except RuntimeError as error:
            if "view" in str(error):
                raise ExerciseFailed("after a transpose the tensor is no longer contiguous, so .view "
                                     "fails: use .reshape (or .contiguous().view).") from None
            raise
        expected = multihead.merge_heads(heads)
        if isinstance(got, torch.Tensor) and got.shape == expected.shape and not torch.equal(got, expected):
            raise ExerciseFailed(
                f"for heads of shape {shape} the shape {tuple(got.shape)} is right but the values "
                "are not: reshaping (B, H, N, D_H) straight to (B, N, H * D_H) interleaves tokens. "
                "Transpose first.")
        expect_close(got, expected, f"merge_heads(heads of shape {shape})")
    x = _numbered(2, 3, 8)
    expect_close(student(multihead.split_heads(x, 4)), x, "merge_heads(split_heads(x, 4))")
    return "merge_heads undoes split_heads exactly."


@exercise(hint="Each token stores one key and one value vector per KV head in every layer: "
               "2 x n_layers x n_kv_heads x head_dim numbers, each bytes_per_value bytes.",
          task="Write kv_cache_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_value) "
               "returning an int. The check tries four model shapes.")
def kv_cache_bytes_per_token(student: Callable[[int, int, int, int], int]) -> str:
    cases = ((32, 1, 64, 4), (96, 96, 128, 2), (80, 8, 128, 2), (12, 12, 64, 1))  # 4 bytes first: unambiguous
    for n_layers, n_kv_heads, head_dim, n_bytes in cases:
        got = expect_count(student(n_layers, n_kv_heads, head_dim, n_bytes),
                           f"the result for ({n_layers}, {n_kv_heads}, {head_dim}, {n_bytes})")
        expected = multihead.kv_cache_bytes_per_token(n_layers, n_kv_heads, head_dim, n_bytes)
        if got == expected:
            continue
        call = f"({n_layers}, {n_kv_heads}, {head_dim}, {n_bytes})"
        if got == expected // 2:
            raise ExerciseFailed(f"{call} gave {got}, half of {expected}: the cache keeps both K and V.")
        if got == expected // n_bytes:
            raise ExerciseFailed(f"{call} gave {got}: that counts numbers, not bytes "
                                 f"(each is {n_bytes} bytes).")
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


MHA_SLIPS = {
    "scales the scores by 1/sqrt(d_model): each head's dot products have D_H terms, so the "
    "scale is 1/sqrt(head_dim)": {"scale": "model"},
    "forgot the 1/sqrt(head_dim) scale of the scores": {"scale": "none"},
    "splits the heads by reading (B, N, D) straight as (B, H, N, D_H), which mixes tokens: "
    "view as (B, N, H, D_H) first, then move the head axis": {"split": "view"},
    "merges the heads by reading (B, H, N, D_H) straight as (B, N, D), which mixes tokens: "
    "move the head axis back after the tokens first": {"merge": "view"},
    "forgot the output projection W_O (mha.out_proj) after merging the heads": {"out_proj": False},
    "ignores causal=True: with it, query i sees keys 0 ... i only": {"mask": False},
}


@exercise(hint="Project x three times, split each into heads (B, H, N, D_H), attend within each head "
               "(scaled by sqrt(D_H), causal when asked), merge the heads back and apply out_proj.",
          task="Write mha_forward(x, mha, causal) returning the (B, N, D) output of the "
               "MultiHeadAttention module mha, using its q_proj, k_proj, v_proj and out_proj. The "
               "check compares with mha(x) for 1 to 4 heads, with and without causal, a single "
               "token included.")
def mha_forward(student: Callable[..., torch.Tensor]) -> str:
    for seed, (batch, n, d, h, causal) in enumerate(((2, 5, 8, 2, False), (2, 5, 8, 2, True),
                                                      (1, 6, 12, 4, True), (3, 1, 6, 1, True))):
        with torch.random.fork_rng():  # leave the notebook's random numbers as they were
            torch.manual_seed(seed)
            mha = multihead.MultiHeadAttention(d, h).double()
            x = torch.randn(batch, n, d, dtype=torch.float64)
        what = f"x {tuple(x.shape)}, {h} heads, causal={causal}"
        with torch.no_grad():
            got = student(x.clone(), mha, causal)
            want = mha(x, causal=causal)
            if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.allclose(got, want):
                for slip, knobs in MHA_SLIPS.items():
                    if torch.allclose(got.double(), mha_variant(x, mha, causal, **knobs)):
                        raise ExerciseFailed(f"for {what} your forward {slip}.")
        expect_close(got, want, f"the output for {what}", atol=1e-6)
    return "Your forward equals MultiHeadAttention's; the next cell proves it equals PyTorch's too."
