"""The term's plan (tools/lesson_plan.py, notebooks/INSTRUCTORS.md): every `##` heading is marked
core or optional, a class can stop every ~25 minutes, the core path fits a 14-week term of
75-minute lectures, and the page in the repository is the one the marks make."""

from __future__ import annotations

import sys

import pytest
from notebook_tools import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import lesson_plan  # noqa: E402

NAMES = lesson_plan.names()


@pytest.mark.parametrize("name", NAMES)
def test_no_two_stops_are_more_than_25_minutes_apart(name):
    long = [(part.heading, round(part.minutes, 1)) for part in lesson_plan.parts(name)
            if part.minutes > lesson_plan.MAX_BETWEEN_STOPS]
    assert not long, f"{name}: parts longer than {lesson_plan.MAX_BETWEEN_STOPS} min, add a ### stop: {long}"


def test_the_core_path_fits_a_term_of_75_minute_lectures():
    core = [part for name in NAMES for part in lesson_plan.parts(name) if part.core]
    lectures = lesson_plan.sessions(core, lesson_plan.LECTURE_MINUTES)
    assert len(lectures) <= lesson_plan.WEEKS, f"the core path needs {len(lectures)} lectures"
    assert all(sum(p.minutes for p in lecture) <= lesson_plan.LECTURE_MINUTES for lecture in lectures)
    assert {part.notebook for part in core} == set(NAMES), "every notebook has a core"


def test_sessions_pack_consecutive_parts_without_passing_the_length():
    parts = [lesson_plan.Part("01_x", "s", f"p{i}", True, minutes) for i, minutes in enumerate([20, 20, 15, 40, 5])]
    packed = lesson_plan.sessions(parts, 50)
    assert [[p.heading for p in session] for session in packed] == [["p0", "p1"], ["p2"], ["p3", "p4"]]
    assert [p.heading for session in packed for p in session] == [p.heading for p in parts]


def test_a_heading_without_its_mark_is_refused_by_name(tmp_path, monkeypatch):
    (tmp_path / "99_demo.py").write_text("# %% [markdown]\n# # Demo\n\n# %% [markdown]\n# ## 1. Unmarked\n")
    monkeypatch.setattr(lesson_plan, "SOURCES", tmp_path)
    monkeypatch.setattr(lesson_plan, "NOTEBOOKS", tmp_path)
    with pytest.raises(ValueError, match=r"99_demo: the heading '## 1. Unmarked' ends with neither"):
        lesson_plan.parts("99_demo")


def test_the_instructors_page_in_the_repository_is_up_to_date():
    assert lesson_plan.PAGE.read_text(encoding="utf-8") == lesson_plan.page(), (
        "notebooks/INSTRUCTORS.md is out of date: run python tools/lesson_plan.py")
