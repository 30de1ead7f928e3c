"""helpers.text.corpus_rich: the rich grammar's generator, checker and word measures, asserted
exactly on tiny inputs.

Written for the mutation run (benchmarks/mutation.py, issue 30): each test fails on a planted
one-line bug that test_corpus_rich.py lets through.
"""

from __future__ import annotations

import random

import pytest

from helpers.text import corpus_rich as cr
from helpers.text.corpus_rich import (
    generate_rich_corpus,
    generate_rich_story,
    is_rich_well_formed,
    known_word_fraction,
    rich_well_formed_fraction,
)

# --- bad input (each refused before any work, naming the argument) ---------------------------


@pytest.mark.parametrize(("call", "message"), [
    (lambda: is_rich_well_formed(None), "sentence is a NoneType, expected a str"),
    (lambda: rich_well_formed_fraction(None), "text is a NoneType, expected a str"),
    (lambda: rich_well_formed_fraction(["Mia ran."]), "text is a list, expected a str"),
    (lambda: known_word_fraction(b"cat"), "text is a bytes, expected a str"),
    (lambda: generate_rich_story(7), "rng is 7 (a int), expected a random.Random"),
    (lambda: generate_rich_corpus(seed="7"), "seed is '7' (a str), expected an int"),
    (lambda: generate_rich_corpus(seed=7.0), "seed is 7.0 (a float), expected an int"),
    (lambda: generate_rich_corpus(min_bytes=None), "min_bytes is None (a NoneType), expected an int >= 0"),
])
def test_bad_input_is_refused_with_a_type_error_naming_the_argument(call, message):
    with pytest.raises(TypeError) as error:
        call()
    assert str(error.value) == message


def test_negative_min_bytes_is_refused():
    with pytest.raises(ValueError) as error:
        generate_rich_corpus(min_bytes=-5)
    assert str(error.value) == "min_bytes is -5, expected an int >= 0"


def test_numpy_integer_seed_and_size_give_the_int_corpus():
    np = pytest.importorskip("numpy")
    assert generate_rich_corpus(np.int64(4), np.int64(400)) == generate_rich_corpus(4, 400)
    assert cr.generate_rich_story(random.Random(4)) == cr.generate_rich_story(random.Random(4))
