"""Bring your own text (helpers.lab.own_text): reading a student's file, and the functions behind
the MY_TEXT_FILE knobs of notebooks 1 and 7."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from helpers.lab.own_text import bpe_on_text_file, gpt_on_text_file, read_text_file, tokens_needed
from helpers.model.gpt import GPTConfig
from helpers.text.bpe import learn_merges
from helpers.training.trainer import TrainConfig, split_train_val

PROSE = ("The little boat left the harbour at dawn. The sailors sang while the gulls followed them, "
         "and the wind filled the sails. By noon the island was a grey line on the horizon.\n")


def write(tmp_path, data: bytes, name: str = "mine.txt"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_reads_utf8_and_drops_a_byte_order_mark(tmp_path):
    text = "Zoë found a key 🔑.\nSecond line.\n"
    assert read_text_file(write(tmp_path, text.encode())) == text
    assert read_text_file(str(write(tmp_path, b"\xef\xbb\xbf" + text.encode()))) == text


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing)) + ".*does not exist"):
        read_text_file(missing)


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match=re.escape(str(tmp_path)) + ".*is a folder"):
        read_text_file(tmp_path)


@pytest.mark.parametrize("data", [b"", b"  \n\t\n  "])
def test_empty_or_white_space_file(tmp_path, data):
    path = write(tmp_path, data)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*is empty.*expected some text"):
        read_text_file(path)


def test_binary_files_are_refused(tmp_path):
    png = write(tmp_path, b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)), "image.txt")
    with pytest.raises(ValueError, match=re.escape(str(png)) + ".*looks binary.*NUL byte at offset 8"):
        read_text_file(png)
    noisy = write(tmp_path, bytes([1, 2, 3, 65, 66, 4, 5, 6]) * 100, "noise.txt")  # no NUL, mostly controls
    with pytest.raises(ValueError, match="looks binary.*control characters"):
        read_text_file(noisy)


def test_utf16_is_named(tmp_path):
    path = write(tmp_path, "hello".encode("utf-16"))
    with pytest.raises(ValueError, match="UTF-16.*iconv -f UTF-16 -t UTF-8"):
        read_text_file(path)


def test_non_utf8_gives_the_offset_and_the_fix(tmp_path):
    path = write(tmp_path, "Café au lait, s'il vous plaît.".encode("cp1252"))
    offset = len(b"Caf")
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}.*not UTF-8: byte {offset} .*cp1252.*iconv") as error:
        read_text_file(path)
    fixed = tmp_path / "fixed.txt"  # the advice works
    fixed.write_text(path.read_text(encoding="cp1252"), encoding="utf-8")
    assert read_text_file(fixed) == "Café au lait, s'il vous plaît."
    assert "expected UTF-8" in str(error.value)


def test_wrong_type():
    with pytest.raises(TypeError, match="path is 3 of type int"):
        read_text_file(3)


@pytest.mark.parametrize("context_length", [1, 7, 64, 128])
@pytest.mark.parametrize("val_fraction", [0.1, 0.25, 0.5, 0.9])
def test_tokens_needed_is_the_fewest_that_split(context_length, val_fraction):
    import torch

    def fits(n):
        train, val = split_train_val(torch.arange(n), val_fraction)
        return len(train) >= context_length + 1 and len(val) >= context_length + 1

    needed = tokens_needed(context_length, val_fraction)
    assert fits(needed) and not fits(needed - 1)


def test_bpe_on_a_file_learns_the_same_merges_as_on_the_text(tmp_path):
    path = write(tmp_path, (PROSE * 20).encode())
    report = bpe_on_text_file(path, n_merges=50)
    assert report.merges == learn_merges(PROSE * 20, 50)
    assert report.tokenizer.decode(report.tokenizer.encode(PROSE)) == PROSE
    assert report.n_bytes == len((PROSE * 20).encode()) and report.bytes_per_token > 2
    summary = report.summary()
    assert "50 merges learned" in summary and "bytes per token" in summary


def test_bpe_on_a_file_without_pairs(tmp_path):
    path = write(tmp_path, b"a\n")
    with pytest.raises(ValueError, match="holds 2 characters, too short to learn a merge"):
        bpe_on_text_file(path)


def test_gpt_on_a_small_file(tmp_path):
    """What notebook 7's MY_TEXT_FILE cell runs, with a tiny model and a few steps."""
    path = write(tmp_path, (PROSE * 30).encode())
    config = GPTConfig(context_length=16, n_layers=1, n_heads=2, d_model=16)
    run = gpt_on_text_file(path, steps=20, vocab_size=300, config=config,
                           train_config=TrainConfig(batch_size=4, eval_every=10, fast=False),
                           max_new_tokens=12, progress_bar=False)
    assert run.tokenizer.vocab_size == 300 and run.model.config.vocab_size == 300
    assert run.model.config.context_length == 16
    assert len(run.history.losses) == 20 and run.history.val_losses[-1] < run.history.val_losses[0] + 1
    assert run.history.losses[-1] < run.history.losses[0]  # it learned something
    assert len(run.tokenizer.encode(run.sample)) >= 12 or run.sample  # decoded text of prompt + 12 tokens
    again = gpt_on_text_file(path, steps=20, vocab_size=300, config=config,
                             train_config=TrainConfig(batch_size=4, eval_every=10, fast=False),
                             max_new_tokens=12, progress_bar=False)
    assert again.sample == run.sample  # seeded


