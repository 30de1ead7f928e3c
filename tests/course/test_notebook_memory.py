"""tools/build_notebooks.py measures each notebook's peak memory (its kernel and the workers the
kernel starts) and keeps it in notebooks/TIMES.md beside the run times."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("psutil", reason="the build measures memory with psutil (JupyterLab brings it)")
pytest.importorskip("jupytext", reason="the build reads the sources with jupytext (the 'test' extra)")


def load_build_module():
    spec = importlib.util.spec_from_file_location("build_notebooks_memory", ROOT / "tools" / "build_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = load_build_module()
MB = 1024**2
OLD_TIMES = """# Time to Restart and Run All

| notebook | float32 | bf16 |
|---|---|---|
| 01_tokenization | 6 s | 6 s |
| 07_gpt | 35 s | 27 s |
"""


def hold_memory(megabytes: int, seconds: float) -> list[str]:
    """A child Python that writes `megabytes` of memory (so it is resident) and holds it."""
    return [sys.executable, "-c", f"import time; block = b'x' * ({megabytes} * 2**20); time.sleep({seconds})"]


def test_the_peak_counts_what_a_child_process_holds():
    with build.PeakMemory(interval=0.02) as big:
        subprocess.run(hold_memory(300, 1.0), check=True)
    with build.PeakMemory(interval=0.02) as small:
        subprocess.run(hold_memory(1, 1.0), check=True)
    assert big.peak_bytes >= 300 * MB
    assert small.peak_bytes < 100 * MB
    assert big.peak_bytes - small.peak_bytes >= 290 * MB


def test_the_peak_sums_processes_running_together():
    with build.PeakMemory(interval=0.02) as memory:
        workers = [subprocess.Popen(hold_memory(200, 1.5)) for _ in range(2)]
        for worker in workers:
            worker.wait()
    assert memory.peak_bytes >= 380 * MB, "two workers holding 200 MB each at once"


@pytest.mark.parametrize("interval", [0, -1.0])
def test_the_sampler_refuses_an_interval_that_is_not_positive(interval):
    with pytest.raises(ValueError, match=rf"interval is {interval!r}, expected a positive number"):
        build.PeakMemory(interval)


@pytest.mark.parametrize(("peak", "shown"), [(1, "10 MB"), (10 * MB, "10 MB"), (10 * MB + 1, "20 MB"),
                                             (1950 * MB, "1950 MB")])
def test_memory_is_written_in_megabytes_rounded_up_to_ten(peak, shown):
    assert build.format_memory(peak) == shown


@pytest.mark.parametrize("peak", [0, -5, 1.5, True, "1 GB"])
def test_memory_formatting_refuses_what_is_not_a_positive_byte_count(peak):
    with pytest.raises(ValueError, match=r"peak_bytes is .*, expected a positive number of bytes"):
        build.format_memory(peak)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_times_file_from_before_the_memory_column_still_reads(newline):
    rows = build.read_times(OLD_TIMES.replace("\n", newline))
    assert rows == {"01_tokenization": {"fp32": "6 s", "bf16": "6 s", "memory": "-"},
                    "07_gpt": {"fp32": "35 s", "bf16": "27 s", "memory": "-"}}


@pytest.fixture
def scratch_course(tmp_path, monkeypatch):
    """The build module writing TIMES.md and README.md in tmp_path."""
    (tmp_path / "notebooks").mkdir()
    times = tmp_path / "notebooks" / "TIMES.md"
    times.write_text(OLD_TIMES)
    (tmp_path / "README.md").write_text("| 7 | [GPT](notebooks/07_gpt.ipynb) | train | 35 s (bf16: 27 s) | CPU |\n")
    monkeypatch.setattr(build, "TIMES", times)
    monkeypatch.setattr(build, "ROOT", tmp_path)
    return tmp_path


def test_the_float32_run_writes_the_peak_and_the_bf16_run_keeps_it(scratch_course):
    build.record_time("07_gpt", 33.4, "fp32", 1234 * MB)
    build.record_time("07_gpt", 26.6, "bf16", 2000 * MB)  # not a laptop's precision: not recorded
    rows = build.read_times((scratch_course / "notebooks" / "TIMES.md").read_text())
    assert rows["07_gpt"] == {"fp32": "33 s", "bf16": "27 s", "memory": "1240 MB"}
    assert rows["01_tokenization"]["memory"] == "-"
    text = (scratch_course / "notebooks" / "TIMES.md").read_text()
    assert "| notebook | float32 | bf16 | peak memory (float32) |" in text
    assert "| 07_gpt | 33 s | 27 s | 1240 MB |" in text
    assert "33 s (bf16: 27 s)" in (scratch_course / "README.md").read_text()
