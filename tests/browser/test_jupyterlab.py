"""Every notebook in a real JupyterLab in headless Chromium, as a student meets it.

For each notebook: open it, Run > Run All Cells, wait for the kernel to go idle, and check that
no cell shows an error, every cell ran, and no widget shows "Error displaying widget"; the
number of widget views must be the one in tests/browser/widget_table.py. Then every control of
every widget is moved (slider, dropdown, text box, checkbox) and what it drives must change.
A screenshot per notebook (and per widget) lands in screenshots/browser/ for a person to look at.

Leave these out locally with `-m "not browser"`; the README's test command runs them.
"""

from __future__ import annotations

import time

import pytest
from lab_page import LabNotebook
from notebook_tools import notebook_paths
from widget_table import WIDGETS

pytestmark = pytest.mark.browser

NAMES = [path.stem for path in notebook_paths()]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_jupyterlab_and_its_widgets_move(name, page, lab, screenshots):
    entry = WIDGETS.get(name)
    if entry is None:
        pytest.fail(f"{name} has no entry in tests/browser/widget_table.py", pytrace=False)
    started = time.monotonic()
    notebook = LabNotebook(page, lab, name)
    notebook.open()
    run_seconds = notebook.run_all()
    saved = notebook.save()
    notebook.screenshot(screenshots / f"{name}.png")
    problems = notebook.problems(saved)
    assert not problems, (f"{name} in JupyterLab:\n" + "\n".join(problems)
                          + "\nbrowser console errors:\n" + "\n".join(notebook.console_errors[-10:]))

    views = notebook.views()
    assert views.count() == len(entry), (
        f"{name}: JupyterLab renders {views.count()} widget view(s), "
        f"tests/browser/widget_table.py lists {len(entry)}")
    moved = []
    for number, widget in enumerate(entry, start=1):
        view = views.nth(number - 1)
        for move in notebook.drive(view, widget):
            assert move.driven_after != move.driven_before, move.describe()
            assert move.value_after != move.value_before, (
                f"{name}: {move.describe()}: the control shows the same value after the move")
            if widget.drives == "figure":
                assert move.driven_after.startswith("data:image/png"), (
                    f"{name}: after {move.describe()} the Output area holds no figure")
            else:
                assert move.driven_after.strip(), f"{name}: after {move.describe()} the HTML is empty"
            moved.append(move.describe())
        notebook.screenshot(screenshots / f"{name}-widget-{number}.png", view)
    assert not notebook.problems(notebook.save()), f"{name}: moving the widgets left an error"
    print(f"{name}: run all {run_seconds:.1f} s, {len(moved)} control(s) moved "
          f"({'; '.join(moved) or 'no widgets'}), {time.monotonic() - started:.1f} s in all")


BROKEN_CELLS = [
    "import ipywidgets as widgets\nimport matplotlib.pyplot as plt\nfrom helpers.lab.widgets import Explorer",
    # An Explorer whose figure ignores one of its controls: moving `ignored` must be caught.
    "def draw(slope, ignored):\n    figure, axis = plt.subplots(figsize=(4, 2))\n"
    "    axis.plot([0, 1], [0, slope])\n    axis.set(title=f'slope {slope}')\n    return slope\n\n"
    "Explorer(draw, slope=widgets.IntSlider(value=1, min=0, max=5, description='slope'),\n"
    "         ignored=widgets.Dropdown(options=['a', 'b'], description='ignored'))",
    # A widget whose model is gone by the time the page draws it.
    "from IPython.display import display\ngone = widgets.IntSlider(description='gone')\n"
    "display(gone)\ngone.close()",
    # A view of a widget model the kernel never made: the page draws nothing in its place.
    "display({'application/vnd.jupyter.widget-view+json': {\n"
    "    'model_id': '0123456789abcdef0123456789abcdef', 'version_major': 2, 'version_minor': 0}},\n"
    "    raw=True)",
    # A widget whose front-end code does not exist: ipywidgets draws an error box instead.
    "from traitlets import Unicode\n\nclass Unknown(widgets.DOMWidget):\n"
    "    _view_name = Unicode('UnknownView').tag(sync=True)\n"
    "    _view_module = Unicode('no-such-widget-module').tag(sync=True)\n"
    "    _view_module_version = Unicode('1.0.0').tag(sync=True)\n\nUnknown()",
    "1 / 0",
    "print('the run stopped above, so this never runs')",
]


def test_the_checks_catch_a_broken_notebook(page, lab, screenshots):
    """The suite's own eyes: errors, unrun cells, dead widgets and dead controls are all seen."""
    import nbformat
    from widget_table import Widget, dropdown, slider

    broken = nbformat.v4.new_notebook()
    broken.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    broken.cells = [nbformat.v4.new_code_cell(source) for source in BROKEN_CELLS]
    nbformat.write(broken, lab.root_dir / "zz_broken.ipynb")
    notebook = LabNotebook(page, lab, "zz_broken")
    notebook.open()
    notebook.run_all()
    problems = "\n".join(notebook.problems(notebook.save()))
    notebook.screenshot(screenshots / "selfcheck-broken-notebook.png")
    assert "ZeroDivisionError" in problems
    assert "code cell 6: not executed" in problems
    assert "code cell 2: 1 widget view(s) in its outputs, 0 drawn" in problems
    assert "code cell 3: 1 widget view(s) in its outputs, 0 drawn" in problems
    assert "code cell 4: shows a widget that failed to draw" in problems
    assert "code cell 1:" not in problems, "the working Explorer was reported"
    assert "code cells" not in problems, "the cell count was reported for an untouched notebook"
    # The footer under the last cell adds a cell when clicked: a stray click must be seen.
    notebook.page.click(".jp-Notebook-footer")
    added = "\n".join(notebook.problems(notebook.save()))
    assert f"shows {len(BROKEN_CELLS) + 1} code cells and saved {len(BROKEN_CELLS) + 1}" in added
    assert f"code cell {len(BROKEN_CELLS)}: not executed" in added
    explorer = notebook.views().first
    with pytest.raises(AssertionError, match="moving dropdown 'ignored' did not change"):
        notebook.drive(explorer, Widget((slider("slope"), dropdown("ignored")), drives="figure"),
                       timeout=10)
    with pytest.raises(AssertionError, match="the widget shows controls"):
        notebook.drive(explorer, Widget((slider("slope"),), drives="figure"))
