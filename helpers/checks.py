"""Argument checks shared by the helpers: one line at the top of a function, one message style.

    positive_int(name, value)                 an int >= 1 (numpy integers accepted), returned as int
    non_negative_int(name, value)             an int >= 0
    integer(name, value)                      any int (a seed), never a bool or a float
    positive_float(name, value)               a finite number > 0 (numpy scalars accepted), as float
    number_in(name, value, low, high, ...)    a finite number in a range, ends open or closed
    boolean(name, value)                      True or False, never a string such as "False"
    one_of(name, value, choices)              one of a few allowed values
    instance(name, value, kind, expected)     an instance of `kind` (str, random.Random, ...)
    tensor_shape(name, value, shape, ...)     a torch tensor of a given number of dimensions and sizes
    text(name, value)                         a str that UTF-8 can encode (the tokenizers' input)
    size_at_least(name, value, smallest)      an int >= smallest (a vocabulary size, a merge count)
    special_tokens(name, value)               a list of distinct non-empty strings
    token_ids(name, value, vocab_size)        a list of ids in range(vocab_size), as plain ints

Every check takes the argument's name first and its value second, returns the value (converted
to a plain Python number where that helps), and raises with a message that names the argument,
what it got and what was expected:

    TypeError   the value has the wrong type (a float or a string where an int is expected)
    ValueError  the type is right but the value is not allowed (0 where a positive int is expected)

Model code: it imports nothing but the standard library (a torch tensor is recognised by its
class's name and module, as a numpy bool is).
"""

from __future__ import annotations

import math
import numbers
import operator
import sys
from collections.abc import Iterable
from typing import Any


def _is_numpy_bool(value: Any) -> bool:
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")


def _is_int(value: Any) -> bool:
    """An int or a numpy integer, but not a bool (True is an int in Python)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) \
        and not _is_numpy_bool(value)


def _is_real(value: Any) -> bool:
    """An int, a float or a numpy number, but not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and not _is_numpy_bool(value)


def _is_tensor(value: Any) -> bool:
    """A torch.Tensor or a subclass of it (nn.Parameter), recognised without importing torch."""
    return any(cls.__name__ == "Tensor" and cls.__module__ == "torch" for cls in type(value).__mro__)


def _got(value: Any) -> str:
    return f"{value!r} (a {type(value).__name__})"


def positive_int(name: str, value: Any) -> int:
    """`value` as an int, if it is an integer >= 1; else TypeError / ValueError naming `name`."""
    if not _is_int(value):
        raise TypeError(f"{name} is {_got(value)}, expected a positive int")
    if value < 1:
        raise ValueError(f"{name} is {value!r}, expected a positive int")
    return int(value)


def non_negative_int(name: str, value: Any) -> int:
    """`value` as an int, if it is an integer >= 0."""
    if not _is_int(value):
        raise TypeError(f"{name} is {_got(value)}, expected an int >= 0")
    if value < 0:
        raise ValueError(f"{name} is {value!r}, expected an int >= 0")
    return int(value)


def integer(name: str, value: Any, expected: str = "an int") -> int:
    """`value` as an int, if it is an integer of any sign (numpy integers accepted, bools not)."""
    if not _is_int(value):
        raise TypeError(f"{name} is {_got(value)}, expected {expected}")
    return int(value)


