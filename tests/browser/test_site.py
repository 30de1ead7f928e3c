"""The course website (`python3 course.py site`, and `--student`) in a real headless Chromium.

Builds both editions into temporary folders with mystmd, serves them on 127.0.0.1 from this
process, and crawls each from its landing page: every page loads, every image is drawn
(naturalWidth > 0), every internal link (and its #anchor) leads somewhere, maths is rendered
(MathML with a size), each notebook page has its Colab link and figures, widgets show their note
instead of a dead widget. Then what students and readers meet: no test marker as page text in
either edition, no solution anywhere in the student's (pages and search index), highlighted
code, previous/next links that walk the whole site in the sidebar's order, each page's own
contents, and a search box that finds a word with the site opened from disk (file://, every
other request refused). Last, a one-notebook course in nbgrader's exercise form built both ways
(the committed notebooks may still be in the older form, solutions in markdown). Skips, saying why, when mystmd (`pip install .[site]`) or Node.js 18+ is
missing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import re
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

spec = importlib.util.spec_from_file_location("site_project_for_browser", ROOT / "tools/site/project.py")
site_project = importlib.util.module_from_spec(spec)
spec.loader.exec_module(site_project)
PLACEHOLDER_SLUG = site_project.PLACEHOLDER_SLUG

MATHS_PAGE = "attention.html"  # notebook 3: $\sqrt{d_k}$ and friends
MARKERS = re.compile(r"NBVAL_\w+|### (?:BEGIN|END) (?:SOLUTION|HIDDEN TESTS)")
SOLUTION_REGION = re.compile(r"^[ \t]*### BEGIN SOLUTION[^\n]*\n(.*?)^[ \t]*### END SOLUTION", re.S | re.M)
HIDDEN_REGION = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS[^\n]*\n(.*?)^[ \t]*### END HIDDEN TESTS", re.S | re.M)
SOLUTION_REVEAL = re.compile(r"<summary>\s*Solution\s*</summary>(.*?)</details>", re.S | re.I)
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve(folder: Path):
    """`folder` on http://127.0.0.1:PORT/ from a thread of this process, for the block's time."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Both editions built: {"instructor": its html folder, "student": its html folder}."""
    if course.find_myst() is None:
        pytest.skip(f"mystmd is not installed: {course.SITE_INSTALL}")
    if (course.node_major() or 0) < 18:
        pytest.skip("mystmd needs Node.js 18 or newer on PATH")
    folders = {}
    for edition, flags in (("instructor", []), ("student", ["--student"])):
        target = tmp_path_factory.mktemp(f"site-{edition}")
        started = time.monotonic()
        assert course.site([*flags, str(target)]) == 0
        print(f"{edition}'s site built in {time.monotonic() - started:.1f} s")
        folders[edition] = target / "_build" / "html"
    return folders


@pytest.fixture(scope="module")
def site_url(built):
    with serve(built["instructor"]) as url:
        yield url


@pytest.fixture(scope="module")
def student_url(built):
    with serve(built["student"]) as url:
        yield url


@pytest.fixture(scope="module")
def editions(site_url, student_url, browser) -> dict[str, tuple[str, dict[str, dict], list[str]]]:
    """Each edition crawled once: {edition: (its root URL, {url: what the page shows}, the
    JavaScript errors met)}."""
    crawled = {}
    for edition, root in (("instructor", site_url), ("student", student_url)):
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            errors = []
            page.on("pageerror", lambda error, errors=errors: errors.append(str(error)))
            started = time.monotonic()
            pages = crawl(page, root)
            print(f"{edition}: crawled {len(pages)} pages in {time.monotonic() - started:.1f} s")
        finally:
            context.close()
        crawled[edition] = (root, pages, errors)
    return crawled


def solutions() -> dict[str, list[str]]:
    """Each notebook's solution and hidden-test lines that stand nowhere else in the notebooks,
    sources or stored outputs (so that finding one on a page means a solution shows): from the
    code between nbgrader's markers, and from the code in the older form's "Solution" reveals."""
    secrets, rest = {}, []
    for path in notebook_paths():
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        sources = ["".join(cell["source"]) for cell in cells]
        secrets[path.name] = "".join(region for text in sources
                                     for pattern in (SOLUTION_REGION, HIDDEN_REGION)
                                     for region in pattern.findall(text))
        secrets[path.name] += "".join(code for text in sources
                                      for reveal in SOLUTION_REVEAL.findall(text)
                                      for code in FENCED.findall(reveal))  # its code, not its prose
        shown = [SOLUTION_REVEAL.sub("", HIDDEN_REGION.sub("", SOLUTION_REGION.sub("", text)))
                 for text in sources]
        rest += shown + [text.replace("`", "") for text in shown]  # inline code shows without them
        rest += [json.dumps(cell.get("outputs", []), ensure_ascii=False).replace("\\n", "\n")
                 for cell in cells]  # the site keeps these (all but the exercises')
    elsewhere = words(" ".join(rest))
    return {name: sorted({words(line) for line in secret.splitlines()
                          if len(line.strip()) >= 20 and words(line) not in elsewhere
                          and not line.strip().startswith(("#", "```"))})
            for name, secret in secrets.items()}


