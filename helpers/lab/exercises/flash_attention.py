"""Exercises of notebook 8 (tiled FlashAttention): merge two softmax states; Algorithm 1 of the
FlashAttention paper (core); write one tile step; write the backward pass tile by tile (core)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from helpers.flash import tiled as reference
from helpers.lab.exercises import SOFTMAX_CALLS, ExerciseFailed, exercise, expect_close, seeded
from helpers.lab.exercises.watch import TensorLog
from helpers.model.attention import scaled_dot_product_attention

INF = math.inf


def _pair(result: object, what: str, names: str) -> tuple:
    if not isinstance(result, tuple) or len(result) != len(names.split(", ")):
        raise ExerciseFailed(f"for {what} you returned a {type(result).__name__}, not a tuple "
                             f"({names}).", fix=f"end the function by returning the {len(names.split(', '))} "
                             "values together, separated by commas.")
    return result


@exercise(hint="The merged max is the larger of the two maxima. Each sum was measured from its own "
               "max: move it to the merged max by multiplying with e to the power (its max minus "
               "the merged max), then add the two. The course's exp_shifted does that "
               "exponential without NaN when the merged max is minus infinity.",
          task="Write merge(max_a, sum_a, max_b, sum_b) returning the (max, sum) of both halves "
               "together. The check includes huge scores and fully masked halves.")
def merge_softmax_states(student: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> str:
    """student(max_a, sum_a, max_b, sum_b) -> (max, sum) must equal one pass over both halves."""
    gen = seeded(8)
    halves = {
        "two halves of ordinary scores": (torch.randn(4, 5, generator=gen, dtype=torch.float64),
                                          torch.randn(4, 3, generator=gen, dtype=torch.float64)),
        "scores of size 1000 (exp(1000) overflows)": (
            1000 * torch.randn(2, 4, generator=gen, dtype=torch.float64),
            1000 * torch.randn(2, 6, generator=gen, dtype=torch.float64)),
        "a fully masked half (every score -inf)": (
            torch.full((2, 3), -INF, dtype=torch.float64),
            torch.tensor([[0.5, -2.0], [1.5, 3.0]], dtype=torch.float64)),
        "two fully masked halves": (torch.full((1, 2), -INF, dtype=torch.float64),
                                    torch.full((1, 3), -INF, dtype=torch.float64)),
    }
    for what, (a, b) in halves.items():
        state_a, state_b = reference.softmax_state(a), reference.softmax_state(b)
        got = _pair(student(*state_a, *state_b), what, "max, sum")
        expected = reference.softmax_state(torch.cat([a, b], dim=-1))
        if isinstance(got[1], Tensor) and "1000" in what and not got[1].isfinite().all():
            raise ExerciseFailed(f"for {what} your sum contains NaN or inf: an exponential of a score "
                                 "or a max of about 1000 overflowed (e to the power 1000 is inf).",
                                 fix="never take e to the power of a max itself: multiply each sum by e "
                                     "to the power (its max minus the merged max), which is at most 1.")
        if isinstance(got[1], Tensor) and got[1].isnan().any():
            raise ExerciseFailed(f"for {what} your sum contains NaN, from e to the power (-inf "
                                 "minus -inf).", fix="where the merged max is minus infinity, shift "
                                 "by 0 instead (the course's exp_shifted does that).")
        if what.startswith("two halves") and isinstance(got[1], Tensor) and torch.allclose(
                got[1], state_a.row_sum + state_b.row_sum):
            raise ExerciseFailed("you added the two sums as they are, but each was measured from "
                                 "its own max.", fix="rescale both sums to the merged max first: "
                                 "multiply each by e to the power (its max minus the merged max).")
        expect_close(got[0], expected.row_max, f"the merged max for {what}")
        expect_close(got[1], expected.row_sum, f"the merged sum for {what}", atol=1e-9)
    return "Any number of blocks can now be folded in, in any order, with the same result."


def _step_close(mine: object, theirs: Tensor, name: str) -> None:
    """The state after a second tile whose scores are all higher than the first's."""
    try:
        expect_close(mine, theirs, f"{name} after a second tile whose scores are all higher", atol=1e-9)
    except ExerciseFailed as failure:
        raise ExerciseFailed(f"{failure} The old sum and accumulator were not moved to the new max.",
                             fix="the old sum and accumulator must be scaled by e to the power (old "
                             "max minus new max) before this tile's terms are added.") from None


