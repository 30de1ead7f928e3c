"""Tokenizers written from scratch: one id per character, and byte-level byte-pair encoding.

A tokenizer turns text into a list of integer ids and back again.

    CharTokenizer   one id per character it saw in training; it cannot encode a character it
                    never saw
    BPETokenizer    starts from the 256 possible byte values, so it can encode any text at all,
                    then learns merges: "the pair (t, h) becomes a new token th"

Both keep special tokens (such as "<|endoftext|>"): strings that always get their own id and are
never cut into pieces.

Training BPE is the textbook loop (count every adjacent pair, merge the most frequent one,
repeat) with two changes that make it fast without changing a single merge:

1. Count each chunk once. The text is first cut into word-like chunks (GPT-2's rule, see
   `pre_split`) and merges never cross a chunk boundary, so a chunk that occurs 5,000 times is
   stored once with the weight 5,000. Special tokens are boundaries too: the text on either
   side of one is split on its own.
2. Update the pair counts instead of recounting them. A merge only changes the chunks that
   contain the merged pair, so only their pairs are subtracted and added back.

Ties between equally frequent pairs go to the pair whose byte strings are lexicographically
greatest (see `most_frequent_pair`), so the merges do not depend on how ids are numbered.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
import numbers
import operator
import re
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple

import regex

Pair = tuple[int, int]

BYTE_VOCAB_SIZE = 256  # ids 0..255 are the raw bytes; merged tokens are numbered from 256

# GPT-2's pre-tokenizer rule, character for character as in OpenAI's encoder.py. It needs the
# `regex` package: Python's `re` has no \p{L} (a letter of any script) or \p{N} (a number,
# "²" and "½" included). Every character falls into one of the branches, so the chunks always
# join back into the original text.
GPT2_SPLIT_PATTERN = (
    r"'s|'t|'re|'ve|'m|'ll|'d"  # English contractions
    r"| ?\p{L}+"  # a word, with the space in front of it
    r"| ?\p{N}+"  # a number
    r"| ?[^\s\p{L}\p{N}]+"  # punctuation and symbols
    r"|\s+(?!\S)"  # a run of spaces, leaving the last one to the word that follows
    r"|\s+"
)
# The patterns `BPETokenizer.load` accepts from a file. A crafted regular expression can take
# exponential time on a short text, so a file may only name one of these; a tokenizer with
# another pattern is built in code, `BPETokenizer(merges, special_tokens, pattern)`.
KNOWN_PATTERNS = {"GPT-2": GPT2_SPLIT_PATTERN}

_CACHE_LIMIT = 100_000  # chunks remembered by BPETokenizer.encode before the cache is emptied
_HEAP_MERGE_LENGTH = 64  # chunks longer than this are merged with a heap (see apply_merges)
MAX_SEGMENTATIONS = 100_000  # the most segmentations `segmentations` lists


# --- argument checks, shared by all the tokenizers --------------------------------------------


def _checked_text(text: object, name: str = "text") -> str:
    """`text` itself, after checking that it is a str that UTF-8 can encode."""
    if not isinstance(text, str):
        hint = " (bytes? decode them first: data.decode('utf-8'))" if isinstance(text, bytes | bytearray) else ""
        raise TypeError(f"{name} is {text!r:.60} of type {type(text).__name__}, expected a str{hint}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{name}[{error.start}] is {text[error.start]!r}, a lone surrogate that UTF-8 "
                         "cannot encode; expected valid Unicode text") from None
    return text


def _checked_size(value: object, name: str, smallest: int, why: str = "") -> int:
    """`value` as an int, after checking that it is an integer (not a bool) of at least `smallest`."""
    try:
        if isinstance(value, bool):
            raise TypeError
        size = operator.index(value)  # int, or a NumPy integer
    except TypeError:
        raise TypeError(f"{name} is {value!r} of type {type(value).__name__}, expected an integer") from None
    if size < smallest:
        raise ValueError(f"{name} is {size}, expected at least {smallest}{why}")
    return size


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> regex.Pattern:
    return regex.compile(pattern)


def _checked_pattern(pattern: object) -> regex.Pattern:
    if not isinstance(pattern, str):
        raise TypeError(f"pattern is {pattern!r:.60} of type {type(pattern).__name__}, expected a str "
                        "holding a regular expression")
    try:
        return _compiled(pattern)
    except regex.error as error:
        raise ValueError(f"pattern is {pattern!r}, which is not a valid regular expression ({error})") from None


def _split(splitter: regex.Pattern, text: str) -> list[str]:
    """The chunks of `text`: each match of `splitter`, and each stretch of text between matches
    as a chunk of its own, so that no character is lost whatever the pattern (capturing groups
    and empty matches included)."""
    if splitter.pattern in _COVERING_PATTERNS:  # matches every character: nothing falls between
        return splitter.findall(text)
    chunks: list[str] = []
    done = 0
    for match in splitter.finditer(text):
        if match.start() > done:
            chunks.append(text[done:match.start()])
        if match.end() > match.start():
            chunks.append(match.group())
        done = match.end()
    if done < len(text):
        chunks.append(text[done:])
    return chunks


_COVERING_PATTERNS = frozenset(KNOWN_PATTERNS.values())


# --- the steps of BPE, each on one list of ids ------------------------------------------------


def pre_split(text: str, pattern: str = GPT2_SPLIT_PATTERN) -> list[str]:
    """Cut `text` into the chunks that BPE works inside: merges never cross a chunk boundary.

    pre_split("Tom found a key.") -> ["Tom", " found", " a", " key", "."];
    "".join(pre_split(text, pattern)) == text for every text and every pattern: text that the
    pattern does not match becomes a chunk of its own.
    """
    return _split(_checked_pattern(pattern), _checked_text(text))


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
    the order their ids were handed out. vocab: id -> bytes; leave it out when all ids are bytes."""
    if not pair_counts:
        raise ValueError("pair_counts is empty, expected at least one pair to choose from")
    highest = max(pair_counts.values())
    tied = [pair for pair, count in pair_counts.items() if count == highest]
    if vocab is None:
        vocab = [bytes([byte]) for byte in range(BYTE_VOCAB_SIZE)]
        if any(not 0 <= i < BYTE_VOCAB_SIZE for pair in tied for i in pair):
            raise ValueError(f"pair_counts holds ids such as {max(tied)} beyond the bytes, expected "
                             "vocab (id -> bytes) to tell how they are spelled")
    return max(tied, key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))


