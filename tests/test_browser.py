"""The built book in headless Chromium, as a reader opens it: every page at a desktop and a phone width.

Checked on every page at 1280 px and 390 px: no console errors or failed requests, every image loads, no
glue placeholder is left, and (at 390 px) the page does not scroll sideways. Also: the phone's sidebar
toggle opens the navigation, search finds a known word over http, and every internal link resolves to a
file and an id. A page that fails leaves a screenshot in _build/browser-test/ (printed in the failure).

The site_browser checks are themselves tested on small hand-made sites at the end of this file.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import site_browser as sb

REPO = Path(__file__).resolve().parent.parent
SHOTS = REPO / "_build" / "browser-test"

pytestmark = pytest.mark.browser


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium (Debian's package, else Playwright's own) through Playwright; fails with the install
    commands when there is neither."""
    if os.environ.get("MENTOR_SKIP_BROWSER") == "1":
        pytest.skip("MENTOR_SKIP_BROWSER=1: the browser test is skipped")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is not installed; " + sb.INSTALL_HINT, pytrace=False)
    path = sb.chromium_path()
    if path is None or not Path(path).is_file():
        pytest.fail("no Chromium binary (looked for $MENTOR_CHROMIUM, `chromium` on PATH and Playwright's own); "
                    + sb.INSTALL_HINT, pytrace=False)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def site(built_book):
    """(html folder, base URL, pages to open) of the built book, served over http."""
    build, html, _ = built_book
    if build.returncode != 0:
        pytest.fail("the book did not build; see test_book_builds", pytrace=False)
    pages = [rel for rel in sb.site_pages(html) if sb.redirect_target(html / rel) is None]
    with sb.serve(html) as base:
        yield html, base, pages


@pytest.fixture(scope="session")
def visits(browser, site):
    """Every page opened at the desktop and the phone width."""
    html, base, pages = site
    shutil.rmtree(SHOTS, ignore_errors=True)  # only this run's failures
    return {width: sb.visit_pages(browser, base, pages, width, SHOTS) for width in (sb.DESKTOP, sb.PHONE)}


def _failures(visits: list[sb.Visit], failed) -> str:
    bad = [visit.describe() for visit in visits if failed(visit)]
    return f"{len(bad)} page(s):\n" + "\n".join(bad)


def test_every_page_is_opened(site, visits):
    html, _, pages = site
    assert {"book/intro.html", "book/api.html", "search.html"} <= set(pages)
    assert [v.page for v in visits[sb.PHONE]] == pages == [v.page for v in visits[sb.DESKTOP]]


@pytest.mark.parametrize("width", [sb.DESKTOP, sb.PHONE])
def test_no_console_errors_or_failed_requests(visits, width):
    found = [v for v in visits[width] if v.console_errors or v.failed_requests]
    assert not found, _failures(found, lambda v: True)


@pytest.mark.parametrize("width", [sb.DESKTOP, sb.PHONE])
def test_every_image_loads(visits, width):
    found = [v for v in visits[width] if v.broken_images]
    assert not found, _failures(found, lambda v: True)


def test_images_are_there_to_load(visits):
    # the figure pages really hold images: the image check is not vacuous
    assert sum(1 for v in visits[sb.DESKTOP] if v.page.startswith("book/0")) >= 8


@pytest.mark.parametrize("width", [sb.DESKTOP, sb.PHONE])
def test_no_glue_placeholder_is_left(visits, width):
    found = [v for v in visits[width] if v.glue_left]
    assert not found, _failures(found, lambda v: True)


def test_no_page_scrolls_sideways_at_phone_width(visits):
    found = [v for v in visits[sb.PHONE] if v.overflow is not None]
    assert not found, _failures(found, lambda v: True)


