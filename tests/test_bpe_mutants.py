"""helpers.text.bpe: what test_bpe.py lets through, written for the mutation run (benchmarks/mutation.py,
issue 30).

Every tokenizer here is built inside its test from a few dozen characters: test_bpe.py's cached
corpus tokenizers are trained once per process, before mutmut plants a bug, so a mutant of the
trainer never reaches them. Grouped by the issue's classes: the tie rule without a vocabulary,
arguments passed on (special tokens, pattern, sizes), error messages read in full, the saved file,
the cache, labels and repr.
"""

from __future__ import annotations

import json
import re

import pytest

from helpers.text import bpe
from helpers.text.bpe import BPETokenizer, learn_merges, most_frequent_pair, textbook_merges
from helpers.text.chars import GPT2_SPLIT_PATTERN

A, B, C = ord("a"), ord("b"), ord("c")


# --- most_frequent_pair without a vocabulary: the ids are bytes ---------------------------------

def test_most_frequent_pair_without_vocab_takes_the_highest_count_then_the_greatest_bytes():
    assert most_frequent_pair({(A, B): 3, (B, C): 1}) == (A, B)
    assert most_frequent_pair({(A, B): 2, (B, A): 2, (A, A): 1}) == (B, A)  # b"b" > b"a"
    assert most_frequent_pair({(C, A): 1, (C, B): 1}) == (C, B)  # first bytes tie: the second decides
    assert most_frequent_pair({(0, 255): 1, (255, 0): 1}) == (255, 0)  # the edge bytes are bytes


@pytest.mark.parametrize("bad_id", [256, 300, -1])
def test_most_frequent_pair_without_vocab_refuses_ids_beyond_the_bytes(bad_id):
    message = (f"pair_counts holds ids such as {max([(A, B), (bad_id, A)])} beyond the bytes, expected "
               "vocab (id -> bytes) to tell how they are spelled")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        most_frequent_pair({(A, B): 2, (bad_id, A): 2})


def test_most_frequent_pair_without_vocab_ignores_ids_of_pairs_that_lose():
    # Only the tied pairs are spelled; a rarer pair may hold any id.
    assert most_frequent_pair({(A, B): 2, (999, A): 1}) == (A, B)


def test_most_frequent_pair_of_nothing_says_so():
    with pytest.raises(ValueError, match=r"^pair_counts is empty, expected at least one pair to choose from$"):
        most_frequent_pair({})


def test_pairs_that_spell_the_same_bytes_go_by_the_smaller_ids():
    vocab = {300: b"a", 301: b"a", 302: b"b", 303: b"b"}
    assert most_frequent_pair({(301, 302): 1, (300, 302): 1}, vocab) == (300, 302)
    assert most_frequent_pair({(302, 301): 1, (302, 300): 1}, vocab) == (302, 300)
    assert most_frequent_pair({(300, 303): 1, (300, 302): 1}, vocab) == (300, 302)
    assert most_frequent_pair({(301, 302): 1, (300, 303): 1}, vocab) == (300, 303)  # the left id first


# --- the trainers: sizes, special tokens, the pattern --------------------------------------------

@pytest.mark.parametrize("trainer", [textbook_merges, learn_merges])
def test_the_trainers_name_n_merges_when_it_is_bad(trainer):
    with pytest.raises(ValueError, match=r"^n_merges is -1, expected at least 0$"):
        trainer("ab ab", -1)
    with pytest.raises(TypeError, match=r"^n_merges is 1\.5 \(a float\), expected an int >= 0$"):
        trainer("ab ab", 1.5)


def test_train_gives_exactly_the_requested_vocabulary_size():
    tokenizer = BPETokenizer.train("aaabdaaabac " * 3, vocab_size=256 + 2 + 3, special_tokens=["<a>", "<b>"])
    assert len(tokenizer.merges) == 3 and tokenizer.vocab_size == 261
    assert tokenizer.special_tokens == {"<a>": 259, "<b>": 260}


def test_train_never_merges_across_a_special_token_inside_a_word():
    # With "XY" special, "abXYab" is the chunks "ab" and "ab"; read as plain text it is one chunk.
    tokenizer = BPETokenizer.train("abXYab abXYab", vocab_size=256 + 1 + 10, special_tokens=["XY"])
    learned = [tokenizer.vocab[256 + i] for i in range(len(tokenizer.merges))]
    assert learned == [b"ab", b" ab"]
    assert tokenizer.encode("abXYab") == [256, 258, 256]


def test_train_keeps_its_pattern():
    pattern = r"\w+"
    tokenizer = BPETokenizer.train("ab ab ab", vocab_size=260, pattern=pattern)
    assert tokenizer.pattern == pattern
    assert tokenizer.merges == [(A, B)]  # " ab" is never one chunk under \w+
    assert tokenizer == BPETokenizer([(A, B)], pattern=pattern)


def test_train_names_vocab_size_with_the_bound_and_why():
    message = ("vocab_size is 100, expected at least 258: one id for each of the 256 bytes plus "
               "2 special token(s)")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        BPETokenizer.train("ab", 100, special_tokens=["x", "y"])


