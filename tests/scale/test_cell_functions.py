"""helpers.scale.cell_functions in this process (no worker started): what `ship` sends for a notebook
cell's function (its source, the cell functions it calls, the modules and values it reads), that
`CellFunction.build` rebuilds a function that behaves as the original and whose traceback shows
its lines, and every refusal read in full."""

from __future__ import annotations

import functools
import linecache
import math
import pickle
import re
import sys
import threading
import traceback
import types

import pytest
import torch
from shared_tools import as_ipython_cell, full

from helpers.scale import cell_functions as cf
from helpers.scale.cell_functions import CellFunction, ship
from helpers.scale.workers import Workers, launch, ring_all_reduce

CELL = '''
import functools
import math
import torch.nn.functional as F
from math import sqrt

SCALE = 3
lock = __import__("threading").Lock()


def helper(x):
    return [sqrt(v) for v in x]


def ping(n):
    return 0 if n == 0 else pong(n - 1) + 1


def pong(n):
    return 0 if n == 0 else ping(n - 1) + 1


def task(rank, world_size):
    """Reads a module by alias, a value, a function of a module, another cell's function."""
    values = [v * SCALE for v in range(rank + 1)]
    return helper(values), F.relu is not None, math.pi, len(values)


def nested_reader(rank, world_size):
    return (lambda: [SCALE for _ in range(1)])()


@functools.lru_cache
def decorated(rank, world_size):
    return rank + SCALE


def reads_lock(rank, world_size):
    return lock


class Box:
    def method(self, rank, world_size):
        return rank


box = Box()


def reads_box(rank, world_size):
    return box


def reads_class(rank, world_size):
    return Box


def fails(rank, world_size):
    x = 1
    return x / 0


async def coroutine(rank, world_size):
    return rank


def make():
    def inner(rank, world_size):
        return rank
    return inner


def make_closure():
    offset = 1

    def inner(rank, world_size):
        return rank + offset
    return inner


anonymous = lambda rank, world_size: rank  # noqa: E731
'''


@pytest.fixture
def cell(monkeypatch):
    """CELL executed as the module __main__ with its source in linecache, as IPython does."""
    yield from as_ipython_cell(monkeypatch, CELL, "<ipython-input-7-cell>")


def test_a_cell_function_travels_with_what_it_reads_and_is_rebuilt(cell):
    shipped = cf.ship(cell.task)
    assert shipped.name == "task" and list(shipped.sources) == ["task", "helper"]
    assert shipped.sources["task"].startswith("def task(rank, world_size):\n")
    assert shipped.modules == {"F": "torch.nn.functional", "math": "math"}
    assert shipped.values == {"SCALE": 3, "sqrt": math.sqrt}
    shipped = pickle.loads(pickle.dumps(shipped))  # it travels
    built = shipped.build()
    assert built.__name__ == "task" and built.__module__ == "__cell__"
    assert built(2, 4) == cell.task(2, 4) == ([0.0, math.sqrt(3), math.sqrt(6)], True, math.pi, 3)
    assert built.__globals__["helper"].__module__ == "__cell__"
    assert built.__globals__["__builtins__"] is __builtins__ or built.__globals__["__builtins__"].__name__ == "builtins"


def test_mutually_recursive_cell_functions_are_sent_once_each(cell):
    shipped = cf.ship(cell.ping)
    assert sorted(shipped.sources) == ["ping", "pong"] and shipped.values == {} == shipped.modules
    assert shipped.build()(5) == 5


def test_names_inside_lambdas_and_comprehensions_are_read(cell):
    assert {"SCALE", "range"} <= cf.names_read(cell.nested_reader.__code__)
    shipped = cf.ship(cell.nested_reader)
    assert shipped.values == {"SCALE": 3} and shipped.build()(0, 1) == [3]


def test_decorators_are_left_behind(cell):
    shipped = cf.ship(cell.decorated.__wrapped__)
    assert shipped.sources["decorated"] == "def decorated(rank, world_size):\n    return rank + SCALE"
    assert "functools" not in shipped.modules and shipped.build()(1, 2) == 4


def test_a_method_of_a_cell_class_is_sent_dedented(cell):
    source = cf._source_without_decorators(cell.Box.method)
    assert source == "def method(self, rank, world_size):\n    return rank"


