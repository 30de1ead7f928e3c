"""Checked exercises of notebook 01, tokenization: count pairs, apply merges, decode bytes.

Each checker runs the student's function on a few small cases, the tricky ones included, and
compares it with the course's own implementation in `helpers.text.bpe`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from helpers.lab.exercises import ExerciseFailed, exercise, expect_count
from helpers.text import bpe as reference


def _is_int(value: Any) -> bool:
    """True for an int (a NumPy integer too), false for a float such as 2.0 or for a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


PAIR_CASES = [
    [1, 2, 3, 1, 2],  # a pair that occurs twice
    [5, 5, 5],  # overlapping occurrences both count
    [104, 105],
    [42],  # one id: no pairs at all
    [],
]


@exercise(hint="Walk over neighbours with zip(ids, ids[1:]) (or itertools.pairwise) and add 1 "
               "to a dict entry per pair: counts[pair] = counts.get(pair, 0) + 1.",
          task="Write count_pairs(ids) returning a dict {(left, right): count} of neighbouring ids. "
               "The check tries five lists: a repeated pair, overlapping pairs, one id, none.")
def count_pairs(student: Callable[[list[int]], Any]) -> str:
    for ids in PAIR_CASES:
        got = student(list(ids))
        expected = dict(reference.count_pairs(ids))
        if not isinstance(got, dict):
            raise ExerciseFailed(f"for ids={ids} you returned a {type(got).__name__}, expected a dict "
                                 "{(left, right): count}.")
        for pair, count in got.items():
            expect_count(count, f"the count of {pair!r} for ids={ids}")
        got = {pair: count for pair, count in got.items() if count}  # a Counter's zeros are fine
        if ids == [5, 5, 5] and got == {(5, 5): 1}:
            raise ExerciseFailed("for ids=[5, 5, 5] you counted (5, 5) once: overlapping pairs both "
                                 "count (positions 0-1 and 1-2).")
        if len(ids) > 1 and got == dict(reference.count_pairs(ids[:-1])):
            raise ExerciseFailed(f"for ids={ids} the last pair {tuple(ids[-2:])} is missing: the "
                                 f"{len(ids)} ids have {len(ids) - 1} neighbouring pairs.")
        if got != expected:
            raise ExerciseFailed(f"for ids={ids} you returned {got}, expected {expected}.")
    return "The trainer runs this count once, then only updates it after each merge."


MERGE_RULES = [(104, 105), (256, 33)]  # "h" + "i" -> 256, then "hi" + "!" -> 257
WORD_CASES = ["hi!", "hihi", "oh hi", "h", "", "ih"]


@exercise(hint="Apply the merges in the order they were learned: for rank, pair in "
               "enumerate(merges), replace the pair by the id 256 + rank using merge(ids, pair, new_id).",
          task="Write encode_word(word, merges) returning the word's ids after the learned merges. "
               "The check tries six words, the empty one included, with two merge rules.")
def encode_word(student: Callable[[str, list[tuple[int, int]]], Any]) -> str:
    tokenizer = reference.BPETokenizer(MERGE_RULES)
    for word in WORD_CASES:
        got = student(word, list(MERGE_RULES))
        expected = tokenizer.apply_merges(list(word.encode("utf-8")))
        if word == "hi!" and got == [256, 33]:
            raise ExerciseFailed("encode_word('hi!') stopped after the first merge: merge 1 turns "
                                 "(256, 33) into 257, so apply every merge, in order.")
        if word == "hi!" and got in ([255, 33], [0, 33], [1, 33]):
            raise ExerciseFailed(f"encode_word('hi!') gave {got}: the merge of rank r makes the new "
                                 "id 256 + r (ids 0 ... 255 are the bytes).")
        if not isinstance(got, list) or not all(map(_is_int, got)) or got != expected:
            raise ExerciseFailed(f"encode_word({word!r}, {MERGE_RULES}) returned {got!r}, expected "
                                 f"{expected} (the bytes are {list(word.encode('utf-8'))}).")
    return "Merges learned early are applied first, exactly as in training."


DECODE_VOCAB = {0: b"I ", 1: b"like ", 2: "caf\u00e9".encode()[:4], 3: "\u00e9".encode()[1:],
                4: "\u2615".encode(), 5: b"!"}
DECODE_CASES = [[0, 1, 4], [2, 3, 5], [0, 2, 3], [2], []]


@exercise(hint="Join the bytes of every token first (b''.join(...)), then decode once with "
               ".decode('utf-8', errors='replace'): a character may be split across two tokens.",
          task="Write decode_ids(ids, vocab) returning the text of the ids, vocab mapping id -> "
               "bytes. The check includes a character whose bytes are split across two tokens.")
def decode_ids(student: Callable[[list[int], dict[int, bytes]], Any]) -> str:
    for ids in DECODE_CASES:
        try:
            got = student(list(ids), dict(DECODE_VOCAB))
        except UnicodeDecodeError:
            raise ExerciseFailed(f"for ids={ids} decoding failed with UnicodeDecodeError: a character cut "
                                 "between tokens (or left unfinished) is not valid UTF-8 on its own. "
                                 "Join all the bytes first, and decode with errors='replace'.") from None
        split = "".join(DECODE_VOCAB[i].decode("utf-8", errors="replace") for i in ids)
        if got == split and split != b"".join(DECODE_VOCAB[i] for i in ids).decode("utf-8", errors="replace"):
            raise ExerciseFailed(f"for ids={ids} you decoded token by token and got {got!r}: the "
                                 "bytes of one character are split across two tokens, so join "
                                 "the bytes first and decode once.")
        expected = b"".join(DECODE_VOCAB[i] for i in ids).decode("utf-8", errors="replace")
        if got != expected:
            pieces = [DECODE_VOCAB[i] for i in ids]
            raise ExerciseFailed(f"for ids={ids} (tokens {pieces}) you returned {got!r}, "
                                 f"expected {expected!r}.")
    return "Bytes first, text last: that is why byte-level BPE can encode any text."
