"""Exercises of notebook 14 (serving the model): the top-p rule, the block-table lookup, the
speculative accept/reject step, and int8 quantize/dequantize."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close
from helpers.serve.paged import lookup
from helpers.serve.quantize import quantize_int8
from helpers.serve.sampling import top_p_filter
from helpers.serve.speculative import residual


@exercise(hint="Sort the probabilities from most to least likely; a token stays when the tokens "
               "ranked above it hold less than top_p of the mass. Set the others to -inf.")
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
               "position % block_size.")
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


@exercise(hint="Accept when u < min(1, p[token] / q[token]). The residual is max(0, p - q), "
               "divided by its sum.")
def accept_or_reject(student: Callable[[Tensor, Tensor, int, float], tuple[bool, Tensor]]) -> str:
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
    for token, u, keep in ((0, 0.99, True), (1, 0.49, True), (1, 0.51, False), (2, 0.7, True)):
        got = student(p.clone(), q.clone(), token, u)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ExerciseFailed(f"return (accepted, residual), got {got!r}.")
        if bool(got[0]) != keep:
            ratio = min(1.0, float(p[token] / q[token]))
            raise ExerciseFailed(f"token {token} with p = {p[token]:.1f}, q = {q[token]:.1f} and "
                                 f"u = {u} should be {'kept' if keep else 'rejected'}: the "
                                 f"acceptance probability is min(1, p/q) = {ratio:.3g}.")
        expect_close(got[1], residual(p, q), "the residual distribution")
        if not math.isclose(float(got[1].sum()), 1.0, abs_tol=1e-9):
            raise ExerciseFailed("the residual must sum to 1: divide max(0, p - q) by its sum.")
    return "Right: keep what the draft under-proposed, redraw from what it missed."


@exercise(hint="scale = each row's largest |w| / 127; q = round(w / scale) as torch.int8.")
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
