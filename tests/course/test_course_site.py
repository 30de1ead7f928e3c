"""`python3 course.py site`: its arguments, its errors without mystmd, and the MyST project it writes.

No mystmd needed here (tests/browser/test_site.py builds the real site and crawls it in Chromium).
"""

from __future__ import annotations

import html
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from notebook_tools import exercise_notebook, lesson_cells, stream

ROOT = Path(__file__).resolve().parents[2]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
MARKERS = re.compile(r"NBVAL_|### (BEGIN|END) (SOLUTION|HIDDEN TESTS)")


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course = load("course_for_site_tests", ROOT / "course.py")
project = load("site_project_for_tests", ROOT / "tools" / "site" / "project.py")
render = load("site_render_for_tests", ROOT / "tools" / "site" / "render.py")
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture
def tools_present(monkeypatch):
    monkeypatch.setattr(course, "find_myst", lambda: "myst")
    monkeypatch.setattr(course, "node_major", lambda: 20)


@pytest.mark.parametrize("args", [["--html"], ["-o"], ["a", "b"]])
def test_site_refuses_unknown_arguments(args, capsys, tools_present):
    assert course.main(["site", *args]) == 2
    assert "usage: python3 course.py site [--student] [DIR]" in capsys.readouterr().out


@pytest.mark.parametrize("where", [".", "notebooks", "notebooks/src", ".."])
def test_site_refuses_to_build_over_the_course(where, tmp_path, capsys, tools_present):
    (tmp_path / "notebooks" / "src").mkdir(parents=True)
    assert course.site([str(tmp_path / where)], root=tmp_path) == 2
    assert "a folder of its own" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notebooks"]  # nothing written


def test_site_refuses_a_folder_that_holds_other_files(tmp_path, capsys, tools_present):
    (tmp_path / "thesis.tex").write_text("mine")
    assert course.site([str(tmp_path)]) == 2
    assert "holds other files" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["thesis.tex"]


def test_site_without_mystmd_names_the_extra_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(course, "find_myst", lambda: None)
    assert course.site([str(tmp_path / "out")]) == 1
    assert "pip install .[site]" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("major", [None, 16])
def test_site_without_node_18_says_so(monkeypatch, tmp_path, capsys, major):
    monkeypatch.setattr(course, "find_myst", lambda: "myst")
    monkeypatch.setattr(course, "node_major", lambda: major)
    assert course.site([str(tmp_path / "out")]) == 1
    assert "Node.js 18 or newer" in capsys.readouterr().out


def test_site_writes_the_project_then_runs_myst_build_html_in_it(monkeypatch, tmp_path, tools_present):
    calls = []
    monkeypatch.setattr(course, "run", lambda args, cwd: calls.append((args, cwd)))
    assert course.site([str(tmp_path / "out")]) == 0
    assert calls == [(["myst", "build", "--html"], (tmp_path / "out").resolve())]
    assert (tmp_path / "out" / "myst.yml").exists()
    assert json.loads((tmp_path / "out" / "edition.json").read_text()) == {"edition": "instructor"}


@pytest.mark.parametrize("args", [["--student", "{out}"], ["{out}", "--student"]])
def test_site_student_builds_the_student_edition_over_an_earlier_build(monkeypatch, tmp_path,
                                                                       tools_present, args):
    out = tmp_path / "out"
    (out / "_build" / "html").mkdir(parents=True)
    (out / "myst.yml").write_text("version: 1\n")
    (out / "_build" / "html" / "attention.html").write_text("the instructor's solution")
    monkeypatch.setattr(course, "run", lambda args, cwd: None)
    assert course.site([arg.format(out=out) for arg in args]) == 0
    assert not (out / "_build").exists(), "an earlier build's pages must not stay"
    assert json.loads((out / "edition.json").read_text()) == {"edition": "student"}
    for path in NOTEBOOKS:  # the student copies (answer cells blanked), whichever form they are in
        shown = json.loads((out / "notebooks" / path.name).read_text())
        for cell in shown["cells"]:
            text = "".join(cell["source"])
            assert not MARKERS.search(text) and not re.search(r"<summary>\s*Solution", text), text


