"""helpers.scale.workers with its processes played by threads of this process, where mutmut sees
the code run: `Workers` started on a fake `multiprocessing` context whose Process is a thread, the
workers' `_serve` loop with torch.distributed simulated (tests/ranks_in_threads.py), `os` faked so that a
quiet worker's redirections are recorded, not done to pytest. What is checked: the results in rank
order, a failing rank raising WorkerFailed with its traceback, a slow one TimeoutError, a rank that
dies silently named, nothing left running; the collectives and the ring all-reduce exactly; every
check read in full."""

from __future__ import annotations

import datetime
import os
import pickle
import queue
import re
import threading
import time
import types

import pytest
import torch
from ranks_in_threads import ThreadRanks, World
from shared_tools import full

from helpers.scale import workers as w
from helpers.scale.cell_functions import CellFunction
from helpers.scale.data_parallel import Run
from helpers.scale.sharded import ShardedAdamW
from helpers.scale.workers import (
    WorkerFailed,
    Workers,
    collectives_demo,
    fail_on_rank,
    init_from_environment,
    launch,
    ring_all_reduce_by_hand,
    ring_all_reduce_bytes,
    sleep_on_rank,
)


class ThreadProcess:
    """multiprocessing's Process, played by a daemon thread; records join, terminate and kill."""

    def __init__(self, target, daemon, args):
        self.target, self.daemon, self.args = target, daemon, args
        self.exitcode, self.events = None, []
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self):
        try:
            self.target(*self.args)
            self.exitcode = 0
        except BaseException:  # noqa: BLE001
            self.exitcode = 1

    def start(self):
        self.thread.start()

    def is_alive(self):
        return self.thread.is_alive()

    def join(self, timeout=None):
        self.events.append("join")
        self.thread.join(timeout)

    def terminate(self):
        self.events.append("terminate")

    def kill(self):
        self.events.append("kill")


class ServeRanks(ThreadRanks):
    """ThreadRanks plus the group set-up that _serve makes (init, is_initialized, destroy): the
    ranks of one start meet in the World of their port."""

    def __init__(self, fake_os):
        super().__init__(0)
        self.os, self.worlds, self.inits, self.destroyed = fake_os, {}, [], []
        self.lock = threading.Lock()

    def init_process_group(self, backend, rank, world_size, timeout):
        self.inits.append((backend, rank, world_size, timeout))
        with self.lock:
            world = self.worlds.setdefault(self.os.environ["MASTER_PORT"],
                                           World(world_size, timeout.total_seconds()))
        self.local.rank, self.local.world = rank, world

    def is_initialized(self):
        return getattr(self.local, "world", None) is not None

    def destroy_process_group(self):
        self.destroyed.append(self.local.rank)
        self.local.world = None


class FakeOS:
    devnull, O_WRONLY = os.devnull, os.O_WRONLY

    def __init__(self):
        self.environ, self.opened, self.dup2s = {}, [], []

    def open(self, path, flags):
        self.opened.append((path, flags))
        return 99

    def dup2(self, fd, fd2):
        self.dup2s.append((fd, fd2))


@pytest.fixture
def threaded(monkeypatch):
    """workers.py with thread processes: returns (fake os, the ranks' dist, the contexts asked for)."""
    fake_os = FakeOS()
    ranks = ServeRanks(fake_os)
    contexts, threads_set = [], []

    def get_context(method):
        contexts.append(method)
        return types.SimpleNamespace(Queue=queue.Queue, Process=ThreadProcess)

    monkeypatch.setattr(w, "mp", types.SimpleNamespace(get_context=get_context))
    monkeypatch.setattr(w, "os", fake_os)
    monkeypatch.setattr(w, "dist", ranks)
    monkeypatch.setattr(torch, "set_num_threads", threads_set.append)
    return types.SimpleNamespace(os=fake_os, dist=ranks, contexts=contexts, threads=threads_set)


def rank_only(rank, world_size):
    return rank


