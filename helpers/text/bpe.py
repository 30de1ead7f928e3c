"""Byte-level byte-pair encoding (BPE), from the textbook loop to the tokenizer GPT-2 uses.

Derived in notebook 1 ("Tokenization"): section 4 writes the steps by hand (`count_pairs`,
`merge`, `most_frequent_pair`) and the textbook loop (`textbook_merges`: count every pair,
merge the most frequent, repeat), section 5 trains on the whole corpus (`learn_merges`,
`BPETokenizer.train`), section 6 encodes and decodes (`BPETokenizer`, which starts from the 256
byte values, so it can encode any text at all). Like minbpe, the ladder keeps its slow rung: the
tests prove that `learn_merges` learns the merges of `textbook_merges`, with three changes:

1. Count each chunk once. Merges never cross a chunk boundary (`helpers.text.chars.pre_split`),
   so a chunk that occurs 5,000 times is stored once with the weight 5,000.
2. Update the pair counts instead of recounting them: a merge only changes the chunks that
   contain the merged pair, and only the pairs next to each occurrence.
3. Keep the counts in a heap, so that finding the most frequent pair does not scan them all.
Ties go to the pair whose byte strings are greatest (`most_frequent_pair`), whatever the ids.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

from helpers import checks
from helpers.text.chars import (
    GPT2_SPLIT_PATTERN,
    KNOWN_PATTERNS,
    compile_pattern,
    read_saved,
    readable,
    split_chunks,
    split_special,
    stream_blocks,
)

Pair = tuple[int, int]

BYTE_VOCAB_SIZE = 256  # ids 0..255 are the raw bytes; merged tokens are numbered from 256
_CACHE_LIMIT = 100_000  # chunks remembered by BPETokenizer.encode before the cache is emptied
_HEAP_MERGE_LENGTH = 64  # chunks longer than this are merged with a heap (see apply_merges)
_STREAMABLE_PATTERNS = frozenset({GPT2_SPLIT_PATTERN})  # where `stream_blocks` cuts, these always cut


# --- the steps of BPE, each on one list of ids ------------------------------------------------


def count_pairs(ids: Sequence[int]) -> Counter[Pair]:
    """How often each adjacent pair occurs in `ids`: count_pairs([1, 2, 1, 2]) -> {(1, 2): 2, (2, 1): 1}."""
    return Counter(pairwise(ids))


def merge(ids: Sequence[int], pair: Pair, new_id: int) -> list[int]:
    """`ids` with every occurrence of `pair`, read left to right, replaced by `new_id`.

    Occurrences do not overlap: merge([7, 7, 7], (7, 7), 300) -> [300, 7].
    """
    merged: list[int] = []
    position = 0
    while position < len(ids):
        if position + 1 < len(ids) and (ids[position], ids[position + 1]) == pair:
            merged.append(new_id)
            position += 2
        else:
            merged.append(ids[position])
            position += 1
    return merged


def most_frequent_pair(pair_counts: Mapping[Pair, int], vocab: Mapping[int, bytes] | Sequence[bytes] | None = None) -> Pair:
    """The pair with the highest count. A tie goes to the pair whose byte strings are greatest,
    compared as (vocab[left], vocab[right]) in lexicographic order: b"e", b" " beats b"d", b" ".
    That is the rule of Stanford's CS336 reference; it depends on what the tokens spell, not on
    the order their ids were handed out (two pairs that spell the same bytes, rare, go by the
    smaller ids). vocab: id -> bytes; leave it out when all ids are bytes."""
    if not pair_counts:
        raise ValueError("pair_counts is empty, expected at least one pair to choose from")
    highest = max(pair_counts.values())
    tied = [pair for pair, count in pair_counts.items() if count == highest]
    if vocab is None:
        vocab = [bytes([byte]) for byte in range(BYTE_VOCAB_SIZE)]
        if any(not 0 <= i < BYTE_VOCAB_SIZE for pair in tied for i in pair):
            raise ValueError(f"pair_counts holds ids such as {max(tied)} beyond the bytes, expected "
                             "vocab (id -> bytes) to tell how they are spelled")
    return max(tied, key=lambda pair: (vocab[pair[0]], vocab[pair[1]], -pair[0], -pair[1]))


# --- training: the textbook loop, then the same merges fast -------------------------------------


class Merge(NamedTuple):
    """One training step: `pair` became the new token `new_id`; it occurred `count` times then."""

    pair: Pair
    new_id: int
    count: int


def _training_chunks(text: str, pattern: str, special_tokens: Iterable[str]) -> list[str]:
    """The chunks BPE trains on: `text` pre-split, special tokens left out (the text on either side
    of one is split on its own, so no chunk joins the end of one document to the next)."""
    text, splitter = checks.text("text", text), compile_pattern(pattern)
    chunks = [chunk for piece, special in split_special(text, checks.special_tokens("special_tokens", special_tokens))
              if not special for chunk in split_chunks(splitter, piece)]
    if not chunks:
        raise ValueError("text is empty (or only special tokens), expected some training text to learn merges from")
    return chunks


def textbook_merges(text: str, n_merges: int, pattern: str = GPT2_SPLIT_PATTERN,
                    special_tokens: Iterable[str] = ()) -> list[Merge]:
    """The first `n_merges` merges of byte-level BPE, learned the slow, plain way: count every pair
    in every chunk, merge the most frequent, repeat. Merge i creates token 256 + i. The reference
    that `learn_merges` must equal, merge for merge; it takes seconds on 100 kB of text."""
    n_merges = checks.size_at_least("n_merges", n_merges, 0)
    chunks = [list(chunk.encode("utf-8")) for chunk in _training_chunks(text, pattern, special_tokens)]
    vocab = [bytes([byte]) for byte in range(BYTE_VOCAB_SIZE)]  # id -> the bytes it spells, for ties
    merges: list[Merge] = []
    while len(merges) < n_merges:
        counts: Counter[Pair] = Counter()
        for ids in chunks:
            counts.update(count_pairs(ids))
        if not counts:
            break  # every chunk is a single token
        pair = most_frequent_pair(counts, vocab)
        new_id = BYTE_VOCAB_SIZE + len(merges)
        merges.append(Merge(pair, new_id, counts[pair]))
        vocab.append(vocab[pair[0]] + vocab[pair[1]])
        chunks = [merge(ids, pair, new_id) for ids in chunks]
    return merges


class _PairTable:
    """The distinct chunks as lists of ids, weighted by how often each occurs; their pair counts; the
    chunks that hold each pair (a merge visits only those); a heap to find the most frequent pair."""

    def __init__(self, chunks: list[list[int]], weights: Sequence[int]) -> None:
        self.chunks, self.weights = chunks, weights
        self.counts: Counter[Pair] = Counter()
        self.holders: defaultdict[Pair, set[int]] = defaultdict(set)
        for index, ids in enumerate(chunks):
            for pair in pairwise(ids):
                self.counts[pair] += weights[index]
                self.holders[pair].add(index)
        self.heap: list[tuple[int, tuple[int, ...], Pair]] = []  # see `most_frequent`
        # A key per token that sorts the greatest bytes first: -b for each byte b, then 1 (so a
        # byte string sorts after every longer string it starts); a pair's key is its two joined.
        self.keys = [(-byte, 1) for byte in range(BYTE_VOCAB_SIZE)]
        self.rose = set(self.counts)  # pairs whose count rose since the last `most_frequent`

    def merge(self, pair: Pair, new_id: int) -> None:
        """`merge` on every chunk that holds `pair`; counts change only next to each occurrence:
        x L R y becomes x new y, so (x, L), (L, R), (R, y) lose the chunk's weight, (x, new), (new, y)
        gain it (L R L R loses (R, L) once). Chunks stay listed under lost pairs: cheaper than exact."""
        (left, right), counts, rose, holders = pair, self.counts, self.rose, self.holders
        self.keys.append(self.keys[left][:-1] + self.keys[right])  # the key of new_id's bytes
        for index in holders.pop(pair):
            ids, weight = self.chunks[index], self.weights[index]
            if left not in ids or right not in ids:  # (quick, in C) a chunk listed under a pair it lost
                continue
            n, merged, position = len(ids), [], 0
            while position < n:
                if ids[position] != left or position + 1 == n or ids[position + 1] != right:
                    merged.append(ids[position])
                    position += 1
                    continue
                counts[pair] -= weight
                if merged:  # the token before
                    before = merged[-1]
                    if before != new_id:  # else the previous occurrence already took (R, L) away
                        counts[before, left] -= weight
                    counts[before, new_id] += weight
                    rose.add((before, new_id))
                    holders[before, new_id].add(index)
                if position + 2 < n:  # the token after
                    after = ids[position + 2]
                    counts[right, after] -= weight
                    if not (after == left and position + 3 < n and ids[position + 3] == right):
                        counts[new_id, after] += weight  # (else the next occurrence adds (new, new))
                        rose.add((new_id, after))
                        holders[new_id, after].add(index)
                merged.append(new_id)
                position += 2
            self.chunks[index] = merged

    def most_frequent(self) -> Pair | None:
        """The pair `most_frequent_pair` would choose (None when no pair is left). The heap holds
        (-count, tie-break key, pair), so its first entry is that pair if its count is still true;
        every pair has an entry at least as high as its count, and a too-high one is put back."""
        heap, counts, keys = self.heap, self.counts, self.keys
        for pair in self.rose:
            if counts[pair] > 0:  # (it may have fallen back to 0 since)
                heapq.heappush(heap, (-counts[pair], keys[pair[0]] + keys[pair[1]], pair))
        self.rose.clear()
        while heap:
            count, key, pair = heapq.heappop(heap)
            if counts[pair] == -count:
                return pair
            if counts[pair] > 0:  # it fell since this entry was pushed
                heapq.heappush(heap, (-counts[pair], key, pair))
        return None


def learn_merges(text: str, n_merges: int, pattern: str = GPT2_SPLIT_PATTERN,
                 special_tokens: Iterable[str] = ()) -> list[Merge]:
    """The first `n_merges` merges byte-level BPE learns from `text` (fewer if it runs out of pairs):
    exactly `textbook_merges(text, n_merges, pattern, special_tokens)`, far faster (module docstring)."""
    n_merges = checks.size_at_least("n_merges", n_merges, 0)
    chunk_counts = Counter(_training_chunks(text, pattern, special_tokens))
    table = _PairTable([list(chunk.encode("utf-8")) for chunk in chunk_counts], list(chunk_counts.values()))

    merges: list[Merge] = []
    while len(merges) < n_merges and (pair := table.most_frequent()) is not None:
        new_id = BYTE_VOCAB_SIZE + len(merges)
        merges.append(Merge(pair, new_id, table.counts[pair]))
        table.merge(pair, new_id)
    return merges


# --- the tokenizer ---------------------------------------------------------------------------------


class BPETokenizer:
    """Byte-level BPE: ids 0..255 are bytes, 256.. are the merges in the order they were learned,
    then one id per special token.

    merges: the learned pairs, merge i creating id 256 + i from two ids that already exist.
    pattern: the pre-tokenizer's regular expression; text it does not match becomes chunks of
        its own, so every pattern round-trips every text.
    """

    def __init__(self, merges: Sequence[Pair], special_tokens: Iterable[str] = (),
                 pattern: str = GPT2_SPLIT_PATTERN) -> None:
        if not isinstance(merges, Sequence) or isinstance(merges, str):
            raise TypeError(f"merges is {merges!r:.60} of type {type(merges).__name__}, expected a list of pairs")
        self.merges = [self._checked_pair(pair, index) for index, pair in enumerate(merges)]
        self._splitter = compile_pattern(pattern)
        self.pattern = pattern
        first_special = BYTE_VOCAB_SIZE + len(self.merges)
        self.special_tokens = {token: first_special + index
                               for index, token in enumerate(checks.special_tokens("special_tokens", special_tokens))}
        # The id a pair merges into; ids grow with the merge's rank, so it doubles as the rank.
        self._merged_id = {pair: BYTE_VOCAB_SIZE + index for index, pair in enumerate(self.merges)}
        self.vocab = self._build_vocab()
        self._cache: dict[str, list[int]] = {}

    @staticmethod
    def _checked_pair(pair: Sequence[int], index: int) -> Pair:
        known = BYTE_VOCAB_SIZE + index
        if (not isinstance(pair, tuple | list) or len(pair) != 2
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < known for i in pair)):
            raise ValueError(f"merges[{index}] is {pair!r}, expected a pair of ids below {known} "
                             "(bytes and earlier merges)")
        return (pair[0], pair[1])

    def _build_vocab(self) -> dict[int, bytes]:
        vocab = {byte: bytes([byte]) for byte in range(BYTE_VOCAB_SIZE)}
        for (left, right), new_id in self._merged_id.items():
            vocab[new_id] = vocab[left] + vocab[right]
        for token, token_id in self.special_tokens.items():
            vocab[token_id] = token.encode("utf-8")
        return vocab

    @classmethod
    def train(cls, text: str, vocab_size: int, special_tokens: Iterable[str] = (),
              pattern: str = GPT2_SPLIT_PATTERN) -> BPETokenizer:
        """Learn merges from `text` until the vocabulary (256 bytes + merges + special tokens)
        has `vocab_size` entries, or until no pair is left to merge. Merges never cross a
        special token: the text between two of them is split and counted on its own."""
        specials = checks.special_tokens("special_tokens", special_tokens)
        smallest = BYTE_VOCAB_SIZE + len(specials)
        vocab_size = checks.size_at_least("vocab_size", vocab_size, smallest, ": one id for each of the 256 "
                                    f"bytes plus {len(specials)} special token(s)")
        merges = learn_merges(text, vocab_size - smallest, pattern, specials)
        return cls([m.pair for m in merges], specials, pattern)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """The ids of `text`: special tokens one id each, the rest pre-split and merged chunk by chunk."""
        ids: list[int] = []
        for piece, special in split_special(checks.text("text", text), self.special_tokens):
            if special:
                ids.append(self.special_tokens[piece])
                continue
            for chunk in split_chunks(self._splitter, piece):
                ids.extend(self._encode_chunk(chunk))
        return ids

    def encode_iterable(self, texts: Iterable[str]) -> Iterator[int]:
        """Exactly `encode("".join(texts))`, yielded as `texts` is read, in bounded memory. `texts`: the
        lines of a file or chunks cut anywhere, even inside a word or a special token; `stream_blocks`
        joins them and cuts again only where GPT-2's pre-tokenizer always cuts (with another pattern
        no such place is known: the whole text is read first). A bad piece is reported when reached."""
        if self.pattern in _STREAMABLE_PATTERNS:
            blocks = stream_blocks(texts, self.special_tokens)
        else:  # one block, never cut (stream_blocks still checks every piece)
            blocks = ["".join(stream_blocks(texts, block_chars=1 << 62))]
        for block in blocks:
            yield from self.encode(block)

    def _encode_chunk(self, chunk: str) -> list[int]:
        # Text repeats its words, so each distinct chunk is merged once and then looked up.
        ids = self._cache.get(chunk)
        if ids is None:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            ids = self._cache[chunk] = self.apply_merges(list(chunk.encode("utf-8")))
        return ids

    def apply_merges(self, ids: list[int]) -> list[int]:
        """Merge `ids` (the bytes of one chunk) as training did: always the earliest-learned pair first.

        Each step scans every pair, so a chunk of n bytes costs up to n * n steps; a long chunk
        (a line of text with no spaces) goes to `_apply_merges_heap`, which gives the same ids.
        """
        if len(ids) > _HEAP_MERGE_LENGTH:
            return self._apply_merges_heap(ids)
        not_a_merge = len(self._merged_id) + BYTE_VOCAB_SIZE
        while len(ids) > 1:
            pair = min(pairwise(ids), key=lambda p: self._merged_id.get(p, not_a_merge))
            if pair not in self._merged_id:
                break
            ids = merge(ids, pair, self._merged_id[pair])
        return ids

    def _apply_merges_heap(self, ids: list[int]) -> list[int]:
        # A heap of (merged id, position) for every mergeable neighbour pair pops the earliest-learned
        # pair, leftmost first, as the loop above merges it. Positions form a linked list (`after`,
        # `before`): a merge touches only its neighbours, whose new pairs never jump the queue.
        tokens: list[int | None] = list(ids)
        end = len(tokens)
        after, before = list(range(1, end + 1)), list(range(-1, end - 1))
        heap = [(self._merged_id[pair], i) for i, pair in enumerate(pairwise(ids)) if pair in self._merged_id]
        heapq.heapify(heap)
        while heap:
            new_id, left = heapq.heappop(heap)
            right = after[left]
            if tokens[left] is None or right == end or self._merged_id.get((tokens[left], tokens[right])) != new_id:
                continue  # an earlier merge changed this pair
            tokens[left], tokens[right] = new_id, None
            after[left] = after[right]
            if after[left] < end:
                before[after[left]] = left
            for start in (before[left], left):
                if start >= 0 and after[start] < end:
                    merged = self._merged_id.get((tokens[start], tokens[after[start]]))
                    if merged is not None:
                        heapq.heappush(heap, (merged, start))
        return [token for token in tokens if token is not None]

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes that `ids` stand for, joined."""
        return b"".join(self.vocab[token_id] for token_id in checks.token_ids("ids", ids, self.vocab_size))

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`. Bytes that do not form whole UTF-8 characters (half an emoji) become '�'."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def labels(self, ids: Iterable[int]) -> list[str]:
        """Each token of `ids` as it looks on screen (see `readable`)."""
        return [readable(self.vocab[token_id]) for token_id in checks.token_ids("ids", ids, self.vocab_size)]

    def save(self, path: str | Path) -> Path:
        """Write the tokenizer as JSON to `path`; `BPETokenizer.load(path)` reads it back."""
        state = {"type": "BPETokenizer", "pattern": self.pattern,
                 "special_tokens": list(self.special_tokens), "merges": self.merges}
        Path(path).write_text(json.dumps(state, ensure_ascii=False), encoding="utf-8")
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        """The tokenizer `save` wrote to `path`. Its pattern must be one of KNOWN_PATTERNS: a
        file may not make `encode` run an arbitrary regular expression."""
        saved = read_saved(path, "BPETokenizer", ("merges", "special_tokens", "pattern"))
        if saved["pattern"] not in KNOWN_PATTERNS.values():
            raise ValueError(f"{path} holds the pattern {saved['pattern']!r:.80}, expected one of the known "
                             f"pre-tokenizer patterns ({', '.join(KNOWN_PATTERNS)}) because a crafted regular expression "
                             "can take exponential time; for your own, build it in code: BPETokenizer(merges, special_tokens, pattern)")
        return cls(saved["merges"], saved["special_tokens"], saved["pattern"])

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, BPETokenizer) and self.merges == other.merges
                and self.special_tokens == other.special_tokens and self.pattern == other.pattern)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={list(self.special_tokens)})")
