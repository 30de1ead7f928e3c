"""Notebook 11, section 1: start N processes that talk to each other, and what talking costs.

    Workers(world_size)             N spawned processes joined by torch.distributed (gloo on CPU),
                                    kept alive: .run(fn, *args) runs fn(rank, world_size, *args) on
                                    each and returns the results in rank order
    launch(fn, world_size, *args)   the same, once: start, run, stop
    free_port()                     a TCP port nobody listens on, for the processes to meet at
    world()                         (rank, world_size) of this process, (0, 1) outside a group
    WorkerFailed                    raised in the parent when a worker raises: carries its traceback
    collectives_demo                the four collectives on small tensors, run inside each worker
    time_all_reduce                 the best time of one all-reduce per size, run inside each worker
    ring_all_reduce_bytes(n, p)     bytes each rank sends in a ring all-reduce: 2 (p - 1) / p x n
    ring_all_reduce                 the ring all-reduce itself, with send and receive, run inside each worker

How `fn` travels: the workers are *spawned* (a fresh Python, as on macOS, Windows and Colab's
safe default). A function of a module is sent by name and imported; a function defined in a
notebook cell has no module to import, so its source is sent and executed there
(`helpers.scale.cell_functions`). A lambda, or a function reading globals that cannot be
pickled, is refused with a message naming it before any process starts.

On a GPU cluster the same worker functions run under `torchrun --nproc_per_node N`, which sets
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, with backend="nccl"; see `init_from_environment`.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from helpers import checks
from helpers.scale.cell_functions import CellFunction, ship
from helpers.timing import best_time

MAX_WORLD_SIZE = 64  # processes on one machine; a typo of 1000 would start a thousand


class WorkerFailed(RuntimeError):
    """A worker raised; `rank` says which, `worker_traceback` is its traceback as text."""

    def __init__(self, rank: int, worker_traceback: str) -> None:
        super().__init__(f"worker of rank {rank} failed; its traceback:\n{worker_traceback}")
        self.rank, self.worker_traceback = rank, worker_traceback


def world() -> tuple[int, int]:
    """(rank, world_size) of this process: from torch.distributed, or (0, 1) without it."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def free_port() -> int:
    """A free TCP port on this machine (the OS picks it; tiny race, fine for a notebook)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(rank: int, world_size: int, port: int, timeout: float, quiet: bool, tasks: Any,
           results: Any) -> None:
    """The body of every spawned process: join the group, then run tasks until told to stop.

    Each task is (fn, args); the answer is (rank, True, pickled result) or (rank, False, traceback).
    quiet: send the process's own stdout and stderr (library warnings) to /dev/null, since a
    notebook would show them in whatever cell runs, in whatever order they arrive.
    """
    if quiet:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # N processes share the cores; one thread each avoids oversubscription
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        while (task := tasks.get()) is not None:
            fn, args = task
            if isinstance(fn, CellFunction):  # a notebook cell's function: rebuild it from its source
                fn = fn.build()
            # Plain pickle copies tensors by value (the queue's own pickler would share memory
            # that vanishes if this process exits before the parent reads it).
            results.put((rank, True, pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent as text
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _check_picklable(args: Sequence[Any]) -> None:
    """Raise at once, naming the argument, if one cannot be pickled: the queue would otherwise
    fail in a background thread and the workers would wait for a task that never comes."""
    for index, arg in enumerate(args):
        try:
            pickle.dumps(arg)
        except Exception as error:  # noqa: BLE001 - pickle raises many types
            raise TypeError(f"argument {index} ({type(arg).__name__}: {arg!r:.60}) cannot be sent "
                            f"to the workers ({type(error).__name__}: {error}), expected a picklable "
                            "value: tensors, numbers, strings, lists and dicts of them, or objects "
                            "of classes defined in a module") from None


class Workers:
    """`world_size` spawned processes joined in one gloo group, kept alive between tasks.

    Starting a process costs a fresh Python and `import torch` (seconds); a notebook pays it once
    and then sends each task with `run` (workers print nothing unless quiet=False: the results
    come back to the parent, which prints them in rank order). If a task raises on any rank, or
    does not finish within `timeout` seconds, every process is stopped (a rank may be stuck
    waiting in a collective for the one that failed) and the next `run` starts fresh ones.
    """

    def __init__(self, world_size: int = 2, timeout: float = 60.0, quiet: bool = True) -> None:
        self.world_size = checks.positive_int("world_size", world_size)
        if world_size > MAX_WORLD_SIZE:
            raise ValueError(f"world_size is {world_size}, expected at most {MAX_WORLD_SIZE}: each "
                             "rank is a whole Python process with torch imported")
        self.timeout = checks.positive_float("timeout", timeout)
        self.quiet = checks.boolean("quiet", quiet)
        self.processes: list[Any] = []

    def start(self) -> Workers:
        context = mp.get_context("spawn")
        self.tasks = [context.Queue() for _ in range(self.world_size)]
        self.results = context.Queue()
        port = free_port()
        self.processes = [context.Process(target=_serve, daemon=True,
                                          args=(rank, self.world_size, port, self.timeout, self.quiet,
                                                self.tasks[rank], self.results))
                          for rank in range(self.world_size)]
        for process in self.processes:
            process.start()
        return self

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> list[Any]:
        """fn(rank, world_size, *args) on every rank; the results in rank order.

        fn is defined with `def` in a module or a notebook cell; its arguments and result picklable. A worker
        that raises -> WorkerFailed with its traceback; too slow -> TimeoutError. Either way no
        process is left running.
        """
        sendable = ship(fn)
        _check_picklable(args)
        timeout = self.timeout if timeout is None else checks.positive_float("timeout", timeout)
        if not self.processes:
            self.start()
        for rank_tasks in self.tasks:
            rank_tasks.put((sendable, args))
        try:
            return _collect(self.processes, self.results, timeout)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Tell the workers to stop; stop by force any that do not."""
        if self.processes:
            for rank_tasks, process in zip(self.tasks, self.processes, strict=True):
                if process.is_alive():
                    rank_tasks.put(None)
            _stop(self.processes)
        self.processes = []

    def __enter__(self) -> Workers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def launch(fn: Callable[..., Any], world_size: int = 2, *args: Any, timeout: float = 60.0) -> list[Any]:
    """Start `world_size` workers, run `fn(rank, world_size, *args)` once on each, stop them.

    Returns the results in rank order; raises WorkerFailed or TimeoutError as `Workers.run` does.
    """
    ship(fn)
    _check_picklable(args)
    with Workers(world_size, timeout) as workers:
        return workers.run(fn, *args)


