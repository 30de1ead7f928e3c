"""Notebook 1's checkers (helpers/lab/exercises/tokenization.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest

from helpers.text.bpe import count_pairs, merge, most_frequent_pair, textbook_merges
from helpers.text.chars import pre_split

from .judging import (
    assert_cases_cover,
    assert_not_attempted_says_the_task,
    case_ids,
    exercise_names,
    judge,
    named,
    verdict,
)


def pairs_counter(ids):
    return dict(Counter(itertools.pairwise(ids)))


def pairs_missing_last(ids):
    return dict(Counter(zip(ids[:-2], ids[1:-1], strict=True)))


def pairs_float(ids):
    return {pair: float(count) for pair, count in Counter(itertools.pairwise(ids)).items()}


def pairs_no_overlap(ids):
    counts, i = {}, 0
    while i < len(ids) - 1:
        pair = (ids[i], ids[i + 1])
        counts[pair] = counts.get(pair, 0) + 1
        i += 2 if i + 2 < len(ids) and (ids[i + 1], ids[i + 2]) == pair else 1
    return counts


def _merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _chunks(text):
    from helpers.text.chars import pre_split
    return pre_split(text)


def encode_lowest_rank_first(text, merges):
    """tiktoken's way: in each chunk, repeatedly merge the present pair of lowest rank."""
    ranks, out = {pair: r for r, pair in enumerate(merges)}, []
    for chunk in _chunks(text):
        ids = list(chunk.encode("utf-8"))
        while len(ids) > 1:
            pair = min(itertools.pairwise(ids), key=lambda p: ranks.get(p, math.inf))
            if pair not in ranks:
                break
            ids = _merge(ids, pair, 256 + ranks[pair])
        out += ids
    return out


def _replay(text, merges, first_id=256, split=True, rank_order=None):
    out = []
    for chunk in (_chunks(text) if split else [text]):
        ids = list(chunk.encode("utf-8"))
        for rank in (rank_order or range)(len(merges)):
            ids = _merge(ids, merges[rank], first_id + rank)
        out.extend(ids)
    return out


def encode_whole_text(text, merges):
    return _replay(text, merges, split=False)


def encode_wrong_ids(text, merges):
    return _replay(text, merges, first_id=255)


def encode_latest_first(text, merges):
    return _replay(text, merges, rank_order=lambda n: reversed(range(n)))


def encode_code_points(text, merges):
    out = []
    for chunk in _chunks(text):
        ids = [ord(char) for char in chunk]
        for rank, pair in enumerate(merges):
            ids = _merge(ids, pair, 256 + rank)
        out += ids
    return out


def decode_bytearray(ids, vocab):
    buffer = bytearray()
    for i in ids:
        buffer += vocab[i]
    return buffer.decode("utf-8", "replace")


def decode_per_token(ids, vocab):
    return "".join(vocab[i].decode("utf-8", errors="replace") for i in ids)


def decode_strict(ids, vocab):
    return b"".join(vocab[i] for i in ids).decode("utf-8")


def bpe_loop(split: bool = True, tie: str = "bytes", recount: bool = True, as_lists: bool = False):
    """A student's training loop; `tie` and `recount` choose its slips (`as_lists`: each pair a list)."""
    def train_textbook(text: str, n_merges: int) -> list[tuple[int, int]]:
        chunks = [list(c.encode("utf-8")) for c in (pre_split(text) if split else [text])]
        vocab = [bytes([b]) for b in range(256)]
        merges = []
        counts = Counter()
        for ids in chunks:
            counts.update(count_pairs(ids))
        while len(merges) < n_merges:
            if recount:
                counts = Counter()
                for ids in chunks:
                    counts.update(count_pairs(ids))
            counts = +counts  # drop zero and negative counts
            if not counts:
                break
            if tie == "bytes":
                pair = most_frequent_pair(counts, vocab)
            elif tie == "first":
                pair = max(counts, key=counts.get)  # the first of the tied pairs counted
            else:
                pair = max(counts, key=lambda p: (counts[p], p))
            merges.append(pair)
            vocab.append(vocab[pair[0]] + vocab[pair[1]])
            chunks = [merge(ids, pair, 256 + len(merges) - 1) for ids in chunks]
            counts[pair] = 0
        return [list(pair) for pair in merges] if as_lists else merges
    return train_textbook