def test_the_theme_runs_on_a_python_with_pygments(monkeypatch, tmp_path):
    monkeypatch.setattr(course, "PYTHON", tmp_path / "python")
    assert course.render_python() == course.sys.executable  # no .venv: this one
    (tmp_path / "python").write_text("")
    monkeypatch.setattr(course.importlib.util, "find_spec", lambda name: None)
    assert course.render_python() == str(tmp_path / "python")  # no Pygments here: the .venv's
    monkeypatch.setattr(course.importlib.util, "find_spec", lambda name: object())
    assert course.render_python() == course.sys.executable


def test_site_says_when_myst_build_fails(monkeypatch, tmp_path, capsys, tools_present):
    def failing(args, cwd):
        raise course.subprocess.CalledProcessError(1, args)

    monkeypatch.setattr(course, "run", failing)
    assert course.site([str(tmp_path / "out")]) == 1
    assert "myst build failed" in capsys.readouterr().out


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    names = project.write_project(ROOT, target, "alice/course", "/usr/bin/python3")
    return target, names


def test_the_project_lists_every_notebook_between_the_landing_page_and_the_two_pages(written):
    target, names = written
    assert names == [path.name for path in NOTEBOOKS]
    toc = re.findall(r"- file: (\S+)", (target / "myst.yml").read_text())
    assert toc == ["index.md", *[f"notebooks/{name}" for name in names], "sources.md",
                   "instructors.md"]
    assert "template: ./theme" in (target / "myst.yml").read_text()
    assert '"/usr/bin/python3" render.py' in (target / "theme" / "template.yml").read_text()
    assert (target / "theme" / "render.py").exists()


def test_each_notebook_keeps_its_outputs_gains_a_colab_link_and_loses_live_widgets(written):
    target, _ = written
    for path in NOTEBOOKS:
        original = json.loads(path.read_text())
        shown = json.loads((target / "notebooks" / path.name).read_text())
        assert len(shown["cells"]) == len(lesson_cells(original["cells"])) + 1  # no speaker notes
        link = "".join(shown["cells"][1]["source"])
        assert f"colab.research.google.com/github/alice/course/blob/main/notebooks/{path.name}" in link
        before = [o for c in original["cells"] for o in c.get("outputs", [])]
        after = [o for c in shown["cells"] for o in c.get("outputs", [])]
        assert len(after) == len(before)
        views = sum(WIDGET_VIEW in o.get("data", {}) for o in before)
        assert sum(o.get("data", {}).get("text/html") == project.WIDGET_NOTE for o in after) == views
        assert not any(WIDGET_VIEW in o.get("data", {}) for o in after)
        for old, new in zip(before, after, strict=True):
            if WIDGET_VIEW not in old.get("data", {}):
                assert new == old, f"{path.name}: an output changed"
        assert "widgets" not in shown["metadata"]


def test_landing_sources_and_instructors_pages_come_from_the_readme_and_the_notebooks(written):
    target, names = written
    index = (target / "index.md").read_text()
    assert all(f"(notebooks/{name})" in index for name in names)
    assert "(sources.md)" in index and "(instructors.md)" in index
    sources = (target / "sources.md").read_text()
    assert "Matrix Magic" in sources
    used = re.findall(r"^- \*\*(the [^*]+)\*\*: (.*)$", sources, re.M)
    assert len(used) == 5 and all("(notebooks/" in where for _, where in used), used
    instructors = (target / "instructors.md").read_text()
    assert all(f"| {Path(name).stem} |" in instructors for name in names)  # TIMES.md's table
    assert all(f"**{name}**: about" in instructors for name in names)  # a stop line each
    knob = re.search(r"^TRAIN_STEPS = \d+", (ROOT / "notebooks/src/07_gpt.py").read_text(), re.M).group(0)
    assert "COURSE_PRECISION" in instructors and f"`{knob}`" in instructors  # the knob as it stands
    assert "python3 course.py student DIR" in instructors


