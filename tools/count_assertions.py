"""Count the assertions in the test files, per file and in all: a reorganisation of tests/ must
keep every one (issue 40).

    python tools/count_assertions.py                 # tests/, one line per file, then the total
    python tools/count_assertions.py --total         # the total only
    python tools/count_assertions.py --json out.json # {file: count} plus "TOTAL"

Counted, by reading each file's syntax tree (nothing is run): `assert` statements; calls of
`raises`, `warns` and `deprecated_call` (pytest's, however imported); and calls of any function
whose name starts with `assert_` (`torch.testing.assert_close`, `np.testing.assert_array_equal`,
a test's own `assert_...` helper). An assert inside a helper used by ten tests counts once: the
count is of assertions written, not of assertions run.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALLS = {"raises", "warns", "deprecated_call"}


def _called_name(call: ast.Call) -> str | None:
    """The last name of what `call` calls: `pytest.raises(...)` -> "raises"; None for `f()()`."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def count(source: str) -> int:
    """The number of assertions in one file's source (see the module docstring for what counts)."""
    total = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assert):
            total += 1
        elif isinstance(node, ast.Call):
            name = _called_name(node)
            if name is not None and (name in CALLS or name.startswith("assert_")):
                total += 1
    return total


def count_tree(folder: Path) -> dict[str, int]:
    """{path relative to the repository: assertions} for every .py file under `folder`."""
    if not folder.is_dir():
        raise ValueError(f"folder is {folder}, expected a directory")
    return {str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p): count(p.read_text(encoding="utf-8"))
            for p in sorted(folder.rglob("*.py"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(ROOT / "tests"))
    parser.add_argument("--total", action="store_true", help="print the total only")
    parser.add_argument("--json", help="write {file: count, 'TOTAL': n} to this path")
    args = parser.parse_args(argv)
    counts = count_tree(Path(args.folder).resolve())
    total = sum(counts.values())
    if args.json:
        Path(args.json).write_text(json.dumps({**counts, "TOTAL": total}, indent=1) + "\n")
    if not args.total:
        for name, n in counts.items():
            print(f"{n:6d}  {name}")
    print(f"{total:6d}  TOTAL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
