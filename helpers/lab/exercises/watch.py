"""What an answer really calls, whatever name it was captured under.

A grade must say who did the work. Swapping `F.cross_entropy` for a trap while a check runs is
beaten by `_ce = F.cross_entropy` in an earlier cell, and nothing stops an answer that just calls
the course's own version (`HandAdamW.step`, `tiled_attention_fa1`, a checker's `*_variant`, a
subclass of the course's class with `pass` as its body). So while a check runs, `Watch` asks
Python's profiler for every call made and judges each call by *what* is called (the code object,
or the C function), never by the name it was reached under:

- a call that the student's code makes into the course's package (`helpers/`) is refused, unless
  the exercise lists it among its building blocks (`BUILDING_BLOCKS` in `building_blocks.py`:
  what its own reference solution calls from earlier notebooks), or it is a property (reading a
  config's `head_dim` is data, not an answer);
- a call of one of the exercise's forbidden library functions (`torch.softmax` where the student
  writes the softmax) is refused wherever it happens below the student's code, inside another
  library function too (`F.softmax` calls `Tensor.softmax`).

Whose call it is: the nearest frame up the stack that is not library code (torch, the standard
library, anything installed) decides. A student frame (any other file: a notebook cell, a test)
makes it the student's call; a frame of the course's package makes it the course's (a checker
computing its expected values, or a building block at work inside). The wrapper that hands the
student's function to the checker counts as the student's, so `my_answer = course_function` is
the student calling the course.

Limits, said plainly: code the answer sends to worker processes is not watched (notebook 11's
ring and FSDP checks), and a student who rewrites the interpreter's own machinery on purpose
(sys.setprofile) can hide from any in-process check; the grader's integrity check
(`grader.py`) catches the usual ways of doing that.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

EXERCISES = Path(__file__).resolve().parent
HELPERS = EXERCISES.parent.parent
_LIBRARY_ROOTS = tuple(sorted({str(Path(p).resolve()) for p in (
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
    sys.prefix, sys.base_prefix, sys.exec_prefix) if p}))

STUDENT, COURSE, LIBRARY = "student", "course", "library"
_KIND: dict[str, str] = {}  # file name -> who wrote it
_BOUNDARY: set[types.CodeType] = set()  # wrappers that call the student's function: count as theirs
_CHECKERS: set[types.CodeType] = set()  # registered checkers: the course's, wherever they are written
# The exercises' machinery (check, expect_close, seeded, the watch and the grader) is no answer to
# anything: a student may call it, and the alarm of the time limit runs inside the student's frame.
_MACHINERY = {str(EXERCISES / name) for name in ("__init__.py", "watch.py", "grader.py")}


def kind_of_file(filename: str) -> str:
    """STUDENT, COURSE or LIBRARY for the code in `filename` (cached)."""
    if not isinstance(filename, str):
        raise TypeError(f"filename must be a str (a code object's co_filename), got {type(filename).__name__}")
    kind = _KIND.get(filename)
    if kind is None:
        if filename.startswith("<"):  # <string>, <frozen ...>: generated or built in, except IPython's
            kind = STUDENT if filename.startswith("<ipython-input") else LIBRARY
        else:
            path = str(Path(filename).resolve())
            if path.startswith(str(HELPERS) + "/") or path.startswith(str(HELPERS) + "\\"):
                kind = COURSE
            elif path.startswith(_LIBRARY_ROOTS):
                kind = LIBRARY
            else:
                kind = STUDENT
        _KIND[filename] = kind
    return kind


def _expect_function(value: Any, what: str) -> None:
    if not isinstance(getattr(value, "__code__", None), types.CodeType):
        raise TypeError(f"{what} must be a Python function, got {type(value).__name__}")


def mark_boundary(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: calls made by `function` itself count as the student's (see the module doc)."""
    _expect_function(function, "function")
    _BOUNDARY.add(function.__code__)
    return function


# The course's stand-ins: what `yours_or` hands the cells after an exercise whose answer does not
# pass yet (code -> that exercise). A later exercise may call a stand-in, as the notebook's own
# cells do, so that one wrong answer costs one exercise; the exercise it stands in for may not.
STAND_INS: dict[types.CodeType, str] = {}


def stand_in(helper: Any, exercise: str) -> None:
    """Note `helper` (a function, or a class and its methods) as the stand-in for `exercise`."""
    if not isinstance(exercise, str) or "." not in exercise:
        raise ValueError(f"exercise must be a name like 'masking.causal_softmax', got {exercise!r}")
    if not callable(helper):
        raise TypeError(f"helper must be a function or a class, got {type(helper).__name__}")
    functions = [v for v in vars(helper).values()] if isinstance(helper, type) else [helper]
    for function in functions:
        function = getattr(function, "__func__", function)
        code = getattr(function, "__code__", None)
        if isinstance(code, types.CodeType):
            STAND_INS.setdefault(code, exercise)


