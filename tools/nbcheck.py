#!/usr/bin/env python3
"""Notebook hygiene report for the course notebooks.

Usage: python3 tools/nbcheck.py [NOTEBOOK_DIR]   (default: notebooks)

Prints one line per finding and a summary; exits 1 when a finding is an error.
Checks only what a reader of the stored notebook would notice: it runs nothing.
"""
import json
import re
import sys
from pathlib import Path

MACHINE_PATH = re.compile(r"(?<![\w.:/~])/(?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_.-]+|site-packages/")
MARKER = re.compile(r"#\s*NBVAL_(SKIP|IGNORE_OUTPUT|RAISES_EXCEPTION)")
WIDGET_FAIL = re.compile(r"Error displaying widget|Widget Javascript not detected|A Jupyter widget could not be displayed")
MAX_BYTES = 3_000_000
# A printed error, gap or difference at float round-off level: its digits change with the CPU's
# vector instructions (AVX-512 vs AVX2 vs none) and thread count, so strict nbval fails elsewhere.
ROUNDOFF = re.compile(r"(error|err|diff|difference|gap|deviation|mismatch|max\s*\|)[^\n]{0,60}?"
                      r"(?<![\w.])(\d(?:\.\d+)?e-(?:0?[6-9]|[1-9]\d))\b", re.IGNORECASE)


def text_of(output):
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    data = output.get("data", {})
    return "".join(data.get("text/plain", "")) + "".join(data.get("text/html", ""))


def check(path):
    errors, warnings = [], []
    size = path.stat().st_size
    if size > MAX_BYTES:
        warnings.append(f"{size/1e6:.1f} MB on disk: large outputs make diffs and reviews painful")
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except Exception as exc:
        return [f"not valid JSON: {exc}"], warnings
    cells = nb.get("cells", [])
    if not cells:
        return ["no cells"], warnings
    if cells[0].get("cell_type") != "markdown" or not "".join(cells[0].get("source", "")).lstrip().startswith("#"):
        warnings.append("first cell is not a markdown title")
    counts = []
    for i, cell in enumerate(cells):
        src = "".join(cell.get("source", ""))
        where = f"cell {i}"
        if MACHINE_PATH.search(src):
            warnings.append(f"{where}: source names an absolute path: {MACHINE_PATH.search(src).group(0)}")
        if cell.get("cell_type") != "code":
            continue
        if src.strip():
            counts.append(cell.get("execution_count"))
        m = MARKER.search(src)
        if m:
            lines = src.splitlines()
            line = next(text for text in lines if "NBVAL_" in text)
            if len(line.split("NBVAL_", 1)[1].split(None, 1)) > 1:
                errors.append(f"{where}: text after NBVAL_{m.group(1)} on its line: nbval then ignores the marker; put the reason on the next line")
            elif sum(1 for text in lines if text.strip().startswith("#")) < 2:
                warnings.append(f"{where}: NBVAL_{m.group(1)} with no comment saying why")
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" and "NBVAL_RAISES_EXCEPTION" not in src:
                errors.append(f"{where}: stored error output {out.get('ename')}: {out.get('evalue', '')[:80]}")
            txt = text_of(out)
            if MACHINE_PATH.search(txt):
                warnings.append(f"{where}: output names an absolute path: {MACHINE_PATH.search(txt).group(0)}")
            m_round = next((m for m in ROUNDOFF.finditer(txt)
                            if not re.search(r"<|≤|below|under|at most", m.group(0))), None)
            if m_round:
                warnings.append(f"{where}: output prints a round-off-level value ({m_round.group(0)[:70]!r}): "
                                "its digits differ on another CPU; print a bound (e.g. '< 1e-6') instead")
            if WIDGET_FAIL.search(txt):
                errors.append(f"{where}: output says a widget failed to display")
            if "Traceback (most recent call last)" in txt and "NBVAL_RAISES_EXCEPTION" not in src:
                warnings.append(f"{where}: output holds a traceback")
    if any(c is None for c in counts):
        errors.append("some code cells were never executed: run Restart and Run All before committing")
    elif counts and counts != list(range(1, len(counts) + 1)):
        errors.append(f"execution counts are {counts[:6]}...: not one clean Restart and Run All")
    body = " ".join("".join(c.get("source", "")) for c in cells if c.get("cell_type") == "markdown").lower()
    if "check your understanding" not in body:
        warnings.append("no 'Check your understanding' section")
    return errors, warnings


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "notebooks")
    books = sorted(p for p in root.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if not books:
        print(f"nbcheck: no notebooks under {root}/")
        return 0
    n_err = 0
    for p in books:
        errors, warnings = check(p)
        for e in errors:
            print(f"ERROR {p}: {e}")
        for w in warnings:
            print(f"warn  {p}: {w}")
        n_err += len(errors)
    print(f"nbcheck: {len(books)} notebooks, {n_err} errors")
    return 1 if n_err else 0


if __name__ == "__main__":
    sys.exit(main())
