"""The slides (`python3 course.py slides`, tools/build_slides.py) in a real headless Chromium.

Builds the decks of notebooks 3, 7 and 12, without and with --solutions, into a temporary folder
and opens each from disk (file://) with every other request refused and counted: the test fails
if any request leaves the disk. In each deck it steps through every slide and fragment with
reveal.js's API, checks that the maths is MathML that Chromium lays out (no raw `$...$` or
`\\(` left in the prose), that the slides with speaker notes give them to Reveal.getSlideNotes(),
that the speaker view (the notes plugin's window, key S) shows them, and that no solution is in
a deck built without --solutions and every one is in a deck built with it.

The decks are built from notebooks made here: each source's cells and slide marks
(tools/build_notebooks.py's to_notebook, not run) with the outputs of the committed notebook,
cell by cell, so the test reads the sources' marks whether or not the committed notebooks have
been rebuilt since. Skips, saying why, when latex2mathml (the extra 'slides') is missing.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from notebook_tools import NOTEBOOKS, ROOT, SOURCES

pytestmark = pytest.mark.browser
sys.path.insert(0, str(ROOT / "tools"))
from build_notebooks import to_notebook  # noqa: E402

DECKS = ("03_attention", "07_gpt", "12_frontier_decoder")
SOLUTION_REGION = re.compile(r"^[ \t]*### BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*### END SOLUTION", re.S | re.M)
RAW_LATEX = re.compile(r"\$[^$\s][^$\n]*\\[A-Za-z]+[^$\n]*\$|\\\(|\\\[|\$\$")

# Every (h, v, fragment) the deck passes through from the first slide, pressing "next" until the
# last slide's last fragment, with whether that slide has speaker notes and their text.
STEP_THROUGH = """() => {
  Reveal.slide(0, 0, -1);
  const seen = [];
  for (let guard = 0; guard < 20000; guard++) {
    const i = Reveal.getIndices();
    seen.push([i.h, i.v || 0, i.f === undefined ? -1 : i.f, Reveal.getSlideNotes() || ""]);
    if (Reveal.isLastSlide() && !Reveal.availableFragments().next) return seen;
    Reveal.next();
  }
  return seen;
}"""

# The deck's text without its code and outputs: the prose, where LaTeX would show if unconverted.
PROSE = """() => {
  const slides = document.querySelector('.slides').cloneNode(true);
  slides.querySelectorAll('pre, code, .jp-OutputArea, aside.notes, math').forEach(e => e.remove());
  return slides.textContent;
}"""

# The first formula's slide, shown, and how Chromium lays the formula out there.
FIRST_FORMULA = """() => {
  const math = document.querySelector('.slides math');
  if (math === null) return null;
  const slide = math.closest('section');
  const at = Reveal.getIndices(slide);
  Reveal.slide(at.h, at.v || 0, Reveal.getSlide(at.h, at.v || 0).querySelectorAll('.fragment').length);
  const box = math.getBoundingClientRect();
  return {namespace: math.namespaceURI, display: getComputedStyle(math).display,
          width: box.width, height: box.height, count: document.querySelectorAll('.slides math').length};
}"""


def notebook_for_deck(name: str, folder: Path) -> Path:
    """`name` as the build makes it from its source (slide marks included), with the committed
    notebook's outputs put back cell by cell (matched by the code cell's source)."""
    built = to_notebook(SOURCES / f"{name}.py")
    stored = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    outputs = {cell.source: cell for cell in stored.cells if cell.cell_type == "code"}
    for cell in built.cells:
        if cell.cell_type == "code":
            assert cell.source in outputs, f"{name}: a code cell of the source is not in the committed notebook"
            cell.outputs = outputs[cell.source].outputs
            cell.execution_count = outputs[cell.source].execution_count
            if "execution" in outputs[cell.source].metadata:  # the run's timestamps
                cell.metadata["execution"] = outputs[cell.source].metadata["execution"]
    path = folder / f"{name}.ipynb"
    nbformat.write(built, path)
    return path


def solutions(name: str) -> list[str]:
    """Each solution's longest line (stripped), a line no blanked deck may show."""
    lines = []
    for found in SOLUTION_REGION.finditer((SOURCES / f"{name}.py").read_text(encoding="utf-8")):
        lines.append(max((line.strip() for line in found.group(1).splitlines()), key=len))
    return lines


