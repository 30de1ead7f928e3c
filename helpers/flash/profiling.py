"""Measuring the peak CPU memory of a call with torch's profiler (notebook 8, section 7).

    peak_memory_bytes(fn)   the most bytes of CPU tensor memory `fn()` held at once

A side concern, kept away from the model code: it reads the profiler's allocation events and
silences the log lines the profiler's C++ side writes to the process's stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Send file descriptor 2 to /dev/null: the profiler's C++ side logs a time-stamped line to
    it on every start and stop, which would land in a notebook's output."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory_bytes(fn: Callable[[], Any]) -> int:
    """The most bytes of CPU tensor memory that `fn()` held at once, beyond what existed before.

    torch's profiler (profile_memory=True) records every allocation and free of PyTorch's CPU
    allocator, with the allocator's running total, including the scratch buffers that kernels
    such as F.scaled_dot_product_attention allocate inside C++. The peak of that total during the
    call, minus the total at its start, is deterministic: it depends on tensor sizes, not timing.
    """
    if not callable(fn):
        raise TypeError(f"fn is {fn!r} (a {type(fn).__name__}), expected a function to call with "
                        "no arguments, e.g. lambda: attention(q, k, v)")
    from torch.profiler import ProfilerActivity, profile

    with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU],
                                            profile_memory=True) as prof:
        fn()
    allocations = sorted(_allocation_events(prof), key=lambda event: event[0])
    if not allocations:
        return 0
    _, first_total, first_size = allocations[0]
    start_total = first_total - first_size
    return max(total for _, total, _ in allocations) - start_total


def _allocation_events(prof: Any) -> list[tuple[int, int, int]]:
    """(time ns, allocator total after the event, bytes allocated (+) or freed (-)) per event."""
    from torch._C._profiler import _EventType

    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            fields = node.extra_fields
            events.append((node.start_time_ns, fields.total_allocated, fields.alloc_size))
        stack.extend(node.children)
    return events
