"""Checked exercises: the student writes a function, `check` tells them, kindly, how it went.

Each notebook's exercises live in a module of this package named after the notebook
(`helpers/lab/exercises/tokenization.py` for `01_tokenization.ipynb`). An exercise is a function
decorated with `@exercise(hint=...)` that receives the student's answer and raises
`ExerciseFailed` with a helpful message when the answer is wrong. Notebooks call
`check("tokenization.count_chars", my_function)`.

`check` never shows a traceback: a wrong answer, a crash inside the student's code, an
exercise not attempted yet (`raise NotImplementedError`) and a function that does not return
within TIME_LIMIT seconds (an endless loop) each print one short explanation.

Feedback comes in steps, as a teacher would give it: the first wrong try says only what is
wrong; from the second wrong try of the same exercise on, the message also says how to fix it
(the failure's own `fix`, else the exercise's `hint`, both in words, never the code).

Grading: in the notebooks every `check(...)` sits in a locked nbgrader test cell. Under
`nbgrader autograde` (which sets NBGRADER_EXECUTION=autograde) and with STRICT set, a failing
check raises AssertionError with its message, so the cell fails and the feedback names the
check and what was wrong.
"""

from __future__ import annotations

import importlib
import numbers
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from helpers.lab.exercises import watch

# Tests set this to True so that a failing solution raises instead of printing.
STRICT = False

# Seconds a checker, with the student's code inside it, may run before `check` gives up. Every
# checker of the course finishes in well under a second with a correct answer.
TIME_LIMIT = 30.0


