"""Exercises of notebook 14 (serving the model): the top-p rule, the block-table lookup, the
speculative round's accept/reject step, int8 per channel and int4 per group quantization."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from helpers.lab.exercises import (
    ExerciseFailed,
    exercise,
    expect_close,
    hidden_round,
    reseed,
    seeded,
)
from helpers.serve.paged import lookup
from helpers.serve.quantize import quantize_int4, quantize_int8, unpack_int4
from helpers.serve.sampling import top_p_filter
from helpers.serve.speculative import residual


def helper_top_p(logits: Tensor, p: float) -> Tensor:
    """helpers.serve.sampling.top_p_filter for one row: logits (V,) -> (V,), -inf outside the nucleus."""
    return top_p_filter(logits, p)[0].to(logits.dtype)


@exercise(hint="Rank the tokens from most to least likely; a token stays when the tokens ranked "
               "above it hold less than top_p of the probability, so the most likely one always "
               "stays. Every other token's logit becomes minus infinity.",
          task="Write my_top_p(logits, p) -> logits of the same shape, -inf for the tokens "
               "left out. The check compares the kept tokens with the helpers' top-p rule on "
               "four cases, ties and p = 1 included.")
def top_p(student: Callable[[Tensor, float], Tensor]) -> str:
    cases = [(torch.tensor([0.5, 0.3, 0.15, 0.05]).log(), 0.75),
             (torch.tensor([0.1, 0.6, 0.3]).log(), 0.6),  # the most likely alone reaches p
             (torch.tensor([2.0, -1.0, 0.5, 0.5, 3.0]), 0.9),
             (torch.tensor([1.0, 1.0, 1.0]), 1.0)]
    if hidden_round():  # float64 logits and a top_p drawn from the hidden seed: the dtype is kept
        cases.insert(0, (3 * torch.randn(12, generator=seeded(68), dtype=torch.float64),
                         round(0.3 + 0.6 * float(torch.rand((), generator=seeded(69))), 3)))
    for logits, p in cases:
        got = student(logits.clone(), p)
        expected = helper_top_p(logits, p)
        if not isinstance(got, Tensor) or got.shape != logits.shape:
            raise ExerciseFailed(f"you return {getattr(got, 'shape', got)!r}, expected logits of shape "
                                 f"{tuple(logits.shape)}.",
                                 fix="return the logits themselves, the same shape as the input, with "
                                     "minus infinity for the tokens left out.")
        kept, should = torch.isfinite(got), torch.isfinite(expected)
        if kept.all() and not should.all() and (got >= 0).all() and abs(float(got.sum()) - 1) < 1e-5:
            raise ExerciseFailed("you return probabilities, not logits.",
                                 fix="return the input logits unchanged for the kept tokens and minus "
                                     "infinity for the others: the sampler applies the softmax later.")
        if not torch.equal(kept, should):
            probs = torch.softmax(logits, 0)
            fix = ("keep a token when the mass ranked above it is below top_p, not when the mass up to "
                   "and including it is: the token that crosses top_p belongs to the nucleus."
                   if kept.sum() < should.sum() else
                   "rank the tokens by probability, most likely first, and stop once the kept mass "
                   "reaches top_p.")
            raise ExerciseFailed(f"with probabilities {[round(x, 3) for x in probs.tolist()]} and "
                                 f"top_p = {p}, the nucleus is tokens {should.nonzero().flatten().tolist()}; "
                                 f"you keep {kept.nonzero().flatten().tolist()}.", fix=fix)
        expect_close(got[kept], logits[kept], "the kept logits (leave them unchanged)")
    return "Right: the nucleus adapts its size to how sure the model is."


@exercise(hint="The position divided by the block size (rounded down) is the sequence's logical "
               "block, which the table turns into a block of the pool; the remainder is the slot.",
          task="Write my_lookup(block_table, position, block_size) -> (block, slot). The check "
               "compares it with the paged cache's lookup on six tables and positions.")
def block_lookup(student: Callable[[list[int], int, int], tuple[int, int]]) -> str:
    cases = (([7, 2, 9], 0, 4), ([7, 2, 9], 5, 4), ([7, 2, 9], 11, 4),
             ([3], 0, 1), ([5, 0, 1, 4], 9, 3), ([8, 6], 15, 8))
    if hidden_round():  # a block table, a block size and a position drawn from the hidden seed
        table, size = torch.randperm(20, generator=seeded(66))[:6].tolist(), 5
        cases = ((table, int(torch.randint(6, 30, (), generator=seeded(67))), size),) + cases
    for table, position, size in cases:
        got = student(list(table), position, size)
        expected = lookup(table, position, size)
        if not isinstance(got, (tuple, list)) or tuple(got) != expected:
            logical = isinstance(got, (tuple, list)) and len(got) == 2 and got[0] == position // size \
                and got[0] != expected[0]
            what = " (that is the logical block index, not the pool's block)" if logical else ""
            fix = ("read the logical block's entry in the block table: that is the block of the pool."
                   if logical else "the logical block is the position divided by the block size, "
                   "rounded down, looked up in the table; the slot is the remainder of that division.")
            raise ExerciseFailed(f"token {position} with block table {table} and block_size {size} "
                                 f"lives at (block, slot) = {expected}, got {got!r}{what}.", fix=fix)
    return "Right: one division and one table read find any token, wherever its block landed."


def round_distribution(p: Tensor, q: Tensor, drafted: list[int], accept=None, fix=None,
                       bonus_row: int | str | None = None) -> dict[tuple[int, ...], float]:
    """P(a round emits each output), exactly: by default the true rule, min(1, p/q), the
    residual, the bonus from p[k]; `accept(p_i, q_i, x)`, `fix(p_i, q_i)` and `bonus_row` swap
    in a slip."""
    accept = accept or (lambda pi, qi, x: min(1.0, float(pi[x] / qi[x])))
    fix = fix or residual
    out: dict[tuple[int, ...], float] = {}
    reach = 1.0                                            # P(every earlier drafted token kept)
    for i, x in enumerate(drafted):
        keep = accept(p[i], q[i], x)
        for y, r in enumerate(fix(p[i], q[i]).tolist()):
            if r > 0:
                key = tuple(drafted[:i]) + (y,)
                out[key] = out.get(key, 0.0) + reach * (1 - keep) * r
        reach *= keep
    if bonus_row == "none":                                # the slip: no bonus token at all
        out[tuple(drafted)] = out.get(tuple(drafted), 0.0) + reach
        return out
    for y, b in enumerate(p[len(drafted) if bonus_row is None else bonus_row].tolist()):
        if b > 0:
            key = tuple(drafted) + (y,)
            out[key] = out.get(key, 0.0) + reach * b
    return out


# (what is wrong, how to fix it, the slip as arguments of round_distribution)
ROUND_SLIPS = [
    ("after a rejection you drew from p (p alone gives the tokens the draft already proposed a "
     "second chance)", "draw the replacement from the residual max(0, p - q), normalised to sum to 1.",
     dict(fix=lambda pi, qi: pi)),
    ("your acceptance is min(1, q/p)", "the ratio is the target's probability over the draft's, p/q.",
     dict(accept=lambda pi, qi, x: min(1.0, float(qi[x] / pi[x])) if pi[x] > 0 else 1.0)),
    ("you keep a token when u >= min(1, p/q)", "keep it when u < min(1, p/q): a uniform draw "
     "below the acceptance probability happens with exactly that probability.",
     dict(accept=lambda pi, qi, x: 1 - min(1.0, float(pi[x] / qi[x])))),
    ("your acceptance is p(x) alone", "it is min(1, p(x) / q(x)), the target's probability over "
     "the draft's.", dict(accept=lambda pi, qi, x: float(pi[x]))),
    ("the bonus token comes from p[k - 1]", "after k kept tokens it is drawn from the target's "
     "distribution after all of them, the last row p[k].", dict(bonus_row=-2)),
    ("when all k drafted tokens are kept the round ends without the bonus token",
     "draw one more token from the target's last distribution p[k].", dict(bonus_row="none")),
]
ROUND_SAMPLES = 4000


def _emitted(student: Callable, p: Tensor, q: Tensor, drafted: list[int], generator,
             all_kept: bool = False) -> tuple[int, ...]:
    """One call of the student's round, checked for its shape: the kept drafted tokens, then one.
    all_kept: p == q, so every drafted token must be kept (and the output can't be just them)."""
    try:
        got = student(p.clone(), q.clone(), list(drafted), generator)
    except RuntimeError as error:
        if "probability tensor" in str(error) or "invalid multinomial" in str(error):
            raise ExerciseFailed("torch.multinomial refused your residual: it has negative entries "
                                 "or is all zeros.",
                                 fix="p - q sums to 0, so clamp it at 0, max(0, p - q), before dividing "
                                     "by its sum (and where p = q no token is ever rejected, so no "
                                     "residual is needed).") from error
        raise
    if not isinstance(got, (list, tuple)) or not all(isinstance(t, int | Tensor) for t in got):
        raise ExerciseFailed(f"your round returned {got!r}, not a list of token ids.",
                             fix="return the round's tokens as a list of ints.")
    got = tuple(int(t) for t in got)
    k = len(drafted)
    if all_kept and got == tuple(drafted):
        raise ExerciseFailed("all k drafted tokens were kept and the round ended there.",
                             fix="add the bonus token, drawn from the target's last distribution p[k].")
    if not 1 <= len(got) <= k + 1 or got[:-1] != tuple(drafted[:len(got) - 1]):
        raise ExerciseFailed(f"for drafted tokens {drafted} you returned {list(got)}.",
                             fix="a round emits the drafted tokens it kept, in order, then exactly one "
                                 "more token (a residual draw at the first rejection, which ends the "
                                 "round, or the bonus).")
    return got


def _distance(counts: dict, exact: dict, n: int) -> float:
    return 0.5 * sum(abs(counts.get(key, 0) / n - exact.get(key, 0.0)) for key in set(counts) | set(exact))


@exercise(hint="Walk through the drafted tokens in order: keep each with probability the smaller of "
               "1 and the target's probability over the draft's, by comparing a uniform draw with "
               "it; at the first rejection draw the replacement from the part of the target's "
               "distribution above the draft's, normalised, and stop; if all are kept, draw one "
               "more token from the target's last row.",
          points=3,
          task="Write my_accept_or_reject(p, q, drafted, generator) -> the round's tokens (a list "
               "of ints). The check runs it on cases where every token must be kept or rejected, "
               "then samples it 4,000 times (fixed seed) against the exact output distribution.")
def accept_or_reject(student: Callable[[Tensor, Tensor, list[int], torch.Generator], list[int]]) -> str:
    generator = seeded(0)
    with torch.random.fork_rng():
        reseed(0)
        # First the distribution: every slip of ROUND_SLIPS lies at least 0.24 (total variation)
        # from the right rule here, 4,000 right rounds stay within 0.05 of it.
        p = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.5, 0.4], [0.7, 0.2, 0.1]], dtype=torch.float64)
        q = torch.tensor([[0.2, 0.6, 0.2], [0.2, 0.3, 0.5]], dtype=torch.float64)
        drafted = [1, 2]
        counts: dict[tuple[int, ...], int] = {}
        for _ in range(ROUND_SAMPLES):
            got = _emitted(student, p, q, drafted, generator)
            counts[got] = counts.get(got, 0) + 1
        gap = _distance(counts, round_distribution(p, q, drafted), ROUND_SAMPLES)
        if gap > 0.05:
            named = [(_distance(counts, round_distribution(p, q, drafted, **change), ROUND_SAMPLES), what, fix)
                     for what, fix, change in ROUND_SLIPS]
            near, what, fix = min(named, key=lambda item: item[0])
            if near < 0.05:
                raise ExerciseFailed(f"{what} (your outputs' frequencies, 4,000 rounds, are {near:.3f} "
                                     f"from that rule's distribution and {gap:.3f} from the right one).",
                                     fix=fix)
            raise ExerciseFailed(f"over 4,000 rounds your outputs are {gap:.3f} (total variation) from "
                                 "the exact distribution of speculative decoding; 4,000 right draws "
                                 "stay within 0.05.")
        # Then the edges, where the rule is certain.
        same = torch.softmax(torch.randn(4, 5, generator=generator, dtype=torch.float64), -1)
        for _ in range(20):                               # p == q: nothing is ever rejected
            got = _emitted(student, same, same[:3], [1, 4, 0], generator, all_kept=True)
            if len(got) != 4:
                raise ExerciseFailed(f"with p = q every drafted token is kept, then comes the bonus: 4 "
                                     f"tokens for k = 3; you returned {list(got)}.",
                                     fix="where p = q the acceptance min(1, p/q) is 1: no uniform draw "
                                         "can reject the token.")
        p0 = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4], dtype=torch.float64)
        q0 = torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.float64)
        for _ in range(20):                               # p(0) = 0: token 0 is always rejected
            got = _emitted(student, p0, q0, [0], generator)
            if got == (1,):                                # token 1: p = q = 0.5, residual 0
                what, fix, _ = ROUND_SLIPS[0]
                raise ExerciseFailed(f"{what} (drafted token 0 is always rejected here, and you "
                                     "replaced it by token 1, where p = q).", fix=fix)
            if got != (2,):
                raise ExerciseFailed(f"drafted token 0 has p = 0 and q = 0.5, so it is always rejected "
                                     f"and the residual puts all its mass on token 2; you returned "
                                     f"{list(got)}.", fix="compare a uniform draw with min(1, p/q) "
                                     "(here 0) and draw the replacement from max(0, p - q), normalised.")
    return "Right: keep what the draft under-proposed, redraw from what it missed, and a bonus when all pass."


