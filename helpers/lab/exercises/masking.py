"""Exercises of notebook 4 (masking): a causal softmax, a padding mask, and the two core ones,
attention with a causal and a padding mask that survives a row with nothing to see, and the sparse
attention patterns as one mask."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close, hidden_round, seeded
from helpers.model import attention as reference


def _expect_bool(got: object, expected: Tensor, what: str) -> None:
    """Fail unless `got` is a boolean tensor equal to `expected`, saying which entry is wrong."""
    if not isinstance(got, Tensor):
        raise ExerciseFailed(f"{what} should be a torch.Tensor, but it is a {type(got).__name__}.",
                             fix="return the mask as a tensor.")
    if got.dtype != torch.bool:
        raise ExerciseFailed(f"{what} has dtype {got.dtype}, not torch.bool.",
                             fix="return a boolean tensor (True = may attend), e.g. with a comparison or .bool().")
    if got.shape != expected.shape:
        raise ExerciseFailed(f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}.",
                             fix="one row per query and one column per key.")
    wrong = (got != expected).nonzero()
    if len(wrong):
        where = tuple(wrong[0].tolist())
        raise ExerciseFailed(f"{what} is wrong at {where}: you have {bool(got[where])}, "
                             f"expected {bool(expected[where])}.",
                             fix="print your mask for a small case and compare it entry by entry with the rule.")


# --- exercise 1: a causal softmax, also for the queries of a KV cache ----------------------------

def _causal_variants(n_q: int, n_k: int) -> dict[str, Tensor]:
    """Which keys each query may see: right, and the usual slips."""
    query = torch.arange(n_q)[:, None]
    key = torch.arange(n_k)[None, :]
    offset = n_k - n_q  # the queries are the last n_q positions
    return {"right": key <= query + offset, "upside down": key >= query + offset, "top left": key <= query,
            "no diagonal": key < query + offset}


@exercise(hint="the queries are the last n_q of the n_k positions, so query i sits at position i + "
               "n_k - n_q and may see every key at or before that position; fill every other score "
               "with minus infinity, then take the softmax over the keys.",
          task="Write causal_softmax(scores) for scores (..., n_q, n_k) with n_k >= n_q: softmax weights "
               "with none on a later key. The check tries (5, 5), (2, 5) and a batch of (3, 6).",
          points=2)
def causal_softmax(student: Callable[[Tensor], Tensor]) -> str:
    """The student's causal_softmax(scores (..., n_q, n_k)) -> weights, with no weight on a later key."""
    generator = seeded(4)
    for shape in ((5, 5), (2, 5), (2, 3, 6)):
        scores = torch.randn(*shape, generator=generator, dtype=torch.float64)
        n_q, n_k = shape[-2:]
        variants = _causal_variants(n_q, n_k)
        expected = reference.softmax(scores.masked_fill(~variants["right"], float("-inf")))
        got = student(scores.clone())
        what = f"scores of shape {shape}"
        if isinstance(got, Tensor) and got.shape == expected.shape:
            got64 = got.double()
            future = ~variants["right"]
            if torch.allclose(got64, reference.softmax(scores.masked_fill(future, 0.0))):
                raise ExerciseFailed(f"for {what} later keys still get weight: you filled them with 0, "
                                     "and exp(0) = 1.",
                                     fix="fill them with float('-inf') so that exp gives exactly 0.")
            if torch.allclose(got64, reference.softmax(scores.masked_fill(~variants["upside down"], float("-inf")))):
                raise ExerciseFailed(f"for {what} your mask is upside down: each query sees the keys after it.",
                                     fix="query i must see the keys up to its own position (on and below the "
                                         "diagonal, torch.tril), not the ones after it.")
            if n_q < n_k and torch.allclose(got64, reference.softmax(scores.masked_fill(~variants["top left"],
                                                                                       float("-inf")))):
                raise ExerciseFailed(f"for {what} query i sees only keys 0 ... i: your triangle starts in the "
                                     "top left corner.",
                                     fix="with a cache the queries are the last n_q positions, so query i sits at "
                                         "position i + n_k - n_q: shift the triangle so that the last query sees "
                                         "every key.")
            no_diagonal = scores.masked_fill(~variants["no diagonal"], float("-inf"))
            if any(torch.allclose(got64, wrong, equal_nan=True)  # the first row NaN, or 0 where it is handled
                   for wrong in (no_diagonal.softmax(-1), reference.softmax(no_diagonal))):
                raise ExerciseFailed(f"for {what} no query may see its own key: your mask leaves out the "
                                     "diagonal, so a query with no earlier key gets NaN.",
                                     fix="let each query see every key up to and including its own position: "
                                         "the diagonal belongs to the allowed part.")
            if got64[..., future].abs().max() > 0:
                raise ExerciseFailed(f"for {what} some query puts weight on a later key.",
                                     fix="every entry after the query's own position must be exactly 0.")
        expect_close(got, expected, f"the causal weights for {what}")
    return "No query can peek at the future, with or without a cache."