def add_rank(rank, world_size, offset):
    return rank * 10 + world_size + offset


def test_workers_on_thread_processes_run_tasks_in_rank_order_and_stop(threaded):
    pool = w.Workers(3, timeout=5.0, quiet=False)
    assert pool.processes == [] and (pool.world_size, pool.timeout, pool.quiet) == (3, 5.0, False)
    assert pool.run(add_rank, 1) == [4, 14, 24]
    processes = pool.processes
    assert threaded.contexts == ["spawn"] and len(processes) == 3
    assert all(p.daemon and p.target is w._serve for p in processes)
    port = processes[0].args[2]
    assert isinstance(port, int) and 0 < port < 65536  # free_port's
    assert [p.args[:2] for p in processes] == [(r, 3) for r in range(3)]
    assert all(p.args[2:5] == (port, 5.0, False) for p in processes)
    assert len({id(p.args[5]) for p in processes}) == 3 and len({id(p.args[6]) for p in processes}) == 1
    assert threaded.os.environ == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    assert threaded.os.dup2s == [] and threaded.threads == [1, 1, 1]
    assert sorted(threaded.dist.inits) == [("gloo", r, 3, datetime.timedelta(seconds=5.0)) for r in range(3)]
    assert pool.run(add_rank, 2, timeout=3.0) == [5, 15, 25] and pool.processes is processes  # kept alive
    assert pool.run(w.collectives_demo)[2]["all_reduce (sum)"] == [6.0, 12.0]  # collectives work
    pool.close()
    assert pool.processes == [] and sorted(threaded.dist.destroyed) == [0, 1, 2]
    assert all(p.exitcode == 0 and "terminate" not in p.events for p in processes)
    pool.close()  # twice: nothing to stop


def test_a_quiet_worker_sends_its_output_to_devnull(threaded):
    with w.Workers(2, timeout=5.0) as pool:
        assert pool.quiet and pool.run(add_rank, 0) == [2, 12]
    assert threaded.os.opened == [(os.devnull, os.O_WRONLY)] * 2
    assert threaded.os.dup2s == [(99, 1), (99, 2)] * 2
    assert pool.processes == []


def test_a_notebook_cell_function_is_rebuilt_in_the_worker(threaded):
    source = "def cell_task(rank, world_size):\n    return [rank, world_size, SCALE]\n"
    shipped = CellFunction("cell_task", {"cell_task": source}, values={"SCALE": 3})
    with w.Workers(2, timeout=5.0, quiet=False) as pool:
        pool.tasks[0].put((shipped, ()))
        pool.tasks[1].put((shipped, ()))
        assert w._collect(pool.processes, pool.results, 5.0) == [[0, 2, 3], [1, 2, 3]]


def test_a_failing_rank_raises_its_traceback_and_every_worker_stops(threaded):
    pool = w.Workers(2, timeout=1.0, quiet=False)
    pool.run(add_rank, 0)
    processes = pool.processes
    with pytest.raises(w.WorkerFailed, match="^worker of rank 1 failed; its traceback:\nTraceback") as failure:
        pool.run(w.fail_on_rank)
    assert failure.value.rank == 1 and "rank 1 fails on purpose, before its all-reduce" in failure.value.worker_traceback
    assert pool.processes == [] and all(not p.is_alive() for p in processes)  # rank 0 left its all-reduce
    assert pool.run(add_rank, 0) == [2, 12] and pool.processes != processes  # fresh ones
    pool.close()


def test_a_slow_rank_times_out_and_is_stopped(threaded):
    pool = w.Workers(2, timeout=5.0, quiet=False)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=re.escape("ranks [0, 1] did not finish within timeout=0.2 s; "
                                                     "all workers were stopped")):
        pool.run(w.sleep_on_rank, 0.6, timeout=0.2)
    assert 0.2 <= time.monotonic() - start < 0.6 + 2.5 and pool.processes == []
    with pytest.raises(ValueError, match="timeout"):
        pool.run(add_rank, 0, timeout=0)
    assert pool.processes == []  # refused before starting anything


