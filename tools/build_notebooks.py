"""Build the course notebooks from their plain-text sources and run them top to bottom.

    python tools/build_notebooks.py                     # every notebook
    python tools/build_notebooks.py 03_attention        # only those whose name contains "03_attention"
    python tools/build_notebooks.py --no-run 01         # write the cells, keep no outputs

Each notebook is written as `notebooks/src/NN_name.py` in the "percent" format (`# %%` starts a
code cell, `# %% [markdown]` a markdown cell whose lines start with `# `), which diffs and reviews
like any Python file; jupytext reads it (so JupyterLab's jupytext can also pair a source with a
notebook). A cell that is exactly `# %% [setup]` becomes the course's set-up cell
(`helpers.lab.environment.SETUP_CELL`). This script turns each source into `notebooks/NN_name.ipynb`
and executes it in a fresh kernel, as "Restart and Run All" would, storing the real outputs that
nbval later compares, then rewrites notebooks/INSTRUCTORS.md from the new run times
(tools/lesson_plan.py). Run it inside the course's environment (`.venv/bin/python`).

Exercises carry nbgrader's cell metadata, written here from the cells themselves so that the
sources stay plain: a code cell holding `### BEGIN SOLUTION` ... `### END SOLUTION` (inside a
function or class body, so that the blanked student copy still runs) is an autograded answer
cell; the code cell right after it must be the exercise's test cell, `check("notebook.name",
answer)` (optionally with `### BEGIN HIDDEN TESTS` ... `### END HIDDEN TESTS`), which becomes a
locked, graded cell worth the points its checker was registered with
(`@exercise(points=...)`). `nbgrader generate_assignment` and `course.py student` turn these
notebooks into the student edition.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
import threading
import time
from pathlib import Path

import jupytext
import nbformat
import psutil
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SOURCES = NOTEBOOKS / "src"
SETUP_MARKER = "# %% [setup]"
SETUP_TITLE = SETUP_MARKER.removeprefix("# %%").strip()   # what jupytext makes of the marker


# What jupytext itself records of a cell's layout in the source (blank lines), not the cell's.
JUPYTEXT_LAYOUT = {"lines_to_next_cell", "lines_to_end_of_cell_marker", "cell_marker"}
SLIDE_TYPES = ("slide", "subslide", "fragment", "-", "skip", "notes")  # RISE's and nbconvert's


def slide_type(metadata: dict) -> str | None:
    """The cell's `slideshow.slide_type` ("slide", ..., "notes"), or None where it has none."""
    return metadata.get("slideshow", {}).get("slide_type")


def parse_source(text: str) -> list[tuple[str, str, dict]]:
    """Split a percent-format source into (cell_type, source, metadata) triples.

    jupytext reads the format; the course adds three rules: the cell `# %% [setup]` (read by
    jupytext as an empty code cell titled "[setup]") becomes SETUP_CELL, every source loses its
    leading and trailing blank lines, and a cell left empty is dropped. The one metadata kept is
    the slide mark, `slideshow={"slide_type": "slide"}` after `# %%` (or `# %% [markdown]`), which
    RISE and `course.py slides` read; a cell marked "notes" is the instructor's speaker notes.
    Any other option after `# %%` is refused (ValueError naming the cell), so that nothing written
    in a source is silently lost. Where jupytext reads differently from a plain split on `# %%`
    (none of the sources does it today): a commented magic in a code cell (`# %time`, `# !ls`)
    becomes the magic.
    """
    from helpers.lab.setup_cell import SETUP_CELL

    parsed = []
    for index, cell in enumerate(jupytext.reads(text, fmt="py:percent").cells):
        metadata = {key: value for key, value in cell.metadata.items() if key not in JUPYTEXT_LAYOUT}
        if cell.cell_type == "code" and metadata.get("title") == SETUP_TITLE:
            parsed.append(("code", SETUP_CELL, {}))
            continue
        first = cell.source.strip().splitlines()[0][:60] if cell.source.strip() else ""
        unknown = sorted(set(metadata) - {"slideshow"})
        if unknown:
            raise ValueError(f"cell {index} ({first!r}) has options {unknown} after '# %%'; "
                             "expected none, or slideshow={\"slide_type\": ...}")
        kind = slide_type(metadata)
        if "slideshow" in metadata and (set(metadata["slideshow"]) != {"slide_type"}
                                        or kind not in SLIDE_TYPES):
            raise ValueError(f"cell {index} ({first!r}) has slideshow={metadata['slideshow']}; "
                             f"expected {{\"slide_type\": one of {', '.join(SLIDE_TYPES)}}}")
        if kind == "notes" and cell.cell_type != "markdown":
            raise ValueError(f"cell {index} ({first!r}) is a {cell.cell_type} cell marked as "
                             "speaker notes; expected a markdown cell")
        if cell.source.strip("\n"):
            parsed.append((cell.cell_type, cell.source.strip("\n"), metadata))
    return parsed