PNG_FIGURE_PAGES: set[str] = set()
"""The pages whose stored figures are still PNG, drawn before mentor.lab.figures: their text size cannot be read, and
each goes from this set when its chapter is rerun with SVG figures (issue 24). The test below fails both ways: a new
PNG figure elsewhere, or a page here that no longer has one."""
MIN_TEXT_PX = 9.0


def test_png_figures_are_left_only_on_the_pages_that_await_their_rerun(visits):
    found = {v.page for v in visits[sb.PHONE] if any(path.endswith(".png") for path, _ in v.figures)}
    assert found == PNG_FIGURE_PAGES, (f"pages with PNG figures not listed: {sorted(found - PNG_FIGURE_PAGES)}; "
                                       f"listed pages without one: {sorted(PNG_FIGURE_PAGES - found)}")


def test_svg_figure_text_is_at_least_9_px_on_a_phone(site, visits):
    """Every SVG figure's smallest text, at the width the 390 px page shows it, read from the file's font sizes."""
    html, _, _ = site
    small, unreadable = [], []
    for visit in visits[sb.PHONE]:
        for path, width in visit.figures:
            if not path.endswith(".svg"):
                continue
            try:
                px = sb.svg_text_px((html / path).read_text(encoding="utf-8"), width)
            except ValueError as err:
                unreadable.append(f"{visit.page}: {path}: {err}")
                continue
            if px is not None and px < MIN_TEXT_PX:
                small.append(f"{visit.page}: {path} shown {width:.0f} px wide, smallest text {px:.1f} px")
    assert not unreadable, "\n".join(unreadable)
    assert not small, "\n".join(small)


def test_internal_links_resolve(site):
    html, _, _ = site
    broken = sb.broken_links(html, sb.site_pages(html))
    assert not broken, "\n".join(broken)


def _shot(page, name: str) -> str:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / name), full_page=True)
    return f" (screenshot: {SHOTS / name})"


@pytest.mark.parametrize("width", [sb.PHONE, 768])
def test_the_sidebar_toggle_opens_the_navigation(browser, site, width):
    _, base, _ = site
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        page.goto(base + "book/05_weight.html", wait_until="load")
        toggle = page.locator("button.primary-toggle").first
        assert toggle.is_visible(), "no visible sidebar toggle" + _shot(page, f"toggle-{width}px.png")
        toggle.click()
        dialog = page.locator("dialog#pst-primary-sidebar-modal")
        dialog.wait_for(state="visible", timeout=5000)
        link = dialog.locator("a", has_text="The baseline").first
        assert link.is_visible(), "the opened sidebar shows no chapter link" + _shot(page, f"toggle-{width}px.png")
        link.click()
        page.wait_for_url("**/01_baseline.html", timeout=5000)
    finally:
        context.close()


def _search(browser, base: str, word: str) -> list[str]:
    """The pages that the built book's search page lists for ``word``, as their link targets."""
    context = browser.new_context(viewport={"width": sb.DESKTOP, "height": 900})
    page = context.new_page()
    try:
        page.goto(base + f"search.html?q={word}", wait_until="load")
        results = page.locator("#search-results li")
        try:
            results.first.wait_for(state="attached", timeout=15000)
        except Exception:
            pytest.fail(f"search for {word!r} listed no result" + _shot(page, f"search-{word}.png"), pytrace=False)
        page.wait_for_function("() => (document.querySelector('#search-results .search-summary') || {})"
                               ".textContent?.includes('Search finished')", timeout=15000)
        return [link.split("?")[0].split("#")[0] for link in
                page.locator("#search-results li > a").evaluate_all("links => links.map(a => a.getAttribute('href'))")]
    finally:
        context.close()


def test_search_finds_a_known_word(browser, site):
    _, base, _ = site
    found = _search(browser, base, "torchmetrics")
    assert len(found) >= 5, f"search for 'torchmetrics' listed {found}"