class Silent:
    """A process already dead (exitcode) or still running (None) that reports nothing."""

    def __init__(self, exitcode):
        self.exitcode = exitcode


def test_collect_names_a_rank_that_died_without_a_word():
    results = queue.Queue()
    results.put((1, True, pickle.dumps("one")))
    start = time.monotonic()
    with pytest.raises(w.WorkerFailed, match=re.escape("worker of rank 0 failed; its traceback:\nthe process "
                                                       "exited with code -9 without reporting (killed, or out "
                                                       "of memory?)")) as failure:
        w._collect([Silent(-9), Silent(None)], results, 30.0)
    assert failure.value.rank == 0 and 1.0 <= time.monotonic() - start < 1.8  # waited 1 s for its message
    # a message that arrives within that second still counts
    results.put((0, True, pickle.dumps("late")))
    results.put((1, True, pickle.dumps("one")))
    assert w._collect([Silent(0), Silent(0)], results, 30.0) == ["late", "one"]


def test_collect_times_out_naming_the_missing_ranks():
    results = queue.Queue()
    results.put((1, True, pickle.dumps(1)))
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=re.escape("ranks [0, 2] did not finish within timeout=0.3 s")):
        w._collect([Silent(None)] * 3, results, 0.3)
    assert 0.3 <= time.monotonic() - start < 1.0


def test_a_rank_failing_after_a_silent_death_names_the_silent_one(monkeypatch):
    results = queue.Queue()
    failure = w._first_failure([Silent(None), Silent(-9), Silent(None)], results, {0}, 0, "connection reset")
    assert failure.rank == 1
    assert str(failure) == ("worker of rank 1 failed; its traceback:\nthe process exited with code -9 without "
                            "reporting (os._exit, killed, or out of memory?); rank 0 then failed too, most "
                            "likely because of it:\nconnection reset")
    # a rank that reports in the meantime is not silent; with everyone reported, the failure is rank 0's
    results.put((2, True, b""))
    start = time.monotonic()
    failure = w._first_failure([Silent(None), Silent(None), Silent(0)], results, {0, 1}, 0, "boom")
    assert (failure.rank, failure.worker_traceback) == (0, "boom") and time.monotonic() - start < 0.5
    # a report read first does not stop the search for a silent one
    results.put((1, True, b""))
    failure = w._first_failure([Silent(None), Silent(None), Silent(-9)], results, {0}, 0, "boom")
    assert failure.rank == 2
    start = time.monotonic()
    failure = w._first_failure([Silent(None), Silent(None)], queue.Queue(), {0}, 0, "boom", grace=0.3)
    assert failure.rank == 0 and 0.3 <= time.monotonic() - start < 1.0

    class EmptyQueue:
        gets = 0

        def get(self, timeout):
            self.gets += 1
            raise queue.Empty

    ticks = iter(range(100))  # a clock that reads 0, 1, 2, ... seconds
    monkeypatch.setattr(w, "time", types.SimpleNamespace(monotonic=lambda: float(next(ticks))))
    results = EmptyQueue()
    assert w._first_failure([Silent(None), Silent(None)], results, {0}, 0, "boom").rank == 0
    assert results.gets == 1  # 2 s of grace unless told: the deadline is 2, one look at t = 1


class Stuck:
    """A process that ignores join and terminate; kill works."""

    def __init__(self, stops_at="kill"):
        self.events, self.stops_at, self.alive = [], stops_at, True

    def join(self, timeout=None):
        self.events.append(("join", None if timeout is None else round(timeout)))

    def is_alive(self):
        return self.alive

    def terminate(self):
        self.events.append("terminate")
        self.alive = self.stops_at != "terminate"

    def kill(self):
        self.events.append("kill")
        self.alive = False