def _collect(processes: Sequence[Any], results: Any, timeout: float) -> list[Any]:
    """Wait for one message per process; raise as soon as one reports failure or dies silently."""
    deadline = time.monotonic() + timeout
    received: dict[int, Any] = {}
    while len(received) < len(processes):
        dead = [rank for rank, process in enumerate(processes)
                if rank not in received and process.exitcode is not None]
        try:  # a process that just died may still have its last message in the pipe: wait longer
            rank, ok, payload = results.get(timeout=1.0 if dead else 0.05)
        except queue.Empty:
            if dead:
                raise WorkerFailed(dead[0], f"the process exited with code {processes[dead[0]].exitcode} "
                                            "without reporting (killed, or out of memory?)") from None
            if time.monotonic() > deadline:
                missing = [rank for rank in range(len(processes)) if rank not in received]
                raise TimeoutError(f"ranks {missing} did not finish within timeout={timeout:g} s; "
                                   "all workers were stopped") from None
            continue
        if not ok:
            raise _first_failure(processes, results, set(received) | {rank}, rank, payload)
        received[rank] = pickle.loads(payload)
    return [received[rank] for rank in range(len(processes))]


def _first_failure(processes: Sequence[Any], results: Any, reported: set[int], rank: int,
                   payload: str, grace: float = 2.0) -> WorkerFailed:
    """The WorkerFailed to raise when `rank` reported a failure. If another process died
    without a word (os._exit, killed), `rank` most likely failed only because its connection
    to that one dropped: the silent one is named, with `rank`'s traceback beside it."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        dead = [r for r, p in enumerate(processes) if r not in reported and p.exitcode is not None]
        try:  # a dead process's last message is in the pipe by now: read what is there first
            reported.add(results.get(timeout=0.05)[0])
            continue
        except queue.Empty:
            pass
        silent = [r for r in dead if r not in reported]
        if silent:
            code = processes[silent[0]].exitcode
            return WorkerFailed(silent[0], f"the process exited with code {code} without reporting "
                                f"(os._exit, killed, or out of memory?); rank {rank} then failed "
                                f"too, most likely because of it:\n{payload}")
        if all(r in reported for r in range(len(processes))):
            break
    return WorkerFailed(rank, payload)


def _stop(processes: Sequence[Any]) -> None:
    """Join workers that are finishing; terminate, then kill, any that are still running."""
    deadline = time.monotonic() + 2.0
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join(timeout=1.0)
        if process.is_alive():
            process.kill()
            process.join()


def init_from_environment(backend: str | None = None) -> tuple[int, int]:
    """Join the group that `torchrun` describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    backend defaults to "nccl" when a GPU is present, else "gloo". Returns (rank, world_size).
    """
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    checks.one_of("backend", backend, ("gloo", "nccl", "mpi"))
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend is 'nccl', which needs a GPU, and this machine has none: "
                         "expected 'gloo' on a CPU")
    missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise RuntimeError(f"the environment variables {missing} are not set, expected the ones "
                           "torchrun sets: start this script with `torchrun --nproc_per_node N`")
    dist.init_process_group(backend)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return dist.get_rank(), dist.get_world_size()


# --- the collectives, run inside the workers -------------------------------------------------


def collectives_demo(rank: int, world_size: int) -> dict[str, list[float] | list[list[float]]]:
    """Each collective once, on tiny tensors whose values say which rank made them."""
    out: dict[str, Any] = {}
    weights = torch.tensor([10.0, 20.0]) if rank == 0 else torch.zeros(2)
    dist.broadcast(weights, src=0)                       # rank 0's tensor, everywhere
    out["broadcast from rank 0"] = weights.tolist()
    mine = torch.tensor([1.0, 2.0]) * (rank + 1)         # rank r holds (r + 1) x [1, 2]
    total = mine.clone()
    dist.all_reduce(total)                               # the sum, everywhere (in place)
    out["all_reduce (sum)"] = total.tolist()
    gathered = [torch.zeros(2) for _ in range(world_size)]
    dist.all_gather(gathered, mine)                      # everybody's tensor, everywhere
    out["all_gather"] = [t.tolist() for t in gathered]
    pieces = [torch.full((2,), float(10 * rank + piece)) for piece in range(world_size)]
    mine_of_sum = torch.zeros(2)
    dist.reduce_scatter(mine_of_sum, pieces)             # piece r of the sum, on rank r only
    out["reduce_scatter: inputs"] = [p.tolist() for p in pieces]
    out["reduce_scatter: result"] = mine_of_sum.tolist()
    return out


def time_all_reduce(rank: int, world_size: int, sizes: Sequence[int], repeats: int = 5) -> dict[int, float]:
    """The best time, in seconds, of one all-reduce of a float32 tensor of each size (in values)."""
    times = {}
    for size in sizes:
        tensor = torch.ones(size)
        dist.barrier()
        times[size] = best_time(lambda t=tensor: dist.all_reduce(t), repeats=repeats)
    return times


def fail_on_rank(rank: int, world_size: int, failing_rank: int = 1) -> float:
    """A task that breaks: `failing_rank` raises while the others wait for it in an all-reduce."""
    if rank == failing_rank:
        raise ValueError(f"rank {rank} fails on purpose, before its all-reduce")
    total = torch.ones(1)
    dist.all_reduce(total)  # never completes: the failing rank does not join
    return total.item()


def sleep_on_rank(rank: int, world_size: int, seconds: float) -> int:
    """A task that takes `seconds` on every rank (to show the timeout)."""
    time.sleep(seconds)
    return rank


def ring_all_reduce_bytes(n_bytes: float, world_size: int) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of an `n_bytes` tensor.

    Reduce-scatter: p - 1 steps, each sending one p-th of the tensor; all-gather: p - 1 more.
    2 (p - 1) / p x n: almost 2 n however many ranks there are.
    """
    checks.positive_int("world_size", world_size)
    n_bytes = checks.number_in("n_bytes", n_bytes, 0.0, float("inf"))
    return 2 * (world_size - 1) / world_size * n_bytes


