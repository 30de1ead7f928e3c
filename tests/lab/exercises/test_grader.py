"""The hidden tests decide the grade (helpers/lab/exercises/grader.py): they trust nothing the
notebook could have changed, they fail an answer that only reproduces what the visible check
saw, and the hidden round shows every exercise inputs the visible check did not (issue 50)."""

from __future__ import annotations

import copy
import sys
from collections import Counter

import pytest
import torch

import helpers.lab.exercises as exercises
from helpers.lab.exercises import GradeFailed, grader
from helpers.lab.exercises import distributed as distributed_checkers
from helpers.model.attention import softmax as course_softmax


def causal_softmax(scores):
    """A correct causal softmax, written as a student would."""
    n_q, n_k = scores.shape[-2:]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool).tril(diagonal=n_k - n_q)
    scores = scores.masked_fill(~allowed, float("-inf"))
    exps = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return exps / exps.sum(dim=-1, keepdim=True)


def hard_coded_from(visible_answer):
    """An answer that replays, call by call, what a correct answer returned in the visible check
    (as a student who saved the check's outputs would hand in), whatever the input."""
    outputs = []

    def record(scores):
        outputs.append(visible_answer(scores))
        return outputs[-1]

    assert exercises.passes("masking.causal_softmax", record)
    replay = iter(list(outputs))

    def replayed(scores):
        return next(replay).clone()

    return replayed


def test_a_correct_answer_passes_the_hidden_tests(capsys):
    grader.hidden_check("masking.causal_softmax", causal_softmax, {"check": exercises.check})
    assert capsys.readouterr().out == ""  # silent outside the grader: the stored outputs stay


def test_under_the_grader_a_pass_says_so(monkeypatch, capsys):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    grader.hidden_check("masking.causal_softmax", causal_softmax, {"check": exercises.check})
    assert "hidden tests pass" in capsys.readouterr().out


def test_an_answer_that_replays_the_visible_outputs_fails_the_hidden_tests():
    replayed = hard_coded_from(causal_softmax)
    assert exercises.passes("masking.causal_softmax", replayed)  # the visible check is fooled
    with pytest.raises(GradeFailed, match="hidden tests, on inputs you have not seen"):
        grader.hidden_check("masking.causal_softmax", hard_coded_from(causal_softmax), {})


def test_a_redefined_or_wrapped_check_scores_zero():
    def check(name, answer):
        print("✅ correct!")

    with pytest.raises(GradeFailed, match="redefines or wraps `check`"):
        grader.hidden_check("masking.causal_softmax", causal_softmax, {"check": check})
    wrapped = lambda *args: exercises.check(*args)  # noqa: E731
    with pytest.raises(GradeFailed, match="redefines or wraps `check`"):
        grader.hidden_check("masking.causal_softmax", causal_softmax, {"check": wrapped})


def test_a_patched_registry_does_not_pass_the_hidden_tests(monkeypatch):
    import dataclasses

    lenient = dataclasses.replace(exercises.get("masking.causal_softmax"), checker=lambda answer: "fine")
    monkeypatch.setitem(exercises._REGISTRY, "masking.causal_softmax", lenient)
    assert exercises.passes("masking.causal_softmax", lambda scores: scores)  # the notebook's copy is fooled
    with pytest.raises(GradeFailed, match="hidden tests"):
        grader.hidden_check("masking.causal_softmax", lambda scores: scores, {})
    assert sys.modules["helpers.lab.exercises"] is exercises  # the notebook's copy is put back


def test_a_patched_evaluate_scores_zero(monkeypatch):
    monkeypatch.setattr(exercises, "evaluate", lambda *args, **kwargs: (True, "✅ correct!"))
    with pytest.raises(GradeFailed, match="replaces helpers.lab.exercises.evaluate"):
        grader.hidden_check("masking.causal_softmax", lambda scores: scores, {})


def test_a_library_function_replaced_by_the_notebooks_code_scores_zero(monkeypatch):
    monkeypatch.setattr(torch, "allclose", lambda *args, **kwargs: True)
    with pytest.raises(GradeFailed, match="replaces torch.allclose"):
        grader.hidden_check("masking.causal_softmax", causal_softmax, {})


def test_the_hidden_round_still_refuses_the_courses_own_code():
    from helpers.model.attention import causal_mask

    def via_course(scores):
        n_q, n_k = scores.shape[-2:]
        return course_softmax(scores.masked_fill(~causal_mask(n_q, n_k), float("-inf")))

    with pytest.raises(GradeFailed, match="helpers.model.attention.causal_mask"):
        grader.hidden_check("masking.causal_softmax", via_course, {})