@exercise(hint="compare the positions 0 to n - 1, as a row, with the lengths, as a column, and let "
               "broadcasting make the (B, n) table: with the pads last a position is real when it is "
               "smaller than the length; with the pads first, when it is at least n minus the length.",
          task="Write padding_mask(lengths, n, side='right') returning a boolean (B, n) mask, True on real "
               "tokens, the pads last (side='right') or first (side='left'). The check tries lengths "
               "[3, 5, 1] with n = 5, both ways.")
def padding_mask(student: Callable[..., Tensor]) -> str:
    """The student's padding_mask(lengths (B,), n, side) -> bool (B, n), True on real tokens."""
    lengths, n = torch.tensor([3, 5, 1]), 5
    if hidden_round():  # lengths drawn from the hidden seed, an empty row and a full one
        lengths, n = torch.cat([torch.randint(1, 7, (4,), generator=seeded(50)), torch.tensor([0, 7])]), 7
    position = torch.arange(n)[None, :]
    right = reference.padding_mask(lengths, n)[:, 0, 0, :]
    left = right.flip(-1)
    for side, expected in (("right", right), ("left", left)):
        what = f"padding_mask(tensor({lengths.tolist()}), {n}, side={side!r})"
        got = student(lengths.clone(), n) if side == "right" else student(lengths.clone(), n, "left")
        if isinstance(got, Tensor) and got.shape == expected.shape and got.dtype == torch.bool \
                and not torch.equal(got, expected):
            if torch.equal(got, ~expected):
                raise ExerciseFailed(f"{what} is inverted: it is True on the padding.",
                                     fix="True must mark the real tokens (may attend), False the padding.")
            if side == "right" and torch.equal(got, position <= lengths[:, None]):
                raise ExerciseFailed(f"{what} has one real token too many: a sentence of length L has its "
                                     "tokens at positions 0 ... L - 1, so position L is already padding.",
                                     fix="compare with < rather than <=.")
            if side == "left" and torch.equal(got, right):
                raise ExerciseFailed(f"{what} puts the pads last: with side='left' they come first.",
                                     fix="with the pads first the real tokens are the last ones: a position is real when it is "
                                         "at least n minus the length.")
            if side == "left" and torch.equal(got, position > n - lengths[:, None]):
                raise ExerciseFailed(f"{what} has one real token too few: the last L positions, from "
                                     "n - L on, are real.", fix="compare with >= rather than >.")
        _expect_bool(got, expected, what)
    return "Padding is now invisible to every query, on either side."


# --- core exercise 1: attention with a causal and a padding mask, safe on an empty row ----------

def masked_attention_variant(q: Tensor, k: Tensor, v: Tensor, real: Tensor, *, scale: bool = True,
                             fill: float = float("-inf"), after_softmax: bool = False, causal: str = "tril",
                             padding: str = "keys") -> tuple[Tensor, Tensor]:
    """Causal + padding attention with one of the usual slips (to name it); an all-masked row may
    come out NaN here, which the checker ignores when it compares."""
    n = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5 if scale else 1.0)
    ones = torch.ones(n, n, dtype=torch.bool)
    allowed = {"tril": ones.tril(), "triu": ones.triu(), "none": ones}[causal]
    if padding == "keys":
        allowed = allowed & real[:, None, None, :]
    elif padding == "queries":
        allowed = allowed & real[:, None, :, None]
    if after_softmax:
        weights = torch.softmax(scores, dim=-1) * allowed
    else:
        weights = torch.softmax(scores.masked_fill(~allowed, fill), dim=-1)
    return weights @ v, weights


MASK_SLIPS = {  # what is wrong: (how to fix it, the slip's knobs)
    "applies the mask after the softmax, so the rows no longer sum to 1":
        ("fill the scores first, then take the softmax.", {"after_softmax": True}),
    "fills the masked scores with 0, and exp(0) = 1":
        ("fill them with float('-inf').", {"fill": 0.0}),
    "forgot the 1/sqrt(d) scale of the scores":
        ("divide the scores by the square root of the head size before masking.", {"scale": False}),
    "has no causal mask, so query i sees the keys after it":
        ("combine the padding mask with the lower triangle (torch.tril).", {"causal": "none"}),
    "has the causal mask upside down":
        ("query i sees keys 0 ... i (torch.tril), not i ... n - 1.", {"causal": "triu"}),
    "lets real tokens see the pads":
        ("a padding mask hides the pad keys: the columns of the pads.", {"padding": "none"}),
    "hides the pad queries (rows) instead of the pad keys (columns)":
        ("index real as (B, 1, 1, N), so that it runs along the keys.", {"padding": "queries"}),
}

