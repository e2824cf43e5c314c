"""Issue 20, item 7 in a real browser: every page of the site at 1440 px and 390 px without a console warning,
an error or a failed request, nothing wider than a phone's screen, and a report that a keyboard can use (a skip
link first, each chart one tab stop, the timeline zoomed, panned and asked for its state from the keys)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webapp import test_browser
from tests.webapp.helpers import FIXTURES, make_upload
from tests.webapp.test_browser import SCREENSHOTS, Visit, _analysed, _session_cookie
from tests.webapp.test_browser_honest import WIDTHS, _fits_the_screen

pytestmark = pytest.mark.browser
browser = test_browser.browser  # the module's Chromium, a pytest fixture shared with test_browser.py


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_every_page_is_quiet_and_fits(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    from django.urls import reverse

    from webapp.snapshots.teams import shares

    width, height = WIDTHS[form]
    one = _analysed(alpha, alice, "gpt_varlen_oom")
    two = _analysed(alpha, alice, "frag_oom")
    queued = make_upload(alpha, alice, FIXTURES / "infer_varbatch.pickle.gz", run="waiting")
    token = shares.share_create(one, alice)
    cookies = _session_cookie(client, alice, live_server)
    pages = {
        "report": (reverse("snapshots:detail", args=[one.code]), True),
        "report-frag": (reverse("snapshots:detail", args=[two.code]), True),
        "shared": (reverse("snapshots:share_view", args=[token]), True),
        "history": (reverse("snapshots:history", args=[alpha.slug]), True),
        "compare": (reverse("snapshots:compare", args=[one.code, two.code]), True),
        "status": (reverse("snapshots:detail", args=[queued.code]), False),
        "home": (reverse("snapshots:home"), False),
        "upload": (reverse("snapshots:upload"), False),
        "tokens": (reverse("snapshots:tokens"), False),
        "teams": (reverse("snapshots:teams"), False),
        "team": (reverse("snapshots:team", args=[alpha.team.slug]), False),
    }
    for name, (path, charts) in pages.items():
        visit = Visit(
            browser,
            live_server.url + path,
            None if name == "shared" else cookies,
            charts=charts,
            width=width,
            height=height,
        )
        try:
            if charts:
                visit.open_folds()
                visit.page.wait_for_timeout(500)
            assert visit.response.status == 200, name
            assert visit.warnings() == [], (name, visit.warnings())
            assert visit.errors() == [], (name, visit.errors())
            assert visit.csp_violations() == [], name
            assert visit.failed == [], (name, visit.failed)
            _fits_the_screen(visit, width)
            if name in ("report", "compare", "history") and form == "phone":
                visit.page.evaluate("window.scrollTo(0, 0)")
                visit.page.screenshot(path=str(SCREENSHOTS / f"phone-{name}.png"), full_page=False)
        finally:
            visit.close()


# An element's box after two animation frames.
SETTLED_BOX = """(e) => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() => {
  const r = e.getBoundingClientRect();
  done({x: r.x, y: r.y, width: r.width, height: r.height});
})))"""


def _settled_box(visit: Visit, selector: str) -> dict[str, float]:
    """The box of the first element ``selector`` finds (Playwright's locator: into BokehJS's shadow roots
    too) once the page's layout has settled: the same across two frames in a row (on a phone charts.js
    moves a chart's legends below it after BokehJS drew it, and BokehJS lays the chart out again). Waits on
    the page's state, not on a time: a loaded machine only takes more frames."""
    element = visit.page.locator(selector).first
    last = None
    for _ in range(600):
        box = element.evaluate(SETTLED_BOX)
        if box == last:
            return dict(box)
        last = box
    raise AssertionError(f"{selector}: its layout never settled (last box {last})")


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_the_decision_the_change_and_the_timeline_are_readable_on_a_phone(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    from django.urls import reverse

    width, height = WIDTHS[form]
    upload = _analysed(alpha, alice, "gpt_varlen_oom")
    visit = Visit(
        browser,
        live_server.url + reverse("snapshots:detail", args=[upload.code]),
        _session_cookie(client, alice, live_server),
        width=width,
        height=height,
    )
    try:
        page = visit.page
        # The timeline drawn (charts.js marks its slot), then every box read once the layout is still.
        visit.wait_for("() => document.querySelector('[data-chart=\"timeline-0\"]').dataset.rendered === '1'")
        tb = _settled_box(visit, '[data-chart="timeline-0"] .bk-Figure')
        line = page.locator("section.decision code").first
        box = _settled_box(visit, "section.decision code")
        # The change is wholly on screen: wrapped, never cut off or scrolled sideways.
        assert box["x"] >= 0 and box["x"] + box["width"] <= width
        assert line.evaluate("(e) => e.closest('pre').scrollWidth <= e.closest('pre').clientWidth")
        timeline = page.locator('[data-chart="timeline-0"] .bk-Figure').first
        assert tb["width"] <= width and tb["height"] >= 150
        # Text in the first screen is at least 12 px.
        smallest = page.evaluate(
            "Math.min(...Array.from(document.querySelectorAll('section.decision *')).filter((e) => e.childElementCount"
            " === 0 && e.textContent.trim()).map((e) => parseFloat(getComputedStyle(e).fontSize)))"
        )
        assert smallest >= 12, smallest
        timeline.scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"timeline-{form}.png"), full_page=False)
    finally:
        visit.close()