def test_search_finds_a_name_by_a_part_of_it(browser, site):
    """"scatter" finds the chapters that name only scatter_stat_scores (book/_ext/search_parts.py)."""
    _, base, _ = site
    found = _search(browser, base, "scatter")
    assert {"book/06_nan_check.html", "book/10_macro_and_collections.html"} <= set(found), found


# --- the checks themselves, on hand-made sites ---

BAD_PAGE = """<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>bad</title></head><body>
<p>Step time {glue:text}`step_ms` ms.</p>
<img src="missing.png" alt="gone">
<img src="ok.svg" alt="fine">
<div style="width: 600px">wide</div>
<a href="good.html#there">ok</a> <a href="good.html#nowhere">bad id</a> <a href="nothing.html">no file</a>
<script>console.error("boom");</script>
</body></html>"""
GOOD_PAGE = """<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>good</title></head><body>
<p id="there">Fine.</p><img src="ok.svg" alt="fine"><a href="#there">self</a><a href="https://example.org/">out</a>
</body></html>"""
SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>'


@pytest.fixture
def toy_site(tmp_path):
    (tmp_path / "bad.html").write_text(BAD_PAGE)
    (tmp_path / "good.html").write_text(GOOD_PAGE)
    (tmp_path / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=good.html" />')
    (tmp_path / "ok.svg").write_text(SVG)
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "skip.html").write_text("asset folder, not a page")
    return tmp_path


def test_svg_text_px_reads_the_smallest_text_against_the_viewbox():
    svg = ('<svg width="288pt" viewBox="0 0 288 144"><text style="font-size: 10px; font-family: x">a</text>'
           '<text style="font-size: 7.5px">b</text><text font-size="12">c</text></svg>')
    assert sb.svg_text_px(svg, 342) == pytest.approx(7.5 * 342 / 288)
    assert sb.svg_text_px(svg, 576) == 15.0
    assert sb.svg_text_px('<svg viewBox="0 0 10 10"><rect/></svg>', 100) is None
    with pytest.raises(ValueError, match="no viewBox"):
        sb.svg_text_px('<svg width="10"><text style="font-size: 5px">a</text></svg>', 100)
    with pytest.raises(ValueError, match="<text> without a font size"):
        sb.svg_text_px('<svg viewBox="0 0 10 10"><text>a</text></svg>', 100)


def test_site_pages_and_redirects(toy_site):
    assert sb.site_pages(toy_site) == ["bad.html", "good.html", "index.html"]
    assert sb.redirect_target(toy_site / "index.html") == "good.html"
    assert sb.redirect_target(toy_site / "good.html") is None


def test_the_checks_find_each_fault_of_a_bad_page(browser, toy_site, tmp_path_factory):
    shots = tmp_path_factory.mktemp("shots")
    with sb.serve(toy_site) as base:
        bad, good = sb.visit_pages(browser, base, ["bad.html", "good.html"], sb.PHONE, shots)
    # Chromium also logs the 404 of the missing image as a console error, before or after the script's
    others = [e for e in bad.console_errors if e != "boom"]
    assert bad.console_errors.count("boom") == 1 and len(others) == 1 and "404" in others[0], bad.console_errors
    assert bad.failed_requests == [f"404 {base}missing.png"]
    assert bad.broken_images == [f"{base}missing.png"]
    assert bad.glue_left == ["{glue", "glue:text"]
    assert bad.overflow is not None and bad.overflow >= 600
    assert any(w.startswith("div") for w in bad.wide_elements), bad.wide_elements
    assert bad.screenshot == shots / "bad.html-390px.png" and bad.screenshot.stat().st_size > 0
    assert not good.failed and good.screenshot is None, good.describe()


def test_broken_links_names_missing_files_and_ids(toy_site):
    assert sb.broken_links(toy_site, ["bad.html", "good.html", "index.html"]) == [
        "bad.html: good.html#nowhere (no id 'nowhere' in good.html)",
        "bad.html: nothing.html (no file nothing.html)",
    ]


