"""Widgets that make an idea move, with a plain figure wherever widgets cannot render.

`Explorer` ties a few ipywidgets controls to a drawing function: every time a control changes,
the function is called again with the controls' values and its figure replaces the old one.
The drawing function returns the numbers it drew, kept in `explorer.last`, so that a test (or an
nbval assertion cell) can move a control with `explorer.set(...)` and check that the picture
really changed. Notebooks show the same drawing function once as a static figure before the
widget, for nbval and for viewers that do not run JavaScript.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import display
from IPython.utils.capture import capture_output


class Explorer:
    """Controls on top, a figure below; `draw(**values)` is re-run whenever a control moves.

    draw: called with one keyword per control; draws with matplotlib and returns what it drew.
    controls: name -> ipywidgets control (slider, text box, dropdown ...), in display order.
    """

    def __init__(self, draw: Callable[..., Any], **controls: widgets.ValueWidget) -> None:
        if not controls:
            raise ValueError("Explorer needs at least one control, got none")
        self.draw = draw
        self.controls = controls
        self.output = widgets.Output()
        self.last: Any = None
        self.redraws = 0
        self.start = self.values()  # what reset() returns to
        for control in controls.values():
            control.observe(self._redraw, names="value")
        self._redraw()

    def values(self) -> dict[str, Any]:
        return {name: control.value for name, control in self.controls.items()}

    def set(self, **values: Any) -> Any:
        """Move controls as a student would; returns what the redrawn figure shows."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise KeyError(f"Explorer.set: no control named {sorted(unknown)}; "
                           f"controls are {list(self.controls)}")
        for name, value in values.items():
            self.controls[name].value = value
        return self.last

    def reset(self) -> Any:
        """Move every control back to where it started; returns what the figure shows then.

        A check cell that begins with `first = explorer.reset()` gives the same answer when a
        student runs it twice (after the first run the controls sit where that run left them)."""
        return self.set(**self.start)

    def _redraw(self, _change: Any = None) -> None:
        # Capture what `draw` shows and hand it to the Output widget ourselves, rather than
        # drawing inside `with self.output:`: that form relies on the front end to route the
        # output, and where there is none (nbval, a script) the figures leak into the cell.
        with capture_output() as shown:
            self.last = self.draw(**self.values())
            plt.show()
        self.output.outputs = ()
        if shown.stdout:
            self.output.append_stdout(shown.stdout)
        for item in shown.outputs:
            self.output.append_display_data(item)
        self.redraws += 1

    def widget(self) -> widgets.Widget:
        return widgets.VBox([widgets.HBox(list(self.controls.values())), self.output])

    def _ipython_display_(self) -> None:
        display(self.widget())
