"""Build each notebook's slides: a reveal.js deck with its speaker notes, that runs offline.

    python tools/build_slides.py                    # every notebook, into notebooks/slides/
    python tools/build_slides.py 03 07_gpt          # notebooks 3 and 7 (a number or a name)
    python tools/build_slides.py 03 --solutions     # with the exercises' solutions shown
    python tools/build_slides.py 03 --notebooks DIR --out DIR   # read and write elsewhere

(`python3 course.py slides ...` runs it in the course's .venv.) A deck is made from the built
notebook (notebooks/NN_name.ipynb, outputs included) by nbconvert's reveal.js exporter with the
course's template (tools/slides/deck.html.j2): slide and fragment boundaries and speaker notes
come from the cells' `slideshow` metadata, which the sources carry (CONTRIBUTING, "Slides").
Nothing is fetched when the deck is shown: reveal.js 5 and its notes plugin (the speaker view,
key S) and fonts are copied from tools/slides/reveal.js/ beside the deck, and the LaTeX of the
markdown cells is turned into MathML here (latex2mathml), which browsers draw without a script.
Without --solutions an exercise's answer cell shows what the student edition shows (its
solution blanked, no output); the grader's hidden tests never reach a deck.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SOURCES = NOTEBOOKS / "src"
OUT = NOTEBOOKS / "slides"  # git ignores it
TEMPLATE_DIR = Path(__file__).resolve().parent / "slides"
REVEAL = TEMPLATE_DIR / "reveal.js"
INSTALL = ".venv/bin/python -m pip install -e '.[slides]' -c constraints.txt"

# Maths in markdown: $$...$$ (display) and $...$ (inline, no space inside either dollar, as
# pandoc and JupyterLab read it), outside code spans and fenced code, and not an escaped \$.
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
MATH = re.compile(r"(?<!\\)\$\$(.+?)\$\$|(?<![\\$])\$(?=\S)([^$\n]+?)(?<=\S)\$(?!\$)", re.S)
HIDDEN_TESTS = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*\n?",
                          re.S | re.M)
SOLUTION_MARKER = re.compile(r"^[ \t]*### (?:BEGIN|END) SOLUTION[^\n]*\n?", re.M)


class DeckError(ValueError):
    """A notebook a deck cannot be made from; the message says why and what to run."""


def latex_to_mathml(markdown: str) -> str:
    """`markdown` with every `$...$` and `$$...$$` replaced by MathML (code left as it is).

    Raises DeckError naming the formula that latex2mathml cannot read."""
    if not isinstance(markdown, str):
        raise TypeError(f"markdown is {type(markdown).__name__}, expected str")
    from latex2mathml.converter import convert

    def formula(found: re.Match) -> str:
        display = found.group(1) is not None
        latex = found.group(1) if display else found.group(2)
        try:
            return convert(latex.strip(), display="block" if display else "inline")
        except Exception as error:  # latex2mathml raises its own exception classes
            raise DeckError(f"cannot turn the formula {found.group(0)!r} into MathML: {error}") from error

    out, start = [], 0
    for code in CODE.finditer(markdown):
        out += [MATH.sub(formula, markdown[start:code.start()]), code.group(0)]
        start = code.end()
    out.append(MATH.sub(formula, markdown[start:]))
    return "".join(out)


PREFIXED = re.compile(r"(</?)ns\d+:(?=\w)")
PREFIX_DECLARATION = re.compile(r' xmlns:ns\d+="http://www\.w3\.org/1998/Math/MathML"')


def html_mathml(page: str) -> str:
    """`page` with MathML as HTML writes it: nbconvert's heading anchors re-serialise a heading
    through ElementTree, which writes `<ns0:math>`, an element HTML does not know as MathML."""
    if not isinstance(page, str):
        raise TypeError(f"page is {type(page).__name__}, expected str (a deck's HTML)")
    return PREFIX_DECLARATION.sub("", PREFIXED.sub(r"\1", page))


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def deck_notebook(notebook: dict, solutions: bool = False) -> dict:
    """A copy of `notebook` (its JSON) as its deck shows it: maths as MathML, no hidden tests, and
    unless `solutions`, each answer cell blanked as in the student edition, and the answer's and
    its test cell's outputs gone (the test cell's says the solution is right)."""
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise TypeError(f"notebook is {type(notebook).__name__}, expected a notebook's JSON "
                        "(a dict with a list of cells)")
    course = course_module()
    deck = copy.deepcopy(notebook)
    for cell in deck["cells"]:
        source = _source(cell)
        if cell["cell_type"] == "markdown":
            cell["source"] = latex_to_mathml(source)
        elif cell["cell_type"] == "code" and cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            if solutions:
                cell["source"] = SOLUTION_MARKER.sub("", source)
            else:
                cell["source"] = course.blank_solutions(source)
                cell["outputs"], cell["execution_count"] = [], None
        elif cell["cell_type"] == "code":
            cell["source"] = HIDDEN_TESTS.sub("", source).rstrip("\n")
            if not solutions and cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
                cell["outputs"], cell["execution_count"] = [], None  # the verdict on the solution
    return deck


def course_module():
    """The repository's course.py (standard library only): its blank_solutions is the student
    edition's."""
    spec = importlib.util.spec_from_file_location("course_for_slides", ROOT / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def slide_marks(cells: list[dict]) -> list[str | None]:
    """Each cell's slide_type (None where unmarked), the list a source and its build share."""
    return [cell.get("metadata", {}).get("slideshow", {}).get("slide_type") for cell in cells]


def find_notebooks(names: list[str], notebooks: Path = NOTEBOOKS) -> list[Path]:
    """The built notebooks `names` ask for ("03", "07_gpt", "gpt"; all where `names` is empty).

    A name is the notebook's number or part of its name, and must pick exactly one source in
    notebooks/src; raises DeckError naming the unknown or ambiguous name and the choices, or a
    notebook that is not built yet (no .ipynb, or one without outputs)."""
    stems = sorted(p.stem for p in SOURCES.glob("[0-9][0-9]_*.py"))
    chosen = []
    for name in names:
        if not isinstance(name, str) or not name:
            raise DeckError(f"notebook name {name!r} is empty, expected a number or a name")
        matches = [s for s in stems if s[:2] == name.zfill(2)] if name.isdigit() else [
            s for s in stems if name in s]
        if len(matches) != 1:
            what = "no notebook" if not matches else f"{len(matches)} notebooks ({', '.join(matches)})"
            raise DeckError(f"{name!r} names {what}; expected one of: {', '.join(stems)}")
        chosen += [m for m in matches if m not in chosen]
    paths = [notebooks / f"{stem}.ipynb" for stem in (chosen or stems)]
    for path in paths:
        check_built(path)
    return paths


def check_built(path: Path) -> None:
    """Raise DeckError unless `path` is a built notebook with outputs and its source's slide marks."""
    import nbformat

    rebuild = f"build it first: .venv/bin/python tools/build_notebooks.py {path.stem}"
    if not path.is_file():
        raise DeckError(f"{path} is not built yet: {rebuild}")
    cells = nbformat.read(path, as_version=4).cells
    if not any(cell.get("outputs") for cell in cells if cell.cell_type == "code"):
        raise DeckError(f"{path} has no outputs (built with --no-run?): {rebuild}")
    source = SOURCES / f"{path.stem}.py"
    if source.is_file():
        sys.path.insert(0, str(ROOT / "tools"))
        from build_notebooks import to_notebook

        if slide_marks(to_notebook(source).cells) != slide_marks(cells):
            raise DeckError(f"{path} was built before its source's slide marks changed "
                            f"({source.relative_to(ROOT)}): rebuild it: .venv/bin/python "
                            f"tools/build_notebooks.py {path.stem}")


def build_deck(path: Path, out: Path = OUT, solutions: bool = False) -> Path:
    """Write `path`'s deck into `out` (NN_name.html, or NN_name-solutions.html) beside a copy of
    reveal.js; returns the deck's path."""
    import nbformat
    from nbconvert import SlidesExporter

    notebook = nbformat.from_dict(deck_notebook(nbformat.read(path, as_version=4), solutions))
    exporter = SlidesExporter(template_file="deck.html.j2", extra_template_paths=[str(TEMPLATE_DIR)],
                              reveal_url_prefix="reveal.js", reveal_theme="white")
    body, _ = exporter.from_notebook_node(notebook, resources={"metadata": {"name": path.stem}})
    body = html_mathml(body)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REVEAL, out / "reveal.js", dirs_exist_ok=True)
    deck = out / f"{path.stem}{'-solutions' if solutions else ''}.html"
    deck.write_text(body, encoding="utf-8")
    return deck


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="notebooks by number or name (default: all)")
    parser.add_argument("--solutions", action="store_true", help="show the exercises' solutions")
    parser.add_argument("--notebooks", type=Path, default=NOTEBOOKS, help="where the built .ipynb are")
    parser.add_argument("--out", type=Path, default=OUT, help="where the decks go (notebooks/slides/)")
    args = parser.parse_args(argv)
    if importlib.util.find_spec("latex2mathml") is None or importlib.util.find_spec("nbconvert") is None:
        print(f"the slides need nbconvert and latex2mathml, the course's extra 'slides': {INSTALL}")
        return 1
    try:
        paths = find_notebooks(args.names, args.notebooks)
        for path in paths:
            deck = build_deck(path, args.out, args.solutions)
            print(f"{path.stem}: {deck} (open it in a browser; S opens the speaker view)")
    except DeckError as error:
        print(f"no slides built: {error}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
