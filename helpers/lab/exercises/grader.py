"""The hidden tests of a graded cell: what nbgrader's autograder runs after the visible check.

Every graded cell of the instructor's notebooks ends with (written by tools/build_notebooks.py,
removed from the student edition):

    ### BEGIN HIDDEN TESTS
    from helpers.lab.exercises.grader import hidden_check
    hidden_check("masking.causal_softmax", my_causal_softmax, globals())
    ### END HIDDEN TESTS

`hidden_check` decides the grade without trusting anything the student's notebook could have
changed before it:

1. the notebook's `check` must be the course's: an answer cell that redefines or wraps `check`
   scores 0 on every exercise whose cell it touches;
2. nothing the checks rely on may have been replaced by the notebook's own code (a function of
   torch, of the course's library);
3. the checker comes from a fresh import of the exercises package (the notebook's copy is put
   back afterwards), so a patched `evaluate`, registry or checker does not count;
4. the check runs again with its random inputs drawn from other seeds (COURSE_HIDDEN_SEED, which
   an instructor sets to a number of their own when grading), so an answer that hard-codes what
   the visible check printed fails, and with the calls it makes watched as in the visible check.

A failure fails the cell with one message, how to fix it included, and no traceback. On a pass
it prints one line under the grader and nothing otherwise, so the instructor's notebooks keep
their outputs.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path
from typing import Any

from helpers.lab.exercises import watch

PACKAGE = "helpers.lab.exercises"
DEFAULT_HIDDEN_SEED = 1009


def hidden_seed() -> int:
    """The seed offset of the hidden round: COURSE_HIDDEN_SEED, else DEFAULT_HIDDEN_SEED."""
    said = os.environ.get("COURSE_HIDDEN_SEED", "").strip()
    if not said:
        return DEFAULT_HIDDEN_SEED
    try:
        seed = int(said)
    except ValueError:
        raise ValueError(f"COURSE_HIDDEN_SEED must be a whole number other than 0, got {said!r}") from None
    if seed == 0:
        raise ValueError("COURSE_HIDDEN_SEED must be a whole number other than 0 (0 is the visible check's)")
    return seed


def genuine_check(candidate: Any) -> bool:
    """True when `candidate` is the course's own `check` function, not a redefinition or wrapper."""
    code = getattr(candidate, "__code__", None)
    return isinstance(candidate, types.FunctionType) and code is not None and code.co_name == "check" \
        and Path(code.co_filename).resolve() == watch.EXERCISES / "__init__.py"


def _replaced_in(owner: Any, label: str) -> str | None:
    """The first attribute of `owner` that is a function written in the student's notebook."""
    try:
        items = list(vars(owner).items())
    except TypeError:
        return None
    for attribute, value in items:
        if not isinstance(value, (types.FunctionType, types.MethodType, staticmethod, classmethod)):
            continue  # only Python functions can hold a notebook's code (and torch.classes raises on getattr)
        function = getattr(value, "__func__", value)
        code = getattr(function, "__code__", None)
        if isinstance(code, types.CodeType) and watch.kind_of_file(code.co_filename) == watch.STUDENT:
            return f"{label}.{attribute}"
    return None


def replaced_function() -> str | None:
    """The dotted name of a library or course function that the notebook's own code replaced."""
    import torch

    owners = [(torch, "torch"), (torch.Tensor, "torch.Tensor"), (torch.nn.functional, "torch.nn.functional"),
              (torch.linalg, "torch.linalg"), (torch.special, "torch.special"), (torch.testing, "torch.testing")]
    owners += [(module, name) for name, module in list(sys.modules.items())
               if (name == "helpers" or name.startswith("helpers.")) and isinstance(module, types.ModuleType)]
    for owner, label in owners:
        found = _replaced_in(owner, label)
        if found:
            return found
    return None


def _fresh_evaluate(name: str, answer: Any, seed: int) -> tuple[bool, str]:
    """evaluate(name, answer) from a fresh import of the exercises package, on the hidden seeds;
    the notebook's own copy of the package is put back afterwards."""
    saved = {key: module for key, module in sys.modules.items()
             if key == PACKAGE or key.startswith(PACKAGE + ".")}
    parent = sys.modules.get(PACKAGE.rsplit(".", 1)[0])
    for key in saved:
        del sys.modules[key]
    try:
        fresh = importlib.import_module(PACKAGE)
        fresh.watch.STAND_INS.update(saved[PACKAGE + ".watch"].STAND_INS)  # earlier exercises' stand-ins
        if PACKAGE + "._ranks" in saved:  # the worker processes kept for the session: no second set
            importlib.import_module(PACKAGE + "._ranks")._POOL[:] = saved[PACKAGE + "._ranks"]._POOL
        fresh.SEED_OFFSET = seed
        fresh.STRICT = False
        return fresh.evaluate(name, answer, attempt=None)
    finally:
        for key in [k for k in sys.modules if k == PACKAGE or k.startswith(PACKAGE + ".")]:
            del sys.modules[key]
        sys.modules.update(saved)
        if parent is not None and PACKAGE in saved:
            parent.exercises = saved[PACKAGE]


def hidden_check(name: str, answer: Any, namespace: dict[str, Any] | None = None) -> None:
    """The hidden tests of exercise `name` (see the module's docstring): fail the cell, with a
    message and no traceback, unless `answer` is the student's own and passes on hidden inputs.

    namespace: the notebook's globals(), to see whether `check` there is the course's.
    """
    from helpers.lab.exercises import GradeFailed, get, grading

    get(name)  # an unknown exercise name is the notebook's bug: say so before anything else
    if namespace is not None and "check" in namespace and not genuine_check(namespace["check"]):
        raise GradeFailed(f"❌ {name}: this notebook redefines or wraps `check`, so its visible check "
                          "cannot be trusted and the exercise scores 0.\n   How to fix it: delete your "
                          "own `check` and run the set-up cells again, so that `check` is the "
                          "course's (`from helpers.lab.exercises import check`).")
    expected_home = os.environ.get("COURSE_HELPERS", "").strip()
    if expected_home and Path(expected_home).resolve() != watch.HELPERS:
        raise GradeFailed(f"❌ {name}: the grader imported the course's library from {watch.HELPERS.parent}, "
                          "not from the course: a submission may not bring a `helpers` of its own, "
                          "and the exercise scores 0.\n   How to fix it: hand in the notebook alone.")
    replaced = replaced_function()
    if replaced is not None:
        raise GradeFailed(f"❌ {name}: your notebook replaces {replaced} with code of its own, so the "
                          "checks cannot be trusted and the exercise scores 0.\n   How to fix it: do not "
                          "assign to the library's or the course's functions; write your own function "
                          "under a name of your own.")
    passed, message = _fresh_evaluate(name, answer, hidden_seed())
    if not passed:
        raise GradeFailed(message.replace(f"{name}:", f"{name} (hidden tests, on inputs you have not "
                                                       "seen):", 1))
    if grading():
        print(f"✅ {name}: the hidden tests pass too.")