@exercise(hint="One scale per row, so that the row's largest absolute weight maps to 127; divide "
               "by it, round to the nearest integer and store as 8-bit integers.",
          task="Write my_quantize_int8(w) -> (q, scale): q int8 of w's shape, one scale per row. "
               "The check compares both with the helpers' int8 quantizer on a matrix with one "
               "row far larger than the others.")
def quantize_int8_rows(student: Callable[[Tensor], tuple[Tensor, Tensor]]) -> str:
    w = torch.randn(6, 16, generator=seeded(0))
    w[2] *= 50  # one row far larger: a single scale for the matrix would crush the others
    got = student(w.clone())
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise ExerciseFailed(f"you return a {type(got).__name__}, not the pair (q, scale).",
                             fix="return the integers and the scales together, integers first.")
    q, scale = got
    if not isinstance(q, Tensor) or q.dtype != torch.int8:
        raise ExerciseFailed(f"q should be a torch.int8 tensor, got {getattr(q, 'dtype', type(q))}.",
                             fix="convert the rounded values to 8-bit integers at the end.")
    expected_q, expected_scale = quantize_int8(w)
    if not isinstance(scale, Tensor) or scale.numel() != 6:
        raise ExerciseFailed(f"scale has {getattr(scale, 'numel', lambda: '?')()} numbers for a "
                             "matrix of 6 rows.",
                             fix="take one scale per row (output channel), from that row's largest "
                                 "absolute weight: shape (6,).")
    expect_close(scale.flatten().float(), expected_scale, "scale", atol=1e-7)
    if (q.int() - expected_q.int()).abs().max() > 0:
        truncated = (w / expected_scale[:, None]).to(torch.int8)
        what = "q is truncated towards zero, not rounded" if torch.equal(q, truncated) else \
            "q differs from w divided by its row's scale, rounded"
        raise ExerciseFailed(f"{what}.", fix="round to the nearest integer before converting: the "
                             "conversion to int8 alone cuts the fraction off.")
    return "Right: each output channel gets its own step, so a large row cannot crush the others."


