"""The package's own machinery (helpers/lab/exercises/__init__.py): `check` and `evaluate` give up on
an answer that never returns, refuse a float count, and say what to write while an exercise is
not attempted."""

from __future__ import annotations

import helpers.lab.exercises as exercises
from helpers.lab.exercises import evaluate


def test_check_refuses_a_float_count(capsys):
    def as_float(n_layers: int, d_model: int, vocab_size: int, context_length: int) -> float:
        d = d_model
        return float(n_layers * (12 * d * d + 13 * d) + vocab_size * d + context_length * d + 2 * d)

    assert not exercises.passes("gpt.exact_parameters", as_float)
    exercises.check("gpt.exact_parameters", as_float)
    assert "should be an int, but it is a float" in capsys.readouterr().out
    assert exercises.passes("gpt.exact_parameters", lambda *args: int(as_float(*args)))
    assert not exercises.passes("multihead_attention.kv_cache_bytes_per_token",
                                lambda n, h, d, b: 2.0 * n * h * d * b)
    assert not exercises.passes("tokenization.count_pairs",
                                lambda ids: {pair: 1.0 for pair in zip(ids, ids[1:], strict=False)})


def test_an_exercise_may_ask_for_more_time_than_the_default():
    import time as clock

    from helpers.lab.exercises import exercise

    @exercise(hint="wait", task="Write nothing. The check waits.", time_limit=5.0)
    def slow_checker(fn):
        clock.sleep(0.3)

    @exercise(hint="wait", task="Write nothing. The check waits.")
    def quick_checker(fn):
        clock.sleep(0.3)

    assert evaluate("test_check.slow_checker", None, time_limit=0.1)[0]
    passed, said = evaluate("test_check.quick_checker", None, time_limit=0.1)
    assert not passed and "did not return within 0.1 s" in said


def test_not_attempted_messages_of_12_to_14_say_what_to_write_not_the_recipe():
    from helpers.lab.exercises import all_exercises

    recipes = ["torch.", "topk", "logsigmoid", "clamp", "min(1", "max(0", "// ", "% ", "einsum", "127"]
    late = {n: e for n, e in all_exercises().items()
            if n.split(".")[0] in ("frontier_decoder", "post_training", "serving")}
    assert len(late) >= 12  # 12 after the reveal era; notebooks 12, 13 and 14 gained core exercises
    for name, ex in late.items():
        assert ex.task.startswith("Write ") and "check" in ex.task, name
        assert not [r for r in recipes if r in ex.task], (name, ex.task)
