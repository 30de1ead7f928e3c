"""Ring attention on 2 real processes: equal to full attention forward and backward (float64),
zig-zag balancing the causal work; sequence lengths the world does not divide refused first."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from ranks_in_threads import ThreadRanks, ThreadWorkers
from shared_tools import full

from helpers.flash.tiled import log_sum_exp, merge_softmax_states, softmax_state
from helpers.scale import ring_attention as ra
from helpers.scale.ring_attention import (
    block_attention,
    chunk_ids,
    full_attention_reference,
    merge_partial,
    run_ring_attention,
    split_sequence,
)
from helpers.scale.workers import Workers

SHAPE = (2, 2, 16, 8)  # B, H, N, D_H


@pytest.fixture
def workers(scale_workers):
    return scale_workers  # one pool for the session (tests/conftest.py)


@pytest.mark.parametrize(("zigzag", "causal"), [(True, True), (False, True), (False, False)])
@pytest.mark.processes
@pytest.mark.slow
def test_ring_attention_equals_full_attention_forward_and_backward(workers, zigzag, causal):
    results = run_ring_attention(workers, SHAPE, zigzag=zigzag, causal=causal)
    reference = full_attention_reference(SHAPE, causal=causal)
    for rank, result in enumerate(results):
        for name in ("out", "q", "k", "v"):
            expected = split_sequence(reference[name], rank, 2, zigzag)
            gap = (result[name] - expected).abs().max().item()
            assert gap < 1e-6, (rank, name, gap)
    assert (results[0]["k"] - split_sequence(reference["k"], 1, 2, zigzag)).abs().max() > 1e-3


@pytest.mark.processes
def test_zigzag_balances_the_causal_work(workers):
    zigzag = [r["work"] for r in run_ring_attention(workers, SHAPE, zigzag=True)]
    contiguous = [r["work"] for r in run_ring_attention(workers, SHAPE, zigzag=False)]
    assert zigzag[0] == zigzag[1]
    assert contiguous[1] == 2 * contiguous[0]  # rank 1 also scores all of rank 0's keys


def test_merge_is_notebook_8s_online_softmax():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    o_a, lse_a = block_attention(q, k[:, :, :2], v[:, :, :2], diagonal=False)
    o_b, lse_b = block_attention(q, k[:, :, 2:], v[:, :, 2:], diagonal=False)
    out, lse = merge_partial(o_a, lse_a, o_b, lse_b)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert (out - expected).abs().max() < 1e-12
    scores = q @ k.transpose(-2, -1) / 8 ** 0.5
    state = merge_softmax_states(softmax_state(scores[..., :2]), softmax_state(scores[..., 2:]))
    assert (log_sum_exp(state) - lse).abs().max() < 1e-12


@pytest.mark.processes
def test_sequences_the_world_does_not_divide_are_refused_before_any_process_starts():
    pool = Workers(2)
    with pytest.raises(ValueError, match="seq_len=6 cannot be split over world_size=2 ranks in zig-zag"):
        run_ring_attention(pool, (1, 1, 6, 4), zigzag=True)
    with pytest.raises(ValueError, match="seq_len=5"):
        run_ring_attention(pool, (1, 1, 5, 4), zigzag=False)
    with pytest.raises(ValueError, match="shape"):
        run_ring_attention(pool, (1, 6, 4))
    with pytest.raises(TypeError, match="causal"):
        run_ring_attention(pool, SHAPE, causal="yes")
    with pytest.raises(TypeError, match="workers"):
        run_ring_attention(None, SHAPE)
    assert pool.processes == []


def test_ring_helpers_check_their_arguments():
    assert chunk_ids(1, 4, True) == [1, 6] and chunk_ids(1, 4, False) == [1]
    with pytest.raises(ValueError, match="rank"):
        chunk_ids(4, 4, True)
    with pytest.raises(ValueError, match="expected \\(B, H, N, D_H\\)"):
        split_sequence(torch.zeros(3, 4), 0, 2, True)
    with pytest.raises(ValueError, match="q"):
        block_attention(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 3), torch.zeros(1, 1, 2, 3), False)
    with pytest.raises(ValueError, match="lse_b"):
        merge_partial(None, None, torch.zeros(2, 4), torch.zeros(3))


def test_the_ring_merge_exercise_checker_refuses_an_unweighted_sum():
    from helpers.lab.exercises import evaluate

    assert evaluate("distributed.ring_merge", merge_partial, watched=False)[0]  # right, but the course's:
    passed, message = evaluate("distributed.ring_merge", merge_partial)
    assert not passed and "merge_partial" in message and "the course's own code" in message
    passed, message = evaluate("distributed.ring_merge", lambda o, lse, ob, lb: (o + ob, torch.logaddexp(lse, lb)))
    assert not passed and "weighted" in message


def test_ring_attention_and_the_reference_check_their_arguments_before_any_communication():
    from helpers.scale.ring_attention import full_attention_reference, ring_attention
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="q, k, v have shapes"):
        ring_attention(q, q[:, :, :3], q, zigzag=True)
    with pytest.raises(ValueError, match="q, k, v have shapes"):
        ring_attention(q[0], q[0], q[0], zigzag=True)
    with pytest.raises((ValueError, TypeError), match="zigzag"):
        ring_attention(q, q, q, zigzag="yes")
    with pytest.raises(ValueError, match="shape is"):
        full_attention_reference((1, 2, 4))
    with pytest.raises(ValueError, match="shape's N"):
        full_attention_reference((1, 2, 0, 8))


# Ring attention (helpers.scale.ring_attention) with its ranks as threads of this process
# (tests/ranks_in_threads.py), where mutmut sees the workers' code run: on 2 and 3 ranks, zig-zag or
# contiguous, causal or not, forward and backward equal PyTorch's scaled_dot_product_attention
# (float64); the work each rank does and the messages it sends, exactly; the pieces (block
# attention, the merge) against PyTorch's; every check read in full.

RING_SHAPE = (1, 2, 12, 4)  # B, H, N, D_H: 12 tokens split over 2 or 3 ranks, zig-zag or not


def expected_work(rank: int, p: int, zigzag: bool, causal: bool, c: int) -> int:
    mine = ra.chunk_ids(rank, p, zigzag)
    every = [chunk for r in range(p) for chunk in ra.chunk_ids(r, p, zigzag)]
    return c * c * sum(1 for qi in mine for ki in every if not causal or ki <= qi)


@pytest.mark.parametrize(("p", "zigzag", "causal"), [(3, True, True), (3, False, True), (3, False, False),
                                                     (2, True, False)])
def test_ring_attention_on_thread_ranks_is_full_attention(monkeypatch, p, zigzag, causal):
    ranks = ThreadRanks(p).patch(monkeypatch, ra)
    results = ra.run_ring_attention(ThreadWorkers(ranks), RING_SHAPE, zigzag=zigzag, causal=causal, seed=2)
    reference = ra.full_attention_reference(RING_SHAPE, causal=causal, seed=2)
    c = RING_SHAPE[2] // (2 * p if zigzag else p)
    for rank, result in enumerate(results):
        for name in ("out", "q", "k", "v"):
            expected = ra.split_sequence(reference[name], rank, p, zigzag)
            torch.testing.assert_close(result[name], expected, rtol=0, atol=1e-12)
        assert result["work"] == expected_work(rank, p, zigzag, causal, c)
        left, right = (rank - 1) % p, (rank + 1) % p
        # p - 1 steps forward (to rank + 1), then the gradients p - 1 steps back (to rank - 1)
        assert [call for r, call in ranks.calls if r == rank] == (
            [f"send to {right}", f"recv from {left}"] * (p - 1) + [f"send to {left}", f"recv from {right}"] * (p - 1))
    assert not torch.equal(reference["out"], ra.full_attention_reference(RING_SHAPE, causal=not causal, seed=2)["out"])


def test_the_default_is_causal_zigzag_with_seed_0(monkeypatch):
    ranks = ThreadRanks(2).patch(monkeypatch, ra)
    results = ra.run_ring_attention(ThreadWorkers(ranks), RING_SHAPE)
    reference = ra.full_attention_reference(RING_SHAPE)
    explicit = ra.full_attention_reference(RING_SHAPE, causal=True, seed=0)
    assert all(torch.equal(reference[n], explicit[n]) for n in reference)
    for rank, result in enumerate(results):
        torch.testing.assert_close(result["out"], ra.split_sequence(reference["out"], rank, 2, True),
                                   rtol=0, atol=1e-12)
        assert result["work"] == expected_work(rank, 2, True, True, 3)
    q, k, v = (ra.split_sequence(t, 0, 1, False) for t in ra._inputs(RING_SHAPE, 0)[:3])
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
    with pytest.raises(ValueError, match=full(message)):
        ra.block_attention(q, torch.zeros(1, 1, 2, 3), q, False)
    for bad in ((q[0], q, q), (q, q[0], q[0]), (q, q, torch.zeros(1, 1, 3, 4))):
        with pytest.raises(ValueError, match="^q "):
            ra.block_attention(*bad, False)
    with pytest.raises(ValueError, match=re.escape("o_b (2, 4) and lse_b (3,): expected (..., c, D_H) and (..., c)")):
        ra.merge_partial(None, None, torch.zeros(2, 4), torch.zeros(3))
    message = ("q, k, v have shapes [(1, 1, 2, 4), (1, 1, 2), (1, 1, 2, 4)], expected three equal "
               "(B, H, n, D_H): this rank's slice of the sequence")
    with pytest.raises(ValueError, match=full(message)):
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
        ra.full_attention_reference(RING_SHAPE, causal="no")
    with pytest.raises(TypeError, match="^causal is "):
        ra.run_ring_attention(Workers(2), RING_SHAPE, causal="no")
    with pytest.raises(TypeError, match="^workers is a str, expected a Workers$"):
        ra.run_ring_attention("pool", RING_SHAPE)
    with pytest.raises(TypeError, match="^workers is a NoneType, expected a Workers$"):
        ra.run_ring_attention(None, RING_SHAPE)
    pool = Workers(2)
    with pytest.raises(TypeError, match="^zigzag is "):
        ra.run_ring_attention(pool, RING_SHAPE, zigzag=None)
    with pytest.raises(ValueError, match="^shape's D_H is 0"):
        ra.run_ring_attention(pool, (1, 2, 12, 0))
    assert pool.processes == []


def test_the_worker_defaults_to_causal_attention_from_seed_0(monkeypatch):
    results = ThreadRanks(2).patch(monkeypatch, ra).run(ra.ring_attention_worker, RING_SHAPE, True)
    reference = ra.full_attention_reference(RING_SHAPE, causal=True, seed=0)
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