def test_the_keyboard_reaches_the_report_and_drives_the_timeline(
    browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    from django.urls import reverse

    upload = _analysed(alpha, alice, "gpt_varlen_oom")
    visit = Visit(
        browser,
        live_server.url + reverse("snapshots:detail", args=[upload.code]),
        _session_cookie(client, alice, live_server),
        width=1440,
    )
    try:
        page = visit.page
        visit.wait_for("() => document.querySelector('[data-chart=\"timeline-0\"]').dataset.exploreReady === '1'")
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.textContent") == "Skip to the content"
        page.keyboard.press("Enter")
        assert page.evaluate("document.activeElement.id") == "main"

        def active() -> str:
            """The focused element: a chart slot by its name, else its tag, class, chart and text."""
            return str(
                page.evaluate(
                    """(() => {
                      const e = document.activeElement;
                      if (e.dataset && e.dataset.chart) return e.dataset.chart;
                      const chart = e.closest('[data-chart]');
                      return `${e.tagName}.${e.className} in ${chart ? chart.dataset.chart : ''} `
                        + (e.textContent || '').trim().slice(0, 40);
                    })()"""
                )
            )

        # From the content to the timeline: the decision's controls and the fold headings, then the chart.
        stops = []
        for _ in range(30):
            page.keyboard.press("Tab")
            stops.append(active())
            if stops[-1] == "timeline-0":
                break
        assert stops[-1] == "timeline-0", stops
        assert len(stops) <= 12, stops
        # Each chart is one stop: the next Tab leaves the timeline for the event list's button, then the
        # active-memory chart, the segment timeline, and on.
        page.keyboard.press("Tab")
        assert active().endswith("Step through the events from the OOM"), active()
        page.keyboard.press("Tab")
        assert active() == "active-0"
        page.keyboard.press("Tab")
        assert active() == "segtime-0"
        page.keyboard.press("Tab")
        assert not active().startswith(("timeline", "active", "segtime")), active()
        for _ in range(4):
            page.keyboard.press("Shift+Tab")
        assert active() == "timeline-0"
        slot = page.locator('[data-chart="timeline-0"]')
        before = page.evaluate(
            "(() => { for (const d of Bokeh.documents) { const f = d.get_model_by_name('timeline-figure');"
            " if (f) return [f.x_range.start, f.x_range.end, f.y_range.end]; } })()"
        )
        for _ in range(6):
            page.keyboard.press("+")
        page.keyboard.press("ArrowRight")
        visit.wait_for("() => document.querySelector('[data-chart=\"timeline-0\"]').dataset.zoom === '1'")
        page.wait_for_timeout(500)
        after = page.evaluate(
            "(() => { for (const d of Bokeh.documents) { const f = d.get_model_by_name('timeline-figure');"
            " if (f) return [f.x_range.start, f.x_range.end, f.y_range.end]; } })()"
        )
        assert after[1] - after[0] < (before[1] - before[0]) / 40  # zoomed in about 64 times
        assert after[0] > before[0]
        lo, hi = (int(v) for v in slot.get_attribute("data-zoom-range").split("-"))
        assert lo >= before[0] and hi <= before[1]
        assert after[2] <= before[2]  # the y axis follows the window's data
        page.keyboard.press("Enter")
        visit.wait_for("() => /^[0-9]+$/.test(document.getElementById('state-0').dataset.state || '')")
        middle = round((after[0] + after[1]) / 2)
        assert abs(int(page.locator("#state-0").get_attribute("data-state")) - middle) <= 1
        page.keyboard.press("Home")
        # Back to the whole run: wait for the figure's range itself (a state), not for a time.
        visit.wait_for(
            "() => { for (const d of Bokeh.documents) { const f = d.get_model_by_name('timeline-figure');"
            f" if (f) return f.x_range.start === {before[0]!r} && f.x_range.end === {before[1]!r}; }} return false; }}"
        )
        home = page.evaluate(
            "(() => { for (const d of Bokeh.documents) { const f = d.get_model_by_name('timeline-figure');"
            " if (f) return [f.x_range.start, f.x_range.end]; } })()"
        )
        assert home == before[:2]
        assert visit.warnings() == [] and visit.errors() == [] and visit.failed == []
        page.screenshot(path=str(SCREENSHOTS / "keyboard-state.png"), full_page=False)
    finally:
        visit.close()
