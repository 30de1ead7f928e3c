"""Driving one notebook in a real JupyterLab page, as a student would, through Playwright.

`LabNotebook` opens a notebook, runs every cell from the Run menu, waits for the kernel to go
idle, reads what went wrong (error outputs, cells the run never reached, "Error displaying
widget"), finds the widget views and moves their controls. Everything it reads comes from the
page or from the notebook JupyterLab itself saved; nothing is simulated.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from lab_server import LabServer
from widget_table import Control, Widget

# Seconds: generous for 2 busy cores; a notebook is meant to run in well under a minute.
RUN_ALL_TIMEOUT = 480
REDRAW_TIMEOUT = 60
KERNEL_START_TIMEOUT = 120

# A widget view drawn straight into a cell's own output area (not a widget inside an Output
# widget, whose output area sits deeper). ipywidgets 8 draws a view that failed as a box "Click
# to show javascript error." (.jupyter-widgets-error-widget), which does not count as drawn.
VIEW_IN_CELL = (":scope .jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output"
                " > .jupyter-widgets:not(:has(.jupyter-widgets-error-widget))")
VIEW_SELECTOR = ".jp-Notebook .jp-CodeCell " + VIEW_IN_CELL.removeprefix(":scope ")

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# Every control kind the suite can move -> the CSS of its container in ipywidgets 8's DOM.
CONTROL_SELECTOR = ", ".join([
    ".widget-slider", ".widget-text", ".widget-textarea", ".widget-dropdown",
    ".widget-select", ".widget-checkbox",
])

JS_PROMPTS = """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell'))
    .map(cell => cell.querySelector('.jp-InputPrompt').textContent.trim())"""

# Per code cell: its prompt, every stderr/error text it shows, whether it shows a widget error.
JS_CELL_REPORT = """() => Array.from(document.querySelectorAll('.jp-Notebook .jp-CodeCell')).map(
    (cell, index) => ({
        index,
        prompt: cell.querySelector('.jp-InputPrompt').textContent.trim(),
        stderr: Array.from(cell.querySelectorAll(
            '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'))
            .map(out => out.innerText),
        widgetErrors: cell.querySelectorAll('.jupyter-widgets-error-widget').length,
        views: cell.querySelectorAll('VIEW_IN_CELL').length,
        text: cell.querySelector('.jp-Cell-outputWrapper')
            ? cell.querySelector('.jp-Cell-outputWrapper').innerText : '',
    }))""".replace("VIEW_IN_CELL", VIEW_IN_CELL)

# What a widget view's controls drive, as a string that changes whenever the picture does:
# every image (its data URL) and every HTML widget's markup, in display order.
JS_DRIVEN = """(view, drives) => {
    if (drives === 'figure') {
        const images = Array.from(view.querySelectorAll('.widget-output img'));
        return images.map(img => img.getAttribute('src') || '').join('|');
    }
    return Array.from(view.querySelectorAll('.widget-html-content'))
        .map(el => el.innerHTML).join('|');
}"""

# The value a control shows on screen (slider readout, selected option, box text, tick).
JS_SHOWN_VALUE = """(control) => {
    const readout = control.querySelector('.widget-readout');
    if (readout) return readout.textContent.trim();
    const select = control.querySelector('select');
    if (select) return select.value;
    const box = control.querySelector('input[type=checkbox]');
    if (box) return String(box.checked);
    const input = control.querySelector('input, textarea');
    return input ? input.value : null;
}"""

# The kind and description of a control container, as widget_table names them.
JS_DESCRIBE = """(control) => {
    const has = name => control.classList.contains(name);
    const kind = has('widget-slider') ? 'slider'
        : (has('widget-text') || has('widget-textarea')) ? 'text'
        : (has('widget-dropdown') || has('widget-select')) ? 'dropdown'
        : has('widget-checkbox') ? 'checkbox' : 'unknown';
    let label = '';
    if (kind === 'checkbox') {
        const span = control.querySelector('.widget-label-basic span');
        label = span ? span.textContent : '';
    } else {
        const el = control.querySelector(':scope > .widget-label');
        label = el ? el.textContent : '';
    }
    return {kind, label: label.replace(/\\u200b/g, '').trim()};
}"""


@dataclass
class Move:
    """One control moved and what it did: the value shown and the driven output, before/after."""
    control: Control
    value_before: str | None
    value_after: str | None
    driven_before: str
    driven_after: str

    def describe(self) -> str:
        return f"{self.control.kind} {self.control.label!r}: {self.value_before!r} -> {self.value_after!r}"


class LabNotebook:
    """One notebook open in a JupyterLab page."""

    def __init__(self, page, lab: LabServer, name: str) -> None:
        self.page = page
        self.lab = lab
        self.name = name
        self.path = f"{name}.ipynb"
        self.console_errors: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.console_errors.append(m.text))
        page.on("pageerror", lambda e: self.console_errors.append(f"page error: {e}"))

    # ---- opening, running, waiting -------------------------------------------------------------
    def kernel_state(self) -> str | None:
        for session in self.lab.api("GET", "/api/sessions"):
            if session.get("path") == self.path and session.get("kernel"):
                return session["kernel"]["execution_state"]
        return None

    def wait_for_idle_kernel(self, timeout: float) -> None:
        """Until the server reports this notebook's kernel idle and the page's indicator agrees."""
        deadline = time.monotonic() + timeout
        while self.kernel_state() != "idle":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: kernel not idle after {timeout:.0f} s "
                                   f"(state {self.kernel_state()!r})")
            time.sleep(0.25)
        self.page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status=idle]",
                                    timeout=max(1.0, deadline - time.monotonic()) * 1000)

    def open(self) -> None:
        notebook = json.loads((self.lab.root_dir / self.path).read_text(encoding="utf-8"))
        self.code_cell_count = sum(cell["cell_type"] == "code" for cell in notebook["cells"])
        self.page.goto(self.lab.lab_url(self.path))
        self.page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell",
                                    timeout=KERNEL_START_TIMEOUT * 1000)
        self.wait_for_idle_kernel(KERNEL_START_TIMEOUT)
        # Fold the file browser away (Ctrl+B, View > Left Sidebar): wider figures on screenshots.
        if self.page.locator("#jp-left-stack:visible").count():
            self.page.keyboard.press("Control+b")

    def menu(self, menu: str, item: str) -> None:
        self.page.click(f".lm-MenuBar-itemLabel:text-is('{menu}')")
        self.page.click(f".lm-Menu-itemLabel:text-is('{item}')")

    def run_all(self) -> float:
        """Edit > Clear Outputs of All Cells, then Run > Run All Cells, as a student would.

        Clearing first means no stored output or prompt can pass for the run's own. Returns the
        seconds from Run All Cells until every cell ran and the kernel was idle.
        """
        self.menu("Edit", "Clear Outputs of All Cells")
        self.page.wait_for_function(
            f"() => ({JS_PROMPTS})().every(p => !/[*0-9]/.test(p))", timeout=30_000)
        started = time.monotonic()
        self.menu("Run", "Run All Cells")
        # Every prompt shows "[*]" (queued or running) or its number once the run has begun; the
        # run has ended when none shows "[*]" (cells after an error keep "[ ]").
        self.page.wait_for_function(
            f"() => ({JS_PROMPTS})().some(p => /[*0-9]/.test(p))", timeout=30_000)
        self.page.wait_for_function(
            f"() => !({JS_PROMPTS})().some(p => p.includes('*'))", timeout=RUN_ALL_TIMEOUT * 1000,
            polling=500)
        self.wait_for_idle_kernel(RUN_ALL_TIMEOUT)
        return time.monotonic() - started

    def save(self) -> dict:
        """Save from the page (Ctrl+S) and return the notebook JupyterLab wrote to disk."""
        target = self.lab.root_dir / self.path
        before = target.stat().st_mtime_ns
        # From the menu, not with a click into the notebook: a click that lands on JupyterLab 4's
        # footer below the last cell ("Click to add a cell.") adds an empty, unrun cell.
        self.menu("File", "Save Notebook")
        deadline = time.monotonic() + 30
        while target.stat().st_mtime_ns == before:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: JupyterLab did not save within 30 s")
            time.sleep(0.25)
        self.page.wait_for_function(
            "() => !document.querySelector('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty')",
            timeout=30_000)
        time.sleep(0.5)  # the write itself finishes after the dirty mark clears
        return json.loads(target.read_text(encoding="utf-8"))

    # ---- what went wrong ------------------------------------------------------------------------
    def problems(self, saved: dict) -> list[str]:
        """Every error the run left: error outputs, unexecuted cells, widget display errors."""
        found = []
        code_cells = [c for c in saved["cells"] if c["cell_type"] == "code"]
        for index, cell in enumerate(code_cells):
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    found.append(f"code cell {index}: {output.get('ename')}: {output.get('evalue')}")
        reports = self.page.evaluate(JS_CELL_REPORT)
        if len(reports) != self.code_cell_count or len(code_cells) != self.code_cell_count:
            found.append(f"the page shows {len(reports)} code cells and saved {len(code_cells)}, "
                         f"the notebook opened with {self.code_cell_count}: a cell was added or "
                         "removed while the suite drove it")
        for report in reports:
            index = report["index"]
            if not report["prompt"].strip("[]: ").isdigit():
                found.append(f"code cell {index}: not executed (prompt {report['prompt']!r})")
            for text in report["stderr"]:
                if "Traceback" in text:
                    found.append(f"code cell {index}: shows an error:\n{text[-1500:]}")
            if report["widgetErrors"]:
                found.append(f"code cell {index}: shows a widget that failed to draw "
                             "('Click to show javascript error.')")
            if "Error displaying widget" in report["text"]:
                found.append(f"code cell {index}: shows 'Error displaying widget'")
            outputs = code_cells[index].get("outputs", []) if index < len(code_cells) else []
            stored = sum(WIDGET_VIEW in output.get("data", {}) for output in outputs)
            if report["views"] != stored:
                found.append(f"code cell {index}: {stored} widget view(s) in its outputs, "
                             f"{report['views']} drawn (a widget that shows nothing or an error)")
        body = self.page.inner_text("body")
        if "Error displaying widget" in body and not any("Error displaying" in f for f in found):
            found.append("the page shows 'Error displaying widget'")
        return found

    # ---- widgets --------------------------------------------------------------------------------
    def views(self):
        return self.page.locator(VIEW_SELECTOR)

    def controls_of(self, view) -> list[tuple]:
        """(container locator, {kind, label}) of every control in a view, in display order."""
        containers = view.locator(CONTROL_SELECTOR)
        return [(containers.nth(i), containers.nth(i).evaluate(JS_DESCRIBE))
                for i in range(containers.count())]

    def driven(self, view, drives: str) -> str:
        return view.evaluate(JS_DRIVEN, drives)

    def move(self, container, control: Control) -> None:
        """Change one control as a student would."""
        if control.kind == "slider":
            handle = container.locator(".noUi-handle").first
            handle.scroll_into_view_if_needed()
            now = float(handle.get_attribute("aria-valuenow"))
            top = float(handle.get_attribute("aria-valuemax"))
            handle.focus()
            self.page.keyboard.press("End" if now < top else "Home")
        elif control.kind == "dropdown":
            select = container.locator("select")
            options = select.locator("option").evaluate_all("os => os.map(o => o.value)")
            current = select.input_value()
            select.select_option(value=options[(options.index(current) + 1) % len(options)])
        elif control.kind == "checkbox":
            container.locator("input[type=checkbox]").click()
        elif control.kind == "text":
            box = container.locator("input, textarea").first
            box.fill(control.type_text)
            box.press("Enter")
        else:
            raise ValueError(f"cannot move a {control.kind!r} control")

    def drive(self, view, widget: Widget, timeout: float = REDRAW_TIMEOUT) -> list[Move]:
        """Move every control of one widget view in turn; each must redraw what it drives."""
        found = self.controls_of(view)
        shown = [(d["kind"], d["label"]) for _, d in found]
        expected = [(c.kind, c.label) for c in widget.controls]
        if shown != expected:
            raise AssertionError(f"{self.name}: the widget shows controls {shown}, the table "
                                 f"lists {expected} (tests/browser/widget_table.py)")
        moves = []
        for (container, _), control in zip(found, widget.controls, strict=True):
            value_before = container.evaluate(JS_SHOWN_VALUE)
            driven_before = self.driven(view, widget.drives)
            self.move(container, control)
            try:
                view.page.wait_for_function(
                    f"([view, drives, before]) => ({JS_DRIVEN})(view, drives) !== before",
                    arg=[view.element_handle(), widget.drives, driven_before],
                    timeout=timeout * 1000, polling=250)
            except Exception as error:
                raise AssertionError(
                    f"{self.name}: moving {control.kind} {control.label!r} did not change the "
                    f"{widget.drives} it drives within {timeout:.0f} s") from error
            self.wait_for_idle_kernel(REDRAW_TIMEOUT)
            moves.append(Move(control, value_before, container.evaluate(JS_SHOWN_VALUE),
                              driven_before, self.driven(view, widget.drives)))
        return moves

    def screenshot(self, path: Path, view=None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if view is not None:  # the widget's controls at the top of the screen, its figure below
            view.evaluate("view => view.scrollIntoView({block: 'start'})")
            self.page.wait_for_timeout(300)
        self.page.screenshot(path=str(path))
