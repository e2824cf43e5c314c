"""A real browser on an upload's first answer (issue 34): the report shows while its charts are still
coming, and the page completes itself once they are stored; waited on the page's state, never on time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES, make_upload
from tests.webapp.test_browser import Visit, _session_cookie, browser  # noqa: F401 - the fixture

pytestmark = pytest.mark.browser

GPT_OOM = FIXTURES / "gpt_varlen_oom.pickle.gz"


def test_the_first_answer_shows_before_the_charts_and_the_page_then_completes(
    browser: Any,  # noqa: F811 - the fixture
    transactional_db: Any,
    alice: Any,
    alpha: Any,
    live_server: Any,
    client: Any,
    tmp_path: Path,
) -> None:
    from django.core.files import File
    from django.core.files.storage import default_storage
    from django.urls import reverse
    from django.utils import timezone

    from webapp.snapshots.models import Upload
    from webapp.snapshots.pages import firstanswer
    from webapp.snapshots.pages.digging import store_name
    from webapp.snapshots.worker import jobs, runner

    limits = runner.limits_for(GPT_OOM, per_byte=6, minimum=1 << 30, maximum=4 << 30, cpu=120, wall=120)
    analysis = runner.run_child(GPT_OOM, limits, charts=True, explore_dir=tmp_path)
    assert analysis.charts and "timeline-0" in analysis.charts
    upload = make_upload(alpha, alice, GPT_OOM, status=Upload.Status.RUNNING, started_at=timezone.now(), attempts=1)
    for store in tmp_path.glob("*.npz"):  # the digging data, as the worker keeps it (tasks._keep_stores)
        with store.open("rb") as fh:
            default_storage.save(store_name(upload.sha256, int(store.stem)), File(fh))
    assert firstanswer.store(upload.id, analysis.report)  # what the worker does once the child wrote the report

    url = live_server.url + reverse("snapshots:detail", args=[upload.code])
    visit = Visit(browser, url, _session_cookie(client, alice, live_server), charts=False)
    try:
        page = visit.page
        headline = page.locator("section.decision .headline").first
        assert headline.is_visible()
        first_headline = headline.inner_text()
        assert first_headline == analysis.report["devices"][0]["decision"]["headline"]
        coming = page.locator("[data-first-answer]")
        assert coming.count() == 1 and "Still coming" in coming.inner_text()
        assert "charts and digging data" in coming.inner_text()
        assert page.locator("[data-chart]").count() == 0  # no chart before they are stored
        page.screenshot(path=str(_shot("first-answer.png")))

        jobs.upload_finish(upload.id, report=analysis.report, charts=analysis.charts, stored_bytes=0)
        # status.js sees "done" and reloads; charts.js then draws the charts.
        _wait_across_reloads(page, "() => document.querySelector('[data-first-answer]') === null")
        _wait_across_reloads(page, "() => document.body.dataset.chartsDrawn !== undefined")
        assert page.locator('[data-chart="timeline-0"][data-rendered="1"]').count() == 1
        assert page.locator("section.decision .headline").first.inner_text() == first_headline
        page.screenshot(path=str(_shot("first-answer-complete.png")))
        assert visit.errors() == [] and visit.csp_violations() == [], visit.failed
    finally:
        visit.close()


def _wait_across_reloads(page: Any, predicate: str, timeout_s: float = 60) -> None:
    """``Visit.wait_for`` that survives the page reloading itself between two polls."""
    import time

    from playwright.sync_api import Error

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if page.evaluate(predicate):
                return
        except Error as exc:  # the reload destroyed the page's context mid-call: ask the new page
            if "context was destroyed" not in str(exc) and "navigat" not in str(exc):
                raise
        assert time.monotonic() < deadline, f"timed out waiting for {predicate}"
        page.wait_for_timeout(50)


def _shot(name: str) -> Any:
    from tests.webapp.test_browser import SCREENSHOTS

    return SCREENSHOTS / name
