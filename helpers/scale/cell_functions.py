"""Notebook 11: send a function defined in a notebook cell to spawned worker processes.

    ship(fn)         the function as something a spawned process can rebuild: itself when it
                     lives in a module (it travels by name), else a CellFunction carrying its
                     source and the globals it reads; raises ValueError/TypeError naming what
                     cannot travel, before any process starts
    CellFunction     the source of a cell's function (and of the cell functions it calls), the
                     modules to import and the picklable values it reads; .build() rebuilds it

A spawned worker is a fresh Python: it imports a module's function by name, but a function
defined in a notebook cell lives in `__main__`, which the worker does not have. Its source does
travel (IPython keeps each cell's text, so `inspect.getsource` finds it): the worker executes
the source in a fresh namespace holding the modules and values the function reads.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import linecache
import pickle
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CellFunction:
    """A notebook cell's function, rebuilt in a worker from its source.

    name: the function to return; sources: name -> source of it and of the cell functions it
    calls; modules: global name -> module to import; values: global name -> picklable value.
    """

    name: str
    sources: dict[str, str]
    modules: dict[str, str] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Callable[..., Any]:
        namespace: dict[str, Any] = {"__name__": "__cell__", "__builtins__": builtins}
        namespace.update({alias: importlib.import_module(module) for alias, module in self.modules.items()})
        namespace.update(self.values)
        for name, source in self.sources.items():
            filename = f"<notebook cell: {name}>"
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show lines
            exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the student's own code
        return namespace[self.name]


def names_read(code: types.CodeType) -> set[str]:
    """Every global name a code object (and the functions, lambdas, comprehensions inside it) reads."""
    if not isinstance(code, types.CodeType):
        raise TypeError(f"code is {type(code).__name__}, expected a code object (a function's "
                        "__code__)")
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= names_read(const)
    return names


def _source_without_decorators(fn: types.FunctionType) -> str:
    """The function's own `def`, dedented, without decorators (they may not exist in the worker)."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as error:
        raise ValueError(f"fn={fn.__qualname__!r} cannot be sent to the workers: its source cannot "
                         f"be found ({error}); expected a function defined with `def` in a notebook "
                         "cell or a module") from None
    definition = ast.parse(source).body[0]
    if not isinstance(definition, ast.FunctionDef) or definition.name != fn.__name__:
        raise ValueError(f"fn={fn.__qualname__!r} cannot be sent to the workers: its source is not "
                         "one plain `def`; expected a function defined with `def` at the top of a cell")
    definition.decorator_list = []
    return ast.unparse(definition)


def _collect(fn: types.FunctionType, shipped: CellFunction, seen: set[str]) -> None:
    """Add fn's source and everything it reads from the notebook's globals to `shipped`."""
    what = f"fn={fn.__qualname__!r}"
    if fn.__closure__:
        raise ValueError(f"{what} reads variables of an enclosing function ({fn.__code__.co_freevars}), "
                         "which cannot be sent; expected a function defined at the top of a cell")
    if fn.__name__ == "<lambda>" or "<" in fn.__qualname__:
        raise ValueError(f"{what} cannot be sent to the workers: a lambda or a function defined "
                         "inside another has no source of its own to send; expected a function "
                         "defined with `def` at the top of a notebook cell or of a module")
    seen.add(fn.__name__)
    shipped.sources[fn.__name__] = _source_without_decorators(fn)
    for name in sorted(names_read(fn.__code__)):
        if name in seen or name not in fn.__globals__:
            continue  # an attribute name, a builtin, or already collected
        value = fn.__globals__[name]
        if isinstance(value, types.ModuleType):
            shipped.modules[name] = value.__name__
        elif isinstance(value, types.FunctionType) and value.__module__ == "__main__":
            _collect(value, shipped, seen)  # another cell's function: send its source too
        elif getattr(type(value), "__module__", "") == "__main__" or (
                isinstance(value, type) and value.__module__ == "__main__"):
            raise TypeError(f"{what} reads {name!r}, a class (or an object of a class) defined in a "
                            "notebook cell, which the workers cannot rebuild; expected a class "
                            "defined in a module, or pass the plain values it holds as arguments")
        else:
            try:
                pickle.dumps(value)
            except Exception as error:  # noqa: BLE001 - pickle raises many types
                raise TypeError(f"{what} reads the global {name!r} ({type(value).__name__}), which "
                                f"cannot be sent to the workers ({type(error).__name__}: {error}); "
                                "expected picklable globals: pass it as an argument, or create it "
                                "inside the function") from None
            shipped.values[name] = value


def ship(fn: Callable[..., Any]) -> Callable[..., Any] | CellFunction:
    """fn itself if a spawned process can import it, else a CellFunction that rebuilds it there."""
    if not callable(fn):
        raise TypeError(f"fn is a {type(fn).__name__}, expected a function")
    qualname = getattr(fn, "__qualname__", repr(fn))
    if not isinstance(fn, types.FunctionType):
        try:
            pickle.dumps(fn)
        except Exception as error:  # noqa: BLE001
            raise ValueError(f"fn={qualname!r} cannot be sent to the workers ({error}); expected a "
                             "function defined with `def`") from None
        return fn
    if fn.__module__ != "__main__":
        if "<" in qualname:
            raise ValueError(f"fn={qualname!r} cannot be sent to the workers: a lambda or a nested "
                             "function has no name to import it by; expected a function defined "
                             "with `def` at the top of a module or a notebook cell")
        return fn  # importable by name
    shipped = CellFunction(fn.__name__, {})
    _collect(fn, shipped, set())
    return shipped
