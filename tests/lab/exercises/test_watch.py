"""The watch sees what an answer calls, whatever name it was captured under
(helpers/lab/exercises/watch.py): the course's own code and forbidden library calls are refused
by name, building blocks and the checker's own work are not; its TensorLog counts the tensors an
answer makes."""

from __future__ import annotations

import functools
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

import helpers.lab.exercises as exercises
from helpers.lab.exercises import ExerciseFailed, exercise, watch
from helpers.lab.exercises.watch import TensorLog
from helpers.model import attention as course_attention
from helpers.model.attention import softmax as course_softmax


def test_the_tensor_log_counts_operations_and_the_largest_tensor():
    x = torch.randn(6, 5)
    with TensorLog() as log:
        y = x @ x.T
        y.sum()
    assert log.largest == 36 and log.largest_shape == (6, 6) and log.operations >= 3


@exercise(hint="take the log-softmax yourself", forbidden=("torch.nn.functional.cross_entropy",))
def own_loss(fn):
    logits, target = torch.tensor([[2.0, 0.5], [0.1, 0.3]]), torch.tensor([0, 1])
    expected = -(logits.log_softmax(-1)[torch.arange(2), target]).mean()
    if not torch.allclose(fn(logits, target), expected):
        raise ExerciseFailed("wrong loss")


@exercise(hint="exp over the row sum")
def rows(fn):
    x = torch.randn(3, 4, generator=exercises.seeded(0), dtype=torch.float64)
    expected = course_softmax(x)  # the checker may use the course's code: that is not the student's call
    if not torch.allclose(fn(x), expected):
        raise ExerciseFailed("wrong rows")


def mine(x):
    exps = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return exps / exps.sum(dim=-1, keepdim=True)


def evaluate(name, answer):
    return exercises.evaluate(f"test_watch.{name}", answer, time_limit=None)


def test_an_own_answer_passes_although_the_checker_calls_the_course():
    passed, said = evaluate("rows", mine)
    assert passed, said


@pytest.mark.parametrize("answer", [
    course_softmax,                                   # the course's function handed in as it is
    lambda x: course_softmax(x),                      # called by name
    lambda x: course_attention.softmax(x),            # called through its module
    functools.partial(course_softmax),                # a partial of it
    lambda x: functools.reduce(lambda a, f: f(a), [course_softmax], x),  # called from C
], ids=["as-is", "by-name", "module", "partial", "from-c"])
def test_an_answer_that_calls_the_course_is_refused_by_name(answer):
    passed, said = evaluate("rows", answer)
    assert not passed
    assert "helpers.model.attention.softmax" in said and "the course's own code" in said


def test_a_name_captured_before_the_check_does_not_hide_a_forbidden_call():
    captured = F.cross_entropy  # as a student's earlier cell would: `_ce = F.cross_entropy`
    passed, said = evaluate("own_loss", lambda logits, target: captured(logits, target))
    assert not passed and "F.cross_entropy" in said and "write yourself" in said
    by_module = evaluate("own_loss", lambda logits, target: torch.nn.CrossEntropyLoss()(logits, target))
    assert not by_module[0] and "F.cross_entropy" in by_module[1]
    passed, said = evaluate("own_loss", lambda logits, target:
                            -(logits.log_softmax(-1)[torch.arange(2), target]).mean())
    assert passed, said


@pytest.mark.parametrize("answer", [
    lambda x: torch.special.softmax(x, -1),
    lambda x: torch.log_softmax(x, -1).exp(),
    lambda x: x.log_softmax(-1).exp(),
    lambda x: F.softmax(x, dim=-1),
    lambda x: torch.nn.Softmax(dim=-1)(x),
], ids=["special", "log-exp", "method", "F", "module"])
def test_every_library_softmax_is_refused_where_the_student_writes_it(answer):
    passed, said = exercises.evaluate("attention.stable_softmax", answer, time_limit=None)
    assert not passed and "softmax" in said and "write yourself" in said, said


def test_a_subclass_of_the_courses_class_is_refused():
    from helpers.training.by_hand import HandAdamW

    class MyAdamW(HandAdamW):
        pass

    passed, said = exercises.evaluate("gpt.hand_adamw", MyAdamW, time_limit=None)
    assert not passed and "helpers.training.by_hand.HandAdamW" in said, said

    class Borrowed:
        __init__ = HandAdamW.__init__
        step = HandAdamW.step

    passed, said = exercises.evaluate("gpt.hand_adamw", Borrowed, time_limit=None)
    assert not passed and "helpers.training.by_hand.HandAdamW." in said, said


