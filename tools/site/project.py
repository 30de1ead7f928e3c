"""The course website's MyST project, written from the repository by `python3 course.py site`.

`write_project(root, target)` writes into `target`: `myst.yml` (the table of contents: the landing
page, every notebook, the sources, the instructors' page), the three Markdown pages, and a copy of
every committed notebook with its stored outputs, a Colab link under its title, and each widget's
output replaced by a note (the static figure the notebook draws before every widget is the
widget's fallback, see CONTRIBUTING.md). Nothing is executed. Standard library only.

The instructors' page says where each notebook can stop in a 50-minute class. The estimate is
per `## ` section: prose words at 100 a minute (read and explained), code lines at 4 a minute
(read, run and discussed), plus the section's measured run time (the cells' `execution`
timestamps that nbclient stored when the notebook was built). It is a starting point, not a
measurement of a class.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime
from pathlib import Path

CLASS_MINUTES = 50
WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE = 100, 4
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ('<p class="widget-note">An interactive widget goes here: run the notebook '
               "(JupyterLab or Colab) to move its controls. The figure just above is the same "
               "drawing, static.</p>")
KNOB = re.compile(r"^([A-Z][A-Z0-9_]+) = (.+?)\s+#\s*(.*(?:knob|<-).*)$")
ENVIRONMENT_KNOBS = [
    ("COURSE_PRECISION", "`fp32`, `bf16` or `auto` (unset: `auto`)", "what the trainer's "
     "`precision=\"auto\"` means for the whole run: `fp32` trains as a laptop without native "
     "bf16 does (`COURSE_PRECISION=fp32 python3 course.py lab`)"),
    ("TRITON_INTERPRET", "`1` (set by notebook 8 when there is no GPU)", "runs notebook 8's "
     "Triton kernels in Triton's CPU interpreter"),
    ("COURSE_CHROMIUM", "a path", "the Chromium the browser tests drive (default "
     "`/usr/bin/chromium`)"),
]


def readme_section(readme: str, title: str) -> str:
    """The text of the README's `## title` section, without its heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", readme, re.S | re.M)
    if match is None:
        raise ValueError(f"README.md has no '## {title}' section")
    return match.group(1).strip()