def test_stop_terminates_then_kills_what_does_not_finish():
    stuck, soft = Stuck(), Stuck("terminate")
    w._stop([stuck, soft])
    assert stuck.events == [("join", 2), "terminate", ("join", 1), "kill", ("join", None)]
    assert soft.events == [("join", 2), "terminate", ("join", 1)]
    done = Stuck()
    done.alive = False
    w._stop([done])
    assert done.events == [("join", 2)]


def test_stop_gives_later_processes_only_what_is_left_of_the_2_seconds(monkeypatch):
    now = iter([0.0, 1.75, 3.0])  # the deadline read at 0, then each join starts later
    monkeypatch.setattr(w, "time", types.SimpleNamespace(monotonic=lambda: next(now)))
    first, second = Stuck("terminate"), Stuck("terminate")
    first.alive = second.alive = False
    w._stop([first, second])
    assert first.events == [("join", 0)] and second.events == [("join", 0)]  # 0.25 s, then none


def test_the_worker_checks_read_in_full(threaded):  # threads: a bug that starts workers leaks none
    failed = w.WorkerFailed(3, "trace")
    assert str(failed) == "worker of rank 3 failed; its traceback:\ntrace" and isinstance(failed, RuntimeError)
    assert (failed.rank, failed.worker_traceback) == (3, "trace")
    for kwargs, message in (({"world_size": 0}, "^world_size is 0"), ({"timeout": 0}, "^timeout is 0"),
                            ({"quiet": 1}, "^quiet is 1")):
        with pytest.raises((ValueError, TypeError), match=message):
            w.Workers(**kwargs)
    with pytest.raises(ValueError, match="^timeout is -1"):
        w.Workers().run(add_rank, 0, timeout=-1)
    with pytest.raises(ValueError, match=re.escape("world_size is 65, expected at most 64: each rank is a "
                                                   "whole Python process with torch imported")):
        w.Workers(65)
    assert w.Workers(64).world_size == 64 and w.MAX_WORLD_SIZE == 64
    defaults = w.Workers()
    assert (defaults.world_size, defaults.timeout, defaults.quiet) == (2, 60.0, True)
    for kwargs, name in (({"world_size": 0}, "world_size"), ({"timeout": 0}, "timeout"), ({"quiet": 1}, "quiet")):
        with pytest.raises((ValueError, TypeError), match=name):
            w.Workers(**kwargs)
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"^argument 1 \(lock: <unlocked _thread.lock object at 0x[0-9a-f]+>\) "
                                        r"cannot be sent to the workers \(TypeError: cannot pickle '_thread.lock' "
                                        r"object\), expected a picklable value: tensors, numbers, strings, lists "
                                        r"and dicts of them, or objects of classes defined in a module$"):
        w._check_picklable([1, lock])
    long = "x" * 100
    with pytest.raises(TypeError, match=re.escape(f"argument 0 (tuple: {(long, lock)!r:.60}) cannot")):
        w._check_picklable([(long, lock)])
    w._check_picklable([1, "a", torch.zeros(2)])
    port = w.free_port()
    assert isinstance(port, int) and 1024 <= port < 65536


def test_launch_checks_before_starting_and_stops_after(monkeypatch):
    started = []

    class Recording(w.Workers):
        def start(self):
            started.append((self.world_size, self.timeout))
            self.processes = []
            return self

        def run(self, fn, *args, timeout=None):
            return [fn(rank, self.world_size, *args) for rank in range(self.world_size)]

    monkeypatch.setattr(w, "Workers", Recording)
    assert w.launch(rank_only) == [0, 1]
    assert w.launch(add_rank, 3, 1, timeout=7.0) == [4, 14, 24]
    assert started == [(2, 60.0), (3, 7.0)]
    with pytest.raises(ValueError, match="lambda"):
        w.launch(lambda rank, world_size: rank)
    with pytest.raises(TypeError, match="argument 0"):
        w.launch(add_rank, 2, threading.Lock())
    assert len(started) == 2


