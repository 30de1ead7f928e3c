"""The ranks the checkers of notebook 11 run the student's code on: two threads joined by an
in-place all-reduce (the data-parallel exercise), and three worker processes kept for a session
(the ring all-reduce and FSDP exercises). Kept apart from the checkers so each reads in one sitting."""

from __future__ import annotations

import threading
from collections.abc import Callable

from torch import Tensor, nn

from helpers.lab.exercises import ExerciseFailed


class ThreadRing:
    """Two ranks in two threads and an in-place sum between them, as `dist.all_reduce` does: each
    rank blocks in all_reduce until the other rank has called it too."""

    def __init__(self, models: tuple[nn.Module, nn.Module]) -> None:
        self.grads = [{id(p.grad): name for name, p in m.named_parameters()} for m in models]
        self.barrier = threading.Barrier(2, timeout=5.0)
        self.slots: list[Tensor | None] = [None, None]
        self.calls: list[list[str]] = [[], []]

    def all_reduce(self, rank: int) -> Callable[[Tensor], None]:
        def all_reduce(tensor: Tensor) -> None:
            if not isinstance(tensor, Tensor) or id(tensor) not in self.grads[rank]:
                raise ExerciseFailed("all_reduce was called on something that is not a parameter's "
                                     "gradient.", fix="all-reduce each parameter's .grad tensor, not "
                                                      "the parameter itself or a copy of it.")
            self.calls[rank].append(self.grads[rank][id(tensor)])
            self.slots[rank] = tensor.detach().clone()
            try:
                self.barrier.wait()  # both ranks have put in their tensor
                total = self.slots[0] + self.slots[1]
                self.barrier.wait()  # both have read: the slots may be reused
            except threading.BrokenBarrierError:
                raise ExerciseFailed("the two ranks called all_reduce a different number of times.",
                                     fix="every rank must reduce the same tensors in the same "
                                         "order.") from None
            tensor.copy_(total)
        return all_reduce


def run_two_ranks(student: Callable, models: tuple[nn.Module, nn.Module], ring: ThreadRing) -> None:
    """student(model_r, all_reduce_r, 2) on both ranks at once; re-raises the first error."""
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            student(models[rank], ring.all_reduce(rank), 2)
        except BaseException as error:  # noqa: BLE001 - handed to the checking thread
            errors.append(error)
            ring.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20.0)
    real = [e for e in errors if not isinstance(e, ExerciseFailed)] or errors
    if real:
        raise real[0]


def is_stub(fn: Callable) -> bool:
    """True when fn's body (after its docstring) is only `raise NotImplementedError`: the untouched
    stub, recognised without starting any process."""
    import ast
    import inspect
    import textwrap
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
    except (OSError, TypeError, SyntaxError, IndexError, AttributeError):
        return False
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0])


_POOL: list = []  # three workers kept for the checks of one session (started on first use)


def three_workers():
    import atexit

    from helpers.scale.workers import Workers, sleep_on_rank
    if not _POOL:
        _POOL.append(Workers(3, timeout=30.0))
        atexit.register(_POOL[0].close)
    if not _POOL[0].processes:  # start them with time to spare: a busy machine starts slowly
        _POOL[0].run(sleep_on_rank, 0.0, timeout=180.0)
    return _POOL[0]


def run_on_three(student: Callable, tensors: list[Tensor], on_timeout: str) -> list:
    """The student's function run on three workers; a stub, a crash or a hang as the exercise's verdict."""
    import inspect

    from helpers.lab.exercises import watch
    from helpers.scale.workers import WorkerFailed

    # No profiler follows the answer into the workers, so look at what it reaches by name (the
    # ring and the FSDP piece have no building blocks from the course).
    reached = watch.reached_by_name(student)
    if reached:
        raise watch.Refused(reached)
    try:  # the student's own function, unwrapped: the workers import it by its source
        return three_workers().run(inspect.unwrap(student), tensors)
    except TimeoutError:
        raise ExerciseFailed("the ranks did not finish within 30 s.", fix=on_timeout) from None
    except WorkerFailed as failure:
        last = failure.worker_traceback.strip().splitlines()[-1]
        if last.startswith("NotImplementedError"):
            raise NotImplementedError from None
        raise ExerciseFailed(f"rank {failure.rank} raised {last}") from None