def _int4_weight() -> Tensor:
    """(3, 16) weights in groups of 8 with the cases a group quantizer must handle: mixed signs,
    all positive (0 must stay representable), all zero (scale 0), all negative."""
    g = seeded(0)
    w = torch.randn(3, 16, generator=g)
    w[0, 8:] = w[0, 8:].abs() + 0.5
    w[1, :8] = 0.0
    w[2, 8:] = -(w[2, 8:].abs() + 0.25)
    return w


def _int4_values(w: Tensor, group_size: int, include_zero: bool = True, levels: int = 15,
                 rounding: bool = True, strided: bool = False, from_bottom: bool = False,
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """q (out, in) in 0 ... 15 before packing, scale and zero; the helper's rule by default.
    The slips: strided groups (every n_groups-th weight; its q is not returned in the row's order)
    and each weight's steps counted from the group's minimum, rounded as a whole."""
    out, n_in = w.shape
    groups = w.reshape(out, n_in // group_size, group_size)
    if strided:
        groups = w.reshape(out, group_size, n_in // group_size).transpose(1, 2)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    if include_zero:
        low, high = low.clamp(max=0), high.clamp(min=0)
    scale = (high - low) / levels
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.round(-low / scale).clamp(0, 15)
    scaled = groups / scale[..., None]
    scaled = torch.round(scaled) if rounding else scaled.trunc()
    q = (scaled + zero[..., None]).clamp(0, 15).to(torch.uint8)
    if from_bottom:
        q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    return q.reshape(out, n_in), scale, zero


@exercise(hint="Cut every row into groups of consecutive weights; each group's range, stretched to "
               "include zero, is split into 15 steps, the zero point is where zero lands (rounded), "
               "each weight becomes its own rounded number of steps plus the zero point, and two "
               "4-bit values share a byte, the even one in the low half.",
          task="Write my_quantize_int4(w, group_size) -> (packed, scale, zero): packed uint8 (out, "
               "in / 2), scale and zero (out, in / group_size). The check compares them with the "
               "helpers' int4 quantizer on groups of mixed signs, all positive, all negative and "
               "all zero.",
          points=3)
def quantize_int4_groups(student: Callable[[Tensor, int], tuple[Tensor, Tensor, Tensor]]) -> str:
    w = _int4_weight()
    got = student(w.clone(), 8)
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise ExerciseFailed(f"you return a {type(got).__name__}, not (packed, scale, zero).",
                             fix="return the packed bytes, the scales and the zero points, in that order.")
    packed, scale, zero = got
    want_packed, want_scale, want_zero = quantize_int4(w, group_size=8)
    for name, mine in (("packed", packed), ("scale", scale), ("zero", zero)):
        if not isinstance(mine, Tensor):
            raise ExerciseFailed(f"{name} is a {type(mine).__name__}, expected a tensor.",
                                 fix="compute every part with torch operations on the weight.")
    if tuple(scale.shape) != (3, 2) or tuple(zero.shape) != (3, 2):
        raise ExerciseFailed(f"for 3 rows of 16 weights in groups of 8, scale and zero are (3, 2); "
                             f"yours are {tuple(scale.shape)} and {tuple(zero.shape)}.",
                             fix="reshape each row into its groups and take one scale and one zero "
                                 "point per group, not per row or per matrix.")
    if not torch.isfinite(scale.double()).all() or (scale == 0).any():
        raise ExerciseFailed("a group of zeros gets a scale of 0 (or nan) from your code.",
                             fix="where a group's range is 0, use a scale of 1 instead: every weight "
                                 "of it is then the zero point exactly.")
    for slip, what, fix in ((dict(include_zero=False), "each group's range does not include 0, so 0 "
                             "is not exactly representable", "stretch the group's minimum down to 0 "
                             "and its maximum up to 0 when they do not reach it."),
                            (dict(levels=16), "the scale divides the range into 16 steps",
                             "4 bits give 16 values, 0 to 15: 15 steps between the lowest and the highest."),
                            (dict(strided=True), "your groups are strided: a group took every second "
                             "weight of its row, but a group is 8 consecutive weights (0 to 7, then 8 to 15)",
                             "cut each row into runs of neighbouring weights: the group axis first, the "
                             "weights within a group second.")):
        _, wrong_scale, _ = _int4_values(w, 8, **slip)
        if torch.allclose(scale.double(), wrong_scale.double(), rtol=1e-6, atol=0) and \
                not torch.allclose(scale.double(), want_scale.double(), rtol=1e-6, atol=0):
            raise ExerciseFailed(f"{what}.", fix=fix)
    expect_close(scale.double(), want_scale.double(), "scale", atol=1e-7)
    if not torch.equal(zero.double(), want_zero.double()):
        raise ExerciseFailed(f"the zero points are {zero.tolist()}, expected {want_zero.tolist()}.",
                             fix="the zero point is minus the group's (stretched) minimum over the "
                                 "scale, rounded to the nearest integer.")
    if packed.dtype != torch.uint8:
        raise ExerciseFailed(f"packed is {packed.dtype}, expected torch.uint8.",
                             fix="convert the 4-bit values to unsigned 8-bit integers before packing.")
    if tuple(packed.shape) != (3, 8):
        raise ExerciseFailed(f"packed has shape {tuple(packed.shape)}, expected (3, 8): two 4-bit "
                             "values per byte.", fix="pack each pair of neighbouring values of a row "
                             "into one byte, the even one in the low 4 bits.")
    mine = unpack_int4(packed)
    right, _, _ = _int4_values(w, 8)
    if torch.equal(mine, right):
        return "Right: 4 bits a weight, plus a scale and a zero point per group."
    if torch.equal(torch.stack([packed >> 4, packed & 0x0F], -1).flatten(-2), right):
        raise ExerciseFailed("the two values of each byte are swapped.",
                             fix="value 2j goes in the low 4 bits of byte j, value 2j + 1 in the high 4 bits.")
    truncated, _, _ = _int4_values(w, 8, rounding=False)
    if torch.equal(mine, truncated):
        raise ExerciseFailed("the values are truncated towards zero, not rounded.",
                             fix="round each weight over the scale to the nearest integer before "
                                 "adding the zero point.")
    from_bottom, _, _ = _int4_values(w, 8, from_bottom=True)
    if torch.equal(mine, from_bottom):
        raise ExerciseFailed("you rounded each weight's distance from the group's minimum as a whole: "
                             "the zero point is already rounded, so 0 no longer lands exactly on it.",
                             fix="round the weight over the scale on its own, then add the (rounded) "
                                 "zero point.")
    wrong = (mine != right).sum().item()
    raise ExerciseFailed(f"{wrong} of the 48 values differ from the helper's after unpacking.",
                         fix="each value is the weight over its group's scale, rounded, plus the zero "
                             "point, kept within 0 to 15.")
