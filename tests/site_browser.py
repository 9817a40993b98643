"""Open a built HTML site in headless Chromium and report what a reader would hit.

Used by test_browser.py on the built book, and by its own tests on small hand-made sites. Chromium is
Debian's ``chromium`` package (``apt-get install chromium``) where it is installed, else Playwright's own
(``python -m playwright install chromium``, under ~/.cache/ms-playwright); Playwright drives it. ``make test``
installs one of them when neither is there (``make browser``, which runs this file to ask whether one is).
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import os
import re
import shutil
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

DESKTOP = 1280
PHONE = 390
INSTALL_HINT = (
    "the browser test needs Chromium and Playwright (`pip install playwright`, in requirements.txt): "
    "`sudo apt-get install chromium` or `.venv/bin/python -m playwright install chromium` (`make browser` "
    "runs the one it can); or set MENTOR_CHROMIUM to a Chromium binary. "
    "To skip the browser test on a machine without them, set MENTOR_SKIP_BROWSER=1."
)
# The CSS pixels a page may be wider than the viewport before it counts as scrolling sideways.
SCROLL_SLACK = 1
# Glue that did not resolve: myst-nb leaves the role or directive text in the page.
GLUE_MARKERS = ("{glue", "glue:figure", "glue:text", "glue:md")


def chromium_path() -> str | None:
    """The Chromium binary to drive: $MENTOR_CHROMIUM, else `chromium` on PATH (Debian's package), else
    Playwright's own Chromium when it is installed, else None."""
    return os.environ.get("MENTOR_CHROMIUM") or shutil.which("chromium") or playwright_chromium()


def playwright_chromium() -> str | None:
    """Playwright's own Chromium (``python -m playwright install chromium``: under $PLAYWRIGHT_BROWSERS_PATH, by
    default ~/.cache/ms-playwright) when it is installed; None when it is not, or Playwright cannot start."""
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            path = playwright.chromium.executable_path
    except Exception:  # no Playwright, or its driver does not start: no Chromium of its own to drive
        return None
    return path if Path(path).is_file() else None


def site_pages(root: Path) -> list[str]:
    """The site's pages as paths relative to ``root``, without Sphinx's asset folders (redirects included)."""
    return sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*.html")
        if not path.relative_to(root).parts[0].startswith("_")
    )


def redirect_target(path: Path) -> str | None:
    """The URL a page sends the browser to with ``<meta http-equiv="refresh">``, or None."""
    parser = _Anchors()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser.redirect


