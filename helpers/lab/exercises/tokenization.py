"""Checked exercises of notebook 01, tokenization: count pairs, the training loop, apply merges,
decode bytes.

Each checker runs the student's function on a few small cases, the tricky ones included, and
compares it with the course's own implementation in `helpers.text.bpe`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from helpers.lab.exercises import ExerciseFailed, exercise, expect_count
from helpers.text import bpe as reference
from helpers.text.chars import pre_split
from helpers.text.corpus import TOY_SOUP


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


# --- the core exercise: the BPE training loop --------------------------------------------------

def _variant(text: str, n_merges: int, split: bool = True, tie: str = "bytes",
             recount: bool = True) -> list[tuple[int, int]]:
    """The training loop, right by default, or with one of the usual slips (to name it)."""
    chunks = [list(c.encode("utf-8")) for c in (pre_split(text) if split else [text])]
    vocab = [bytes([byte]) for byte in range(256)]
    merges: list[tuple[int, int]] = []
    counts: Counter = Counter()
    for step in range(n_merges):
        if recount or step == 0:
            counts = Counter()
            for ids in chunks:
                counts.update(reference.count_pairs(ids))
        counts = Counter({pair: n for pair, n in counts.items() if n > 0})
        if not counts:
            break
        if tie == "bytes":
            pair = reference.most_frequent_pair(counts, vocab)
        elif tie == "first":
            pair = counts.most_common(1)[0][0]
        else:  # the greatest ids, which is the byte order only while every id is a byte
            top = max(counts.values())
            pair = max(p for p, n in counts.items() if n == top)
        merges.append(pair)
        vocab.append(vocab[pair[0]] + vocab[pair[1]])
        chunks = [reference.merge(ids, pair, 256 + step) for ids in chunks]
        del counts[pair]
    return merges


SLIPS = {
    "merges across chunk boundaries: pre-split the text first and count pairs inside each chunk "
    "only (pre_split(text))": {"split": False},
    "merges the wrong pair on a tie (you took the first pair counted): among equally frequent "
    "pairs take the one whose byte strings are greatest, most_frequent_pair(counts, vocab)": {"tie": "first"},
    "merges the wrong pair on a tie (you compared the ids): a tie goes to the greatest byte strings, "
    "so keep vocab (id -> bytes) and call most_frequent_pair(counts, vocab)": {"tie": "ids"},
    "counts the pairs only once: count again after every merge, since a merge removes pairs and "
    "makes new ones": {"recount": False},
}
TRAIN_CASES = [("low lower lowest newer wider new", 10), (TOY_SOUP, 12), ("aaab ab", 10), ("soup", 0)]


@exercise(hint="Each step: count the pairs of every chunk, pick the most frequent (ties by the "
               "bytes they spell), replace it everywhere by the next new id; stop early when no "
               "chunk has a pair left.",
          task="Write train_textbook(text, n_merges) returning the list of merged pairs in order. "
               "The check trains on four texts (one runs out of pairs, one asks for 0 merges) and "
               "compares every merge with the course's trainer.")
def train_bpe(student: Callable[[str, int], Any]) -> str:
    for text, n_merges in TRAIN_CASES:
        got = student(text, n_merges)
        if not isinstance(got, list):
            raise ExerciseFailed(f"train_textbook({text!r}, {n_merges}) returned a {type(got).__name__}, "
                                 "expected a list of (left, right) pairs.")
        got = [tuple(pair) if isinstance(pair, list | tuple) else pair for pair in got]
        expected = [m.pair for m in reference.textbook_merges(text, n_merges)]
        if got == expected:
            continue
        for slip, knobs in SLIPS.items():
            if got == _variant(text, n_merges, **knobs):
                raise ExerciseFailed(f"on {text!r} your loop {slip}.")
        if got == expected[:len(got)] and len(got) < len(expected):
            raise ExerciseFailed(f"on {text!r} you returned {len(got)} merges, expected {len(expected)}: "
                                 f"the first {len(got)} are right, keep going until n_merges.")
        first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
        where = f"merge {first} is {got[first]}, expected {expected[first]}" if first is not None else \
            f"you returned {len(got)} merges, expected {len(expected)}"
        raise ExerciseFailed(f"train_textbook({text!r}, {n_merges}): {where}.")
    return "That is the textbook BPE loop; the rest of the notebook trains with it."
