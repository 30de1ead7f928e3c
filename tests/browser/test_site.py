"""The course website (`python3 course.py site`) in a real headless Chromium.

Builds the site into a temporary folder with mystmd, serves it on 127.0.0.1 from this process, and
crawls it from the landing page: every page loads, every image is drawn (naturalWidth > 0), every
internal link (and its #anchor) leads somewhere, maths is rendered (MathML with a size), each
notebook page has its Colab link and figures, widgets show their note instead of a dead widget.
Skips, saying why, when mystmd (`pip install .[site]`) or Node.js 18+ is missing.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urldefrag, urljoin

import pytest
from notebook_tools import notebook_paths

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("course_for_site", ROOT / "course.py")
course = importlib.util.module_from_spec(spec)
spec.loader.exec_module(course)

MATHS_PAGE = "attention.html"  # notebook 3: $\sqrt{d_k}$ and friends


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def site_url(tmp_path_factory):
    if course.find_myst() is None:
        pytest.skip(f"mystmd is not installed: {course.SITE_INSTALL}")
    if (course.node_major() or 0) < 18:
        pytest.skip("mystmd needs Node.js 18 or newer on PATH")
    target = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    assert course.site([str(target)]) == 0
    print(f"site built in {time.monotonic() - started:.1f} s")
    handler = functools.partial(QuietHandler, directory=str(target / "_build" / "html"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def crawl(page, root: str) -> dict[str, dict]:
    """Every page under `root` reachable from its index.html by links: what each one shows."""
    seen, queue = {}, [root + "index.html"]
    while queue:
        url = queue.pop()
        if url in seen:
            continue
        loading = time.monotonic()
        response = page.goto(url)
        assert response is not None and response.ok, f"{url}: HTTP {response and response.status}"
        page.wait_for_load_state("load")
        seen[url] = page.evaluate("""() => ({
            title: document.title,
            images: [...document.images].map(i => [i.getAttribute('src'), i.complete && i.naturalWidth]),
            links: [...document.querySelectorAll('a[href]')].map(a => a.href),
            ids: [...document.querySelectorAll('[id]')].map(e => e.id),
            maths: [...document.querySelectorAll('.katex math')].map(m => m.getBoundingClientRect().width),
            widgetNotes: document.querySelectorAll('p.widget-note').length,
            colab: [...document.querySelectorAll('a[href*="colab.research.google.com"]')].length,
            text: document.body.innerText,
            outputs: [...document.querySelectorAll('pre.output')].map(p => p.innerText).join('\\n'),
        })""")
        print(f"{url}: {time.monotonic() - loading:.1f} s")
        for link in seen[url]["links"]:
            target, _ = urldefrag(link)
            if target.startswith(root) and target not in seen:
                queue.append(target)
    return seen


def test_every_page_loads_with_its_images_maths_and_links(site_url, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        started = time.monotonic()
        pages = crawl(page, site_url)
        seconds = time.monotonic() - started
    finally:
        context.close()
    names = {url.removeprefix(site_url) for url in pages}
    notebooks = notebook_paths()
    assert len(names) == len(notebooks) + 3, f"pages found by crawling: {sorted(names)}"
    assert {"index.html", "sources.html", "instructors.html", MATHS_PAGE} <= names

    broken = [f"{url}: image {src} not drawn" for url, shown in pages.items()
              for src, width in shown["images"] if not width]
    for url, shown in pages.items():
        for link in shown["links"]:
            target, anchor = urldefrag(link)
            if not target.startswith(site_url):
                continue
            if target not in pages:
                broken.append(f"{url}: link to {link} leads nowhere")
            elif anchor and anchor not in pages[target]["ids"]:
                broken.append(f"{url}: link to {link}: no element with id {anchor!r}")
    assert not broken, "\n".join(broken)
    assert not errors, f"JavaScript errors: {errors}"

    notebook_pages = {url: shown for url, shown in pages.items() if shown["colab"] and shown["images"]}
    assert len(notebook_pages) == len(notebooks), "each notebook page: a Colab link and figures"
    maths = pages[urljoin(site_url, MATHS_PAGE)]["maths"]
    assert len(maths) > 20 and min(maths) > 0, f"{MATHS_PAGE}: {len(maths)} formulas drawn"
    assert sum(shown["widgetNotes"] for shown in pages.values()) > 0
    assert not any("Box(children" in shown["outputs"] for shown in pages.values()), (
        "a widget's text form shows where its note should be")
    instructors = pages[urljoin(site_url, "instructors.html")]["text"]
    assert "stop before" in instructors and "COURSE_PRECISION" in instructors
    assert "course.py student" in instructors
    images = sum(len(shown["images"]) for shown in pages.values())
    print(f"crawled {len(pages)} pages, {images} images in {seconds:.1f} s")