def markdown(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def code(lines: int, seconds: float) -> dict:
    execution = {"iopub.status.busy": "2026-01-01T00:00:00.000Z",
                 "iopub.status.idle": f"2026-01-01T00:00:{seconds:06.3f}Z"}
    return {"cell_type": "code", "metadata": {"execution": execution}, "outputs": [],
            "source": "\n".join(["x = 1"] * lines)}


def test_sections_add_reading_code_and_the_stored_run_times():
    notebook = {"cells": [markdown("## One\n" + "word " * 198), code(8, 30.0),
                          markdown("## Two\n" + "word " * 98)]}
    (first, minutes, seconds), (second, minutes_2, _) = project.sections(notebook)
    assert (first, second) == ("One", "Two")
    assert minutes == pytest.approx(200 / 100 + 8 / 4 + 0.5) and seconds == pytest.approx(30.0)
    assert minutes_2 == pytest.approx(1.0)


@pytest.mark.parametrize("edition", ["instructor", "student"])
def test_speaker_notes_are_left_out_of_both_sites_and_of_the_section_times(edition):
    notes = dict(markdown("Ask the room " + "word " * 300), metadata={"slideshow": {"slide_type": "notes"}})
    notebook = {"cells": [markdown("# Title"), markdown("## One\n" + "word " * 98), notes, code(4, 0.0)],
                "metadata": {}}
    (_, minutes, _), = project.sections(notebook)[-1:]
    assert minutes == pytest.approx(100 / 100 + 4 / 4)
    shown = project.site_notebook(notebook, project.colab_url("alice/course", "09_x.ipynb"),
                                  course.student_notebook if edition == "student" else None)
    assert len(shown["cells"]) == 4 and not any("Ask the room" in text for text in texts(shown))


def test_stop_points_fall_before_the_section_that_would_overrun_each_class():
    twenty = "word " * 2000  # 20 minutes of prose
    notebook = {"cells": [markdown(f"## {name}\n{twenty}") for name in "ABCDE"]}
    line = project.stop_points(notebook)
    assert "stop before **C**, then before **E**" in line and "about 100 min" in line
    assert "fits in one class" in project.stop_points({"cells": [markdown("## A\nshort")]})


def test_the_theme_turns_a_myst_tree_into_html_with_page_links_and_figures():
    page = render.Page({"intro", "attention"}, "intro")
    tree = {"type": "root", "children": [
        {"type": "paragraph", "children": [
            {"type": "text", "value": "a < b "},
            {"type": "link", "url": "/attention#scores", "children": [{"type": "text", "value": "next"}]},
            {"type": "link", "url": "/intro", "children": []},
            {"type": "inlineMath", "value": "x", "html": '<span class="katex">x</span>'}]},
        {"type": "output", "jupyter_data": {"output_type": "display_data", "data": {
            "image/png": {"path": "/abc.png"}, "text/plain": {"content": "<Figure>"}}}}]}
    out = page.node(tree)
    assert "a &lt; b" in out and 'href="attention.html#scores"' in out and 'href="index.html"' in out
    assert '<span class="katex">x</span>' in out and '<img src="abc.png"' in out
    assert page.files == {"/abc.png"}


def texts(notebook: dict) -> list[str]:
    return ["".join(cell["source"]) for cell in notebook["cells"]]


@pytest.mark.parametrize("metadata", [True, False], ids=["nbgrader metadata", "markers only"])
def test_the_instructors_site_shows_solutions_and_hidden_tests_without_markers(metadata):
    shown = project.site_notebook(exercise_notebook(metadata), project.colab_url("alice/course", "09_x.ipynb"))
    assert texts(shown)[1].startswith("[Open in Colab](")
    del shown["cells"][1]
    setup, answer, tested, after = (texts(shown)[i] for i in (1, 3, 4, 6))
    assert setup == "print('timing')"
    assert "y = x * x" in answer and "assert f(3) == 9" in tested
    assert "the older form's solution" in after
    assert not any(MARKERS.search(text) for text in texts(shown))
    outputs = [cell.get("outputs") for cell in shown["cells"]]
    assert outputs == [cell.get("outputs") for cell in exercise_notebook(metadata)["cells"]]


@pytest.mark.parametrize("metadata", [True, False], ids=["nbgrader metadata", "markers only"])
def test_the_students_site_has_no_solution_no_hidden_test_and_no_exercise_output(metadata):
    shown = project.site_notebook(exercise_notebook(metadata),
                                  project.colab_url("alice/course", "09_x.ipynb"),
                                  course.student_notebook)
    opening = texts(shown)[1]
    assert "colab" not in opening.lower() and "python3 course.py lab" in opening
    del shown["cells"][1]
    answer, tested, after = (texts(shown)[i] for i in (3, 4, 6))
    assert "raise NotImplementedError()" in answer and "# YOUR CODE HERE" in answer
    everything = "\n".join(texts(shown))
    for secret in ("y = x * x", "the instructor's square", "assert f(3) == 9", "a hidden case",
                   "the older form's solution", "<summary>Solution"):
        assert secret not in everything
    assert tested.strip() == 'check("x.f", f)' and after.strip() == "After the reveal."
    assert "Hint 1: the idea" in texts(shown)[2]
    assert not MARKERS.search(everything)
    assert [cell.get("outputs") for cell in shown["cells"]] == [
        None, [stream("timing 3 s\n")], None, [], [],
        [stream("this cell uses your f once it passes x.f; until then, the course's own version\n")],
        None]


def test_the_colab_links_say_they_need_the_public_address_until_the_course_has_one():
    placeholder = project.PLACEHOLDER_SLUG
    caveat = project.colab_caveat(placeholder)
    assert "do not work yet" in caveat and "course.py publish" in caveat
    assert f"https://github.com/{placeholder}" in caveat
    assert project.colab_caveat("alice/course") == ""
    link = texts(project.site_notebook(exercise_notebook(True),
                                       project.colab_url(placeholder, "09_x.ipynb")))[1]
    assert "do not work yet" in link
    published = texts(project.site_notebook(exercise_notebook(True),
                                            project.colab_url("alice/course", "09_x.ipynb")))[1]
    assert "do not work yet" not in published


def test_the_student_landing_page_has_no_colab_column(tmp_path):
    project.write_project(ROOT, tmp_path, "alice/course", "/usr/bin/python3", course.student_notebook)
    index = (tmp_path / "index.md").read_text()
    assert "colab.research.google.com" not in index and "student edition" in index
    assert all(f"(notebooks/{path.name})" in index for path in NOTEBOOKS)
    header = next(line for line in index.splitlines() if line.startswith("| #"))
    assert header.rstrip().endswith("| needs |")
    rows = [line for line in index.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in rows}) == 1, "every row lost the same column"


