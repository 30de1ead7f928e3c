"""A function defined in a notebook cell (module `__main__`, source known only to linecache, as
IPython keeps it) runs on real spawned workers; what cannot travel is refused before any start."""

from __future__ import annotations

import sys
import threading
import types

import pytest
import torch
from shared_tools import as_ipython_cell

from helpers.scale.cell_functions import CellFunction, ship
from helpers.scale.workers import Workers, launch, ring_all_reduce

CELL = '''
import torch
import torch.distributed as dist

SCALE = 10.0


def double(x):
    return 2 * x


def student_sum(rank, world_size, values):
    """Each rank's tensor times SCALE, summed over the ranks, doubled by another cell's function."""
    mine = torch.tensor(values[rank]) * SCALE
    dist.all_reduce(mine)
    return double(mine).tolist()


lock = __import__("threading").Lock()


def reads_a_lock(rank, world_size):
    return lock.locked()


class Box:
    pass


box = Box()


def reads_a_cell_class(rank, world_size):
    return box


def make_closure():
    offset = 1

    def inner(rank, world_size):
        return rank + offset
    return inner
'''


@pytest.fixture
def cell(monkeypatch):
    """The cell's source executed in a fresh module named __main__, registered in linecache like
    an IPython cell, with sys.modules['__main__'] pointing at it (no __file__: spawn cannot
    re-import it, exactly as in a notebook)."""
    yield from as_ipython_cell(monkeypatch, CELL, "<ipython-input-1-cell>")


def test_a_cell_function_runs_on_two_real_processes(cell):
    shipped = ship(cell.student_sum)
    assert isinstance(shipped, CellFunction)
    assert set(shipped.sources) == {"student_sum", "double"} and shipped.values == {"SCALE": 10.0}
    assert shipped.modules == {"torch": "torch", "dist": "torch.distributed"}
    values = [[1.0, 2.0], [3.0, 4.0]]
    results = launch(cell.student_sum, 2, values, timeout=60.0)
    assert results == [[80.0, 120.0], [80.0, 120.0]]  # 2 x 10 x (1 + 3, 2 + 4) on both ranks


def test_a_module_function_still_travels_by_name(cell):
    assert ship(ring_all_reduce) is ring_all_reduce


@pytest.mark.parametrize("name, error, words", [
    ("reads_a_lock", TypeError, "reads the global 'lock'"),
    ("reads_a_cell_class", TypeError, "'box', a class (or an object of a class) defined in a notebook cell"),
])
def test_what_cannot_travel_is_named_before_any_process_starts(cell, name, error, words):
    pool = Workers(2)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        pool.run(getattr(cell, name))
    assert pool.processes == []


def test_lambdas_and_closures_are_refused(cell):
    with pytest.raises(ValueError, match="lambda"):
        launch(lambda rank, world_size: rank, 2)
    with pytest.raises(ValueError, match="enclosing function"):
        ship(cell.make_closure())
    with pytest.raises(TypeError, match="fn is a int"):
        ship(3)


def test_a_function_without_source_is_refused(monkeypatch):
    module = types.ModuleType("__main__")
    exec(compile("def f(rank, world_size):\n    return rank\n", "<nowhere>", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", module)
    with pytest.raises(ValueError, match="source cannot be found"):
        ship(module.f)


def test_the_ring_all_reduce_sums_on_three_processes():
    tensors = [torch.arange(7.0) * (rank + 1) + rank for rank in range(3)]
    results = launch(ring_all_reduce, 3, tensors, timeout=60.0)
    assert all(torch.equal(result, sum(tensors)) for result in results)
    with pytest.raises(ValueError, match="at least world_size=3 values"):
        ring_all_reduce(0, 3, [torch.ones(2)] * 3)
    assert threading.active_count() >= 1