# --- training ----------------------------------------------------------------------------------


class Merge(NamedTuple):
    """One training step: `pair` became the new token `new_id`; it occurred `count` times then."""

    pair: Pair
    new_id: int
    count: int


class _PairTable:
    """Pair counts over the distinct chunks, each weighted by how often its chunk occurs, and for
    each pair the chunks that hold it (so a merge visits only those)."""

    def __init__(self) -> None:
        self.counts: Counter[Pair] = Counter()
        self.holders: defaultdict[Pair, set[int]] = defaultdict(set)

    def add(self, chunk: int, ids: Sequence[int], weight: int) -> None:
        for pair in pairwise(ids):
            self.counts[pair] += weight
            self.holders[pair].add(chunk)

    def remove(self, chunk: int, ids: Sequence[int], weight: int) -> None:
        # A chunk stays listed under pairs it no longer holds: merging it there changes nothing,
        # which is cheaper than keeping the lists exact.
        for pair in pairwise(ids):
            self.counts[pair] -= weight
            if self.counts[pair] == 0:
                del self.counts[pair]


def learn_merges(text: str, n_merges: int, pattern: str = GPT2_SPLIT_PATTERN,
                 special_tokens: Iterable[str] = ()) -> list[Merge]:
    """The first `n_merges` merges byte-level BPE learns from `text` (fewer if it runs out of pairs).

    Merge i creates token 256 + i. The result is exactly the textbook loop's (recount all pairs,
    merge the most frequent, ties to the greatest byte strings, repeat) on the pre-split chunks,
    computed far faster. Special tokens are left out, and the text on either side of one is
    split on its own, so no merge joins the end of one document to the start of the next.
    """
    text, n_merges = _checked_text(text), _checked_size(n_merges, "n_merges", 0)
    splitter = _checked_pattern(pattern)
    chunk_counts: Counter[str] = Counter()
    for piece, special in split_special(text, _checked_special_tokens(special_tokens)):
        if not special:
            chunk_counts.update(_split(splitter, piece))
    if not chunk_counts:
        raise ValueError("text is empty (or only special tokens), expected some training text to learn merges from")
    chunks = [list(chunk.encode("utf-8")) for chunk in chunk_counts]
    weights = list(chunk_counts.values())
    table = _PairTable()
    for index, ids in enumerate(chunks):
        table.add(index, ids, weights[index])

    merges: list[Merge] = []
    vocab = [bytes([byte]) for byte in range(BYTE_VOCAB_SIZE)]  # id -> bytes, for the tie-break
    while len(merges) < n_merges and table.counts:
        pair = most_frequent_pair(table.counts, vocab)
        new_id = BYTE_VOCAB_SIZE + len(merges)
        merges.append(Merge(pair, new_id, table.counts[pair]))
        vocab.append(vocab[pair[0]] + vocab[pair[1]])
        for index in table.holders.pop(pair):
            table.remove(index, chunks[index], weights[index])
            chunks[index] = merge(chunks[index], pair, new_id)
            table.add(index, chunks[index], weights[index])
    return merges


