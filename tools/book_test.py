"""The book's website as a reader's browser sees it: every page of ``build/book/`` in headless
Chromium, offline.

``make book`` builds the site; this test serves it on 127.0.0.1 (a free port, a server thread
in this process, always stopped) and opens every page of it in Chromium, where every request
for anything but that server is blocked (and no other host even resolves). Each page fails on

* a request that failed (an HTTP error, a file the site lacks) or that went off the site;
* a JavaScript error;
* math left unrendered: a math element MathJax did not typeset or reported an error in, or raw
  ``$...$``, ``\\(``, ``\\[`` or ``\\begin{`` left in the text (code and outputs excepted);
* an image that did not load (``naturalWidth`` 0);
* a link within the site to a page or an anchor that does not exist;
* no chapter content: a chapter page without its title, cells, the note on how to run it, its
  marked checkpoint and exercises, or previous / next links; a front page without the chapter
  table.

The offline search is tried too (it must find a chapter), and ``test_checks_can_fail`` proves
each check reports a page broken on purpose. A screenshot of every page goes to
``artifacts/book/``, with ``summary.txt`` (what was checked, timings).

Run with ``make test-book`` (builds the site first; needs Debian's ``chromium`` and the
``playwright`` package). Knobs: ``FLASHTEXT_CHROMIUM`` (browser binary), ``FLASHTEXT_BOOK_DIR``
(another built site), ``FLASHTEXT_BOOK_PAGE_TIMEOUT`` (seconds per page, default 60).
"""

from __future__ import annotations

import contextlib
import functools
import html.parser
import http.server
import os
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from headless_chromium import launched

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("FLASHTEXT_BOOK_DIR") or ROOT / "build" / "book")
ARTIFACTS = ROOT / "artifacts" / "book"
PAGE_TIMEOUT_S = float(os.environ.get("FLASHTEXT_BOOK_PAGE_TIMEOUT", "60"))


def _pages(site: Path = SITE) -> list[str]:
    """Every page a reader navigates to: the front page and the chapters (the site's search and
    index pages are tried by test_offline_search)."""
    chapters = sorted(p.relative_to(site).as_posix() for p in (site / "chapters").glob("*.html"))
    return ["index.html", *chapters] if (site / "index.html").exists() else []


def _summary(line: str) -> None:
    print(line)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with open(ARTIFACTS / "summary.txt", "a") as f:
        f.write(line + "\n")


# ----------------------------------------------------------------------------- the server

class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # failed requests are reported by the browser side, with the page that made them


@dataclass
class Site:
    root: Path
    base: str  # http://127.0.0.1:PORT/

    def url(self, path: str) -> str:
        return urllib.parse.urljoin(self.base, path)


@contextlib.contextmanager
def serve(root: Path) -> Iterator[Site]:
    """Serve ``root`` on 127.0.0.1 from a thread of this process, on a free port; always
    stopped, whatever the test does."""
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="book-server", daemon=True)
    thread.start()
    try:
        yield Site(root, f"http://127.0.0.1:{server.server_address[1]}/")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="session")
def site() -> Iterator[Site]:
    if not (SITE / "index.html").exists():
        pytest.fail(f"no built site at {SITE}: run `make book` first (`make test-book` does)")
    shutil.rmtree(ARTIFACTS, ignore_errors=True)  # this run's screenshots only
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with serve(SITE) as s:
        yield s


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    with launched() as b:
        yield b


# ----------------------------------------------------------------------------- one page

@dataclass
class Visit:
    """What one page load asked for and what went wrong with it, seen from the browser."""
    off_site: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _page(browser: object, site: Site) -> Iterator[tuple[object, Visit]]:
    """A fresh context and page whose every request off ``site`` is blocked and recorded."""
    origin = urllib.parse.urlsplit(site.base).netloc
    visit = Visit()
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  service_workers="block")
    context.set_default_timeout(PAGE_TIMEOUT_S * 1000)

    def route(r: object) -> None:
        parts = urllib.parse.urlsplit(r.request.url)
        if parts.scheme in ("http", "https", "ws", "wss") and parts.netloc != origin:
            visit.off_site.append(r.request.url)
            r.abort("blockedbyclient")
        else:
            r.continue_()

    def on_failed(req: object) -> None:
        if urllib.parse.urlsplit(req.url).netloc == origin:  # off-site ones are listed above
            visit.failed.append(f"{req.url} ({req.failure})")

    def on_response(resp: object) -> None:
        if resp.status >= 400:
            visit.failed.append(f"{resp.url} (HTTP {resp.status})")

    context.route("**/*", route)
    page = context.new_page()
    page.on("requestfailed", on_failed)
    page.on("response", on_response)
    page.on("pageerror", lambda e: visit.errors.append(str(e)[:300]))
    try:
        yield page, visit
    finally:
        context.close()


