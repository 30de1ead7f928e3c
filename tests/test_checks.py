"""helpers.checks.tensor_shape: a torch tensor of the expected sizes, recognised without torch."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

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
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        checks.tensor_shape("x", value, shape, "E")


def test_the_verb_can_be_is():
    with pytest.raises(ValueError, match=r"^bias is \(4,\), expected a tensor \(3,\)$"):
        checks.tensor_shape("bias", torch.zeros(4), (3,), "a tensor (3,)", verb="is")
