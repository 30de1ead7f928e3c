"""The course website's own MyST theme: static HTML pages from what `myst build --html` computed.

mystmd's book theme is downloaded from the internet at the first build; this one is a file of the
course, so `python3 course.py site` works offline. mystmd does all the reading (notebooks with
their stored outputs, Markdown, cross-references, KaTeX for the maths, figures saved as files)
and serves the result as JSON on a local content server; `myst build --html` then runs this script
(the `render` command of the theme's template.yml) with two environment variables:

    CONTENT_CDN       http://localhost:PORT, serving /config.json, /content/SLUG.json and files
    BUILD_DIRECTORY   where the HTML goes

Standard library only. Each page is one HTML file (`SLUG.html`, the first page `index.html`) with
a sidebar of every page, and the figures sit beside them. The maths arrives as KaTeX's HTML with
MathML inside; with no KaTeX style sheet to hand, the page shows the MathML, which browsers draw.
"""

from __future__ import annotations

import html
import json
import os
import sys
import urllib.request
from pathlib import Path

STYLE = """
body { margin: 0; font: 17px/1.55 system-ui, sans-serif; color: #1f2328; display: flex; }
nav { width: 17rem; flex: none; height: 100vh; position: sticky; top: 0; overflow-y: auto;
      background: #f6f8fa; border-right: 1px solid #d0d7de; padding: 1rem; box-sizing: border-box; }
nav a { display: block; padding: .25rem 0; color: #0550ae; text-decoration: none; }
nav a.current { font-weight: 600; }
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
"""


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
        if kind == "heading":
            depth, ident = node.get("depth", 2), node.get("identifier", "")
            return f'<h{depth} id="{html.escape(ident)}">{inner()}</h{depth}>'
        if kind == "code":
            return f'<pre><code class="language-{node.get("lang", "")}">{html.escape(node["value"])}</code></pre>'
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


def write_page(out: Path, name: str, title: str, body: str, nav: list[tuple[str, str]]) -> None:
    links = "".join(f'<a href="{slug}.html"{" class=current" if slug == name else ""}>'
                    f"{html.escape(text)}</a>" for slug, text in nav)
    out.joinpath(f"{name}.html").write_text(
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}'
        f'</title><meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{STYLE}</style></head><body><nav>{links}</nav><main><h1>{html.escape(title)}</h1>"
        f"{body}</main></body></html>\n", encoding="utf-8")


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
    for slug, document in documents.items():
        page = Page(set(slugs), index)
        body = page.node(document["mdast"])
        write_page(out, names[slug], document["frontmatter"].get("title", slug), body, nav)
        files |= page.files
    for path in sorted(files):
        out.joinpath(path.lstrip("/")).write_bytes(fetch(path))
    print(f"wrote {len(slugs)} pages and {len(files)} files to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