BPE_CASES = [
    (bpe_loop(), None),
    (bpe_loop(as_lists=True), None),  # lists for pairs are fine
    # the course's own loop is the exercise itself: refused by name (issue 50)
    (lambda text, n: [m.pair for m in textbook_merges(text, n)], "helpers.text.bpe.textbook_merges"),
    (bpe_loop(split=False), "merges across chunk boundaries"),
    (bpe_loop(tie="first"), "wrong pair on a tie (you took the first pair counted)"),
    (bpe_loop(tie="ids"), "wrong pair on a tie (you compared the ids)"),
    (bpe_loop(recount=False), "counts the pairs only once"),
    (lambda text, n: bpe_loop()(text, n)[:-1] if n else [], "keep going until n_merges"),
    (lambda text, n: tuple(bpe_loop()(text, n)), "expected a list"),
]


def test_bpe_loop_that_never_stops_early_is_refused_with_where_it_broke():
    def no_break(text, n_merges):
        chunks, merges = [list(c.encode()) for c in pre_split(text)], []
        for step in range(n_merges):
            counts = Counter()
            for ids in chunks:
                counts.update(count_pairs(ids))
            pair = most_frequent_pair(counts)  # raises once no pair is left
            merges.append(pair)
            chunks = [merge(ids, pair, 256 + step) for ids in chunks]
        return merges
    passed, said = verdict("tokenization.train_bpe", no_break)
    assert not passed and "raised" in said


def encode_leftmost_first(text, merges):
    """Merges, in each chunk, the leftmost pair that was ever learned, not the earliest learned."""
    from helpers.text.chars import pre_split

    rank_of = {pair: rank for rank, pair in enumerate(merges)}
    ids = []
    for chunk in pre_split(text):
        tokens = list(chunk.encode("utf-8"))
        while (pair := next((p for p in itertools.pairwise(tokens) if p in rank_of), None)) is not None:
            merged, i = [], 0
            while i < len(tokens):
                if tuple(tokens[i:i + 2]) == pair:
                    merged.append(256 + rank_of[pair])
                    i += 2
                else:
                    merged.append(tokens[i])
                    i += 1
            tokens = merged
        ids += tokens
    return ids


def test_encoding_the_leftmost_learned_pair_is_not_called_latest_first():
    message = named("tokenization.encode_text", encode_leftmost_first, "leftmost learned pair")
    assert "latest first" not in message


CASES = [
    ("tokenization.count_pairs", pairs_counter, None),
    ("tokenization.count_pairs", pairs_missing_last, "the last pair"),
    ("tokenization.count_pairs", pairs_float, "should be an int"),
    ("tokenization.count_pairs", pairs_no_overlap, "overlapping pairs both count"),
    ("tokenization.encode_text", encode_lowest_rank_first, None),
    ("tokenization.encode_text", encode_whole_text, "merged across chunk boundaries"),
    ("tokenization.encode_text", encode_wrong_ids, "256 + r"),
    ("tokenization.encode_text", encode_latest_first, "latest first"),
    ("tokenization.encode_text", encode_code_points, "code points"),
    ("tokenization.decode_ids", decode_bytearray, None),
    ("tokenization.decode_ids", decode_per_token, "decoded token by token"),
    ("tokenization.decode_ids", decode_strict, "errors='replace'"),
]
CASES += [("tokenization.train_bpe", answer, message) for answer, message in BPE_CASES]


@pytest.mark.parametrize("name, answer, message", CASES, ids=case_ids(CASES))
def test_checker_judges(name, answer, message):
    judge(name, answer, message)


def test_every_checker_has_a_right_and_two_wrong_cases():
    assert_cases_cover("tokenization", CASES)


@pytest.mark.parametrize("name", exercise_names("tokenization"))
def test_not_attempted_says_the_task_not_the_recipe(name):
    assert_not_attempted_says_the_task(name)
