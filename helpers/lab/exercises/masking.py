"""Exercises of notebook 4 (masking): a causal softmax, a padding mask, attention with both masks,
a sliding-window mask."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close
from helpers.model import attention as reference


def _expect_bool(got: object, expected: Tensor, what: str) -> None:
    """Fail unless `got` is a boolean tensor equal to `expected`, saying which entry is wrong."""
    if not isinstance(got, Tensor):
        raise ExerciseFailed(f"{what} should be a torch.Tensor, but it is a {type(got).__name__}.")
    if got.dtype != torch.bool:
        raise ExerciseFailed(f"{what} has dtype {got.dtype}: return a boolean tensor "
                             "(True = may attend), e.g. with a comparison or .bool().")
    if got.shape != expected.shape:
        raise ExerciseFailed(f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}.")
    wrong = (got != expected).nonzero()
    if len(wrong):
        where = tuple(wrong[0].tolist())
        raise ExerciseFailed(f"{what} is wrong at {where}: you have {bool(got[where])}, "
                             f"expected {bool(expected[where])}.")


@exercise(hint="build torch.tril(torch.ones(n, n, dtype=torch.bool)), then "
               "scores.masked_fill(~allowed, float('-inf')), then softmax over dim=-1.",
          task="Write causal_softmax(scores) for an (n, n) score matrix: softmax weights with none "
               "on a later key. The check compares with the course's on a (5, 5) matrix.")
def causal_softmax(student: Callable[[Tensor], Tensor]) -> str:
    """The student's causal_softmax(scores (n, n)) -> weights, with no weight on any future key."""
    scores = torch.randn(5, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    got = student(scores)
    expected = reference.softmax(scores.masked_fill(~reference.causal_mask(5), float("-inf")))
    if isinstance(got, Tensor) and got.shape == expected.shape:
        future = ~reference.causal_mask(5)
        if torch.allclose(got, torch.softmax(scores.masked_fill(future, 0.0), dim=-1)):
            raise ExerciseFailed("future keys still get weight: you filled them with 0, and exp(0) = 1. "
                                 "Fill them with float('-inf') so that exp gives exactly 0.")
        if got[future].abs().max() > 0 and got.tril(-1).abs().max() == 0:
            raise ExerciseFailed("your mask is upside down: query i must see keys 0..i (on and below "
                                 "the diagonal, torch.tril), not i..n-1.")
        if got[future].abs().max() > 0:
            raise ExerciseFailed("some query puts weight on a later key: every entry above the "
                                 "diagonal must be exactly 0.")
    expect_close(got, expected, "the causal weights of a (5, 5) score matrix")
    return "No query can peek at the future."


@exercise(hint="torch.arange(n) gives the key positions; compare them with lengths[:, None].",
          task="Write padding_mask(lengths, n) returning a boolean (B, n) mask, True on real tokens. "
               "The check tries lengths [3, 5, 1] with n = 5.")
def padding_mask(student: Callable[[Tensor, int], Tensor]) -> str:
    """The student's padding_mask(lengths (B,), n) -> bool (B, n), True on real tokens."""
    lengths = torch.tensor([3, 5, 1])
    expected = reference.padding_mask(lengths, 5)[:, 0, 0, :]
    got = student(lengths, 5)
    if isinstance(got, Tensor) and got.shape == expected.shape and got.dtype == torch.bool:
        if torch.equal(got, torch.arange(5)[None, :] <= lengths[:, None]):
            raise ExerciseFailed("one real token too many: a sequence of length L has tokens at "
                                 "positions 0 ... L - 1, so position L is already padding (use <).")
        if torch.equal(got, ~expected):
            raise ExerciseFailed("the mask is inverted: True must mark the real tokens (may attend), "
                                 "False the padding.")
    _expect_bool(got, expected, "padding_mask(tensor([3, 5, 1]), 5)")
    return "Padding is now invisible to every query."


@exercise(hint="offset = i - j for query i and key j (torch.arange(n)[:, None] - torch.arange(n)); "
               "allowed where 0 <= offset <= window.",
          task="Write local_mask(n, window) returning a boolean (n, n) causal sliding-window mask. "
               "The check tries windows 2, 0 and one wider than n.")
def local_mask(student: Callable[[int, int], Tensor]) -> str:
    """The student's causal sliding-window mask local_mask(n, window) -> bool (n, n)."""
    for n, window in ((6, 2), (5, 0), (4, 10)):
        got = student(n, window)
        expected = reference.local_mask(n, window, causal=True)
        if isinstance(got, Tensor) and got.shape == expected.shape and got.dtype == torch.bool:
            two_sided = reference.local_mask(n, window, causal=False)
            if torch.equal(got, two_sided) and not torch.equal(expected, two_sided):
                raise ExerciseFailed(f"local_mask({n}, {window}) lets a query see later keys: keep only "
                                     "keys at or before the query (offset >= 0).")
            short = reference.local_mask(n, max(window - 1, 0), causal=True)
            if window > 0 and torch.equal(got, short) and not torch.equal(expected, short):
                raise ExerciseFailed(f"local_mask({n}, {window}) lets each query see only {window} keys: "
                                     f"the window counts the keys before the query, so offsets 0 ... "
                                     f"{window} are allowed ({window + 1} keys).")
        _expect_bool(got, expected, f"local_mask({n}, {window})")
    return "Each query now sees at most window + 1 keys, so the cost grows as n * window, not n^2."


# --- the core exercise: attention with a causal and a padding mask -----------------------------

def masked_attention_variant(q: Tensor, k: Tensor, v: Tensor, lengths: Tensor, *, scale: bool = True,
                             fill: float = float("-inf"), after_softmax: bool = False,
                             causal: str = "tril", padding: str = "keys") -> tuple[Tensor, Tensor]:
    """Causal + padding attention, right by default, or with one of the usual slips (to name it)."""
    n = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5 if scale else 1.0)
    ones = torch.ones(n, n, dtype=torch.bool)
    allowed = {"tril": ones.tril(), "triu": ones.triu(), "none": ones}[causal]
    positions = torch.arange(n)
    real = positions <= lengths[:, None] if padding == "keys_le" else positions < lengths[:, None]
    if padding in ("keys", "keys_le"):
        allowed = allowed & real[:, None, None, :]
    elif padding == "queries":
        allowed = allowed & real[:, None, :, None]
    if after_softmax:
        weights = torch.softmax(scores, dim=-1) * allowed
    else:
        weights = torch.softmax(scores.masked_fill(~allowed, fill), dim=-1)
    return weights @ v, weights


