"""Several ranks in the pytest process: one thread per rank, on torch's in-process ("threaded")
process group, whose collectives add up the threads' tensors as gloo adds up processes' ones.

Why: a mutation tool (mutmut, benchmarks/mutation.py) counts a test for a function only when the
function runs in the pytest process, and helpers.scale.workers runs each rank in its own process.
A one-rank gloo group runs in-process but cannot tell rank 0's share from rank 1's, nor a sum over
ranks from a copy. Here every rank runs the workers' own code, in threads of this process.

The global random generator is one per process, so `locked(...)` wraps a function that seeds and
draws from it (make_model) so that one rank at a time seeds and builds.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.distributed import multi_threaded_pg

_SEEDING = threading.Lock()
_TURNS: weakref.WeakSet = weakref.WeakSet()  # every SeedTurns alive: a rank that leaves gives its turn back


def locked(function: Callable) -> Callable:
    """`function`, run by one thread at a time (it seeds and draws from the global generator)."""

    @functools.wraps(function)
    def one_at_a_time(*args: Any, **kwargs: Any) -> Any:
        with _SEEDING:
            return function(*args, **kwargs)

    return one_at_a_time


def run_ranks(world_size: int, task: Callable, *args: Any, timeout: float = 10.0) -> list:
    """task(rank, world_size, *args) on `world_size` threads, each the rank of one threaded
    process group; the results by rank. The first rank's exception is raised here, and a rank
    still waiting after `timeout` seconds in all (a rank that skipped a collective leaves the
    others waiting) raises TimeoutError."""
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    multi_threaded_pg._install_threaded_pg()
    store = dist.HashStore()
    results: list = [None] * world_size
    errors: list[tuple[int, BaseException]] = []

    def rank_main(rank: int) -> None:
        dist.init_process_group("threaded", rank=rank, world_size=world_size, store=store)
        try:
            results[rank] = task(rank, world_size, *args)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread below
            errors.append((rank, error))
            multi_threaded_pg.ProcessLocalGroup.exception_handle(error)  # wake the waiting ranks
        finally:
            for turns in list(_TURNS):
                turns.release()
            if dist.is_initialized():  # a task such as a script's main() may have left already
                dist.destroy_process_group()

    try:
        threads = [threading.Thread(target=rank_main, args=(rank,), daemon=True)
                   for rank in range(world_size)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        multi_threaded_pg.ProcessLocalGroup.reset()
    finally:
        multi_threaded_pg._uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    if errors:
        raise sorted(errors, key=lambda pair: pair[0])[0][1]
    if any(thread.is_alive() for thread in threads):
        raise TimeoutError(f"a rank did not finish within {timeout} s")
    return results


class SeedTurns:
    """For a task that seeds the global generator, draws a model, then talks to the other ranks:
    torch.manual_seed (patched) waits for the generator and keeps it for this rank until the rank
    calls `release_before(function)` (patched over the first call after the draws)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        _TURNS.add(self)

    def manual_seed(self, real: Callable) -> Callable:
        def seeded(seed: int) -> Any:
            if self._owner != threading.get_ident():
                self._lock.acquire()
                self._owner = threading.get_ident()
            return real(seed)

        return seeded

    def release(self) -> None:
        if self._owner == threading.get_ident():
            self._owner = None
            self._lock.release()

    def release_before(self, function: Callable) -> Callable:
        @functools.wraps(function)
        def released(*args: Any, **kwargs: Any) -> Any:
            self.release()
            return function(*args, **kwargs)

        return released
