"""Write notebooks/INSTRUCTORS.md: a core path through the course for a 14-week term of 75-minute
lectures, and each notebook's plan for 50- and 75-minute sessions.

    python tools/lesson_plan.py            # rewrite notebooks/INSTRUCTORS.md
    python tools/lesson_plan.py --check    # exit 1 if it is out of date

The marks live in the notebook sources: every `##` heading ends with `(core)` or `(optional)`.
A class can stop at any `##` or `###` heading (a stop); no two stops are more than
MAX_BETWEEN_STOPS minutes apart. Minutes are estimated as the site's instructors' page estimates
them (tools/site/project.py): prose at 100 words a minute, code at 4 lines a minute, plus the
cell's run time stored in the built notebook by nbclient (0 for a cell the built notebook does
not hold yet). A starting point for planning, not a measured class.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SOURCES = NOTEBOOKS / "src"
PAGE = NOTEBOOKS / "INSTRUCTORS.md"
WEEKS, LECTURE_MINUTES, SHORT_MINUTES = 14, 75, 50
MAX_BETWEEN_STOPS = 25
MARK = re.compile(r"\((core|optional)\)\s*$")
STOP = re.compile(r"^(##|###) (.+)$", re.M)


def _site_project():
    spec = importlib.util.spec_from_file_location("site_project_for_plan", ROOT / "tools/site/project.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SITE = _site_project()


@dataclass
class Part:
    """The stretch of a notebook from one stop (a `##` or `###` heading) to the next."""

    notebook: str
    section: str  # the `##` heading it belongs to, without its mark
    heading: str  # its own heading (= section for the part a `##` heading starts)
    core: bool
    minutes: float = 0.0


def source_cells(name: str) -> list[tuple[str, str]]:
    """(cell type, source) of notebook `name` as the build makes them from notebooks/src."""
    sys.path.insert(0, str(ROOT / "tools"))
    from build_notebooks import parse_cells

    return parse_cells((SOURCES / f"{name}.py").read_text(encoding="utf-8"))


def stored_seconds(name: str) -> dict[str, float]:
    """Run seconds of each code cell of the built notebook, by its source (0 when not built)."""
    path = NOTEBOOKS / f"{name}.ipynb"
    if not path.exists():
        return {}
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return {SITE.source_text(cell): SITE.cell_seconds(cell) for cell in cells if cell["cell_type"] == "code"}


def parts(name: str) -> list[Part]:
    """The notebook's parts in order, from its opening (title and set-up, always core)."""
    seconds = stored_seconds(name)
    found: list[Part] = [Part(name, "(opening)", "title and set-up", True)]
    for kind, source in source_cells(name):
        if kind == "markdown":
            pieces = STOP.split(source)  # text, level, heading, text, level, heading, text ...
            found[-1].minutes += _prose_minutes(pieces[0])
            for level, heading, text in zip(pieces[1::3], pieces[2::3], pieces[3::3], strict=True):
                if level == "##":
                    mark = MARK.search(heading)
                    if mark is None:
                        raise ValueError(f"{name}: the heading '## {heading}' ends with neither "
                                         "(core) nor (optional)")
                    section = heading[: mark.start()].strip()
                    found.append(Part(name, section, section, mark.group(1) == "core"))
                else:
                    found.append(Part(name, found[-1].section, heading.strip(), found[-1].core))
                found[-1].minutes += _prose_minutes(text)
        else:
            found[-1].minutes += (len(source.splitlines()) / SITE.CODE_LINES_PER_MINUTE
                                  + seconds.get(source, 0.0) / 60)
    return found


def _prose_minutes(text: str) -> float:
    return len(re.sub(r"<[^>]+>", " ", text).split()) / SITE.WORDS_PER_MINUTE


def sessions(plan: list[Part], minutes: int) -> list[list[Part]]:
    """Consecutive parts packed into sessions of at most `minutes` (a longer part: alone)."""
    packed: list[list[Part]] = [[]]
    for part in plan:
        if packed[-1] and sum(p.minutes for p in packed[-1]) + part.minutes > minutes:
            packed.append([])
        packed[-1].append(part)
    return [session for session in packed if session]


def names() -> list[str]:
    return [path.stem for path in sorted(SOURCES.glob("[0-9][0-9]_*.py"))]


def _span(session: list[Part]) -> str:
    first, last = session[0], session[-1]
    where = first.heading if first.heading == last.heading else f"{first.heading} -> {last.heading}"
    return f"{where} ({sum(p.minutes for p in session):.0f} min)"


def page() -> str:
    every = {name: parts(name) for name in names()}
    core = [part for name in every for part in every[name] if part.core]
    lectures = sessions(core, LECTURE_MINUTES)
    total = sum(p.minutes for ps in every.values() for p in ps)
    core_total = sum(p.minutes for p in core)
    lines = [
        "# Teaching the course: a term's core path and each notebook's sessions", "",
        "Written by `python tools/lesson_plan.py` from the marks in the notebook sources (every",
        "`##` heading ends with `(core)` or `(optional)`) and the run times stored in the built",
        "notebooks; do not edit by hand. Minutes are estimates, as the site's instructors' page",
        f"makes them: prose at {SITE.WORDS_PER_MINUTE} words a minute, code at "
        f"{SITE.CODE_LINES_PER_MINUTE} lines a minute, plus",
        "the cells' stored run time. A class can stop at any `##` or `###` heading; no two stops",
        f"are more than {MAX_BETWEEN_STOPS} minutes apart.", "",
        f"The whole course: about {total:.0f} min; its core: about {core_total:.0f} min, "
        f"{len(lectures)} lectures of at most {LECTURE_MINUTES} min.", "",
        f"## The core path: {WEEKS} weeks of one {LECTURE_MINUTES}-minute lecture", "",
        "| week | notebook | from -> to |", "|---|---|---|",
    ]
    for week, lecture in enumerate(lectures, start=1):
        by_notebook: dict[str, list[Part]] = {}
        for part in lecture:
            by_notebook.setdefault(part.notebook, []).append(part)
        for name, session in by_notebook.items():
            lines.append(f"| {week} | {name} | {_span(session)} |")
    lines += ["", f"Weeks {len(lectures) + 1} to {WEEKS}: review, or optional sections of your choice."
              if len(lectures) < WEEKS else "", "## Each notebook in sessions", ""]
    for name, plan in every.items():
        optional = [p.section for p in plan if not p.core and p.heading == p.section]
        lines += [f"### {name}", "",
                  f"Core: about {sum(p.minutes for p in plan if p.core):.0f} min; optional: "
                  + (", ".join(optional) or "none") + ".", ""]
        for minutes in (SHORT_MINUTES, LECTURE_MINUTES):
            spans = "; ".join(f"session {i}: {_span(s)}" for i, s in enumerate(sessions(plan, minutes), 1))
            lines.append(f"- **{minutes}-minute sessions**: {spans}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    parser.add_argument("--parts", action="store_true", help="print every part's minutes")
    args = parser.parse_args(argv)
    if args.parts:
        for name in names():
            for part in parts(name):
                print(f"{name} | {'core' if part.core else 'opt '} | {part.minutes:5.1f} | {part.heading}")
        return 0
    text = page()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python tools/lesson_plan.py")
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
