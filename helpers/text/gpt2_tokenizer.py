"""GPT-2's tokenizer files read into the course's byte-level BPE (notebook 7, "Optional: GPT-2's own weights").

    bytes_to_unicode         GPT-2's table: each of the 256 bytes as a printable character
    read_vocab, read_merges  vocab.json / encoder.json and merges.txt / vocab.bpe
    GPT2Tokenizer            the course BPETokenizer with GPT-2's ids: encode, decode

GPT-2's tokenizer *is* a byte-level BPE like notebook 1's: the same pre-tokenizer rule, merges
applied earliest-learned first. Only the labels differ. GPT-2 writes every byte as a printable
character (byte 32, the space, is "Ġ"), stores merges as pairs of such strings ("Ġ t"), and
numbers its tokens in its own order (its id 0 is "!", byte 33; `<|endoftext|>` is 50256).
So the course tokenizer is built from the merges, and GPT-2's ids are a relabelling of its ids:
one table each way. tests/text/test_gpt2_tokenizer.py checks every id against Hugging Face's encoder.

Model code with file input: it imports json and the course's BPE.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from helpers import checks
from helpers.text.bpe import BYTE_VOCAB_SIZE, BPETokenizer


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> character table. The 188 bytes that print as themselves in Latin-1
    ("!".."~", "¡".."¬", "®".."ÿ") keep their character; the other 68 (controls, space,
    soft hyphen, ...) take the characters 256, 257, ... in byte order, so nothing is invisible."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    shifted = 256
    for byte in range(BYTE_VOCAB_SIZE):
        if byte not in table:
            table[byte] = chr(shifted)
            shifted += 1
    return dict(sorted(table.items()))


def read_vocab(path: str | Path) -> dict[str, int]:
    """vocab.json (or the older encoder.json): {token as GPT-2 characters: id}."""
    path = Path(path)
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a JSON vocabulary file: {error}") from None
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise ValueError(f"{path} holds a {type(vocab).__name__}, expected a JSON object "
                         '{"token": id, ...} like GPT-2\'s vocab.json')
    return vocab


def read_merges(path: str | Path) -> list[tuple[str, str]]:
    """merges.txt (or the older vocab.bpe): a '#version' line, then one merge 'left right' a line."""
    path = Path(path)
    merges = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("#version") or not line:
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise ValueError(f"{path} line {number} is {line!r}, expected two tokens "
                             "separated by one space, such as 'Ġ t'")
        merges.append((parts[0], parts[1]))
    return merges


class GPT2Tokenizer:
    """GPT-2's tokenizer: the course BPETokenizer underneath, GPT-2's ids outside.

    encode(text) -> GPT-2's ids; decode(ids) -> text. `bpe` is the course tokenizer
    (ids 0..255 the bytes, merge i is id 256 + i, then the special tokens); `to_gpt2[i]` is
    GPT-2's id of course id i, `from_gpt2` the way back. Every vocabulary entry that no merge
    makes (GPT-2 has one, `<|endoftext|>`) is a special token: one id, never split.
    """

    def __init__(self, vocab: Mapping[str, int], merges: Sequence[tuple[str, str]]) -> None:
        self._check_ids(vocab)
        course_id = {char: byte for byte, char in bytes_to_unicode().items()}  # "Ġ" -> 32
        pairs = []
        for index, (left, right) in enumerate(merges):
            for part in (left, right):
                if part not in course_id:
                    raise ValueError(f"merge {index} is {left!r} + {right!r}, but {part!r} is neither "
                                     "a byte nor made by an earlier merge")
            if left + right in course_id:
                raise ValueError(f"merge {index} makes {left + right!r}, which an earlier merge made "
                                 "already: each merge must add a new token")
            pairs.append((course_id[left], course_id[right]))
            course_id[left + right] = BYTE_VOCAB_SIZE + index
        missing = [token for token in course_id if token not in vocab]
        if missing:
            raise ValueError(f"the vocabulary has no id for {missing[:3]} (made by the bytes or the "
                             "merges): vocab.json and merges.txt do not belong together")
        specials = sorted((token for token in vocab if token not in course_id), key=vocab.__getitem__)
        self._check_no_missing_merges(specials, course_id, len(merges))
        self.bpe = BPETokenizer(pairs, specials)
        self.to_gpt2 = [vocab[token] for token in course_id] + [vocab[token] for token in specials]
        self.from_gpt2 = {gpt2: ours for ours, gpt2 in enumerate(self.to_gpt2)}

    @staticmethod
    def _check_no_missing_merges(specials: Sequence[str], made: Mapping[str, int], n_merges: int) -> None:
        """A vocabulary entry no merge makes is a special token (`<|endoftext|>`), unless two
        made tokens join into it: then it is a merge that merges.txt lacks (a cut-short file)."""
        looks_merged = [token for token in specials
                        if any(token[:i] in made and token[i:] in made for i in range(1, len(token)))]
        if looks_merged:
            raise ValueError(f"merges.txt has {n_merges} merges, but vocab.json has {len(looks_merged)} "
                             f"tokens that only a merge makes and no merge does, such as "
                             f"{looks_merged[:3]}: merges.txt is cut short (an interrupted "
                             "download?), expected one merge for every such token")

    @staticmethod
    def _check_ids(vocab: Mapping[str, int]) -> None:
        ids = sorted(vocab.values())
        if ids != list(range(len(ids))):
            raise ValueError(f"the vocabulary's {len(ids)} ids are not 0 .. {len(ids) - 1}, each "
                             "once: it is not a GPT-2 vocab.json")

    @classmethod
    def from_files(cls, vocab_path: str | Path, merges_path: str | Path) -> GPT2Tokenizer:
        """From vocab.json + merges.txt (or the same content as encoder.json + vocab.bpe)."""
        return cls(read_vocab(vocab_path), read_merges(merges_path))

    @property
    def vocab_size(self) -> int:
        return len(self.to_gpt2)

    @property
    def special_tokens(self) -> dict[str, int]:
        """{special token: GPT-2's id}, e.g. {"<|endoftext|>": 50256}."""
        return {token: self.to_gpt2[i] for token, i in self.bpe.special_tokens.items()}

    def encode(self, text: str) -> list[int]:
        """GPT-2's ids of `text` (special tokens such as <|endoftext|> are one id each)."""
        return [self.to_gpt2[i] for i in self.bpe.encode(text)]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of GPT-2's `ids` (half a UTF-8 character decodes to '�'). Like
        BPETokenizer.decode it takes NumPy and torch integers (a row of `generate`'s output) and
        refuses bools. GPT-2's ids are exactly 0 .. vocab_size - 1 (checked when built)."""
        return self.bpe.decode([self.from_gpt2[token_id] for token_id in checks.token_ids("ids", ids, self.vocab_size)])

    def __repr__(self) -> str:
        return (f"GPT2Tokenizer(vocab_size={self.vocab_size}, merges={len(self.bpe.merges)}, "
                f"special_tokens={list(self.special_tokens)})")
