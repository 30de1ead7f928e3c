"""Wall-clock timing for notebooks and benchmarks.

Notebooks print every time as "took 12.3 ms": the tests' nbval sanitiser recognises exactly that
form, so a stored notebook still compares equal when the machine is faster or slower.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from helpers import checks


def format_duration(seconds: float) -> str:
    """'took 850 µs', 'took 12.3 ms', 'took 4.20 s' or 'took 2.5 min'."""
    if seconds < 1e-3:
        return f"took {seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"took {seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"took {seconds:.2f} s"
    return f"took {seconds / 60:.1f} min"


def best_time(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> float:
    """The fastest of `repeats` calls of `fn`, in seconds, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def times_in_turns(steps: dict[str, Callable[[], Any]], rounds: int, steps_per_turn: int,
                   warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each of `steps` (a name -> a training step), timed in turns for an
    equal-time comparison: each round runs every step `steps_per_turn` times, the order rotated
    by one each round, after `warmup` untimed calls each (first calls allocate). Returns one
    time per round for each name, in round order: compare within a round (its turns seconds
    apart), where a burst of load on a shared machine slows every turn alike."""
    if not (isinstance(steps, dict) and steps and all(callable(fn) for fn in steps.values())):
        raise TypeError(f"steps is {steps!r:.60}, expected a non-empty dict of names to functions")
    checks.positive_int("rounds", rounds)
    checks.positive_int("steps_per_turn", steps_per_turn)
    checks.non_negative_int("warmup", warmup)
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            started = time.perf_counter()
            for _ in range(steps_per_turn):
                steps[name]()
            seconds[name].append((time.perf_counter() - started) / steps_per_turn)
    return seconds
