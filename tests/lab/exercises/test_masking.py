"""Notebook 4's checkers (helpers/lab/exercises/masking.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers.model.attention import (
    causal_mask,
    scaled_dot_product_attention,
)

from .judging import (
    assert_cases_cover,
    assert_not_attempted_says_the_task,
    case_ids,
    exercise_names,
    judge,
    named,
)


def causal_triu(scores):
    n_q, n_k = scores.shape[-2:]
    return (scores + torch.full((n_q, n_k), -math.inf, dtype=scores.dtype).triu(n_k - n_q + 1)).softmax(-1)


def causal_zero_fill(scores):
    n_q, n_k = scores.shape[-2:]
    return scores.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(n_k - n_q + 1), 0.0).softmax(-1)


def causal_upside_down(scores):
    n_q, n_k = scores.shape[-2:]
    return scores.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q - 1), -math.inf).softmax(-1)


def causal_top_left(scores):
    n_q, n_k = scores.shape[-2:]
    return scores.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).triu(1), -math.inf).softmax(-1)


def padding_lt(lengths, n, side="right"):
    mask = torch.arange(n).expand(len(lengths), n) < lengths.unsqueeze(1)
    return mask.flip(-1) if side == "left" else mask


def padding_le(lengths, n, side="right"):
    return torch.arange(n)[None, :] <= lengths[:, None]


def padding_inverted(lengths, n, side="right"):
    return torch.arange(n)[None, :] >= lengths[:, None]


def padding_always_right(lengths, n, side="right"):
    return torch.arange(n)[None, :] < lengths[:, None]


def padding_left_gt(lengths, n, side="right"):
    position = torch.arange(n)[None, :]
    return position > n - lengths[:, None] if side == "left" else position < lengths[:, None]


def sparse_answer(slip: str = ""):
    """A student's sparse_mask from triangles and loops; `slip` chooses the usual mistake."""
    def my_sparse_mask(n, window=None, stride=None, global_tokens=(), causal=False):
        ones = torch.ones(n, n, dtype=torch.bool)
        mask = torch.zeros(n, n, dtype=torch.bool)
        if window is not None:
            reach = window - 1 if slip == "short" else window
            mask = mask | (ones.tril(reach) & ones.triu(-reach))
        if stride is not None:
            for i in range(n):
                for j in range(n):
                    if (j if slip == "from_zero" else i - j) % stride == 0:
                        mask[i, j] = True
        for g in global_tokens:
            if slip != "columns_only":
                mask[g, :] = True
            mask[:, g] = True
        if causal and slip != "two_sided":
            mask = mask & ones.tril()
        return mask
    return my_sparse_mask


def masked_answer(slip: str = ""):
    """A student's masked attention; `slip` chooses the usual mistake. Right, it uses a finite fill
    and then zeroes the rows with nothing to see."""
    def my_masked_attention(q, k, v, real):
        n = q.shape[-2]
        scores = q @ k.transpose(-2, -1)
        if slip != "unscaled":
            scores = scores / math.sqrt(q.shape[-1])
        causal = torch.ones(n, n).tril().bool()
        if slip == "upside_down":
            causal = torch.ones(n, n).triu().bool()
        if slip == "no_causal":
            causal = torch.ones(n, n).bool()
        if slip == "no_padding":
            real = torch.ones_like(real)
        allowed = causal & (real[:, None, :, None] if slip == "rows" else real[:, None, None, :])
        if slip == "after":
            weights = scores.softmax(-1).masked_fill(~allowed, 0.0)
        elif slip == "nan":
            weights = scores.masked_fill(~allowed, -math.inf).softmax(-1)
        else:
            weights = scores.masked_fill(~allowed, 0.0 if slip == "zero" else -1e9).softmax(-1)
            if slip != "uniform":
                weights = weights * allowed.any(dim=-1, keepdim=True)
        return weights @ v, weights
    return my_masked_attention