# MathJax 2 typesets asynchronously after the page's load event; wait for its queue to drain.
MATH_DONE_JS = """
async (timeoutMs) => {
  if (!document.querySelector('.math.nohighlight')) return 'no math';
  const t0 = Date.now();
  while (!(window.MathJax && MathJax.Hub && MathJax.isReady)) {
    if (Date.now() - t0 > timeoutMs) return 'MathJax never became ready';
    await new Promise(r => setTimeout(r, 50));
  }
  await new Promise(r => MathJax.Hub.Queue(() => r()));
  return 'typeset';
}
"""

# What the reader sees, read from the DOM after MathJax ran. Observation only.
INSPECT_JS = r"""
() => {
  const article = document.querySelector('article.bd-article') || document.body;
  const clone = article.cloneNode(true);
  // code, outputs and typeset math are allowed their dollars and backslashes
  // (and so are the search's result summaries: plain text of the pages, by Sphinx's design)
  clone.querySelectorAll('pre, code, script, style, .highlight, .MathJax, .MathJax_Display, '
      + '.MathJax_Preview, .MathJax_SVG, .MathJax_CHTML, mjx-container, #search-results .context'
      ).forEach(n => n.remove());
  const text = clone.textContent;
  const raw = [];
  for (const re of [/\$[^$\n]{1,200}?\$/g, /\\\(/g, /\\\[/g, /\\begin\{/g]) {
    for (const m of text.matchAll(re)) {
      raw.push(text.slice(Math.max(0, m.index - 40), m.index + 60).replace(/\s+/g, ' '));
    }
  }
  // Sphinx's math elements (MathJax's own output has inner "math" spans too)
  const math = [...document.querySelectorAll('span.math.nohighlight, div.math.nohighlight')];
  const untypeset = math.filter(e => !e.querySelector(
      '.MathJax, .MathJax_Display, .MathJax_SVG, .MathJax_CHTML, mjx-container'))
    .map(e => e.textContent.slice(0, 80));
  const mathErrors = [...document.querySelectorAll('.MathJax_Error, .noError, merror')]
    .map(e => e.textContent.slice(0, 80));
  const images = [...document.images].map(i => ({
    src: i.getAttribute('src') || '', ok: i.complete && i.naturalWidth > 0}));
  const links = [...document.querySelectorAll('a[href]')].map(a => a.href);
  const h1 = article.querySelector('h1');
  return {
    title: h1 ? h1.textContent.replace(/[#¶]\s*$/, '').trim() : null,
    text_length: article.textContent.length,
    raw, untypeset, mathErrors, images, links, n_math: math.length,
    cells: article.querySelectorAll('div.cell').length,
    code_cells: article.querySelectorAll('div.cell div.cell_input .highlight').length,
    highlighted: article.querySelectorAll('div.cell_input .highlight span.k, '
      + 'div.cell_input .highlight span.kn').length,
    run_note: !!article.querySelector('.ft-run') &&
      article.querySelector('.ft-run').textContent.includes('make lab'),
    checkpoint: article.querySelectorAll('section.ft-checkpoint').length,
    exercises: article.querySelectorAll('section.ft-exercises').length,
    widgets: article.querySelectorAll('div.cell.ft-widget img').length,
    prev: (document.querySelector('a.left-prev') || {}).href || null,
    next: (document.querySelector('a.right-next') || {}).href || null,
    nav: [...document.querySelectorAll('.bd-sidebar-primary nav a.reference')].map(a => a.href),
    table_links: [...article.querySelectorAll('table a')].map(a => a.href),
  };
}
"""


class _Ids(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)


@functools.cache
def _ids(path: Path) -> frozenset[str]:
    parser = _Ids()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return frozenset(parser.ids)


