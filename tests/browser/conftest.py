"""Fixtures of the browser suite: Debian's Chromium, Playwright, and one JupyterLab server.

The server and the browser live for this folder's tests only (module scope), serve copies of the
notebooks from a temporary folder, and are stopped (the server by its own PID) when the module
ends, passed or failed.

A missing Chromium is installed in CI only (CI=true). Elsewhere the suite asks on the terminal
first (y/N, once a session), and with no terminal or on a "no" it skips, naming the command that
installs it (tools/install_browser.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))  # lab_server, lab_page, widget_table

from lab_server import LabServer, copy_notebooks, launch_chromium  # noqa: E402
from notebook_tools import notebook_paths  # noqa: E402

SCREENSHOTS = ROOT / "screenshots" / "browser"


def load_installer():
    spec = importlib.util.spec_from_file_location("install_browser", ROOT / "tools" / "install_browser.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def terminal_question(config: pytest.Config, installer) -> Callable[[str], bool | None]:
    """Ask on the user's terminal with pytest's capture of stdin and stdout suspended (as pdb
    does): the yes or no, or None when stdin is no terminal."""
    capture = config.pluginmanager.getplugin("capturemanager")

    def ask(question: str) -> bool | None:
        suspended = contextlib.nullcontext() if capture is None else uncaptured(capture)
        with suspended:
            return installer.ask_on_terminal(question)

    return ask


@contextlib.contextmanager
def uncaptured(capture):
    capture.suspend(in_=True)
    try:
        yield
    finally:
        capture.resume()


@pytest.fixture(scope="session")
def chromium(request) -> Path:
    """Session scope: asked (and skipped) once for the whole suite, not once a module."""
    installer = load_installer()
    try:
        return installer.ensure_chromium(ask=terminal_question(request.config, installer))
    except installer.BrowserNotInstalled as why:
        pytest.skip(str(why))
    except installer.BrowserMissing as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="module")
def browser(chromium):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser tests need the playwright package: "
                    ".venv/bin/python -m pip install -e '.[browser]' -c constraints.txt "
                    "(python3 course.py test installs it)", pytrace=False)
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright, chromium)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on 127.0.0.1, serving copies of every notebook (Lab saves what it opens)."""
    base = tmp_path_factory.mktemp("jupyterlab")
    root = copy_notebooks(notebook_paths(), base / "notebooks")
    server = LabServer(root, base / "state", base / "jupyter-lab.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()
        assert server.process.returncode is not None, "jupyter-lab is still running"


@pytest.fixture
def page(browser, lab):
    """A fresh page (its own browser context); the notebook's kernel is shut down afterwards."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        yield context.new_page()
    finally:
        context.close()
        lab.shutdown_kernels()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
