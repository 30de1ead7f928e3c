"""Notebooks 8-11's core exercises: another correct formulation passes, and each common wrong
variant is named (the tiled backward's D and dS, the modern block, BERT's 80/10/10, the ring
all-reduce on real worker processes)."""

from __future__ import annotations

import linecache
import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from helpers.families.mlm import IGNORE, mask_tokens
from helpers.lab.exercises import evaluate
from helpers.lab.exercises.flash_attention import (
    ALGORITHM_1_MISTAKES,
    BACKWARD_MISTAKES,
    algorithm_1_variant,
    backward_variant,
)
from helpers.lab.exercises.modern_decoder import BLOCK_MISTAKES, modern_block_variant
from helpers.model import modern
from helpers.model.multihead import split_heads

# --- notebook 8: the tiled backward --------------------------------------------------------------


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


# --- notebook 8: Algorithm 1 ----------------------------------------------------------------------


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


# --- notebook 9: the modern block ----------------------------------------------------------------


def block_with_the_helpers(block, x, table):
    """Right, but from the course's own pieces (rms_norm, rope_rotate_half, attend): the exercise
    asks for the block from its weights, so the grade refuses it by name (issue 50)."""
    h = modern.rms_norm(x, block.norm1.weight, block.norm1.eps)
    q = modern.rope_rotate_half(split_heads(block.attn.q_proj(h), block.attn.n_heads), table)
    k, v = block.attn.project_keys_values(h)
    x = x + block.attn.attend(q, modern.rope_rotate_half(k, table), v, causal=True)
    h = modern.rms_norm(x, block.norm2.weight, block.norm2.eps)
    return x + block.mlp.down(F.silu(block.mlp.gate(h)) * block.mlp.up(h))


def test_the_modern_block_checker_refuses_the_helpers_and_names_each_mistake():
    passed, said = evaluate("modern_decoder.modern_block", block_with_the_helpers)
    assert not passed and "helpers.model.modern.rms_norm" in said
    assert evaluate("modern_decoder.modern_block", block_with_the_helpers, watched=False)[0]  # yet right
    for mistake, message in BLOCK_MISTAKES.items():
        passed, said = evaluate("modern_decoder.modern_block",
                                lambda b, x, t, m=mistake: modern_block_variant(b, x, t, m), watched=False)
        assert not passed and message in said, mistake
    passed, said = evaluate("modern_decoder.modern_block", lambda b, x, t: x)
    assert not passed and "wrong values" in said


# --- notebook 10: BERT's corruption --------------------------------------------------------------


def corrupt(mask_share=0.8, random_share=0.1, labels_everywhere=False, pick_padding=False,
            first_random=None, seeded=True, rate_scale=1.0):
    """A mask_tokens answer with one knob turned away from BERT's recipe."""
    def answer(ids, mask_id, vocab_size, first_word_id, generator, rate=0.15, pad_id=0):
        gen = generator if seeded else None
        real = torch.ones_like(ids, dtype=torch.bool) if pick_padding else ids != pad_id
        picked = (torch.rand(ids.shape, generator=gen) < rate * rate_scale) & real
        labels = ids.clone() if labels_everywhere else ids.masked_fill(~picked, IGNORE)
        roll = torch.rand(ids.shape, generator=gen)
        low = first_word_id if first_random is None else first_random
        words = torch.randint(low, vocab_size, ids.shape, generator=gen)
        inputs = ids.masked_fill(picked & (roll < mask_share), mask_id)
        inputs = torch.where(picked & (roll >= mask_share) & (roll < mask_share + random_share), words, inputs)
        return inputs, labels
    return answer


@pytest.mark.parametrize("answer, words", [
    (corrupt(mask_share=0.9), "proportions are off: of the picked tokens you made <mask> 90%, random 10%, kept 0%"),
    (corrupt(random_share=0.2), "80 % / random 10 % / keep 10 % proportions are off"),
    (corrupt(labels_everywhere=True), "labels are the ids everywhere"),
    (corrupt(pick_padding=True), "padding positions were picked"),
    (corrupt(first_random=0), "special tokens"),
    (corrupt(seeded=False), "generator=generator"),
    (corrupt(rate_scale=0.5), "of the real tokens were picked, expected about 15 %"),
])
def test_the_masking_checker_names_the_wrong_recipe(answer, words):
    passed, said = evaluate("encoders.mask_tokens", answer)
    assert not passed and words in said