def test_init_from_environment_names_what_is_missing(monkeypatch):
    fake_os = FakeOS()
    joined = []
    fake_dist = types.SimpleNamespace(init_process_group=joined.append, get_rank=lambda: 1,
                                      get_world_size=lambda: 4)
    monkeypatch.setattr(w, "os", fake_os)
    monkeypatch.setattr(w, "dist", fake_dist)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    message = ("the environment variables ['RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT'] are not "
               "set, expected the ones torchrun sets: start this script with `torchrun --nproc_per_node N`")
    with pytest.raises(RuntimeError, match=full(message)):
        w.init_from_environment()
    fake_os.environ.update(RANK="1", WORLD_SIZE="4", MASTER_ADDR="h")
    with pytest.raises(RuntimeError, match=re.escape("variables ['MASTER_PORT'] are not set")):
        w.init_from_environment("gloo")
    fake_os.environ["MASTER_PORT"] = "1"
    assert w.init_from_environment() == (1, 4) and joined == ["gloo"]  # gloo without a GPU
    with pytest.raises(ValueError, match=re.escape("backend is 'nccl', which needs a GPU, and this machine "
                                                   "has none: expected 'gloo' on a CPU")):
        w.init_from_environment("nccl")
    with pytest.raises(ValueError, match=re.escape("backend is 'tcp', expected one of ")):
        w.init_from_environment("tcp")
    w.init_from_environment("mpi")  # torchrun with an MPI build
    assert joined[-1] == "mpi"
    joined.pop()
    devices = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", devices.append)
    assert w.init_from_environment() == (1, 4) and joined == ["gloo", "nccl"] and devices == [0]
    fake_os.environ["LOCAL_RANK"] = "3"
    w.init_from_environment("nccl")
    w.init_from_environment("gloo")  # a GPU, but gloo: no device set
    assert devices == [0, 3] and joined == ["gloo", "nccl", "nccl", "gloo"]


@pytest.mark.parametrize("p", [2, 3])
def test_the_collectives_demo_gives_the_textbook_values(monkeypatch, p):
    results = ThreadRanks(p).patch(monkeypatch, w).run(w.collectives_demo)
    for rank, out in enumerate(results):
        assert out["broadcast from rank 0"] == [10.0, 20.0]
        total = sum(r + 1 for r in range(p))
        assert out["all_reduce (sum)"] == [total, 2.0 * total]
        assert out["all_gather"] == [[r + 1.0, 2.0 * (r + 1)] for r in range(p)]
        assert out["reduce_scatter: inputs"] == [[10.0 * rank + c] * 2 for c in range(p)]
        assert out["reduce_scatter: result"] == [float(sum(10 * r + rank for r in range(p)))] * 2


def test_the_tasks_that_time_and_fail(monkeypatch):
    ranks = ThreadRanks(2).patch(monkeypatch, w)
    repeats = []
    monkeypatch.setattr(w, "best_time", lambda fn, repeats: (fn(), repeats_seen(repeats))[1])

    def repeats_seen(n):
        repeats.append(n)
        return 0.5

    assert ranks.run(w.time_all_reduce, [3, 5]) == [{3: 0.5, 5: 0.5}] * 2
    assert repeats == [5] * 4
    assert [c for r, c in ranks.calls if r == 0] == ["barrier", "all_reduce"] * 2
    ranks.run(w.time_all_reduce, [3], 2)
    assert repeats[-1] == 2
    with pytest.raises(ValueError, match="^rank 1 fails on purpose, before its all-reduce$"):
        ThreadRanks(2).patch(monkeypatch, w).run(w.fail_on_rank)
    assert ThreadRanks(3).patch(monkeypatch, w).run(w.fail_on_rank, 5) == [3.0] * 3  # nobody fails
    with pytest.raises(ValueError, match="^rank 0 fails on purpose"):
        w.fail_on_rank(0, 1, 0)
    start = time.monotonic()
    assert w.sleep_on_rank(4, 5, 0.1) == 4 and time.monotonic() - start >= 0.1


