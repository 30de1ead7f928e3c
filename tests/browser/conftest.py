"""Fixtures of the browser suite: Debian's Chromium, Playwright, and one JupyterLab server.

The server and the browser live for this folder's tests only (module scope), serve copies of the
notebooks from a temporary folder, and are stopped (the server by its own PID) when the module
ends, passed or failed.
"""

from __future__ import annotations

import importlib.util
import sys
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


@pytest.fixture(scope="module")
def chromium() -> Path:
    installer = load_installer()
    try:
        return installer.ensure_chromium()
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