def test_without_colab_column_leaves_other_tables_alone():
    table = "| a | b |\n|---|---|\n| 1 | 2 |"
    assert project.without_colab_column(table) == table
    assert project.without_colab_column("| a | Colab |\n|---|---|\n| 1 | [open](x) |") == (
        "| a |\n|---|\n| 1 |")


def test_the_instructors_page_shows_no_marker_and_says_how_to_hand_out_and_grade(written):
    target, _ = written
    page = (target / "instructors.md").read_text()
    assert not MARKERS.search(page)
    for needed in ("python3 course.py student DIR", "DIR/notebooks", "python3 course.py lab DIR",
                   "nbgrader generate_assignment", "nbgrader autograde",
                   "nbgrader generate_feedback", "pip install .[grade]", "course.py site --student"):
        assert needed in page, needed


def heading(depth: int, ident: str, text: str) -> dict:
    return {"type": "heading", "depth": depth, "identifier": ident,
            "children": [{"type": "text", "value": text}]}


def test_the_theme_highlights_code_and_writes_contents_pager_and_search(tmp_path, monkeypatch):
    page = render.Page({"intro", "attention"}, "intro")
    code = page.node({"type": "code", "lang": "python", "value": "def f(x):\n    return x < 1"})
    assert '<span class="k">def</span>' in code and "&lt;" in code
    assert page.node({"type": "code", "lang": "", "value": "a < b"}).count("<span") == 0
    tree = {"type": "root", "children": [
        heading(2, "one", "One"), {"type": "paragraph", "children": [{"type": "text", "value": "alpha"}]},
        heading(3, "one-a", "One a"), {"type": "code", "value": "beta()"},
        {"type": "output", "jupyter_data": {"output_type": "stream", "text": "gamma"}},
        heading(2, "two", "Two"), heading(4, "deep", "Deep")]}
    found = render.headings(tree)
    assert found == [(2, "one", "One"), (3, "one-a", "One a"), (2, "two", "Two")]
    toc = render.contents(found)
    assert toc.index('href="#one"') < toc.index('href="#one-a"') < toc.index('href="#two"')
    assert toc.count("<ul>") == toc.count("</ul>") == 2 and toc.count("<li>") == toc.count("</li>") == 3
    assert [s["heading"] for s in render.sections(tree)] == ["One", "One a", "Two", "Deep"]
    assert render.sections(tree)[1]["text"] == "beta()"  # code is searchable, outputs are not
    assert "gamma" not in json.dumps(render.sections(tree))
    nav = [("index", "Home"), ("attention", "3. Attention"), ("sources", "Sources")]
    middle = render.pager("attention", nav)
    assert 'rel="prev" href="index.html"' in middle and 'rel="next" href="sources.html"' in middle
    assert 'rel="prev"' not in render.pager("index", nav)
    assert 'rel="next"' not in render.pager("sources", nav)
    render.write_page(tmp_path, "attention", "3. Attention", code, nav, found, "Student edition")
    written = (tmp_path / "attention.html").read_text()
    assert 'id="search"' in written and "search.js" in written and "Student edition" in written
    assert ".highlight .k" in written and 'rel="next"' in written and 'class="contents"' in written
    index = render.search_index({"attention": {"frontmatter": {"title": "3. Attention"}, "mdast": tree}},
                                {"attention": "attention"})
    assert index[0] == {"url": "attention.html#one", "page": "3. Attention", "heading": "One",
                        "text": "alpha"}


