"""Exercises of notebook 14 (serving the model): the top-p rule, the block-table lookup, the
speculative round's accept/reject step, and int8 quantize/dequantize."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close
from helpers.serve.paged import lookup
from helpers.serve.quantize import quantize_int8
from helpers.serve.sampling import top_p_filter
from helpers.serve.speculative import residual


@exercise(hint="Sort the probabilities from most to least likely; a token stays when the tokens "
               "ranked above it hold less than top_p of the mass. Set the others to -inf.",
          task="Write my_top_p(logits, p) -> logits of the same shape, -inf for the tokens "
               "left out. The check compares the kept tokens with the helpers' top-p rule on "
               "four cases, ties and p = 1 included.")
def top_p(student: Callable[[Tensor, float], Tensor]) -> str:
    cases = [(torch.tensor([0.5, 0.3, 0.15, 0.05]).log(), 0.75),
             (torch.tensor([0.1, 0.6, 0.3]).log(), 0.6),  # the most likely alone reaches p
             (torch.tensor([2.0, -1.0, 0.5, 0.5, 3.0]), 0.9),
             (torch.tensor([1.0, 1.0, 1.0]), 1.0)]
    for logits, p in cases:
        got = student(logits.clone(), p)
        expected = top_p_filter(logits, p)[0].to(logits.dtype)
        if not isinstance(got, Tensor) or got.shape != logits.shape:
            raise ExerciseFailed(f"return logits of shape {tuple(logits.shape)}, with -inf for "
                                 f"the tokens left out; got {getattr(got, 'shape', got)!r}.")
        kept, should = torch.isfinite(got), torch.isfinite(expected)
        if not torch.equal(kept, should):
            probs = torch.softmax(logits, 0)
            raise ExerciseFailed(f"with probabilities {[round(x, 3) for x in probs.tolist()]} and "
                                 f"top_p = {p}, keep tokens {should.nonzero().flatten().tolist()}, "
                                 f"not {kept.nonzero().flatten().tolist()}: the smallest set of "
                                 "most likely tokens whose mass reaches top_p.")
        expect_close(got[kept], logits[kept], "the kept logits (leave them unchanged)")
    return "Right: the nucleus adapts its size to how sure the model is."


@exercise(hint="The block is block_table[position // block_size]; the slot within it is "
               "position % block_size.",
          task="Write my_lookup(block_table, position, block_size) -> (block, slot). The check "
               "compares it with the paged cache's lookup on six tables and positions.")
def block_lookup(student: Callable[[list[int], int, int], tuple[int, int]]) -> str:
    for table, position, size in (([7, 2, 9], 0, 4), ([7, 2, 9], 5, 4), ([7, 2, 9], 11, 4),
                                  ([3], 0, 1), ([5, 0, 1, 4], 9, 3), ([8, 6], 15, 8)):
        got = student(list(table), position, size)
        expected = lookup(table, position, size)
        if not isinstance(got, (tuple, list)) or tuple(got) != expected:
            hint = " (that is a logical block index: look it up in the table)" \
                if isinstance(got, (tuple, list)) and len(got) == 2 and got[0] == position // size \
                and got[0] != expected[0] else ""
            raise ExerciseFailed(f"token {position} with block table {table} and block_size {size} "
                                 f"lives at (block, slot) = {expected}, got {got!r}{hint}.")
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


ROUND_SLIPS = {
    "after a rejection you drew from p: draw from the residual max(0, p - q), normalised (p "
    "alone gives the tokens the draft already proposed a second chance)": dict(fix=lambda pi, qi: pi),
    "your acceptance is min(1, q/p): the ratio is the target's over the draft's, p/q":
        dict(accept=lambda pi, qi, x: min(1.0, float(qi[x] / pi[x])) if pi[x] > 0 else 1.0),
    "you keep a token when u >= min(1, p/q): keep it when u < min(1, p/q)":
        dict(accept=lambda pi, qi, x: 1 - min(1.0, float(pi[x] / qi[x]))),
    "your acceptance is p(x) alone: it is min(1, p(x) / q(x)), the target's probability over "
    "the draft's": dict(accept=lambda pi, qi, x: float(pi[x])),
    "the bonus token comes from p[k - 1]: after k kept tokens it is drawn from the target's "
    "distribution after all of them, p[k]": dict(bonus_row=-2),
    "when all k drafted tokens are kept the round ends without the bonus token: draw one more "
    "from the target's last distribution p[k]": dict(bonus_row="none"),
}
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
                                 "or is all zeros. p - q sums to 0, so clamp it at 0, max(0, p - q), "
                                 "before dividing by its sum (and where p = q no token is ever "
                                 "rejected, so no residual is needed).") from error
        raise
    if not isinstance(got, (list, tuple)) or not all(isinstance(t, int | Tensor) for t in got):
        raise ExerciseFailed(f"return the round's tokens as a list of ints, got {got!r}.")
    got = tuple(int(t) for t in got)
    k = len(drafted)
    if all_kept and got == tuple(drafted):
        raise ExerciseFailed("all k drafted tokens were kept and the round ended there: add the "
                             "bonus token, drawn from the target's last distribution p[k].")
    if not 1 <= len(got) <= k + 1 or got[:-1] != tuple(drafted[:len(got) - 1]):
        raise ExerciseFailed(f"for drafted tokens {drafted} you returned {list(got)}: a round emits "
                             "the drafted tokens it kept, in order, then exactly one more token (a "
                             "residual draw at the first rejection, which ends the round, or the bonus).")
    return got


def _distance(counts: dict, exact: dict, n: int) -> float:
    return 0.5 * sum(abs(counts.get(key, 0) / n - exact.get(key, 0.0)) for key in set(counts) | set(exact))


@exercise(hint="Walk through the drafted tokens: keep each with probability min(1, p/q) (compare "
               "a uniform draw with it); at the first rejection draw the replacement from "
               "max(0, p - q) normalised and stop; if all are kept, draw one more from p[k].",
          task="Write my_accept_or_reject(p, q, drafted, generator) -> the round's tokens (a list "
               "of ints). The check runs it on cases where every token must be kept or rejected, "
               "then samples it 4,000 times (fixed seed) against the exact output distribution.")
def accept_or_reject(student: Callable[[Tensor, Tensor, list[int], torch.Generator], list[int]]) -> str:
    generator = torch.Generator().manual_seed(0)
    with torch.random.fork_rng():
        torch.manual_seed(0)
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
            named = {slip: _distance(counts, round_distribution(p, q, drafted, **change), ROUND_SAMPLES)
                     for slip, change in ROUND_SLIPS.items()}
            slip, near = min(named.items(), key=lambda item: item[1])
            if near < 0.05:
                raise ExerciseFailed(f"{slip} (your outputs' frequencies, 4,000 rounds, are {near:.3f} "
                                     f"from that rule's distribution and {gap:.3f} from the right one).")
            raise ExerciseFailed(f"over 4,000 rounds your outputs are {gap:.3f} (total variation) from "
                                 "the exact distribution of speculative decoding; 4,000 right draws "
                                 "stay within 0.05.")
        # Then the edges, where the rule is certain.
        same = torch.softmax(torch.randn(4, 5, generator=generator, dtype=torch.float64), -1)
        for _ in range(20):                               # p == q: nothing is ever rejected
            got = _emitted(student, same, same[:3], [1, 4, 0], generator, all_kept=True)
            if len(got) != 4:
                raise ExerciseFailed(f"with p = q every drafted token is kept (min(1, p/q) = 1), "
                                     f"then comes the bonus: 4 tokens for k = 3; you returned {list(got)}.")
        p0 = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4], dtype=torch.float64)
        q0 = torch.tensor([[0.5, 0.5, 0.0, 0.0]], dtype=torch.float64)
        for _ in range(20):                               # p(0) = 0: token 0 is always rejected
            got = _emitted(student, p0, q0, [0], generator)
            if got == (1,):                                # token 1: p = q = 0.5, residual 0
                raise ExerciseFailed(f"{next(iter(ROUND_SLIPS))} (drafted token 0 is always "
                                     "rejected here, and you replaced it by token 1, where p = q).")
            if got != (2,):
                raise ExerciseFailed(f"drafted token 0 has p = 0 and q = 0.5, so it is always rejected "
                                     f"and the residual max(0, p - q) puts all its mass on token 2; "
                                     f"you returned {list(got)}.")
    return "Right: keep what the draft under-proposed, redraw from what it missed, and a bonus when all pass."


@exercise(hint="scale = each row's largest |w| / 127; q = round(w / scale) as torch.int8.",
          task="Write my_quantize_int8(w) -> (q, scale): q int8 of w's shape, one scale per row. "
               "The check compares both with the helpers' int8 quantizer on a matrix with one "
               "row far larger than the others.")
def quantize_int8_rows(student: Callable[[Tensor], tuple[Tensor, Tensor]]) -> str:
    w = torch.randn(6, 16, generator=torch.Generator().manual_seed(0))
    w[2] *= 50  # one row far larger: a single scale for the matrix would crush the others
    got = student(w.clone())
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise ExerciseFailed(f"return (q, scale), got {type(got).__name__}.")
    q, scale = got
    if not isinstance(q, Tensor) or q.dtype != torch.int8:
        raise ExerciseFailed(f"q should be a torch.int8 tensor, got {getattr(q, 'dtype', type(q))}.")
    expected_q, expected_scale = quantize_int8(w)
    if not isinstance(scale, Tensor) or scale.numel() != 6:
        raise ExerciseFailed("scale should hold one number per row (output channel): shape (6,).")
    expect_close(scale.flatten().float(), expected_scale, "scale", atol=1e-7)
    if (q.int() - expected_q.int()).abs().max() > 0:
        raise ExerciseFailed("q differs from round(w / scale): round to the nearest integer, do "
                             "not truncate with .to(torch.int8) alone.")
    return "Right: each output channel gets its own step, so a large row cannot crush the others."
