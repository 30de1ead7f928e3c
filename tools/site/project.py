"""The course website's MyST project, written from the repository by `python3 course.py site`.

`write_project(root, target)` writes into `target`: `myst.yml` (the table of contents: the landing
page, every notebook, the sources, and in the instructor's edition the instructors' page), those
Markdown pages, and a copy of
every committed notebook with its stored outputs, a Colab link under its title, and each widget's
output replaced by a note (the static figure the notebook draws before every widget is the
widget's fallback, see CONTRIBUTING.md). Nothing is executed. Standard library only.

Two editions. The instructor's shows each exercise's solution as plain code; the student's
(`course.py site --student`) blanks it as `course.student_notebook` does, drops hidden tests and
the outputs of answer and test cells, keeps every other stored output (where a cell runs on the
student's answer once it passes, its line says so instead of "using your X"), and has no page
for instructors. Neither shows the
test markers (`# NBVAL_*`, nbgrader's `### BEGIN/END SOLUTION` and `### BEGIN/END HIDDEN TESTS`)
as page text. Robust to the older form too, where a solution sat in a markdown "Solution" reveal.

The instructors' page says where each notebook can stop in a 50-minute class. The estimate is
per `## ` section: prose words at 100 a minute (read and explained), code lines at 4 a minute
(read, run and discussed), plus the section's measured run time (the cells' `execution`
timestamps that nbclient stored when the notebook was built). It is a starting point, not a
measurement of a class.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

CLASS_MINUTES = 50
WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE = 100, 4
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ('<p class="widget-note">An interactive widget goes here: run the notebook '
               "(JupyterLab or Colab) to move its controls. The figure just above is the same "
               "drawing, static.</p>")
# Lines that steer the tests, not the reader: nbval's cell comments and nbgrader's markers.
MARKER_LINE = re.compile(r"^[ \t]*(?:#[ \t]*NBVAL_\w+|### (?:BEGIN|END) (?:SOLUTION|HIDDEN TESTS))\b.*(?:\n|$)",
                         re.M)
CHECK_CALL = re.compile(r"^check\(", re.M)
# A cell that runs on the student's answer once it passes, else on the course's version, and what
# the instructor's run (every answer written) printed there.
YOURS_OR = re.compile(r"\byours_or\(")
YOURS_PASSED = re.compile(r"using your (\w+) from here on \(it passes ([\w.]+)\)")
# The older form's solution: a markdown reveal, `<details><summary>Solution</summary>...</details>`.
SOLUTION_REVEAL = re.compile(r"<details>\s*<summary>\s*Solution\s*</summary>.*?</details>[ \t]*\n?",
                             re.S | re.I)
# The address the course names until it has a public home (the README's "In Colab"). Written in
# two halves on purpose: `course.py publish` rewrites every literal address in the course, and
# this one must stay the placeholder, so that a published site drops the caveat.
PLACEHOLDER_SLUG = "transformer-course/" + "transformer-course"
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
        if is_speaker_notes(cell):
            continue
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


def colab_caveat(slug: str) -> str:
    """What a reader must know about the Colab links: nothing once the course is published."""
    if slug != PLACEHOLDER_SLUG:
        return ""
    return (f"The Colab links need the course at its public address, and "
            f"`https://github.com/{slug}` is a placeholder until it has one: **they do not work "
            "yet**. Whoever hosts the course runs `python3 course.py publish "
            "https://github.com/OWNER/REPO` (the README's \"In Colab\"), which points them there.")


def without_colab_column(markdown: str) -> str:
    """The README's notebook table without its last column when that is the Colab one."""
    lines = markdown.splitlines()
    header = next((line for line in lines if line.startswith("|")), "")
    if not re.search(r"\|\s*Colab\s*\|\s*$", header):
        return markdown
    return "\n".join(re.sub(r"[^|]*\|\s*$", "", line) if line.startswith("|") else line
                     for line in lines)