def test_the_student_site_has_no_page_for_instructors(tmp_path):
    (tmp_path / "instructors.md").write_text("an earlier instructor's build")
    project.write_project(ROOT, tmp_path, "alice/course", "/usr/bin/python3", course.student_notebook)
    toc = re.findall(r"- file: (\S+)", (tmp_path / "myst.yml").read_text())
    assert toc == ["index.md", *[f"notebooks/{path.name}" for path in NOTEBOOKS], "sources.md"]
    assert not (tmp_path / "instructors.md").exists()
    assert "instructors" not in (tmp_path / "index.md").read_text()


def test_no_stored_output_on_the_student_site_says_an_empty_stub_passes(tmp_path):
    """The instructor's run printed "using your X from here on (it passes NAME)" under every
    `yours_or` cell; above an empty stub the student's page says what the cell will do instead."""
    claimed = sum(len(project.YOURS_PASSED.findall(json.dumps(json.loads(path.read_text())["cells"])))
                  for path in NOTEBOOKS)
    assert claimed >= len(NOTEBOOKS), "the committed notebooks print which answer a cell uses"
    project.write_project(ROOT, tmp_path, "alice/course", "/usr/bin/python3", course.student_notebook)
    said = []
    for path in NOTEBOOKS:
        for cell in json.loads((tmp_path / "notebooks" / path.name).read_text())["cells"]:
            for output in cell.get("outputs", []):
                text = json.dumps(output)
                assert "using your" not in text and "(it passes" not in text, (path.name, text)
                said += re.findall(r"this cell uses your \w+ once it passes [\w.]+", text)
    assert len(said) == claimed