@contextmanager
def serve(root: Path) -> Iterator[str]:
    """Serve ``root`` over http on a free local port; yields the base URL (ending in /)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Visit:
    """What one page showed at one viewport width."""

    page: str
    width: int
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)
    glue_left: list[str] = field(default_factory=list)
    # the page's width in CSS pixels when it is wider than the viewport, and its widest elements
    overflow: int | None = None
    wide_elements: list[str] = field(default_factory=list)
    # the figures of the page's content: (image file as the site serves it, width shown in CSS px)
    figures: list[tuple[str, float]] = field(default_factory=list)
    screenshot: Path | None = None

    @property
    def failed(self) -> bool:
        return bool(self.console_errors or self.failed_requests or self.broken_images or self.glue_left
                    or self.overflow is not None)

    def describe(self) -> str:
        parts = [f"{self.page} at {self.width} px"]
        for label, items in (("console errors", self.console_errors), ("failed requests", self.failed_requests),
                             ("images that did not load", self.broken_images),
                             ("glue left unresolved", self.glue_left)):
            if items:
                parts.append(f"  {label}: " + "; ".join(items))
        if self.overflow is not None:
            parts.append(f"  page is {self.overflow} px wide in a {self.width} px viewport; widest: "
                         + "; ".join(self.wide_elements))
        if self.screenshot is not None:
            parts.append(f"  screenshot: {self.screenshot}")
        return "\n".join(parts)


# Every <img> loads eagerly and decodes; the ones that fail are returned by their src.
_BROKEN_IMAGES_JS = """
async () => {
  const broken = [];
  await Promise.all([...document.images].map(async (img) => {
    img.loading = "eager";
    try { await img.decode(); } catch (e) { broken.push(img.currentSrc || img.src || img.outerHTML.slice(0, 80)); }
    if (img.complete && img.naturalWidth === 0 && !broken.includes(img.src)) broken.push(img.src);
  }));
  return broken;
}
"""

# The elements that stick out past the right edge of the viewport, outermost first: tag#id.class and right edge.
_WIDE_ELEMENTS_JS = """
() => {
  const limit = window.innerWidth;
  const out = [];
  const clipped = (el) => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== "visible") return true;
    }
    return false;
  };
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.right <= limit + 1 || clipped(el)) continue;
    const p = el.parentElement;
    if (p && p !== document.body && p.getBoundingClientRect().right > limit + 1) continue;
    const cls = typeof el.className === "string" && el.className ? "." + el.className.trim().split(/\\s+/).join(".") : "";
    out.push(`${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}${cls} (right edge ${Math.round(r.right)} px)`);
    if (out.length >= 5) break;
  }
  return out;
}
"""


# The content's images (Sphinx copies every figure and output image to _images/; not the logo or the index's
# toggle icons): their path under the site root and the width shown, in CSS px.
_FIGURES_JS = """
(base) => [...document.querySelectorAll("main img")]
  .filter((img) => img.currentSrc.startsWith(base + "_images/") && img.getBoundingClientRect().width > 0)
  .map((img) => [decodeURIComponent(new URL(img.currentSrc).pathname).replace(/^\\//, ""),
                 img.getBoundingClientRect().width])
"""

_VIEWBOX = re.compile(r'<svg\b[^>]*\bviewBox="\s*[-0-9.]+[ ,]+[-0-9.]+[ ,]+([0-9.]+)[ ,]+[0-9.]+\s*"')
_FONT_SIZE = re.compile(r"font-size:\s*([0-9.]+)(?:px)?|font-size=\"([0-9.]+)(?:px)?\"|font:\s*(?:[a-z]+\s+)*([0-9.]+)px")


def svg_text_px(svg: str, shown_width: float) -> float | None:
    """The size in CSS px, at ``shown_width`` px, of the smallest text of an SVG image (None when it has no text).

    Sizes are in the SVG's user units; shown ``shown_width`` wide, a unit is ``shown_width / viewBox width`` px.
    An SVG without a viewBox, or with text drawn as paths (matplotlib's default), has no size to read: a
    ValueError says so.

    >>> svg_text_px('<svg viewBox="0 0 288 100"><text style="font-size: 8px">a</text></svg>', 342)
    9.5
    """
    box = _VIEWBOX.search(svg)
    if box is None:
        raise ValueError("the SVG has no viewBox, so the size its text is shown at cannot be computed")
    sizes = [float(next(g for g in m.groups() if g)) for m in _FONT_SIZE.finditer(svg)]
    if not sizes:
        if "<text" in svg:
            raise ValueError("the SVG has <text> without a font size")
        return None
    return min(sizes) * shown_width / float(box.group(1))


def visit_pages(browser: object, base_url: str, pages: list[str], width: int, shots: Path | None) -> list[Visit]:
    """Open every page at ``width`` px in a fresh browser context and record what went wrong.

    A page that fails gets a full-page screenshot in ``shots`` (when given)."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    visits = []
    try:
        for rel in pages:
            visit = Visit(rel, width)
            page = context.new_page()
            page.on("console", lambda msg, v=visit: v.console_errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc, v=visit: v.console_errors.append(f"uncaught: {exc}"))
            page.on("response", lambda resp, v=visit: v.failed_requests.append(f"{resp.status} {resp.url}")
                    if resp.status >= 400 and resp.url.startswith(base_url) else None)
            page.on("requestfailed", lambda req, v=visit: v.failed_requests.append(f"{req.failure} {req.url}")
                    if req.url.startswith(base_url) else None)
            page.goto(base_url + rel, wait_until="load")
            visit.broken_images = page.evaluate(_BROKEN_IMAGES_JS)
            text = page.inner_text("body")
            visit.glue_left = [marker for marker in GLUE_MARKERS if marker in text]
            visit.figures = [(path, float(w)) for path, w in page.evaluate(_FIGURES_JS, base_url)]
            scroll_width = page.evaluate("document.documentElement.scrollWidth")
            if scroll_width > width + SCROLL_SLACK:
                visit.overflow = scroll_width
                visit.wide_elements = page.evaluate(_WIDE_ELEMENTS_JS)
            page.wait_for_timeout(50)  # late console messages from async scripts
            if visit.failed and shots is not None:
                shots.mkdir(parents=True, exist_ok=True)
                visit.screenshot = shots / f"{rel.replace('/', '_')}-{width}px.png"
                page.screenshot(path=str(visit.screenshot), full_page=True)
            page.close()
            visits.append(visit)
    finally:
        context.close()
    return visits


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()
        self.redirect: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"])
        if tag == "a" and values.get("name"):
            self.ids.add(values["name"])
        if tag == "a" and values.get("href"):
            self.hrefs.append(values["href"])
        if tag == "meta" and (values.get("http-equiv") or "").lower() == "refresh":
            target = (values.get("content") or "").partition("url=")[2].strip()
            self.redirect = target or None
            if target:
                self.hrefs.append(target)


def broken_links(root: Path, pages: list[str]) -> list[str]:
    """Internal links of ``pages`` whose file is missing from ``root`` or whose #fragment is not an id there."""
    parsed: dict[Path, _Anchors] = {}

    def anchors(path: Path) -> _Anchors:
        if path not in parsed:
            parser = _Anchors()
            parser.feed(path.read_text(encoding="utf-8", errors="replace"))
            parsed[path] = parser
        return parsed[path]

    broken = []
    for rel in pages:
        source = root / rel
        for href in anchors(source).hrefs:
            url = urllib.parse.urlsplit(href)
            if url.scheme or url.netloc or href.startswith(("mailto:", "javascript:")):
                continue
            target = source if not url.path else (source.parent / urllib.parse.unquote(url.path)).resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{rel}: {href} (no file {target.relative_to(root.resolve()) if target.is_relative_to(root.resolve()) else target})")
                continue
            fragment = urllib.parse.unquote(url.fragment)
            if fragment and target.suffix == ".html" and fragment not in anchors(target).ids:
                broken.append(f"{rel}: {href} (no id {fragment!r} in {target.name})")
    return broken


if __name__ == "__main__":
    # `make browser` asks whether there is a Chromium to drive: prints it, exit status 1 when there is none.
    found = chromium_path()
    print(found or "no Chromium: not $MENTOR_CHROMIUM, `chromium` on PATH or Playwright's own")
    raise SystemExit(0 if found and Path(found).is_file() else 1)