def instance(name: str, value: Any, kind: type | tuple[type, ...], expected: str) -> Any:
    """`value` unchanged, if it is an instance of `kind`; else a TypeError naming `name`."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} is {_got(value)}, expected {expected}")
    return value


AT_LEAST_ONE = range(1, sys.maxsize)   # a size in tensor_shape: not empty


def tensor_shape(name: str, value: Any, shape: tuple[int | range | None, ...], expected: str,
                 verb: str = "has shape") -> Any:
    """`value` unchanged, if it is a torch tensor of len(shape) dimensions whose sizes match
    `shape` (an int: exactly that size, a range: a size in it, None: any size); else a ValueError
    "{name} {verb} {got}, expected {expected}", got being its shape, or its type's name when it
    is not a tensor: tensor_shape("logits", logits, (None, 8), "(T, 8)")."""
    fits = _is_tensor(value) and value.dim() == len(shape) and all(
        want is None or (size in want if isinstance(want, range) else size == want)
        for size, want in zip(value.shape, shape, strict=True))
    if not fits:
        got = tuple(value.shape) if _is_tensor(value) else type(value).__name__
        raise ValueError(f"{name} {verb} {got}, expected {expected}")
    return value


def positive_float(name: str, value: Any, hint: str = "") -> float:
    """`value` as a float, if it is a finite number > 0. `hint` is added to the message."""
    return number_in(name, value, 0.0, math.inf, low_open=True, high_open=True,
                     expected=f"a finite number > 0{hint}")


def number_in(name: str, value: Any, low: float, high: float, low_open: bool = False,
              high_open: bool = False, expected: str | None = None) -> float:
    """`value` as a float, if it is a number between `low` and `high` (NaN never is).

    low_open / high_open leave that end out: number_in("dropout", p, 0, 1, high_open=True)
    accepts 0 <= p < 1. `expected` replaces the generated description of the range.
    """
    if expected is None:
        expected = (f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}")
    if not _is_real(value):
        raise TypeError(f"{name} is {_got(value)}, expected {expected}")
    number = float(value)
    above = number > low if low_open else number >= low
    below = number < high if high_open else number <= high
    if not (above and below):  # also catches NaN, for which every comparison is False
        raise ValueError(f"{name} is {value!r}, expected {expected}")
    return number


def boolean(name: str, value: Any) -> bool:
    """`value`, if it is True or False. A string such as "False" (read from a JSON file or a
    command line) is refused: it is truthy, so it would silently mean True."""
    if isinstance(value, bool):
        return value
    if _is_numpy_bool(value):
        return bool(value)
    advice = f": write {value.strip().capitalize()}, not the string {value!r}" \
        if isinstance(value, str) and value.strip().lower() in ("true", "false") else ""
    raise TypeError(f"{name} is {_got(value)}, expected True or False{advice}")


def rank_in_world(rank: Any, world_size: Any) -> int:
    """`rank`, if it is an int with 0 <= rank < world_size (world_size a positive int)."""
    positive_int("world_size", world_size)
    if not _is_int(rank):
        raise TypeError(f"rank is {_got(rank)}, expected an int")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank is {rank}, expected 0 <= rank < world_size = {world_size}")
    return rank


def one_of(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """`value`, if it is one of `choices`."""
    choices = list(choices)
    if not any(type(value) is type(choice) and value == choice for choice in choices):
        listed = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"{name} is {value!r}, expected one of {listed}")
    return value


# --- text and token ids, shared by the tokenizers (helpers.text) ------------------------------

def text(name: str, value: Any) -> str:
    """`value` itself, after checking that it is a str that UTF-8 can encode."""
    if not isinstance(value, str):
        hint = " (bytes? decode them first: data.decode('utf-8'))" if isinstance(value, bytes | bytearray) else ""
        raise TypeError(f"{name} is {value!r:.60} of type {type(value).__name__}, expected a str{hint}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{name}[{error.start}] is {value[error.start]!r}, a lone surrogate that UTF-8 "
                         "cannot encode; expected valid Unicode text") from None
    return value


def size_at_least(name: str, value: Any, smallest: int, why: str = "") -> int:
    """`value` as an int, after checking that it is an integer of at least `smallest`; `why`
    ends the message (": one id for each byte")."""
    try:
        size = non_negative_int(name, value)
    except ValueError:
        size = int(value)  # negative: refused below, with the bound that applies here
    if size < smallest:
        raise ValueError(f"{name} is {size}, expected at least {smallest}{why}")
    return size


def special_tokens(name: str, value: Any) -> list[str]:
    """A list of distinct non-empty strings (a tokenizer's special tokens), as a list."""
    if isinstance(value, str | bytes):
        raise TypeError(f"{name} is {value!r}, a single string; expected a list of strings such as [{value!r}]")
    if not isinstance(value, Iterable):
        raise TypeError(f"{name} is {value!r} of type {type(value).__name__}, expected a list of strings")
    tokens = list(value)
    for token in tokens:
        if not isinstance(token, str):
            raise TypeError(f"{name} holds {token!r} of type {type(token).__name__}, expected strings")
        if not token:
            raise ValueError(f"{name} holds {token!r}, expected non-empty strings")
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"{name} is {tokens}, expected no repeats")
    return tokens


def token_ids(name: str, value: Any, vocab_size: int) -> list[int]:
    """`value` as plain ints, after checking that each one is an id of a `vocab_size` vocabulary."""
    if isinstance(value, str | bytes | bytearray) or not isinstance(value, Iterable):
        raise TypeError(f"{name} is {value!r:.60} of type {type(value).__name__}, expected a list of integer ids")
    checked = []
    for position, token_id in enumerate(value):
        one = token_id if type(token_id) is int else token_id_at(name, position, token_id)
        if not 0 <= one < vocab_size:
            raise ValueError(f"{name}[{position}] is {one}, expected an id in range(0, {vocab_size}) "
                             "(the size of this tokenizer's vocabulary)")
        checked.append(one)
    return checked


def token_id_at(name: str, position: int, value: Any) -> int:
    """A NumPy or 0-d torch integer as an int; bools are refused (True is an int to Python)."""
    try:
        if isinstance(value, bool) or str(getattr(value, "dtype", "")).endswith("bool"):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}[{position}] is {value!r} of type {type(value).__name__}, "
                        "expected an integer id") from None
