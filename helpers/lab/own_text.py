"""Bring your own text: train the course's BPE and GPT on any UTF-8 text file you have.

Used at the end of notebook 1 ("Tokenization") and of notebook 7 ("GPT"), behind the knob
`MY_TEXT_FILE`. Everything here is the course's own code put in a row; what this module adds
is `read_text_file`, which says clearly what is wrong with a file that cannot be trained on:

    read_text_file(path)          the text of a UTF-8 file, or a ValueError naming the path and the
                                  problem: missing, a folder, a pipe or device, too large, empty,
                                  binary, not UTF-8
    tokens_needed(...)            how many tokens a GPT run needs (a training and a validation window)
    bpe_on_text_file(path, ...)   notebook 1: learn BPE merges from the file, measure the compression
    gpt_on_text_file(path, ...)   notebook 7: BPE, then a small GPT trained for a fixed number of
                                  steps with the Trainer, then a sample
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from helpers import checks
from helpers.model.generation import generate
from helpers.model.gpt import GPT, GPTConfig
from helpers.text.bpe import BYTE_VOCAB_SIZE, BPETokenizer, Merge, learn_merges
from helpers.training.trainer import History, TrainConfig, Trainer, encode_text, split_train_val

_SNIFF_BYTES = 65_536  # the start of the file that is checked for binary content
_MAX_CONTROL_SHARE = 0.05  # text has almost no control characters besides tabs and line breaks
_TEXT_CONTROLS = frozenset(b"\t\n\r\f\v\b\x1b")
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
MAX_TEXT_BYTES = 64 * 2**20  # 64 MiB: far more than a laptop CPU trains the course's GPT on


def _control_share(data: bytes) -> float:
    """The share of bytes in `data` that are control characters no text file uses."""
    if not data:
        return 0.0
    controls = sum(1 for byte in data if (byte < 32 or byte == 127) and byte not in _TEXT_CONTROLS)
    return controls / len(data)


def _encoding_hint(data: bytes, file: Path) -> str:
    """Advice for a file that is not UTF-8: which common encoding reads it, and how to convert."""
    for encoding in ("cp1252", "latin-1"):  # latin-1 reads any bytes, so it is the last resort
        try:
            data.decode(encoding)
        except UnicodeDecodeError:
            continue
        return (f"It may be in {encoding} (common for files saved on Windows or by older editors): "
                f"convert it once with `iconv -f {encoding.upper()} -t UTF-8 in.txt > out.txt`, or in Python: "
                f"Path('out.txt').write_text(Path({str(file)!r}).read_text(encoding={encoding!r}), encoding='utf-8')")
    return "Save it again as UTF-8."  # not reached: latin-1 decodes everything


def read_text_file(path: str | Path, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The text of the UTF-8 file at `path` (a byte-order mark at the start is dropped).

    Raises FileNotFoundError for a missing file and ValueError, naming the path and what was
    expected, for a folder, anything that is not a regular file (a named pipe, /dev/stdin,
    /dev/zero: reading those could block or never end), a file over `max_bytes` (64 MiB by
    default), an empty or whitespace-only file, a binary file (NUL bytes or many control
    characters: an image, a PDF, a Word document) and a file that is not UTF-8 (with the byte
    offset of the first bad byte and how to convert the file).
    """
    if not isinstance(path, str | Path):
        raise TypeError(f"path is {path!r:.60} of type {type(path).__name__}, expected a str or pathlib.Path")
    checks.positive_int("max_bytes", max_bytes)
    file = Path(path).expanduser()
    if not file.exists():
        raise FileNotFoundError(f"path {str(file)!r} does not exist, expected a UTF-8 text file "
                                f"(relative paths start from {str(Path.cwd())!r})")
    if file.is_dir():
        raise ValueError(f"path {str(file)!r} is a folder, expected a UTF-8 text file: name one file inside it")
    data = _read_regular_file(file, max_bytes)
    if data.startswith(_UTF16_BOMS):
        raise ValueError(f"path {str(file)!r} is UTF-16 text (it starts with a UTF-16 byte-order mark), "
                         "expected UTF-8: convert it once with `iconv -f UTF-16 -t UTF-8 in.txt > out.txt`")
    start = data[:_SNIFF_BYTES]
    if b"\x00" in start or _control_share(start) > _MAX_CONTROL_SHARE:
        where = f"a NUL byte at offset {start.index(0):,}" if b"\x00" in start else (
            f"{_control_share(start):.0%} control characters")
        raise ValueError(f"path {str(file)!r} looks binary ({where} in its first {len(start):,} bytes), "
                         "expected a plain UTF-8 text file: export PDFs and Word documents as plain text first "
                         "(UTF-16 text has a NUL in every other byte: `iconv -f UTF-16 -t UTF-8 in.txt > out.txt`)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = data[error.start:error.start + 4]
        raise ValueError(f"path {str(file)!r} is not UTF-8: byte {error.start:,} ({bad!r}) is {error.reason}; "
                         f"expected UTF-8 text. {_encoding_hint(data, file)}") from None
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise ValueError(f"path {str(file)!r} is empty" + (f" ({len(data):,} bytes of white space only)" if data else "")
                         + ", expected some text to train on")
    return text


def _read_regular_file(file: Path, max_bytes: int) -> bytes:
    """The bytes of `file`, if it is a regular file of at most `max_bytes` bytes.

    The file is opened without blocking (a named pipe with no writer would otherwise wait
    forever) and checked through the open descriptor, so it cannot be swapped in between.
    """
    descriptor = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            kind = ("a named pipe" if stat.S_ISFIFO(info.st_mode) else "a device" if
                    stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a socket"
                    if stat.S_ISSOCK(info.st_mode) else "not a regular file")
            raise ValueError(f"path {str(file)!r} is {kind}, expected a regular UTF-8 text file "
                             "(reading a pipe or a device can wait or run forever)")
        if info.st_size > max_bytes:
            raise ValueError(f"path {str(file)!r} has {info.st_size:,} bytes, expected at most "
                             f"max_bytes = {max_bytes:,}: train on a part of it, or raise max_bytes")
        data = handle.read(max_bytes + 1)  # a file that grew since fstat is still capped
    if len(data) > max_bytes:
        raise ValueError(f"path {str(file)!r} has more than max_bytes = {max_bytes:,} bytes, "
                         "expected at most that: train on a part of it, or raise max_bytes")
    return data


def tokens_needed(context_length: int, val_fraction: float = 0.1) -> int:
    """The fewest tokens whose `split_train_val(ids, val_fraction)` leaves both parts at least
    one window of `context_length` tokens plus its next token (what the Trainer needs)."""
    checks.positive_int("context_length", context_length)
    checks.number_in("val_fraction", val_fraction, 0.0, 1.0, low_open=True, high_open=True)
    window = context_length + 1
    n = 2 * window  # both parts need a window; the split rounds, so step up to the first length that works
    while True:
        cut = int(n * (1.0 - val_fraction))
        if cut >= window and n - cut >= window:
            return n
        n += 1


# --- notebook 1: the course BPE on your text ---------------------------------------------------


@dataclass
class BPEReport:
    """What `bpe_on_text_file` learned: the tokenizer, its merges and how well it compresses."""

    tokenizer: BPETokenizer
    merges: list[Merge]
    n_bytes: int  # the text's UTF-8 bytes
    n_tokens: int  # its tokens after the merges

    @property
    def bytes_per_token(self) -> float:
        return self.n_bytes / self.n_tokens

    def summary(self, first: int = 10) -> str:
        """A few lines to print: the size, the first merges, the compression."""
        vocab = self.tokenizer.vocab
        lines = [f"{self.n_bytes:,} bytes, {len(self.merges):,} merges learned",
                 "first merges: " + ", ".join(
                     f"{vocab[m.new_id]!r}" for m in self.merges[:first]),
                 f"{self.n_tokens:,} tokens: {self.bytes_per_token:.2f} bytes per token"]
        return "\n".join(lines)


def bpe_on_text_file(path: str | Path, n_merges: int = 1_000) -> BPEReport:
    """Learn up to `n_merges` byte-level BPE merges (GPT-2's pre-tokenizer) from the file at
    `path` (fewer when the text runs out of pairs) and encode the file with them."""
    checks.positive_int("n_merges", n_merges)
    text = read_text_file(path)
    merges = learn_merges(text, n_merges)
    if not merges:
        raise ValueError(f"path {str(path)!r} holds {len(text):,} characters, too short to learn a merge "
                         "from: expected at least one word of two or more characters")
    tokenizer = BPETokenizer([m.pair for m in merges])
    return BPEReport(tokenizer, merges, len(text.encode("utf-8")), len(tokenizer.encode(text)))


# --- notebook 7: the tokenizer and a small GPT on your text -------------------------------------


@dataclass
class GPTRun:
    """What `gpt_on_text_file` made: the tokenizer, the trained model, its history and a sample."""

    tokenizer: BPETokenizer
    model: GPT
    history: History
    sample: str


def gpt_on_text_file(path: str | Path, steps: int = 300, vocab_size: int = 512,
                     config: GPTConfig | None = None, train_config: TrainConfig | None = None,
                     max_new_tokens: int = 100, seed: int = 0, progress_bar: bool = True) -> GPTRun:
    """Train a BPE tokenizer of `vocab_size` ids and a GPT (`config`; its vocab_size is replaced)
    on the file at `path` for `steps` Trainer steps (90% training, the last 10% validation), then
    sample `max_new_tokens` tokens (temperature 0.8, top-k 20) after the validation text's start.

    The default model is small enough for a laptop CPU: 4 layers, d_model 128, windows of 128
    tokens. A file too short for one training and one validation window raises a ValueError
    that says how many tokens it has and how many are needed (`tokens_needed`).
    """
    checks.positive_int("steps", steps)
    checks.positive_int("max_new_tokens", max_new_tokens)
    checks.non_negative_int("seed", seed)
    if vocab_size <= BYTE_VOCAB_SIZE:
        raise ValueError(f"vocab_size is {vocab_size!r}, expected more than the {BYTE_VOCAB_SIZE} byte ids")
    text = read_text_file(path)
    tokenizer = BPETokenizer.train(text, vocab_size)
    ids = encode_text(tokenizer, text)
    base = config or GPTConfig(context_length=128, n_layers=4, n_heads=4, d_model=128)
    config = replace(base, vocab_size=tokenizer.vocab_size)
    train_config = train_config or TrainConfig(batch_size=16, learning_rate=3e-3, eval_every=max(1, steps // 5))
    context_length = train_config.context_length or config.context_length
    needed = tokens_needed(context_length)
    if len(ids) < needed:
        raise ValueError(f"path {str(path)!r} is {len(ids):,} tokens long, expected at least {needed:,} "
                         f"tokens (one window of context_length + 1 = {context_length + 1} for training and one "
                         "for validation, the last 10%): use a longer file or a smaller context_length")
    torch.manual_seed(seed)
    model = GPT(config)
    train_ids, val_ids = split_train_val(ids)
    history = Trainer(model, train_ids, val_ids, train_config).fit(steps=steps, progress_bar=progress_bar)
    prompt = val_ids[: min(8, len(val_ids))].unsqueeze(0)
    generator = torch.Generator().manual_seed(seed)
    out = generate(model, prompt, max_new_tokens, temperature=0.8, top_k=20, generator=generator)
    return GPTRun(tokenizer, model, history, tokenizer.decode(out[0].tolist()))