MASKED_CASES = (  # q and k shape, d_v, which tokens are real
    ((3, 2, 5, 4), 3, [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], "right-padded"),
    ((2, 1, 6, 4), 2, [[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]], "left-padded"),
    ((1, 1, 1, 2), 2, [[1]], "a single token"),
)


def _explain_empty_rows(weights: Tensor, empty: Tensor, what: str) -> None:
    """Name what the student's weights do on the rows that may see no key at all."""
    if weights[empty].isnan().any():
        raise ExerciseFailed(f"for {what} a query that may see no key (a left pad under the causal mask) "
                             "gets NaN weights: the softmax of a row of -inf is 0/0.",
                             fix="shift such a row by 0 instead of by its maximum, and divide by 1 where a "
                                 "row's sum is 0 (section 7), so that it gets zero weights.")
    rows = weights[empty]
    if rows.numel() and torch.allclose(rows, torch.full_like(rows, 1 / rows.shape[-1])):
        raise ExerciseFailed(f"for {what} a query that may see no key spreads its weight evenly over all "
                             "the keys it must not see: a large finite fill does that.",
                             fix="fill with -inf and give a row with nothing to see zero weights (section 7).")


@exercise(hint="Scale the scores; allowed is the lower triangle and a real key, the padding mask indexed "
               "so that it runs along the keys; fill the rest with minus infinity; then a softmax that "
               "shifts an all-masked row by 0 rather than by its maximum and divides by 1 where a row's "
               "sum is 0.",
          task="Write masked_attention(q, k, v, real) for q, k, v (B, H, N, d) and real (B, N) returning "
               "(output, weights), with no weight on a later key or on a pad key, and zero weights for a "
               "query that may see no key. The check tries right padding, left padding and one token.",
          points=4)
