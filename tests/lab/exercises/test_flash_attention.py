"""Notebook 8's checkers (helpers/lab/exercises/flash_attention.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import math

import pytest
import torch

import helpers.lab.exercises as exercises
from helpers.flash import tiled
from helpers.lab.exercises import evaluate
from helpers.lab.exercises.flash_attention import (
    ALGORITHM_1_MISTAKES,
    BACKWARD_MISTAKES,
    algorithm_1_variant,
    backward_variant,
)

from .judging import (
    assert_cases_cover,
    assert_not_attempted_says_the_task,
    case_ids,
    exercise_names,
    from_the_checker,
    judge,
    named,
)


def merge_where(max_a, sum_a, max_b, sum_b):
    new_max = torch.maximum(max_a, max_b)
    safe = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
    return new_max, sum_a * torch.exp(max_a - safe) + sum_b * torch.exp(max_b - safe)


def merge_plain_sum(max_a, sum_a, max_b, sum_b):
    return torch.maximum(max_a, max_b), sum_a + sum_b


def merge_nan(max_a, sum_a, max_b, sum_b):
    new_max = torch.maximum(max_a, max_b)
    return new_max, sum_a * torch.exp(max_a - new_max) + sum_b * torch.exp(max_b - new_max)


def step_where(row_max, row_sum, acc, scores, v_tile):
    new_max = torch.maximum(row_max, scores.amax(-1))
    safe = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
    correction = torch.exp(row_max - safe)
    probs = torch.exp(scores - safe[:, None])
    return new_max, row_sum * correction + probs.sum(-1), acc * correction[:, None] + probs @ v_tile


def step_no_rescale(row_max, row_sum, acc, scores, v_tile):
    new_max = torch.maximum(row_max, scores.amax(-1))
    probs = tiled.exp_shifted(scores, new_max[:, None])
    return new_max, row_sum + probs.sum(-1), acc + probs @ v_tile


def step_nan(row_max, row_sum, acc, scores, v_tile):
    new_max = torch.maximum(row_max, scores.amax(-1))
    correction = torch.exp(row_max - new_max)
    probs = torch.exp(scores - new_max[:, None])
    return new_max, row_sum * correction + probs.sum(-1), acc * correction[:, None] + probs @ v_tile


def _flash_backward(mistake):
    from helpers.lab.exercises.flash_attention import backward_variant
    return lambda *args: backward_variant(*args, mistake=mistake)


@from_the_checker
def backward_tiled(*args):
    return _flash_backward("")(*args)


def backward_by_the_checker(*args):  # the same function, watched: the checker's own code is refused
    return _flash_backward("")(*args)


@from_the_checker
def backward_d_from_grad_out(*args):
    return _flash_backward("D = rowsum(dO)")(*args)


@from_the_checker
def backward_d_of_one_tile(*args):
    return _flash_backward("D of one tile")(*args)


def _algorithm_1(mistake):
    from helpers.lab.exercises.flash_attention import algorithm_1_variant
    return lambda *args: algorithm_1_variant(*args, mistake=mistake)


@from_the_checker
def algorithm_1_listing(*args):
    return _algorithm_1("")(*args)


def algorithm_1_by_the_checker(*args):
    return _algorithm_1("")(*args)


@from_the_checker
def algorithm_1_not_unnormalised(*args):
    return _algorithm_1("not un-normalised")(*args)


@from_the_checker
def algorithm_1_last_tile_only(*args):
    return _algorithm_1("one tile")(*args)


def backward_untiled(q, k, v, out, lse, grad_out, block):
    """The same equations on the whole matrices at once: the right values, but the exercise states
    that the whole N x N matrix P is never made, and the check holds it to that."""
    p = torch.exp(q @ k.T / math.sqrt(q.shape[-1]) - lse[:, None])
    ds = p * (grad_out @ v.T - (grad_out * out).sum(-1, keepdim=True))
    return ds @ k / math.sqrt(q.shape[-1]), ds.T @ q / math.sqrt(q.shape[-1]), p.T @ grad_out


def test_the_backward_checker_refuses_the_untiled_equations_and_names_each_mistake():
    passed, said = evaluate("flash_attention.backward", backward_untiled)
    assert not passed and "as many as the whole N x N matrix" in said
    passed, said = evaluate("flash_attention.backward", backward_variant)  # the checker's own code
    assert not passed and "helpers.lab.exercises.flash_attention.backward_variant" in said
    # the slips come from the checker's variant: watched=False lets the checker name them
    assert evaluate("flash_attention.backward", backward_variant, watched=False)[0]
    for mistake, (message, fix) in BACKWARD_MISTAKES.items():
        passed, said = evaluate("flash_attention.backward",
                                lambda *args, m=mistake: backward_variant(*args, mistake=m), watched=False)
        assert not passed and message in said and fix in said, mistake
        first_try = evaluate("flash_attention.backward",
                             lambda *args, m=mistake: backward_variant(*args, mistake=m), attempt=1,
                             watched=False)[1]
        assert message in first_try and fix not in first_try, mistake
    passed, said = evaluate("flash_attention.backward", lambda q, k, v, *rest: (q, k))
    assert not passed and "dq, dk, dv" in said


def algorithm_1_untiled_online(Q, K, V, block_r, block_c):
    """Another correct answer: the key tiles in the outer loop, every query at once, and the
    output kept un-normalised until the end (the merge is the same identity)."""
    n, d = Q.shape
    scores_scale = 1 / math.sqrt(d)
    m = torch.full((n, 1), -math.inf, dtype=Q.dtype)
    ell, acc = torch.zeros(n, 1, dtype=Q.dtype), torch.zeros_like(Q)
    for j in range(0, n, block_c):
        s = scores_scale * Q @ K[j:j + block_c].T
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)
        ell = torch.exp(m - m_new) * ell + p.sum(-1, keepdim=True)
        acc = torch.exp(m - m_new) * acc + p @ V[j:j + block_c]
        m = m_new
    return acc / ell


def algorithm_1_with_softmax(Q, K, V, block_r, block_c):
    return torch.softmax(Q @ K.T / math.sqrt(Q.shape[-1]), dim=-1) @ V


def algorithm_1_without_max(Q, K, V, block_r, block_c):
    e = torch.exp(Q @ K.T / math.sqrt(Q.shape[-1]))
    return e @ V / e.sum(-1, keepdim=True)


def test_the_algorithm_1_checker_accepts_other_orders_and_names_each_mistake():
    passed, said = evaluate("flash_attention.algorithm_1", algorithm_1_variant)  # the checker's own code
    assert not passed and "helpers.lab.exercises.flash_attention.algorithm_1_variant" in said
    assert evaluate("flash_attention.algorithm_1", algorithm_1_variant, watched=False)[0]
    assert evaluate("flash_attention.algorithm_1", algorithm_1_untiled_online)[0]
    for mistake, (message, fix) in ALGORITHM_1_MISTAKES.items():
        passed, said = evaluate("flash_attention.algorithm_1",
                                lambda *args, m=mistake: algorithm_1_variant(*args, mistake=m), watched=False)
        assert not passed and message in said and fix in said, mistake
    passed, said = evaluate("flash_attention.algorithm_1", algorithm_1_with_softmax)
    assert not passed and "calls torch.softmax" in said
    passed, said = evaluate("flash_attention.algorithm_1", algorithm_1_without_max)
    assert not passed and "an exponential overflowed" in said
    passed, said = evaluate("flash_attention.algorithm_1", lambda *args: (algorithm_1_variant(*args),),
                            watched=False)
    assert not passed and "not the output O alone" in said


def merge_through_the_exponentials(max_a, sum_a, max_b, sum_b):
    """Undoes each shift (sum times e to the max), adds, and shifts again: overflows at 1000."""
    merged = torch.maximum(max_a, max_b)
    return merged, (sum_a * max_a.exp() + sum_b * max_b.exp()) / merged.exp()


def test_a_merge_that_overflows_is_not_blamed_on_minus_infinity():
    message = named("flash_attention.merge_softmax_states", merge_through_the_exponentials, "overflowed")
    assert "-inf minus -inf" not in message


def algorithm_1_old_sum_kept(q, k, v, block_r, block_c):
    """Algorithm 1 that moves the old output to the new max but adds to the old sum as it is."""
    n, d = q.shape
    q = q / math.sqrt(d)
    out, ell, m = torch.zeros_like(q), torch.zeros(n, dtype=q.dtype), torch.full((n,), -math.inf, dtype=q.dtype)
    for j in range(0, n, block_c):
        for i in range(0, n, block_r):
            rows = slice(i, i + block_r)
            scores = q[rows] @ k[j:j + block_c].T
            m_new = torch.maximum(m[rows], scores.amax(1))
            p = (scores - m_new[:, None]).exp()
            old = (m[rows] - m_new).exp()
            ell_new = ell[rows] + p.sum(1)                     # the slip: ell[rows] not times old
            out[rows] = (old[:, None] * ell[rows, None] * out[rows] + p @ v[j:j + block_c]) / ell_new[:, None]
            ell[rows], m[rows] = ell_new, m_new
    return out


def test_algorithm_1_names_a_running_sum_left_at_the_old_max():
    message = named("flash_attention.algorithm_1", algorithm_1_old_sum_kept, "running sum", "new max")
    assert "wrong values" not in message


def untiled_algorithm_1(q, k, v, block_r, block_c):
    scores = q @ k.T / math.sqrt(q.shape[-1])  # the whole N x N matrix
    exps = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return exps / exps.sum(dim=-1, keepdim=True) @ v


def tiled_algorithm_1(q, k, v, block_r, block_c):
    """Key tiles outside, query tiles inside, as in the listing."""
    n, scale = q.shape[0], 1 / math.sqrt(q.shape[-1])
    out = torch.zeros_like(q[:, :1].expand(n, v.shape[-1])).clone()
    row_max = torch.full((n, 1), -math.inf, dtype=q.dtype)
    row_sum = torch.zeros(n, 1, dtype=q.dtype)
    for j in range(0, n, block_c):
        k_tile, v_tile = k[j:j + block_c], v[j:j + block_c]
        for i in range(0, n, block_r):
            rows = slice(i, i + block_r)
            scores = q[rows] @ k_tile.T * scale
            new_max = torch.maximum(row_max[rows], scores.amax(dim=-1, keepdim=True))
            exps = torch.exp(scores - new_max)
            shrink = torch.exp(row_max[rows] - new_max)
            new_sum = row_sum[rows] * shrink + exps.sum(dim=-1, keepdim=True)
            out[rows] = (out[rows] * row_sum[rows] * shrink + exps @ v_tile) / new_sum
            row_max[rows], row_sum[rows] = new_max, new_sum
    return out


def test_an_untiled_algorithm_1_gives_the_right_numbers_but_fails_the_stated_rule():
    q, k, v = (torch.randn(10, 4, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(untiled_algorithm_1(q, k, v, 4, 3), tiled_algorithm_1(q, k, v, 4, 3))
    passed, said = exercises.evaluate("flash_attention.algorithm_1", untiled_algorithm_1, time_limit=None)
    assert not passed and "64 x 64 = 4,096 numbers" in said and "one tile at a time" in said, said
    passed, said = exercises.evaluate("flash_attention.algorithm_1", tiled_algorithm_1, time_limit=None)
    assert passed, said


def untiled_backward(q, k, v, out, lse, grad_out, block):
    scale = 1 / math.sqrt(q.shape[-1])
    p = torch.exp(q @ k.T * scale - lse[:, None])  # the whole P
    d = (grad_out * out).sum(dim=-1, keepdim=True)
    ds = p * (grad_out @ v.T - d)
    return ds @ k * scale, ds.T @ q * scale, p.T @ grad_out


def tiled_backward(q, k, v, out, lse, grad_out, block):
    scale = 1 / math.sqrt(q.shape[-1])
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    d = (grad_out * out).sum(dim=-1)
    for i in range(0, q.shape[0], block):
        for j in range(0, k.shape[0], block):
            rows, cols = slice(i, i + block), slice(j, j + block)
            p = torch.exp(q[rows] @ k[cols].T * scale - lse[rows, None])
            dv[cols] += p.T @ grad_out[rows]
            ds = p * (grad_out[rows] @ v[cols].T - d[rows, None])
            dq[rows] += ds @ k[cols] * scale
            dk[cols] += ds.T @ q[rows] * scale
    return dq, dk, dv


def test_a_backward_that_builds_the_whole_p_fails_by_name():
    passed, said = exercises.evaluate("flash_attention.backward", untiled_backward, time_limit=None)
    assert not passed and "whole N x N matrix of probabilities P" in said, said
    passed, said = exercises.evaluate("flash_attention.backward", tiled_backward, time_limit=None)
    assert passed, said


CASES = [
    ("flash_attention.merge_softmax_states", merge_where, None),
    ("flash_attention.merge_softmax_states", merge_plain_sum, "rescale both"),
    ("flash_attention.merge_softmax_states", merge_nan, "NaN"),
    ("flash_attention.tile_step", step_where, None),
    ("flash_attention.tile_step", step_no_rescale, "were not moved to the new max"),
    ("flash_attention.tile_step", step_nan, "NaN"),
    ("flash_attention.backward", backward_tiled, None),
    ("flash_attention.backward", backward_d_from_grad_out, "you summed dO alone"),
    ("flash_attention.backward", backward_d_of_one_tile, "over one key tile only"),
    ("flash_attention.backward", backward_by_the_checker, "helpers.lab.exercises.flash_attention.backward_variant"),
    ("flash_attention.algorithm_1", algorithm_1_listing, None),
    ("flash_attention.algorithm_1", algorithm_1_not_unnormalised, "must be un-normalised first"),
    ("flash_attention.algorithm_1", algorithm_1_last_tile_only, "only the last key tile counts"),
    ("flash_attention.algorithm_1", algorithm_1_by_the_checker,
     "helpers.lab.exercises.flash_attention.algorithm_1_variant"),
]


@pytest.mark.parametrize("name, answer, message", CASES, ids=case_ids(CASES))
def test_checker_judges(name, answer, message):
    judge(name, answer, message)


def test_every_checker_has_a_right_and_two_wrong_cases():
    assert_cases_cover("flash_attention", CASES)


@pytest.mark.parametrize("name", exercise_names("flash_attention"))
def test_not_attempted_says_the_task_not_the_recipe(name):
    assert_not_attempted_says_the_task(name)