MASK_SLIPS = {
    "applies the mask after the softmax: fill the scores first, then take the softmax, so that "
    "each row's weights still sum to 1": {"after_softmax": True},
    "fills the masked scores with 0, and exp(0) = 1: fill them with float('-inf')": {"fill": 0.0},
    "forgot the 1/sqrt(d) scale of the scores": {"scale": False},
    "has no causal mask: query i must not see the keys after it": {"causal": "none"},
    "has the causal mask upside down: query i sees keys 0 ... i (torch.tril), not i ... n - 1": {"causal": "triu"},
    "lets real tokens see the pads: a padding mask hides the pad keys (the columns)": {"padding": "none"},
    "hides the pad queries (rows) instead of the pad keys (columns)": {"padding": "queries"},
    "shows one pad too many: position j is real when j < length, not j <= length": {"padding": "keys_le"},
}


@exercise(hint="One boolean mask, (B, 1, N, N) = causal (N, N) & padding (B, 1, 1, N), filled into the "
               "scaled scores with -inf before the softmax over the keys.",
          task="Write masked_attention(q, k, v, lengths) for q, k, v (B, H, N, d) returning (output, "
               "weights), with no weight on a later key or on a pad key. The check tries lengths "
               "[5, 3, 1] and a single token, and compares with the course's attention.")
def masked_attention(student: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> str:
    generator = torch.Generator().manual_seed(6)
    for shape, d_v, lengths in (((3, 2, 5, 4), 3, [5, 3, 1]), ((1, 1, 1, 2), 2, [1]), ((2, 3, 4, 8), 8, [2, 4])):
        q, k = (torch.randn(*shape, generator=generator, dtype=torch.float64) for _ in range(2))
        v = torch.randn(*shape[:-1], d_v, generator=generator, dtype=torch.float64)
        lengths_t = torch.tensor(lengths)
        what = f"q, k {shape}, v {tuple(v.shape)}, lengths {lengths}"
        got = student(q, k, v, lengths_t.clone())
        if not isinstance(got, tuple) or len(got) != 2:
            raise ExerciseFailed(f"return a pair (output, weights); for {what} you returned a "
                                 f"{type(got).__name__}.")
        n = shape[-2]
        mask = reference.causal_mask(n) & reference.padding_mask(lengths_t, n)
        want_out, want_w = reference.scaled_dot_product_attention(q, k, v, mask=mask)
        out, weights = got
        if isinstance(weights, Tensor) and weights.shape == want_w.shape and not torch.allclose(weights, want_w):
            slips = {slip: masked_attention_variant(q, k, v, lengths_t, **knobs)[1] for slip, knobs in MASK_SLIPS.items()}
            # A row a slip masks entirely is NaN there, or anything with a finite fill: compare the
            # other rows, trying first the slips that leave the fewest such rows.
            for slip, wrong in sorted(slips.items(), key=lambda item: int(item[1].isnan().sum())):
                seen = ~wrong.isnan()
                if torch.allclose(weights.double()[seen], wrong[seen]):
                    raise ExerciseFailed(f"for {what} your attention {slip}.")
        expect_close(weights, want_w, f"the weights for {what}")
        expect_close(out, want_out, f"the output for {what}")
    return "No token reads the future or a pad; the next cell runs on your function."