def test_gpt_on_a_file_too_short(tmp_path):
    path = write(tmp_path, b"Just one short sentence here.")
    with pytest.raises(ValueError, match=re.escape(str(path)) + r".*is \d+ tokens long, expected at least 121 tokens"):
        gpt_on_text_file(path, steps=1, vocab_size=260,
                         config=GPTConfig(context_length=12, n_layers=1, n_heads=1, d_model=8))
    with pytest.raises(ValueError, match="vocab_size is 256"):
        gpt_on_text_file(path, vocab_size=256)


# --- the knob cells of notebooks 1 and 7, run with MY_TEXT_FILE set ----------------------------


def knob_cell(notebook: str) -> str:
    """The source of the notebook's cell that holds `MY_TEXT_FILE = None`."""
    source = (Path(__file__).resolve().parents[2] / "notebooks" / "src" / notebook).read_text(encoding="utf-8")
    cells = [cell for cell in source.split("\n# %%") if "\nMY_TEXT_FILE = None" in cell]
    assert len(cells) == 1, f"{notebook} has {len(cells)} cells with MY_TEXT_FILE = None, expected 1"
    return cells[0].split("\n", 1)[1]


def test_notebook_1_knob_cell(tmp_path, capsys):
    from helpers.text.bpe import BPETokenizer

    path = write(tmp_path, (PROSE * 20).encode())
    off = knob_cell("01_tokenization.py")
    exec(off, {})
    assert "MY_TEXT_FILE = None: nothing read" in capsys.readouterr().out
    on = off.replace("\nMY_TEXT_FILE = None", f"\nMY_TEXT_FILE = {str(path)!r}").replace("MY_MERGES = 1_000", "MY_MERGES = 40")
    corpus = "a tiny corpus, a tiny corpus"
    bpe = BPETokenizer.train(corpus, vocab_size=260)
    exec(on, {"corpus": corpus, "corpus_ids": bpe.encode(corpus), "bpe": bpe})
    out = capsys.readouterr().out
    assert "40 merges learned" in out and "its first line, token by token: The | " in out


def test_notebook_7_knob_cell(tmp_path, capsys):
    from helpers.timing import format_duration

    path = write(tmp_path, (PROSE * 30).encode())
    off = knob_cell("07_gpt.py")
    exec(off, {"GPTConfig": GPTConfig, "format_duration": format_duration})
    assert "MY_TEXT_FILE = None: nothing read" in capsys.readouterr().out
    on = re.sub(r"\nMY_CONFIG = GPTConfig\([^)]*\)[^\n]*",  # the call may span lines
                "\nMY_CONFIG = GPTConfig(context_length=16, n_layers=1, n_heads=2, d_model=16)",
                off.replace("\nMY_TEXT_FILE = None", f"\nMY_TEXT_FILE = {str(path)!r}"))
    on = re.sub(r"\nMY_STEPS = \d+", "\nMY_STEPS = 6", on)
    exec(on, {"GPTConfig": GPTConfig, "format_duration": format_duration})
    out = capsys.readouterr().out
    assert re.search(r"^6 steps, took .*validation loss \d+\.\d\d at step \d+, \d+\.\d\d at the end", out, re.M), out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_read_text_file_refuses_a_named_pipe_without_blocking(tmp_path):
    pipe = tmp_path / "pipe.txt"
    os.mkfifo(pipe)
    outcome = {}

    def read() -> None:
        try:
            read_text_file(pipe)
        except ValueError as error:
            outcome["error"] = str(error)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=5.0)
    assert not thread.is_alive(), "read_text_file blocked on a named pipe"
    assert "is a named pipe, expected a regular UTF-8 text file" in outcome["error"]


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero here")
def test_read_text_file_refuses_a_device():
    with pytest.raises(ValueError, match="'/dev/zero' is a device, expected a regular"):
        read_text_file("/dev/zero")


def test_read_text_file_refuses_a_file_over_the_size_cap(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("a" * 101)
    with pytest.raises(ValueError, match="has 101 bytes, expected at most max_bytes = 100"):
        read_text_file(big, max_bytes=100)
    assert read_text_file(big, max_bytes=101) == "a" * 101
    with pytest.raises(ValueError, match="max_bytes"):
        read_text_file(big, max_bytes=0)