def parse_cells(text: str) -> list[tuple[str, str]]:
    """The (cell_type, source) pairs of the lesson itself (parse_source's cells without the
    speaker notes, which the students never see): what the lesson plan times and tests read."""
    return [(kind, source) for kind, source, metadata in parse_source(text)
            if slide_type(metadata) != "notes"]


CHECK_CALL = re.compile(r'^check\("([\w.]+)"', re.M)
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
SOLUTION_REVEAL = re.compile(r"<summary>\s*Solution\s*</summary>")


def _nbgrader(grade_id: str, *, solution: bool, grade: bool, points: int | None = None) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": not solution, "schema_version": 3,
            "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return meta


def _check_cell_problem(source: str) -> str | None:
    """Why `source` is not a well-formed test cell (one check call, hidden tests, comments), or None."""
    lines, hidden = [], False
    for line in source.splitlines():
        stripped = line.strip()
        if stripped == HIDDEN_BEGIN:
            hidden = True
        elif stripped == HIDDEN_END:
            hidden = False
        elif not hidden and stripped and not stripped.startswith("#"):
            lines.append(line)
    if len(CHECK_CALL.findall(source)) != 1:
        return "it must call check(...) exactly once"
    if hidden:
        return f"{HIDDEN_BEGIN!r} without {HIDDEN_END!r}"
    if not lines or not lines[0].startswith("check("):
        return "it may hold only the check(...) call, comments and hidden tests"
    return None


HIDDEN_CALL = "from helpers.lab.exercises.grader import hidden_check"


def with_hidden_tests(source: str) -> str:
    """The test cell `source` with the grader's hidden tests appended (helpers/lab/exercises/grader.py):
    the same check again, from a fresh import, on other seeds, with the calls watched."""
    if HIDDEN_BEGIN in source:
        return source
    call = ast.parse(source).body[0].value  # the check(...) call, which _check_cell_problem vouched for
    if len(call.args) < 2:
        raise ValueError(f"check(...) needs the exercise's name and the answer, got: {source}")
    name, answer = ast.literal_eval(call.args[0]), ast.unparse(call.args[1])
    return (f"{source.rstrip()}\n{HIDDEN_BEGIN}\n{HIDDEN_CALL}\n"
            f'hidden_check("{name}", {answer}, globals())\n{HIDDEN_END}')


def add_nbgrader_metadata(nb: nbformat.NotebookNode, name: str) -> None:
    """Mark every exercise's answer cell and test cell as nbgrader expects (see the docstring)."""
    from helpers.lab.exercises import get

    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    seen: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type == "markdown" and SOLUTION_REVEAL.search(cell.source):
            raise ValueError(f"{name}: a 'Solution' reveal in markdown; solutions live in the "
                             f"exercise's code cell between {BEGIN!r} and {END!r}")
    for index, cell in enumerate(code):
        if BEGIN not in cell.source:
            if END in cell.source:
                raise ValueError(f"{name}: {END!r} without {BEGIN!r} in:\n{cell.source}")
            continue
        begins = [line for line in cell.source.splitlines() if line.strip() == BEGIN]
        if any(not line.startswith((" ", "\t")) for line in begins):
            raise ValueError(f"{name}: {BEGIN!r} at the top level of a cell; put the solution "
                             f"inside a function or class body so that the blanked copy runs:\n{cell.source}")
        if cell.source.count(BEGIN) != cell.source.count(END) or CHECK_CALL.search(cell.source):
            raise ValueError(f"{name}: an answer cell needs matched {BEGIN!r}/{END!r} lines and no "
                             f"check(...) call (that goes in the next cell):\n{cell.source}")
        test = code[index + 1] if index + 1 < len(code) else None
        problem = "there is none" if test is None else _check_cell_problem(test.source)
        if problem:
            raise ValueError(f"{name}: the code cell after an answer cell must be its test cell "
                             f"(check(...) alone), but {problem}:\n{test.source if test else ''}")
        exercise = CHECK_CALL.search(test.source).group(1)
        if exercise in seen:
            raise ValueError(f"{name}: exercise {exercise!r} has two answer cells")
        seen.add(exercise)
        grade_id = exercise.replace(".", "-")
        test.source = with_hidden_tests(test.source)
        cell.metadata["nbgrader"] = _nbgrader(f"{grade_id}-answer", solution=True, grade=False)
        test.metadata["nbgrader"] = _nbgrader(f"{grade_id}-check", solution=False, grade=True,
                                              points=get(exercise).points)
    for cell in code:
        found = CHECK_CALL.search(cell.source)
        if found and "nbgrader" not in cell.metadata:
            raise ValueError(f"{name}: check({found.group(1)!r}) has no answer cell with "
                             f"{BEGIN!r} right before it")
    course = course_module()
    for index, cell in enumerate(nb.cells):  # e.g. a solution written in a markdown cell
        problem = course.misplaced_marker(cell, index)
        if problem:
            raise ValueError(f"{name}: {problem}")