class ExerciseFailed(Exception):
    """Raised by an exercise's checker: `message` says what is wrong, `fix` (optional) how to fix
    it in words. `check` shows `fix` only from the student's second wrong try on."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class Exercise:
    name: str
    checker: Callable[[Any], str | None]
    hint: str
    task: str = ""
    time_limit: float | None = None  # more seconds than TIME_LIMIT, for a checker that starts processes
    points: int = 1  # nbgrader points of the exercise's test cell
    forbidden: tuple[str, ...] = ()  # dotted names the student's code may not call


_REGISTRY: dict[str, Exercise] = {}

# Every library way to a softmax, for the exercises that ask the student to write it: a log-softmax
# exponentiated is a softmax too.
SOFTMAX_CALLS = ("torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax",
                 "torch.special.softmax", "torch.log_softmax", "torch.nn.functional.log_softmax",
                 "torch.Tensor.log_softmax", "torch.special.log_softmax", "torch._softmax",
                 "torch._log_softmax")

# The grader's hidden round runs every checker again with its random inputs drawn from other
# seeds (`seeded`, `reseed` add this offset), so that an answer which hard-codes what the visible
# check printed fails there. 0 in the visible check.
SEED_OFFSET = 0


def _expect_seed(seed: Any) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a whole number >= 0, got {seed!r}")


def seeded(seed: int) -> Any:
    """A torch.Generator seeded with `seed` (plus SEED_OFFSET in the grader's hidden round)."""
    import torch

    _expect_seed(seed)
    return torch.Generator().manual_seed(seed + SEED_OFFSET)


def reseed(seed: int) -> None:
    """torch.manual_seed(seed), plus SEED_OFFSET in the grader's hidden round."""
    import torch

    _expect_seed(seed)
    torch.manual_seed(seed + SEED_OFFSET)


def hidden_round() -> bool:
    """True while the grader's hidden tests run: a checker may then add cases of its own."""
    return SEED_OFFSET != 0


def exercise(hint: str, task: str = "", time_limit: float | None = None, points: int = 1,
             forbidden: tuple[str, ...] = ()) -> Callable[[Callable[[Any], str | None]], Callable[[Any], str | None]]:
    """Register the decorated checker as `<module>.<function name>`.

    hint: how to fix a wrong answer, in words (the steps, never the code); shown from the second
    wrong try on, when the failure carries no `fix` of its own.
    task: what the student writes and what the check tests, shown while the exercise is not
    attempted yet. It must not give the recipe.
    time_limit: the seconds this checker may take at least (one that starts worker processes
    needs more than TIME_LIMIT on a busy machine).
    points: what the exercise's nbgrader test cell is worth (the build writes it).
    forbidden: dotted names of library functions the exercise asks the student to write
    themselves (e.g. "torch.nn.functional.cross_entropy"); calling one fails the check by name.
    """
    if not isinstance(points, int) or isinstance(points, bool) or points < 1:
        raise ValueError(f"points must be a positive int, got {points!r}")
    for dotted in forbidden:
        if not isinstance(dotted, str) or "." not in dotted:
            raise ValueError(f"forbidden names are dotted paths like 'torch.nn.functional.cross_entropy', "
                             f"got {dotted!r}")

    def register(checker: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        module = checker.__module__.rsplit(".", 1)[-1]
        name = f"{module}.{checker.__name__}"
        watch.mark_checker(checker)
        _REGISTRY[name] = Exercise(name=name, checker=checker, hint=hint, task=task,
                                   time_limit=time_limit, points=points, forbidden=tuple(forbidden))
        return checker

    return register


def get(name: str) -> Exercise:
    """The registered exercise called `name` ("notebook.exercise"), importing its module."""
    module, _, _ = name.partition(".")
    if name not in _REGISTRY:
        try:
            importlib.import_module(f"{__name__}.{module}")
        except ModuleNotFoundError as error:
            raise KeyError(f"no exercise module {module!r} for exercise {name!r}") from error
    if name not in _REGISTRY:
        known = ", ".join(sorted(n for n in _REGISTRY if n.startswith(module + ".")))
        raise KeyError(f"no exercise named {name!r}; this notebook has: {known}")
    return _REGISTRY[name]


def all_exercises() -> dict[str, Exercise]:
    """Every exercise of every notebook module (imports them all)."""
    from pkgutil import iter_modules

    for info in iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return dict(_REGISTRY)


def _where_it_broke(error: BaseException) -> str:
    """The last line of the student's own code in the traceback, if there is one."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "helpers" not in f.filename]
    if not frames:
        return ""
    frame = frames[-1]
    return f" (in `{frame.name}`, at `{(frame.line or '').strip()}`)"


class _TimeUp(BaseException):
    """Raised inside a checker that ran past its time limit. A BaseException, so that a
    student's `except Exception:` cannot swallow it."""


def _run_with_time_limit(checker: Callable[[Any], str | None], answer: Any,
                         seconds: float | None) -> str | None:
    """checker(answer), raising _TimeUp if it has not returned after `seconds` (None: no limit).

    In the main thread of a Unix process (a notebook kernel) an alarm signal interrupts the
    student's code itself. Elsewhere (Windows, other threads) the checker runs in a helper
    thread that is abandoned when the time is up: it cannot be stopped, only left behind.
    """
    if seconds is None:
        return checker(answer)
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        def time_up(signum: int, frame: Any) -> None:
            raise _TimeUp

        previous = signal.signal(signal.SIGALRM, time_up)
        started = time.monotonic()
        earlier_alarm, earlier_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return checker(answer)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if earlier_alarm:  # someone else's alarm was pending: set it again
                left = earlier_alarm - (time.monotonic() - started)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), earlier_interval)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = checker(answer)
        except BaseException as error:  # noqa: BLE001 - handed to the calling thread
            outcome["error"] = error

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise _TimeUp
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@watch.mark_boundary
def _call_answer(answer: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Calls the student's function: what it calls directly counts as the student's (watch.py)."""
    return answer(*args, **kwargs)


def _handed(answer: Any) -> Any:
    """The student's function as the checker receives it: wrapped, so that `my_answer =
    course_function` shows up as the student calling the course (a class is handed as it is)."""
    if isinstance(answer, type) or not callable(answer):
        return answer

    def handed(*args: Any, **kwargs: Any) -> Any:
        return _call_answer(answer, args, kwargs)

    # The answer's own names, for the checkers' messages (one that sends the answer to worker
    # processes unwraps it: inspect.unwrap follows __wrapped__).
    for attribute in ("__name__", "__qualname__", "__module__", "__doc__"):
        if hasattr(answer, attribute):
            setattr(handed, attribute, getattr(answer, attribute))
    handed.__wrapped__ = answer
    return handed


_FORBIDDEN: dict[str, watch.Forbidden] = {}


def _refusal(name: str, answer: Any) -> tuple[str, str] | None:
    """(the refused name, its kind) when the answer *is* the course's code: a course function
    under another name, or a class built on the course's class."""
    allowed = allowed_course_calls(name)
    if isinstance(answer, type):
        found = watch.inherited_course_code(answer, allowed)
    else:
        found = watch.course_callable(answer, allowed)
    return (found, "course") if found else None


def _refused_message(name: str, refused: str, kind: str) -> tuple[str, str]:
    """(what is wrong, how to fix it) for an answer that calls what it may not."""
    short = refused.replace("torch.nn.functional.", "F.")
    if kind == "library":
        return (f"your code calls {short}, which this exercise asks you to write yourself.",
                f"write the computation of {short.rsplit('.', 1)[-1]} with basic tensor operations "
                "instead of calling it.")
    blocks = allowed_course_calls(name)
    may = (" From the course's library it may use only: " + ", ".join(sorted(blocks)) + ".") if blocks \
        else " It may use torch, but nothing from the course's library."
    return (f"your code calls {short}, the course's own code: the grade counts only what you "
            "write, and the course's version (by any name, a subclass or a copy of its function) "
            "earns nothing.",
            f"write this part yourself instead of calling {short.rsplit('.', 1)[-1]}.{may}")


# How many times each exercise has failed `check` in this kernel: the second wrong try on gets
# the "how to fix it" line as well.
_WRONG_TRIES: dict[str, int] = {}


def _verdict(name: str, what: str, fix: str, attempt: int | None) -> str:
    """A failure's message: what is wrong, then (from the second try on, or always when `attempt`
    is None, as tests read it) how to fix it."""
    if attempt is not None and attempt < 2:
        return (f"❌ {name}: {what}\n   Change your code and run the check again; from the second "
                "wrong try on, it also says how to fix it.")
    return f"❌ {name}: {what}\n   How to fix it: {fix}"


def evaluate(name: str, answer: Any, time_limit: float | None = None,
             attempt: int | None = None, watched: bool = True) -> tuple[bool, str]:
    """Run exercise `name` against `answer`; return (passed, the message for the student).

    time_limit: seconds before giving up on an answer that does not return; None takes the
    module's TIME_LIMIT (set `helpers.lab.exercises.TIME_LIMIT = None` to wait forever).
    attempt: the how-many-th wrong try this would be (1: say only what is wrong; 2 or more:
    also how to fix it); None gives the full message.

    While the checker runs, `watch.Watch` sees every call the answer makes: a call of the
    course's own code (other than the exercise's building blocks) or of a forbidden library
    function fails the exercise by name, whatever the answer printed or returned.
    watched=False refuses only the forbidden library calls: for tests that build a student's slip
    from a checker's own variant function, to test how the checker names it.
    """
    ex = get(name)
    seconds = TIME_LIMIT if time_limit is None else time_limit
    if seconds is not None and ex.time_limit is not None:
        seconds = max(seconds, ex.time_limit)
    refused = _refusal(name, answer) if watched else None
    if refused:
        return False, _verdict(name, *_refused_message(name, *refused), attempt)
    if name not in _FORBIDDEN:
        _FORBIDDEN[name] = watch.Forbidden(ex.forbidden)
    watching = watch.Watch(_FORBIDDEN[name], allowed_course_calls(name), record=RECORD_CALLS,
                           course=watched, exercise=name)
    failed: tuple[str, str] | None = None
    try:
        with watching:
            praise = _run_with_time_limit(ex.checker, _handed(answer), seconds)
    except _TimeUp:
        failed = (f"⏱ your function did not return within {seconds:g} s, so the check stopped it.",
                  "look for a loop that never ends (a `while` whose condition never changes).")
    except NotImplementedError:
        if watching.refused is None:
            said = f"\n   {ex.task}" if ex.task else ""
            return False, (f"⏳ {name}: not attempted yet. Replace `raise NotImplementedError()` with "
                           f"your code.{said}")
    except watch.Refused as refused:  # reached by name where no profiler follows (worker processes)
        watching.refused, watching.why = refused.name, "course"
    except ExerciseFailed as failure:
        failed = (str(failure), failure.fix or ex.hint)
    except Exception as error:  # the student's code crashed: say where, without a traceback
        failed = (f"your code raised {type(error).__name__}: {error}{_where_it_broke(error)}", ex.hint)
    if RECORD_CALLS is not None:
        _record(name, watching.seen)
    if watching.refused is not None:  # a refused call outranks whatever the answer computed
        return False, _verdict(name, *_refused_message(name, watching.refused, watching.why), attempt)
    if failed is not None:
        return False, _verdict(name, *failed, attempt)
    return True, f"✅ {name}: correct!" + (f" {praise}" if praise else "")


def passes(name: str, answer: Any, time_limit: float | None = None) -> bool:
    """True when `answer` passes exercise `name`; prints nothing (for tests of the checkers)."""
    return evaluate(name, answer, time_limit)[0]


def grading() -> bool:
    """True under `nbgrader autograde` (or validate), where a failing check must fail its cell."""
    return os.environ.get("NBGRADER_EXECUTION") in ("autograde", "validate")


class GradeFailed(AssertionError):
    """A check that failed where it must fail its cell (the grader, or STRICT tests). In a
    notebook it shows as its message alone: no traceback, no path of the grading machine."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of the traceback
        return [str(self)]


def check(name: str, answer: Any, time_limit: float | None = None) -> None:
    """Run exercise `name` against the student's `answer` and print the verdict.

    Returns nothing, so that a bare `check(...)` as the last line of a cell shows only the
    verdict. The first wrong try says what is wrong; later ones also how to fix it. With STRICT
    set, or under nbgrader's autograder, a failing answer fails the cell instead (GradeFailed,
    an AssertionError), with the whole message, how to fix it included. An answer that has not
    returned after `time_limit` seconds (default TIME_LIMIT) fails with a message saying so.
    """
    graded = STRICT or grading()
    tries = _WRONG_TRIES.get(name, 0)
    passed, message = evaluate(name, answer, time_limit, attempt=None if graded else tries + 1)
    if not passed and not message.startswith("⏳"):
        _WRONG_TRIES[name] = tries + 1
    if graded and not passed:
        raise GradeFailed(message)
    print(message)


# The course functions each exercise's answer may call are its building blocks: what its own
# reference solution calls (building_blocks.py). With RECORD_CALLS set to a file, every check
# writes there the course functions the answer called, which is how that table is made.
RECORD_CALLS: str | None = os.environ.get("COURSE_RECORD_CALLS") or None


def allowed_course_calls(name: str) -> frozenset[str]:
    """The dotted names of the course functions exercise `name`'s answer may call."""
    from helpers.lab.exercises.building_blocks import BUILDING_BLOCKS, INTERFACE

    get(name)  # an unknown exercise is refused by name, not given an empty list
    return frozenset(BUILDING_BLOCKS.get(name, ())) | frozenset(INTERFACE.get(name, ()))


def _record(name: str, seen: set[str]) -> None:
    import json

    with open(RECORD_CALLS, "a", encoding="utf-8") as out:  # type: ignore[arg-type]
        out.write(json.dumps({"exercise": name, "calls": sorted(seen)}) + "\n")


def expect_count(got: Any, what: str) -> int:
    """`got` as an int if it is a whole-number count; fail for anything else, 3.0 included.

    A count returned as a float usually means a `/` where `//` was meant (or a float slipped
    into the sizes), and would print as 124439808.0: the exercise asks for an int.
    """
    if isinstance(got, bool) or not isinstance(got, numbers.Integral):
        fix = " (use // instead of /, or int(...))" if isinstance(got, float) else ""
        raise ExerciseFailed(f"{what} should be an int, but it is a {type(got).__name__}, "
                             f"{got!r}{fix}.")
    return int(got)


def expect_close(got: Any, expected: Any, what: str, atol: float = 1e-6) -> None:
    """Fail with a message naming `what` unless `got` is a tensor close to `expected`."""
    import torch

    if not isinstance(got, torch.Tensor):
        raise ExerciseFailed(f"{what} should be a torch.Tensor, but it is a {type(got).__name__}.")
    if got.shape != expected.shape:
        raise ExerciseFailed(f"{what} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}.")
    if got.dtype != expected.dtype and got.is_floating_point() and expected.is_floating_point():
        raise ExerciseFailed(f"{what} comes back as {got.dtype}, but the input was {expected.dtype}: "
                             "somewhere a tensor was made in the default dtype (or converted) and "
                             "the precision was lost.",
                             fix="keep the input's dtype: make new tensors with dtype=x.dtype (or "
                                 "torch.zeros_like, torch.full_like), and do not call .float().")
    if not torch.allclose(got.double(), expected.double(), atol=atol, rtol=0):
        worst = (got.double() - expected.double()).abs().max().item()
        raise ExerciseFailed(f"{what} has the right shape but wrong values (largest error {worst:.3g}).")


def yours_or(name: str, answer: Callable[..., Any], helper: Callable[..., Any]) -> Callable[..., Any]:
    """The student's `answer` when it passes exercise `name`, else the course's `helper`, saying which.

    The cells after an exercise that feeds them run on what this returns, so an unanswered or
    wrong exercise never stops the notebook (tools/exercise_use.py lists which cells use which
    exercise). With STRICT set (the tests that run the solutions) a failing answer
    raises, so those tests prove the notebook really ran on the student's function.
    """
    passed, message = evaluate(name, answer)
    label = getattr(answer, "__name__", "answer")
    if not passed:  # the later exercises may build on the course's version of this one
        watch.stand_in(helper, name)
    if grading() and not passed:  # graded: the check cell already lost its points; run on
        print(f"using the course's {getattr(helper, '__name__', 'helper')} from here on")
        return helper
    if passed:
        print(f"using your {label} from here on (it passes {name})")
        return answer
    if STRICT:
        raise AssertionError(message)
    why = "not attempted yet" if message.startswith("⏳") else "does not pass its check yet"
    print(f"using the course's {getattr(helper, '__name__', 'helper')} from here on: your {label} {why}")
    return helper