@pytest.fixture(scope="module")
def decks(tmp_path_factory) -> Path:
    pytest.importorskip("latex2mathml", reason="the slides need the extra 'slides': "
                        ".venv/bin/python -m pip install -e '.[slides]' -c constraints.txt")
    folder = tmp_path_factory.mktemp("slides")
    notebooks = folder / "notebooks"
    notebooks.mkdir()
    for name in DECKS:
        notebook_for_deck(name, notebooks)
    for extra in ([], ["--solutions"]):
        subprocess.run([sys.executable, str(ROOT / "tools" / "build_slides.py"), *DECKS, *extra,
                        "--notebooks", str(notebooks), "--out", str(folder / "decks")],
                       check=True, cwd=ROOT)
    return folder / "decks"


@pytest.fixture
def offline_page(browser):
    """A page whose every request but file:// is refused; yields (page, refused URLs)."""
    context = browser.new_context(viewport={"width": 1280, "height": 720})
    refused: list[str] = []

    def only_files(route) -> None:
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    context.route("**/*", only_files)
    try:
        yield context.new_page(), refused
    finally:
        context.close()


def open_deck(page, deck: Path) -> None:
    page.goto(deck.as_uri())
    page.wait_for_function("() => window.Reveal && Reveal.isReady()")


@pytest.mark.parametrize("name", DECKS)
def test_a_deck_steps_through_offline_with_maths_and_speaker_notes(decks, offline_page, name):
    page, refused = offline_page
    open_deck(page, decks / f"{name}.html")
    steps = page.evaluate(STEP_THROUGH)
    slides = {(h, v) for h, v, _, _ in steps}
    total = page.evaluate("() => Reveal.getTotalSlides()")
    assert len(slides) == total > 10, f"{name}: visited {len(slides)} of {total} slides"
    assert sum(1 for _, _, f, _ in steps if f >= 0) > 10, f"{name}: no fragments stepped through"
    notes = {(h, v): text for h, v, _, text in steps if text}
    sources = SOURCES / f"{name}.py"
    expected = sources.read_text(encoding="utf-8").count('slide_type": "notes"')
    assert len(notes) >= 5 and len(notes) >= expected - 2, f"{name}: {len(notes)} slides with notes"
    assert any("Ask" in text for text in notes.values())

    unknown = page.evaluate("() => [...document.querySelectorAll('.slides *')]"
                            ".filter(e => e.localName.includes(':')).map(e => e.localName)")
    assert unknown == [], f"{name}: elements the browser does not know: {sorted(set(unknown))}"
    prose = page.evaluate(PROSE)
    raw = RAW_LATEX.findall(prose)
    assert raw == [], f"{name}: LaTeX left unconverted: {raw[:5]}"
    formula = page.evaluate(FIRST_FORMULA)
    if "$" in sources.read_text(encoding="utf-8"):  # notebooks 7 and 12 write no LaTeX today
        assert formula["namespace"] == "http://www.w3.org/1998/Math/MathML"
        assert formula["display"] in ("math", "inline math", "block math"), formula
        assert formula["width"] > 0 and formula["height"] > 0 and formula["count"] > 5, formula
    else:
        assert formula is None, f"{name}: MathML in a deck whose source has no formula"

    text = page.evaluate("() => document.querySelector('.slides').textContent")
    for line in solutions(name):
        assert line not in text, f"{name}: a solution line is in the deck without --solutions: {line}"
    assert "hidden_check" not in text and "NotImplementedError" in text
    assert refused == [], f"{name}: requests left the disk: {refused[:5]}"


@pytest.mark.parametrize("name", DECKS)
def test_the_solutions_deck_shows_every_solution(decks, offline_page, name):
    page, refused = offline_page
    open_deck(page, decks / f"{name}-solutions.html")
    text = page.evaluate("() => document.querySelector('.slides').textContent")
    missing = [line for line in solutions(name) if line not in text]
    assert solutions(name) and missing == [], f"{name}: solutions missing: {missing}"
    assert "### BEGIN SOLUTION" not in text and "hidden_check" not in text
    assert refused == []


def test_the_speaker_view_shows_the_notes_of_the_slide(decks, offline_page):
    page, refused = offline_page
    open_deck(page, decks / "03_attention.html")
    at = page.evaluate("""() => {
      const slide = [...document.querySelectorAll('.slides section')]
        .find(s => s.querySelector(':scope > aside.notes'));
      const i = Reveal.getIndices(slide);
      Reveal.slide(i.h, i.v || 0);
      return Reveal.getSlideNotes();
    }""")
    assert at and "Ask the room" in at
    with page.expect_popup() as popup_info:
        page.keyboard.press("s")
    speaker = popup_info.value
    speaker.wait_for_function("() => { const n = document.querySelector('.speaker-controls-notes .value');"
                              " return n && n.textContent.includes('Ask the room'); }", timeout=20000)
    assert speaker.locator(".speaker-controls-notes .value").inner_text().strip().startswith("Opening")
    assert refused == [], f"requests left the disk: {refused[:5]}"
