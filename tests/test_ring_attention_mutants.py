"""Ring attention (helpers.scale.ring_attention) with its ranks as threads of this process
(tests/thread_ranks.py), where mutmut sees the workers' code run: on 2 and 3 ranks, zig-zag or
contiguous, causal or not, forward and backward equal PyTorch's scaled_dot_product_attention
(float64); the work each rank does and the messages it sends, exactly; the pieces (block
attention, the merge) against PyTorch's; every check read in full. Written against the mutants
that survived benchmarks/mutation.py."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from thread_ranks import ThreadRanks, ThreadWorkers

from helpers.scale import ring_attention as ra
from helpers.scale.workers import Workers

SHAPE = (1, 2, 12, 4)  # B, H, N, D_H: 12 tokens split over 2 or 3 ranks, zig-zag or not


def expected_work(rank: int, p: int, zigzag: bool, causal: bool, c: int) -> int:
    mine = ra.chunk_ids(rank, p, zigzag)
    every = [chunk for r in range(p) for chunk in ra.chunk_ids(r, p, zigzag)]
    return c * c * sum(1 for qi in mine for ki in every if not causal or ki <= qi)


@pytest.mark.parametrize(("p", "zigzag", "causal"), [(3, True, True), (3, False, True), (3, False, False),
                                                     (2, True, False)])
def test_ring_attention_on_thread_ranks_is_full_attention(monkeypatch, p, zigzag, causal):
    ranks = ThreadRanks(p).patch(monkeypatch, ra)
    results = ra.run_ring_attention(ThreadWorkers(ranks), SHAPE, zigzag=zigzag, causal=causal, seed=2)
    reference = ra.full_attention_reference(SHAPE, causal=causal, seed=2)
    c = SHAPE[2] // (2 * p if zigzag else p)
    for rank, result in enumerate(results):
        for name in ("out", "q", "k", "v"):
            expected = ra.split_sequence(reference[name], rank, p, zigzag)
            torch.testing.assert_close(result[name], expected, rtol=0, atol=1e-12)
        assert result["work"] == expected_work(rank, p, zigzag, causal, c)
        left, right = (rank - 1) % p, (rank + 1) % p
        # p - 1 steps forward (to rank + 1), then the gradients p - 1 steps back (to rank - 1)
        assert [call for r, call in ranks.calls if r == rank] == (
            [f"send to {right}", f"recv from {left}"] * (p - 1) + [f"send to {left}", f"recv from {right}"] * (p - 1))
    assert not torch.equal(reference["out"], ra.full_attention_reference(SHAPE, causal=not causal, seed=2)["out"])


def test_the_default_is_causal_zigzag_with_seed_0(monkeypatch):
    ranks = ThreadRanks(2).patch(monkeypatch, ra)
    results = ra.run_ring_attention(ThreadWorkers(ranks), SHAPE)
    reference = ra.full_attention_reference(SHAPE)
    explicit = ra.full_attention_reference(SHAPE, causal=True, seed=0)
    assert all(torch.equal(reference[n], explicit[n]) for n in reference)
    for rank, result in enumerate(results):
        torch.testing.assert_close(result["out"], ra.split_sequence(reference["out"], rank, 2, True),
                                   rtol=0, atol=1e-12)
        assert result["work"] == expected_work(rank, 2, True, True, 3)
    q, k, v = (ra.split_sequence(t, 0, 1, False) for t in ra._inputs(SHAPE, 0)[:3])
    one = ThreadRanks(1).patch(monkeypatch, ra).run(lambda rank, p: ra.ring_attention(q, k, v, zigzag=False))
    torch.testing.assert_close(one[0][0], F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               rtol=0, atol=1e-12)


def test_ring_attention_refuses_slices_that_do_not_hold_its_chunks(monkeypatch):
    q = torch.zeros(1, 1, 5, 4)
    with pytest.raises(ValueError, match="^q has 5 positions, expected a multiple of 2 chunks$"):
        ThreadRanks(1).patch(monkeypatch, ra).run(lambda rank, p: ra.ring_attention(q, q, q, zigzag=True))


def test_block_attention_is_pytorchs_with_its_log_sum_exp():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, 3, 4, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(2, 1, 3, 4, generator=generator, dtype=torch.float64) for _ in range(2))
    for diagonal in (False, True):
        out, lse = ra.block_attention(q, k, v, diagonal)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=diagonal),
                                   rtol=0, atol=1e-12)
        scores = q @ k.transpose(-2, -1) / math.sqrt(4)
        if diagonal:
            scores = scores.masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(lse, scores.logsumexp(-1), rtol=0, atol=1e-12)
    # keys of another length (c' != c) against the queries: allowed, no mask
    out, lse = ra.block_attention(q, k[:, :, :2], v[:, :, :2], False)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k[:, :, :2], v[:, :, :2]), rtol=0, atol=1e-12)


def test_the_merge_starts_from_none_and_weights_each_part():
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    o_a, lse_a = ra.block_attention(q, k[:, :, :1], v[:, :, :1], False)
    o_b, lse_b = ra.block_attention(q, k[:, :, 1:], v[:, :, 1:], False)
    out, lse = ra.merge_partial(None, None, o_a, lse_a)
    assert out is o_a and lse is lse_a
    out, lse = ra.merge_partial(out, lse, o_b, lse_b)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, torch.logaddexp(lse_a, lse_b), rtol=0, atol=0)
    reversed_out, _ = ra.merge_partial(o_b, lse_b, o_a, lse_a)
    torch.testing.assert_close(reversed_out, out, rtol=0, atol=1e-12)


def test_split_sequence_takes_the_ranks_chunks_in_order():
    x = torch.arange(8.0).view(1, 1, 8, 1)
    assert ra.split_sequence(x, 0, 2, True).flatten().tolist() == [0.0, 1.0, 6.0, 7.0]
    assert ra.split_sequence(x, 1, 2, True).flatten().tolist() == [2.0, 3.0, 4.0, 5.0]
    assert ra.split_sequence(x, 1, 2, False).flatten().tolist() == [4.0, 5.0, 6.0, 7.0]
    assert ra.split_sequence(x, 0, 1, False).flatten().tolist() == list(range(8))
    assert ra.check_divides(12, 3, True) == 2 and ra.check_divides(12, 3, False) == 4


def test_the_ring_checks_read_in_full():
    with pytest.raises(ValueError, match=re.escape("seq_len=6 cannot be split over world_size=2 ranks in "
                                                   "zig-zag chunks: expected a multiple of 4")):
        ra.check_divides(6, 2, True)
    with pytest.raises(ValueError, match=re.escape("seq_len=5 cannot be split over world_size=2 ranks: "
                                                   "expected a multiple of 2")):
        ra.check_divides(5, 2, False)
    for args, name in (((0, 2, True), "seq_len"), ((4, 0, True), "world_size"), ((4, 2, 1), "zigzag")):
        with pytest.raises((ValueError, TypeError), match=f"^{name} is "):
            ra.check_divides(*args)
    with pytest.raises(TypeError, match="^zigzag is "):
        ra.chunk_ids(0, 2, "yes")
    with pytest.raises(ValueError, match=re.escape("x is (3, 4), expected (B, H, N, D_H)")):
        ra.split_sequence(torch.zeros(3, 4), 0, 2, True)
    with pytest.raises(ValueError, match=re.escape("x is list, expected (B, H, N, D_H)")):
        ra.split_sequence([1.0], 0, 2, True)
    q = torch.zeros(1, 1, 2, 4)
    message = ("q (1, 1, 2, 4), k (1, 1, 2, 3), v (1, 1, 2, 4): expected (B, H, c, D_H) and two "
               "equal (B, H, c', D_H)")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ra.block_attention(q, torch.zeros(1, 1, 2, 3), q, False)
    for bad in ((q[0], q, q), (q, q[0], q[0]), (q, q, torch.zeros(1, 1, 3, 4))):
        with pytest.raises(ValueError, match="^q "):
            ra.block_attention(*bad, False)
    with pytest.raises(ValueError, match=re.escape("o_b (2, 4) and lse_b (3,): expected (..., c, D_H) and (..., c)")):
        ra.merge_partial(None, None, torch.zeros(2, 4), torch.zeros(3))
    message = ("q, k, v have shapes [(1, 1, 2, 4), (1, 1, 2), (1, 1, 2, 4)], expected three equal "
               "(B, H, n, D_H): this rank's slice of the sequence")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ra.ring_attention(q, q[..., 0], q, zigzag=True)
    with pytest.raises(ValueError, match=re.escape("q, k, v have shapes [(1, 1, 2, 4), (), (1, 1, 2, 4)]")):
        ra.ring_attention(q, None, q, zigzag=True)
    with pytest.raises(ValueError, match="q, k, v have shapes"):
        ra.ring_attention(q, q, torch.zeros(1, 1, 2, 5), zigzag=True)
    with pytest.raises(TypeError, match="^causal is "):
        ra.ring_attention(q, q, q, zigzag=True, causal=1)
    with pytest.raises(TypeError, match="^zigzag is "):
        ra.ring_attention(q, q, q, zigzag=1)
    with pytest.raises(ValueError, match=re.escape("shape is (1, 2, 4), expected (B, H, N, D_H)")):
        ra.full_attention_reference((1, 2, 4))
    with pytest.raises(ValueError, match="shape is 'abcd'"):
        ra.full_attention_reference("abcd")
    for i, name in enumerate(("B", "H", "N", "D_H")):
        shape = [1, 2, 4, 4]
        shape[i] = 0
        with pytest.raises(ValueError, match=f"^shape's {name} is 0"):
            ra.full_attention_reference(tuple(shape))
    with pytest.raises(TypeError, match="^causal is "):
        ra.full_attention_reference(SHAPE, causal="no")
    with pytest.raises(TypeError, match="^causal is "):
        ra.run_ring_attention(Workers(2), SHAPE, causal="no")
    with pytest.raises(TypeError, match="^workers is a str, expected a Workers$"):
        ra.run_ring_attention("pool", SHAPE)
    with pytest.raises(TypeError, match="^workers is a NoneType, expected a Workers$"):
        ra.run_ring_attention(None, SHAPE)
    pool = Workers(2)
    with pytest.raises(TypeError, match="^zigzag is "):
        ra.run_ring_attention(pool, SHAPE, zigzag=None)
    with pytest.raises(ValueError, match="^shape's D_H is 0"):
        ra.run_ring_attention(pool, (1, 2, 12, 0))
    assert pool.processes == []


def test_the_worker_defaults_to_causal_attention_from_seed_0(monkeypatch):
    results = ThreadRanks(2).patch(monkeypatch, ra).run(ra.ring_attention_worker, SHAPE, True)
    reference = ra.full_attention_reference(SHAPE, causal=True, seed=0)
    for rank, result in enumerate(results):
        for name in ("out", "q", "k", "v"):
            torch.testing.assert_close(result[name], ra.split_sequence(reference[name], rank, 2, True),
                                       rtol=0, atol=1e-12)


def test_zero_keys_and_values_give_zeros_not_nan(monkeypatch):
    """Keys and values all zero (a padded or empty stretch of the sequence): every output is 0."""
    q = torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    zeros = torch.zeros_like(q)
    results = ThreadRanks(2).patch(monkeypatch, ra).run(
        lambda rank, p: ra.ring_attention(*(ra.split_sequence(t, rank, p, True) for t in (q, zeros, zeros)),
                                          zigzag=True)[0])
    assert all(torch.equal(out, torch.zeros(1, 2, 4, 4, dtype=torch.float64)) for out in results)
