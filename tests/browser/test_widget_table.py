"""The browser suite's widget table covers every notebook and every widget it stores.

Fast, with no browser: it reads the built notebooks. The browser suite then checks the same
table against what JupyterLab really renders.
"""

from __future__ import annotations

from collections import Counter

import pytest
from notebook_tools import SOURCES, notebook_paths, read
from widget_table import DRIVABLE, MODEL_KINDS, WIDGETS

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
NOTEBOOKS = {path.stem: path for path in notebook_paths()}


def stored_widget_views(path) -> int:
    return sum(WIDGET_VIEW in output.get("data", {})
               for cell in read(path).cells if cell.cell_type == "code"
               for output in cell.get("outputs", []))


def stored_controls(path) -> Counter:
    """(kind, description) of every control model in the notebook's saved widget state."""
    state = read(path).metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    found = Counter()
    for model in state.values():
        kind = MODEL_KINDS.get(model["model_name"])
        if kind is not None:
            found[(kind, model["state"].get("description", ""))] += 1
    return found


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_name.ipynb found"


def test_every_notebook_has_an_entry_and_every_entry_a_notebook():
    missing = sorted(set(NOTEBOOKS) - set(WIDGETS))
    assert not missing, (
        f"{missing}: not covered by the browser suite. Add an entry to WIDGETS in "
        "tests/browser/widget_table.py (an empty list if the notebook shows no widget).")
    # An entry may come before its notebook is built, but not without a source to build from.
    stale = sorted(name for name in set(WIDGETS) - set(NOTEBOOKS)
                   if not (SOURCES / f"{name}.py").exists())
    assert not stale, f"{stale}: in tests/browser/widget_table.py but not in notebooks/"


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_table_matches_the_widgets_the_notebook_stores(name):
    entry = WIDGETS.get(name)
    if entry is None:
        pytest.fail(f"{name} has no entry in tests/browser/widget_table.py")
    path = NOTEBOOKS[name]
    views = stored_widget_views(path)
    assert views == len(entry), (
        f"{name} displays {views} widget view(s) but tests/browser/widget_table.py lists "
        f"{len(entry)}: add or remove a Widget(...) so the browser suite moves every one")
    listed = Counter((c.kind, c.label) for widget in entry for c in widget.controls)
    stored = stored_controls(path)
    assert listed == stored, (
        f"{name}: controls in the notebook's widget state {sorted(stored.elements())} differ "
        f"from the table's {sorted(listed.elements())}")
    for widget in entry:
        assert widget.drives in {"figure", "html", "display"}, f"{name}: drives={widget.drives!r}"
        assert (widget.drives == "display") == (not widget.controls), (
            f"{name}: a widget with controls drives a figure or HTML; one without only displays")
        for control in widget.controls:
            assert control.kind in DRIVABLE, (
                f"{name}: the browser suite cannot move a {control.kind!r} yet "
                "(teach tests/browser/lab_page.py how)")
            if control.kind == "text":
                assert control.type_text, f"{name}: say what to type into text box {control.label!r}"
