"""The tables the lecture notes print, read from one fixture instead of typed into cells.

Notebooks 3 and 7 recompute the Matrix Magic and DS 246 notes' printed tables from the notes'
own inputs and say where a table differs. The tables themselves, typed in as on the slides
(their rounding and slips included), live in `data/notes_tables.txt`; one call reads them:

    mm = load_notes_tables("matrix_magic")   # mm.W_O, mm.SUM_TABLE, ... as float64 tensors

The file's format: a table starts with a line `== <notes> <NAME> (<rows>, <columns>): <caption>`,
and its rows follow, one per line. Every row's length and the number of rows are checked against
that header, so a table cut short or typed with a missing number is refused with its name.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import torch

from helpers.text.corpus import data_dir

NOTES_TABLES_FILE = "notes_tables.txt"
HEADER = re.compile(r"== (\w+) (\w+) \((\d+), (\d+)\): (.*)")
MAX_BYTES = 1_000_000  # the fixture is about 10 kB; anything far larger is not it


def load_notes_tables(notes: str, path: str | Path | None = None) -> SimpleNamespace:
    """Every table of `notes` ("matrix_magic", "ds246") as float64 tensors, by name.

    path: the fixture to read (default: the course's `data/notes_tables.txt`).
    """
    tables = read_notes_tables(path)
    found = {name: table for (source, name), table in tables.items() if source == notes}
    if not found:
        known = sorted({source for source, _ in tables})
        raise ValueError(f"notes is {notes!r}, expected one of {known}")
    return SimpleNamespace(**found)


def read_notes_tables(path: str | Path | None = None) -> dict[tuple[str, str], torch.Tensor]:
    """{(notes, NAME): table (rows, columns), float64} for every table in the fixture."""
    path = Path(path) if path is not None else data_dir() / NOTES_TABLES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"notes tables not found at {path}: expected a regular file")
    if path.stat().st_size > MAX_BYTES:
        raise ValueError(f"{path} has {path.stat().st_size:,} bytes, expected at most {MAX_BYTES:,}")
    tables: dict[tuple[str, str], torch.Tensor] = {}
    header: re.Match | None = None
    rows: list[list[float]] = []
    lines = path.read_text(encoding="utf-8").splitlines() + [""]
    for number, line in enumerate(lines, start=1):
        if line.startswith("#"):
            continue
        if line.startswith("=="):
            header, rows = _parse_header(line, path, number), []
        elif line.strip() and header is None:
            raise ValueError(f"{path}, line {number}: numbers before any '== notes NAME (r, c):' header")
        elif line.strip():
            rows.append(_parse_row(line, header, path, number))
        elif header is not None:  # a blank line ends a table
            key = (header.group(1), header.group(2))
            if key in tables:
                raise ValueError(f"{path}: table {key[0]} {key[1]} appears twice")
            tables[key] = _finish_table(rows, header, path)
            header = None
    return tables


def _parse_header(line: str, path: Path, number: int) -> re.Match:
    header = HEADER.fullmatch(line)
    if header is None:
        raise ValueError(f"{path}, line {number}: {line!r} is not a header of the form "
                         "'== notes NAME (rows, columns): caption'")
    return header


def _parse_row(line: str, header: re.Match, path: Path, number: int) -> list[float]:
    name, columns = header.group(2), int(header.group(4))
    try:
        row = [float(value) for value in line.split()]
    except ValueError:
        raise ValueError(f"{path}, line {number} (table {name}): {line!r} holds something that is "
                         "not a number") from None
    if len(row) != columns:
        raise ValueError(f"{path}, line {number} (table {name}): {len(row)} numbers, expected "
                         f"{columns} as its header says")
    if not all(map(float.__eq__, row, row)) or any(abs(value) == float("inf") for value in row):
        raise ValueError(f"{path}, line {number} (table {name}): a value is not finite")
    return row


def _finish_table(rows: list[list[float]], header: re.Match, path: Path) -> torch.Tensor:
    name, n_rows = header.group(2), int(header.group(3))
    if len(rows) != n_rows:
        raise ValueError(f"{path}: table {name} has {len(rows)} rows, expected {n_rows} as its "
                         "header says")
    return torch.tensor(rows, dtype=torch.float64)
