"""The course website's own MyST theme: static HTML pages from what `myst build --html` computed.

mystmd's book theme is downloaded from the internet at the first build; this one is a file of the
course, so `python3 course.py site` works offline. mystmd does all the reading (notebooks with
their stored outputs, Markdown, cross-references, KaTeX for the maths, figures saved as files)
and serves the result as JSON on a local content server; `myst build --html` then runs this script
(the `render` command of the theme's template.yml) with two environment variables:

    CONTENT_CDN       http://localhost:PORT, serving /config.json, /content/SLUG.json and files
    BUILD_DIRECTORY   where the HTML goes

Standard library, and Pygments (JupyterLab's highlighter, so in every course environment) for the
code; without it the code shows plain. Each page is one HTML file (`SLUG.html`, the first page
`index.html`) with a sidebar of every page and a search box (a bar above the page when the window
is narrow or zoomed, the list folded; a dark page in dark mode), its own contents (its headings) at
the top, and links to the previous and the next page; the figures sit beside them. The maths
arrives as KaTeX's HTML with MathML inside; with no KaTeX style sheet to hand, the page shows the
MathML, which browsers draw.

The search works offline, from disk too: `search.js` holds an index written here (each section's
heading and text, its maths as plain text) as a script, not JSON, since a page opened as a file
may not fetch() another; SEARCH_RANKING lists the sections where the words stand first.
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
import urllib.request
from pathlib import Path

try:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound
except ImportError:  # the code then shows plain
    highlight = None

STYLE = """
body { margin: 0; font: 17px/1.55 system-ui, sans-serif; color: #1f2328; display: flex; }
nav.sidebar { width: 17rem; flex: none; height: 100vh; position: sticky; top: 0; overflow-y: auto;
      background: #f6f8fa; border-right: 1px solid #d0d7de; padding: 1rem; box-sizing: border-box; }
nav.sidebar a { display: block; padding: .25rem 0; color: #0550ae; text-decoration: none; }
nav.sidebar a.current { font-weight: 600; }
p.edition { margin: 0 0 .5rem; font-size: 14px; color: #57606a; }
input#search { width: 100%; box-sizing: border-box; padding: .35rem .5rem; font: inherit;
      font-size: 15px; border: 1px solid #d0d7de; border-radius: 6px; }
ol#search-results { margin: .3rem 0 1rem; padding-left: 1.2rem; font-size: 14px; }
ol#search-results small { display: block; color: #57606a; }
nav.contents { border: 1px solid #d0d7de; border-radius: 6px; padding: .3rem 1rem; font-size: 15px; }
nav.contents ul { margin: .2rem 0; padding-left: 1.2rem; }
nav.pager { display: flex; justify-content: space-between; gap: 1rem; margin: 2rem 0 1rem;
      padding-top: 1rem; border-top: 1px solid #d0d7de; }
main { max-width: 60rem; padding: 1.5rem 2.5rem; min-width: 0; }
pre { background: #f6f8fa; padding: .6rem .8rem; overflow-x: auto; font-size: 14px; }
pre.output { background: #fff; border-left: 3px solid #d0d7de; }
pre.error { background: #fff0f0; }
div.cell { margin: 1rem 0; }
img { max-width: 100%; }
table { border-collapse: collapse; } td, th { border: 1px solid #d0d7de; padding: .3rem .6rem; }
details { margin: .6rem 0; padding: .3rem .6rem; border: 1px solid #d0d7de; border-radius: 6px; }
.katex-html { display: none; }
a.colab { display: inline-block; background: #f9ab00; color: #000; padding: .2rem .7rem;
          border-radius: 4px; text-decoration: none; font-weight: 600; }
p.widget-note { font-style: italic; color: #57606a; }
details.pages > summary { display: none; }
/* Narrow, or zoomed (1280 px at 200 % is 640 CSS px): the sidebar becomes a bar above the page
   that scrolls away, its list of pages folded behind "All pages". */
@media (max-width: 60rem) {
  body { display: block; }
  nav.sidebar { width: auto; height: auto; position: static; border-right: none;
                border-bottom: 1px solid #d0d7de; }
  details.pages > summary { display: list-item; cursor: pointer; padding: .4rem 0; font-weight: 600; }
  main { padding: 1rem; }
}
/* Dark mode: dark page, light figures and code kept on their own light card (the figures are
   drawn on white; inverting them would change what their colours mean). */
@media (prefers-color-scheme: dark) {
  body { background: #0d1117; color: #e6edf3; }
  nav.sidebar { background: #161b22; border-color: #30363d; }
  nav.sidebar a, main a { color: #58a6ff; }
  p.edition, ol#search-results small, p.widget-note { color: #9198a1; }
  input#search { background: #0d1117; color: #e6edf3; border-color: #30363d; }
  pre, pre.output { background: #f6f8fa; color: #1f2328; }
  pre.output { border-left-color: #9198a1; }
  pre.error { background: #fff0f0; color: #1f2328; }
  img { background: #fff; padding: .3rem; border-radius: 4px; }
  nav.contents, details, td, th, nav.pager { border-color: #30363d; }
}
"""
# The search, a pure function (tests/course/test_course_site.py runs it in Node): every section
# whose page title, heading or text holds every word typed, best first. A word in the heading
# counts most, then in the page's title, then each time it stands in the text (up to 5); the
# landing page, which names every notebook in its table, counts half, so that the page where
# the word stands comes first. The snippet is the text around the first word found in it.
SEARCH_RANKING = """
function courseSearch(records, query) {
  const words = query.toLowerCase().split(/\\s+/).filter(Boolean);
  if (!words.length) return [];
  const count = (text, word) => text.split(word).length - 1;
  const hits = [];
  records.forEach((r, order) => {
    const heading = r.heading.toLowerCase(), page = r.page.toLowerCase(), text = r.text.toLowerCase();
    if (!words.every(w => heading.includes(w) || page.includes(w) || text.includes(w))) return;
    let score = 0;
    for (const w of words) {
      score += (heading.includes(w) ? 6 : 0) + (page.includes(w) ? 2 : 0) + Math.min(count(text, w), 5);
    }
    if (r.listing) score /= 2;
    const first = words.map(w => text.indexOf(w)).filter(i => i >= 0);
    const at = first.length ? Math.max(Math.min(...first) - 40, 0) : 0;
    hits.push({url: r.url, title: r.page + (r.heading ? ' \\u203a ' + r.heading : ''), score, order,
               snippet: (at ? '\\u2026' : '') + r.text.slice(at, at + 120)});
  });
  return hits.sort((a, b) => b.score - a.score || a.order - b.order);
}
"""
# The search box: loads search.js on first use (a script tag works from disk), then lists the
# hits of courseSearch.
SEARCH_SCRIPT = SEARCH_RANKING + """
(function () {
  const box = document.getElementById('search'), list = document.getElementById('search-results');
  let loading = false;
  function show() {
    list.replaceChildren();
    if (!box.value.trim() || !window.COURSE_SEARCH) return;
    const hits = courseSearch(window.COURSE_SEARCH, box.value);
    for (const hit of hits.slice(0, 30)) {
      const item = document.createElement('li'), link = document.createElement('a');
      link.href = hit.url;
      link.textContent = hit.title;
      const note = document.createElement('small');
      note.textContent = hit.snippet;
      item.append(link, note);
      list.append(item);
    }
    if (!hits.length) list.append(Object.assign(document.createElement('li'), {textContent: 'no match'}));
  }
  function load() {
    if (loading) return;
    loading = true;
    const script = document.createElement('script');
    script.src = 'search.js';
    script.onload = show;
    document.head.append(script);
  }
  box.addEventListener('focus', load);
  box.addEventListener('input', () => { load(); show(); });
  // The page list starts folded where the sidebar is a bar above the page (see the style's @media).
  const pages = document.querySelector('details.pages');
  if (pages && window.matchMedia('(max-width: 60rem)').matches) pages.open = false;
})();
"""
CODE_STYLE = HtmlFormatter(style="default").get_style_defs(".highlight") if highlight else ""


def highlighted(code: str, lang: str) -> str:
    """`code` as HTML: Pygments' spans (classes styled by CODE_STYLE), or escaped when it has no lexer."""
    if highlight is not None and lang:
        try:
            lexer = get_lexer_by_name(lang)
        except ClassNotFound:
            lexer = None
        if lexer is not None:
            return highlight(code, lexer, HtmlFormatter(nowrap=True)).rstrip("\n")
    return html.escape(code)


# LaTeX as a reader would type it: the search index holds plain text, never `\sqrt{d_k}`.
MATH_SYMBOLS = {
    "top": "\u1d40", "infty": "\u221e", "ell": "\u2113", "times": "\u00d7", "cdot": "\u00b7",
    "partial": "\u2202", "sum": "\u03a3", "prod": "\u03a0", "circ": "\u2218", "leftarrow": "\u2190",
    "rightarrow": "\u2192", "to": "\u2192", "le": "\u2264", "leq": "\u2264", "ge": "\u2265",
    "geq": "\u2265", "ne": "\u2260", "neq": "\u2260", "approx": "\u2248", "in": "\u2208",
    "cup": "\u222a", "cap": "\u2229", "lceil": "\u2308", "rceil": "\u2309", "lfloor": "\u230a",
    "rfloor": "\u230b", "odot": "\u2299", "otimes": "\u2297", "sqrt": "\u221a", "pm": "\u00b1",
    "log": "log", "exp": "exp", "max": "max", "min": "min", "cos": "cos", "sin": "sin",
    "alpha": "\u03b1", "beta": "\u03b2", "gamma": "\u03b3", "delta": "\u03b4", "epsilon": "\u03b5",
    "varepsilon": "\u03b5", "eta": "\u03b7", "theta": "\u03b8", "lambda": "\u03bb", "mu": "\u03bc",
    "pi": "\u03c0", "sigma": "\u03c3", "tau": "\u03c4", "phi": "\u03c6", "omega": "\u03c9",
    "Theta": "\u0398", "Sigma": "\u03a3", "Delta": "\u0394", "Omega": "\u03a9",
}
MATH_GROUP_COMMANDS = {"text", "mathrm", "mathbf", "mathit", "operatorname", "mathrel", "mathbb",
                       "tilde", "hat", "bar", "vec", "boldsymbol"}
MATH_SPACES = {"quad", "qquad", ",", ";", ":", "!", " ", "\\"}


def _group(latex: str, at: int) -> tuple[str, int]:
    """The braced group (or single character) starting at `at` (after spaces), and where it ends."""
    while at < len(latex) and latex[at] == " ":
        at += 1
    if at >= len(latex):
        return "", at
    if latex[at] != "{":
        return latex[at], at + 1
    depth, start = 0, at
    for at in range(start, len(latex)):
        depth += {"{": 1, "}": -1}.get(latex[at], 0)
        if depth == 0:
            return latex[start + 1:at], at + 1
    return latex[start + 1:], len(latex)


def _bracketed(text: str) -> str:
    return text if re.fullmatch(r"[\w.]+", text) else f"({text})"


def plain_maths(latex: str) -> str:
    """`latex` as plain text: `\\frac{a}{b}` -> a/b, `\\sqrt{d_k}` -> \u221ad_k, `K^\\top` -> K\u1d40, no braces."""
    out, at = [], 0
    while at < len(latex):
        char = latex[at]
        if char == "\\":
            name = re.match(r"[A-Za-z]+|.", latex[at + 1:] or " ").group(0)
            at += 1 + len(name)
            if name in ("frac", "tfrac", "dfrac"):
                top, at = _group(latex, at)
                bottom, at = _group(latex, at)
                out.append(f"{_bracketed(plain_maths(top))}/{_bracketed(plain_maths(bottom))}")
            elif name == "sqrt":
                inside, at = _group(latex, at)
                out.append("\u221a" + _bracketed(plain_maths(inside)))
            elif name in MATH_GROUP_COMMANDS:
                inside, at = _group(latex, at)
                out.append(plain_maths(inside))
            elif name in MATH_SPACES:
                out.append(" ")
            elif name not in ("left", "right"):
                out.append(MATH_SYMBOLS.get(name, name))
        elif char in "{}":
            at += 1
        elif char == "^" and re.match(r"\^\s*\{?\s*\\top\b\s*\}?", latex[at:]):
            at += re.match(r"\^\s*\{?\s*\\top\b\s*\}?", latex[at:]).end()
            out.append("\u1d40")
        else:
            out.append(char)
            at += 1
    return " ".join("".join(out).split())


def is_maths(node: dict) -> bool:
    """A formula: mystmd's maths node, or (inside raw HTML such as a hint's <details>) a span of
    class math-inline / math-display holding the LaTeX as text."""
    return node["type"] in ("inlineMath", "math") or (
        node["type"] == "span" and "math" in str(node.get("class", "")))


def plain(node: dict) -> str:
    """The text a node shows, without markup (headings in the contents, the search index)."""
    if is_maths(node):
        return plain_maths(node.get("value") or "".join(child.get("value", "") for child in
                                                        node.get("children", [])))
    if "value" in node and node["type"] in ("text", "inlineCode", "code"):
        return node["value"]
    return "".join(plain(child) for child in node.get("children", []))


def sections(tree: dict) -> list[dict]:
    """The page's searchable sections: each heading (its anchor) and the prose and code under it."""
    found = [{"heading": "", "anchor": "", "text": []}]

    def walk(node: dict) -> None:
        kind = node["type"]
        if kind == "heading":
            found.append({"heading": plain(node), "anchor": node.get("identifier", ""), "text": []})
        elif kind in ("text", "inlineCode", "code") or is_maths(node):
            found[-1]["text"].append(plain(node))
        elif kind != "output":  # outputs are numbers and figures: not what a reader looks for
            for child in node.get("children", []):
                walk(child)

    walk(tree)
    return [{**section, "text": " ".join(" ".join(section["text"]).split())}
            for section in found if section["heading"] or section["text"]]



def fetch(path: str) -> bytes:
    with urllib.request.urlopen(os.environ["CONTENT_CDN"] + path, timeout=60) as response:
        return response.read()


class Page:
    """Turns one page's MyST tree into HTML; `files` collects the figures it refers to."""

    def __init__(self, slugs: set[str], index: str) -> None:
        self.slugs, self.index = slugs, index
        self.files: set[str] = set()

    def href(self, url: str) -> str:
        slug = url.strip("/").split("#")[0]
        anchor = url[url.index("#"):] if "#" in url else ""
        if slug in self.slugs or slug == "":
            return ("index" if slug in ("", self.index) else slug) + ".html" + anchor
        return url

    def children(self, node: dict) -> str:
        return "".join(self.node(child) for child in node.get("children", []))

    def node(self, node: dict) -> str:  # noqa: C901 (one branch per kind of node)
        kind, inner = node["type"], lambda: self.children(node)
        if kind == "text":
            return html.escape(node["value"])
        if kind in ("inlineMath", "math"):
            rendered = node.get("html") or html.escape(node["value"])
            return f'<div class="math">{rendered}</div>' if kind == "math" else rendered
        if is_maths(node):  # maths inside raw HTML (a hint's <details>): mystmd leaves it LaTeX
            return f'<span class="math-plain">{html.escape(plain(node))}</span>'
        if kind == "heading":
            depth, ident = node.get("depth", 2), node.get("identifier", "")
            return f'<h{depth} id="{html.escape(ident)}">{inner()}</h{depth}>'
        if kind == "code":
            lang = html.escape(node.get("lang") or "")
            return (f'<pre class="highlight"><code class="language-{lang}">'
                    f'{highlighted(node["value"], node.get("lang") or "")}</code></pre>')
        if kind == "link":
            url = self.href(node.get("url", ""))
            return f'<a href="{html.escape(url)}">{inner()}</a>'
        if kind == "image":
            return f'<img src="{self.asset(node["url"])}" alt="{html.escape(node.get("alt", ""))}">'
        if kind == "html":
            return node["value"]
        if kind == "list":
            tag = "ol" if node.get("ordered") else "ul"
            return f"<{tag}>{inner()}</{tag}>"
        if kind == "tableCell":
            tag = "th" if node.get("header") else "td"
            return f"<{tag}>{inner()}</{tag}>"
        if kind == "output":
            return self.output(node.get("jupyter_data", {}))
        if kind == "block" and node.get("kind") == "notebook-code":
            return f'<div class="cell">{inner()}</div>'
        tags = {"paragraph": "p", "strong": "strong", "emphasis": "em", "inlineCode": "code",
                "listItem": "li", "table": "table", "tableRow": "tr", "details": "details",
                "summary": "summary", "blockquote": "blockquote", "span": "span", "div": "div",
                "underline": "u", "delete": "del", "subscript": "sub", "superscript": "sup"}
        if kind == "inlineCode":
            return f"<code>{html.escape(node['value'])}</code>"
        if kind in tags:
            return f"<{tags[kind]}>{inner()}</{tags[kind]}>"
        if kind == "thematicBreak":
            return "<hr>"
        if kind == "break":
            return "<br>"
        return inner()  # root, block, outputs, container, admonition...: their children

    def asset(self, url: str) -> str:
        if url.startswith("/") and not url.startswith("//"):
            self.files.add(url)
            return url.lstrip("/")
        return html.escape(url)

    def output(self, data: dict) -> str:
        kind = data.get("output_type")
        if kind == "stream":
            return f'<pre class="output">{html.escape(data.get("text", ""))}</pre>'
        if kind == "error":
            return f'<pre class="output error">{html.escape(data.get("ename", ""))}: {html.escape(data.get("evalue", ""))}</pre>'
        bundle = data.get("data", {})
        for mime in ("image/svg+xml", "image/png", "image/jpeg", "image/gif"):
            if mime in bundle:
                return f'<img src="{self.asset(bundle[mime]["path"])}" alt="figure">'
        if "text/html" in bundle:
            return self.text(bundle["text/html"])
        if "text/plain" in bundle:
            return f'<pre class="output">{html.escape(self.text(bundle["text/plain"]))}</pre>'
        return ""

    def text(self, item: dict) -> str:
        """A text output: inline (`content`) or, when long, saved beside the site (`path`)."""
        if "content" in item:
            return item["content"]
        return fetch(item["path"]).decode("utf-8")


def headings(tree: dict, page: Page | None = None) -> list[tuple[int, str, str]]:
    """(depth, anchor, its HTML) of the page's `##` and `###` headings, in order: its contents.
    With `page`, a heading's maths and code show as in the heading; without, as plain text."""
    if tree["type"] == "heading":
        depth = tree.get("depth", 2)
        shown = page.children(tree) if page is not None else html.escape(plain(tree))
        return [(depth, tree.get("identifier", ""), shown)] if depth in (2, 3) else []
    return [found for child in tree.get("children", []) for found in headings(child, page)]


def contents(found: list[tuple[int, str, str]]) -> str:
    """The page's own table of contents: its `##` headings, each with its `###` ones."""
    if not found:
        return ""
    items, open_sub = [], False
    for depth, anchor, text in found:
        link = f'<a href="#{html.escape(anchor)}">{text}</a>'
        if depth == 3 and items:
            items.append(("" if open_sub else "<ul>") + f"<li>{link}</li>")
            open_sub = True
        else:
            items.append(("</ul></li>" if open_sub else "</li>" if items else "") + f"<li>{link}")
            open_sub = False
    items.append("</ul></li>" if open_sub else "</li>")
    return f'<nav class="contents" aria-label="Contents"><strong>Contents</strong><ul>{"".join(items)}</ul></nav>'


def pager(name: str, nav: list[tuple[str, str]]) -> str:
    """Links to the previous and the next page in the sidebar's order."""
    at = [slug for slug, _ in nav].index(name)
    links = []
    if at > 0:
        links.append(f'<a rel="prev" href="{nav[at - 1][0]}.html">&larr; {html.escape(nav[at - 1][1])}</a>')
    else:
        links.append("<span></span>")
    if at + 1 < len(nav):
        links.append(f'<a rel="next" href="{nav[at + 1][0]}.html">{html.escape(nav[at + 1][1])} &rarr;</a>')
    return f'<nav class="pager" aria-label="Previous and next page">{"".join(links)}</nav>'


def edition_label() -> str:
    """"Student edition" or "Instructor's edition", from the edition.json `project.py` wrote."""
    where = Path(__file__).resolve().parent.parent / "edition.json"
    edition = json.loads(where.read_text(encoding="utf-8"))["edition"] if where.exists() else ""
    return {"student": "Student edition", "instructor": "Instructor's edition"}.get(edition, "")


def write_page(out: Path, name: str, title: str, body: str, nav: list[tuple[str, str]],
               found: list[tuple[int, str, str]], label: str = "") -> None:
    links = "".join(f'<a href="{slug}.html"{" class=current" if slug == name else ""}>'
                    f"{html.escape(text)}</a>" for slug, text in nav)
    edition = f'<p class="edition">{html.escape(label)}</p>' if label else ""
    search = ('<input id="search" type="search" placeholder="Search the course" '
              'aria-label="Search the course" autocomplete="off"><ol id="search-results"></ol>')
    out.joinpath(f"{name}.html").write_text(
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}'
        f'</title><meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{STYLE}{CODE_STYLE}</style></head><body>"
        f'<nav class="sidebar">{edition}{search}'
        f'<details class="pages" open><summary>All pages</summary>{links}</details></nav>'
        f"<main><h1>{html.escape(title)}</h1>{contents(found)}{body}{pager(name, nav)}</main>"
        f"<script>{SEARCH_SCRIPT}</script></body></html>\n", encoding="utf-8")


def search_index(documents: dict[str, dict], names: dict[str, str]) -> list[dict]:
    """One record per section of every page: where it is (url), its page, heading and text (plain,
    maths included); the landing page's records are marked `listing` (see SEARCH_RANKING)."""
    records = []
    for slug, document in documents.items():
        page = document["frontmatter"].get("title", slug)
        for section in sections(document["mdast"]):
            anchor = f"#{section['anchor']}" if section["anchor"] else ""
            record = {"url": f"{names[slug]}.html{anchor}", "page": page,
                      "heading": section["heading"], "text": section["text"]}
            records.append(record | ({"listing": True} if names[slug] == "index" else {}))
    return records


def main() -> int:
    out = Path(os.environ["BUILD_DIRECTORY"])
    out.mkdir(parents=True, exist_ok=True)
    project = json.loads(fetch("/config.json"))["projects"][0]
    index = project["index"]
    slugs = [index] + [page["slug"] for page in project["pages"] if "slug" in page]
    documents = {slug: json.loads(fetch(f"/content/{slug}.json")) for slug in slugs}
    names = {slug: "index" if slug == index else slug for slug in slugs}
    nav = [(names[s], documents[s]["frontmatter"].get("title", s)) for s in slugs]
    files: set[str] = set()
    label = edition_label()
    for slug, document in documents.items():
        page = Page(set(slugs), index)
        body = page.node(document["mdast"])
        write_page(out, names[slug], document["frontmatter"].get("title", slug), body, nav,
                   headings(document["mdast"], page), label)
        files |= page.files
    for path in sorted(files):
        out.joinpath(path.lstrip("/")).write_bytes(fetch(path))
    records = search_index(documents, names)
    out.joinpath("search.js").write_text(
        "window.COURSE_SEARCH = " + json.dumps(records, ensure_ascii=False) + ";\n", encoding="utf-8")
    if highlight is None:
        print("Pygments is missing: the code is not highlighted (pip install pygments)", file=sys.stderr)
    print(f"wrote {len(slugs)} pages, {len(files)} files and a search index of {len(records)} "
          f"sections to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