def test_a_rebuilt_functions_traceback_shows_its_lines(cell):
    built = cf.ship(cell.fails).build()
    with pytest.raises(ZeroDivisionError) as error:
        built(0, 1)
    frame = traceback.extract_tb(error.value.__traceback__)[-1]
    assert frame.filename == "<notebook cell: fails>" and frame.lineno == 3 and frame.line == "return x / 0"
    assert linecache.getline("<notebook cell: fails>", 2) == "    x = 1\n"
    linecache.checkcache()  # what traceback printing does: the lines stay, there is no file to stat
    assert linecache.getlines("<notebook cell: fails>") == ["def fails(rank, world_size):\n", "    x = 1\n",
                                                           "    return x / 0"]


def test_build_imports_each_module_under_its_alias():
    source = "def f():\n    return alias.pi, other.sep, VALUE\n"
    built = cf.CellFunction("f", {"f": source}, {"alias": "math", "other": "os"}, {"VALUE": 7}).build()
    import os
    assert built() == (math.pi, os.sep, 7)
    assert cf.CellFunction("g", {"g": "def g():\n    return 1\n"}).build()() == 1  # defaults: nothing to add


def test_what_cannot_travel_is_refused_with_its_name(cell):
    message = ("fn='reads_lock' reads the global 'lock' (lock), which cannot be sent to the workers "
               "(TypeError: cannot pickle '_thread.lock' object); expected picklable globals: pass it "
               "as an argument, or create it inside the function")
    with pytest.raises(TypeError, match=full(message)):
        cf.ship(cell.reads_lock)
    message = ("fn='{}' reads 'box', a class (or an object of a class) defined in a notebook cell, which "
               "the workers cannot rebuild; expected a class defined in a module, or pass the plain values "
               "it holds as arguments")
    with pytest.raises(TypeError, match=full(message.format('reads_box'))):
        cf.ship(cell.reads_box)
    with pytest.raises(TypeError, match=re.escape("fn='reads_class' reads 'Box', a class (or an object")):
        cf.ship(cell.reads_class)
    message = ("fn='make_closure.<locals>.inner' reads variables of an enclosing function (('offset',)), "
               "which cannot be sent; expected a function defined at the top of a cell")
    with pytest.raises(ValueError, match=full(message)):
        cf.ship(cell.make_closure())
    message = ("fn='{}' cannot be sent to the workers: a lambda or a function defined inside another has "
               "no source of its own to send; expected a function defined with `def` at the top of a "
               "notebook cell or of a module")
    with pytest.raises(ValueError, match=full(message.format('<lambda>'))):
        cf.ship(cell.anonymous)
    with pytest.raises(ValueError, match=full(message.format('make.<locals>.inner'))):
        cf.ship(cell.make())
    cell.anonymous.__qualname__ = "anonymous"  # renamed: still a lambda, refused as one
    with pytest.raises(ValueError, match=full(message.format('anonymous'))):
        cf.ship(cell.anonymous)
    message = ("fn='coroutine' cannot be sent to the workers: its source is not one plain `def`; "
               "expected a function defined with `def` at the top of a cell")
    with pytest.raises(ValueError, match=full(message)):
        cf.ship(cell.coroutine)
    renamed = cell.task
    renamed.__name__ = "other"
    with pytest.raises(ValueError, match="^fn='task' cannot be sent to the workers: its source is not one plain"):
        cf.ship(renamed)


