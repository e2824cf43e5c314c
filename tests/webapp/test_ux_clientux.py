"""Issue 35's dead ends and words, in a real browser at 1440 and 390 px and by keyboard (Debian's chromium
through playwright, as ``test_browser.py``): the logged-out front page, home's verdict column, the upload form
(the project last used, errors beside their field, one tab stop for the file), the status page's wait, the runs
trend (axes from zero, regressions drawn as such, the badge's colour, 390 px), the pinned baseline's page, the
compare page's conclusion, and the report's words ("tried to allocate", "The GPU it needs", no "--limit", no
"0.00 GiB"). Data: real captures analysed by the worker's own functions in this process.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from analysis.compare import compare as compare_reports
from tests.webapp.helpers import FIXTURES, make_upload
from tests.webapp.test_browser import SCREENSHOTS, Visit, browser  # noqa: F401 (the fixture)
from tests.webapp.test_runs_browser import clean, login_cookie, project_runs  # noqa: F401 (the fixture)

pytestmark = pytest.mark.browser

WIDTHS = (1440, 390)


def analysed(project: Any, user: Any, case: str, **fields: Any) -> Any:
    from webapp.snapshots.models import Upload
    from webapp.snapshots.worker.tasks import analyse_upload

    upload = make_upload(project, user, FIXTURES / f"{case}.pickle.gz", **fields)
    analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == Upload.Status.DONE, (upload.error_code, upload.error_message)
    return upload


WIDER = """(width) => Array.from(document.querySelectorAll('body *'))
    .filter((el) => el.getBoundingClientRect().right > width + 0.5
      && el.parentElement.getBoundingClientRect().right <= width + 0.5)
    .map((el) => el.tagName + '.' + el.className + '#' + el.id + ' ' + Math.round(el.getBoundingClientRect().right))
    .slice(0, 8)"""


def fits_width(visit: Visit, width: int) -> None:
    """Nothing makes the page wider than the window (wide tables scroll inside themselves)."""
    wider = visit.page.evaluate(WIDER, width)
    assert visit.page.evaluate("document.documentElement.scrollWidth") <= width, wider


def tab_until(visit: Visit, selector: str, limit: int = 40) -> list[str]:
    """Press Tab until ``selector`` has the focus; the focused elements on the way (id or tag)."""
    seen = []
    for _ in range(limit):
        visit.page.keyboard.press("Tab")
        seen.append(visit.page.evaluate("document.activeElement.id || document.activeElement.tagName"))
        if visit.page.evaluate(f"document.activeElement.matches({json.dumps(selector)})"):
            return seen
    raise AssertionError(f"{selector} never took the focus: {seen}")


@pytest.mark.parametrize("width", WIDTHS)
def test_logged_out_front_page_says_what_oomscope_is(
    browser: Any,  # noqa: F811
    live_server: Any,
    transactional_db: Any,
    width: int,
) -> None:
    visit = Visit(browser, live_server.url + "/", charts=False, width=width)
    try:
        clean(visit)
        page = visit.page
        assert page.url == live_server.url + "/"  # no redirect to a bare log-in form
        assert page.get_by_role("heading", level=1).inner_text() == "Why did your training job run out of GPU memory?"
        assert "tells you what filled the device, why the job died" in page.locator(".welcome .lead").inner_text()
        assert page.get_by_role("heading", name="Log in").is_visible()
        tab_until(visit, "input[name=username]")  # the form is reached by keyboard
        fits_width(visit, width)
        page.screenshot(path=str(SCREENSHOTS / f"welcome-{width}.png"), full_page=True)
    finally:
        visit.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_home_lists_recent_uploads_with_their_verdict(
    browser: Any,  # noqa: F811
    transactional_db: Any,
    live_server: Any,
    client: Any,
    alice: Any,
    alpha: Any,
    width: int,
) -> None:
    done = analysed(alpha, alice, "frag_oom")
    visit = Visit(browser, live_server.url + "/", login_cookie(client, alice, live_server), charts=False, width=width)
    try:
        clean(visit)
        row = visit.page.locator("table tbody tr").first
        headline = done.summary["headline"]
        cell = row.locator("td.verdict")
        assert cell.locator(".badge").inner_text() == "OOM"
        assert cell.locator("span[title]").get_attribute("title") == headline
        assert " ".join(headline.split()[:14]) in cell.inner_text()
        fits_width(visit, width)
    finally:
        visit.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_upload_form_last_project_errors_beside_the_field_one_tab_stop(
    browser: Any,  # noqa: F811
    transactional_db: Any,
    live_server: Any,
    client: Any,
    alice: Any,
    alpha: Any,
    width: int,
    tmp_path: Any,
) -> None:
    from webapp.snapshots.teams import membership

    zulu = membership.project_create(team=alpha.team, name="Zulu", slug="zulu")
    make_upload(zulu, alice, FIXTURES / "frag_oom.pickle.gz")  # the project last used, not the first by name
    visit = Visit(
        browser, live_server.url + "/upload/", login_cookie(client, alice, live_server), charts=False, width=width
    )
    try:
        clean(visit)
        page = visit.page
        assert page.locator("#id_project").input_value() == "zulu"
        # One tab stop for the file: from the skip link's neighbours on, the file input comes right before the project.
        page.locator("#triage-link").focus()
        order = tab_until(visit, "#id_project")
        assert order[-2:] == ["id_file", "id_project"], order
        page.set_input_files("#id_file", str(FIXTURES / "frag_oom.pickle.gz"))
        page.fill("#id_cap", "7XB")  # no size: the form refuses it, beside the cap's field far below the file
        page.get_by_role("button", name="Upload and analyse").click()
        visit.wait_for("() => document.querySelector('[data-field=cap] .errorlist') !== null")
        error = page.locator("[data-field=cap] .errorlist")
        assert "'7XB' is no size" in error.inner_text()
        assert page.locator(".form-errors").inner_text() == ""  # nothing at the top, far from the field
        assert page.evaluate("document.activeElement.id") == "id_cap"
        assert page.locator("#id_cap").get_attribute("aria-invalid") == "true"
        fits_width(visit, width)
        page.screenshot(path=str(SCREENSHOTS / f"upload-error-{width}.png"), full_page=False)
    finally:
        visit.close()


def test_status_page_says_what_a_rank_waits_for(
    browser: Any,  # noqa: F811
    transactional_db: Any,
    live_server: Any,
    client: Any,
    alice: Any,
    alpha: Any,
) -> None:
    from django.db import transaction

    from webapp.snapshots.runs import runs

    rank0 = make_upload(alpha, alice, FIXTURES / "runs" / "ddp_gloo_rank0.pickle.gz", run="ddp-waits")
    with transaction.atomic():
        runs.run_attach(rank0, {"rank": 0, "world_size": 2})
    alone = make_upload(alpha, alice, FIXTURES / "frag_oom.pickle.gz")
    cookies = login_cookie(client, alice, live_server)
    for width in WIDTHS:
        visit = Visit(browser, f"{live_server.url}/s/{rank0.code}/", cookies, charts=False, width=width)
        try:
            clean(visit)
            waiting = visit.page.locator("[data-field=waiting_for]")
            visit.wait_for("() => document.querySelector('[data-field=waiting_for]').textContent.length > 0")
            assert waiting.inner_text().startswith(
                "Waiting for the other ranks of run ddp-waits: 1 of 2 are in; missing rank 1. The run is analysed as "
                "one once all have come, or with those present in "
            )
            assert not visit.page.locator("[data-field=estimate-sentence]").is_visible()  # no estimate it cannot keep
            fits_width(visit, width)
            visit.page.screenshot(path=str(SCREENSHOTS / f"status-rank-{width}.png"), full_page=False)
        finally:
            visit.close()
    visit = Visit(browser, f"{live_server.url}/s/{alone.code}/", cookies, charts=False)
    try:
        assert visit.page.locator("[data-field=waiting_for]").inner_text().startswith("Waiting for a worker: 1 upload")
        assert visit.page.locator("[data-field=estimate_basis]").inner_text() == "fixed rates"
    finally:
        visit.close()


def test_runs_trend_axes_regression_badge_and_390px(
    browser: Any,  # noqa: F811
    project_runs: dict[str, Any],  # noqa: F811
    live_server: Any,
    client: Any,
    alice: Any,
) -> None:
    worse = project_runs["worse"]
    assert worse.regression["regressed"] and (worse.summary["run"]["oom_ranks"])  # regressed and out of memory
    cookies = login_cookie(client, alice, live_server)
    for width in WIDTHS:
        visit = Visit(browser, f"{live_server.url}/p/alpha/runs/", cookies, charts=False, width=width)
        try:
            clean(visit)
            page = visit.page
            ticks = page.locator("svg#trend .trend-axis text.tick").all_text_contents()
            assert ticks[0] == "0" and ticks[4].endswith("GiB")  # from zero to a round size
            points = page.locator("circle.trend-point.regressed.oom")  # the feature run and the DDP run
            assert points.count() == 2
            for point in points.all():
                assert point.get_attribute("fill") == "#b35900"  # drawn as a regression
                assert point.get_attribute("stroke") == "#c0392b"  # with the OOM's ring
            badge = page.locator("td .badge.regression").first
            assert badge.evaluate("b => getComputedStyle(b).backgroundColor") == "rgb(179, 89, 0)"
            fits_width(visit, width)
            page.screenshot(path=str(SCREENSHOTS / f"runs-trend-{width}.png"), full_page=True)
        finally:
            visit.close()


def test_the_pinned_baselines_own_page(
    browser: Any,  # noqa: F811
    project_runs: dict[str, Any],  # noqa: F811
    live_server: Any,
    client: Any,
    alice: Any,
) -> None:
    from webapp.snapshots.runs import runs

    base = project_runs["base"]
    runs.baseline_pin(base.project, base)
    visit = Visit(
        browser, f"{live_server.url}/run/{base.code}/", login_cookie(client, alice, live_server), charts=False
    )
    try:
        clean(visit)
        text = visit.page.locator("#is-baseline").inner_text()
        assert text.startswith("This run is the project's pinned baseline: every other run of alpha is compared")
        assert "No baseline to compare with" not in visit.page.content()
    finally:
        visit.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_says_its_conclusion_in_one_line(
    browser: Any,  # noqa: F811
    transactional_db: Any,
    live_server: Any,
    client: Any,
    alice: Any,
    alpha: Any,
    width: int,
) -> None:
    from webapp.snapshots.pages import payloads

    a = analysed(alpha, alice, "gpt_varlen_oom")
    b = analysed(alpha, alice, "gpt_varlen_expandable")
    expected = compare_reports(payloads.report_for(a).data, payloads.report_for(b).data)["conclusion"]
    truth = {
        c: json.loads((FIXTURES / f"{c}.truth.json").read_text()) for c in ("gpt_varlen_oom", "gpt_varlen_expandable")
    }
    peak_a = truth["gpt_varlen_oom"]["memory_stats"]["reserved_bytes.all.peak"]
    peak_b = truth["gpt_varlen_expandable"]["memory_stats"]["reserved_bytes.all.peak"]
    from analysis.readout import size

    # The process's own peaks (the truth files): B, with expandable_segments, peaked lower; both died.
    assert peak_b < peak_a
    assert expected.startswith(f"B peaks at {size(peak_b)} reserved, {size(peak_a - peak_b)} (")
    assert "less than A; both ran out of memory; the settings differ: " in expected
    visit = Visit(
        browser, f"{live_server.url}/compare/{a.code}/{b.code}/", login_cookie(client, alice, live_server), width=width
    )
    try:
        assert visit.page.locator("#compare-conclusion").inner_text() == expected
        assert visit.errors() == [] and visit.csp_violations() == []
    finally:
        visit.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_report_words_match_the_figures(
    browser: Any,  # noqa: F811
    transactional_db: Any,
    live_server: Any,
    client: Any,
    alice: Any,
    alpha: Any,
    width: int,
) -> None:
    from webapp.snapshots.pages import payloads

    frag = analysed(alpha, alice, "frag_oom")  # no OOM message given; a trace without steps
    cookies = login_cookie(client, alice, live_server)
    visit = Visit(browser, f"{live_server.url}/s/{frag.code}/", cookies, width=width)
    try:
        visit.open_folds()
        page = visit.page
        body = page.locator("main").inner_text()
        assert "tried to allocate (the segment size torch's message prints)" in body
        assert "tried to allocate (torch's message)" not in body
        assert "--limit" not in body and "0.00 GiB" not in body
        gpu = page.locator(".gpu-fit").inner_text()
        assert "Not known: the rest of the failing step was not projected (the trace has no steps" in gpu
        assert "GB" not in gpu  # no card named for a step whose end is not known
        assert visit.errors() == [] and visit.csp_violations() == []
    finally:
        visit.close()
    grow = analysed(alpha, alice, "grow_gpt2_default")  # a projected failing step
    fits = payloads.report_for(grow).data["devices"][0]["gpu_fit"]["fits_default"]
    visit = Visit(browser, f"{live_server.url}/s/{grow.code}/", cookies, width=width)
    try:
        visit.open_folds()
        gpu = visit.page.locator(".gpu-fit p").inner_text()
        assert f"the smallest cards that fit are {fits[0]} and {fits[1]} (and every larger one)" in gpu
        assert fits[-1] not in gpu
    finally:
        visit.close()
