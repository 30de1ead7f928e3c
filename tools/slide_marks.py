"""Propose slide boundaries from the headings and write them into the notebook sources.

    python tools/slide_marks.py            # every notebooks/src/NN_name.py
    python tools/slide_marks.py 03 07      # those whose name contains one of these

A first draft for a deck, to be read and edited by hand: it marks only the cells that have no
`slideshow=` yet, so it never overwrites a mark an author chose. The rules (CONTRIBUTING,
"Slides"): a markdown cell that opens with a `#` or `##` heading, or holds a `##` heading, starts
a slide; any other markdown cell starts a subslide (reveal.js's step down); a code cell is a
fragment, shown on its prose's slide at the next key press. The set-up cell stays unmarked
(it must read exactly `# %% [setup]`), and so do speaker notes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "notebooks" / "src"
HEADER = re.compile(r"^# %%(?: \[markdown\])?$")  # a cell header without options
SLIDE_HEADING = re.compile(r"^# #{1,2} ", re.M)
OPENING_HEADING = re.compile(r"^# #{1,2} ")


def proposed_type(header: str, body: list[str]) -> str:
    """The slide_type the rules give a cell with this `header` line and `body` lines."""
    if not header.endswith("[markdown]"):
        return "fragment"
    text = "\n".join(body)
    first = next((line for line in body if line.strip() not in ("", "#")), "")
    if OPENING_HEADING.match(first) or SLIDE_HEADING.search(text):
        return "slide"
    return "subslide"


def mark(text: str) -> str:
    """`text` (a percent-format source) with a slide mark on every cell header that has none."""
    if not isinstance(text, str):
        raise TypeError(f"text is {type(text).__name__}, expected a notebook source (str)")
    lines = text.split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith("# %%")]
    for n, start in enumerate(starts):
        header = lines[start]
        if not HEADER.match(header):  # [setup], or a header that already carries options
            continue
        body = lines[start + 1: starts[n + 1] if n + 1 < len(starts) else len(lines)]
        lines[start] = f'{header} slideshow={{"slide_type": "{proposed_type(header, body)}"}}'
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    sources = sorted(SOURCES.glob("[0-9][0-9]_*.py"))
    if argv:
        sources = [s for s in sources if any(name in s.stem for name in argv)]
    if not sources:
        print(f"no notebook source matched {' '.join(argv)}; the sources are in {SOURCES}")
        return 2
    for source in sources:
        text = source.read_text(encoding="utf-8")
        marked = mark(text)
        if marked != text:
            source.write_text(marked, encoding="utf-8")
            print(f"{source.name}: slide marks proposed; read them before committing")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
