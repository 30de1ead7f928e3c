"""Checked exercises of notebook 01, tokenization: count pairs, the training loop, encode a text,
decode bytes.

Each checker runs the student's function on a few small cases, the tricky ones included, and
compares it with the course's own implementation in `helpers.text.bpe`. A failure says what is
wrong; its `fix` says, in words, how to put it right.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from helpers.lab.exercises import ExerciseFailed, exercise, expect_count, hidden_round, seeded
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


@exercise(hint="Visit every neighbouring pair once, from the first two ids to the last two, and "
               "add one to that pair's entry of a dict, starting it at zero the first time.",
          task="Write count_pairs(ids) returning a dict {(left, right): count} of neighbouring ids. "
               "The check tries five lists: a repeated pair, overlapping pairs, one id, none.")
def count_pairs(student: Callable[[list[int]], Any]) -> str:
    cases = PAIR_CASES
    if hidden_round():  # a longer list drawn from the hidden seed, few ids so that pairs repeat
        cases = [torch.randint(0, 4, (20,), generator=seeded(70)).tolist(), [9, 9]] + PAIR_CASES
    for ids in cases:
        got = student(list(ids))
        expected = dict(reference.count_pairs(ids))
        if not isinstance(got, dict):
            raise ExerciseFailed(f"for ids={ids} you returned a {type(got).__name__}, expected a dict "
                                 "{(left, right): count}.",
                                 fix="build a dict whose keys are the pairs (as tuples) and whose "
                                     "values are their counts, and return it.")
        for pair, count in got.items():
            expect_count(count, f"the count of {pair!r} for ids={ids}")
        got = {pair: count for pair, count in got.items() if count}  # a Counter's zeros are fine
        if ids == [5, 5, 5] and got == {(5, 5): 1}:
            raise ExerciseFailed("for ids=[5, 5, 5] you counted (5, 5) once, but overlapping pairs "
                                 "both count (positions 0-1 and 1-2).",
                                 fix="move one position at a time, not past the pair you just "
                                     "counted.")
        if len(ids) > 1 and got == dict(reference.count_pairs(ids[:-1])):
            raise ExerciseFailed(f"for ids={ids} the last pair {tuple(ids[-2:])} is missing: the "
                                 f"{len(ids)} ids have {len(ids) - 1} neighbouring pairs.",
                                 fix="let the last pair be the last two ids: each id but the last "
                                     "starts one pair.")
        if got != expected:
            raise ExerciseFailed(f"for ids={ids} you returned {got}, expected {expected}.",
                                 fix="each pair is an id and the id right after it; count every "
                                     "such pair once for each place it starts.")
    return "The trainer runs this count once, then only updates it after each merge."


# --- a core exercise: encode a whole text with the learned merges --------------------------------

# Merge i makes id 256 + i: "ou", "sou", " sou", " soup", "so", "e ", "ë", "Zo", "Zoë". "ou" comes
# before "so", so "soup" must merge "ou" first; "e ", an "e" with the space after it, only ever
# occurs across a chunk boundary, which a correct encoder never merges; "ë" is two bytes.
ENCODE_MERGES = [(111, 117), (115, 256), (32, 257), (258, 112), (115, 111), (101, 32), (195, 171),
                 (90, 111), (263, 262)]
ENCODE_CASES = ["I like to eat soup.", "Zoë ate soup!", "soup  soup\n\nsoup", "", "so sou soup"]


def encode_variant(text: str, merges: list[tuple[int, int]], split: bool = True, utf8: bool = True,
                   first_id: int = 256, order: str = "learned") -> list[int]:
    """Encode `text` by replaying `merges` in each chunk, right by default, or with a usual slip."""
    chunks = pre_split(text) if split else [text]
    ranked = list(enumerate(merges))
    if order == "reversed":
        ranked.reverse()
    ids: list[int] = []
    for chunk in chunks:
        chunk_ids = list(chunk.encode("utf-8")) if utf8 else [ord(char) for char in chunk]
        for rank, pair in ranked if order != "leftmost" else ():
            if order == "first only" and rank > 0:
                break
            chunk_ids = reference.merge(chunk_ids, pair, first_id + rank)
        rank_of = {pair: rank for rank, pair in ranked}
        while order == "leftmost":  # the leftmost learned pair, whatever its rank
            pair = next((p for p in itertools.pairwise(chunk_ids) if p in rank_of), None)
            if pair is None:
                break
            chunk_ids = reference.merge(chunk_ids, pair, first_id + rank_of[pair])
        ids += chunk_ids
    return ids


ENCODE_SLIPS = {
    "you merged across chunk boundaries (a word with the space after it)":
        ({"split": False}, "pre-split the text into chunks first and replay the merges inside each "
                           "chunk on its own, then join the chunks' ids."),
    "you started from the characters' code points, not from the UTF-8 bytes":
        ({"utf8": False}, "encode each chunk as UTF-8 and start from its bytes: a character such "
                          "as ë is two bytes, two ids."),
    "you gave the merges the wrong new ids: the merge of rank r makes the new id 256 + r":
        ({"first_id": 255}, "ids 0 to 255 are the bytes, so the first merge makes 256, the next 257, "
                            "and so on."),
    "you gave the merges the wrong new ids (counted from 0): the merge of rank r makes 256 + r":
        ({"first_id": 0}, "ids 0 to 255 are the bytes, so the first merge makes 256, the next 257, "
                          "and so on."),
    "you merged the leftmost learned pair of the chunk first, not the earliest learned":
        ({"order": "leftmost"}, "at each step merge the chunk's pair whose merge was learned first "
                                "(the lowest rank), wherever it sits: a pair further left may have "
                                "been learned later."),
    "you applied the merges latest first, not in the order they were learned":
        ({"order": "reversed"}, "replay the merges from the first learned to the last, as training "
                                "made them: a merge can only apply after the merges that made its "
                                "parts."),
    "you applied only the first merge, not every merge":
        ({"order": "first only"}, "keep merging until no pair of the chunk was ever learned; every "
                                  "merge whose parts are there applies."),
}


@exercise(hint="Cut the text into chunks as training did and spell each chunk in bytes; inside a "
               "chunk, keep merging its pair that was learned earliest until none of its pairs was "
               "learned; join the chunks' ids in order.",
          task="Write encode_text(text, merges) returning the ids of the text after the learned "
               "merges (merge i makes id 256 + i). The check tries five texts, the empty one and "
               "one with a two-byte letter included, against the course's BPETokenizer.",
          points=3)
def encode_text(student: Callable[[str, list[tuple[int, int]]], Any]) -> str:
    tokenizer = reference.BPETokenizer(ENCODE_MERGES)
    texts = ENCODE_CASES
    if hidden_round():  # words of the merges drawn from the hidden seed, and one byte alone
        words = ["soup", "so", "sou", "Zoë", "e", "ate", "soup!", "\n", "ou", "  "]
        picks = torch.randint(0, len(words), (12,), generator=seeded(71)).tolist()
        texts = [" ".join(words[i] for i in picks), "o"] + ENCODE_CASES
    for text in texts:
        got = student(text, list(ENCODE_MERGES))
        expected = tokenizer.encode(text)
        if isinstance(got, tuple):
            got = list(got)
        if not isinstance(got, list) or not all(map(_is_int, got)):
            raise ExerciseFailed(f"encode_text({text!r}, merges) returned {got!r}, expected a list of "
                                 "int ids.",
                                 fix="collect the ids of every chunk, in order, in one list of ints "
                                     "and return it.")
        if got == expected:
            continue
        every_text = [student(other, list(ENCODE_MERGES)) for other in ENCODE_CASES]
        slips = sorted(ENCODE_SLIPS.items(), key=lambda slip: every_text != [  # a slip that fits every text first
            encode_variant(other, ENCODE_MERGES, **slip[1][0]) for other in ENCODE_CASES])
        for slip, (knobs, fix) in slips:
            if got == encode_variant(text, ENCODE_MERGES, **knobs):
                raise ExerciseFailed(f"on {text!r} {slip}: you returned {got}, expected {expected}.",
                                     fix=fix)
        raise ExerciseFailed(f"encode_text({text!r}, merges) returned {got}, expected {expected} (the "
                             f"chunks are {pre_split(text)}).",
                             fix="for each chunk: its UTF-8 bytes, then, as long as one of its "
                                 "pairs was learned, merge the earliest-learned one into 256 + its "
                                 "rank; join the chunks' ids.")
    return "Encoding replays training: the same chunks, the same merges, in the same order."


DECODE_VOCAB = {0: b"I ", 1: b"like ", 2: "caf\u00e9".encode()[:4], 3: "\u00e9".encode()[1:],
                4: "\u2615".encode(), 5: b"!"}
DECODE_CASES = [[0, 1, 4], [2, 3, 5], [0, 2, 3], [2], []]
JOIN_FIRST = ("join the bytes of all the tokens first, then turn them into text once, replacing "
              "bytes that do not form a whole character by the mark '�'.")


@exercise(hint="Tokens hold bytes, and a character may begin in one token and end in the next: "
               "put all the bytes together first, then read them as UTF-8 once, replacing what "
               "is not a whole character.",
          task="Write decode_ids(token_ids, token_bytes) returning the text of the ids, token_bytes "
               "mapping id -> bytes. The check includes a character whose bytes are split across "
               "two tokens.")
def decode_ids(student: Callable[[list[int], dict[int, bytes]], Any]) -> str:
    cases = DECODE_CASES
    if hidden_round():  # ids drawn from the hidden seed: characters cut anywhere, unfinished ones too
        cases = [torch.randint(0, len(DECODE_VOCAB), (9,), generator=seeded(72)).tolist(), [3]] + DECODE_CASES
    for ids in cases:
        try:
            got = student(list(ids), dict(DECODE_VOCAB))
        except UnicodeDecodeError:
            raise ExerciseFailed(f"for ids={ids} decoding failed with UnicodeDecodeError: you decoded "
                                 "strictly (without errors='replace'), and a character cut between "
                                 "tokens, or left unfinished, is not valid UTF-8 on its own.",
                                 fix="after joining all the bytes, decode them asking Python to "
                                     "replace whatever is not a whole character by the mark '�'.") from None
        expected = b"".join(DECODE_VOCAB[i] for i in ids).decode("utf-8", errors="replace")
        split = "".join(DECODE_VOCAB[i].decode("utf-8", errors="replace") for i in ids)
        if got == split and split != expected:
            raise ExerciseFailed(f"for ids={ids} you decoded token by token and got {got!r}: the "
                                 "bytes of one character are split across two tokens.", fix=JOIN_FIRST)
        if got != expected:
            pieces = [DECODE_VOCAB[i] for i in ids]
            raise ExerciseFailed(f"for ids={ids} (tokens {pieces}) you returned {got!r}, "
                                 f"expected {expected!r}.", fix=JOIN_FIRST)
    return "Bytes first, text last: that is why byte-level BPE can encode any text."


# --- a core exercise: the BPE training loop ------------------------------------------------------

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


TIE_FIX = ("keep beside the merges what every id spells in bytes (the 256 single bytes, then each "
           "merge's two parts joined) and hand it to most_frequent_pair, which breaks a tie by "
           "those byte strings.")
SLIPS = {
    "merges across chunk boundaries":
        ({"split": False}, "pre-split the text with pre_split first and count pairs inside each "
                           "chunk only."),
    "merges the wrong pair on a tie (you took the first pair counted)": ({"tie": "first"}, TIE_FIX),
    "merges the wrong pair on a tie (you compared the ids)": ({"tie": "ids"}, TIE_FIX),
    "counts the pairs only once, before the first merge":
        ({"recount": False}, "count again at every step, on the chunks as the last merge left them: "
                             "a merge removes pairs and makes new ones."),
}
TRAIN_CASES = [("low lower lowest newer wider new", 10), (TOY_SOUP, 12), ("aaab ab", 10), ("soup", 0)]


@exercise(hint="Each step: count the pairs of every chunk, pick the most frequent (ties by the "
               "bytes they spell), replace it everywhere by the next new id; stop early when no "
               "chunk has a pair left.",
          task="Write train_textbook(text, n_merges) returning the list of merged pairs in order. "
               "The check trains on four texts (one runs out of pairs, one asks for 0 merges) and "
               "compares every merge with the course's trainer.",
          points=3)
def train_bpe(student: Callable[[str, int], Any]) -> str:
    cases = TRAIN_CASES
    if hidden_round():  # a text of words drawn from the hidden seed, and a text of one letter
        words = ["low", "lower", "newest", "soup", "so", "aaab", "Zoë", "wide", "ab"]
        picks = torch.randint(0, len(words), (10,), generator=seeded(73)).tolist()
        cases = [(" ".join(words[i] for i in picks), 8), ("a", 3)] + TRAIN_CASES
    for text, n_merges in cases:
        got = student(text, n_merges)
        if not isinstance(got, list):
            raise ExerciseFailed(f"train_textbook({text!r}, {n_merges}) returned a {type(got).__name__}, "
                                 "expected a list of (left, right) pairs.",
                                 fix="append each merged pair to a list as you learn it and return "
                                     "that list.")
        got = [tuple(pair) if isinstance(pair, list | tuple) else pair for pair in got]
        expected = [m.pair for m in reference.textbook_merges(text, n_merges)]
        if got == expected:
            continue
        for slip, (knobs, fix) in SLIPS.items():
            if got == _variant(text, n_merges, **knobs):
                raise ExerciseFailed(f"on {text!r} your loop {slip}.", fix=fix)
        if got == expected[:len(got)] and len(got) < len(expected):
            raise ExerciseFailed(f"on {text!r} you returned {len(got)} merges, expected {len(expected)}: "
                                 f"the first {len(got)} are right.",
                                 fix="keep going until n_merges merges are learned; stop early only "
                                     "when no chunk has a pair left.")
        first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None)
        where = f"merge {first} is {got[first]}, expected {expected[first]}" if first is not None else \
            f"you returned {len(got)} merges, expected {len(expected)}"
        raise ExerciseFailed(f"train_textbook({text!r}, {n_merges}): {where}.")
    return "That is the textbook BPE loop; the rest of the notebook trains with it."
