"""tools/build_slides.py (`python3 course.py slides`): its pure parts and its refusals.

The decks themselves are opened in a browser by tests/browser/test_slides.py."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest
from notebook_tools import NOTEBOOKS, ROOT, SOURCES

sys.path.insert(0, str(ROOT / "tools"))
import build_slides  # noqa: E402
from build_slides import DeckError, deck_notebook, find_notebooks, html_mathml, latex_to_mathml  # noqa: E402

pytest.importorskip("latex2mathml", reason="the extra 'slides' is not installed")

SOLVED = ('def double(x):\n    """Twice x."""\n    ### BEGIN SOLUTION\n    return 2 * x\n'
          "    ### END SOLUTION")
CHECKED = ('check("demo.double", double)\n### BEGIN HIDDEN TESTS\nhidden_check("demo.double", double, '
           "globals())\n### END HIDDEN TESTS")


def _notebook() -> dict:
    output = {"output_type": "stream", "name": "stdout", "text": "correct!\n"}
    return {"cells": [
        {"cell_type": "markdown", "metadata": {}, "source": "Scale by $\\sqrt{d_k}$, not `$x$`."},
        {"cell_type": "code", "metadata": {"nbgrader": {"solution": True, "grade": False}},
         "source": SOLVED, "outputs": [dict(output)], "execution_count": 1},
        {"cell_type": "code", "metadata": {"nbgrader": {"solution": False, "grade": True}},
         "source": CHECKED, "outputs": [dict(output)], "execution_count": 2},
        {"cell_type": "code", "metadata": {}, "source": "print(double(2))",
         "outputs": [dict(output, text="4\n")], "execution_count": 3}],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_inline_and_display_maths_become_mathml():
    out = latex_to_mathml("softmax of $x_i$ over\n$$\\frac{QK^\\top}{\\sqrt{d_k}}$$\nend")
    assert out.count("<math") == 2 and 'display="inline"' in out and 'display="block"' in out
    assert "<msqrt>" in out and "<mfrac>" in out and "$" not in out
    assert out.startswith("softmax of <math") and out.endswith("</math>\nend")


@pytest.mark.parametrize("text", [
    "a price: $5 and $6",             # a space before the closing dollar: not maths
    "code `$x_i$` stays",             # a code span
    "```\nprint('$a$')\n```",         # fenced code
    "an escaped \\$x$ dollar",
])
def test_what_is_not_maths_is_left_as_it_is(text):
    assert latex_to_mathml(text) == text


def test_a_formula_latex2mathml_cannot_read_is_named(monkeypatch):
    def refuse(latex, display):
        raise RuntimeError("unknown command")

    monkeypatch.setattr("latex2mathml.converter.convert", refuse)
    with pytest.raises(DeckError, match=r"cannot turn the formula '\$\\\\oops\$' into MathML: unknown"):
        latex_to_mathml("a $\\oops$ b")


def test_latex_to_mathml_refuses_what_is_not_text():
    with pytest.raises(TypeError, match="markdown is list, expected str"):
        latex_to_mathml(["$x$"])


def test_a_deck_without_solutions_blanks_the_answer_and_the_verdict_and_keeps_the_rest():
    notebook = _notebook()
    before = json.dumps(notebook, sort_keys=True)
    deck = deck_notebook(notebook)
    assert json.dumps(notebook, sort_keys=True) == before  # the notebook itself is not touched
    prose, answer, test, other = deck["cells"]
    assert "<math" in prose["source"] and "`$x$`" in prose["source"]
    assert "return 2 * x" not in answer["source"] and "raise NotImplementedError()" in answer["source"]
    assert answer["outputs"] == [] and test["outputs"] == [] and answer["execution_count"] is None
    assert test["source"] == 'check("demo.double", double)'
    assert other["outputs"][0]["text"] == "4\n" and other["execution_count"] == 3


def test_a_deck_with_solutions_shows_them_without_markers_or_hidden_tests():
    prose, answer, test, other = deck_notebook(_notebook(), solutions=True)["cells"]
    assert "    return 2 * x" in answer["source"] and "###" not in answer["source"]
    assert answer["outputs"][0]["text"] == "correct!\n" and test["outputs"][0]["text"] == "correct!\n"
    assert test["source"] == 'check("demo.double", double)'


def test_deck_notebook_refuses_what_is_not_a_notebook():
    with pytest.raises(TypeError, match="notebook is list, expected a notebook's JSON"):
        deck_notebook([])


def test_prefixed_mathml_from_a_heading_becomes_html_mathml():
    page = ('<h2 xmlns:ns0="http://www.w3.org/1998/Math/MathML">by <ns0:math display="inline">'
            "<ns0:mi>d</ns0:mi></ns0:math></h2>")
    assert html_mathml(page) == '<h2>by <math display="inline"><mi>d</mi></math></h2>'
    with pytest.raises(TypeError, match="page is bytes"):
        html_mathml(b"<h2></h2>")


@pytest.mark.parametrize("name, message", [
    ("99", r"'99' names no notebook; expected one of: 01_tokenization, .*14_serving"),
    ("a", r"'a' names \d+ notebooks \(01_tokenization, .*\); expected one of"),
    ("", r"notebook name '' is empty"),
])
def test_an_unknown_or_ambiguous_notebook_is_refused_with_the_choices(name, message):
    with pytest.raises(DeckError, match=message):
        find_notebooks([name])


def _built_into(folder, name: str) -> nbformat.NotebookNode:
    """Notebook `name` as the build makes it from its source, with one output, written to `folder`."""
    sys.path.insert(0, str(ROOT / "tools"))
    from build_notebooks import to_notebook

    built = to_notebook(SOURCES / f"{name}.py")
    next(c for c in built.cells if c.cell_type == "code").outputs = [
        nbformat.v4.new_output("stream", text="x\n")]
    nbformat.write(built, folder / f"{name}.ipynb")
    return built


def test_a_notebook_is_found_by_number_or_name_once(tmp_path):
    for name in ("03_attention", "07_gpt"):
        _built_into(tmp_path, name)
    paths = find_notebooks(["3", "03_attention", "gpt"], tmp_path)
    assert paths == [tmp_path / "03_attention.ipynb", tmp_path / "07_gpt.ipynb"]


def test_a_notebook_not_built_yet_is_refused_with_the_command_that_builds_it(tmp_path):
    with pytest.raises(DeckError, match=r"03_attention.ipynb is not built yet: build it first: "
                                        r"\.venv/bin/python tools/build_notebooks.py 03_attention"):
        find_notebooks(["03"], tmp_path)
    stored = nbformat.read(NOTEBOOKS / "03_attention.ipynb", as_version=4)
    for cell in stored.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    nbformat.write(stored, tmp_path / "03_attention.ipynb")
    with pytest.raises(DeckError, match=r"has no outputs \(built with --no-run\?\)"):
        find_notebooks(["03"], tmp_path)


def test_a_notebook_built_before_its_slide_marks_changed_is_refused(tmp_path):
    built = _built_into(tmp_path, "03_attention")
    assert find_notebooks(["03"], tmp_path) == [tmp_path / "03_attention.ipynb"]
    built.cells[0].metadata["slideshow"] = {"slide_type": "skip"}
    nbformat.write(built, tmp_path / "03_attention.ipynb")
    with pytest.raises(DeckError, match="built before its source's slide marks changed"):
        find_notebooks(["03"], tmp_path)


def test_the_command_says_why_it_built_nothing(capsys):
    assert build_slides.main(["nope"]) == 2
    assert capsys.readouterr().out.startswith("no slides built: 'nope' names no notebook")


def test_course_py_names_the_extra_when_the_slides_cannot_be_built(tmp_path, monkeypatch):
    """course.py runs the tool in the course's .venv; a Python without latex2mathml gets the install line."""
    bare = tmp_path / "python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S -I \"$@\"\n")
    bare.chmod(0o755)
    result = subprocess.run([sys.executable, "-c", (
        "import importlib.util, sys; from pathlib import Path\n"
        f"spec = importlib.util.spec_from_file_location('c', {str(ROOT / 'course.py')!r})\n"
        "c = importlib.util.module_from_spec(spec); spec.loader.exec_module(c)\n"
        f"c.PYTHON = Path({str(bare)!r})\n"
        "sys.exit(c.slides(['03']))")], capture_output=True, text=True)
    assert result.returncode == 1, result.stderr
    assert "the course's extra 'slides'" in result.stdout and "pip install -e '.[slides]'" in result.stdout


def test_the_files_a_deck_loads_are_in_the_repository_not_ignored():
    """The vendored reveal.js is what every deck copies: a file git ignores (a `dist/` rule did)
    is missing from every clone, and the decks then show nothing."""
    needed = [build_slides.REVEAL / part for part in
              ("dist/reveal.js", "dist/reveal.css", "dist/theme/white.css",
               "dist/theme/fonts/source-sans-pro/source-sans-pro.css", "plugin/notes/notes.js")]
    assert all(path.is_file() for path in needed), [str(p) for p in needed if not p.is_file()]
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing can be ignored")
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *map(str, needed)], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    assert not ignored, f"git ignores files every deck needs: {ignored}"