def mark_checker(function: Callable[..., Any]) -> None:
    """Count `function`'s calls as the course's, even if it is written outside the package (a test's
    own exercise)."""
    _expect_function(function, "function")
    _CHECKERS.add(function.__code__)


def _whose(frame: types.FrameType | None) -> str:
    """Who made a call from `frame`: the nearest frame up the stack that is not library code."""
    while frame is not None:
        code = frame.f_code
        if code in _BOUNDARY:
            return STUDENT
        if code in _CHECKERS or code in STAND_INS:
            return COURSE
        kind = kind_of_file(code.co_filename)
        if kind != LIBRARY:
            return kind
        frame = frame.f_back
    return LIBRARY


# --- naming the course's functions ---------------------------------------------------------------

_NAMES: dict[types.CodeType, str] = {}
_PROPERTIES: set[types.CodeType] = set()
_INDEXED: set[str] = set()


def _module_of(filename: str) -> str:
    relative = Path(filename).resolve().relative_to(HELPERS.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _index(module: types.ModuleType) -> None:
    """Name every function and method that `module` defines, and note its properties."""
    if module.__name__ in _INDEXED:
        return
    _INDEXED.add(module.__name__)

    def visit(owner: Any, prefix: str, depth: int) -> None:
        for attribute, value in list(vars(owner).items()):
            target = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if isinstance(value, property):
                for accessor in (value.fget, value.fset, value.fdel):
                    if accessor is not None and hasattr(accessor, "__code__"):
                        _PROPERTIES.add(accessor.__code__)
            elif isinstance(target, types.FunctionType) and target.__module__ == module.__name__:
                _name_code(target.__code__, f"{prefix}.{attribute}")
            elif isinstance(value, type) and value.__module__ == module.__name__ and depth < 3:
                visit(value, f"{prefix}.{attribute}", depth + 1)

    visit(module, module.__name__, 0)


def _name_code(code: types.CodeType, name: str) -> None:
    """Name `code` and, as Python's qualified names do, the functions nested in it."""
    _NAMES.setdefault(code, name)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _name_code(const, f"{name}.<locals>.{const.co_name}")


def course_name(code: types.CodeType) -> str:
    """The dotted name of a course function: helpers.training.by_hand.HandAdamW.step."""
    if not isinstance(code, types.CodeType):
        raise TypeError(f"code must be a code object, got {type(code).__name__}")
    if kind_of_file(code.co_filename) != COURSE:
        raise ValueError(f"code of {code.co_name!r} from {code.co_filename} is not the course's")
    if code not in _NAMES:
        module_name = _module_of(code.co_filename)
        module = sys.modules.get(module_name)
        if module is not None:
            _index(module)
    if code not in _NAMES:  # a nested function or lambda: its module and its (qualified) name
        _NAMES[code] = f"{_module_of(code.co_filename)}.{getattr(code, 'co_qualname', code.co_name)}"
    return _NAMES[code]


def is_property(code: types.CodeType) -> bool:
    course_name(code)  # indexes its module
    return code in _PROPERTIES


# --- forbidden library functions ------------------------------------------------------------------

def resolve(dotted: str) -> Any:
    """The object a dotted name like 'torch.nn.functional.softmax' or 'torch.Tensor.softmax' names."""
    if not isinstance(dotted, str) or "." not in dotted:
        raise ValueError(f"dotted must be a dotted name like 'torch.softmax', got {dotted!r}")
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            if not hasattr(found, part):
                raise ValueError(f"cannot find {dotted!r}: {'.'.join(parts[:cut])} has no {part!r}")
            found = getattr(found, part)
        return found
    raise ValueError(f"cannot find {dotted!r}: forbidden names are dotted paths like "
                     "'torch.nn.functional.cross_entropy'")


class Forbidden:
    """The library functions an exercise asks the student to write themselves, as the profiler
    sees them: Python functions by their code object, C functions by identity, and C methods
    (`Tensor.softmax`) by their name and the type they belong to."""

    def __init__(self, names: Iterable[str]) -> None:
        self.codes: dict[types.CodeType, str] = {}
        self.functions: dict[int, str] = {}
        self.methods: dict[str, tuple[type, str]] = {}
        for dotted in names:
            found = resolve(dotted)
            found = getattr(found, "__func__", found)
            # The function itself, not a decorator's wrapper: `@torch.no_grad()` wraps every
            # function in one shared code object, which a student's decorated answer runs too.
            found = inspect.unwrap(found) if isinstance(found, types.FunctionType) else found
            if isinstance(found, types.FunctionType):
                # a decorated function (@torch.no_grad()) is seen by its own code, not the decorator's
                # wrapper, whose code every function decorated the same way shares
                found = inspect.unwrap(found)
                self.codes[found.__code__] = dotted
            elif isinstance(found, (types.MethodDescriptorType, types.WrapperDescriptorType)):
                self.methods[found.__name__] = (found.__objclass__, dotted)
            elif isinstance(found, type) and hasattr(found, "__init__"):
                for name, value in vars(found).items():
                    if isinstance(value, types.FunctionType):
                        self.codes[value.__code__] = f"{dotted}.{name}"
            else:
                self.functions[id(found)] = dotted
        self._keep = list(names)

    def code(self, code: types.CodeType) -> str | None:
        return self.codes.get(code)

    def c_function(self, function: Any) -> str | None:
        named = self.functions.get(id(function))
        if named is not None:
            return named
        owner = getattr(function, "__self__", None)
        method = self.methods.get(getattr(function, "__name__", ""))
        if method is not None and owner is not None and isinstance(owner, method[0]):
            return method[1]
        return None


# --- the watch ----------------------------------------------------------------------------------

class Watch:
    """While inside, note the first call that the student's code may not make.

    forbidden: the exercise's forbidden library functions; allowed: dotted names of the course's
    functions the answer may call (its building blocks). After the block, `refused` is None or
    the dotted name of the first refused call, and `why` says what kind of call it was
    ("course" or "library"). With `record` set, course calls are noted in `seen`, not refused.
    """

    def __init__(self, forbidden: Forbidden, allowed: Iterable[str] = (), record: object = None,
                 course: bool = True, exercise: str = "") -> None:
        if not isinstance(forbidden, Forbidden):
            raise TypeError(f"forbidden must be a Forbidden, got {type(forbidden).__name__}")
        self.forbidden = forbidden
        self.course = course  # False: refuse only the forbidden library calls (tests of slips)
        self.exercise = exercise
        self.allowed = frozenset(allowed)
        self.record = record is not None  # note the course calls in `seen` instead of refusing them
        self.seen: set[str] = set()
        self.refused: str | None = None
        self.why = ""
        self._judged: dict[types.CodeType, bool] = {}
        self._previous: list[Any] = []

    def _course_call(self, code: types.CodeType) -> str | None:
        """The course function's name when the student may not call it."""
        if code in _BOUNDARY or str(Path(code.co_filename).resolve()) in _MACHINERY:
            return None
        if STAND_INS.get(code, self.exercise) != self.exercise:
            return None  # the course's stand-in for an earlier exercise
        name = course_name(code)
        if name in self.allowed or is_property(code):
            return None
        return name

    def _event(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if self.refused is not None:
            return
        if event == "call":
            code = frame.f_code
            named = self.forbidden.code(code)
            if named is None and self.course and kind_of_file(code.co_filename) == COURSE:
                refusable = self._judged.get(code)
                if refusable is None:
                    refusable = self._judged[code] = self._course_call(code) is not None
                if refusable and _whose(frame.f_back) == STUDENT:
                    if self.record:
                        self.seen.add(course_name(code))
                    else:
                        self.refused, self.why = course_name(code), "course"
                return
            if named is not None and _whose(frame.f_back) == STUDENT:
                self.refused, self.why = named, "library"
        elif event == "c_call":
            named = self.forbidden.c_function(arg)
            if named is not None and _whose(frame) == STUDENT:
                self.refused, self.why = named, "library"

    def __enter__(self) -> Watch:
        self._previous = [sys.getprofile(), threading.getprofile()]
        threading.setprofile(self._event)
        sys.setprofile(self._event)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self._previous[0])
        threading.setprofile(self._previous[1])


def inherited_course_code(answer: type, allowed: Iterable[str] = ()) -> str | None:
    """For a class answer: the first course class it inherits from (or whose function it holds),
    unless allowed: `class MyBlock(Block): pass` is the course's Block under another name."""
    if not isinstance(answer, type):
        raise TypeError(f"answer must be a class, got {type(answer).__name__}")
    allowed = frozenset(allowed)
    for base in inspect.getmro(answer):
        if base is answer and (getattr(base, "__module__", "") or "").split(".")[0] == "helpers":
            name = f"{base.__module__}.{base.__qualname__}"  # the course's class itself
            if name not in allowed:
                return name
        if base is answer:
            for value in vars(base).values():
                function = getattr(value, "__func__", value)
                code = getattr(function, "__code__", None)
                if code is not None and kind_of_file(code.co_filename) == COURSE:
                    name = course_name(code)
                    if name not in allowed:
                        return name
            continue
        module = getattr(base, "__module__", "") or ""
        if module.split(".")[0] == "helpers":
            name = f"{module}.{base.__qualname__}"
            if name not in allowed:
                return name
    return None


def course_callable(answer: Any, allowed: Iterable[str] = ()) -> str | None:
    """The course function an answer *is* (`my_answer = course_function`, a partial or bound
    method of one), unless allowed."""
    target = answer
    for _ in range(5):  # functools.partial, bound methods, wrappers: unwrap a few layers
        inner = getattr(target, "func", None) or getattr(target, "__func__", None) or \
            getattr(target, "__wrapped__", None)
        if inner is None:
            break
        target = inner
    code = getattr(target, "__code__", None)
    if code is not None and kind_of_file(code.co_filename) == COURSE:
        name = course_name(code)
        return None if name in frozenset(allowed) else name
    return None


# --- the rules an exercise states: tensors made and operations run ---------------------------------

class TensorLog:
    """While inside, note every tensor operation run and the largest tensor any of them made.

    For the rules an exercise's text states and its check enforces: "without the N x N matrix
    ever existing" (the largest tensor stays under N * N numbers), "no loop over positions" (the
    count of operations does not grow with the number of positions). Wrap only the student's
    call: the checker's own reference computations would count too.
    """

    def __init__(self) -> None:
        self.operations = 0
        self.largest = 0
        self.largest_shape: tuple[int, ...] = ()
        self._mode: Any = None

    def _saw(self, output: Any) -> None:
        import torch

        stack = [output]
        while stack:
            item = stack.pop()
            if isinstance(item, (tuple, list)):
                stack.extend(item)
            elif isinstance(item, torch.Tensor) and item.numel() > self.largest:
                self.largest, self.largest_shape = item.numel(), tuple(item.shape)

    def __enter__(self) -> TensorLog:
        from torch.utils._python_dispatch import TorchDispatchMode

        log = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
                output = func(*args, **(kwargs or {}))
                log.operations += 1
                log._saw(output)
                return output

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)


