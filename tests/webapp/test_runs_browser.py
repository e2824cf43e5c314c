"""The run pages in a real browser (Debian's chromium through playwright, as ``test_browser.py``):
the two-rank run's decision screen, pinning it as the baseline, the project's trend with its
branch filter; no console error and no CSP violation on any of them.

Data: the real two-rank DDP job of ``tests/fixtures/runs`` and two real one-process GPT captures,
analysed by the worker's own functions in this process.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES, make_upload
from tests.webapp.test_browser import SCREENSHOTS, Visit, browser  # noqa: F401 (the fixture)

pytestmark = pytest.mark.browser

RUNS = FIXTURES / "runs"
CAPTURES = FIXTURES / "captures"


@pytest.fixture
def project_runs(transactional_db: Any, alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from django.db import transaction

    from webapp.snapshots.models import Run
    from webapp.snapshots.runs import runs
    from webapp.snapshots.worker import runtasks
    from webapp.snapshots.worker.tasks import analyse_upload

    # The chord is published at commit; here its tasks run in this process instead.
    monkeypatch.setattr(runs, "publish_run", lambda run_id: True)
    made = {}
    for name, path, branch, tags in (
        ("base", CAPTURES / "gpt_autocast_c75_expandable.pickle.gz", "main", ["nightly"]),
        ("worse", CAPTURES / "gpt_autocast_c75_default.pickle.gz", "feature", ["h200"]),
    ):
        upload = make_upload(alpha, alice, path, run=name, tags=tags)
        with transaction.atomic():  # as upload_create calls it (PostgreSQL locks the run's row)
            runs.run_attach(upload, {"branch": branch})
        analyse_upload(upload.id)
        made[name] = Run.objects.get(name=name)
    ranks = []
    for rank in (0, 1):
        upload = make_upload(alpha, alice, RUNS / f"ddp_gloo_rank{rank}.pickle.gz", run="ddp-16")
        error = "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer"
        with transaction.atomic():
            runs.run_attach(
                upload, {"rank": rank, "world_size": 2, "branch": "main", **({"error": error} if rank else {})}
            )
        ranks.append(upload.id)
    for upload_id in ranks:
        runtasks.analyse_rank(upload_id)
    made["ddp"] = Run.objects.get(name="ddp-16")
    assert runs.run_summarise(made["ddp"].pk) == "done"
    return made


def login_cookie(client: Any, user: Any, live_server: Any) -> list[dict[str, Any]]:
    client.force_login(user)
    return [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]


def clean(visit: Visit) -> None:
    assert visit.response.status == 200
    assert visit.page.evaluate("window.__cspViolations") == []
    assert [line for line in visit.console if line.startswith(("error", "pageerror"))] == []


def test_the_run_page_and_pinning_a_baseline(
    browser: Any,  # noqa: F811
    project_runs: dict[str, Any],
    live_server: Any,
    client: Any,
    alice: Any,
) -> None:
    cookies = login_cookie(client, alice, live_server)
    visit = Visit(browser, f"{live_server.url}/run/{project_runs['ddp'].code}/", cookies, charts=False)
    try:
        clean(visit)
        page = visit.page
        assert page.get_by_role("heading", name="Rank 0 ran out of memory first").is_visible()
        assert page.locator("tr[data-rank='1'] .badge.peer").inner_text() == "a peer died"
        assert "Connection closed by peer" in page.locator("tr[data-rank='1']").inner_text()
        assert "1.4075" in page.locator("#run-decision").inner_text()
        page.screenshot(path=str(SCREENSHOTS / "run.png"), full_page=True)
        page.get_by_role("button", name="Pin as the baseline").click()
        page.wait_for_load_state()
        assert page.locator(".badge.baseline").inner_text() == "baseline"
        assert page.get_by_role("button", name="Unpin as baseline").count() == 1
    finally:
        visit.close()


def test_the_trend_marks_ooms_and_filters_by_branch(
    browser: Any,  # noqa: F811
    project_runs: dict[str, Any],
    live_server: Any,
    client: Any,
    alice: Any,
) -> None:
    cookies = login_cookie(client, alice, live_server)
    visit = Visit(browser, f"{live_server.url}/p/alpha/runs/", cookies, charts=False)
    try:
        clean(visit)
        page = visit.page
        assert page.locator("svg#trend").is_visible()
        assert page.locator("circle.trend-point").count() == 3
        assert page.locator("circle.trend-point.oom").count() == 2  # the feature run and the DDP run
        assert page.locator("tr.regressed").count() >= 1
        page.screenshot(path=str(SCREENSHOTS / "runs.png"), full_page=True)
        page.select_option("#runs-branch", "feature")
        page.get_by_role("button", name="Filter").click()
        page.wait_for_load_state()
        assert page.url.endswith("?branch=feature&tag=")
        assert page.locator("circle.trend-point").count() == 1
    finally:
        visit.close()
