"""`python3 course.py site`: its arguments, its errors without mystmd, and the MyST project it writes.

No mystmd needed here (tests/browser/test_site.py builds the real site and crawls it in Chromium).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


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
    assert "usage: python3 course.py site [DIR]" in capsys.readouterr().out


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
        assert len(shown["cells"]) == len(original["cells"]) + 1
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