# --- code that runs where the watch cannot see --------------------------------------------------

class Refused(Exception):
    """Raised by a checker about to send an answer where no profiler follows it (worker
    processes) when the answer reaches the course's code by name: `name` is what it reaches."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name



def _course_object(value: Any, allowed: frozenset[str]) -> str | None:
    """The dotted name of `value` if it is a course function or class the answer may not use."""
    if isinstance(value, type) and (getattr(value, "__module__", "") or "").split(".")[0] == "helpers":
        name = f"{value.__module__}.{value.__qualname__}"
        return None if name in allowed else name
    return course_callable(value, allowed)


def reached_by_name(answer: Callable[..., Any], allowed: Iterable[str] = ()) -> str | None:
    """The first course function or class that `answer` reaches by the names its code reads (its
    globals, the course modules it imports, the other functions of the notebook it calls), unless
    allowed. For answers run in worker processes, where Watch cannot follow: a static look, which a
    name built at run time (importlib on a computed string) escapes."""
    if not callable(answer):
        raise TypeError(f"answer must be a function, got {type(answer).__name__}")
    from helpers.scale.cell_functions import names_read  # what notebook 11 ships to its workers

    allowed = frozenset(allowed)
    stack, seen = [inspect.unwrap(answer)], set()
    while stack:
        function = stack.pop()
        code = getattr(function, "__code__", None)
        if code is None or code in seen:
            continue
        seen.add(code)
        names = names_read(code)
        namespace = dict(getattr(function, "__globals__", {}))
        for free, cell in zip(code.co_freevars, getattr(function, "__closure__", None) or (), strict=False):
            try:
                namespace[free] = cell.cell_contents
            except ValueError:  # a cell not filled yet
                continue
        names |= set(code.co_freevars)
        modules = [namespace[n] for n in names if isinstance(namespace.get(n), types.ModuleType)]
        for dotted in names:  # `from helpers.x import y` reads the module's dotted name
            if dotted.split(".")[0] == "helpers":
                try:
                    modules.append(importlib.import_module(dotted))
                except ImportError:
                    continue
        for module in modules:
            if module.__name__.split(".")[0] == "helpers":
                for name in names:
                    found = _course_object(getattr(module, name, None), allowed)
                    if found:
                        return found
        for name in names:
            value = namespace.get(name)
            found = _course_object(value, allowed)
            if found:
                return found
            if isinstance(value, types.FunctionType) and kind_of_file(value.__code__.co_filename) == STUDENT:
                stack.append(value)
    return None
