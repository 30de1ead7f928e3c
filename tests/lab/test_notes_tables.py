"""The lecture notes' printed tables, read from data/notes_tables.txt (notebooks 3 and 7)."""

from __future__ import annotations

import os

import pytest
import torch

from helpers.lab.notes_tables import load_notes_tables, read_notes_tables

GOOD = "# a comment\n\n== matrix_magic W (2, 3): a caption\n1 2 3\n4 5 6.5\n\n== ds246 X (1, 2): x\n0.1 -2\n"


def write(tmp_path, text: str):
    path = tmp_path / "tables.txt"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_course_fixture_holds_the_notes_tables_with_their_shapes():
    mm, ds = load_notes_tables("matrix_magic"), load_notes_tables("ds246")
    assert mm.TOKEN_TABLE.shape == (12, 8) and mm.W_O.shape == (16, 8) and mm.W1.shape == (8, 32)
    assert mm.PROBABILITIES.shape == (4, 12) and ds.X.shape == (4, 6) and ds.V.shape == (4, 4)
    assert mm.W_O.dtype == torch.float64
    # values as on the slides: the first token row, and the notes' slip (0.00 + 0.05 shown as 0.06)
    assert mm.TOKEN_TABLE[0].tolist() == [0.26, 0.38, 0.0, 0.27, 0.18, 0.67, 0.65, 0.57]
    assert mm.SUM_TABLE[0, 2].item() == 0.06 and mm.TOKEN_TABLE[0, 2] + mm.POSITION_TABLE[0, 2] == 0.05


def test_a_small_fixture_reads_back_exactly(tmp_path):
    tables = read_notes_tables(write(tmp_path, GOOD))
    assert set(tables) == {("matrix_magic", "W"), ("ds246", "X")}
    assert torch.equal(tables["matrix_magic", "W"], torch.tensor([[1, 2, 3], [4, 5, 6.5]], dtype=torch.float64))
    assert load_notes_tables("ds246", write(tmp_path, GOOD)).X.tolist() == [[0.1, -2.0]]


@pytest.mark.parametrize("text, message", [
    ("== matrix_magic W (2, 3): c\n1 2 3\n\n", "table W has 1 rows, expected 2"),
    ("== matrix_magic W (1, 3): c\n1 2\n\n", "2 numbers, expected 3"),
    ("== matrix_magic W (1, 2): c\n1 x\n\n", "not a number"),
    ("== matrix_magic W (1, 2): c\n1 nan\n\n", "not finite"),
    ("== matrix_magic W (1, 2): c\n1 inf\n\n", "not finite"),
    ("== matrix magic W (1, 2): c\n1 2\n\n", "is not a header"),
    ("1 2\n", "before any"),
    ("== a W (1, 1): c\n1\n\n== a W (1, 1): c\n2\n\n", "appears twice"),
])
def test_a_lying_or_broken_fixture_is_refused_with_the_table_named(tmp_path, text, message):
    with pytest.raises(ValueError, match=message):
        read_notes_tables(write(tmp_path, text))


def test_unknown_notes_and_unreadable_paths_are_refused(tmp_path):
    with pytest.raises(ValueError, match="notes is 'usf', expected one of"):
        load_notes_tables("usf", write(tmp_path, GOOD))
    with pytest.raises(FileNotFoundError, match="expected a regular file"):
        read_notes_tables(tmp_path)  # a folder
    with pytest.raises(FileNotFoundError, match="expected a regular file"):
        read_notes_tables(tmp_path / "missing.txt")
    big = tmp_path / "big.txt"
    big.write_bytes(b"#" * 1_000_001)
    with pytest.raises(ValueError, match="expected at most"):
        read_notes_tables(big)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need a POSIX system")
def test_a_named_pipe_is_refused_without_blocking(tmp_path):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(FileNotFoundError, match="expected a regular file"):
        read_notes_tables(pipe)