def test_the_ring_all_reduce_sums_sending_to_the_right_only(monkeypatch):
    tensors = [(torch.arange(14.0) * (rank + 1) + rank).view(2, 7) for rank in range(3)]
    ranks = ThreadRanks(3).patch(monkeypatch, w)
    results = ranks.run(w.ring_all_reduce, tensors)
    assert all(torch.equal(result, sum(tensors)) for result in results)
    for rank in range(3):
        assert [c for r, c in ranks.calls if r == rank] == [f"send to {(rank + 1) % 3}",
                                                            f"recv from {(rank - 1) % 3}"] * 4
    assert torch.equal(tensors[0], torch.arange(14.0).view(2, 7))  # the inputs are not changed
    message = ("tensors must be 3 tensors (one per rank) of at least world_size=3 values each, got "
               "[torch.Size([2]), torch.Size([2]), torch.Size([2])]")
    with pytest.raises(ValueError, match=full(message)):
        w.ring_all_reduce(0, 3, [torch.ones(2)] * 3)
    with pytest.raises(ValueError, match="tensors must be 2 tensors"):
        w.ring_all_reduce(0, 2, [torch.ones(2)])
    with pytest.raises(ValueError, match=re.escape("got [torch.Size([2]), 5]")):
        w.ring_all_reduce(0, 2, [torch.ones(2), 5])
    with pytest.raises(ValueError, match="rank"):
        w.ring_all_reduce(2, 2, [torch.ones(2)] * 2)
    exactly = [torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0])]  # world_size values: enough
    results = ThreadRanks(2).patch(monkeypatch, w).run(w.ring_all_reduce, exactly)
    assert all(r.tolist() == [11.0, 22.0] for r in results)
    (one,) = ThreadRanks(1).patch(monkeypatch, w).run(w.ring_all_reduce, [torch.ones(3)])
    assert torch.equal(one, torch.ones(3))


def test_the_ring_by_hand_and_its_bytes():
    for p in (1, 2, 3, 4):
        tensors = [torch.arange(12.0) * (r + 2) - r for r in range(p)]
        results, sent = w.ring_all_reduce_by_hand(tensors)
        assert all(torch.equal(result, sum(tensors)) for result in results)
        assert sent == 2 * (p - 1) * 12 // p
        assert tensors[0].equal(torch.arange(12.0) * 2)  # not changed in place
    results, sent = w.ring_all_reduce_by_hand([torch.arange(5.0), torch.ones(5)])  # chunks of 3 and 2
    assert all(torch.equal(result, torch.arange(5.0) + 1) for result in results) and sent == 3 + 2
    assert w.ring_all_reduce_bytes(1200, 4) == 1800 and w.ring_all_reduce_bytes(0, 3) == 0
    with pytest.raises(ValueError, match="^world_size is 0"):
        w.ring_all_reduce_bytes(10, 0)
    with pytest.raises(ValueError, match="^n_bytes is -1"):
        w.ring_all_reduce_bytes(-1, 2)
    with pytest.raises(ValueError, match="^len\\(per_rank\\) is 0"):
        w.ring_all_reduce_by_hand([])


@pytest.mark.parametrize("backend, words", [("glo", "backend is 'glo', expected one of 'gloo'"),
                                            ("nccl", "needs a GPU")])
def test_a_misspelt_or_unusable_backend_is_named(backend, words):
    if backend == "nccl" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match=words):
        init_from_environment(backend)


@pytest.mark.processes
def test_an_argument_that_cannot_be_pickled_is_refused_at_once():
    start = time.monotonic()
    with pytest.raises(TypeError, match="argument 0 .*cannot be sent to the workers"):
        launch(sleep_then_return, 2, threading.Lock(), timeout=60.0)
    assert time.monotonic() - start < 5.0  # no worker was even started


def sleep_then_return(rank: int, world_size: int, value: object) -> object:
    return value