def test_the_masking_checker_refuses_the_course_and_accepts_another_draw_order():
    passed, said = evaluate("encoders.mask_tokens", mask_tokens)
    assert not passed and "helpers.families.mlm.mask_tokens" in said

    def split_first(ids, mask_id, vocab_size, first_word_id, generator, rate=0.15, pad_id=0):
        roll = torch.rand(ids.shape, generator=generator)        # the split first, then the pick
        picked = (torch.rand(ids.shape, generator=generator) < rate) & (ids != pad_id)
        words = torch.randint(first_word_id, vocab_size, ids.shape, generator=generator)
        inputs = torch.where(picked & (roll >= 0.9), words, ids)  # the random 10 % at the top
        inputs = torch.where(picked & (roll < 0.8), torch.full_like(ids, mask_id), inputs)
        return inputs, torch.where(picked, ids, torch.full_like(ids, IGNORE))
    assert evaluate("encoders.mask_tokens", split_first)[0]


# --- notebook 11: the ring all-reduce, from a notebook cell, on real workers ---------------------

CELL = '''
import torch
import torch.distributed as dist


def solution(rank, world_size, tensors):
    p = world_size
    chunks = list(tensors[rank].flatten().clone().tensor_split(p))

    def exchange(send, receive):  # a nested function travels inside its function's source
        incoming = torch.empty_like(chunks[receive])
        request = dist.isend(chunks[send].contiguous(), (rank + 1) % p)
        dist.recv(incoming, (rank - 1) % p)
        request.wait()
        return incoming

    for s in range(p - 1):
        chunks[(rank - s - 1) % p] = chunks[(rank - s - 1) % p] + exchange((rank - s) % p, (rank - s - 1) % p)
    for s in range(p - 1):
        chunks[(rank - s) % p] = exchange((rank + 1 - s) % p, (rank - s) % p)
    return torch.cat(chunks).reshape(tensors[rank].shape)


def own(rank, world_size, tensors):
    return tensors[rank].clone()


def mean(rank, world_size, tensors):
    return solution(rank, world_size, tensors) / world_size


def scatter_only(rank, world_size, tensors):
    p = world_size
    chunks = list(tensors[rank].flatten().clone().tensor_split(p))
    for s in range(p - 1):
        incoming = torch.empty_like(chunks[(rank - s - 1) % p])
        request = dist.isend(chunks[(rank - s) % p].contiguous(), (rank + 1) % p)
        dist.recv(incoming, (rank - 1) % p)
        request.wait()
        chunks[(rank - s - 1) % p] += incoming
    return torch.cat(chunks)


def collective(rank, world_size, tensors):
    total = tensors[rank].clone()
    dist.all_reduce(total)
    return total


def stub(rank, world_size, tensors):
    """Not written yet."""
    raise NotImplementedError
'''


@pytest.fixture(scope="module")
def cell():
    """CELL run as a notebook cell is: a module named __main__ without a file, its source kept in
    linecache (as IPython keeps it), so that the workers receive these functions as source."""
    filename = "<ipython-input-11-ring>"
    linecache.cache[filename] = (len(CELL), None, CELL.splitlines(True), filename)
    module = types.ModuleType("__main__")
    exec(compile(CELL, filename, "exec"), module.__dict__)
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = module
    yield module
    sys.modules["__main__"] = saved
    from helpers.lab.exercises import _ranks
    for pool in _ranks._POOL:
        pool.close()


def test_the_ring_checker_runs_a_cell_function_on_three_workers_and_names_mistakes(cell):
    passed, said = evaluate("distributed.ring_all_reduce", cell.solution, time_limit=120)
    assert passed, said
    for name, words in [("own", "its own tensor unchanged"), ("mean", "returned the mean"),
                        ("scatter_only", "the all-gather phase is missing")]:
        passed, said = evaluate("distributed.ring_all_reduce", getattr(cell, name), time_limit=120)
        assert not passed and words in said, name


def test_the_ring_checker_refuses_a_collective_and_knows_a_stub_without_starting_processes(cell):
    passed, said = evaluate("distributed.ring_all_reduce", cell.collective)
    assert not passed and "build it from point-to-point sends" in said
    passed, said = evaluate("distributed.ring_all_reduce", cell.stub)
    assert not passed and "not attempted yet" in said


def test_an_exercise_may_ask_for_more_time_than_the_default():
    import time as clock

    from helpers.lab.exercises import exercise

    @exercise(hint="wait", task="Write nothing. The check waits.", time_limit=5.0)
    def slow_checker(fn):
        clock.sleep(0.3)

    @exercise(hint="wait", task="Write nothing. The check waits.")
    def quick_checker(fn):
        clock.sleep(0.3)

    assert evaluate("test_core_exercises_middle.slow_checker", None, time_limit=0.1)[0]
    passed, said = evaluate("test_core_exercises_middle.quick_checker", None, time_limit=0.1)
    assert not passed and "did not return within 0.1 s" in said