def test_the_grader_shows_the_message_alone():
    failure = GradeFailed("❌ x: wrong\n   How to fix it: do y")
    assert failure._render_traceback_() == ["❌ x: wrong\n   How to fix it: do y"]
    assert isinstance(failure, AssertionError)  # STRICT tests and old graders still see an assert


@pytest.mark.parametrize("said, expected", [("", grader.DEFAULT_HIDDEN_SEED), ("77", 77), ("-5", -5)])
def test_the_hidden_seed_comes_from_the_environment(monkeypatch, said, expected):
    monkeypatch.setenv("COURSE_HIDDEN_SEED", said)
    assert grader.hidden_seed() == expected


@pytest.mark.parametrize("said", ["0", "seven", "1.5"])
def test_a_hidden_seed_that_is_not_a_nonzero_whole_number_is_refused(monkeypatch, said):
    monkeypatch.setenv("COURSE_HIDDEN_SEED", said)
    with pytest.raises(ValueError, match="COURSE_HIDDEN_SEED"):
        grader.hidden_seed()


def test_an_unknown_exercise_is_the_notebooks_bug():
    with pytest.raises(KeyError, match="no_such"):
        grader.hidden_check("masking.no_such", causal_softmax, {})


def test_a_library_brought_by_the_submission_scores_zero(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_HELPERS", str(tmp_path / "helpers"))
    with pytest.raises(GradeFailed, match="may not bring a `helpers` of its own"):
        grader.hidden_check("masking.causal_softmax", causal_softmax, {})


def test_a_later_exercise_may_call_the_stand_in_of_an_earlier_one_but_not_its_own():
    from helpers.lab.exercises import watch
    from helpers.model.attention import causal_mask

    def via_mask(scores):
        n_q, n_k = scores.shape[-2:]
        allowed = causal_mask(n_q, n_k)
        exps = torch.exp(scores.masked_fill(~allowed, float("-inf")) - scores.amax(dim=-1, keepdim=True))
        return exps / exps.sum(dim=-1, keepdim=True)

    assert not exercises.passes("masking.causal_softmax", via_mask)
    saved = dict(watch.STAND_INS)
    try:
        watch.stand_in(causal_mask, "masking.padding_mask")  # as yours_or does after a failed answer
        assert exercises.passes("masking.causal_softmax", via_mask)
        grader.hidden_check("masking.causal_softmax", via_mask, {})
        watch.STAND_INS.clear()
        watch.stand_in(causal_mask, "masking.causal_softmax")  # its own exercise's stand-in: refused
        assert not exercises.passes("masking.causal_softmax", via_mask)
    finally:
        watch.STAND_INS.clear()
        watch.STAND_INS.update(saved)


def _course_callables() -> list[tuple[str, object]]:
    """Every function and class the student folder's `helpers` package defines, by dotted name."""
    import importlib
    import inspect
    import pkgutil

    import helpers

    found = {}
    for info in pkgutil.walk_packages(helpers.__path__, "helpers."):
        if info.name.endswith(("triton_kernels", "triton_attention")):
            continue  # imports triton; its functions are kernels, no exercise's answer
        module = importlib.import_module(info.name)
        for attribute, value in vars(module).items():
            if (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == info.name:
                found[f"{info.name}.{attribute}"] = value
    return sorted(found.items())


def test_no_function_in_the_student_folder_passes_an_exercise_unchanged():
    """Issue 50: whatever the course ships (helpers, fallbacks, checkers' variants) earns nothing as an
    answer: refused by name, or, for an exercise's own building blocks, wrong for that exercise."""
    passing = []
    callables = _course_callables()
    assert len(callables) > 300
    for name in sorted(exercises.all_exercises()):
        if name.startswith("test_"):
            continue
        for dotted, value in callables:
            if exercises.evaluate(name, value, time_limit=10)[0]:
                passing.append((name, dotted))
    assert passing == []


def test_the_hidden_round_reuses_the_sessions_worker_processes():
    """Notebook 11 keeps three worker processes for its checks: the hidden round's fresh import
    must run on them, not start three more (the notebook's memory would grow by a third)."""
    from helpers.lab.exercises import _ranks

    class FakePool:
        processes = True
        calls = 0

        def run(self, fn, tensors):
            FakePool.calls += 1
            raise TimeoutError

    def ring(rank, world_size, tensors):
        return tensors[rank]

    saved = list(_ranks._POOL)
    _ranks._POOL[:] = [FakePool()]
    try:
        with pytest.raises(GradeFailed, match="did not finish"):
            grader.hidden_check("distributed.ring_all_reduce", ring, {})
    finally:
        _ranks._POOL[:] = saved
    assert FakePool.calls == 1


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
