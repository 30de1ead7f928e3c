"""The grader's hidden round shows every exercise inputs the visible check did not (issue 50).

An answer that hard-codes what the visible check returned passes the visible check; it must fail
the hidden round, which reruns the checker with SEED_OFFSET != 0. That only works when the
checker's inputs change with the offset, so each exercise is asked here for the first inputs it
hands the student in both rounds.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

import helpers.lab.exercises as exercises
from helpers.lab.exercises import GradeFailed, grader
from helpers.lab.exercises import distributed as distributed_checkers

HIDDEN = grader.DEFAULT_HIDDEN_SEED

# Exercises whose first call cannot differ, and why the hidden round still shows new inputs.
KNOWN_SAME_FIRST_CALL = {
    "attention.attention_layer": "the first call builds the layer with the sizes the task states "
                                 "(d_in, d_k, d_v); every input of its forward is drawn through seeded",
}

# Checkers that run the answer on worker processes: their inputs are read where they are handed
# to the workers, not by calling a stand-in answer.
ON_WORKERS = ("distributed.fsdp_grad_piece", "distributed.ring_all_reduce")


def _first_call(name: str, offset: int, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """(args, kwargs) of the first call the checker `name` makes to the answer under `offset`."""
    calls: list[tuple] = []

    def student(*args, **kwargs):
        calls.append((args, kwargs))
        raise NotImplementedError

    class Student:
        def __init__(self, *args, **kwargs):
            calls.append((args, kwargs))
            raise NotImplementedError

    with monkeypatch.context() as patch:
        patch.setattr(exercises, "SEED_OFFSET", offset)
        exercises.evaluate(name, student, time_limit=None)
        if not calls:  # the exercise asks for a class
            exercises.evaluate(name, Student, time_limit=None)
    assert calls, f"{name} never called the answer"
    return calls[0]


def _inputs_on_workers(name: str, offset: int, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """The tensors the checker `name` hands to its worker processes under `offset`."""
    handed: list[list[torch.Tensor]] = []

    def workers(student, tensors, on_timeout):
        handed.append(tensors)
        raise NotImplementedError

    def answer(rank, world_size, tensors):
        return tensors[rank]

    with monkeypatch.context() as patch:
        patch.setattr(exercises, "SEED_OFFSET", offset)
        patch.setattr(distributed_checkers, "run_on_three", workers)
        exercises.evaluate(name, answer, time_limit=None)
    assert handed, f"{name} never handed tensors to its workers"
    return handed[0]


def _same(a, b) -> bool:
    """True when two recorded inputs are equal, tensors by shape, dtype and value."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.nn.Module):
        return isinstance(b, torch.nn.Module) and _same(list(a.state_dict().values()),
                                                        list(b.state_dict().values()))
    return type(a) is type(b) and a == b


CALLED = sorted(set(exercises.all_exercises()) - set(ON_WORKERS) - set(KNOWN_SAME_FIRST_CALL))


@pytest.mark.parametrize("name", CALLED)
def test_the_hidden_round_calls_the_answer_on_other_inputs(name, monkeypatch):
    visible, hidden = _first_call(name, 0, monkeypatch), _first_call(name, HIDDEN, monkeypatch)
    assert not _same(visible, hidden), f"{name} hands the answer {visible!r:.200} in both rounds"


@pytest.mark.parametrize("name", ON_WORKERS)
def test_the_hidden_round_hands_the_workers_other_tensors(name, monkeypatch):
    visible = _inputs_on_workers(name, 0, monkeypatch)
    hidden = _inputs_on_workers(name, HIDDEN, monkeypatch)
    assert [t.shape for t in visible] == [t.shape for t in hidden]  # the sizes the task states
    assert not _same(visible, hidden)


def test_the_known_exceptions_are_exercises_still():
    assert set(KNOWN_SAME_FIRST_CALL) | set(ON_WORKERS) <= set(exercises.all_exercises())


# --- an answer that replays the visible check's outputs fails the hidden round --------------------

def count_pairs(ids):
    return dict(Counter(zip(ids, ids[1:], strict=False)))


def padding_mask(lengths, n, side="right"):
    right = torch.arange(n)[None, :] < lengths[:, None]
    return right if side == "right" else right.flip(-1)


def ring_bytes(n_bytes, world_size):
    return 2 * (world_size - 1) / world_size * n_bytes


def split_heads(x, n_heads):
    batch, tokens, features = x.shape
    return x.view(batch, tokens, n_heads, features // n_heads).transpose(1, 2)


def source_key_mask(source, pad_id):
    return (source != pad_id)[:, None, None, :]


def rotate_pair(a, b, position, theta):
    angle = torch.tensor(position * theta, dtype=torch.float64)
    return (a * angle.cos() - b * angle.sin()).item(), (a * angle.sin() + b * angle.cos()).item()


REPLAYED = [("tokenization.count_pairs", count_pairs), ("masking.padding_mask", padding_mask),
            ("distributed.ring_bytes", ring_bytes), ("multihead_attention.split_heads", split_heads),
            ("encoders.source_key_mask", source_key_mask), ("modern_decoder.rotate_pair", rotate_pair)]


def replaying(name: str, answer):
    """An answer that returns, call by call, what `answer` returned in the visible check of `name`
    (as a student who saved the check's outputs would hand in), whatever the input."""
    outputs = []

    def record(*args, **kwargs):
        outputs.append(answer(*args, **kwargs))
        return outputs[-1]

    assert exercises.passes(name, record)
    replay = iter(list(outputs))

    def replayed(*args, **kwargs):
        return copy.deepcopy(next(replay))

    return replayed


@pytest.mark.parametrize("name, answer", REPLAYED, ids=[name for name, _ in REPLAYED])
def test_the_answer_passes_both_rounds(name, answer):
    assert exercises.passes(name, answer)
    grader.hidden_check(name, answer, {"check": exercises.check})


@pytest.mark.parametrize("name, answer", REPLAYED, ids=[name for name, _ in REPLAYED])
def test_replaying_the_visible_outputs_fails_the_hidden_round(name, answer):
    assert exercises.passes(name, replaying(name, answer))  # the visible check is fooled
    with pytest.raises(GradeFailed, match="hidden tests, on inputs you have not seen"):
        grader.hidden_check(name, replaying(name, answer), {})