def source_text(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def is_exercise_cell(cell: dict) -> bool:
    """An answer cell or a test cell: by nbgrader's metadata, or by its markers and check call."""
    if cell["cell_type"] != "code":
        return False
    grader = cell.get("metadata", {}).get("nbgrader", {})
    source = source_text(cell)
    return bool(grader.get("solution") or grader.get("grade") or CHECK_CALL.search(source)
                or "### BEGIN SOLUTION" in source or "### BEGIN HIDDEN TESTS" in source)


def without_markers(source: str) -> str:
    """`source` without its test-marker lines (what nbval and nbgrader read, not the student)."""
    return MARKER_LINE.sub("", source)


def as_student_sees_it(output: dict) -> dict:
    """A stored output of a cell that calls `yours_or(...)`, as it reads above an empty stub: the
    instructor's run says "using your X from here on (it passes NAME)", which a student's page
    must not claim; it says instead that the cell uses their X once it passes."""
    if output.get("output_type") != "stream":
        return output
    text = "".join(output["text"]) if isinstance(output["text"], list) else output["text"]
    return {**output, "text": YOURS_PASSED.sub(
        r"this cell uses your \1 once it passes \2; until then, the course's own version", text)}


def is_speaker_notes(cell: dict) -> bool:
    """True for a cell of the instructor's speaker notes (slide_type "notes"), which only the
    slides show (`course.py slides`); the site, like the student edition, leaves them out."""
    return cell.get("metadata", {}).get("slideshow", {}).get("slide_type") == "notes"


def student_edition(notebook: dict, student_notebook: Callable[[dict], dict]) -> dict:
    """`student_notebook(notebook)` (solutions blanked, hidden tests gone, outputs cleared), with
    the stored outputs of every cell but the answer and test cells put back, those of the cells
    that choose between the student's answer and the course's version as a student's run would
    say it (see `as_student_sees_it`); no Solution reveal (the older form, removed before
    `student_notebook`, which refuses a solution marker in markdown)."""
    notebook["cells"] = [cell for cell in notebook["cells"] if not is_speaker_notes(cell)]
    for cell in notebook["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = SOLUTION_REVEAL.sub("", source_text(cell))
    original = copy.deepcopy(notebook["cells"])
    blanked = student_notebook(notebook)
    for before, after in zip(original, blanked["cells"], strict=True):  # one for one
        if after["cell_type"] == "code" and not is_exercise_cell(before):
            outputs = before.get("outputs", [])
            if YOURS_OR.search(source_text(before)):
                outputs = [as_student_sees_it(output) for output in outputs]
            after["outputs"] = outputs
            after["execution_count"] = before.get("execution_count")
    return blanked


def site_notebook(notebook: dict, colab: str, student_notebook: Callable[[dict], dict] | None = None
                  ) -> dict:
    """The notebook as the site shows it: the edition's exercises (see the module docstring), no
    test markers, a Colab link under the title (the student's: how to open it instead), widget
    views as a note."""
    notebook["cells"] = [cell for cell in notebook["cells"] if not is_speaker_notes(cell)]  # the decks'
    if student_notebook is not None:
        notebook = student_edition(notebook, student_notebook)
    for cell in notebook["cells"]:
        cell["source"] = without_markers(source_text(cell))
    slug = colab.split("/github/", 1)[-1].split("/blob/", 1)[0]
    if student_notebook is None:
        text = f"[Open in Colab]({colab}) (run it there, or locally with `python3 course.py lab`)."
        text += f" {colab_caveat(slug)}" if colab_caveat(slug) else ""
    else:  # the repository's copy holds the solutions: the student runs the handed-out folder
        text = ("Run this notebook from the student folder your instructor handed out: "
                "`python3 course.py lab` inside it opens it in JupyterLab.")
    opening = {"cell_type": "markdown", "metadata": {}, "id": f"colab-{colab.rsplit('/', 1)[-1][:2]}",
               "source": text}
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
        "`python3 course.py student DIR` (default `student/`) writes a folder that runs on its "
        "own: the student notebooks in `DIR/notebooks`, the `helpers` package and the data they "
        "import, the files that install them, `course.py` and a README with one command. In an "
        "answer cell the code between nbgrader's solution markers becomes `# YOUR CODE HERE` and `raise NotImplementedError()`, hidden tests go and every "
        "output is cleared; the hints stay. No full notebook and no notebook source is in the "
        "folder, but `helpers/` is the course's own library, which holds the course's version of "
        "many exercises' ideas: the folder's README says so, and that the grader does not accept "
        "an answer that calls it. Zip the folder or push it to a repository of its own. Run the "
        "command again on the same folder to refresh it: only files it wrote and nobody changed "
        "since are replaced (`.course-edition.json` lists them); the students' files, `.venv` "
        "and `.git` stay, and a changed file is kept and listed (`--force` replaces it, keeping "
        "the student's version beside it).", "",
        "The students open it with `python3 course.py lab` inside the folder (you can try it "
        "from the course with `python3 course.py lab DIR`). Each exercise's check says \"not "
        "attempted\" until it is solved, and the cells after it use the course's own version "
        "and say so, so the notebook always runs to the end.", "",
        "`python3 course.py site --student` builds this website without the solutions, the "
        "hidden tests or the outputs of answer and test cells, for the students to read.", "",
        "## Grading with nbgrader", "",
        "The committed notebooks carry nbgrader's cell metadata: each answer cell is an "
        "autograded answer with its solution between nbgrader's markers, each `check(...)` cell after "
        "it a locked, graded test cell with its points (and hidden tests where they help). "
        "nbgrader's own commands work unchanged; install them with the extra "
        "`pip install .[grade]` (in the course's `.venv`: `.venv/bin/python -m pip install -e "
        "'.[grade]' -c constraints.txt`). In a grading folder with the usual "
        "`source/ASSIGNMENT/` layout:", "",
        "```bash",
        "mkdir -p source/week1 && cp COURSE/notebooks/03_attention.ipynb source/week1/",
        "nbgrader generate_assignment week1   # release/week1/: the student notebooks",
        "# the students' work goes in submitted/STUDENT/week1/, then",
        "nbgrader autograde week1",
        "nbgrader generate_feedback week1     # feedback/STUDENT/week1/: which check failed",
        "```", "",
        "`generate_assignment` writes the same student notebooks as `course.py student`. The "
        "autograder runs the notebooks, so it needs the course package where it runs (the "
        "course's `.venv` has it).", ""])