def ring_all_reduce_by_hand(per_rank: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
    """Simulate a ring all-reduce in one process: p tensors of n values -> p copies of their sum.

    Each tensor is cut into p chunks. Reduce-scatter: at step s rank r sends chunk (r - s) mod p
    to rank r + 1, which adds it to its own; after p - 1 steps rank r holds the full sum of chunk
    (r + 1) mod p. All-gather: p - 1 more steps pass the finished chunks around. Also returns the
    number of values each rank sent.
    """
    p = len(per_rank)
    checks.positive_int("len(per_rank)", p)
    chunks = [list(t.clone().tensor_split(p)) for t in per_rank]  # chunks[r][c], p of them
    sent = 0
    for step in range(p - 1):  # reduce-scatter
        outgoing = [(r, (r - step) % p, chunks[r][(r - step) % p].clone()) for r in range(p)]
        for r, c, values in outgoing:
            chunks[(r + 1) % p][c] += values
        sent += outgoing[0][2].numel()
    for step in range(p - 1):  # all-gather: rank r owns chunk (r + 1) mod p
        outgoing = [(r, (r + 1 - step) % p, chunks[r][(r + 1 - step) % p].clone()) for r in range(p)]
        for r, c, values in outgoing:
            chunks[(r + 1) % p][c] = values
        sent += outgoing[0][2].numel()
    return [torch.cat(c) for c in chunks], sent


def ring_all_reduce(rank: int, world_size: int, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The sum over the ranks of their tensors, by a ring, run inside each worker.

    tensors: one per rank, same shape, at least world_size values; rank r reads only tensors[r]
    (on a cluster it would have computed it). Rank r sends only to r + 1 and receives from r - 1,
    one of p chunks a step: p - 1 steps of reduce-scatter (add what arrives), then p - 1 of
    all-gather (keep it). The send is asynchronous (`isend`): if every rank waited in a blocking
    send for its neighbour to receive, nobody would ever receive.
    """
    checks.rank_in_world(rank, world_size)
    if len(tensors) != world_size or not all(isinstance(t, torch.Tensor) for t in tensors) \
            or tensors[rank].numel() < world_size:
        raise ValueError(f"tensors must be {world_size} tensors (one per rank) of at least "
                         f"world_size={world_size} values each, got {[getattr(t, 'shape', t) for t in tensors]}")
    chunks = list(tensors[rank].detach().flatten().clone().tensor_split(world_size))
    right, left = (rank + 1) % world_size, (rank - 1) % world_size

    def pass_on(send: int, receive: int) -> torch.Tensor:
        incoming = torch.empty_like(chunks[receive])
        request = dist.isend(chunks[send].contiguous(), right)
        dist.recv(incoming, left)
        request.wait()
        return incoming

    for step in range(world_size - 1):  # reduce-scatter: afterwards rank r owns chunk r + 1
        chunks[(rank - step - 1) % world_size] += pass_on((rank - step) % world_size, (rank - step - 1) % world_size)
    for step in range(world_size - 1):  # all-gather: the finished chunks go round once
        chunks[(rank - step) % world_size] = pass_on((rank + 1 - step) % world_size, (rank - step) % world_size)
    return torch.cat(chunks).reshape(tensors[rank].shape)