def exit_on_rank(rank: int, world_size: int, exiting_rank: int = 1) -> float:
    """Rank `exiting_rank` leaves without a word; the others wait for it in an all-reduce."""
    if rank == exiting_rank:
        os._exit(3)
    total = torch.ones(1)
    torch.distributed.all_reduce(total)
    return float(total)


def differing_shapes(rank: int, world_size: int) -> None:
    model = torch.nn.Linear(4, 4 + rank)
    ShardedAdamW(model.parameters(), rank, world_size)


@pytest.mark.processes
@pytest.mark.slow
def test_workers_name_the_rank_that_exited_and_the_ranks_whose_shapes_differ():
    with Workers(2, timeout=60.0) as workers:
        with pytest.raises(Exception, match="(?s)worker of rank 1 failed.*exited with code 3") as failure:
            workers.run(exit_on_rank, 1)
        assert failure.value.rank == 1
        with pytest.raises(Exception, match=r"(?s)params differ across ranks: rank 1 .*\(5, 4\)"):
            workers.run(differing_shapes)


def test_unpicklable_check_accepts_tensors():
    pickle.dumps(torch.ones(2))  # the check uses plain pickle, which tensors support


@pytest.mark.processes
def test_a_typo_in_world_size_starts_no_thousand_processes():
    with pytest.raises(ValueError, match="world_size is 1000, expected at most 64"):
        Workers(1000)


@pytest.mark.processes
def test_collectives_give_the_textbook_results_on_every_rank(scale_workers):
    results = scale_workers.run(collectives_demo)
    for rank, result in enumerate(results):
        assert result["broadcast from rank 0"] == [10.0, 20.0]
        assert result["all_reduce (sum)"] == [3.0, 6.0]
        assert result["all_gather"] == [[1.0, 2.0], [2.0, 4.0]]
        # piece `rank` of the sum over ranks of 10 * r + piece
        assert result["reduce_scatter: result"] == [10.0 + 2 * rank] * 2


@pytest.mark.processes
def test_a_slow_task_times_out_and_is_stopped():
    pool = Workers(2, timeout=60.0)
    with pytest.raises(TimeoutError, match="timeout=1 s"):
        pool.run(sleep_on_rank, 30.0, timeout=1.0)
    assert pool.processes == []


@pytest.mark.processes
def test_lambdas_are_refused_before_spawning():
    with pytest.raises(ValueError, match="lambda"):
        launch(lambda rank, world_size: rank, 2)


def test_ring_all_reduce_by_hand_sums_and_sends_the_formula():
    for p in (2, 3, 4):
        tensors = [torch.randn(12) for _ in range(p)]
        results, sent = ring_all_reduce_by_hand(tensors)
        for result in results:
            assert torch.allclose(result, sum(tensors), atol=1e-6)
        assert sent * 4 == ring_all_reduce_bytes(12 * 4, p)
    assert ring_all_reduce_bytes(1000, 2) == 1000
    assert ring_all_reduce_bytes(1000, 1) == 0


@pytest.mark.processes
def test_a_failing_worker_is_reported_with_its_traceback_and_nothing_hangs(scale_workers):
    # After every other test that uses the session's workers (tests/conftest.py): it stops them (a later run would restart).
    scale_workers.run(collectives_demo)  # started and healthy
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match="rank 1 fails on purpose") as failure:
        scale_workers.run(fail_on_rank, 1, timeout=30.0)
    assert failure.value.rank == 1 and "Traceback" in failure.value.worker_traceback
    assert time.monotonic() - start < 30.0
    assert scale_workers.processes == []  # all stopped, including rank 0 stuck in its all-reduce


@pytest.mark.processes
def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="model"):
        Run(model="cnn")
    with pytest.raises(ValueError, match="world_size"):
        Workers(0)
    with pytest.raises(TypeError, match="timeout"):
        Workers(2, timeout="soon")


def test_world_outside_a_process_group_is_rank_0_of_1():
    from helpers.scale.workers import world
    assert world() == (0, 1)