def write_project(root: Path, target: Path, repo_slug: str, python: str,
                  student_notebook: Callable[[dict], dict] | None = None) -> list[str]:
    """Write the MyST project into `target`; returns the notebooks' file names.

    python: the interpreter that runs the theme (`render.py`) when myst builds the HTML.
    student_notebook: None for the instructor's edition; for the student's, the function that
    makes a notebook's student copy (`course.student_notebook`).
    """
    readme = (root / "README.md").read_text(encoding="utf-8")
    paths = sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise ValueError(f"no notebooks/NN_name.ipynb under {root}")
    (target / "notebooks").mkdir(parents=True, exist_ok=True)
    notebooks = {}
    for path in paths:
        notebooks[path.name] = json.loads(path.read_text(encoding="utf-8"))
        try:
            shown = site_notebook(json.loads(path.read_text(encoding="utf-8")),
                                  colab_url(repo_slug, path.name), student_notebook)
        except ValueError as error:
            raise ValueError(f"notebooks/{path.name}: {error}") from None
        (target / "notebooks" / path.name).write_text(json.dumps(shown, indent=1), "utf-8")
    title = readme.splitlines()[0].lstrip("# ").strip()
    opening = readme.split("\n## ", 1)[0].split("\n", 1)[1].strip()
    table = readme_section(readme, "The notebooks")
    caveat = colab_caveat(repo_slug)
    if student_notebook is not None:  # the Colab links open the instructor's notebooks
        table = without_colab_column(table)
        caveat = ("This is the student edition: the exercises are yours to write. Open the "
                  "notebooks from the folder your instructor handed out (`python3 course.py lab` "
                  "inside it).")
    pages = ["sources.md"] if student_notebook is not None else ["sources.md", "instructors.md"]
    see_also = ("See also [the sources](sources.md)." if student_notebook is not None else
                "See also [the sources](sources.md) and [the page for instructors](instructors.md).")
    (target / "index.md").write_text("\n\n".join([
        f"# {title}", opening, "## The notebooks", table, *([caveat] if caveat else []), see_also]),
        "utf-8")
    sources = readme_section(readme, "Sources")
    (target / "sources.md").write_text(f"# Sources\n\n{sources}\n\n{citations(root, sources)}\n",
                                       "utf-8")
    if "instructors.md" in pages:  # the student site has no page for instructors
        (target / "instructors.md").write_text(instructors_page(root, list(notebooks), notebooks),
                                               "utf-8")
    else:
        (target / "instructors.md").unlink(missing_ok=True)  # an earlier instructor's build's
    toc = "\n".join(f"    - file: {name}" for name in
                    ["index.md", *(f"notebooks/{name}" for name in notebooks), *pages])
    (target / "myst.yml").write_text(
        f"version: 1\nproject:\n  title: {json.dumps(title)}\n  toc:\n{toc}\n"
        "site:\n  template: ./theme\n", "utf-8")
    edition = "student" if student_notebook is not None else "instructor"
    (target / "edition.json").write_text(json.dumps({"edition": edition}), "utf-8")
    theme = target / "theme"
    theme.mkdir(exist_ok=True)
    shutil.copy(Path(__file__).with_name("render.py"), theme / "render.py")
    render = f'"{python}" render.py'.replace("'", "''")  # YAML's single quotes; a path may hold spaces
    (theme / "template.yml").write_text(f"myst: v1\nkind: site\nbuild:\n  render: '{render}'\n",
                                        "utf-8")
    return list(notebooks)