# --- special tokens and id checks, shared by both tokenizers ----------------------------------


def _checked_special_tokens(special_tokens: Iterable[str]) -> list[str]:
    if isinstance(special_tokens, str | bytes):
        raise TypeError(f"special_tokens is {special_tokens!r}, a single string; expected a list of "
                        f"strings such as [{special_tokens!r}]")
    if not isinstance(special_tokens, Iterable):
        raise TypeError(f"special_tokens is {special_tokens!r} of type {type(special_tokens).__name__}, "
                        "expected a list of strings")
    tokens = list(special_tokens)
    for token in tokens:
        if not isinstance(token, str):
            raise TypeError(f"special_tokens holds {token!r} of type {type(token).__name__}, expected strings")
        if not token:
            raise ValueError(f"special_tokens holds {token!r}, expected non-empty strings")
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"special_tokens is {tokens}, expected no repeats")
    return tokens


def split_special(text: str, special_tokens: Collection[str]) -> list[tuple[str, bool]]:
    """`text` cut into (piece, is_special) pairs, each special token a piece of its own.

    split_special("a<|end|>b", ["<|end|>"]) -> [("a", False), ("<|end|>", True), ("b", False)]
    """
    if not special_tokens:
        return [(text, False)] if text else []
    longest_first = sorted(special_tokens, key=len, reverse=True)
    splitter = re.compile("(" + "|".join(re.escape(token) for token in longest_first) + ")")
    pieces = splitter.split(text)  # odd positions hold the special tokens
    return [(piece, index % 2 == 1) for index, piece in enumerate(pieces) if piece]


def _checked_ids(ids: Iterable[int], vocab_size: int) -> list[int]:
    """`ids` as plain ints, after checking that each one is an id of a `vocab_size` vocabulary."""
    if isinstance(ids, str | bytes | bytearray) or not isinstance(ids, Iterable):
        raise TypeError(f"ids is {ids!r:.60} of type {type(ids).__name__}, expected a list of integer ids")
    checked = []
    for position, token_id in enumerate(ids):
        value = token_id if type(token_id) is int else _checked_id(token_id, position)
        if not 0 <= value < vocab_size:
            raise ValueError(f"ids[{position}] is {value}, expected an id in range(0, {vocab_size}) "
                             "(the size of this tokenizer's vocabulary)")
        checked.append(value)
    return checked


def _checked_id(token_id: object, position: int) -> int:
    """A NumPy or 0-d torch integer as an int; bools are refused (True is an int to Python)."""
    try:
        if isinstance(token_id, bool) or str(getattr(token_id, "dtype", "")).endswith("bool"):
            raise TypeError
        return operator.index(token_id)
    except TypeError:
        raise TypeError(f"ids[{position}] is {token_id!r} of type {type(token_id).__name__}, "
                        "expected an integer id") from None


def _read_saved(path: str | Path, kind: str, keys: Sequence[str]) -> dict:
    try:
        saved = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a JSON file ({error}), expected what {kind}.save writes") from None
    if not isinstance(saved, dict) or saved.get("type") != kind:
        found = saved.get("type") if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"{path} holds a {found!r}, expected a saved {kind}")
    missing = [key for key in keys if key not in saved]
    if missing:
        raise ValueError(f"{path} has no {', '.join(map(repr, missing))}, expected a complete saved {kind}")
    return saved