def masked_attention(student: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> str:
    generator = seeded(6)
    for shape, d_v, real_rows, padded in MASKED_CASES:
        q, k = (torch.randn(*shape, generator=generator, dtype=torch.float64) for _ in range(2))
        v = torch.randn(*shape[:-1], d_v, generator=generator, dtype=torch.float64)
        real = torch.tensor(real_rows, dtype=torch.bool)
        what = f"q, k {shape}, v {tuple(v.shape)}, {padded}"
        got = student(q.clone(), k.clone(), v.clone(), real.clone())
        if not isinstance(got, tuple) or len(got) != 2:
            raise ExerciseFailed(f"for {what} you returned a {type(got).__name__}, not a pair.",
                                 fix="return output, weights.")
        n = shape[-2]
        mask = reference.causal_mask(n) & real[:, None, None, :]
        want_out, want_w = reference.scaled_dot_product_attention(q, k, v, mask=mask)
        out, weights = got
        if isinstance(weights, Tensor) and weights.shape == want_w.shape and weights.is_floating_point():
            weights = weights.double()
            empty = ~mask.any(dim=-1).expand(want_w.shape[:-1])  # queries that may see no key
            seen = ~empty
            if not torch.allclose(weights[seen], want_w[seen]):
                slips = {slip: (fix, masked_attention_variant(q, k, v, real, **knobs)[1])
                         for slip, (fix, knobs) in MASK_SLIPS.items()}
                # A row a slip masks entirely is NaN there: compare the rows it leaves a number in.
                for slip, (fix, wrong) in slips.items():
                    rows = seen & ~wrong.isnan().any(dim=-1)
                    if rows.any() and torch.allclose(weights[rows], wrong[rows]):
                        raise ExerciseFailed(f"for {what} your attention {slip}.", fix=fix)
            else:
                _explain_empty_rows(weights, empty, what)
        expect_close(got[1], want_w, f"the weights for {what}")
        expect_close(out, want_out, f"the output for {what}")
    return "No token reads the future or a pad, and a query with nothing to see gets nothing."


# --- core exercise 2: the sparse patterns as one mask --------------------------------------------

def sparse_variant(n: int, window: int | None = None, stride: int | None = None, global_tokens: tuple = (),
                   causal: bool = False, *, slip: str = "") -> Tensor:
    """The pattern mask, right by default, or with one of the usual slips (to name it)."""
    position = torch.arange(n)
    offset = position[:, None] - position[None, :]  # i - j
    mask = torch.zeros(n, n, dtype=torch.bool)
    if window is not None:
        mask |= (offset.abs() < window) if slip == "short window" else (offset.abs() <= window)
    if stride is not None:
        mask |= (position[None, :] % stride == 0).expand(n, n) if slip == "stride from 0" else (offset % stride == 0)
    chosen = torch.zeros(n, dtype=torch.bool)
    chosen[list(global_tokens)] = True
    if slip == "global rows only":
        mask |= chosen[:, None].expand(n, n)
    elif slip == "global columns only":
        mask |= chosen[None, :].expand(n, n)
    elif slip != "global after causal":
        mask |= chosen[:, None] | chosen[None, :]
    if causal and slip != "two-sided":
        mask &= offset >= 0
    if slip == "global after causal":
        mask |= chosen[:, None] | chosen[None, :]
    return mask


SPARSE_SLIPS = {  # slip: (what is wrong, how to fix it)
    "two-sided": ("lets a query see later keys although causal=True.",
                  "with causal=True keep only the keys at or before the query."),
    "global after causal": ("lets a global token see later keys although causal=True: the causal cut came "
                            "before the global part.",
                            "apply causal last, to the whole union, global part included."),
    "short window": ("lets each query see only window - 1 keys on either side.",
                     "the window counts the keys on either side: offsets -window ... window are visible."),
    "stride from 0": ("keeps the keys at multiples of the stride counted from position 0.",
                      "count from the query: key j is visible when i - j is a multiple of the stride."),
    "global rows only": ("lets a global token see everything, but no one sees it.",
                         "global tokens see every key and every query sees them: both the rows and the columns."),
    "global columns only": ("lets every query see a global token, but the global token itself sees only "
                            "its own pattern.",
                            "global tokens see every key and every query sees them: both the rows and the columns."),
}

def _course_sparse(n: int, window: int | None = None, stride: int | None = None, global_tokens: tuple = (),
                   causal: bool = False) -> Tensor:
    """The right mask, from the course's own pattern helpers."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    if window is not None:
        mask |= reference.local_mask(n, window, causal=False)
    if stride is not None:
        mask |= reference.strided_mask(n, stride, causal=False)
    if global_tokens:
        mask |= reference.global_mask(n, list(global_tokens))
    return mask & reference.causal_mask(n) if causal else mask


SPARSE_CASES = (  # keyword arguments of my_sparse_mask
    {"n": 8, "window": 2},
    {"n": 8, "window": 2, "causal": True},
    {"n": 9, "stride": 3},
    {"n": 9, "stride": 3, "causal": True},
    {"n": 7, "global_tokens": (0, 4)},
    {"n": 10, "window": 1, "global_tokens": (0,), "causal": True},
    {"n": 6, "window": 10, "causal": True},
    {"n": 12, "window": 1, "stride": 4, "global_tokens": (0,)},
)


@exercise(hint="Make the table of offsets, query position minus key position. Start from an all-False "
               "mask and add each part that was asked for: the offsets no larger than the window in "
               "size, the offsets that are multiples of the stride, and the rows and the columns of the "
               "global tokens. With causal, keep only the non-negative offsets, last.",
          task="Write sparse_mask(n, window=None, stride=None, global_tokens=(), causal=False) returning "
               "the boolean (n, n) union of the parts asked for. The check tries each part alone, with "
               "and without causal, and together.",
          points=3)
def sparse_mask(student: Callable[..., Tensor]) -> str:
    """The student's sparse_mask(n, window, stride, global_tokens, causal) -> bool (n, n)."""
    cases = SPARSE_CASES
    if hidden_round():  # every part at once on sizes drawn from the hidden seed, and a single token
        n, window, stride, first = (int(torch.randint(low, high, (), generator=seeded(51)))
                                    for low, high in ((11, 20), (1, 4), (2, 6), (1, 10)))
        cases = ({"n": n, "window": window, "stride": stride, "global_tokens": (first,), "causal": True},
                 {"n": 1, "window": 1, "global_tokens": (0,)}) + SPARSE_CASES
    for case in cases:
        got = student(case["n"], case.get("window"), case.get("stride"), case.get("global_tokens", ()),
                      case.get("causal", False))
        expected = _course_sparse(**case)
        what = "sparse_mask(" + ", ".join(f"{name}={value}" for name, value in case.items()) + ")"
        if isinstance(got, Tensor) and got.shape == expected.shape and got.dtype == torch.bool \
                and not torch.equal(got, expected):
            for slip, (wrong, fix) in SPARSE_SLIPS.items():
                if torch.equal(got, sparse_variant(**case, slip=slip)):
                    raise ExerciseFailed(f"{what} {wrong}", fix=fix)
        _expect_bool(got, expected, what)
    return "Every pattern of the DS 246 notes is now one call, and the cells below draw yours."