def test_the_landing_pages_headline_is_on_a_phones_first_screen(browser, site):
    """At 390 x 844 px, the landing page's measured result ("The result." and its glued overheads) is fully visible
    before any scrolling."""
    _, base, _ = site
    context = browser.new_context(viewport={"width": sb.PHONE, "height": 844})
    page = context.new_page()
    try:
        page.goto(base + "book/intro.html", wait_until="load")
        headline = page.locator("p", has=page.locator("strong", has_text="The result.")).first
        box = headline.bounding_box()
        assert box is not None, "the landing page has no paragraph that starts with 'The result.'"
        assert box["y"] + box["height"] <= 844, (
            f"the headline paragraph ends {box['y'] + box['height']:.0f} px down, below the phone's first screen"
            + _shot(page, "headline.png"))
        assert "%" in headline.inner_text()  # its glued overheads are rendered, not placeholders
    finally:
        context.close()


def test_visits_list_the_content_figures_with_their_shown_width(browser, tmp_path):
    """Only images under _images/ inside <main> count, at the width the page shows them."""
    (tmp_path / "_images").mkdir()
    (tmp_path / "_images" / "f.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="288pt" height="72pt" '
                                                'viewBox="0 0 288 72"><text y="20" style="font-size: 8px">a</text></svg>')
    (tmp_path / "logo.svg").write_text(SVG)
    (tmp_path / "page.html").write_text(
        '<!doctype html><html><head><meta charset="utf-8"><link rel="icon" href="data:,"><title>t</title></head><body>'
        '<img src="logo.svg" alt="logo"><main><img src="_images/f.svg" alt="f" style="width: 171px"></main></body></html>')
    with sb.serve(tmp_path) as base:
        (visit,) = sb.visit_pages(browser, base, ["page.html"], sb.PHONE, None)
    assert visit.figures == [("_images/f.svg", 171.0)]
    assert sb.svg_text_px((tmp_path / "_images" / "f.svg").read_text(), 171.0) == 4.75


def test_a_pending_rerun_is_said_under_the_title_in_four_phone_lines_at_most(browser, site):
    """At 390 px, each chapter whose stored run waits for a rerun (book/_ext/run_box.py) says so right under its title
    in at most four lines of text, none under 9 px, with the changed files folded until opened."""
    import json

    _, base, _ = site
    waived = [p.stem for p in sorted((REPO / "book").glob("*.ipynb"))
              if json.loads(p.read_text()).get("metadata", {}).get("mentor", {}).get("waiver")]
    context = browser.new_context(viewport={"width": sb.PHONE, "height": 844})
    page = context.new_page()
    try:
        for name in waived:
            page.goto(f"{base}book/{name}.html", wait_until="load")
            banner = page.locator("div.pending-rerun").first
            assert banner.count() == 1, f"{name}: no pending-rerun note" + _shot(page, f"{name}-banner.png")
            text = banner.locator("p").first
            lines = page.evaluate(
                "p => { const r = document.createRange(); r.selectNodeContents(p);"
                " const tops = new Set([...r.getClientRects()].map(b => Math.round(b.top)));"
                " return [tops.size, parseFloat(getComputedStyle(p).fontSize)]; }", text.element_handle())
            assert lines[0] <= 4 and lines[1] >= 9, (f"{name}: the note takes {lines[0]} lines at {lines[1]} px"
                                                     + _shot(page, f"{name}-banner.png"))
            assert text.inner_text().startswith("Rerun pending.")
            assert banner.locator("details").first.get_attribute("open") is None  # folded until opened
            title_box = page.locator("article h1").first.bounding_box()
            assert title_box is not None, f"{name}: no visible title" + _shot(page, f"{name}-banner.png")
            assert title_box["y"] < banner.bounding_box()["y"] < title_box["y"] + title_box["height"] + 60, (
                f"{name}: the note is not right under the title" + _shot(page, f"{name}-banner.png"))
    finally:
        context.close()
