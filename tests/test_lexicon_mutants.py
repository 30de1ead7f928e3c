"""helpers.text.lexicon: every spelling rule on hand-picked words, each branch and edge.

Written for the mutation run (benchmarks/mutation.py, issue 30): each test fails on a planted
one-line bug that test_corpus_rich.py lets through. The expected forms are written out by hand
(how the words are spelt in British English), not computed by the rules under test.
"""

from __future__ import annotations

import pytest

from helpers.text import lexicon as lx


def test_third_person_of_a_verb_that_is_an_irregular_noun_is_regular():
    # "fish" has the noun plural "fish", but the verb takes -es: she fishes.
    assert lx.third_person("fish") == "fishes"
    assert lx.plural("fish") == "fish"
    assert lx.third_person("man") == "mans"
    assert lx.third_person("knife") == "knifes"


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: lx.number_word(3.0), TypeError, "n is 3.0 (a float), expected a whole number from 0 to 99"),
    (lambda: lx.number_word(True), TypeError,
     "n is True (a bool), expected a whole number from 0 to 99"),
    (lambda: lx.number_word(-1), ValueError, "n is -1, expected a whole number from 0 to 99"),
    (lambda: lx.number_word(100), ValueError, "n is 100, expected a whole number from 0 to 99"),
    (lambda: lx.ordinal(2.0), TypeError, "n is 2.0 (a float), expected an int >= 0"),
    (lambda: lx.ordinal(True), TypeError, "n is True (a bool), expected an int >= 0"),
    (lambda: lx.ordinal(-3), ValueError, "n is -3, expected an int >= 0"),
])
def test_numbers_refuse_what_is_not_a_whole_number_in_range(call, error, message):
    with pytest.raises(error) as caught:
        call()
    assert str(caught.value) == message