Algorithm1 = Callable[[Tensor, Tensor, Tensor, int, int], Tensor]


def algorithm_1_variant(q: Tensor, k: Tensor, v: Tensor, block_r: int, block_c: int,
                        mistake: str = "") -> Tensor:
    """Algorithm 1 of FlashAttention for one head (q, k, v: (N, d) -> O (N, d)), right or with one
    named `mistake` (the checker compares a wrong answer with each)."""
    n, d = q.shape
    q = q if mistake == "no scale" else q / math.sqrt(d)
    out, ell = torch.zeros_like(q), torch.zeros(n, dtype=q.dtype)
    m = torch.full((n,), -INF, dtype=q.dtype)
    for j in range(0, n, block_c):
        k_j, v_j = k[j:j + block_c], v[j:j + block_c]
        for i in range(0, n, block_r):
            r = slice(i, i + block_r)
            s_ij = q[r] @ k_j.T
            m_tile = s_ij.amax(dim=1)
            p_tile = torch.exp(s_ij - m_tile[:, None])
            ell_tile = p_tile.sum(dim=1)
            if mistake == "one tile":  # every key tile replaces the output
                out[r], ell[r], m[r] = (p_tile @ v_j) / ell_tile[:, None], ell_tile, m_tile
                continue
            m_new = torch.maximum(m[r], m_tile)
            old, new = torch.exp(m[r] - m_new), torch.exp(m_tile - m_new)
            if mistake == "no rescale":
                old, new = torch.ones_like(old), torch.ones_like(new)
            if mistake == "old state kept":  # only the tile is moved to the new max
                old = torch.ones_like(old)
            ell_new = (ell[r] if mistake == "old sum kept" else old * ell[r]) + new * ell_tile
            kept = old if mistake == "not un-normalised" else ell[r] * old
            out[r] = (kept[:, None] * out[r] + new[:, None] * (p_tile @ v_j)) / ell_new[:, None]
            ell[r], m[r] = ell_new, m_new
    return out


ALGORITHM_1_MISTAKES = {  # mistake: (what is wrong, how to fix it)
    "no scale": ("your output is attention without the 1/sqrt(d) scaling of the scores.",
                 "divide Q (or every tile of scores) by the square root of d first; the paper's "
                 "listing leaves it out."),
    "not un-normalised": ("line 12 rescales the old output without multiplying it by its old sum "
                          "l_i: O_i is stored normalised, so it must be un-normalised first.",
                          "multiply the old O_i by l_i (and by e to the power (m_i minus the new "
                          "max)) before adding the new tile's contribution and dividing by the "
                          "new l."),
    "no rescale": ("the old and new statistics are added without moving them to the new max.",
                   "multiply the old sum and output by e to the power (old max minus new max), and "
                   "the tile's by e to the power (tile max minus new max)."),
    "old sum kept": ("the running sum l_i is not moved to the new max: it was measured from the old "
                     "max, so adding the tile's sum to it as it is mixes two scales.",
                     "multiply the old l_i by e to the power (old max minus new max) before adding "
                     "the tile's sum, as you do for the output."),
    "old state kept": ("the running sum and output are not moved to the new max: only the tile's "
                       "terms are, so the old ones keep the old max's scale.",
                       "multiply the old l_i and the old O_i by e to the power (old max minus new "
                       "max) before adding the tile's terms."),
    "one tile": ("each key tile replaces the output instead of merging into it: only the last key "
                 "tile counts.",
                 "keep the running max, sum and output of every query row across key tiles, and "
                 "merge each new tile into them (lines 11 to 13)."),
}