def words(text: str) -> str:
    """`text` with every run of white space one space: a page's text and its source compare."""
    return " ".join(text.split())


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
            source: document.body.textContent,
            highlighted: [...document.querySelectorAll('pre.highlight span')].length,
            keywordColor: (k => k && getComputedStyle(k).color)(document.querySelector('pre.highlight span.k')),
            codeColor: (c => c && getComputedStyle(c).color)(document.querySelector('pre.highlight code')),
            prev: (a => a && a.href)(document.querySelector('nav.pager a[rel=prev]')),
            next: (a => a && a.href)(document.querySelector('nav.pager a[rel=next]')),
            sidebar: [...document.querySelectorAll('nav.sidebar a')].map(a => a.href),
            contents: [...document.querySelectorAll('nav.contents a')].map(a => a.getAttribute('href')),
            headings: [...document.querySelectorAll('main h2[id], main h3[id]')].map(h => '#' + h.id),
            outputs: [...document.querySelectorAll('pre.output')].map(p => p.innerText).join('\\n'),
        })""")
        print(f"{url}: {time.monotonic() - loading:.1f} s")
        for link in seen[url]["links"]:
            target, _ = urldefrag(link)
            if target.startswith(root) and target not in seen:
                queue.append(target)
    return seen



@pytest.mark.parametrize("edition", ["instructor", "student"])
def test_every_page_loads_with_its_images_maths_and_links(editions, edition):
    root, pages, errors = editions[edition]
    names = {url.removeprefix(root) for url in pages}
    notebooks = notebook_paths()
    pages_for = {"instructor": {"index.html", "sources.html", "instructors.html"},
                 "student": {"index.html", "sources.html"}}[edition]  # no instructors' page
    assert len(names) == len(notebooks) + len(pages_for), f"pages found by crawling: {sorted(names)}"
    assert pages_for | {MATHS_PAGE} <= names

    broken = [f"{url}: image {src} not drawn" for url, shown in pages.items()
              for src, width in shown["images"] if not width]
    for url, shown in pages.items():
        for link in shown["links"]:
            target, anchor = urldefrag(link)
            if not target.startswith(root):
                continue
            if target not in pages:
                broken.append(f"{url}: link to {link} leads nowhere")
            elif anchor and anchor not in pages[target]["ids"]:
                broken.append(f"{url}: link to {link}: no element with id {anchor!r}")
    assert not broken, "\n".join(broken)
    assert not errors, f"JavaScript errors: {errors}"

    with_figures = {url: shown for url, shown in pages.items() if shown["images"]}
    assert len(with_figures) == len(notebooks), "each notebook page has figures"
    if edition == "instructor":
        assert all(shown["colab"] for shown in with_figures.values()), "each notebook: a Colab link"
        unpublished = course.current_address(ROOT) == PLACEHOLDER_SLUG  # see `course.py publish`
        said = [("do not work yet" in shown["text"]) for shown in with_figures.values()]
        assert said == [unpublished] * len(with_figures), "the Colab links say they need the address"
    else:  # the Colab links open the instructor's notebooks, solutions and all
        assert not any(shown["colab"] for shown in pages.values())
    maths = pages[urljoin(root, MATHS_PAGE)]["maths"]
    assert len(maths) > 20 and min(maths) > 0, f"{MATHS_PAGE}: {len(maths)} formulas drawn"
    assert sum(shown["widgetNotes"] for shown in pages.values()) > 0
    assert not any("Box(children" in shown["outputs"] for shown in pages.values()), (
        "a widget's text form shows where its note should be")
    if edition == "instructor":
        instructors = pages[urljoin(root, "instructors.html")]["text"]
        assert "stop before" in instructors and "COURSE_PRECISION" in instructors
        assert "course.py student" in instructors
    else:  # no stored line claims that an empty stub passes
        assert not any("using your" in shown["outputs"] for shown in pages.values())
    images = sum(len(shown["images"]) for shown in pages.values())
    print(f"{edition}: {len(pages)} pages, {images} images")


@pytest.mark.parametrize("edition", ["instructor", "student"])
def test_no_test_marker_is_page_text(editions, edition):
    _, pages, _ = editions[edition]
    shown = [f"{url}: {found.group(0)}" for url, page in pages.items()
             for found in MARKERS.finditer(page["source"])]
    assert not shown, "markers on the pages:\n" + "\n".join(shown[:20])


def test_the_student_site_shows_no_solution_and_the_instructors_shows_them(editions, built):
    lines = solutions()
    assert sum(map(len, lines.values())) > len(lines), "the notebooks hold solutions to look for"
    instructor = words(" ".join(page["source"] for page in editions["instructor"][1].values()))
    missing = [line for found in lines.values() for line in found if line not in instructor]
    assert not missing, f"the instructor's site lacks solutions: {missing[:5]}"
    student = words(" ".join(page["source"] for page in editions["student"][1].values()))
    index = (built["student"] / "search.js").read_text(encoding="utf-8")
    leaked = [f"{name}: {line}" for name, found in lines.items() for line in found
              if line in student or json.dumps(line, ensure_ascii=False)[1:-1] in index]
    assert not leaked, "solutions in the student's site:\n" + "\n".join(leaked[:20])


@pytest.mark.parametrize("edition", ["instructor", "student"])
def test_code_is_highlighted(editions, edition):
    root, pages, _ = editions[edition]
    notebook = pages[urljoin(root, MATHS_PAGE)]
    assert notebook["highlighted"] > 100, f"{notebook['highlighted']} highlighted tokens"
    assert notebook["keywordColor"] and notebook["keywordColor"] != notebook["codeColor"]


def test_previous_and_next_walk_the_whole_site_in_the_sidebars_order(editions):
    root, pages, _ = editions["instructor"]
    order = pages[root + "index.html"]["sidebar"]
    assert len(order) == len(pages)
    walked, url = [], root + "index.html"
    while url is not None:
        walked.append(url)
        url = pages[url]["next"]
    assert walked == order
    assert [pages[url]["prev"] for url in order] == [None, *order[:-1]]


def test_each_page_has_its_own_contents(editions):
    _, pages, _ = editions["instructor"]
    for url, page in pages.items():
        assert page["contents"], f"{url}: no contents"
        assert page["contents"] == page["headings"], f"{url}: contents != its ## and ### headings"


def test_the_search_box_finds_a_word_with_the_site_opened_from_disk(built, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    requests = []
    context.route("**/*", lambda route: (requests.append(route.request.url),
                                         route.continue_() if route.request.url.startswith("file:")
                                         else route.abort()))
    try:
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto((built["student"] / "index.html").as_uri())
        page.fill("#search", "xqzjw-nothing")
        page.wait_for_selector("#search-results li")
        assert page.inner_text("#search-results") == "no match"
        page.fill("#search", "Softmax overflow")
        page.wait_for_selector("#search-results li a")
        hits = page.eval_on_selector_all("#search-results li a", "links => links.map(a => a.href)")
        assert any("attention.html#" in hit for hit in hits), hits
        page.fill("#search", "softmax")  # on the home table too: the pages where it stands first
        page.wait_for_function("document.querySelectorAll('#search-results li a').length > 3")
        hits = page.eval_on_selector_all("#search-results li a", "links => links.map(a => a.href)")
        assert "index.html" not in hits[0] and "attention.html#" in hits[0], hits[:5]
        page.fill("#search", "sqrt")
        page.wait_for_selector("#search-results li small")
        notes = page.eval_on_selector_all("#search-results li small", "ns => ns.map(n => n.textContent)")
        assert not any("\\sqrt" in note or "\\frac" in note for note in notes), notes[:5]
        page.fill("#search", "Softmax overflow")
        page.wait_for_selector("#search-results li a")
        page.click("#search-results li a")
        page.wait_for_load_state("load")
        assert page.url.startswith("file:") and "softmax" in page.inner_text("main").lower()
    finally:
        context.close()
    assert not errors, f"JavaScript errors: {errors}"
    assert all(url.startswith("file:") for url in requests), [u for u in requests if not u.startswith("file:")]


def test_zoomed_in_the_sidebar_folds_above_the_page_and_scrolls_away(built, browser):
    """1280 x 720 at 200 % zoom is 640 x 360 CSS pixels: the page, not the sidebar, takes the
    width, the list of pages is folded until asked for, and scrolling takes the sidebar away."""
    context = browser.new_context(viewport={"width": 640, "height": 360})
    try:
        page = context.new_page()
        page.goto((built["student"] / "attention.html").as_uri())
        main_width = page.eval_on_selector("main", "m => m.getBoundingClientRect().width")
        assert main_width > 0.9 * 640, f"the page is {main_width:.0f} px of 640"
        assert not page.is_visible("nav.sidebar details.pages a.current"), "the page list is open"
        page.click("details.pages > summary")
        assert page.is_visible("nav.sidebar details.pages a.current"), "the list does not open"
        page.mouse.wheel(0, 3000)
        page.wait_for_function("window.scrollY > 1000")
        bottom = page.eval_on_selector("nav.sidebar", "n => n.getBoundingClientRect().bottom")
        assert bottom < 0, f"the sidebar stays on screen when scrolled (its bottom at {bottom:.0f} px)"
    finally:
        context.close()
    wide = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = wide.new_page()
        page.goto((built["student"] / "attention.html").as_uri())
        assert page.is_visible("nav.sidebar details.pages a.current"), "wide, the list is folded"
    finally:
        wide.close()


def test_dark_mode_darkens_the_page_and_keeps_figures_on_a_light_card(built, browser):
    colour = "e => getComputedStyle(e).backgroundColor"
    shades = {}
    for scheme in ("light", "dark"):
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, color_scheme=scheme)
        try:
            page = context.new_page()
            page.goto((built["student"] / "attention.html").as_uri())
            shades[scheme] = (page.eval_on_selector("body", colour),
                              page.eval_on_selector("main img", colour),
                              page.eval_on_selector("main pre", colour))
        finally:
            context.close()

    def brightness(css: str) -> float:
        red, green, blue, *alpha = (float(x) for x in re.findall(r"[\d.]+", css))
        return 255.0 if alpha and alpha[0] == 0 else (red + green + blue) / 3  # transparent: white

    body, image, code = (brightness(shade) for shade in shades["dark"])
    assert brightness(shades["light"][0]) > 200 and body < 60, shades
    assert image > 200 and code > 200, f"dark mode puts figures or code on a dark ground: {shades}"


def test_a_notebook_in_the_nbgrader_form_builds_into_both_editions(tmp_path):
    """The whole build (mystmd and the theme) on a notebook whose exercise carries nbgrader's
    metadata and markers: the instructor's page shows the solution and the hidden test without
    markers, the student's page shows neither, nor the outputs of the answer and test cells."""
    if course.find_myst() is None or (course.node_major() or 0) < 18:
        pytest.skip("mystmd and Node.js 18+ are needed to build the site")
    from notebook_tools import exercise_notebook

    root = tmp_path / "course"
    for name in ("README.md", "notebooks/TIMES.md", "helpers/lab/setup_cell.py",
                 "tools/site/project.py", "tools/site/render.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text((ROOT / name).read_text(encoding="utf-8"), encoding="utf-8")
    (root / "notebooks" / "src").mkdir()
    notebook = exercise_notebook(metadata=True)
    notebook["metadata"] = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                           "language": "python"}}
    (root / "notebooks" / "09_x.ipynb").write_text(json.dumps(notebook), encoding="utf-8")
    shown = {}
    for edition, flags in (("instructor", []), ("student", ["--student"])):
        assert course.site([*flags, str(tmp_path / edition)], root=root) == 0
        page = (tmp_path / edition / "_build" / "html" / "x.html").read_text(encoding="utf-8")
        shown[edition] = words(re.sub(r"<[^>]+>", " ", page))
    for text in shown.values():
        assert not MARKERS.search(text) and "timing 3 s" in text
    assert "using your f from here on (it passes x.f)" in shown["instructor"]
    assert "using your f" not in shown["student"]
    assert "this cell uses your f once it passes x.f" in shown["student"]
    for secret in ("y = x * x", "assert f ( 3 ) == 9", "Exercise x.f: passed", "the answer cell ran",
                   "the older form's solution"):
        assert secret.replace(" ", "") in shown["instructor"].replace(" ", "")
        assert secret.replace(" ", "") not in shown["student"].replace(" ", ""), secret
    assert "NotImplementedError" in shown["student"] and "YOUR CODE HERE" in shown["student"]
