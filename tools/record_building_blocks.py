"""Write helpers/lab/exercises/building_blocks.py from what the reference solutions call.

    python tools/record_building_blocks.py            # runs every notebook (a few minutes)
    python tools/record_building_blocks.py 04 07      # only these; the others keep their rows

Runs the instructor's notebooks (the reference solutions in their answer cells) in fresh kernels
with COURSE_RECORD_CALLS set, so that every check notes which of the course's functions the
answer called; those are the exercise's building blocks, and any other course call fails the
check (helpers/lab/exercises/watch.py). Nothing in the notebooks is changed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "helpers" / "lab" / "exercises" / "building_blocks.py"


def record(notebooks: list[Path]) -> dict[str, set[str]]:
    """{exercise: the course functions its reference answer called} over `notebooks`."""
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "calls.jsonl"
        os.environ["COURSE_RECORD_CALLS"] = str(log)
        try:
            for path in notebooks:
                print(f"running {path.name}", flush=True)
                nb = nbformat.read(path, as_version=4)
                NotebookClient(nb, timeout=600, kernel_name="python3",
                               resources={"metadata": {"path": str(path.parent)}}).execute()
        finally:
            os.environ.pop("COURSE_RECORD_CALLS", None)
        found: dict[str, set[str]] = {}
        for line in log.read_text(encoding="utf-8").splitlines() if log.exists() else []:
            row = json.loads(line)
            found.setdefault(row["exercise"], set()).update(row["calls"])
        return found


def write_table(rows: dict[str, set[str]]) -> None:
    head = TABLE.read_text(encoding="utf-8").split("BUILDING_BLOCKS: dict")[0]
    body = ["BUILDING_BLOCKS: dict[str, tuple[str, ...]] = {"]
    for exercise in sorted(rows):
        names = sorted(rows[exercise])
        if not names:
            continue
        body.append(f"    {exercise!r}: (")
        body += [f"        {name!r}," for name in names]
        body.append("    ),")
    body.append("}")
    TABLE.write_text(head + "\n".join(body) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    from helpers.lab.exercises.building_blocks import BUILDING_BLOCKS

    paths = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if argv:
        paths = [p for p in paths if any(p.name.startswith(a) or a in p.stem for a in argv)]
        if not paths:
            print(f"no notebook matches {argv}")
            return 2
    found = record(paths)
    chosen = {p.stem.split("_", 1)[1] for p in paths}
    rows = {name: set(calls) for name, calls in BUILDING_BLOCKS.items()
            if not argv or name.split(".")[0] not in chosen}
    rows.update(found)
    write_table(rows)
    print(f"{len(found)} exercises recorded, {sum(bool(c) for c in found.values())} with building blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
