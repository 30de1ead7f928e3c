"""helpers.text.chars: the character tokenizer, GPT-2's pre-split (against Hugging Face's), special
tokens, and clear errors for bad input. BPE is tested in test_bpe.py, WordPiece and Unigram in
test_subword.py; nothing here is timed (the speed budgets live in benchmarks/bench_tokenizer.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizer_cases import ASSIGNED, END, finishes

from helpers.text.chars import CharTokenizer, pre_split, readable, split_special
from helpers.text.corpus import TOY_SOUP, load_corpus

# --- GPT-2's pre-split and special tokens --------------------------------------------------------


@given(st.text())
def test_pre_split_loses_nothing(text):
    assert "".join(pre_split(text)) == text


def test_pre_split_keeps_the_space_with_the_next_word():
    assert pre_split("Tom found a key.") == ["Tom", " found", " a", " key", "."]
    assert pre_split("it's  ok") == ["it", "'s", " ", " ok"]
    assert pre_split("x²") == ["x", "²"]  # ² is a number to GPT-2 (\p{N}), not a letter


def gpt2_reference_split(text: str) -> list[str]:
    """Hugging Face's Rust implementation of GPT-2's byte-level pre-tokenizer, mapped back to text."""
    from tokenizers import pre_tokenizers

    splitter = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return [text[start:end] for _, (start, end) in splitter.pre_tokenize_str(text)]


@settings(max_examples=300, deadline=None)
@given(st.text(ASSIGNED) | st.text(alphabet=" \t\n\u00a0\u2003's²½x7é東_-!"))
def test_pre_split_matches_gpt2_on_any_unicode(text):
    assert pre_split(text) == gpt2_reference_split(text)


def test_pre_split_matches_gpt2_on_the_corpus_and_tricky_text():
    text = load_corpus()[:50_000] + " x² ½ Ⅻ 'S we'LL  \t\n  ٣٤ 東京 _a__ a\u00a0b"
    assert pre_split(text) == gpt2_reference_split(text)


def test_split_special_isolates_special_tokens():
    assert split_special(f"a{END}b{END}", [END]) == [("a", False), (END, True), ("b", False), (END, True)]
    assert split_special("plain", []) == [("plain", False)]
    assert split_special("", [END]) == []


# --- the character tokenizer ---------------------------------------------------------------------


@given(st.text(min_size=1))
def test_char_tokenizer_round_trips_its_training_text(text):
    tokenizer = CharTokenizer.train(text)
    ids = tokenizer.encode(text)
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_char_tokenizer_special_tokens():
    tokenizer = CharTokenizer.train(f"ab{END}ba", special_tokens=[END])
    assert tokenizer.chars == ["a", "b"]
    assert tokenizer.encode(f"a{END}") == [0, 2]
    assert tokenizer.decode([2, 1]) == f"{END}b"


def test_char_save_load_identity(tmp_path):
    tokenizer = CharTokenizer.train(TOY_SOUP + "é☕", special_tokens=[END])
    loaded = CharTokenizer.load(tokenizer.save(tmp_path / "chars.json"))
    assert loaded == tokenizer
    assert loaded.encode(TOY_SOUP) == tokenizer.encode(TOY_SOUP)


def test_unknown_character_names_the_character_and_its_position():
    tokenizer = CharTokenizer.train(TOY_SOUP)
    with pytest.raises(ValueError, match=r"text\[7\] is 'é'"):
        tokenizer.encode("I like é soup")


def test_char_ids_outside_the_vocabulary_are_refused():
    tokenizer = CharTokenizer.train("abc")
    with pytest.raises(ValueError, match=r"ids\[0\] is 3, expected an id in range\(0, 3\)"):
        tokenizer.decode([3])


def test_readable_shows_spaces_and_partial_characters():
    assert readable(b" the\n") == "␣the↵"
    assert readable("é".encode()[:1]) == "\\xc3"


# --- bad input: a clear error that names the argument --------------------------------------------


BAD_INPUT = {
    "char special_tokens str": (lambda: CharTokenizer.train("abc", special_tokens="<eot>"),
                                TypeError, "special_tokens is"),
    "char decode bools": (lambda: CharTokenizer.train("abc").decode([False]), TypeError, r"ids\[0\] is False"),
    "char train bytes": (lambda: CharTokenizer.train(b"abc"), TypeError, "text is b'abc'"),
    "char encode int": (lambda: CharTokenizer.train("abc").encode(3), TypeError, "text is 3"),
    "pre_split None": (lambda: pre_split(None), TypeError, "text is None"),
    "char train surrogate": (lambda: CharTokenizer.train("\ud800"), ValueError, r"text\[0\]"),
}


@pytest.mark.parametrize("case", BAD_INPUT, ids=str)
def test_bad_input_gets_a_clear_error_naming_the_argument(case):
    call, error_type, message = BAD_INPUT[case]
    with pytest.raises(error_type, match=message):
        finishes(call)
