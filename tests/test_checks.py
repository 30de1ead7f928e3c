"""helpers.checks.tensor_shape: a torch tensor of the expected sizes, recognised without torch."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from shared_tools import full

from helpers import checks


def test_a_tensor_of_the_expected_sizes_is_returned_unchanged():
    x = torch.zeros(3, 4)
    assert checks.tensor_shape("x", x, (None, 4), "(T, 4)") is x
    assert checks.tensor_shape("x", x, (3, None), "(3, D)") is x
    assert checks.tensor_shape("x", x, (None, range(1, 5)), "(B, N), 1 <= N <= 4") is x
    weight = torch.nn.Parameter(torch.zeros(2))             # a subclass of Tensor
    assert checks.tensor_shape("weight", weight, (2,), "(2,)") is weight


@pytest.mark.parametrize("value, shape, message", [
    (torch.zeros(3), (None, None), "x has shape (3,), expected E"),              # too few dims
    (torch.zeros(3, 4, 1), (None, None), "x has shape (3, 4, 1), expected E"),   # too many
    (torch.zeros(3, 5), (None, 4), "x has shape (3, 5), expected E"),            # a wrong size
    (torch.zeros(2, 0), (None, checks.AT_LEAST_ONE), "x has shape (2, 0), expected E"),
    (torch.zeros(2, 5), (None, range(1, 5)), "x has shape (2, 5), expected E"),  # past the range
    ([[1.0, 2.0]], (None, None), "x has shape list, expected E"),                # not a tensor
    (np.zeros((2, 2)), (None, None), "x has shape ndarray, expected E"),         # numpy is not torch
])
def test_anything_else_is_refused_naming_the_argument_and_what_it_got(value, shape, message):
    with pytest.raises(ValueError, match=full(message)):
        checks.tensor_shape("x", value, shape, "E")


def test_the_verb_can_be_is():
    with pytest.raises(ValueError, match=r"^bias is \(4,\), expected a tensor \(3,\)$"):
        checks.tensor_shape("bias", torch.zeros(4), (3,), "a tensor (3,)", verb="is")


@pytest.mark.parametrize("check, value, error, match", [
    (checks.positive_int, 0, ValueError, "n is 0, expected a positive int"),
    (checks.positive_int, 2.0, TypeError, r"n is 2.0 \(a float\), expected a positive int"),
    (checks.positive_int, True, TypeError, "n is True"),
    (checks.positive_int, None, TypeError, "n is None"),
    (checks.positive_float, 0.0, ValueError, "n is 0.0, expected a finite number > 0"),
    (checks.positive_float, math.nan, ValueError, "n is nan"),
    (checks.positive_float, "1", TypeError, "n is '1'"),
    (checks.boolean, "False", TypeError, "n is 'False' .*write False, not the string"),
    (checks.boolean, 1, TypeError, "n is 1 .*expected True or False"),
    (checks.integer, 1.0, TypeError, r"^n is 1.0 \(a float\), expected an int$"),
    (checks.integer, True, TypeError, r"^n is True \(a bool\), expected an int$"),
    (checks.integer, "7", TypeError, r"^n is '7' \(a str\), expected an int$"),
])
def test_shared_checks_name_the_argument(check, value, error, match):
    with pytest.raises(error, match=match):
        check("n", value)


def test_shared_checks_accept_numpy_numbers_and_return_plain_ones():
    assert checks.positive_int("n", np.int64(3)) == 3 and type(checks.positive_int("n", np.int64(3))) is int
    assert checks.positive_float("x", np.float32(0.5)) == 0.5
    assert checks.boolean("b", np.bool_(True)) is True
    assert checks.integer("seed", -3) == -3 and type(checks.integer("seed", np.int64(5))) is int
    with pytest.raises(TypeError, match=r"^n is 2.5 \(a float\), expected a whole number$"):
        checks.integer("n", 2.5, "a whole number")
    text = "abc"
    assert checks.instance("text", text, str, "a str") is text
    with pytest.raises(TypeError, match=r"^rng is 3 \(a int\), expected a random.Random$"):
        checks.instance("rng", 3, random.Random, "a random.Random")
    assert checks.number_in("p", 0.0, 0.0, 1.0, high_open=True) == 0.0
    with pytest.raises(ValueError, match=r"p is 1.0, expected a number in \[0, 1\)"):
        checks.number_in("p", 1.0, 0.0, 1.0, high_open=True)


@pytest.mark.parametrize("check, args, error, said", [
    (checks.text, ("text", b"ab"), TypeError, r"^text is b'ab' of type bytes, expected a str \(bytes\? decode"),
    (checks.text, ("word", "a\ud800"), ValueError, r"^word\[1\] is '\\ud800', a lone surrogate"),
    (checks.size_at_least, ("n_merges", -1, 0), ValueError, "^n_merges is -1, expected at least 0$"),
    (checks.size_at_least, ("vocab_size", 3, 5, ": why"), ValueError, "^vocab_size is 3, expected at least 5: why$"),
    (checks.special_tokens, ("special_tokens", "<|end|>"), TypeError, "a single string"),
    (checks.special_tokens, ("special_tokens", ["a", "a"]), ValueError, "expected no repeats"),
    (checks.token_ids, ("ids", [0, 9], 5), ValueError, r"^ids\[1\] is 9, expected an id in range\(0, 5\)"),
    (checks.token_ids, ("ids", [True], 5), TypeError, r"^ids\[0\] is True of type bool, expected an integer id"),
])
def test_the_tokenizers_checks_name_what_they_refuse(check, args, error, said):
    with pytest.raises(error, match=said):
        check(*args)


def test_the_tokenizers_checks_return_what_they_accept():
    assert checks.text("text", "ab") == "ab" and checks.size_at_least("n", 2, 2) == 2
    assert checks.special_tokens("special_tokens", ("<a>",)) == ["<a>"]
    assert checks.token_ids("ids", (0, 4), 5) == [0, 4]
