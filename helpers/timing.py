"""Wall-clock timing for notebooks and benchmarks.

Notebooks print every time as "took 12.3 ms": the tests' nbval sanitiser recognises exactly that
form, so a stored notebook still compares equal when the machine is faster or slower.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


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