def _broken_links(site: Site, page_url: str, links: list[str]) -> list[str]:
    """Links into the site whose file does not exist, or whose #anchor is not on that page."""
    broken = []
    for href in sorted(set(links)):
        parts = urllib.parse.urlsplit(href)
        if parts.scheme not in ("http", "https") or not href.startswith(site.base):
            continue  # off-site links may exist; only loading from them is forbidden
        rel = urllib.parse.unquote(parts.path)[1:]
        target = site.root / rel
        if rel == "" or target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            broken.append(f"{href} (no {target.relative_to(site.root)})")
        elif parts.fragment and target.suffix == ".html" and \
                urllib.parse.unquote(parts.fragment) not in _ids(target):
            broken.append(f"{href} (no id {parts.fragment!r} on {target.relative_to(site.root)})")
    return [f"broken link on {page_url}: {b}" for b in broken]


def inspect(page: object, visit: Visit, site: Site, path: str, screenshot: Path | None = None,
            math_timeout_s: float = PAGE_TIMEOUT_S) -> tuple[list[str], dict]:
    """Open ``path`` of ``site``; return every problem found (empty when the page is good) and
    what the page showed."""
    url = site.url(path)
    t0 = time.monotonic()
    page.goto(url, wait_until="load", timeout=PAGE_TIMEOUT_S * 1000)
    math = page.evaluate(MATH_DONE_JS, math_timeout_s * 1000)
    page.wait_for_load_state("networkidle", timeout=PAGE_TIMEOUT_S * 1000)  # fonts MathJax asked
    shown = page.evaluate(INSPECT_JS)
    if screenshot is not None:
        page.screenshot(path=str(screenshot), full_page=True, type="jpeg", quality=70)
    shown["seconds"] = time.monotonic() - t0
    problems = []
    problems += [f"request off the site (blocked): {u}" for u in visit.off_site]
    problems += [f"failed request: {u}" for u in dict.fromkeys(visit.failed)]
    problems += [f"JavaScript error: {e}" for e in dict.fromkeys(visit.errors)]
    if math not in ("no math", "typeset"):
        problems.append(f"math not typeset: {math}")
    problems += [f"math left untypeset: {t!r}" for t in shown["untypeset"]]
    problems += [f"math error: {t!r}" for t in shown["mathErrors"]]
    problems += [f"raw math in the text: ...{t}..." for t in shown["raw"]]
    problems += [f"image did not load: {i['src']}" for i in shown["images"] if not i["ok"]]
    problems += _broken_links(site, path, shown["links"])
    return problems, shown


def _content_problems(path: str, shown: dict, pages: list[str], site: Site) -> list[str]:
    """The page has the book's content and its navigation."""
    found = []
    if path == "index.html":
        chapters = {site.url(p) for p in pages[1:]}
        linked = {u.split("#")[0] for u in shown["table_links"]}
        if not chapters or chapters - linked:
            found.append(f"front page: the chapter table does not link "
                         f"{sorted(chapters - linked) or 'any chapter'}")
        first = site.url(pages[1]) if len(pages) > 1 else None
        if shown["next"] != first:
            found.append(f"front page: 'next' is {shown['next']}, not the first chapter")
        return found
    i = pages.index(path)
    if not shown["title"] or not re.match(r"Chapter \d+ · ", shown["title"]):
        found.append(f"no 'Chapter N · ...' title (h1 is {shown['title']!r})")
    if shown["cells"] < 3 or shown["code_cells"] < 1 or shown["text_length"] < 2000:
        found.append(f"no chapter content: {shown['cells']} cells, {shown['code_cells']} code "
                     f"cells, {shown['text_length']} characters")
    if shown["code_cells"] and not shown["highlighted"]:
        found.append("code cells are not syntax-highlighted")
    if not shown["run_note"]:
        found.append("no note on how to run the chapter (make lab)")
    if not shown["checkpoint"] or not shown["exercises"]:
        found.append(f"checkpoint / exercises not marked ({shown['checkpoint']} checkpoint and "
                     f"{shown['exercises']} exercises sections)")
    want_prev = site.url(pages[i - 1])
    want_next = site.url(pages[i + 1]) if i + 1 < len(pages) else None
    if shown["prev"] != want_prev or shown["next"] != want_next:
        found.append(f"previous / next are {shown['prev']} / {shown['next']}, "
                     f"expected {want_prev} / {want_next}")
    missing_nav = {site.url(p) for p in pages[1:]} - {u.split("#")[0] for u in shown["nav"]}
    if missing_nav:
        found.append(f"the table of contents lacks {sorted(missing_nav)}")
    return found


