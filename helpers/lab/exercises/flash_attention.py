"""Exercises of notebook 8 (tiled FlashAttention): merge two softmax states; write one tile step;
write the backward pass tile by tile (its D and dS)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from helpers.flash import tiled as reference
from helpers.lab.exercises import ExerciseFailed, exercise, expect_close
from helpers.model.attention import scaled_dot_product_attention

INF = math.inf


def _pair(result: object, what: str, names: str) -> tuple:
    if not isinstance(result, tuple) or len(result) != len(names.split(", ")):
        raise ExerciseFailed(f"return a tuple ({names}) for {what}; you returned a "
                             f"{type(result).__name__}.")
    return result


@exercise(hint="the merged max is torch.maximum(max_a, max_b); move each sum to it by multiplying "
               "with exp(old max - merged max), then add. A max of -inf means 'no key yet': "
               "helpers.flash.tiled.exp_shifted(x, shift) computes exp(x - shift) safely for that case.",
          task="Write merge(max_a, sum_a, max_b, sum_b) returning the (max, sum) of both halves "
               "together. The check includes huge scores and fully masked halves.")
def merge_softmax_states(student: Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> str:
    """student(max_a, sum_a, max_b, sum_b) -> (max, sum) must equal one pass over both halves."""
    gen = torch.Generator().manual_seed(8)
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
        if isinstance(got[1], Tensor) and got[1].isnan().any():
            raise ExerciseFailed(f"for {what} your sum contains NaN. exp(-inf - (-inf)) is NaN: "
                                 "when the merged max is -inf, shift by 0 instead.")
        if what.startswith("two halves") and isinstance(got[1], Tensor) and torch.allclose(
                got[1], state_a.row_sum + state_b.row_sum):
            raise ExerciseFailed("you added the two sums as they are, but each was measured from "
                                 "its own max: rescale both to the merged max first.")
        expect_close(got[0], expected.row_max, f"the merged max for {what}")
        expect_close(got[1], expected.row_sum, f"the merged sum for {what}", atol=1e-9)
    return "Any number of blocks can now be folded in, in any order, with the same result."


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


@exercise(hint="new_max = max(row_max, scores.amax(-1)); correction = exp(row_max - new_max); "
               "probs = exp(scores - new_max[:, None]); then row_sum and acc are both multiplied "
               "by the correction before this tile's probs.sum(-1) and probs @ v_tile are added. "
               "helpers.flash.tiled.exp_shifted avoids NaN where new_max is -inf.",
          task="Write the tile step (row_max, row_sum, acc, scores, v_tile) -> new (row_max, "
               "row_sum, acc). The check runs a whole causal head with it, a ragged tile and a fully "
               "masked row included.")
def tile_step(student: StepFunction) -> str:
    """student(row_max, row_sum, acc, scores, v_tile) -> new (row_max, row_sum, acc), used for
    every tile of a 10-query, 10-key head (tiles of 4: the last one is ragged, one row is masked)."""
    gen = torch.Generator().manual_seed(80)
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
        expect_close(mine, theirs, f"{name} after a second tile whose scores are all higher "
                                   "(the old sum and acc must be scaled by exp(old max - new max))",
                     atol=1e-9)
    mask = torch.ones(10, 10, dtype=torch.bool).tril()  # causal: tiles above the diagonal are -inf
    mask[5] = False  # and query 5 may see nothing at all
    expected_out, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    got_out = _run_with_step(student, q, k, v, mask, block=4)
    if got_out.isnan().any():
        raise ExerciseFailed("the output contains NaN: a tile where a row is fully masked has max "
                             "-inf, and exp(-inf - (-inf)) is NaN. Shift by 0 where the max is -inf.")
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


BACKWARD_MISTAKES = {
    "D = rowsum(dO)": "D is rowsum(dO * O), one number per query: you summed dO alone.",
    "no D": "dS = P * (dP - D): the D term is missing (dS = P * dP forgets that the softmax's "
            "weights sum to 1).",
    "D of one tile": "D summed P * dP over one key tile only: it is a sum over all keys, which is "
                     "why it is computed once from O and dO, as rowsum(dO * O).",
    "tile softmax": "P was rebuilt with a softmax over one key tile: each tile's P is "
                    "exp(S - L) with the saved log-sum-exp L of the whole row.",
    "no scale": "dQ and dK are missing the 1/sqrt(d) of the scores S = Q K^T / sqrt(d).",
}


@exercise(hint="Before the loops D = (grad_out * out).sum(-1). For each tile pair: S = Q_i K_j^T / "
               "sqrt(d); P = exp(S - lse_i[:, None]); dV_j += P^T dO_i; dP = dO_i V_j^T; "
               "dS = P * (dP - D_i[:, None]); dQ_i += dS K_j / sqrt(d); dK_j += dS^T Q_i / sqrt(d).",
          task="Write my_flash_backward(q, k, v, out, lse, grad_out, block) for one head without a "
               "mask, returning (dq, dk, dv), tile by tile from the saved output and log-sum-exp. "
               "The check compares with autograd through naive attention, with ragged tiles.")
def backward(student: BackwardFunction) -> str:
    gen = torch.Generator().manual_seed(88)
    q, k, v = (torch.randn(n, 6, generator=gen, dtype=torch.float64) for n in (10, 13, 13))
    grad_out = torch.randn(10, 6, generator=gen, dtype=torch.float64)
    out, lse = reference.tiled_attention_fa2(q, k, v, block_q=4, block_k=4)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.autograd.grad(scaled_dot_product_attention(*leaves)[0], leaves, grad_out)
    got = _pair(student(q.clone(), k.clone(), v.clone(), out.clone(), lse.clone(), grad_out.clone(), 4),
                "flash_backward", "dq, dk, dv")
    if not all(isinstance(g, Tensor) and g.shape == e.shape for g, e in zip(got, expected, strict=True)):
        raise ExerciseFailed(f"return dq, dk, dv shaped like q, k, v: {[tuple(e.shape) for e in expected]}; "
                             f"you returned {[getattr(g, 'shape', type(g).__name__) for g in got]}.")
    if all(torch.allclose(g, e, atol=1e-9) for g, e in zip(got, expected, strict=True)):
        return "dS = P (dP - D): the whole backward of attention, without ever storing P."
    for mistake, message in BACKWARD_MISTAKES.items():
        wrong = backward_variant(q, k, v, out, lse, grad_out, 4, mistake)
        if all(torch.allclose(g, w, atol=1e-9) for g, w in zip(got, wrong, strict=True)):
            raise ExerciseFailed(message)
    for name, g, e in zip(("dq", "dk", "dv"), got, expected, strict=True):
        expect_close(g, e, name, atol=1e-9)
    raise ExerciseFailed("dq, dk and dv differ from autograd's.")
