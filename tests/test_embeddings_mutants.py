"""helpers.model.embeddings: the gaps its mutation run found (benchmarks/MUTATION.md).

Grouped by issue 30's classes: configuration asserted (the defaults and the bounds of `base`),
exact properties whatever the default device or dtype, edge inputs (unbatched ids, bool and
complex ids, a start that is not an int), and every error message read in full.
"""

from __future__ import annotations

import math

import pytest
import torch
from shared_tools import full

from helpers.model.embeddings import (
    TokenAndPositionEmbedding,
    check_token_ids,
    cosine_similarity,
    one_hot,
    sinusoidal_positions,
)

# --- configuration: the paper's base by default, and the bounds of base ---------------------------

def test_the_default_base_is_the_papers_10000():
    assert torch.equal(sinusoidal_positions(64, 33), sinusoidal_positions(64, 33, 10000.0))
    assert not torch.equal(sinusoidal_positions(64, 33), sinusoidal_positions(64, 33, 10001.0))


def test_any_base_above_1_is_accepted_and_follows_the_formula():
    table = sinusoidal_positions(3, 4, 1.5)  # below 2: only "> 1" is required
    assert table[2, 2].item() == pytest.approx(math.sin(2 / 1.5 ** 0.5), abs=1e-6)


@pytest.mark.parametrize("base", [1.0, math.inf])
def test_a_base_of_1_or_infinity_is_refused_with_the_reason(base):
    message = (f"base is {base!r}, expected a number > 1 (10000.0 in the paper): with base <= 1 the "
               "wavelengths would not grow along the dimensions")
    with pytest.raises(ValueError, match=full(message)):
        sinusoidal_positions(4, 4, base)


# --- exact properties whatever the environment ----------------------------------------------------

def test_one_hot_and_the_positions_follow_the_ids_device_not_the_default_one():
    embed = TokenAndPositionEmbedding(5, 4, 2)
    ids = torch.tensor([[1, 4, 0]])
    expected = embed(ids)
    with torch.device("meta"):  # factory calls without a device would land on meta
        vectors = one_hot(ids, 5)
        out = embed(ids)
    assert vectors.device == ids.device and torch.equal(vectors.argmax(-1), ids)
    assert out.device == ids.device and torch.equal(out, expected)


def test_the_sinusoidal_table_is_computed_in_float64_whatever_the_default_dtype():
    expected = sinusoidal_positions(300, 10)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.bfloat16)
        table = sinusoidal_positions(300, 10)
    finally:
        torch.set_default_dtype(previous)
    assert table.dtype == torch.float32 and torch.equal(table, expected)


# --- edge inputs and the full messages ------------------------------------------------------------

@pytest.mark.parametrize("ids, dtype", [
    (torch.tensor([True, False]), "torch.bool"),
    (torch.tensor([1.0]), "torch.float32"),
    (torch.tensor([1 + 0j]), "torch.complex64"),
])
def test_bool_float_and_complex_ids_get_the_integer_dtype_message(ids, dtype):
    message = f"token_ids has dtype {dtype}, expected an integer dtype (torch.long)"
    with pytest.raises(TypeError, match=full(message)):
        check_token_ids(ids, 5)


def test_ids_that_are_not_a_tensor_or_on_the_meta_device_are_named():
    with pytest.raises(TypeError, match=full("ids must be a torch.Tensor of integer ids, got list")):
        check_token_ids([0, 1], 5, name="ids")
    message = ("token_ids is on the meta device, which holds shapes but no values: "
               "expected real ids (on the CPU or a GPU)")
    with pytest.raises(ValueError, match=full(message)):
        check_token_ids(torch.zeros(3, dtype=torch.long, device="meta"), 5)


def test_a_zero_vector_in_a_is_named_a():
    message = "a contains a zero vector, which has no direction: cosine similarity is undefined for it"
    with pytest.raises(ValueError, match=full(message)):
        cosine_similarity(torch.zeros(3), torch.ones(3))


def test_a_zero_d_model_is_named():
    with pytest.raises(ValueError, match=r"^d_model is 0, expected a positive int"):
        TokenAndPositionEmbedding(10, 4, 0)


@pytest.mark.parametrize("start", [True, 1.0, "1"])
def test_a_start_that_is_not_an_int_is_refused(start):
    with pytest.raises(ValueError, match=full(f"start is {start!r}, expected an int >= 0")):
        TokenAndPositionEmbedding(10, 4, 2)(torch.tensor([1]), start=start)


def test_too_many_unbatched_ids_get_the_whole_message():
    message = ("token_ids has 5 positions (shape (5,)), expected at most context_length = 4: "
               "the position table has no row for the later positions")
    with pytest.raises(ValueError, match=full(message)):
        TokenAndPositionEmbedding(10, 4, 2)(torch.zeros(5, dtype=torch.long))