# ----------------------------------------------------------------------------- the tests

PAGES = _pages()


@pytest.mark.parametrize("path", PAGES or ["<no site built>"],
                         ids=lambda p: p.removesuffix(".html"))
def test_page(path: str, site: Site, browser: object) -> None:
    if not PAGES:
        pytest.fail(f"no pages in {SITE}: run `make book` first (`make test-book` does)")
    shot = ARTIFACTS / (path.removesuffix(".html").replace("/", "__") + ".jpg")
    with _page(browser, site) as (page, visit):
        problems, shown = inspect(page, visit, site, path, screenshot=shot)
    problems += _content_problems(path, shown, PAGES, site)
    _summary(f"{path}: {shown['seconds']:.1f} s, {shown['n_math']} math, "
             f"{len(shown['images'])} images, {shown['cells']} cells, "
             f"{shown['widgets']} widget figures, {len(set(shown['links']))} links, "
             f"{len(problems)} problem(s)")
    assert not problems, f"{path}:\n  " + "\n  ".join(problems)


def test_offline_search(site: Site, browser: object) -> None:
    """The site's own search (Sphinx's index, in the page's JavaScript) finds a chapter."""
    with _page(browser, site) as (page, visit):
        problems, _ = inspect(page, visit, site, "search.html?q=online+softmax")
        n_failed, n_off = len(visit.failed), len(visit.off_site)
        results = page.locator("#search-results ul.search li a")
        try:
            results.first.wait_for(timeout=PAGE_TIMEOUT_S * 1000)
        except Exception:
            problems.append("the search for 'online softmax' returned nothing")
        page.wait_for_load_state("networkidle")  # the result summaries are fetched pages
        hrefs = [results.nth(i).get_attribute("href") for i in range(results.count())]
        page.screenshot(path=str(ARTIFACTS / "search.jpg"), type="jpeg", quality=70)
        problems += [f"failed request while searching: {u}" for u in visit.failed[n_failed:]]
        problems += [f"request off the site while searching (blocked): {u}"
                     for u in visit.off_site[n_off:]]
    if hrefs and not any("02_streaming_softmax" in h for h in hrefs):
        problems.append(f"searching 'online softmax' does not find chapter 2: {hrefs[:5]}")
    _summary(f"search 'online softmax': {len(hrefs)} result(s)")
    assert not problems, "search.html:\n  " + "\n  ".join(problems)


BROKEN_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8">
<script src="https://cdn.example.org/lib.js"></script></head><body>
<article class="bd-article"><h1>Broken on purpose</h1>
<p>Raw inline math $a_i + b_i$ and \\(x\\) left behind.</p>
<span class="math notranslate nohighlight">\\(y\\)</span>
<img src="missing.png" alt="missing">
<a href="nowhere.html">a dead link</a> <a href="#no-such-anchor">a dead anchor</a>
<a href="https://example.org/">an outside link (allowed)</a>
</article></body></html>
"""


def test_checks_can_fail(browser: object) -> None:
    """Every check above reports a page broken on purpose (a scratch site in a temporary
    folder): an off-site script, raw and untypeset math, a missing image, dead links."""
    tmp = Path(tempfile.mkdtemp(prefix="flashtext-book-selftest-"))
    try:
        (tmp / "index.html").write_text(BROKEN_PAGE)
        with serve(tmp) as scratch, _page(browser, scratch) as (page, visit):
            problems, _ = inspect(page, visit, scratch, "index.html", math_timeout_s=2)
            scratch_base = scratch.base
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    text = "\n".join(problems)
    for expected in ("request off the site (blocked): https://cdn.example.org/lib.js",
                     "failed request: " + scratch_base + "missing.png (HTTP 404)",
                     "math left untypeset: '\\\\(y\\\\)'",
                     "raw math in the text: ...", "$a_i + b_i$", "\\(x\\)",
                     "image did not load: missing.png",
                     "nowhere.html (no nowhere.html)", "(no id 'no-such-anchor' on index.html)"):
        assert expected in text, f"the check did not report {expected!r}; it reported:\n{text}"
    assert "example.org/ (" not in text, f"an outside link was reported as broken:\n{text}"
