"""The rules an exercise's text states are checked (issue 50, item 9): an untiled algorithm_1 or
a backward that builds the whole P, and a sinusoidal table that loops over positions, give the
right numbers and still fail, by name; the tiled and broadcast answers pass. The tensors an
answer makes are counted by watch.TensorLog."""

from __future__ import annotations

import math

import torch

import helpers.lab.exercises as exercises
from helpers.lab.exercises.watch import TensorLog


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


def table_by_broadcast(n_positions, d_model, base=10000.0):
    angles = torch.arange(n_positions)[:, None] / base ** (torch.arange(0, d_model, 2) / d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)


def table_by_loop(n_positions, d_model, base=10000.0):
    rows = []
    for pos in range(n_positions):
        angles = pos / base ** (torch.arange(0, d_model, 2) / d_model)
        rows.append(torch.stack([angles.sin(), angles.cos()], dim=-1).flatten())
    return torch.stack(rows)


def test_a_sinusoidal_table_that_loops_over_positions_fails_and_one_broadcast_passes():
    torch.testing.assert_close(table_by_loop(9, 6), table_by_broadcast(9, 6))
    passed, said = exercises.evaluate("embeddings.sinusoidal_table", table_by_loop, time_limit=None)
    assert not passed and "loops over the positions" in said, said
    passed, said = exercises.evaluate("embeddings.sinusoidal_table", table_by_broadcast, time_limit=None)
    assert passed, said


def test_the_tensor_log_counts_operations_and_the_largest_tensor():
    x = torch.randn(6, 5)
    with TensorLog() as log:
        y = x @ x.T
        y.sum()
    assert log.largest == 36 and log.largest_shape == (6, 6) and log.operations >= 3
