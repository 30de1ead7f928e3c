"""catch_up's pieces: a notebook cut into sections, the names a cell makes and reads, and the
refusal of an untrained model (the kernel-side run is tests/notebooks/test_sections_alone.py)."""

from __future__ import annotations

import math

import pytest

from helpers.lab.sections import (
    catch_up,
    defined_names,
    earlier_and_own_code,
    find_notebook,
    refuse_untrained,
    split_sections,
    used_names,
)


def cell(kind: str, source: str) -> dict:
    return {"cell_type": kind, "source": source, "metadata": {}}


CELLS = [cell("markdown", "# Title"), cell("code", "import torch"),
         cell("markdown", "Intro.\n\n## 1. First\nText."), cell("code", "x = 1\ndef f(): return x"),
         cell("markdown", "## 2. Second"), cell("code", 'catch_up("01_a", "2.")'),
         cell("code", "y = f() + x\n### BEGIN HIDDEN TESTS\nsecret = 1\n### END HIDDEN TESTS\n"),
         cell("markdown", "## Check your understanding"), cell("code", "print(y)")]


def test_sections_start_at_a_heading_even_below_other_text_in_the_cell():
    setup, sections = split_sections(CELLS)
    assert setup == CELLS[:2]
    assert [title for title, _ in sections] == ["1. First", "2. Second", "Check your understanding"]
    assert sections[1][1] == CELLS[4:7]


def test_earlier_code_leaves_out_catch_up_calls_and_hidden_tests():
    earlier, own = earlier_and_own_code(CELLS, "Check")
    assert earlier == ["x = 1\ndef f(): return x", "y = f() + x\n"]
    assert own == ["print(y)"]


def test_a_section_is_named_by_a_prefix_of_exactly_one_title():
    with pytest.raises(ValueError, match=r"section='3.' starts 0 section titles"):
        earlier_and_own_code(CELLS, "3.")


def test_defined_names_are_only_those_a_run_from_the_top_surely_binds():
    source = ("import numpy as np\nfor i in range(3):\n    total = i\nclass A: pass\nold = 1\ndel old\n"
              "a, (b, *c) = 1, (2, 3)\nd[0] = squares = [x * x for x in range(3)]\n"
              "if np:\n    maybe = 1\nwith open('f') as f:\n    text = f.read()")
    assert defined_names(source) == {"np", "i", "A", "a", "b", "c", "squares", "f", "text"}
    assert used_names("y = f(x) + z.w") == {"f", "x", "z"}
    assert defined_names("%time x = 1") == set()  # a magic: not Python, nothing to look for


def test_an_untrained_loss_is_refused_with_the_numbers_and_a_trained_one_passes():
    with pytest.raises(RuntimeError, match=r"not trained: its loss here is 4.22, a uniform guess "
                                           r"scores ln 70 = 4.25"):
        refuse_untrained(4.22, 70)
    refuse_untrained(0.79 * math.log(70), 70)


@pytest.mark.parametrize(("loss", "vocab", "match"), [
    (1.0, 1, r"vocab_size=1, expected an int >= 2"), (float("nan"), 70, r"loss=nan, expected a finite"),
    (-0.5, 70, r"loss=-0.5, expected")])
def test_refuse_untrained_rejects_bad_arguments(loss, vocab, match):
    with pytest.raises(ValueError, match=match):
        refuse_untrained(loss, vocab)


def test_catch_up_refuses_a_bad_notebook_name_or_section_before_anything_runs():
    with pytest.raises(ValueError, match=r"name='gpt', expected a notebook name such as '07_gpt'"):
        find_notebook("gpt")
    with pytest.raises(ValueError, match=r"section='', expected the start of a `##` title"):
        catch_up("07_gpt", "", namespace={})


def test_the_section_tools_refuse_what_is_not_cells_or_source():
    from helpers.lab.sections import defined_names, split_sections, used_names

    with pytest.raises(TypeError, match="cells must be a list of notebook cells"):
        split_sections("## 1. A section")
    with pytest.raises(TypeError, match="cells must be a list of notebook cells"):
        split_sections([{"source": "x = 1"}])
    for function in (defined_names, used_names):
        with pytest.raises(TypeError, match="source must be a cell's source as a str"):
            function(["x = 1"])
