"""benchmarks/bench_memory.py: every notebook's stored peak memory is under the laptop budget."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_memory", ROOT / "benchmarks" / "bench_memory.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

TABLE = """| notebook | float32 | bf16 | peak memory (float32) |
|---|---|---|---|
| 01_tokenization | 6 s | 6 s | 410 MB |
| 11_distributed | 24 s | 23 s | 2100 MB |
| 12_frontier_decoder | 22 s | 22 s | - |
"""


def test_the_table_reads_into_megabytes_with_none_where_unmeasured():
    assert bench.stored_peaks(TABLE) == {"01_tokenization": 410, "11_distributed": 2100,
                                         "12_frontier_decoder": None}
    assert bench.stored_peaks("| 01_tokenization | 6 s | 6 s |\n") == {"01_tokenization": None}


def test_a_notebook_over_budget_or_unmeasured_is_reported():
    problems = bench.over_budget(bench.stored_peaks(TABLE))
    assert problems == ["12_frontier_decoder: no peak memory measured (rebuild it with "
                        "tools/build_notebooks.py in float32)",
                        "11_distributed: 2100 MB, over the 2048 MB budget"]
    assert bench.over_budget({"01_tokenization": 2048}) == []
    assert bench.over_budget({}) == ["no notebook rows found"]


@pytest.mark.parametrize("cell", ["2 GB", "12.5 MB", ""])
def test_a_memory_cell_that_is_not_megabytes_is_refused(cell):
    with pytest.raises(ValueError, match=r"a memory cell reads .*, expected '<integer> MB' or '-'"):
        bench.parse_megabytes(cell)


def test_every_notebook_fits_the_laptop_budget():
    """The stored figures (tools/build_notebooks.py's float32 run): each notebook under 2 GB."""
    peaks = bench.stored_peaks((ROOT / "notebooks" / "TIMES.md").read_text(encoding="utf-8"))
    notebooks = {path.stem for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert set(peaks) == notebooks
    assert bench.over_budget(peaks) == []
