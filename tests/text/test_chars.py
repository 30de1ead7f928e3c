"""helpers.text.chars: the character tokenizer, GPT-2's pre-split (against Hugging Face's), special
tokens, and clear errors for bad input. BPE is tested in tests/text/test_bpe.py, WordPiece and Unigram in
tests/text/test_subword.py; nothing here is timed (the speed budgets live in benchmarks/bench_tokenizer.py)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import regex
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_tools import raises_exactly
from tokenizer_cases import ASSIGNED, END, finishes

from helpers import checks
from helpers.text.chars import (
    GPT2_SPLIT_PATTERN,
    CharTokenizer,
    pre_split,
    readable,
    split_special,
    stream_blocks,
)
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


# helpers.text.chars, exactly:
#
# Grouped by the classes: error messages read in full (each names the argument, what it got
# and what was expected), patterns that leave text between their matches, the exact blocks of
# stream_blocks at the edges of block_chars and special tokens, ids from NumPy and torch, the saved
# file, CharTokenizer's repr and equality.


def test_text_checks_name_the_argument_the_type_and_the_bytes_hint():
    with raises_exactly(TypeError, "text is b'ab' of type bytes, expected a str "
                                   "(bytes? decode them first: data.decode('utf-8'))"):
        pre_split(b"ab")
    with raises_exactly(TypeError, "text is bytearray(b'ab') of type bytearray, expected a str "
                                   "(bytes? decode them first: data.decode('utf-8'))"):
        CharTokenizer(["a"]).encode(bytearray(b"ab"))
    with raises_exactly(TypeError, "text is 3.5 of type float, expected a str"):
        pre_split(3.5)
    with raises_exactly(ValueError, "text[2] is '\\udc80', a lone surrogate that UTF-8 cannot encode; "
                                    "expected valid Unicode text"):
        pre_split("ab\udc80")


def test_sizes_below_the_bound_are_named_with_the_bound():
    assert checks.size_at_least("n", 2, 2) == 2
    with raises_exactly(ValueError, "n is -3, expected at least 2"):
        checks.size_at_least("n", -3, 2)
    with raises_exactly(ValueError, "n is 1, expected at least 2: why"):
        checks.size_at_least("n", 1, 2, ": why")
    with raises_exactly(TypeError, "n is 'x' (a str), expected an int >= 0"):
        checks.size_at_least("n", "x", 2)


def test_pattern_checks_name_the_pattern():
    with raises_exactly(TypeError, "pattern is b'a' of type bytes, expected a str holding a regular expression"):
        pre_split("a", b"a")
    with pytest.raises(ValueError, match=r"^pattern is '\(a', which is not a valid regular expression \(missing \)"):
        pre_split("a", "(a")


@pytest.mark.parametrize(("text", "pattern", "expected"), [
    ("ab  cd", "b", ["a", "b", "  cd"]),           # text before, and after the last match
    ("aXbXc", "X", ["a", "X", "b", "X", "c"]),
    ("abc", "(?=b)", ["a", "bc"]),                 # an empty match cuts but adds no chunk
    ("XX", "X", ["X", "X"]),                        # matches side by side: nothing between
    ("", "X", []),
])
def test_a_pattern_that_leaves_text_between_matches_keeps_it_as_chunks(text, pattern, expected):
    assert pre_split(text, pattern) == expected


def test_gpt2_pattern_chunks_are_its_matches():
    assert pre_split("  Tom's 42!\n\n", GPT2_SPLIT_PATTERN) == [" ", " Tom", "'s", " 42", "!", "\n\n"]


def test_stream_blocks_cut_once_block_chars_are_read():
    assert list(stream_blocks(["ab cd ef"], block_chars=8)) == ["ab cd", " ef"]
    assert list(stream_blocks(["ab cd ef"], block_chars=9)) == ["ab cd ef"]
    assert list(stream_blocks(["ab", " cd", " ef", " g"], block_chars=2)) == ["ab", " cd", " ef", " g"]
    assert list(stream_blocks(["ab", " cd", " ef", " g"], block_chars=5)) == ["ab", " cd", " ef", " g"]
    assert list(stream_blocks(["ab", " cd", " ef", " g"], block_chars=6)) == ["ab cd", " ef g"]
    assert list(stream_blocks([])) == [] and list(stream_blocks(["", ""])) == []


def test_stream_blocks_carry_what_follows_the_cut_into_the_next_block():
    assert list(stream_blocks(["a b", "c d", "e"], block_chars=3)) == ["a", " bc", " de"]
    assert list(stream_blocks(["xy z", "w"], block_chars=1)) == ["xy", " zw"]


def test_stream_blocks_keep_a_special_token_whole():
    # The last place to cut wins: after "y" in "a x y b", after "a" in "a x y", since a cut after
    # "x" would split the special token "x y".
    assert list(stream_blocks(["a x y b"], ["x y"], block_chars=1)) == ["a x y", " b"]
    assert list(stream_blocks(["a x y"], ["x y"], block_chars=1)) == ["a", " x y"]
    assert list(stream_blocks(["a x y"], ["q", "x y"], block_chars=1)) == ["a", " x y"]
    assert list(stream_blocks(["a x y"], ["x y", "q"], block_chars=1)) == ["a", " x y"]
    assert list(stream_blocks(["a x y"], block_chars=1)) == ["a x", " y"]
    assert list(stream_blocks(["a x", " y b"], ["x y"], block_chars=1)) == ["a", " x y", " b"]
    # "a x " has read the space after x, but not yet whether "y" follows: no cut there yet.
    assert list(stream_blocks(["a x ", "y b"], ["x y"], block_chars=1)) == ["a", " x y", " b"]
    assert list(stream_blocks(["ab c", "d e"], ["d e"], block_chars=1)) == ["ab", " cd e"]
    # A special token at the very start, and one that ends with the space after the cut.
    assert list(stream_blocks(["x y", "z"], ["x y"], block_chars=1)) == ["x yz"]
    assert list(stream_blocks(["ab c"], ["b "], block_chars=1)) == ["ab c"]


def reference_blocks(texts, special_tokens, block_chars):
    """stream_blocks without its bookkeeping: each time block_chars or more characters wait, look
    at every place in them for the last one to cut (a non-space then a space, no special token
    across it, and far enough from the end that none can still be arriving)."""
    longest = max(map(len, special_tokens), default=0)
    pending = ""
    for piece in texts:
        pending += piece
        if len(pending) < block_chars:
            continue
        end = len(pending) - max(longest - 1, 0)
        cuts = [cut for cut in range(1, min(end, len(pending) - 1) + 1)
                if regex.match(r"\S\s", pending[cut - 1:cut + 1])
                and not any(pending.startswith(token, at) for token in special_tokens
                            for at in range(max(0, cut - len(token) + 1), cut))]
        if cuts:
            yield pending[:cuts[-1]]
            pending = pending[cuts[-1]:]
    if pending:
        yield pending

SPECIALS = st.sampled_from([[], ["x y"], ["b"], ["x y", "y  x"], ["<e>", "a a"], [" ", "ab x"]])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab xy\n<e>", max_size=7), max_size=8), SPECIALS, st.integers(1, 9))
def test_stream_blocks_cut_at_the_last_safe_place_as_a_plain_search_does(texts, special_tokens, block_chars):
    assert list(stream_blocks(texts, special_tokens, block_chars)) == list(
        reference_blocks(texts, special_tokens, block_chars))


def test_stream_blocks_refuse_what_is_not_an_iterable_of_str():
    hint = "expected an iterable of str, such as the lines of a file opened with encoding='utf-8'"
    with raises_exactly(TypeError, f"texts is 'ab' of type str, {hint} (one str? encode it whole)"):
        list(stream_blocks("ab"))
    with raises_exactly(TypeError, f"texts is b'a' of type bytes, {hint}"):
        list(stream_blocks(b"a"))
    with raises_exactly(TypeError, f"texts is bytearray(b'a') of type bytearray, {hint}"):
        list(stream_blocks(bytearray(b"a")))
    with raises_exactly(TypeError, f"texts is 5 of type int, {hint}"):
        list(stream_blocks(5))
    with raises_exactly(ValueError, "block_chars is 0, expected a positive int"):
        list(stream_blocks(["a"], block_chars=0))
    with raises_exactly(TypeError, "texts[1] is 7 of type int, expected a str"):
        list(stream_blocks(["a", 7]))
    with raises_exactly(ValueError, "texts[1][1] is '\\ud800', a lone surrogate that UTF-8 cannot encode; "
                                    "expected valid Unicode text"):
        list(stream_blocks(["ok", "a\ud800"]))


def test_special_token_checks_are_named_in_full():
    with raises_exactly(TypeError, "special_tokens is 'x', a single string; expected a list of strings such as ['x']"):
        CharTokenizer(["a"], "x")
    with raises_exactly(TypeError, "special_tokens is b'x', a single string; expected a list of strings such as [b'x']"):
        CharTokenizer(["a"], b"x")
    with raises_exactly(TypeError, "special_tokens is 5 of type int, expected a list of strings"):
        CharTokenizer(["a"], 5)
    with raises_exactly(TypeError, "special_tokens holds b'x' of type bytes, expected strings"):
        CharTokenizer(["a"], ["ok", b"x"])
    with raises_exactly(ValueError, "special_tokens holds '', expected non-empty strings"):
        CharTokenizer(["a"], ["ok", ""])
    with raises_exactly(ValueError, "special_tokens is ['a', 'a'], expected no repeats"):
        CharTokenizer(["a"], ["a", "a"])
    assert CharTokenizer(["a"], iter(["<x>", "<y>"])).special_tokens == {"<x>": 1, "<y>": 2}


def test_split_special_prefers_the_longest_token_and_escapes_them():
    assert split_special("a<|e|>b<|e", ["<|e", "<|e|>"]) == [
        ("a", False), ("<|e|>", True), ("b", False), ("<|e", True)]
    assert split_special("a.b", ["."]) == [("a", False), (".", True), ("b", False)]
    assert split_special("<s><s>", ["<s>"]) == [("<s>", True), ("<s>", True)]
    assert split_special("", []) == []


def test_ids_from_numpy_and_torch_are_plain_ints_and_are_checked():
    tokenizer = CharTokenizer(["a", "b", "c"])
    assert tokenizer.decode([np.int64(2), torch.tensor(1), np.uint8(0)]) == "cba"
    assert tokenizer.decode(np.array([0, 2])) == "ac"
    with raises_exactly(TypeError, "ids is 5 of type int, expected a list of integer ids"):
        tokenizer.decode(5)
    with raises_exactly(TypeError, "ids is b'a' of type bytes, expected a list of integer ids"):
        tokenizer.decode(b"a")
    with raises_exactly(TypeError, "ids is bytearray(b'a') of type bytearray, expected a list of integer ids"):
        tokenizer.decode(bytearray(b"a"))
    with raises_exactly(TypeError, "ids[0] is np.True_ of type bool, expected an integer id"):
        tokenizer.decode([np.bool_(True)])
    with raises_exactly(TypeError, "ids[1] is True of type bool, expected an integer id"):
        tokenizer.decode([0, True])
    with raises_exactly(TypeError, "ids[1] is 'a' of type str, expected an integer id"):
        tokenizer.decode([1, "a"])
    with raises_exactly(ValueError, "ids[1] is 3, expected an id in range(0, 3) "
                                    "(the size of this tokenizer's vocabulary)"):
        tokenizer.decode([2, 3])
    with raises_exactly(ValueError, "ids[0] is -1, expected an id in range(0, 3) "
                                    "(the size of this tokenizer's vocabulary)"):
        tokenizer.decode([np.int64(-1)])
    assert checks.token_id_at("ids", 0, torch.tensor(4)) == 4 and type(checks.token_id_at("ids", 0, np.int32(4))) is int


def test_bool_tensors_are_refused():
    with pytest.raises(TypeError, match=r"^ids\[0\] is tensor\(True\) of type Tensor, expected an integer id$"):
        CharTokenizer(["a", "b"]).decode(torch.tensor([True]))


@pytest.mark.parametrize(("content", "message"), [
    ("[1, 2]", "holds a 'list', expected a saved CharTokenizer"),
    ('{"type": "BPETokenizer"}', "holds a 'BPETokenizer', expected a saved CharTokenizer"),
    ('{"chars": []}', "holds a None, expected a saved CharTokenizer"),
    ('{"type": "CharTokenizer"}', "has no 'chars', 'special_tokens', expected a complete saved CharTokenizer"),
    ('{"type": "CharTokenizer", "chars": []}', "has no 'special_tokens', expected a complete saved CharTokenizer"),
])
def test_a_wrong_file_is_named_with_what_is_wrong(tmp_path, content, message):
    path = tmp_path / "chars.json"
    path.write_text(content, encoding="utf-8")
    with raises_exactly(ValueError, f"{path} {message}"):
        CharTokenizer.load(path)


def test_a_file_that_is_not_json_or_not_utf8_is_named(tmp_path):
    path = tmp_path / "chars.json"
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} is not a JSON file \(.*\), expected what "
                                         r"CharTokenizer\.save writes$"):
        CharTokenizer.load(path)
    path.write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match=r"is not a JSON file \(Expecting property name"):
        CharTokenizer.load(path)


def test_char_save_writes_readable_utf8_json(tmp_path):
    tokenizer = CharTokenizer(["a", "é"], special_tokens=["☕"])
    path = tokenizer.save(tmp_path / "chars.json")
    text = path.read_bytes().decode("utf-8")
    assert '"é"' in text and '"☕"' in text  # characters as themselves
    assert text.splitlines()[:3] == ["{", ' "type": "CharTokenizer",', ' "chars": [']  # one space a level
    assert json.loads(text) == {"type": "CharTokenizer", "chars": ["a", "é"], "special_tokens": ["☕"]}
    assert CharTokenizer.load(path) == tokenizer


def test_char_tokenizer_ids_repr_and_equality():
    tokenizer = CharTokenizer.train("ba<e>c", special_tokens=["<e>", "<f>"])
    assert tokenizer.chars == ["a", "b", "c"]
    assert tokenizer.special_tokens == {"<e>": 3, "<f>": 4} and tokenizer.vocab_size == 5
    assert tokenizer.encode("c<f>ab<e>") == [2, 4, 0, 1, 3]
    assert repr(tokenizer) == "CharTokenizer(vocab_size=5, special_tokens=['<e>', '<f>'])"
    assert tokenizer == CharTokenizer(["a", "b", "c"], ["<e>", "<f>"])
    assert tokenizer != CharTokenizer(["a", "b", "c"], ["<e>"])
    assert tokenizer != CharTokenizer(["a", "b", "d"], ["<e>", "<f>"])
    assert tokenizer != ["a", "b", "c"]


def test_char_tokenizer_refuses_bad_chars_in_full():
    with raises_exactly(ValueError, "chars holds 'ab', expected single characters"):
        CharTokenizer(["a", "ab"])
    with raises_exactly(ValueError, "chars holds 5, expected single characters"):
        CharTokenizer(["a", 5])
    with raises_exactly(ValueError, "chars holds '', expected single characters"):
        CharTokenizer([""])
    with raises_exactly(ValueError, "chars holds repeated characters, expected each character once"):
        CharTokenizer(["a", "b", "a"])
    with raises_exactly(ValueError, "text is empty, expected some training text to collect characters from"):
        CharTokenizer.train("<e>", special_tokens=["<e>"])


def test_an_unknown_character_after_a_special_token_is_placed_in_the_whole_text():
    tokenizer = CharTokenizer(["a", "b"], special_tokens=["<e>"])
    message = ("text[6] is 'z', which is not among this tokenizer's 2 characters; train on text that "
               "contains it, or use BPETokenizer, which can encode any text")
    with raises_exactly(ValueError, message):
        tokenizer.encode("ab<e>az")
    with raises_exactly(ValueError, message.replace("text[6]", "text[5]")):
        tokenizer.encode("ab<e>zazz")  # the first of the three


def test_readable_marks_tabs_spaces_and_new_lines():
    assert readable(b"a\tb \n") == "a⇥b␣↵"
    assert readable(b"\xe2\x98") == "\\xe2\\x98"


def test_split_chunks_and_read_saved_refuse_what_is_not_a_pattern_a_text_or_a_path():
    from helpers.text.chars import compile_pattern, read_saved, split_chunks
    with pytest.raises(TypeError, match=r"^splitter is 'a' \(a str\), expected a compiled pattern"):
        split_chunks("a", "abc")
    with pytest.raises(TypeError, match=r"^text is 3 \(a int\), expected a str"):
        split_chunks(compile_pattern("a"), 3)
    with pytest.raises(TypeError, match=r"^path is 7 \(a int\), expected a file name"):
        read_saved(7, "CharTokenizer", ())
    assert split_chunks(compile_pattern("b"), "abc") == ["a", "b", "c"]
