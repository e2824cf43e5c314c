"""A real browser on a finished report: every chart drawn, no console error, no CSP violation, no request off-site.

Debian's chromium (``/usr/bin/chromium``, ``apt-get install -y chromium``) driven by the
playwright package (its own browser downloads are not used). The report comes from the real
``gpt_varlen_oom`` fixture through the worker's task function, served by ``live_server`` with
the site's real middleware (django-csp nonces, WhiteNoise for BokehJS). Screenshots go to
``test-results/`` (ignored by git), so a test run never changes tracked files; to refresh the
README's ``docs/screenshots/`` on purpose, run with ``OOMSCOPE_SCREENSHOTS=docs/screenshots``
(then look at them, and commit the ones that changed for a reason).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.webapp import chartdata
from tests.webapp.helpers import make_upload

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Screenshots go to test-results/ (ignored); OOMSCOPE_SCREENSHOTS=docs/screenshots refreshes the
# committed ones on purpose.
_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("OOMSCOPE_SCREENSHOTS") or _ROOT / "test-results")
DOCS_SCREENSHOTS = _ROOT / "docs" / "screenshots"


def _docs_screenshots_state() -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(DOCS_SCREENSHOTS.glob("*"))}


@pytest.fixture(scope="module", autouse=True)
def _docs_screenshots_untouched() -> Iterator[None]:
    """Unless asked to, the run leaves the tracked screenshots as they were (issue 13, item 7)."""
    before = _docs_screenshots_state()
    yield
    if SCREENSHOTS.resolve() != DOCS_SCREENSHOTS.resolve():
        assert _docs_screenshots_state() == before, "a test wrote into docs/screenshots/"


# Collects CSP violations from inside the page (init scripts run outside the page's CSP).
WATCH_CSP = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__cspViolations.push(e.violatedDirective + " " + e.blockedURI);
});
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip("no Debian chromium at /usr/bin/chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in requirements-dev.txt")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # Playwright's sync API keeps an asyncio loop running in this thread; Django's ORM refuses to run
    # while one is, although these tests never use it concurrently (the documented pytest-django +
    # playwright setting).
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            yield b
            b.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def finished(transactional_db: Any, alice: Any, alpha: Any) -> Any:
    """A done upload of gpt_varlen_oom, analysed by the task function itself."""
    from webapp.snapshots.models import Upload
    from webapp.snapshots.worker.tasks import analyse_upload

    upload = make_upload(alpha, alice, run="nightly-1234", tags=["gpt", "7GiB-cap"], note="Batch 6, seq jitter.")
    analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == Upload.Status.DONE, (upload.error_code, upload.error_message)
    return upload


class Visit:
    """One page load with everything the browser saw recorded."""

    def __init__(
        self,
        browser: Any,
        url: str,
        cookies: list[dict[str, Any]] | None = None,
        *,
        charts: bool = True,
        width: int = 1280,
        height: int = 900,
    ) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": height})
        if cookies:
            self.context.add_cookies(cookies)
        self.context.add_init_script(WATCH_CSP)
        self.page = self.context.new_page()
        self.console: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.failed: list[str] = []
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.url} {r.failure}"))
        self.page.on("response", lambda r: r.status >= 400 and self.failed.append(f"{r.url} {r.status}"))
        self.response = self.page.goto(url)
        if charts:
            # charts.js sets this once every chart has been handled (drawn or failed), after charts.json came.
            self.wait_for("() => document.body.dataset.chartsDrawn !== undefined")
        self.page.wait_for_timeout(300)

    def open_folds(self) -> None:
        """Open every folded section; charts.js draws the charts inside as each opens."""
        self.page.evaluate("document.querySelectorAll('details').forEach((d) => { d.open = true; })")
        self.wait_for(
            "() => document.body.dataset.chartsDrawn === document.body.dataset.chartsTotal"
            " || document.querySelector('[data-rendered=error]') !== null"
        )
        self.page.wait_for_timeout(200)

    def wait_for(self, predicate: str, timeout_s: float = 60) -> None:
        """Poll a JS predicate with ``evaluate`` (``wait_for_function`` evals a string, which the CSP forbids)."""
        import time

        deadline = time.monotonic() + timeout_s
        while not self.page.evaluate(predicate):
            assert time.monotonic() < deadline, f"timed out waiting for {predicate}"
            self.page.wait_for_timeout(50)

    def wait_for_whole_report(self, timeout_s: float = 60) -> None:
        """Wait until the page is the whole report and has stopped polling: status.js reloads it once at the
        first answer and again when done, and a ``goto`` issued between the two is aborted by the reload."""
        import time

        from playwright.sync_api import Error as PlaywrightError

        settled = (
            "() => document.querySelector('section.decision') !== null"
            " && !document.querySelector('[data-status-url]')"
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.page.evaluate(settled):
                    return
            except PlaywrightError:  # a reload destroyed the context mid-evaluate: ask the new page
                pass
            assert time.monotonic() < deadline, "timed out waiting for the whole report"
            self.page.wait_for_timeout(50)

    def errors(self) -> list[str]:
        return [line for line in self.console if line.startswith(("error", "pageerror"))]

    def warnings(self) -> list[str]:
        """Console warnings (BokehJS's "could not set initial ranges" among them)."""
        return [line for line in self.console if line.startswith("warning")]

    def csp_violations(self) -> list[str]:
        return list(self.page.evaluate("window.__cspViolations"))

    def close(self) -> None:
        self.context.close()


def _expected_figures(charts: dict[str, dict[str, Any]]) -> int:
    return sum(chartdata.figure_count(item) for item in charts.values())


def _check_page(visit: Visit, charts: dict[str, dict[str, Any]], host: str | None) -> None:
    visit.open_folds()
    assert visit.errors() == []
    assert visit.csp_violations() == []
    # Pages with a server add an (initially empty) active-memory chart per device to the stored ones.
    # The active-memory and segment-timeline charts need the server's data: a page without one (the
    # standalone file) leaves them out.
    names = visit.page.evaluate("Array.from(document.querySelectorAll('[data-chart]')).map((e) => e.dataset.chart)")
    left_out = [n for n in charts if n not in names]
    assert all(n.startswith(("active-", "segtime-")) for n in left_out) and (host is None) == bool(left_out), left_out
    charts = {n: item for n, item in charts.items() if n in names}
    assert visit.page.evaluate("document.body.dataset.chartsDrawn") == str(len(charts))
    assert visit.page.locator("[data-chart][data-rendered=error]").count() == 0
    # Playwright's CSS selectors pierce Bokeh's open shadow roots.
    assert visit.page.locator(".bk-Figure").count() == _expected_figures(charts)
    for name in charts:
        assert visit.page.locator(f'[data-chart="{name}"] canvas').count() > 0, name
    for url in visit.requests:
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob"):
            continue
        if host is None:
            assert parts.scheme == "file", url
        else:
            assert parts.netloc == host, url


def test_shared_report_renders_under_the_csp(browser: Any, finished: Any, live_server: Any) -> None:
    from django.urls import reverse

    from webapp.snapshots.pages import payloads
    from webapp.snapshots.teams import shares

    charts = payloads.report_for(finished).charts
    assert {"timeline-0", "segments-peak-0", "segments-oom-0", "stacks-0", "whatif-0", "whatif-steps-0"} <= set(charts)
    token = shares.share_create(finished, finished.uploaded_by)
    visit = Visit(browser, live_server.url + reverse("snapshots:share_view", args=[token]))
    try:
        assert visit.response.status == 200
        csp = visit.response.headers["content-security-policy"]
        assert "'nonce-" in csp and "unsafe-eval" not in csp
        _check_page(visit, charts, urlsplit(live_server.url).netloc)
        # The timeline came without its hover text; charts.json brought it (explore.js put it in).
        assert any(u.endswith(f"/r/{token}/charts.json") for u in visit.requests)
        assert visit.page.locator('[data-chart="timeline-0"]').get_attribute("data-hover") == "1"
        # BokehJS came from our static files, pinned to the installed version.
        from importlib.metadata import version

        assert any(f"/static/bokeh/{version('bokeh')}/bokeh.min.js" in u for u in visit.requests)
        # Hover works without CustomJS: over the timeline, a tooltip gives a point's bytes in binary
        # units and exactly (BokehJS's numbro formats).
        timeline = visit.page.locator('[data-chart="timeline-0"] .bk-Figure').first
        timeline.scroll_into_view_if_needed()
        box = timeline.bounding_box()
        visit.page.mouse.move(box["x"] + box["width"] * 0.4, box["y"] + box["height"] * 0.5, steps=5)
        figures = visit.page.get_by_text(re.compile(r"^[0-9.]+ [KMG]iB \([0-9,]+ B\)$"))
        figures.first.wait_for(timeout=5_000)
        assert figures.count() >= 3  # reserved, allocated, requested at that event
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        visit.page.mouse.move(0, 0)
        visit.page.screenshot(path=str(SCREENSHOTS / "report-full.png"), full_page=True)
        visit.page.evaluate("window.scrollTo(0, 0)")
        visit.page.screenshot(path=str(SCREENSHOTS / "report.png"), full_page=False)  # the first screen
    finally:
        visit.close()


def test_members_report_page_renders(browser: Any, finished: Any, live_server: Any, client: Any) -> None:
    from django.urls import reverse

    from webapp.snapshots.pages import payloads

    client.force_login(finished.uploaded_by)
    cookie = {"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}
    visit = Visit(browser, live_server.url + reverse("snapshots:detail", args=[finished.code]), [cookie])
    try:
        assert visit.response.status == 200
        _check_page(visit, payloads.report_for(finished).charts, urlsplit(live_server.url).netloc)
        assert visit.page.get_by_role("button", name="Create a share link").count() == 1
    finally:
        visit.close()


def _jsonb_order(value: Any) -> Any:
    """Keys ordered as PostgreSQL's jsonb stores them (shorter first, then bytewise)."""
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: _jsonb_order(value[k]) for k in keys}
    if isinstance(value, list):
        return [_jsonb_order(v) for v in value]
    return value


def test_standalone_page_renders_from_disk(browser: Any, finished: Any, tmp_path: Path) -> None:
    from webapp.snapshots.management.commands.report import render_standalone
    from webapp.snapshots.pages import payloads

    stored = payloads.report_for(finished)
    page = tmp_path / "report.html"
    # Charts as a jsonb column returns them, whatever this test database is: bare references to
    # models may then come before their definitions, and charts.js must still draw every chart.
    reordered = _jsonb_order(stored.charts)
    page.write_text(render_standalone(stored.data, reordered), encoding="utf-8")
    visit = Visit(browser, page.as_uri())
    try:
        _check_page(visit, stored.charts, host=None)
        assert visit.requests == [page.as_uri()]  # the file itself and nothing else
        visit.page.screenshot(path=str(SCREENSHOTS / "report-standalone.png"), full_page=False)
    finally:
        visit.close()
    sizes = {"html": len(page.read_bytes()), "charts": len(json.dumps(stored.charts))}
    assert sizes["html"] < 5_000_000, sizes


def test_history_compare_and_upload_pages(browser: Any, finished: Any, live_server: Any, client: Any) -> None:
    """The project's other pages under the same CSP: the history chart, a comparison, the upload form."""
    from django.urls import reverse

    from tests.webapp.helpers import FIXTURES
    from webapp.snapshots.models import Upload
    from webapp.snapshots.pages import payloads
    from webapp.snapshots.pages.charts import build_compare_charts
    from webapp.snapshots.worker.tasks import analyse_upload

    other = make_upload(
        finished.project,
        finished.uploaded_by,
        FIXTURES / "gpt_varlen_expandable.pickle.gz",
        run="nightly-1235",
        tags=["expandable"],
    )
    analyse_upload(other.id)
    other.refresh_from_db()
    assert other.status == Upload.Status.DONE
    queued = make_upload(finished.project, finished.uploaded_by, run="waiting")  # never analysed: live status page

    client.force_login(finished.uploaded_by)
    cookies = [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    host = urlsplit(live_server.url).netloc

    history = Visit(browser, live_server.url + reverse("snapshots:history", args=[finished.project.slug]), cookies)
    try:
        assert history.errors() == [] and history.csp_violations() == []
        assert history.page.evaluate("document.body.dataset.chartsDrawn") == "1"
        assert history.page.locator('[data-chart="history"] .bk-Figure').count() == 1
        assert history.page.locator("table.history tbody tr").count() == 3
        history.page.screenshot(path=str(SCREENSHOTS / "history.png"), full_page=True)
        # The A/B radios open the comparison of the two finished runs.
        history.page.locator(f'input[name=a][value="{finished.code}"]').check()
        history.page.locator(f'input[name=b][value="{other.code}"]').check()
        history.page.get_by_role("button", name="Compare A with B").click()
        history.page.wait_for_url(f"**/compare/{finished.code}/{other.code}/")
    finally:
        history.close()

    compare = Visit(browser, live_server.url + reverse("snapshots:compare", args=[finished.code, other.code]), cookies)
    try:
        a, b = payloads.report_for(finished).data, payloads.report_for(other).data
        _check_page(compare, build_compare_charts(a, b), host)
        text = compare.page.locator(".compare-grid").inner_text()
        assert "6.93 GiB" in text  # gpt_varlen_oom's peak reserved
        # What changed: the delta of peak reserved, the setting that differs, the stack diff by site.
        from analysis.decision import format_size

        delta = b["devices"][0]["summary"]["peak_reserved_bytes"] - a["devices"][0]["summary"]["peak_reserved_bytes"]
        row = compare.page.locator('table.deltas tr[data-name="peak reserved"] td.delta').inner_text()
        assert row == ("+" if delta > 0 else "") + format_size(delta)
        settings = compare.page.locator("table.settings-diff").inner_text()
        assert "expandable_segments\tFalse\tTrue" in settings
        diff_rows = compare.page.locator("table.stack-diff").first.locator("tbody tr")
        assert diff_rows.count() >= 5
        changes = set(
            compare.page.locator("table.stack-diff")
            .first.locator("tbody tr")
            .evaluate_all("rows => rows.map(r => r.dataset.change)")
        )
        assert changes <= {"grew", "shrank", "new", "gone", "same"} and changes & {"grew", "shrank"}
        assert "capture.py:" in compare.page.locator("table.stack-diff").first.inner_text()
        compare.page.screenshot(path=str(SCREENSHOTS / "compare.png"), full_page=True)
    finally:
        compare.close()

    for name, url in (
        ("upload", reverse("snapshots:upload")),
        ("status", reverse("snapshots:detail", args=[queued.code])),
        ("home", reverse("snapshots:home")),
    ):
        page = Visit(browser, live_server.url + url, cookies, charts=False)
        try:
            assert page.response.status == 200, name
            assert page.errors() == [] and page.csp_violations() == [], name
            assert all(urlsplit(u).netloc == host for u in page.requests if urlsplit(u).scheme.startswith("http"))
            if name == "status":
                # status.js polls status.json from the page's own site.
                page.page.wait_for_timeout(1500)
                assert any(u.endswith("/status.json") for u in page.requests)
            page.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
            if name == "upload":
                # upload.js posts the form by XHR (progress bar) and follows the JSON answer to the new page.
                page.page.set_input_files("input[type=file]", str(FIXTURES / "frag_oom.pickle.gz"))
                page.page.fill("input[name=run]", "from-the-browser")
                page.page.get_by_role("button", name="Upload and analyse").click()
                page.page.wait_for_url("**/s/*/", timeout=30_000)
                made = Upload.objects.get(run="from-the-browser")
                assert made.filename == "frag_oom.pickle.gz" and made.project == finished.project
                assert page.errors() == [] and page.csp_violations() == []
        finally:
            page.close()


def _analysed(project: Any, user: Any, case: str) -> Any:
    from tests.webapp.helpers import FIXTURES
    from webapp.snapshots.models import Upload
    from webapp.snapshots.worker.tasks import analyse_upload

    upload = make_upload(project, user, FIXTURES / f"{case}.pickle.gz", run=case)
    analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == Upload.Status.DONE, (upload.error_code, upload.error_message)
    return upload


def _truth(case: str) -> dict[str, Any]:
    from tests.webapp.helpers import FIXTURES

    return json.loads((FIXTURES / f"{case}.truth.json").read_text())


def _session_cookie(client: Any, user: Any, live_server: Any) -> list[dict[str, Any]]:
    client.force_login(user)
    return [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "frag_oom", "infer_varbatch"])
def test_decision_screen_comes_first(
    case: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    """The first screen answers: the verdict, the change to copy, what the replay says it buys."""
    from django.urls import reverse

    from analysis.decision import format_size

    upload = _analysed(alpha, alice, case)
    truth = _truth(case)
    visit = Visit(
        browser,
        live_server.url + reverse("snapshots:detail", args=[upload.code]),
        _session_cookie(client, alice, live_server),
    )
    visit.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    try:
        page = visit.page
        box = page.locator("section.decision").first
        # On the first screen (1280x900), above everything else of the report.
        bounds = box.bounding_box()
        assert bounds is not None and bounds["y"] + bounds["height"] < 900, bounds
        headline = box.locator(".headline").inner_text()
        buys = box.locator(".buys").inner_text()
        stats = truth["memory_stats"]
        if truth["oom_message"]:
            # torch's own wording of the failed request, as its message printed it: the allocator's view,
            # under the cause's headline where the diagnosis names one.
            tried = re.search(r"Tried to allocate ([0-9.]+ [KMG]iB)", truth["oom_message"]).group(1)
            at_request = box.locator(".allocator-headline")
            allocator_view = at_request.inner_text() if at_request.count() else headline
            assert f"the {tried} request" in allocator_view
            assert allocator_view.startswith(("Out of memory from fragmentation", "The last of"))
        if case == "gpt_varlen_oom":
            # Its steps keep growing: the real expandable_segments rerun got past step 23 and died in step 27,
            # so the change is to cap the growth, and the settings only postpone.
            assert headline.startswith("The steps need more and more")
            assert box.locator("[data-kind=code]").count() == 1
            line = box.locator("code").first.inner_text()
            assert line.startswith("max_len = ")
            assert "no setting saves the run" in buys
            # The copy button copies the line exactly (our copy.js, no inline handler).
            box.get_by_role("button", name="Copy").click()
            visit.wait_for("() => document.querySelector('section.decision button').textContent === 'Copied'")
            assert page.evaluate("navigator.clipboard.readText()") == line
        elif case == "frag_oom":
            assert headline.startswith("The last of 2 OOMs in the trace.")
            assert box.locator("[data-kind=code]").count() == 1
            assert page.locator("table.ooms tbody tr").count() == 2  # both OOMs listed
        else:
            assert box.locator(".badge").inner_text() == "no OOM"
            idle_end = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
            assert f"held its peak of {format_size(stats['reserved_bytes.all.peak'])} (" in headline
            assert "of it held no live block" in headline
            assert f"at the end {format_size(idle_end)} is idle" in headline
            assert box.locator("code").first.inner_text() == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        # Everything else folds: the sections below are <details>.
        assert page.locator("details.fold").count() >= 5
        assert visit.errors() == [] and visit.csp_violations() == []
        page.screenshot(path=str(SCREENSHOTS / f"decision-{case}.png"), full_page=False)
    finally:
        visit.close()


def test_ranked_table_and_batch_advice(
    browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    """Issue 12 on a real growing-batch run (GPT-2, batch 4 ran, 5 died): the ranked table puts the change that
    lets the failing step finish first, and the batch advice and GPU sizes are on the page."""
    from django.urls import reverse

    from webapp.snapshots.models import Report

    upload = _analysed(alpha, alice, "grow_gpt2_default")
    dev = Report.objects.get(upload=upload).data["devices"][0]
    visit = Visit(
        browser,
        live_server.url + reverse("snapshots:detail", args=[upload.code]),
        _session_cookie(client, alice, live_server),
    )
    try:
        page = visit.page
        rows = page.locator("table.ranked tbody tr")
        assert rows.count() == len(dev["ranked"]) >= 2
        first = rows.first
        assert first.get_attribute("data-id") == dev["ranked"][0]["id"] == "smaller_batch"
        # The batch fit is an estimate (nothing replays a smaller batch): never a plain "yes" (issue 20).
        assert first.get_attribute("data-state") == "estimate"
        assert first.locator(".state-text").inner_text() == "should fit, by the batch estimate"
        # expandable_segments: the real rerun with it died in the same step, and the table says so
        exp = page.locator("table.ranked tr[data-id=expandable_segments]")
        assert exp.get_attribute("data-state") == "runs-out"
        assert exp.locator(".state-text").inner_text() == "runs out later in step 4"
        batch = page.locator(".batch-fit p").inner_text()
        assert f"{dev['batch_fit']['fraction'] * 100:.0f}%" in batch and "gradient accumulation" in batch
        gpu = page.locator(".gpu-fit p").inner_text()
        # The smallest cards that fit, not every card (issue 35).
        fits = dev["gpu_fit"]["fits_default"]
        assert f"the smallest cards that fit are {' and '.join(fits[:2])}" in gpu and fits[-1] not in gpu
        assert visit.errors() == [] and visit.csp_violations() == []
        page.screenshot(path=str(SCREENSHOTS / "ranked-grow_gpt2.png"), full_page=False)
    finally:
        visit.close()


def test_invite_roles_and_project_tokens_in_the_browser(
    browser: Any, transactional_db: Any, alice: Any, alpha: Any, bob: Any, live_server: Any, client: Any
) -> None:
    from django.test import Client

    from webapp.snapshots.models import Membership, Project

    bob.email = "bob@example.com"
    bob.save()
    cookies = _session_cookie(client, alice, live_server)
    visit = Visit(browser, live_server.url + f"/t/{alpha.team.slug}/", cookies, charts=False)
    try:
        page = visit.page
        page.get_by_label("Project name").fill("Gamma")
        page.get_by_role("button", name="Create the project").click()
        page.wait_for_load_state()
        assert Project.objects.filter(team=alpha.team, slug="gamma").exists()
        page.get_by_label("Username or email").fill("bob@example.com")
        page.get_by_label("Role").select_option("viewer")
        page.get_by_role("button", name="Invite").click()
        page.wait_for_load_state()
        # An invitation, not a membership: bob joins when he accepts (issue 22); listed as typed, so the
        # page does not tell whether that e-mail has an account (issue 36).
        invited = 'tr[data-invited="bob@example.com"]'
        assert page.locator(invited).inner_text().split("\t")[:3] == ["bob@example.com", "viewer", "alice"]
        assert not Membership.objects.filter(team=alpha.team, user=bob).exists()
        invitee = Visit(browser, live_server.url + "/teams/", _session_cookie(Client(), bob, live_server), charts=False)
        try:
            row = invitee.page.locator("tr[data-invitation]")
            assert alpha.team.slug in row.inner_text() and "alice" in row.inner_text()
            row.get_by_role("button", name="Accept").click()
            invitee.page.wait_for_load_state()
            assert invitee.errors() == [] and invitee.csp_violations() == []
        finally:
            invitee.close()
        page.reload()
        assert page.locator('tr[data-user="bob"] td.role').inner_text() == "viewer"
        assert page.locator(invited).count() == 0
        assert Membership.objects.get(team=alpha.team, user=bob).role == "viewer"
        # Promote to admin through the same form.
        page.get_by_label("Username or email").fill("bob")
        page.get_by_label("Role").select_option("admin")
        page.get_by_role("button", name="Invite").click()
        page.wait_for_load_state()
        assert page.locator('tr[data-user="bob"] td.role').inner_text() == "admin"
        page.screenshot(path=str(SCREENSHOTS / "team.png"), full_page=True)
        page.locator('tr[data-user="bob"]').get_by_role("button", name="Remove").click()
        page.wait_for_load_state()
        assert page.locator('tr[data-user="bob"]').count() == 0
        assert not Membership.objects.filter(team=alpha.team, user=bob).exists()

        # A token limited to Gamma, made in the UI, reaches Gamma only.
        page.goto(live_server.url + "/tokens/")
        page.get_by_label("Name").fill("cluster")
        page.get_by_label("Limit to one project").select_option("gamma")
        page.get_by_role("button", name="Make the token").click()
        page.wait_for_load_state()
        token = page.locator("#new-token").input_value()
        assert token.startswith("oom_")
        page.screenshot(path=str(SCREENSHOTS / "tokens.png"), full_page=True)
        seen = client.get("/api/v1/projects", HTTP_AUTHORIZATION=f"Bearer {token}").json()["projects"]
        assert [p["slug"] for p in seen] == ["gamma"]
        assert page.locator("table.tokens").inner_text().count("project gamma only") == 1
        assert visit.errors() == [] and visit.csp_violations() == []
    finally:
        visit.close()


def test_timeline_hover_click_state_and_zoom(browser: Any, finished: Any, live_server: Any, client: Any) -> None:
    """Hover names the event's stack; a click shows the replay's state there; zoom fetches single events."""
    from django.urls import reverse

    from analysis.allocator.recorded import recorded_replay
    from analysis.reader import read_snapshot
    from tests.webapp.helpers import GPT_OOM

    snap = read_snapshot(GPT_OOM)
    rep = recorded_replay(snap, snap.devices[0])
    visit = Visit(
        browser,
        live_server.url + reverse("snapshots:detail", args=[finished.code]),
        _session_cookie(client, finished.uploaded_by, live_server),
    )
    try:
        page = visit.page
        visit.wait_for("() => document.querySelector('[data-chart=\"timeline-0\"]').dataset.exploreReady === '1'")
        slot = page.locator('[data-chart="timeline-0"]')
        canvas = slot.locator(".bk-Figure").first
        canvas.scroll_into_view_if_needed()
        box = canvas.bounding_box()
        # Hover: the tooltip says what the event was and under which code (a stack label has " ← ").
        # (Frees of the backward pass carry no frames with stacks="python": move until a framed event.)
        what = page.get_by_text(re.compile(r"^[a-z ]+ [0-9.]+ (bytes|KiB|MiB|GiB) · .+"))
        labels = []
        for k in range(40):
            page.mouse.move(box["x"] + box["width"] * (0.1 + 0.021 * k), box["y"] + box["height"] * 0.55, steps=2)
            page.wait_for_timeout(150)
            if what.count():
                labels.append(what.first.inner_text())
                if ".py:" in labels[-1]:
                    break
        assert labels and ".py:" in labels[-1], labels
        # The active-memory chart got its bands for the whole range from the server.
        visit.wait_for("() => document.querySelector('[data-chart=\"active-0\"]').dataset.active === '1'")
        assert int(page.locator('[data-chart="active-0"]').get_attribute("data-active-bands")) > 50
        active = page.locator('[data-chart="active-0"] .bk-Figure').first
        active.scroll_into_view_if_needed()
        ab = active.bounding_box()
        page.mouse.move(ab["x"] + ab["width"] * 0.5, ab["y"] + ab["height"] * 0.8, steps=3)
        page.wait_for_timeout(300)
        page.screenshot(path=str(SCREENSHOTS / "report-active.png"), full_page=False)
        canvas.scroll_into_view_if_needed()
        box = canvas.bounding_box()
        # Click: the panel shows the state after that event, equal to the replay's.
        page.mouse.click(box["x"] + box["width"] * 0.55, box["y"] + box["height"] * 0.55)
        visit.wait_for("() => /^[0-9]+$/.test(document.getElementById('state-0').dataset.state || '')")
        index = int(page.locator("#state-0").get_attribute("data-state"))
        for figure, column in (("allocated", rep.allocated), ("reserved", rep.reserved), ("requested", rep.requested)):
            shown = page.locator(f'#state-0 dd[data-figure="{figure}"]').get_attribute("data-bytes")
            assert int(shown) == int(column[index]), figure
        drawn = page.locator("#state-0 .block.active_allocated")
        assert drawn.count() > 0
        sizes = page.locator("#state-0 .block.active_allocated").evaluate_all("els => els.map(e => +e.dataset.size)")
        assert sum(sizes) == int(rep.allocated[index])
        # Click a block made by user code: its allocation stack, every frame.
        page.locator('#state-0 .block.active_allocated[title*=".py:"]').first.click()
        visit.wait_for("() => document.querySelector('#state-0 .block-detail').dataset.alloc !== undefined")
        alloc = int(page.locator("#state-0 .block-detail").get_attribute("data-alloc"))
        frames = page.locator("#state-0 .block-detail ol").first.locator("li").count()
        assert frames == len(snap.stacks.frames_of(int(snap.devices[0].trace.stack[alloc]))) > 0
        page.screenshot(path=str(SCREENSHOTS / "report-state.png"), full_page=False)
        # Zoom with the wheel over the chart until the server sends single events.
        canvas.scroll_into_view_if_needed()
        box = canvas.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.45, box["y"] + box["height"] * 0.5)  # the plot, not its legend
        for _ in range(40):
            page.mouse.wheel(0, -300)
            page.wait_for_timeout(250)
            if slot.get_attribute("data-zoom-full-detail") == "true":
                break
        visit.wait_for("() => document.querySelector('[data-chart=\"timeline-0\"]').dataset.zoom === '1'")
        visit.wait_for(
            "() => document.querySelector('[data-chart=\"timeline-0\"]').dataset.zoomFullDetail === 'true'", 20
        )
        lo, hi = (int(v) for v in slot.get_attribute("data-zoom-range").split("-"))
        # Every event of the range, but the free requests whose completion follows at once.
        points, elided = int(slot.get_attribute("data-zoom-points")), int(slot.get_attribute("data-zoom-elided"))
        trace = snap.devices[0].trace
        fused = sum(
            1
            for i in range(lo, hi)
            if int(trace.action[i]) == 1 and i + 1 < len(trace) and int(trace.action[i + 1]) == 2
        )
        assert points + elided == hi - lo and fused - 1 <= elided <= fused  # the last one may move past hi
        # The chart shows that range (it does not spring back to the whole trace once the data arrives).
        page.wait_for_timeout(400)
        shown = page.evaluate(
            "() => { for (const d of Bokeh.documents) { const f = d.get_model_by_name('timeline-figure');"
            " if (f) return [f.x_range.start, f.x_range.end]; } }"
        )
        assert lo - 1 <= shown[0] and shown[1] <= hi + 1, (shown, lo, hi)
        page.screenshot(path=str(SCREENSHOTS / "report-zoomed.png"), full_page=False)
        assert visit.errors() == [] and visit.csp_violations() == []
    finally:
        visit.close()