# --- the tokenizer: special-token ids, errors, labels, repr, equality ---------------------------

def test_special_tokens_are_numbered_after_the_merges_in_order():
    tokenizer = BPETokenizer([(A, B), (256, C)], special_tokens=["<a>", "<b>", "<c>"])
    assert tokenizer.special_tokens == {"<a>": 258, "<b>": 259, "<c>": 260}
    assert tokenizer.vocab[259] == b"<b>" and tokenizer.vocab_size == 261
    assert tokenizer.encode("abc<c><a>") == [257, 260, 258]
    assert tokenizer.decode([260, 257, 259]) == "<c>abc<b>"


def test_bad_merges_are_named_in_full():
    with pytest.raises(TypeError, match=r"^merges is 5 of type int, expected a list of pairs$"):
        BPETokenizer(5)
    message = "merges[1] is (256, 300), expected a pair of ids below 257 (bytes and earlier merges)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        BPETokenizer([(A, B), (256, 300)])


def test_labels_show_each_token_readably_and_check_the_ids():
    tokenizer = BPETokenizer([(A, B)], special_tokens=["<a>", "é"])
    assert tokenizer.labels([256, 32, 10, 9, 0xC3, 257, 258]) == ["ab", "␣", "↵", "⇥", "\\xc3", "<a>", "é"]
    assert tokenizer.labels(iter([A])) == ["a"]
    with pytest.raises(ValueError, match=r"^ids\[0\] is 259, expected an id in range\(0, 259\)"):
        tokenizer.labels([259])


def test_repr_names_the_sizes_and_the_special_tokens():
    tokenizer = BPETokenizer([(A, B), (256, C)], special_tokens=["<a>", "é"])
    assert repr(tokenizer) == "BPETokenizer(vocab_size=260, merges=2, special_tokens=['<a>', 'é'])"


def test_equality_needs_the_same_merges_special_tokens_and_pattern():
    base = BPETokenizer([(A, B)], ["<a>"])
    assert base == BPETokenizer([[A, B]], ["<a>"])
    assert base != BPETokenizer([], ["<a>"])  # merges differ, the rest agrees
    assert base != BPETokenizer([(A, B)], ["<b>"])
    assert base != BPETokenizer([(A, B)], ["<a>"], pattern=r"\w+")
    assert base != [(A, B)]


# --- the saved file ---------------------------------------------------------------------------

def test_save_writes_readable_utf8_json(tmp_path):
    tokenizer = BPETokenizer([(A, B)], special_tokens=["☕"])
    path = tokenizer.save(tmp_path / "bpe.json")
    text = path.read_bytes().decode("utf-8")
    assert '"☕"' in text  # written as itself, not as \u2615
    assert json.loads(text) == {"type": "BPETokenizer", "pattern": GPT2_SPLIT_PATTERN,
                                "special_tokens": ["☕"], "merges": [[A, B]]}
    assert BPETokenizer.load(path) == tokenizer


def test_load_names_the_pattern_and_the_known_ones_in_full(tmp_path):
    path = tmp_path / "bpe.json"
    path.write_text(json.dumps({"type": "BPETokenizer", "pattern": "a+", "special_tokens": [], "merges": []}),
                    encoding="utf-8")
    message = (f"{path} holds the pattern 'a+', expected one of the known pre-tokenizer patterns (GPT-2) "
               "because a crafted regular expression can take exponential time; for your own, build it "
               "in code: BPETokenizer(merges, special_tokens, pattern)")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        BPETokenizer.load(path)


def test_load_names_every_known_pattern(tmp_path, monkeypatch):
    monkeypatch.setattr(bpe, "KNOWN_PATTERNS", {"GPT-2": GPT2_SPLIT_PATTERN, "words": r"\w+"})
    path = tmp_path / "bpe.json"
    path.write_text(json.dumps({"type": "BPETokenizer", "pattern": "a+", "special_tokens": [], "merges": []}),
                    encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape("known pre-tokenizer patterns (GPT-2, words) because")):
        BPETokenizer.load(path)
    saved = BPETokenizer([(A, B)], pattern=r"\w+").save(tmp_path / "words.json")
    assert BPETokenizer.load(saved).pattern == r"\w+"


# --- the chunk cache ----------------------------------------------------------------------------

def test_the_chunk_cache_is_emptied_when_it_is_full(monkeypatch):
    monkeypatch.setattr(bpe, "_CACHE_LIMIT", 2)
    tokenizer = BPETokenizer([(A, B)])
    assert tokenizer.encode("ab") == [256] and len(tokenizer._cache) == 1
    assert tokenizer.encode("ab") == [256] and len(tokenizer._cache) == 1  # looked up, not added
    tokenizer.encode(" ab")
    assert tokenizer._cache == {"ab": [256], " ab": [32, 256]}
    assert tokenizer.encode(" b") == [32, B]
    assert tokenizer._cache == {" b": [32, B]}  # full at 2: emptied, then the new chunk


# --- long chunks: the heap merge against merging in the order learned --------------------------