def masked_with_torch(q, k, v, real):
    n = q.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool).tril() & real[:, None, None, :]
    weights = (q @ k.mT / q.shape[-1] ** 0.5).masked_fill(~mask, -math.inf).softmax(-1).nan_to_num(0.0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), weights


def masked_nan_to_zero(q, k, v, real):
    n = q.shape[-2]
    allowed = torch.ones(n, n, dtype=torch.bool).tril() & real[:, None, None, :]
    scores = (q @ k.mT / q.shape[-1] ** 0.5).masked_fill(~allowed, -math.inf)
    weights = scores.softmax(-1).nan_to_num(0.0)
    return weights @ v, weights


def masked_by_the_course(q, k, v, real):
    """The course's causal mask and attention: what the exercise asks the student to write."""
    return scaled_dot_product_attention(q, k, v, mask=causal_mask(q.shape[-2]) & real[:, None, None, :])


MASKED_CASES = [
    (masked_answer(), None),  # a large finite fill is fine once the rows with nothing to see are zeroed
    (masked_with_torch, None),
    (masked_nan_to_zero, None),
    (masked_by_the_course, "helpers.model.attention.causal_mask"),
    (masked_answer("after"), "mask after the softmax"),
    (masked_answer("zero"), "exp(0) = 1"),
    (masked_answer("unscaled"), "forgot the 1/sqrt(d) scale"),
    (masked_answer("no_causal"), "has no causal mask"),
    (masked_answer("upside_down"), "upside down"),
    (masked_answer("no_padding"), "lets real tokens see the pads"),
    (masked_answer("rows"), "pad queries (rows) instead of the pad keys"),
    (masked_answer("nan"), "gets NaN weights"),
    (masked_answer("uniform"), "spreads its weight evenly"),
]


def causal_softmax_without_diagonal(scores):
    n_q, n_k = scores.shape[-2:]
    later_or_self = torch.arange(n_k)[None, :] >= torch.arange(n_q)[:, None] + (n_k - n_q)
    masked = scores.masked_fill(later_or_self, float("-inf"))
    return masked.exp() / masked.exp().sum(-1, keepdim=True)


def test_a_causal_mask_missing_its_diagonal_is_named():
    message = named("masking.causal_softmax", causal_softmax_without_diagonal, "diagonal", "own key")
    assert "nan" not in message


CASES = [
    ("masking.causal_softmax", causal_triu, None),
    ("masking.causal_softmax", causal_zero_fill, "exp(0) = 1"),
    ("masking.causal_softmax", causal_upside_down, "upside down"),
    ("masking.causal_softmax", causal_top_left, "top left corner"),
    ("masking.padding_mask", padding_lt, None),
    ("masking.padding_mask", padding_le, "one real token too many"),
    ("masking.padding_mask", padding_inverted, "inverted"),
    ("masking.padding_mask", padding_always_right, "puts the pads last"),
    ("masking.padding_mask", padding_left_gt, "one real token too few"),
    ("masking.sparse_mask", sparse_answer(), None),
    ("masking.sparse_mask", sparse_answer("two_sided"), "see later keys although causal=True"),
    ("masking.sparse_mask", sparse_answer("short"), "only window - 1 keys"),
    ("masking.sparse_mask", sparse_answer("from_zero"), "counted from position 0"),
    ("masking.sparse_mask", sparse_answer("columns_only"), "only its own pattern"),
]
CASES += [("masking.masked_attention", answer, message) for answer, message in MASKED_CASES]


@pytest.mark.parametrize("name, answer, message", CASES, ids=case_ids(CASES))
def test_checker_judges(name, answer, message):
    judge(name, answer, message)


def test_every_checker_has_a_right_and_two_wrong_cases():
    assert_cases_cover("masking", CASES)


@pytest.mark.parametrize("name", exercise_names("masking"))
def test_not_attempted_says_the_task_not_the_recipe(name):
    assert_not_attempted_says_the_task(name)