def test_a_function_without_source_is_refused_naming_why(monkeypatch):
    module = types.ModuleType("__main__")
    exec(compile("def f(rank, world_size):\n    return rank\n", "<nowhere>", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", module)
    with pytest.raises(ValueError, match=r"^fn='f' cannot be sent to the workers: its source cannot be "
                                         r"found \(.+\); expected a function defined with `def` in a "
                                         r"notebook cell or a module$"):
        cf.ship(module.f)


def module_level(rank, world_size):
    return rank


def test_module_functions_and_picklable_callables_travel_as_themselves():
    assert cf.ship(module_level) is module_level
    assert cf.ship(math.sqrt) is math.sqrt  # a builtin: pickled by name
    partial = functools.partial(module_level, 1)
    assert cf.ship(partial) is partial
    message = ("fn='{}' cannot be sent to the workers: a lambda or a nested function has no name to "
               "import it by; expected a function defined with `def` at the top of a module or a "
               "notebook cell")
    here = "test_module_functions_and_picklable_callables_travel_as_themselves.<locals>"
    with pytest.raises(ValueError, match=full(message.format(here + '.<lambda>'))):
        cf.ship(lambda rank, world_size: rank)

    def nested(rank, world_size):
        return rank

    with pytest.raises(ValueError, match=full(message.format(here + '.nested'))):
        cf.ship(nested)
    lock_partial = functools.partial(module_level, threading.Lock())
    with pytest.raises(ValueError, match=r"^fn='functools.partial\(<function module_level at 0x[0-9a-f]+>, "
                                         r"<unlocked _thread.lock object at 0x[0-9a-f]+>\)' cannot be sent "
                                         r"to the workers \(cannot pickle '_thread.lock' object\); expected "
                                         r"a function defined with `def`$"):
        cf.ship(lock_partial)
    with pytest.raises(TypeError, match="^fn is a int, expected a function$"):
        cf.ship(3)


# A function defined in a notebook cell (module `__main__`, source known only to linecache, as
# IPython keeps it) runs on real spawned workers; what cannot travel is refused before any start.

WORKER_CELL = '''
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
def worker_cell(monkeypatch):
    """The cell's source executed in a fresh module named __main__, registered in linecache like
    an IPython cell, with sys.modules['__main__'] pointing at it (no __file__: spawn cannot
    re-import it, exactly as in a notebook)."""
    yield from as_ipython_cell(monkeypatch, WORKER_CELL, "<ipython-input-1-cell>")


@pytest.mark.processes
@pytest.mark.slow
def test_a_cell_function_runs_on_two_real_processes(worker_cell):
    shipped = ship(worker_cell.student_sum)
    assert isinstance(shipped, CellFunction)
    assert set(shipped.sources) == {"student_sum", "double"} and shipped.values == {"SCALE": 10.0}
    assert shipped.modules == {"torch": "torch", "dist": "torch.distributed"}
    values = [[1.0, 2.0], [3.0, 4.0]]
    results = launch(worker_cell.student_sum, 2, values, timeout=60.0)
    assert results == [[80.0, 120.0], [80.0, 120.0]]  # 2 x 10 x (1 + 3, 2 + 4) on both ranks


def test_a_module_function_still_travels_by_name(worker_cell):
    assert ship(ring_all_reduce) is ring_all_reduce


@pytest.mark.parametrize("name, error, words", [
    ("reads_a_lock", TypeError, "reads the global 'lock'"),
    ("reads_a_cell_class", TypeError, "'box', a class (or an object of a class) defined in a notebook cell"),
])
@pytest.mark.processes
def test_what_cannot_travel_is_named_before_any_process_starts(worker_cell, name, error, words):
    pool = Workers(2)
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        pool.run(getattr(worker_cell, name))
    assert pool.processes == []


@pytest.mark.processes
def test_lambdas_and_closures_are_refused(worker_cell):
    with pytest.raises(ValueError, match="lambda"):
        launch(lambda rank, world_size: rank, 2)
    with pytest.raises(ValueError, match="enclosing function"):
        ship(worker_cell.make_closure())
    with pytest.raises(TypeError, match="fn is a int"):
        ship(3)


def test_a_function_without_source_is_refused(monkeypatch):
    module = types.ModuleType("__main__")
    exec(compile("def f(rank, world_size):\n    return rank\n", "<nowhere>", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", module)
    with pytest.raises(ValueError, match="source cannot be found"):
        ship(module.f)


@pytest.mark.processes
@pytest.mark.slow
def test_the_ring_all_reduce_sums_on_three_processes():
    tensors = [torch.arange(7.0) * (rank + 1) + rank for rank in range(3)]
    results = launch(ring_all_reduce, 3, tensors, timeout=60.0)
    assert all(torch.equal(result, sum(tensors)) for result in results)
    with pytest.raises(ValueError, match="at least world_size=3 values"):
        ring_all_reduce(0, 3, [torch.ones(2)] * 3)
    assert threading.active_count() >= 1


def test_names_read_refuses_what_is_not_a_code_object():
    with pytest.raises(TypeError, match="^code is function, expected a code object"):
        cf.names_read(lambda: None)
    assert "len" in cf.names_read((lambda xs: len(xs)).__code__)
