"""Peak memory of each notebook against the laptop budget: every notebook under 2 GB, so that the
whole course runs on an 8 GB laptop (one notebook at a time, beside JupyterLab, a browser and the
system).

    python benchmarks/bench_memory.py                    # check notebooks/TIMES.md's column
    python benchmarks/bench_memory.py --run 11 12        # run these notebooks again and measure

The figures are written by `tools/build_notebooks.py` in its float32 run (a laptop's precision):
the kernel's and its worker processes' proportional memory, summed, at its highest
(`PeakMemory` there). Without `--run` this reads them from `notebooks/TIMES.md`; with `--run`
it runs the named notebooks again in a fresh kernel the same way, in float32, without writing
them, and prints what it measured.

Budget (exit status 1 when missed): every notebook has a figure and each is under 2 GB.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMES = ROOT / "notebooks" / "TIMES.md"
BUDGET_MB = 2048
LAPTOP_GB = 8


def parse_megabytes(text: str) -> int | None:
    """'690 MB' -> 690; '-' (not measured) -> None."""
    if text.strip() == "-":
        return None
    found = re.fullmatch(r"(\d+) MB", text.strip())
    if found is None:
        raise ValueError(f"a memory cell reads {text!r}, expected '<integer> MB' or '-'")
    return int(found.group(1))


def stored_peaks(times_text: str) -> dict[str, int | None]:
    """{notebook: peak MB or None} from TIMES.md's table (None where no figure is written)."""
    peaks = {}
    for line in times_text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if re.fullmatch(r"\d\d_\w+", cells[0]):
            peaks[cells[0]] = parse_megabytes(cells[3]) if len(cells) == 4 else None
    return peaks


def over_budget(peaks: dict[str, int | None], budget_mb: int = BUDGET_MB) -> list[str]:
    """What breaks the budget, one line each: a notebook without a figure, or over `budget_mb`."""
    if not peaks:
        return ["no notebook rows found"]
    problems = [f"{name}: no peak memory measured (rebuild it with tools/build_notebooks.py "
                "in float32)" for name, mb in peaks.items() if mb is None]
    problems += [f"{name}: {mb} MB, over the {budget_mb} MB budget"
                 for name, mb in peaks.items() if mb is not None and mb > budget_mb]
    return problems


def measure(names: list[str]) -> dict[str, int]:
    """Run the notebooks whose names contain one of `names` again, in float32; their peak MB."""
    os.environ["COURSE_PRECISION"] = "fp32"  # the kernel inherits it: a laptop's precision
    spec = importlib.util.spec_from_file_location("build_notebooks", ROOT / "tools" / "build_notebooks.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    peaks = {}
    for source in sorted(build.SOURCES.glob("[0-9][0-9]_*.py")):
        if any(name in source.stem for name in names):
            seconds, peak_bytes = build.execute(build.to_notebook(source))
            peaks[source.stem] = -(-peak_bytes // 1024**2)
            print(f"{source.stem}: {peaks[source.stem]} MB in {seconds:.0f} s", flush=True)
    return peaks


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs="+", metavar="NAME", help="measure these notebooks again")
    args = parser.parse_args(argv)
    peaks = measure(args.run) if args.run else stored_peaks(TIMES.read_text(encoding="utf-8"))
    if args.run and not peaks:
        print(f"no notebook source matched {args.run}", file=sys.stderr)
        return 1
    for name, mb in sorted(peaks.items()):
        print(f"{name:28s} {'-' if mb is None else f'{mb} MB':>8s}")
    measured = [mb for mb in peaks.values() if mb is not None]
    if measured:
        print(f"largest: {max(measured)} MB of the {BUDGET_MB} MB budget "
              f"(one notebook at a time on a {LAPTOP_GB} GB laptop)")
    problems = over_budget(peaks)
    for problem in problems:
        print(f"over budget: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
