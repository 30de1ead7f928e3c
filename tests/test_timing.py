"""helpers.timing.times_in_turns: the equal-time comparison the benchmarks share."""

from __future__ import annotations

import pytest

from helpers.timing import times_in_turns


def test_times_in_turns_rotates_the_order_and_times_each_turn():
    calls: list[str] = []
    steps = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    seconds = times_in_turns(steps, rounds=3, steps_per_turn=2, warmup=1)
    assert calls[:3] == ["a", "b", "c"]  # one untimed warm-up call each
    turns = calls[3::2]  # each turn is two calls of one step
    assert turns == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {name: len(times) for name, times in seconds.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(t >= 0 for times in seconds.values() for t in times)


@pytest.mark.parametrize("args, error, said", [
    (({}, 1, 1), TypeError, r"^steps is \{\}, expected a non-empty dict"),
    (({"a": 3}, 1, 1), TypeError, "expected a non-empty dict of names to functions"),
    (({"a": print}, 0, 1), ValueError, "^rounds is 0"),
    (({"a": print}, 1, 0), ValueError, "^steps_per_turn is 0"),
])
def test_times_in_turns_refuses_bad_input_naming_it(args, error, said):
    with pytest.raises(error, match=said):
        times_in_turns(*args)
