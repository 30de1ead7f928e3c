"""Exercises of notebook 3 (scaled dot-product attention): softmax, its Jacobian, attention."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close
from helpers.model import attention as reference


def _random(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@exercise(hint="subtract the largest logit of each row before exp, then divide by the row's sum; "
               "use dim=-1 and keepdim=True so the shapes broadcast.",
          task="Write a softmax over the last dimension. The check tries one row, a (3, 5) batch and "
               "logits of size 1000.")
def stable_softmax(student: Callable[[Tensor], Tensor]) -> str:
    """The student's softmax(x) over the last dim must match ours, also for huge logits."""
    row = torch.tensor([2.0, 1.0, 0.1], dtype=torch.float64)
    expect_close(student(row), reference.softmax(row), "softmax([2.0, 1.0, 0.1])")
    batch = _random(3, 5, seed=1)
    got = student(batch)
    if isinstance(got, Tensor) and got.shape == batch.shape:
        sums = got.sum(dim=-1)
        if not torch.allclose(sums, torch.ones_like(sums)):
            raise ExerciseFailed("on a (3, 5) input your rows do not sum to 1: normalise along the "
                                 "last dimension (dim=-1), not over the whole tensor or the columns.")
    expect_close(got, reference.softmax(batch), "softmax of a (3, 5) tensor")
    huge = torch.tensor([1000.0, 0.0, -1000.0], dtype=torch.float64)
    got = student(huge)
    if isinstance(got, Tensor) and not torch.isfinite(got).all():
        raise ExerciseFailed("softmax([1000, 0, -1000]) gave NaN or inf: exp(1000) overflows. "
                             "Subtract the row maximum first; softmax does not change when every "
                             "logit moves by the same amount.")
    expect_close(got, reference.softmax(huge), "softmax([1000, 0, -1000])")
    return "It survives logits of 1000, where exp alone overflows."


@exercise(hint="torch.diag(a) puts a on the diagonal; torch.outer(a, a) is a a^T.",
          task="Write the Jacobian (n, n) of softmax at the probabilities a (n,). The check compares "
               "at two points.")
def softmax_jacobian(student: Callable[[Tensor], Tensor]) -> str:
    """The student's Jacobian of softmax at probabilities a (n,) must equal diag(a) - a a^T."""
    for logits in ([2.5, 0.0, -2.5], [0.3, -1.2, 0.7, 2.0]):
        a = reference.softmax(torch.tensor(logits, dtype=torch.float64))
        got = student(a)
        expected = reference.softmax_jacobian(a)
        if isinstance(got, Tensor) and got.shape == expected.shape and torch.allclose(got, torch.diag(a)):
            raise ExerciseFailed("you returned only diag(a): subtract the outer product a a^T too.")
        if isinstance(got, Tensor) and got.shape == expected.shape and torch.allclose(got, -expected):
            raise ExerciseFailed("every sign is flipped: the Jacobian is diag(a) - a a^T, positive "
                                 "on the diagonal (raising a logit raises its own probability).")
        expect_close(got, expected, f"the Jacobian at softmax({logits})", atol=1e-9)
    return "Each row of it sums to 0: adding a constant to every logit changes nothing."


@exercise(hint="scores = q @ k.transpose(-2, -1) / math.sqrt(d_k); weights = softmax over the last "
               "dim (the keys); output = weights @ v. Return (output, weights).",
          task="Write attention(q, k, v) returning (output, weights). The check tries "
               "self-attention, cross-attention and a batch of heads.")
def scaled_attention(student: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> str:
    """The student's attention(q, k, v) -> (output, weights) on self- and cross-attention shapes."""
    cases = {
        "self-attention, q, k, v of shape (4, 8)": ((4, 8), (4, 8), (4, 8)),
        "cross-attention, q (2, 8), k (5, 8), v (5, 3)": ((2, 8), (5, 8), (5, 3)),
        "a batch of heads, q (2, 3, 4, 6), k and v (2, 3, 5, 6)": ((2, 3, 4, 6), (2, 3, 5, 6), (2, 3, 5, 6)),
    }
    for seed, (what, (q_shape, k_shape, v_shape)) in enumerate(cases.items()):
        q, k, v = _random(*q_shape, seed=3 * seed), _random(*k_shape, seed=3 * seed + 1), _random(*v_shape, seed=3 * seed + 2)
        result = student(q, k, v)
        if not isinstance(result, tuple) or len(result) != 2:
            raise ExerciseFailed(f"return a pair (output, weights); for {what} you returned a "
                                 f"{type(result).__name__}.")
        output, weights = result
        expected_out, expected_w = reference.scaled_dot_product_attention(q, k, v)
        _explain_wrong_weights(weights, q, k, what, d_v=v.shape[-1])
        expect_close(weights, expected_w, f"the weights for {what}")
        expect_close(output, expected_out, f"the output for {what}")
    return "Your function handles self-attention, cross-attention and batched heads alike."


def _explain_wrong_weights(weights: object, q: Tensor, k: Tensor, what: str, d_v: int | None = None) -> None:
    """Recognise the classic mistakes: no 1/sqrt(d_k), 1/d_k, 1/sqrt(d_v), the scale after the
    softmax, and the softmax over the wrong dim."""
    if not isinstance(weights, Tensor) or weights.shape[-2:] != (q.shape[-2], k.shape[-2]):
        return
    scores = q @ k.transpose(-2, -1)
    if torch.allclose(weights, reference.softmax(scores), atol=1e-9):
        raise ExerciseFailed(f"for {what} your weights are softmax(q k^T): divide the scores by "
                             f"sqrt(d_k) = {math.sqrt(q.shape[-1]):.3f} before the softmax.")
    d_k = q.shape[-1]
    d_v = d_k if d_v is None else d_v
    slips = {f"your weights are softmax(q k^T / d_k): divide by sqrt(d_k) = {math.sqrt(d_k):.3f}, "
             f"not by d_k = {d_k}.": reference.softmax(scores / d_k),
             "your weights are softmax(q k^T) / sqrt(d_k): the scale goes on the scores, before "
             "the softmax, so that each row still sums to 1.": reference.softmax(scores) / math.sqrt(d_k)}
    if d_v != d_k:
        slips[f"you divided the scores by sqrt(d_v) = {math.sqrt(d_v):.3f}: the scale is sqrt(d_k) = "
              f"{math.sqrt(d_k):.3f}, the size of the vectors in each dot product."] = \
            reference.softmax(scores / math.sqrt(d_v))
    for slip, wrong in slips.items():
        if torch.allclose(weights, wrong, atol=1e-9):
            raise ExerciseFailed(f"for {what} {slip}")
    if q.shape[-2] > 1 and torch.allclose(weights, reference.softmax(scores / math.sqrt(q.shape[-1]), dim=-2), atol=1e-9):
        raise ExerciseFailed(f"for {what} your weights' columns sum to 1: each query (row) must get "
                             "a distribution over the keys, so take the softmax over dim=-1.")