def test_a_solution_marker_in_markdown_stops_the_student_site_naming_the_cell():
    notebook = exercise_notebook(metadata=True)
    notebook["cells"][2]["source"] += "\n\n### BEGIN HIDDEN TESTS\nassert f(2) == 4\n### END HIDDEN TESTS"
    with pytest.raises(ValueError, match="cell 2, a markdown cell starting '### Exercise 1.*"
                                         "'### BEGIN HIDDEN TESTS'"):
        project.site_notebook(notebook, project.colab_url("alice/course", "09_x.ipynb"),
                              course.student_notebook)


@pytest.mark.parametrize("latex, shown", [
    (r"\sqrt{d_k}", "√d_k"), (r"\frac{QK^\top}{\sqrt{d_k}}", "QKᵀ/(√d_k)"),
    (r"\mathrm{softmax}(x)_i", "softmax(x)_i"), (r"-\infty", "-∞"), (r"\tfrac{1}{2}", "1/2"),
    (r"\left(a\right) \cdot b", "(a) · b"), (r"\alpha\,\beta", "α β"), (r"K^{\top}", "Kᵀ"),
])
def test_maths_in_the_search_index_is_plain_text(latex, shown):
    assert render.plain_maths(latex) == shown
    tree = {"type": "root", "children": [heading(2, "s", "Scores"), {"type": "paragraph", "children": [
        {"type": "text", "value": "divide by "}, {"type": "inlineMath", "value": latex}]}]}
    (section,) = render.sections(tree)
    assert section["text"] == f"divide by {shown}" and "\\" not in section["text"]
    in_a_hint = {"type": "root", "children": [{"type": "details", "children": [
        {"type": "span", "class": "math-inline", "children": [{"type": "text", "value": latex}]}]}]}
    assert render.sections(in_a_hint)[0]["text"] == shown  # mystmd's maths inside raw HTML
    assert render.Page(set(), "index").node(in_a_hint) == (
        f'<details><span class="math-plain">{html.escape(shown)}</span></details>')  # on the page too


def rank(records: list[dict], query: str) -> list[dict]:
    """The site's search (render.SEARCH_RANKING, JavaScript) run in Node on `records`."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js runs the site's search script")
    script = (render.SEARCH_RANKING + f"\nconsole.log(JSON.stringify(courseSearch({json.dumps(records)}, "
              f"{json.dumps(query)})));")
    ran = subprocess.run([node, "-e", script], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(ran.stdout)


def test_the_search_ranks_the_page_where_the_word_stands_before_the_home_table():
    records = [
        {"url": "index.html", "page": "Home", "heading": "", "listing": True,
         "text": "3 Attention: compute attention by hand, the softmax saturation demo"},
        {"url": "tokens.html#bpe", "page": "1. Tokens", "heading": "BPE", "text": "merges and merges"},
        {"url": "attention.html#weights", "page": "3. Attention", "heading": "Weights",
         "text": "the softmax turns scores into weights"},
        {"url": "attention.html#overflow", "page": "3. Attention", "heading": "Softmax overflow",
         "text": "a softmax of large logits overflows; subtract the row's max before the softmax"},
    ]
    hits = rank(records, "softmax")
    assert [hit["url"] for hit in hits] == ["attention.html#overflow", "attention.html#weights",
                                            "index.html"]
    assert hits[0]["title"] == "3. Attention › Softmax overflow"
    assert hits[0]["snippet"].startswith("a softmax of large logits")
    assert [hit["url"] for hit in rank(records, "Softmax ROW")] == ["attention.html#overflow"]
    assert rank(records, "xqzjw") == [] and rank(records, "  ") == []