@exercise(hint="Follow the listing: key tiles in the outer loop, query tiles inside. For each pair, "
               "the tile's scores, their row max, exponentials and row sum; then the new running "
               "max and sum of the rows; then the output tile: the old one un-normalised and moved "
               "to the new max, plus this tile's exponentials times the value tile moved to the new "
               "max, all divided by the new sum.",
          task="Write algorithm_1(Q, K, V, block_r, block_c) for one head, Q, K, V of shape (N, d), "
               "returning O (N, d), following the listing's lines 5 to 13 without a softmax call. "
               "The check compares with naive attention for several tile sizes, ragged ones and "
               "huge scores included.",
          points=5,
          forbidden=(*SOFTMAX_CALLS, "torch.nn.functional.scaled_dot_product_attention"))
def algorithm_1(student: Algorithm1) -> str:
    """student(Q, K, V, block_r, block_c) -> O (N, d) must equal naive attention."""
    gen = seeded(81)
    q, k, v = (torch.randn(10, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    expected, _ = scaled_dot_product_attention(q, k, v)
    got = student(q.clone(), k.clone(), v.clone(), 4, 3)
    if isinstance(got, tuple):
        raise ExerciseFailed(f"you returned a tuple of {len(got)}, not the output O alone.",
                             fix="return only the output tensor O of shape (N, d).")
    if isinstance(got, Tensor) and got.shape == expected.shape and not torch.allclose(
            got, expected, atol=1e-12, rtol=0):
        for mistake, (message, fix) in ALGORITHM_1_MISTAKES.items():
            if torch.allclose(got, algorithm_1_variant(q, k, v, 4, 3, mistake), atol=1e-12, rtol=0):
                raise ExerciseFailed(message, fix=fix)
    expect_close(got, expected, "O with tiles of 4 queries and 3 keys (N = 10: ragged tiles)", atol=1e-12)
    for block_r, block_c in ((10, 10), (1, 7), (3, 16)):
        expect_close(student(q.clone(), k.clone(), v.clone(), block_r, block_c), expected,
                     f"O with B_r = {block_r}, B_c = {block_c}", atol=1e-12)
    huge = [60 * t for t in (q, k)]
    got = student(huge[0].clone(), huge[1].clone(), v.clone(), 4, 3)
    if isinstance(got, Tensor) and not got.isfinite().all():
        raise ExerciseFailed("with scores in the thousands your output holds inf or NaN: an "
                             "exponential overflowed.", fix="measure every exponential from a "
                             "maximum (the tile's, or the running one), so that no exponent is "
                             "above 0.")
    expect_close(got, scaled_dot_product_attention(*huge, v)[0], "O for scores in the thousands",
                 atol=1e-12)
    _never_whole(lambda q, k, v: lambda: student(q, k, v, 8, 8), "algorithm_1(Q, K, V, 8, 8)", "scores")
    return "Every output row was built from tiles, without the N x N matrix ever existing."


RULE_N = 64  # positions for the rule "never the whole N x N matrix": tiles of 8 are 1/64 of it


def _never_whole(prepare: Callable[[Tensor, Tensor, Tensor], Callable[[], object]], call: str,
                 what: str) -> None:
    """Fail unless the student's call that `prepare(q, k, v)` sets up, at N = RULE_N, makes no tensor
    of N * N numbers or more (what the checker prepares is not counted)."""
    q, k, v = (torch.randn(RULE_N, 4, generator=seeded(85 + i), dtype=torch.float64) for i in range(3))
    call_student = prepare(q, k, v)
    with TensorLog() as log:
        call_student()
    if log.largest >= RULE_N * RULE_N:
        shape = " x ".join(map(str, log.largest_shape))
        raise ExerciseFailed(f"{call} with N = {RULE_N} made a tensor of {shape} = {log.largest:,} "
                             f"numbers, as many as the whole N x N matrix of {what} ({RULE_N * RULE_N:,}): "
                             "the right values, but the very thing tiling exists to avoid.",
                             fix=f"compute the {what} one tile at a time, a block of queries against a "
                                 "block of keys, and keep only per-row statistics between tiles.")


StepFunction = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


def _run_with_step(student: StepFunction, q: Tensor, k: Tensor, v: Tensor, mask: Tensor,
                   block: int) -> Tensor:
    """Attention of one head computed query tile by query tile with the student's tile step."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    outputs = []
    for start in range(0, q.shape[0], block):
        rows = slice(start, start + block)
        state = reference.start_tile_state(q[rows], v.shape[-1])
        row_max, row_sum, acc = state
        for key_start in range(0, k.shape[0], block):
            cols = slice(key_start, key_start + block)
            scores = (q[rows] * scale) @ k[cols].T
            scores = scores.masked_fill(~mask[rows, cols], -INF)
            row_max, row_sum, acc = _pair(student(row_max, row_sum, acc, scores, v[cols]),
                                          "one tile step", "row_max, row_sum, acc")
        output, _ = reference.finish(reference.TileState(row_max, row_sum, acc))
        outputs.append(output)
    return torch.cat(outputs)


@exercise(hint="A tile may raise a row's max. What was accumulated so far (the sum and the "
               "accumulator) was measured from the old max: move it to the new max before adding "
               "this tile's part, itself measured from the new max. Use the course's exp_shifted "
               "for every exponential, so a fully masked row gives no NaN.",
          task="Write the tile step (row_max, row_sum, acc, scores, v_tile) -> new (row_max, "
               "row_sum, acc). The check runs a whole causal head with it, a ragged tile and a fully "
               "masked row included.")
def tile_step(student: StepFunction) -> str:
    """student(row_max, row_sum, acc, scores, v_tile) -> new (row_max, row_sum, acc), used for
    every tile of a 10-query, 10-key head (tiles of 4: the last one is ragged, one row is masked)."""
    gen = seeded(80)
    q, k, v = (torch.randn(10, 6, generator=gen, dtype=torch.float64) for _ in range(3))
    first = reference.start_tile_state(q[:4], 6)
    scores = (q[:4] @ k[:4].T) / math.sqrt(6)
    got = _pair(student(*first, scores.clone(), v[:4]), "the first tile", "row_max, row_sum, acc")
    expected = reference.tile_step(first, scores.clone(), v[:4])
    for name, mine, theirs in zip(("row_max", "row_sum", "acc"), got, expected, strict=True):
        expect_close(mine, theirs, f"{name} after the first tile", atol=1e-9)
    higher = (q[:4] @ k[4:8].T) / math.sqrt(6) + 5.0  # every row's max goes up: old terms shrink
    got = _pair(student(*expected, higher.clone(), v[4:8]), "the second tile",
                "row_max, row_sum, acc")
    second = reference.tile_step(expected, higher.clone(), v[4:8])
    for name, mine, theirs in zip(("row_max", "row_sum", "acc"), got, second, strict=True):
        _step_close(mine, theirs, name)
    mask = torch.ones(10, 10, dtype=torch.bool).tril()  # causal: tiles above the diagonal are -inf
    mask[5] = False  # and query 5 may see nothing at all
    expected_out, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    got_out = _run_with_step(student, q, k, v, mask, block=4)
    if got_out.isnan().any():
        raise ExerciseFailed("the output contains NaN: a tile where a row is fully masked has max "
                             "-inf, and e to the power (-inf minus -inf) is NaN.",
                             fix="shift by 0 where the max is minus infinity: use the course's "
                             "exp_shifted for every exponential.")
    expect_close(got_out, expected_out, "the attention output built from your steps", atol=1e-9)
    return "That one function is the whole inner loop of FlashAttention-2, and of the Triton kernel."


BackwardFunction = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, int], tuple[Tensor, Tensor, Tensor]]


def backward_variant(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor,
                     block: int, mistake: str = "") -> tuple[Tensor, Tensor, Tensor]:
    """The tiled backward of one head (no mask), right or with one named `mistake` (the checker
    compares a wrong answer with each): q (N_q, d), k and v (N_k, d), out and grad_out (N_q, d),
    lse (N_q,) -> dq, dk, dv."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    big_d = {"D = rowsum(dO)": grad_out.sum(-1), "no D": torch.zeros_like(lse)}.get(
        mistake, (grad_out * out).sum(-1))
    for r in range(0, q.shape[0], block):
        rows = slice(r, r + block)
        for c in range(0, k.shape[0], block):
            cols = slice(c, c + block)
            scores = scale * q[rows] @ k[cols].T
            probs = scores.softmax(-1) if mistake == "tile softmax" else torch.exp(scores - lse[rows, None])
            d_probs = grad_out[rows] @ v[cols].T
            d = (probs * d_probs).sum(-1) if mistake == "D of one tile" else big_d[rows]
            d_scores = probs * (d_probs - d[:, None])
            s = 1.0 if mistake == "no scale" else scale
            dq[rows] += s * d_scores @ k[cols]
            dk[cols] += s * d_scores.T @ q[rows]
            dv[cols] += probs.T @ grad_out[rows]
    return dq, dk, dv


BACKWARD_MISTAKES = {  # mistake: (what is wrong, how to fix it)
    "D = rowsum(dO)": ("D is not rowsum(dO * O): you summed dO alone.",
                       "D is one number per query: the row sum of dO times O, element by element."),
    "no D": ("the D term of dS is missing: dS = P * dP forgets that the softmax's weights sum to 1.",
             "subtract each query's D from dP before multiplying by P."),
    "D of one tile": ("D summed P * dP over one key tile only.",
                      "D is a sum over all keys, which is why it is computed once, before the "
                      "loops, from O and dO."),
    "tile softmax": ("P was rebuilt with a softmax over one key tile.",
                     "each tile of P is e to the power (S minus L), with the saved log-sum-exp L "
                     "of the whole row."),
    "no scale": ("dQ and dK are missing the 1/sqrt(d) of the scores S = Q K^T / sqrt(d).",
                 "multiply the contributions to dQ and dK by the same scale as the scores."),
}


@exercise(hint="D (per query, the sum over features of dO times O) does not depend on the tile: "
               "compute it once, before the loops. Then, for each pair of a query tile and a key "
               "tile, rebuild that tile of P from its scores and the saved log-sum-exp, and add the "
               "tile's contributions to dV, dQ and dK, through dS = P (dP - D); dQ and dK carry the "
               "scores' scale.",
          points=3,
          task="Write my_flash_backward(q, k, v, out, lse, grad_out, block) for one head without a "
               "mask, returning (dq, dk, dv), tile by tile from the saved output and log-sum-exp. "
               "The check compares with autograd through naive attention, with ragged tiles.")
def backward(student: BackwardFunction) -> str:
    gen = seeded(88)
    q, k, v = (torch.randn(n, 6, generator=gen, dtype=torch.float64) for n in (10, 13, 13))
    grad_out = torch.randn(10, 6, generator=gen, dtype=torch.float64)
    out, lse = reference.tiled_attention_fa2(q, k, v, block_q=4, block_k=4)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.autograd.grad(scaled_dot_product_attention(*leaves)[0], leaves, grad_out)
    got = _pair(student(q.clone(), k.clone(), v.clone(), out.clone(), lse.clone(), grad_out.clone(), 4),
                "flash_backward", "dq, dk, dv")
    if not all(isinstance(g, Tensor) and g.shape == e.shape for g, e in zip(got, expected, strict=True)):
        raise ExerciseFailed(f"you returned {[getattr(g, 'shape', type(g).__name__) for g in got]}, "
                             f"not dq, dk, dv shaped like q, k, v: {[tuple(e.shape) for e in expected]}.",
                             fix="give each gradient the shape of the tensor it belongs to.")
    if all(torch.allclose(g, e, atol=1e-9) for g, e in zip(got, expected, strict=True)):
        def prepared(q: Tensor, k: Tensor, v: Tensor) -> Callable[[], object]:
            out, lse = reference.tiled_attention_fa2(q, k, v, block_q=8, block_k=8)
            return lambda: student(q, k, v, out, lse, torch.ones_like(out), 8)

        _never_whole(prepared, "my_flash_backward(..., block=8)", "probabilities P")
        return "dS = P (dP - D): the whole backward of attention, without ever storing P."
    for mistake, (message, fix) in BACKWARD_MISTAKES.items():
        wrong = backward_variant(q, k, v, out, lse, grad_out, 4, mistake)
        if all(torch.allclose(g, w, atol=1e-9) for g, w in zip(got, wrong, strict=True)):
            raise ExerciseFailed(message, fix=fix)
    for name, g, e in zip(("dq", "dk", "dv"), got, expected, strict=True):
        expect_close(g, e, name, atol=1e-9)
    raise ExerciseFailed("dq, dk and dv differ from autograd's.")