def test_a_checkers_own_code_is_refused_as_an_answer():
    from helpers.lab.exercises import masking

    def via_checker(scores):
        n_q, n_k = scores.shape[-2:]
        return course_softmax(scores.masked_fill(~masking._causal_variants(n_q, n_k)["right"], float("-inf")))

    passed, said = exercises.evaluate("masking.causal_softmax", via_checker, time_limit=None)
    assert not passed and "helpers.lab.exercises.masking._causal_variants" in said, said


def test_a_forbidden_call_in_a_thread_the_answer_starts_is_seen():
    def threaded(x):
        out = {}
        worker = threading.Thread(target=lambda: out.setdefault("y", course_softmax(x)))
        worker.start()
        worker.join()
        return out["y"]

    passed, said = evaluate("rows", threaded)
    assert not passed and "helpers.model.attention.softmax" in said


def test_the_watch_puts_back_a_profiler_that_was_running():
    calls = []

    def profiler(frame, event, arg):
        calls.append(event)

    sys.setprofile(profiler)
    try:
        evaluate("rows", mine)
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)


def test_reading_a_property_of_a_course_object_is_not_a_call_of_the_course():
    from helpers.model.gpt import GPTConfig

    config = GPTConfig(vocab_size=11, context_length=8, d_model=16, n_heads=2, n_layers=1)
    with_property = [name for name, value in vars(GPTConfig).items() if isinstance(value, property)]
    seen = watch.Watch(watch.Forbidden(()), record=True)
    with seen:
        for name in with_property:
            getattr(config, name)
    assert seen.seen == set()


def test_files_are_told_apart():
    assert watch.kind_of_file(watch.__file__) == watch.COURSE
    assert watch.kind_of_file(torch.__file__) == watch.LIBRARY
    assert watch.kind_of_file(__file__) == watch.STUDENT
    assert watch.kind_of_file("/tmp/ipykernel_1/123.py") == watch.STUDENT
    assert watch.kind_of_file("<string>") == watch.LIBRARY


def test_a_forbidden_name_that_does_not_exist_is_refused_when_declared():
    with pytest.raises(ValueError, match="torch.no_such_softmax"):
        watch.Forbidden(("torch.no_such_softmax",))


def test_what_an_answer_reaches_by_name_is_seen_where_no_profiler_follows():
    from helpers.scale import workers

    def imports_it(rank, world_size, tensors):
        from helpers.scale.workers import ring_all_reduce
        return ring_all_reduce(rank, world_size, tensors)

    def through_module(rank, world_size, tensors):
        return workers.ring_all_reduce(rank, world_size, tensors)

    def through_own_helper(rank, world_size, tensors):
        return imports_it(rank, world_size, tensors)

    def own(rank, world_size, tensors):
        return sum(tensors)

    for answer in (imports_it, through_module, through_own_helper):
        assert watch.reached_by_name(answer) == "helpers.scale.workers.ring_all_reduce", answer
    assert watch.reached_by_name(own) is None


def test_a_forbidden_decorated_function_is_known_by_its_own_code_not_its_decorators():
    from helpers.model.layers import init_gpt2_

    @torch.no_grad()
    def my_init(blocks):
        return blocks

    forbidden = watch.Forbidden(("helpers.model.layers.init_gpt2_",))
    assert forbidden.code(my_init.__code__) is None  # torch.no_grad's wrapper, shared by both
    assert forbidden.code(init_gpt2_.__wrapped__.__code__) == "helpers.model.layers.init_gpt2_"


def test_the_watch_refuses_bad_arguments_by_name():
    with pytest.raises(TypeError, match="filename must be a str"):
        watch.kind_of_file(3)
    with pytest.raises(TypeError, match="code must be a code object"):
        watch.course_name("softmax")
    with pytest.raises(ValueError, match="is not the course's"):
        watch.course_name(mine.__code__)
    for dotted in ("softmax", 3, ""):
        with pytest.raises(ValueError, match="dotted must be a dotted name"):
            watch.resolve(dotted)
    with pytest.raises(ValueError, match="exercise must be a name like"):
        watch.stand_in(course_softmax, "softmax")
    with pytest.raises(TypeError, match="helper must be a function or a class"):
        watch.stand_in(3, "masking.causal_softmax")
    with pytest.raises(TypeError, match="forbidden must be a Forbidden"):
        watch.Watch(("torch.softmax",))
    with pytest.raises(TypeError, match="answer must be a class"):
        watch.inherited_course_code(mine)
    with pytest.raises(TypeError, match="answer must be a function"):
        watch.reached_by_name(3)
    for mark in (watch.mark_boundary, watch.mark_checker):
        with pytest.raises(TypeError, match="function must be a Python function"):
            mark(print)