def readable(token: bytes) -> str:
    """How a token looks on screen: spaces as '␣', newlines as '↵', tabs as '⇥', and bytes that
    are only part of a UTF-8 character as escapes such as '\\xf0'."""
    text = token.decode("utf-8", errors="backslashreplace")
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")


# --- the tokenizers ----------------------------------------------------------------------------


class CharTokenizer:
    """One id per character: ids 0..len(chars)-1 are `chars`, then one id per special token."""

    def __init__(self, chars: Sequence[str], special_tokens: Iterable[str] = ()) -> None:
        for char in chars:
            if not isinstance(char, str) or len(char) != 1:
                raise ValueError(f"chars holds {char!r}, expected single characters")
        if len(set(chars)) != len(chars):
            raise ValueError("chars holds repeated characters, expected each character once")
        self.chars = list(chars)
        self.special_tokens = {token: len(self.chars) + index
                               for index, token in enumerate(_checked_special_tokens(special_tokens))}
        self._id_of = {char: index for index, char in enumerate(self.chars)}
        self._text_of = self.chars + list(self.special_tokens)

    @classmethod
    def train(cls, text: str, special_tokens: Iterable[str] = ()) -> CharTokenizer:
        """A tokenizer for the characters of `text` (sorted), special tokens left out."""
        specials = _checked_special_tokens(special_tokens)
        plain = "".join(piece for piece, special in split_special(_checked_text(text), specials) if not special)
        if not plain:
            raise ValueError("text is empty, expected some training text to collect characters from")
        return cls(sorted(set(plain)), specials)

    @property
    def vocab_size(self) -> int:
        return len(self._text_of)

    def encode(self, text: str) -> list[int]:
        """The ids of `text`, one per character (special tokens one id each)."""
        ids: list[int] = []
        offset = 0
        for piece, special in split_special(_checked_text(text), self.special_tokens):
            if special:
                ids.append(self.special_tokens[piece])
            else:
                ids.extend(self._char_ids(piece, offset))
            offset += len(piece)
        return ids

    def _char_ids(self, piece: str, offset: int) -> list[int]:
        try:
            return [self._id_of[char] for char in piece]
        except KeyError as missing:
            char = missing.args[0]
            position = offset + piece.index(char)
            raise ValueError(f"text[{position}] is {char!r}, which is not among this tokenizer's "
                             f"{len(self.chars)} characters; train on text that contains it, or "
                             "use BPETokenizer, which can encode any text") from None

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self._text_of[token_id] for token_id in _checked_ids(ids, self.vocab_size))

    def save(self, path: str | Path) -> Path:
        """Write the tokenizer as JSON to `path`; `CharTokenizer.load(path)` reads it back."""
        state = {"type": "CharTokenizer", "chars": self.chars, "special_tokens": list(self.special_tokens)}
        Path(path).write_text(json.dumps(state, ensure_ascii=False, indent=1), encoding="utf-8")
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> CharTokenizer:
        saved = _read_saved(path, "CharTokenizer", ("chars", "special_tokens"))
        return cls(saved["chars"], saved["special_tokens"])

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, CharTokenizer) and self.chars == other.chars
                and self.special_tokens == other.special_tokens)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, special_tokens={list(self.special_tokens)})"


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
        self._splitter = _checked_pattern(pattern)
        self.pattern = pattern
        first_special = BYTE_VOCAB_SIZE + len(self.merges)
        self.special_tokens = {token: first_special + index
                               for index, token in enumerate(_checked_special_tokens(special_tokens))}
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
        specials = _checked_special_tokens(special_tokens)
        smallest = BYTE_VOCAB_SIZE + len(specials)
        vocab_size = _checked_size(vocab_size, "vocab_size", smallest, ": one id for each of the 256 "
                                   f"bytes plus {len(specials)} special token(s)")
        merges = learn_merges(text, vocab_size - smallest, pattern, specials)
        return cls([m.pair for m in merges], specials, pattern)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """The ids of `text`: special tokens one id each, the rest pre-split and merged chunk by chunk."""
        ids: list[int] = []
        for piece, special in split_special(_checked_text(text), self.special_tokens):
            if special:
                ids.append(self.special_tokens[piece])
                continue
            for chunk in _split(self._splitter, piece):
                ids.extend(self._encode_chunk(chunk))
        return ids

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
        # A heap of (merged id, position) for every mergeable neighbour pair pops the earliest-
        # learned pair, leftmost first, as the loop above merges it. Positions form a linked list
        # (`after`, `before`) so that a merge only touches its neighbours: n log n in all.
        # A merge's new pairs were learned later than it, so they never jump the queue.
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
        return b"".join(self.vocab[token_id] for token_id in _checked_ids(ids, self.vocab_size))

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`. Bytes that do not form whole UTF-8 characters (half an emoji) become '�'."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def labels(self, ids: Iterable[int]) -> list[str]:
        """Each token of `ids` as it looks on screen (see `readable`)."""
        return [readable(self.vocab[token_id]) for token_id in _checked_ids(ids, self.vocab_size)]

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
        saved = _read_saved(path, "BPETokenizer", ("merges", "special_tokens", "pattern"))
        if saved["pattern"] not in KNOWN_PATTERNS.values():
            raise ValueError(f"{path} holds the pattern {saved['pattern']!r:.80}, expected one of the "
                             f"known pre-tokenizer patterns ({', '.join(KNOWN_PATTERNS)}) because a "
                             "crafted regular expression can take exponential time; to use your own "
                             "pattern, build the tokenizer in code: BPETokenizer(merges, special_tokens, pattern)")
        return cls(saved["merges"], saved["special_tokens"], saved["pattern"])

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, BPETokenizer) and self.merges == other.merges
                and self.special_tokens == other.special_tokens and self.pattern == other.pattern)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={list(self.special_tokens)})")


# --- Unigram: every segmentation has a probability ---------------------------------------------


def segmentations(word: str, pieces: Collection[str]) -> list[list[str]]:
    """Every way to cut `word` into consecutive pieces that all belong to `pieces`.

    segmentations("abc", {"a", "b", "c", "ab"}) -> [["a", "b", "c"], ["ab", "c"]]. The number of
    ways grows exponentially with the length (2 ** 19 for 20 letters if every substring is a
    piece), so it is counted first, and a word with more than MAX_SEGMENTATIONS is refused.
    """
    word = _checked_text(word, "word")
    longest = max(map(len, pieces), default=0)
    # ways[start]: how many segmentations word[start:] has; counting is cheap, listing is not.
    ways = [0] * len(word) + [1]
    for start in range(len(word) - 1, -1, -1):
        ways[start] = sum(ways[end] for end in range(start + 1, min(len(word), start + longest) + 1)
                          if word[start:end] in pieces)
    if ways[0] > MAX_SEGMENTATIONS:
        raise ValueError(f"word {word!r:.40} has {ways[0]:,} segmentations, expected at most "
                         f"{MAX_SEGMENTATIONS:,} (MAX_SEGMENTATIONS): listing them all would take too long")
    # Extend cuts of word[:start] piece by piece, only towards ends that can still be completed.
    cuts: list[list[list[str]]] = [[[]]] + [[] for _ in word]
    for start in range(len(word)):
        for end in range(start + 1, min(len(word), start + longest) + 1):
            if cuts[start] and ways[end] and word[start:end] in pieces:
                cuts[end].extend([*cut, word[start:end]] for cut in cuts[start])
    return sorted(cuts[-1], key=lambda cut: [len(piece) for piece in cut]) if ways[0] else []


# --- the other two subword families: WordPiece and Unigram --------------------------------------
# Both work on words (spaces dropped, punctuation split off), as BERT's WordPiece and
# SentencePiece's Unigram usually do, and both train on the distinct words with their counts.

_WORD = re.compile(r"\w+|[^\w\s]")


def split_words(text: str) -> list[str]:
    """Words and punctuation marks, spaces dropped: "Soup is yummy." -> ["Soup", "is", "yummy", "."]."""
    return _WORD.findall(_checked_text(text))


def _word_counts(text: str) -> Counter[str]:
    counts = Counter(split_words(text))
    if not counts:
        raise ValueError("text is empty (or only spaces), expected some training text with words in it")
    return counts


class WordPieceTokenizer:
    """WordPiece (BERT): a piece that continues a word is written with "##" in front ("##ing").

    Training merges pairs like BPE but ranks them by count(ab) / (count(a) * count(b)), which
    prefers pairs whose parts rarely appear apart. Encoding takes, from the left, the longest
    piece in the vocabulary; a word it cannot spell becomes `unk_token`.
    """

    def __init__(self, vocab: Sequence[str], unk_token: str = "[UNK]") -> None:
        self.vocab = list(vocab)
        self.unk_token = unk_token
        if unk_token not in self.vocab:
            self.vocab.append(unk_token)
        self._ids = {piece: index for index, piece in enumerate(self.vocab)}
        self._longest = max(len(piece) for piece in self.vocab)

    @classmethod
    def train(cls, text: str, vocab_size: int, unk_token: str = "[UNK]") -> WordPieceTokenizer:
        word_counts = _word_counts(text)
        spellings = {word: [word[0]] + ["##" + char for char in word[1:]] for word in word_counts}
        vocab = sorted({piece for pieces in spellings.values() for piece in pieces})
        vocab_size = _checked_size(vocab_size, "vocab_size", len(vocab) + 1, f": the {len(vocab)} characters "
                                   f"(first and continuing) of text plus {unk_token}")
        while len(vocab) + 1 < vocab_size:
            pair = cls._best_pair(spellings, word_counts)
            if pair is None:
                break
            joined = pair[0] + pair[1].removeprefix("##")
            vocab.append(joined)
            spellings = {word: cls._join(pieces, pair, joined) for word, pieces in spellings.items()}
        return cls(vocab, unk_token)

    @staticmethod
    def _best_pair(spellings: Mapping[str, list[str]], word_counts: Mapping[str, int]) -> tuple[str, str] | None:
        piece_counts: Counter[str] = Counter()
        pair_counts: Counter[tuple[str, str]] = Counter()
        for word, pieces in spellings.items():
            for piece in pieces:
                piece_counts[piece] += word_counts[word]
            for pair in pairwise(pieces):
                pair_counts[pair] += word_counts[word]
        if not pair_counts:
            return None
        return min(pair_counts, key=lambda pair: (
            -pair_counts[pair] / (piece_counts[pair[0]] * piece_counts[pair[1]]), pair))

    @staticmethod
    def _join(pieces: list[str], pair: tuple[str, str], joined: str) -> list[str]:
        result: list[str] = []
        for piece in pieces:
            if result and (result[-1], piece) == pair:
                result[-1] = joined
            else:
                result.append(piece)
        return result

    def tokenize_word(self, word: str) -> list[str]:
        """Longest vocabulary piece first, left to right; [unk_token] if some part cannot be spelled."""
        word = _checked_text(word, "word")
        pieces: list[str] = []
        start = 0
        while start < len(word):
            prefix = "##" if start else ""
            for end in range(min(len(word), start + self._longest), start, -1):
                if prefix + word[start:end] in self._ids:
                    pieces.append(prefix + word[start:end])
                    start = end
                    break
            else:
                return [self.unk_token]
        return pieces

    def tokenize(self, text: str) -> list[str]:
        return [piece for word in split_words(text) for piece in self.tokenize_word(word)]

    def encode(self, text: str) -> list[int]:
        return [self._ids[piece] for piece in self.tokenize(text)]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


class UnigramTokenizer:
    """Unigram language model (SentencePiece): every piece has a probability, a segmentation's
    probability is the product of its pieces', and encoding picks the most probable one.

    log_probs: piece -> natural log of its probability. Each character missing from it becomes
    one `unk_token`, scored 10 below the least likely piece (SentencePiece's penalty).
    """

    def __init__(self, log_probs: Mapping[str, float], unk_token: str = "<unk>") -> None:
        if not isinstance(log_probs, Mapping) or not log_probs:
            raise ValueError(f"log_probs is {log_probs!r:.60}, expected a non-empty dict piece -> log-probability")
        if not all(isinstance(piece, str) and piece for piece in log_probs):
            raise TypeError("log_probs has a key that is not a non-empty str, expected pieces of text as keys")
        self.log_probs = dict(log_probs)
        self.unk_token = unk_token
        self._longest = max(len(piece) for piece in self.log_probs)
        self._unk_score = min(self.log_probs.values()) - 10.0

    @classmethod
    def train(cls, text: str, vocab_size: int, max_piece_length: int = 8,
              prune_fraction: float = 0.2, unk_token: str = "<unk>") -> UnigramTokenizer:
        """A simplified Unigram trainer: start from many frequent substrings, then alternate
        (a) re-estimating each piece's probability from how often the best segmentations use it,
        (b) dropping the `prune_fraction` of pieces whose loss costs the corpus least,
        until `vocab_size` pieces are left. Single characters are never dropped.

        (SentencePiece re-estimates with expected counts over all segmentations; counting only
        the best one, as here, is its common "hard" simplification.)
        """
        word_counts = _word_counts(text)
        chars = {char for word in word_counts for char in word}
        vocab_size = _checked_size(vocab_size, "vocab_size", len(chars), ": one piece for each character of text")
        max_piece_length = _checked_size(max_piece_length, "max_piece_length", 1)
        if isinstance(prune_fraction, bool) or not isinstance(prune_fraction, numbers.Real):
            raise TypeError(f"prune_fraction is {prune_fraction!r} of type {type(prune_fraction).__name__}, "
                            "expected a number between 0 and 1")
        if not 0 < prune_fraction < 1:
            raise ValueError(f"prune_fraction is {prune_fraction}, expected a fraction strictly between 0 "
                             "and 1 (with 0 or less no piece is ever dropped, so training would never end)")
        substrings: Counter[str] = Counter()
        for word, count in word_counts.items():
            for start in range(len(word)):
                for end in range(start + 1, min(len(word), start + max_piece_length) + 1):
                    substrings[word[start:end]] += count
        seed = {piece for piece, _ in substrings.most_common(4 * vocab_size)} | chars
        model = cls(_normalised({piece: substrings[piece] for piece in seed}), unk_token)
        while True:
            usage = model._usage(word_counts)
            model = cls(_normalised({piece: usage[piece] + 1 for piece in model.log_probs}), unk_token)
            if len(model.log_probs) <= vocab_size:
                return model
            # At least one piece goes each round, however small prune_fraction is.
            keep = max(vocab_size, min(len(model.log_probs) - 1, int(len(model.log_probs) * (1 - prune_fraction))))
            model = model._pruned(model._usage(word_counts), keep, chars)

    def _usage(self, word_counts: Mapping[str, int]) -> Counter[str]:
        """How many times the corpus's best segmentations use each piece."""
        usage: Counter[str] = Counter()
        for word, count in word_counts.items():
            for piece in self.tokenize_word(word):
                usage[piece] += count
        return usage

    def _pruned(self, usage: Mapping[str, int], keep: int, chars: Collection[str]) -> UnigramTokenizer:
        def loss(piece: str) -> float:  # how much log-likelihood the corpus loses without `piece`
            if piece in chars:
                return float("inf")
            alternative, _ = self._best(piece, exclude=piece)
            return usage.get(piece, 0) * (self.log_probs[piece] - alternative)

        ranked = sorted(self.log_probs, key=lambda piece: (-loss(piece), piece))
        return UnigramTokenizer({piece: self.log_probs[piece] for piece in ranked[:keep]}, self.unk_token)

    def _best(self, word: str, exclude: str | None = None) -> tuple[float, list[str] | None]:
        """Viterbi: the most probable segmentation of `word` and its log-probability."""
        best: list[tuple[float, list[str] | None]] = [(0.0, [])]
        for end in range(1, len(word) + 1):
            best.append((float("-inf"), None))
            for start in range(max(0, end - self._longest), end):
                piece = word[start:end]
                score_before, pieces_before = best[start]
                log_p = self.log_probs.get(piece)
                if log_p is None and end - start == 1:  # an unknown character: one unk_token
                    piece, log_p = self.unk_token, self._unk_score
                if pieces_before is None or piece == exclude or log_p is None:
                    continue
                score = score_before + log_p
                if score > best[end][0]:
                    best[end] = (score, [*pieces_before, piece])
        return best[-1]

    def score(self, pieces: Sequence[str]) -> float:
        """log P(segmentation) = the sum of its pieces' log-probabilities (-inf for an unknown piece)."""
        return sum(self.log_probs.get(piece, float("-inf")) for piece in pieces)

    def tokenize_word(self, word: str) -> list[str]:
        _, pieces = self._best(_checked_text(word, "word"))
        return [self.unk_token] if pieces is None else pieces

    def tokenize(self, text: str) -> list[str]:
        return [piece for word in split_words(text) for piece in self.tokenize_word(word)]

    @property
    def vocab_size(self) -> int:
        return len(self.log_probs)



def _normalised(counts: Mapping[str, float]) -> dict[str, float]:
    """piece -> log(count / total)."""
    total = sum(counts.values())
    return {piece: math.log(count / total) for piece, count in counts.items()}
