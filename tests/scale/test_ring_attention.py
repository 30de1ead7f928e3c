"""Ring attention on 2 real processes: equal to full attention forward and backward (float64),
zig-zag balancing the causal work; sequence lengths the world does not divide refused first."""

from __future__ import annotations

import pytest
import torch

from helpers.flash.tiled import log_sum_exp, merge_softmax_states, softmax_state
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
def test_ring_attention_equals_full_attention_forward_and_backward(workers, zigzag, causal):
    results = run_ring_attention(workers, SHAPE, zigzag=zigzag, causal=causal)
    reference = full_attention_reference(SHAPE, causal=causal)
    for rank, result in enumerate(results):
        for name in ("out", "q", "k", "v"):
            expected = split_sequence(reference[name], rank, 2, zigzag)
            gap = (result[name] - expected).abs().max().item()
            assert gap < 1e-6, (rank, name, gap)
    assert (results[0]["k"] - split_sequence(reference["k"], 1, 2, zigzag)).abs().max() > 1e-3


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

    assert evaluate("distributed.ring_merge", merge_partial)[0]
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