def course_module():
    """The repository's course.py (standard library only), whose rules the student edition follows."""
    spec = importlib.util.spec_from_file_location("course_for_build", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernelspec() -> dict[str, str]:
    """The kernelspec metadata JupyterLab writes when it opens a notebook on the course's python3
    kernel: the installed kernel's own display name ("Python 3 (ipykernel)"). Writing anything
    else ("Python 3") makes JupyterLab rewrite it on opening, so the notebook shows as modified."""
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    return {"display_name": spec.display_name, "language": spec.language, "name": "python3"}


def to_notebook(source_path: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = kernelspec()
    nb.metadata["language_info"] = {"name": "python"}
    for kind, source, metadata in parse_source(source_path.read_text(encoding="utf-8")):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        nb.cells.append(make(source, metadata=metadata))
    for index, cell in enumerate(nb.cells):  # stable ids keep diffs small
        cell["id"] = f"{source_path.stem[:2]}-{index:03d}"
    add_nbgrader_metadata(nb, source_path.stem)
    return nb


class PeakMemory:
    """The peak memory of this process's descendants while the `with` block runs: the notebook's
    kernel and the worker processes it starts (notebooks 11 and 12), summed.

    A thread samples them every `interval` seconds. On Linux each process counts its
    proportional set size (PSS: its own pages, plus its share of the pages it shares, such as
    torch's libraries that every worker maps), so the sum is what the machine really holds;
    elsewhere the resident set size (which counts shared pages once per process, an
    overestimate). A process's own high-water mark (Linux's VmHWM) is a floor, so a spike of
    one process between two samples still counts. Read `peak_bytes` after the block.
    """

    def __init__(self, interval: float = 0.05) -> None:
        if not interval > 0:
            raise ValueError(f"interval is {interval!r}, expected a positive number of seconds")
        self.interval, self.peak_bytes = interval, 0
        self._stop = threading.Event()

    def sample(self) -> int:
        """The summed resident memory of the descendants now (and the biggest one's peak so far)."""
        total, biggest = 0, 0
        for child in psutil.Process().children(recursive=True):
            try:
                total += proportional_memory(child)
                biggest = max(biggest, high_water_mark(child.pid))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue  # a worker that exited between the listing and the reading
        return max(total, biggest)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_bytes = max(self.peak_bytes, self.sample())

    def __enter__(self) -> PeakMemory:
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak_bytes = max(self.peak_bytes, self.sample())
        self._stop.set()
        self._thread.join()


def proportional_memory(process: psutil.Process) -> int:
    """`process`'s PSS in bytes where the system reports it (Linux), else its RSS."""
    if sys.platform.startswith("linux"):
        return process.memory_full_info().pss
    return process.memory_info().rss


def high_water_mark(pid: int) -> int:
    """Process `pid`'s peak resident memory in bytes (Linux's VmHWM), or 0 where /proc has none."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    found = re.search(r"^VmHWM:\s+(\d+) kB$", status, re.M)
    return int(found.group(1)) * 1024 if found else 0


def execute(nb: nbformat.NotebookNode, timeout: int = 600) -> tuple[float, int]:
    """Run every cell in a fresh kernel (cwd notebooks/); return the wall time in seconds and
    the peak resident memory in bytes of the kernel and its workers."""
    started = time.perf_counter()
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    with PeakMemory() as memory:
        client.execute()
    return time.perf_counter() - started, memory.peak_bytes


TIMES = NOTEBOOKS / "TIMES.md"
PRECISIONS = ("fp32", "bf16")  # TIMES.md's two columns: a laptop's float32, a CPU with native bf16


def build_precision() -> str:
    """The precision the notebooks train in on this machine now ("fp32" or "bf16"), as the
    course's `pick_dtype` decides it (COURSE_PRECISION, else bf16 where the CPU has it)."""
    import torch

    from helpers.training.speed import pick_dtype

    return "bf16" if pick_dtype(torch.device("cpu")) == torch.bfloat16 else "fp32"


MEMORY_BUDGET_BYTES = 2 * 1024**3  # each notebook on an 8 GB laptop, with room for the rest
COLUMNS = (*PRECISIONS, "memory")   # TIMES.md's columns after the name


def format_memory(peak_bytes: int) -> str:
    """Peak memory as TIMES.md writes it: MiB, rounded up to the next 10 ("690 MB")."""
    if isinstance(peak_bytes, bool) or not isinstance(peak_bytes, int) or peak_bytes <= 0:
        raise ValueError(f"peak_bytes is {peak_bytes!r}, expected a positive number of bytes")
    return f"{-(-peak_bytes // (10 * 1024**2)) * 10} MB"


def read_times(text: str) -> dict[str, dict[str, str]]:
    """TIMES.md's rows, {notebook: {"fp32": "6 s", "bf16": "6 s", "memory": "690 MB"}}; a row
    written before the memory column existed reads as memory "-"."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if re.fullmatch(r"\d\d_\w+", cells[0]) and len(cells) in (len(COLUMNS), 1 + len(COLUMNS)):
            rows[cells[0]] = dict(zip(COLUMNS, [*cells[1:], "-"][:len(COLUMNS)], strict=True))
    return rows


def record_time(name: str, seconds: float, precision: str, peak_bytes: int | None = None) -> None:
    """Keep notebooks/TIMES.md, how long each notebook takes in float32 and in bf16 and its peak
    memory in float32, and the README's "runs in" column (the float32 time: most laptops have
    no native bf16). `peak_bytes` is recorded from the float32 run only (a laptop's)."""
    rows = read_times(TIMES.read_text()) if TIMES.exists() else {}
    row = rows.setdefault(name, dict.fromkeys(COLUMNS, "-"))
    row[precision] = f"{seconds:.0f} s"
    if peak_bytes is not None and precision == "fp32":
        row["memory"] = format_memory(peak_bytes)
    lines = ["# Time and memory to Restart and Run All", "",
             "Measured by `tools/build_notebooks.py` on the 2-core CPU machine the outputs were made on,",
             "in float32 (`COURSE_PRECISION=fp32`, as on most laptops) and in bfloat16 (a CPU with",
             "native bf16, where the course trains in bf16 by itself; `-` where the machine that made",
             "the outputs had no native bf16, since emulated bf16 says nothing about a real one).",
             "Peak memory is the resident memory of the notebook's kernel and the worker processes it",
             "starts, summed, at its highest during the float32 run (rounded up to 10 MB); the budget",
             f"is {MEMORY_BUDGET_BYTES // 1024**3} GB per notebook, so that the course runs on an 8 GB laptop",
             "(`benchmarks/bench_memory.py` holds it).", "",
             "| notebook | float32 | bf16 | peak memory (float32) |", "|---|---|---|---|"]
    lines += [f"| {n} | {t['fp32']} | {t['bf16']} | {t['memory']} |" for n, t in sorted(rows.items())]
    TIMES.write_text("\n".join(lines) + "\n")
    update_readme_time(name, readme_time(rows[name]))


def readme_time(times: dict[str, str]) -> str:
    """The README's "runs in": the float32 time, with the bf16 time beside it where measured."""
    return times["fp32"] if times["bf16"] == "-" else f"{times['fp32']} (bf16: {times['bf16']})"


def update_readme_time(name: str, time: str) -> None:
    """Write `time` into the "runs in" column of the README's row for notebook `name`."""
    readme = ROOT / "README.md"
    row = re.compile(rf"(\(notebooks/{re.escape(name)}\.ipynb\) \| [^|]+ \| )[^|]+( \|)")
    readme.write_text(row.sub(lambda m: f"{m.group(1)}{time}{m.group(2)}", readme.read_text()))


def build(source_path: Path, run: bool = True) -> Path:
    nb = to_notebook(source_path)
    if run:
        seconds, peak_bytes = execute(nb)
        precision = build_precision()
        print(f"{source_path.stem}: Restart and Run All took {seconds:.1f} s in {precision}, "
              f"peak memory {format_memory(peak_bytes)}", flush=True)
        record_time(source_path.stem, seconds, precision, peak_bytes)
    target = NOTEBOOKS / f"{source_path.stem}.ipynb"
    nbformat.write(nb, target)
    return target


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="build only notebooks whose name contains one of these")
    parser.add_argument("--no-run", action="store_true", help="write cells without executing them")
    args = parser.parse_args(argv)
    sources = sorted(SOURCES.glob("[0-9][0-9]_*.py"))
    if args.names:
        sources = [s for s in sources if any(name in s.stem for name in args.names)]
    if not sources:
        print("no notebook source matched", file=sys.stderr)
        return 1
    for source in sources:
        build(source, run=not args.no_run)
    if not args.no_run:  # the instructors' page reads the run times just stored
        from lesson_plan import main as write_lesson_plan

        write_lesson_plan([])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