def merged_in_order(ids, merges):
    for rank, pair in enumerate(merges):
        ids = bpe.merge(ids, pair, 256 + rank)
    return ids


@pytest.mark.parametrize("chunk", [
    "ab" * 40,                                  # occurrences side by side
    "a" * 70 + "b",                             # a run: (a, a) merges overlap
    "abcabdabcaab" * 7,
    "".join("abcd"[(i * i + 3 * i) % 4] for i in range(97)),
    "dcba" * 17,                                # merges learned on another order, few apply
])
def test_the_heap_merge_of_a_long_chunk_equals_merging_in_the_order_learned(chunk):
    tokenizer = BPETokenizer.train("aaab abab abcab abd abcd " * 3 + "aaaa", vocab_size=256 + 12,
                                   pattern=r"[\s\S]+")
    assert len(tokenizer.merges) == 12
    ids = list(chunk.encode())
    assert len(ids) > bpe._HEAP_MERGE_LENGTH
    expected = merged_in_order(ids, tokenizer.merges)
    assert tokenizer.apply_merges(list(ids)) == expected
    assert tokenizer._apply_merges_heap(list(ids)) == expected
    assert tokenizer.encode(chunk) == expected  # one chunk under [\s\S]+


def test_a_chunk_of_exactly_the_heap_length_is_merged_by_the_scanning_loop(monkeypatch):
    tokenizer = BPETokenizer([(A, B), (256, 256)])
    calls = []
    monkeypatch.setattr(BPETokenizer, "_apply_merges_heap", lambda self, ids: calls.append(len(ids)) or ids)
    assert tokenizer.apply_merges(list(b"ab" * 32)) == [257] * 16  # 64 bytes: the loop
    assert calls == []
    tokenizer.apply_merges(list(b"ab" * 32 + b"a"))
    assert calls == [65]


def test_the_heap_merge_joins_a_new_token_with_an_unmerged_left_neighbour():
    # x a b: merging a b at position 2 makes the pair (x, ab) at positions 1 and 2, a neighbour
    # that no earlier merge moved; in a run such as a b a b the left neighbour is always merged.
    x = ord("x")
    tokenizer = BPETokenizer([(A, B), (x, 256)])
    ids = list(b"cxab" * 17)
    assert len(ids) > bpe._HEAP_MERGE_LENGTH
    assert tokenizer.apply_merges(list(ids)) == [C, 257] * 17 == merged_in_order(ids, tokenizer.merges)


def test_the_heap_merge_at_the_first_and_the_last_position():
    x, d = ord("x"), ord("d")
    # Position 0 as the left neighbour of a new token (x + ab) and as the new token itself (ab + c).
    tokenizer = BPETokenizer([(A, B), (x, 256), (256, C)])
    assert tokenizer.apply_merges(list(b"xab" + b"d" * 62)) == [257] + [d] * 62
    assert tokenizer.apply_merges(list(b"abc" + b"d" * 62)) == [258] + [d] * 62
    # b c at the end merges first, then a + bc; the stale entry for a b then finds no right neighbour.
    tokenizer = BPETokenizer([(B, C), (A, 256), (A, B)])
    ids = list(b"d" * 62 + b"abc")
    assert tokenizer.apply_merges(list(ids)) == [d] * 62 + [257] == merged_in_order(ids, tokenizer.merges)


# --- encode_iterable: lazily with GPT-2's pattern, never cutting a special token ----------------

def test_encode_iterable_reads_lazily_only_with_gpt2s_pattern():
    def counted(read):
        for index in range(200):
            read.append(index)
            yield "ab " * 400  # 1,200 characters a piece: a block every 55 pieces
    read = []
    first = next(BPETokenizer([(A, B)]).encode_iterable(counted(read)))
    assert first == 256 and len(read) < 100
    read = []
    first = next(BPETokenizer([(A, B)], pattern=r"\w+|\s+").encode_iterable(counted(read)))
    assert first == 256 and len(read) == 200  # another pattern: the whole text is read first


def test_encode_iterable_never_cuts_a_block_inside_a_special_token():
    # After 70,000 letters and " x " a block may end; cutting after "x" would split "x y".
    tokenizer = BPETokenizer([], special_tokens=["x y"])
    pieces = ["a" * 70_000 + " x ", "y b"]
    ids = list(tokenizer.encode_iterable(pieces))
    assert ids == tokenizer.encode("".join(pieces)) and ids.count(256) == 1


def test_each_distinct_chunk_is_merged_once(monkeypatch):
    calls = []
    original = BPETokenizer.apply_merges
    monkeypatch.setattr(BPETokenizer, "apply_merges", lambda self, ids: calls.append(bytes(ids)) or original(self, ids))
    assert BPETokenizer([(A, B)]).encode("ab ab ab") == [256, 32, 256, 32, 256]
    assert calls == [b"ab", b" ab"]  # " ab" the second time comes from the cache


def test_training_on_nothing_is_named_in_full():
    with pytest.raises(ValueError, match=r"^text is empty \(or only special tokens\), expected some training "
                                         r"text to learn merges from$"):
        learn_merges("<e>", 3, special_tokens=["<e>"])
