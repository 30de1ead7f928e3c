"""The cells after an exercise run on the student's answer, or the exercise says it stands alone.

The README promises that the cells after an exercise run on the student's answer once it passes
(`yours_or`, helpers/lab/exercises/__init__.py). tools/exercise_use.py reads, from the notebooks'
sources, which later cells use each exercise; these tests hold every exercise to the promise or to
its own words (exercise_use.STANDS_ALONE), and check the reader itself on small made-up notebooks.
"""

from __future__ import annotations

import sys

import pytest
from notebook_tools import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import exercise_use  # noqa: E402
from build_notebooks import parse_cells  # noqa: E402

EVERY = exercise_use.every_exercise()


def made_up(*later: str, text: str = "### Exercise: square\nWrite `f(x)`.") -> list[tuple[str, str]]:
    """A notebook's cells: the exercise's text, its answer cell, its check, then `later` cells."""
    answer = "def f(x):\n    ### BEGIN SOLUTION\n    return x * x\n    ### END SOLUTION"
    return [("markdown", text), ("code", answer), ("code", 'check("x.f", f)'),
            *(("code", source) for source in later)]


def test_the_reader_finds_every_exercise_of_the_course():
    names = [use.name for use in EVERY]
    assert len(names) == len(set(names)) and len(names) >= 71
    assert {use.notebook for use in EVERY} == {path.stem for path in
                                               (ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py")}


@pytest.mark.parametrize("use", EVERY, ids=lambda use: use.name)
def test_every_exercise_is_used_by_a_later_cell_or_says_it_stands_alone(use):
    assert use.users or use.stands_alone, (
        f"{use.notebook}: no later cell runs on {use.name} (no `x = yours_or({use.name!r}, ...)` "
        f"whose x a later cell reads), and its text does not say "
        f"{exercise_use.STANDS_ALONE!r}")


@pytest.mark.parametrize("use", [use for use in EVERY if use.stands_alone], ids=lambda use: use.name)
def test_an_exercise_that_says_it_stands_alone_is_used_by_no_later_cell(use):
    assert not use.users, f"{use.name} says it stands alone, but cells {use.users} run on it"


@pytest.mark.parametrize("name", ["masking.causal_softmax", "masking.padding_mask",
                                  "multihead_attention.kv_cache_bytes_per_token",
                                  "serving.quantize_int8_rows", "serving.quantize_int4_groups",
                                  "serving.accept_or_reject"])
def test_the_answers_issue_51_named_are_used_later(name):
    assert [use for use in EVERY if use.name == name and use.users]


def test_notebook_14_quantizes_the_model_and_sweeps_k_through_the_answers_in_use():
    cells = parse_cells((ROOT / "notebooks" / "src" / "14_serving.py").read_text(encoding="utf-8"))
    sweep = [source for _, source in cells if "for k in range(1, 7)" in source]
    quantizer = [source for _, source in cells if "def quantize_model_with" in source]
    assert len(sweep) == 1 and "verify" in exercise_use.names_read(sweep[0])
    assert len(quantizer) == 1 and {"quantize8", "quantize4"} <= exercise_use.names_read(quantizer[0])
    assert any("quantize_model_with(target" in source for _, source in cells)


def test_a_later_cell_that_reads_what_yours_or_bound_uses_the_exercise():
    [use] = exercise_use.exercise_uses("x", made_up('g = yours_or("x.f", f, abs)', "print(g(3))"))
    assert use.users == (4,) and use.bound == ("g",) and not use.stands_alone


def test_the_yours_or_cell_itself_uses_the_exercise_when_it_reads_the_name_below_the_call():
    [use] = exercise_use.exercise_uses("x", made_up('g = yours_or("x.f", f, abs)\nprint(g(3))'))
    assert use.users == (3,)


@pytest.mark.parametrize("later", [
    ["print(f)"],                                      # the answer by name, without yours_or
    ['g = yours_or("x.f", f, abs)'],                   # bound, but no cell reads g
    ['g = yours_or("x.other", f, abs)', "g(3)"],       # another exercise's name
    ['print(g)', 'g = yours_or("x.f", f, abs)'],       # read only above the call
], ids=["no yours_or", "bound never read", "other exercise", "read above"])
def test_an_answer_no_later_cell_runs_on_is_unused(later):
    [use] = exercise_use.exercise_uses("x", made_up(*later))
    assert use.users == ()


def test_the_stand_alone_words_are_read_across_line_breaks_and_markdown_and_a_catch_up_cell():
    text = ("### Exercise: square\nWrite `f(x)`. This exercise stands alone: no later\n# cell "
            "runs on your answer.")
    cells = made_up(text=text)
    cells.insert(1, ("code", 'catch_up("01_x", "2.")'))
    [use] = exercise_use.exercise_uses("x", cells)
    assert use.stands_alone and "Exercise: square" in use.text
    [plain] = exercise_use.exercise_uses("x", made_up(text="### Exercise: square\nNo words."))
    assert not plain.stands_alone


def test_the_reader_refuses_cells_that_are_not_cell_type_and_source_pairs():
    with pytest.raises(ValueError, match="^cells is str, expected a list of"):
        exercise_use.exercise_uses("x", "def f(x): ...")
    with pytest.raises(ValueError, match=r"^notebooks is \[''\], expected names like '04'"):
        exercise_use.every_exercise([""])