def cell_seconds(cell: dict) -> float:
    times = cell.get("metadata", {}).get("execution", {})
    try:
        start = datetime.fromisoformat(times["iopub.status.busy"].replace("Z", "+00:00"))
        end = datetime.fromisoformat(times["iopub.status.idle"].replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return 0.0
    return max((end - start).total_seconds(), 0.0)


def sections(notebook: dict) -> list[tuple[str, float, float]]:
    """(heading, estimated minutes, measured run seconds) of each `## ` section, in order."""
    found: list[list] = [["(opening)", 0.0, 0.0]]
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            for line in source.splitlines():
                if line.startswith("## "):
                    found.append([line[3:].strip(), 0.0, 0.0])
            found[-1][1] += len(re.sub(r"<[^>]+>", " ", source).split()) / WORDS_PER_MINUTE
        elif cell["cell_type"] == "code":
            seconds = cell_seconds(cell)
            found[-1][1] += len(source.splitlines()) / CODE_LINES_PER_MINUTE + seconds / 60
            found[-1][2] += seconds
    return [tuple(section) for section in found if section[1] > 0 or section[0] != "(opening)"]


def stop_points(notebook: dict) -> str:
    """One line: the sections before which each 50-minute class ends, and the whole estimate."""
    elapsed, in_class, stops, listed = 0.0, 0.0, [], sections(notebook)
    for heading, minutes, _ in listed:
        if in_class + minutes > CLASS_MINUTES and in_class > 0:
            stops.append(f"**{heading}**")
            in_class = 0.0
        elapsed += minutes
        in_class += minutes
    run = sum(seconds for _, _, seconds in listed)
    where = f"stop before {', then before '.join(stops)}" if stops else "fits in one class"
    return (f"about {elapsed:.0f} min of class ({len(listed)} sections, {run:.0f} s of "
            f"computing): {where}")


def colab_url(slug: str, name: str) -> str:
    return f"https://colab.research.google.com/github/{slug}/blob/main/notebooks/{name}"


def site_notebook(notebook: dict, colab: str) -> dict:
    """The notebook as the site shows it: a Colab link under the title, widget views as a note."""
    opening = {"cell_type": "markdown", "metadata": {}, "id": f"colab-{colab.rsplit('/', 1)[-1][:2]}",
               "source": f"[Open in Colab]({colab}) (run it there, or locally with "
                         "`python3 course.py lab`)"}
    notebook["cells"].insert(1, opening)
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            if WIDGET_VIEW in output.get("data", {}):
                output["data"] = {"text/html": WIDGET_NOTE, "text/plain": "(widget)"}
    notebook.get("metadata", {}).pop("widgets", None)
    return notebook


def knobs(sources: Path) -> list[str]:
    """Markdown lines: each notebook's named knobs (`NAME = value  # the knob: ...`)."""
    lines = []
    for path in sorted(sources.glob("[0-9][0-9]_*.py")):
        for line in path.read_text(encoding="utf-8").splitlines():
            match = KNOB.match(line)
            if match:
                name, value, why = match.groups()
                lines.append(f"| {path.stem} | `{name} = {value}` | {why.replace('|', '/')} |")
    return lines


def citations(root: Path, sources: str) -> str:
    """Markdown: for each set of notes (the short names of the README's table), the notebooks
    that cite it."""
    texts = {path.stem: path.read_text(encoding="utf-8").lower()
             for path in sorted((root / "notebooks" / "src").glob("[0-9][0-9]_*.py"))}
    lines = ["## Where each is used", ""]
    for short in re.findall(r"^\| (the [^|]+?) \|", sources, re.M):
        using = [name for name, text in texts.items() if short.lower() in text]
        lines.append(f"- **{short}**: " + (", ".join(
            f"[{name}](notebooks/{name}.ipynb)" for name in using) or "not cited yet"))
    return "\n".join(lines)


def instructors_page(root: Path, names: list[str], notebooks: dict[str, dict]) -> str:
    times = (root / "notebooks" / "TIMES.md").read_text(encoding="utf-8")
    times_table = "\n".join(line for line in times.splitlines() if line.startswith("|"))
    stops = [f"- **{name}**: {stop_points(notebooks[name])}" for name in names]
    environment = [f"| `{name}` | {values} | {what} |" for name, values, what in ENVIRONMENT_KNOBS]
    return "\n".join([
        "# For instructors", "",
        "## Time to run each notebook", "",
        "Restart and Run All on a 2-core CPU (from `notebooks/TIMES.md`, which "
        "`tools/build_notebooks.py` keeps):", "", times_table, "",
        f"## Where to stop in a {CLASS_MINUTES}-minute class", "",
        f"Estimated per `## ` section: prose at {WORDS_PER_MINUTE} words a minute, code at "
        f"{CODE_LINES_PER_MINUTE} lines a minute, plus the section's run time measured when the "
        "notebook was built (the cells' stored `execution` timestamps). A starting point for "
        "planning, not a measured class.", "", *stops, "",
        "## The knobs", "",
        "Environment variables:", "",
        "| variable | values | what it does |", "|---|---|---|", *environment, "",
        "Named knobs at the top of a section (change the value, then run the section again):", "",
        "| notebook | knob | what it does |", "|---|---|---|", *knobs(root / "notebooks" / "src"), "",
        "## Handing out the student edition", "",
        "`python3 course.py student DIR` writes every notebook into `DIR` (default `student/`) "
        "with nbgrader's conventions: code between `### BEGIN SOLUTION` and `### END SOLUTION` "
        "becomes `# YOUR CODE HERE` and `raise NotImplementedError`, hidden tests and the "
        "\"Solution\" reveals go, every output is cleared; the hints stay. Hand out `DIR` with "
        "the `helpers` package (the students run `python3 course.py lab`, or Colab's first cell "
        "installs it). Each exercise's check then says \"not attempted\" until it is solved, and "
        "the rest of the notebook still runs.", ""])


def write_project(root: Path, target: Path, repo_slug: str, python: str) -> list[str]:
    """Write the MyST project into `target`; returns the notebooks' file names.

    python: the interpreter that runs the theme (`render.py`) when myst builds the HTML.
    """
    readme = (root / "README.md").read_text(encoding="utf-8")
    paths = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise ValueError(f"no notebooks/NN_name.ipynb under {root}")
    (target / "notebooks").mkdir(parents=True, exist_ok=True)
    notebooks = {}
    for path in paths:
        notebooks[path.name] = json.loads(path.read_text(encoding="utf-8"))
        shown = site_notebook(json.loads(path.read_text(encoding="utf-8")),
                              colab_url(repo_slug, path.name))
        (target / "notebooks" / path.name).write_text(json.dumps(shown, indent=1), "utf-8")
    title = readme.splitlines()[0].lstrip("# ").strip()
    opening = readme.split("\n## ", 1)[0].split("\n", 1)[1].strip()
    (target / "index.md").write_text("\n\n".join([
        f"# {title}", opening, "## The notebooks", readme_section(readme, "The notebooks"),
        "See also [the sources](sources.md) and [the page for instructors](instructors.md)."]),
        "utf-8")
    sources = readme_section(readme, "Sources")
    (target / "sources.md").write_text(f"# Sources\n\n{sources}\n\n{citations(root, sources)}\n",
                                       "utf-8")
    (target / "instructors.md").write_text(instructors_page(root, list(notebooks), notebooks),
                                           "utf-8")
    toc = "\n".join(f"    - file: notebooks/{name}" for name in notebooks)
    (target / "myst.yml").write_text(
        f"version: 1\nproject:\n  title: {json.dumps(title)}\n  toc:\n    - file: index.md\n"
        f"{toc}\n    - file: sources.md\n    - file: instructors.md\n"
        "site:\n  template: ./theme\n", "utf-8")
    theme = target / "theme"
    theme.mkdir(exist_ok=True)
    shutil.copy(Path(__file__).with_name("render.py"), theme / "render.py")
    render = f'"{python}" render.py'.replace("'", "''")  # YAML's single quotes; a path may hold spaces
    (theme / "template.yml").write_text(f"myst: v1\nkind: site\nbuild:\n  render: '{render}'\n",
                                        "utf-8")
    return list(notebooks)
