"""What every tokenizer of notebook 1 shares, and the simplest one: one id per character.

Derived in notebook 1 ("Tokenization"): section 2 builds the character tokenizer (`CharTokenizer`)
and section 4 GPT-2's pre-split (`pre_split`). The rest of the ladder builds on this module:

    tokenizers  CharTokenizer; GPT-2's pre-tokenizer; the checks of text, ids, special tokens
    bpe         byte-level BPE: pairs and merges, the textbook trainer, the fast one, BPETokenizer
    subword     the other two subword families, WordPiece and Unigram, and `segmentations`

A tokenizer turns text into a list of integer ids and back again. Every tokenizer here keeps
special tokens (such as "<|endoftext|>"): strings that always get their own id and are never
cut into pieces.

GPT-2's pre-tokenizer cuts text into word-like chunks before BPE sees it; BPE merges never
cross a chunk boundary. Between a non-space character and a space that follows it there is
always a boundary, whatever comes next, which is where `stream_blocks` cuts a long stream of
text so that it can be encoded a block at a time.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Collection, Iterable, Iterator, Sequence
from pathlib import Path

import regex

from helpers import checks

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

STREAM_BLOCK_CHARS = 1 << 16  # characters `stream_blocks` gathers before it looks for a cut


# --- argument checks, shared by all the tokenizers --------------------------------------------


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> regex.Pattern:
    return regex.compile(pattern)


def compile_pattern(pattern: object) -> regex.Pattern:
    """`pattern`, a str holding a regular expression, compiled (and cached) by `regex`."""
    if not isinstance(pattern, str):
        raise TypeError(f"pattern is {pattern!r:.60} of type {type(pattern).__name__}, expected a str "
                        "holding a regular expression")
    try:
        return _compiled(pattern)
    except regex.error as error:
        raise ValueError(f"pattern is {pattern!r}, which is not a valid regular expression ({error})") from None


def split_chunks(splitter: regex.Pattern, text: str) -> list[str]:
    """The chunks of `text`: each match of `splitter`, and each stretch of text between matches
    as a chunk of its own, so that no character is lost whatever the pattern (capturing groups
    and empty matches included). The tokenizers call it on checked arguments."""
    checks.instance("splitter", splitter, regex.Pattern, "a compiled pattern (compile_pattern)")
    checks.instance("text", text, str, "a str")
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


# --- the pre-tokenizer: where BPE may merge, and where a stream may be cut ---------------------


def pre_split(text: str, pattern: str = GPT2_SPLIT_PATTERN) -> list[str]:
    """Cut `text` into the chunks that BPE works inside: merges never cross a chunk boundary.

    pre_split("Tom found a key.") -> ["Tom", " found", " a", " key", "."];
    "".join(pre_split(text, pattern)) == text for every text and every pattern: text that the
    pattern does not match becomes a chunk of its own.
    """
    return split_chunks(compile_pattern(pattern), checks.text("text", text))


# A non-space character followed by a space: GPT-2's pattern has no chunk that holds both (words,
# numbers and punctuation hold no space; space runs hold nothing else; " ?\p{L}+" puts a space in
# front of a word, never after it), and it never looks behind or past that space.
_ALWAYS_A_CUT = regex.compile(r"\S\s", flags=regex.REVERSE)  # REVERSE: search from the end


def stream_blocks(texts: Iterable[str], special_tokens: Collection[str] = (),
                  block_chars: int = STREAM_BLOCK_CHARS) -> Iterator[str]:
    """The text of `texts` (lines of a file, or chunks of any size) joined and cut again into
    blocks of about `block_chars` or more characters, cut only where GPT-2's pre-tokenizer always
    cuts and never inside a special token. Encoding the blocks one by one therefore gives the
    ids of the whole text, while only one block (and one piece of `texts`) is in memory.

    A block ends where a non-space character meets a space, and at least as many characters
    before the end of what has been read as the longest special token has, so that a special
    token that is still arriving cannot be cut. Text with no such place stays in one block.
    """
    if isinstance(texts, str | bytes | bytearray) or not isinstance(texts, Iterable):
        hint = " (one str? encode it whole)" if isinstance(texts, str) else ""
        raise TypeError(f"texts is {texts!r:.60} of type {type(texts).__name__}, expected an iterable "
                        f"of str, such as the lines of a file opened with encoding='utf-8'{hint}")
    block_chars = checks.positive_int("block_chars", block_chars)
    longest = max(map(len, special_tokens), default=0)
    pending: list[str] = []  # pieces read since the last cut
    pending_chars = 0
    searched_from = 0  # places to cut before this were tried and refused
    for index, piece in enumerate(texts):
        pending.append(checks.text(f"texts[{index}]", piece))
        pending_chars += len(piece)
        if pending_chars < block_chars:
            continue
        text = "".join(pending)
        cut, searched_from = _last_cut(text, special_tokens, longest, searched_from)
        pending = [text[cut:]]
        pending_chars = len(text) - cut
        if cut:
            searched_from = 0
            yield text[:cut]
    if pending_chars:
        yield "".join(pending)


def _last_cut(text: str, special_tokens: Collection[str], longest: int, start: int) -> tuple[int, int]:
    """The last place in text[start:] where `stream_blocks` may cut (0 if none), and where the
    next search must start: places too near the end to rule out a special token are not final."""
    end = len(text) - max(longest - 1, 0)  # the last place whose special tokens are all in view
    search_end = min(len(text), end + 1)
    while (match := _ALWAYS_A_CUT.search(text, start, search_end)) is not None:
        cut = match.start() + 1
        if not any(text.startswith(token, at) for token in special_tokens
                   for at in range(max(0, cut - len(token) + 1), cut)):
            return cut, 0
        search_end = match.start() + 1
    return 0, max(0, end - 1)


# --- special tokens and ids, shared by all the tokenizers ------------------------------------


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


def read_saved(path: str | Path, kind: str, keys: Sequence[str]) -> dict:
    """The JSON dict a tokenizer of class `kind` saved at `path`, refused unless it is one and has `keys`."""
    checks.instance("path", path, str | Path, "a file name (str or Path)")
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



# --- the simplest tokenizer: one id per character ---------------------------------------------


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
                               for index, token in enumerate(checks.special_tokens("special_tokens", special_tokens))}
        self._id_of = {char: index for index, char in enumerate(self.chars)}
        self._text_of = self.chars + list(self.special_tokens)

    @classmethod
    def train(cls, text: str, special_tokens: Iterable[str] = ()) -> CharTokenizer:
        """A tokenizer for the characters of `text` (sorted), special tokens left out."""
        specials = checks.special_tokens("special_tokens", special_tokens)
        plain = "".join(piece for piece, special in split_special(checks.text("text", text), specials) if not special)
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
        for piece, special in split_special(checks.text("text", text), self.special_tokens):
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
        return "".join(self._text_of[token_id] for token_id in checks.token_ids("ids", ids, self.vocab_size))

    def save(self, path: str | Path) -> Path:
        """Write the tokenizer as JSON to `path`; `CharTokenizer.load(path)` reads it back."""
        state = {"type": "CharTokenizer", "chars": self.chars, "special_tokens": list(self.special_tokens)}
        Path(path).write_text(json.dumps(state, ensure_ascii=False, indent=1), encoding="utf-8")
        return Path(path)

    @classmethod
    def load(cls, path: str | Path) -> CharTokenizer:
        saved = read_saved(path, "CharTokenizer", ("chars", "special_tokens"))
        return cls(saved["chars"], saved["special_tokens"])

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, CharTokenizer) and self.chars == other.chars
                and self.special_tokens == other.special_tokens)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, special_tokens={list(self.special_tokens)})"
