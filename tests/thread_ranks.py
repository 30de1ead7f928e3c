"""p ranks as p threads of the pytest process, joined by real gloo groups (one per thread).

mutmut credits a test only when the mutated function runs in the pytest process, so the tests of
notebook 11's workers (fsdp, pipeline, ring attention) run them here: `ThreadRanks(p).run(fn,
*args)` calls fn(rank, p, *args) on p threads, and `ThreadRanks.patch(monkeypatch, module)` swaps
the module's `torch.distributed` for the calls below, each sent on the calling thread's own
gloo group (a real ProcessGroupGloo; only the default-group bookkeeping is left out). One rank
runs at a time: a thread holds `turn` except while it waits for a message, so that the ranks do
not interleave their draws from torch's one global generator (each worker process has its own).
A rank that raises makes `run` raise its error (the others stop at the gloo timeout); nothing
waits forever.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

import torch
import torch.distributed as dist

from helpers.scale.workers import Workers

TIMEOUT = datetime.timedelta(seconds=5)


class ThreadRanks:
    """The torch.distributed calls the course's workers make, on one gloo group per thread."""

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
        store = dist.HashStore()
        results: list[Any] = [None] * self.world_size
        errors: list[tuple[int, BaseException]] = []

        def body(rank: int) -> None:
            self.local.rank = rank
            try:
                self.local.group = dist.ProcessGroupGloo(store, rank, self.world_size, TIMEOUT)
                with self.turn:
                    self.local.has_turn = True
                    results[rank] = fn(rank, self.world_size, *args)
            except BaseException as error:  # noqa: BLE001 - raised again in the caller
                errors.append((rank, error))

        threads = [threading.Thread(target=body, args=(rank,), daemon=True)
                   for rank in range(self.world_size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=3 * TIMEOUT.total_seconds())
        if any(thread.is_alive() for thread in threads):
            raise TimeoutError("a rank thread did not finish")
        if errors:
            raise errors[0][1]  # the first rank to fail (the others may fail because of it)
        return results

    # --- the calls the workers make (torch.distributed's names and arguments) ---

    def _log(self, call: str) -> Any:
        self.calls.append((self.local.rank, call))
        return self.local.group

    def _wait(self, work: Any) -> None:
        """Wait for a message with `turn` released, so that the other ranks can run meanwhile."""
        if not getattr(self.local, "has_turn", False):
            return work.wait()
        self.turn.release()
        try:
            work.wait()
        finally:
            self.turn.acquire()

    def get_rank(self) -> int:
        return self.local.rank

    def get_world_size(self) -> int:
        return self.world_size

    def barrier(self) -> None:
        self._wait(self._log("barrier").barrier())

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self._wait(self._log(f"broadcast from {src}").broadcast(tensor, src))

    def all_reduce(self, tensor: torch.Tensor) -> None:
        self._wait(self._log("all_reduce").allreduce([tensor]))

    def all_gather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> None:
        self._wait(self._log("all_gather").allgather([outputs], [tensor]))

    def reduce_scatter(self, output: torch.Tensor, inputs: list[torch.Tensor]) -> None:
        self._wait(self._log("reduce_scatter").reduce_scatter([output], [inputs]))

    def isend(self, tensor: torch.Tensor, dst: int) -> Any:
        return _Sent(self, self._log(f"send to {dst}").send([tensor], dst, 0))

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self._wait(self._log(f"recv from {src}").recv([tensor], src, 0))


class _Sent:
    """isend's answer: its wait() releases the turn like every other wait."""

    def __init__(self, ranks: ThreadRanks, work: Any) -> None:
        self.ranks, self.work = ranks, work

    def wait(self) -> None:
        self.ranks._wait(self.work)


class ThreadWorkers(Workers):
    """A Workers whose ranks are the threads of a ThreadRanks (run_pipeline and run_ring_attention
    want a Workers); `runs` counts the tasks sent."""

    def __init__(self, ranks: ThreadRanks) -> None:
        super().__init__(ranks.world_size)
        self.ranks, self.runs = ranks, 0

    def run(self, fn: Any, *args: Any, timeout: float | None = None) -> list[Any]:
        self.runs += 1
        return self.ranks.run(fn, *args)
