"""The hidden tests decide the grade (helpers/lab/exercises/grader.py): they trust nothing the
notebook could have changed, and they fail an answer that only reproduces what the visible check
saw."""

from __future__ import annotations

import sys

import pytest
import torch

import helpers.lab.exercises as exercises
from helpers.lab.exercises import GradeFailed, grader
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
