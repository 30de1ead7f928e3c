"""Several ranks of torch.distributed as threads of the pytest process: one helper, two ways.

Why threads: mutmut (benchmarks/mutation.py) credits a test only when the mutated function runs in
the pytest process, and helpers.scale.workers runs each rank in a spawned process. A one-rank
gloo group runs in-process but cannot tell rank 0's share from rank 1's, nor a sum over ranks
from a copy. Here every rank runs the workers' own code, each in a thread of this process.

1. `run_ranks(world_size, task, *args)`: real collectives. Each thread joins torch's in-process
   "threaded" process group (what PyTorch's own distributed tests use), whose collectives add the
   threads' tensors as gloo adds processes' ones; DDP, ZeRO and DTensor run on it unchanged. For
   the data-, tensor- and expert-parallel workers, which call torch.distributed themselves.
2. `ThreadRanks(p).run(fn, *args)` with `ThreadRanks.patch(monkeypatch, module)`: the module's
   `torch.distributed` swapped for calls simulated in Python (collectives meet at a barrier and add
   in rank order, a send puts a copy in the receiver's queue; shapes, dtypes or collectives that
   differ between ranks raise RuntimeError as gloo does). One rank computes at a time (a thread
   holds `turn` except while it waits for the others), so the ranks draw from torch's global
   generator in a fixed order, and `calls` records who called what. For FSDP by hand, the
   pipeline, ring attention and the workers' own loop, whose tests read those calls; a planted
   bug that sends to the wrong rank fails as an exception, never as a crash of the process.

Why not gloo itself, torch's public API: two threads that each call
`init_process_group("gloo", store=HashStore(), ...)` hang, because a process has one default
group, and the workers' code calls torch.distributed's module functions on that default group.
`ProcessGroupGloo(store, rank, size)` objects do run in threads (`pg.allreduce([t]).wait()`), but
nothing hands them to `dist.all_reduce(t)`. Per-thread default groups exist only through torch's
private thread-isolation mode, which `run_ranks` uses (torch.testing._internal.distributed).

Limits: the ranks share one process, so one global random generator (wrap a function that seeds
and draws in `locked`, or use `SeedTurns`), one CPU thread pool (no speed-up), and no crash of one
rank without the others: timing and memory per rank mean nothing here, and a hang becomes a
timeout (TimeoutError, or RuntimeError from a wait) rather than a stuck test. ThreadRanks knows
only the calls listed below (broadcast, all_reduce with a sum, all_gather, reduce_scatter, isend,
recv, barrier), each on the default group.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.distributed import multi_threaded_pg

from helpers.scale.workers import Workers

# --- 1. run_ranks: torch's threaded process group -----------------------------------------------

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


# --- 2. ThreadRanks: torch.distributed's calls simulated in Python ----------------------------

TIMEOUT = 5.0  # seconds a rank waits for the others before it raises


class World:
    """The state the ranks of one group share: a barrier, one slot per rank, a queue per (src, dst)."""

    def __init__(self, world_size: int, timeout: float = TIMEOUT) -> None:
        self.world_size, self.timeout = world_size, timeout
        self.barrier = threading.Barrier(world_size)
        self.slots: list[Any] = [None] * world_size
        self.queues = {(s, d): queue.Queue() for s in range(world_size) for d in range(world_size)}
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True
        self.barrier.abort()


class ThreadRanks:
    """torch.distributed's calls that the course's workers make, for ranks that are threads."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.local = threading.local()
        self.calls: list[tuple[int, str]] = []  # (rank, call) in the order made
        self.turn = threading.Lock()

    def patch(self, monkeypatch: Any, *modules: Any) -> ThreadRanks:
        for module in modules:
            monkeypatch.setattr(module, "dist", self)
        return self

    def run(self, fn: Any, *args: Any) -> list[Any]:
        world = World(self.world_size)
        results: list[Any] = [None] * self.world_size
        errors: list[tuple[int, BaseException]] = []

        def body(rank: int) -> None:
            self.local.rank, self.local.world = rank, world
            try:
                with self.turn:
                    self.local.has_turn, self.local.sent = True, []
                    results[rank] = fn(rank, self.world_size, *args)
                    if not all(sent.waited for sent in self.local.sent):
                        raise RuntimeError(f"rank {rank} returned before waiting for all its isends "
                                           "(gloo may still be reading their tensors)")
            except BaseException as error:  # noqa: BLE001 - raised again in the caller
                errors.append((rank, error))
                world.abort()

        threads = [threading.Thread(target=body, args=(rank,), daemon=True)
                   for rank in range(self.world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=3 * TIMEOUT)
        if any(thread.is_alive() for thread in threads):
            world.abort()
            raise TimeoutError("a rank thread did not finish")
        if errors:
            raise errors[0][1]  # the first rank to fail (the others fail because of it)
        return results

    # --- waiting, with the turn released ---

    def _log(self, call: str) -> World:
        self.calls.append((self.local.rank, call))
        return self.local.world

    def _waiting(self, wait: Any) -> Any:
        """Run wait() (which blocks on the other ranks) with `turn` released."""
        if not getattr(self.local, "has_turn", False):
            return wait()
        self.turn.release()
        try:
            return wait()
        finally:
            self.turn.acquire()

    def _meet(self, world: World, call: str, contribution: Any) -> list[Any]:
        """Every rank's contribution to the same collective, in rank order."""
        world.slots[self.local.rank] = (call, contribution)

        def wait() -> list[Any]:
            try:
                world.barrier.wait(world.timeout)
                everyone = list(world.slots)
                world.barrier.wait(world.timeout)  # nobody overwrites a slot before all have read
            except threading.BrokenBarrierError:
                raise RuntimeError(f"rank {self.local.rank}: {call} did not complete: another rank "
                                   "failed or did not join within the timeout") from None
            return everyone

        everyone = self._waiting(wait)
        if {c for c, _ in everyone} != {call}:
            raise RuntimeError(f"ranks made different collectives at once: {[c for c, _ in everyone]}")
        return [value for _, value in everyone]

    @staticmethod
    def _same(tensors: list[torch.Tensor], what: str) -> None:
        if len({(tuple(t.shape), t.dtype) for t in tensors}) != 1:
            raise RuntimeError(f"{what}: the ranks' tensors differ: {[(tuple(t.shape), t.dtype) for t in tensors]}")

    # --- the calls the workers make (torch.distributed's names and arguments) ---

    def get_rank(self) -> int:
        return self.local.rank

    def get_world_size(self) -> int:
        return self.local.world.world_size

    def barrier(self) -> None:
        self._meet(self._log("barrier"), "barrier", None)

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        values = self._meet(self._log(f"broadcast from {src}"), f"broadcast from {src}", tensor.clone())
        self._same(values, "broadcast")
        tensor.copy_(values[src])

    def all_reduce(self, tensor: torch.Tensor) -> None:
        values = self._meet(self._log("all_reduce"), "all_reduce", tensor.clone())
        self._same(values, "all_reduce")
        total = values[0].clone()
        for value in values[1:]:
            total += value
        tensor.copy_(total)

    def all_gather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> None:
        values = self._meet(self._log("all_gather"), "all_gather", tensor.clone())
        self._same([*values, *outputs], "all_gather")
        if len(outputs) != len(values):
            raise RuntimeError(f"all_gather: {len(outputs)} outputs for {len(values)} ranks")
        for output, value in zip(outputs, values, strict=True):
            output.copy_(value)

    def reduce_scatter(self, output: torch.Tensor, inputs: list[torch.Tensor]) -> None:
        values = self._meet(self._log("reduce_scatter"), "reduce_scatter", [t.clone() for t in inputs])
        if any(len(v) != len(values) for v in values):
            raise RuntimeError(f"reduce_scatter: {[len(v) for v in values]} inputs for {len(values)} ranks")
        mine = [v[self.local.rank] for v in values]
        self._same([*mine, output], "reduce_scatter")
        total = mine[0].clone()
        for value in mine[1:]:
            total += value
        output.copy_(total)

    def isend(self, tensor: torch.Tensor, dst: int) -> _Sent:
        world = self._log(f"send to {dst}")
        if not 0 <= dst < world.world_size or dst == self.local.rank:
            raise RuntimeError(f"rank {self.local.rank} sends to rank {dst}, in a world of {world.world_size}")
        world.queues[(self.local.rank, dst)].put(tensor.detach().clone())
        sent = _Sent()
        if hasattr(self.local, "sent"):
            self.local.sent.append(sent)
        return sent

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        world = self._log(f"recv from {src}")
        if not 0 <= src < world.world_size or src == self.local.rank:
            raise RuntimeError(f"rank {self.local.rank} receives from rank {src}, in a world of {world.world_size}")

        def wait() -> torch.Tensor:
            deadline = time.monotonic() + world.timeout
            while not world.aborted and time.monotonic() < deadline:
                try:
                    return world.queues[(src, self.local.rank)].get(timeout=0.01)
                except queue.Empty:
                    continue
            raise RuntimeError(f"rank {self.local.rank}: nothing came from rank {src} (another rank "
                               "failed, or never sent)")

        message = self._waiting(wait)
        self._same([message, tensor], f"recv from {src}")
        tensor.copy_(message)


class _Sent:
    """isend's answer: the copy is already in the receiver's queue; `run` checks that every rank
    waited for each of its sends before returning, as it must with gloo."""

    def __init__(self) -> None:
        self.waited = False

    def wait(self) -> None:
        self.waited = True


class ThreadWorkers(Workers):
    """A Workers whose ranks are the threads of a ThreadRanks (run_pipeline and run_ring_attention
    want a Workers); `runs` counts the tasks sent."""

    def __init__(self, ranks: ThreadRanks) -> None:
        super().__init__(ranks.world_size)
        self.ranks, self.runs = ranks, 0

    def run(self, fn: Any, *args: Any, timeout: float | None = None) -> list[Any]:
        self.runs += 1
        return self.ranks.run(fn, *args)
