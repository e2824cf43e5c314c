"""Issue 35's words on the first screen, in a real browser at 1440 and 390 px, on real captures with real reruns:
a run without an OOM is not pushed a costly change (t5_nocap_default: nothing free lowers its peak, so nothing
needs to change and the cheapest code change is only the runner-up), a free setting the real rerun bore out is
the change (unetrr_nocap_default: expandable_segments, its replayed peak within 1% of the real rerun's), and a
runner-up whose step is not known says so (eval_bert_default: its real rerun died in the same step); the DDP
run page names the change with Copy; the runs page validates a webhook on save and sends a test alert."""

from __future__ import annotations

import json
from typing import Any

import pytest

from analysis.decision import NO_OOM_NOTHING_FREE
from tests.webapp import test_browser
from tests.webapp.helpers import FIXTURES
from tests.webapp.test_browser import SCREENSHOTS, Visit, _analysed, _session_cookie
from tests.webapp.test_browser_honest import WIDTHS, _clean, _fits_the_screen
from tests.webapp.test_hardmisc import receivers  # noqa: F401 (the fixture: real HTTP receivers on loopback)
from tests.webapp.test_runs_browser import project_runs  # noqa: F401 (the fixture: a real two-rank DDP run)

pytestmark = pytest.mark.browser
browser = test_browser.browser  # the module's Chromium, a pytest fixture shared with test_browser.py


def _visit(browser: Any, url: str, cookies: list[dict[str, Any]], form: str, *, charts: bool = True) -> Visit:
    """One page at the form's viewport (``WIDTHS``)."""
    width, height = WIDTHS[form]
    return Visit(browser, url, cookies, charts=charts, width=width, height=height)


def _page(browser: Any, live_server: Any, client: Any, user: Any, upload: Any, form: str) -> Visit:
    from django.urls import reverse

    url = live_server.url + reverse("snapshots:detail", args=[upload.code])
    return _visit(browser, url, _session_cookie(client, user, live_server), form)


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_a_run_without_an_oom_is_not_pushed_a_costly_change(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    upload = _analysed(alpha, alice, "captures/t5_nocap_default")
    visit = _page(browser, live_server, client, alice, upload, form)
    try:
        page = visit.page
        screen = page.get_by_role("region", name="What to do")
        assert screen.locator(".badge").inner_text() == "no OOM"
        # Without an OOM there is no message to paste: the ledger's caption does not ask for one.
        ledger = screen.locator("figcaption").first.inner_text()
        assert "without an OOM there is no message" in ledger and "paste the OOM message" not in ledger
        assert screen.locator(".change.none").inner_text() == "No change needed: the run did not run out of memory."
        assert screen.locator(".change[data-change]").count() == 0  # no "The change, in the code"
        assert screen.locator(".buys").inner_text() == f"What it buys: {NO_OOM_NOTHING_FREE}"
        # The runner-up is the ranked table's cheapest code change (autocast), not checkpointing.
        first = page.locator("table.ranked tbody tr").first
        assert first.get_attribute("data-id") == "amp"
        assert screen.locator(".runner-up code").inner_text() == first.locator("code").inner_text()
        assert "checkpoint" not in screen.inner_text()
        _clean(visit)
        _fits_the_screen(visit, WIDTHS[form][0])
        page.screenshot(path=str(SCREENSHOTS / f"words35-no-oom-nothing-free-{form}.png"), full_page=False)
    finally:
        visit.close()


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_a_run_without_an_oom_is_offered_the_free_setting_its_rerun_bore_out(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    from webapp.snapshots.models import Report

    upload = _analysed(alpha, alice, "captures/unetrr_nocap_default")
    rerun = json.loads((FIXTURES / "captures" / "unetrr_nocap_expandable.truth.json").read_text())
    real_peak = rerun["memory_stats"]["reserved_bytes.all.peak"]
    dev = Report.objects.get(upload=upload).data["devices"][0]
    replayed = next(w for w in dev["whatif"] if w["config"] == "expandable_segments:True")["peak_reserved_bytes"]
    assert abs(replayed - real_peak) <= 0.01 * real_peak  # the replay's saving is the real rerun's
    visit = _page(browser, live_server, client, alice, upload, form)
    try:
        page = visit.page
        screen = page.get_by_role("region", name="What to do")
        change = screen.locator(".change")
        assert change.get_attribute("data-change") == "expandable_segments"
        assert change.get_attribute("data-kind") == "env"
        assert screen.locator("code#change-line-0").inner_text() == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        buys = screen.locator(".buys").inner_text()
        assert "In the replay under expandable_segments:True: peak reserved 7.63 GiB → 6.89 GiB" in buys
        assert real_peak / 2**30 == pytest.approx(6.89, abs=0.01)
        _clean(visit)
        _fits_the_screen(visit, WIDTHS[form][0])
        page.screenshot(path=str(SCREENSHOTS / f"words35-no-oom-free-setting-{form}.png"), full_page=False)
    finally:
        visit.close()


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_a_runner_up_whose_step_is_not_known_is_qualified(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    reruns = json.loads((FIXTURES / "diagnosis" / "eval_bert.reruns.json").read_text())["members"]
    assert reruns["expandable"]["died_step"] == reruns["halfbatch"]["died_step"] == 2  # died in the same step
    upload = _analysed(alpha, alice, "diagnosis/eval_bert_default")
    visit = _page(browser, live_server, client, alice, upload, form)
    try:
        page = visit.page
        runner = page.get_by_role("region", name="What to do").locator(".runner-up")
        assert runner.locator("code").inner_text() == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        note = runner.locator(".qualifier")
        assert note.inner_text().startswith(
            "(but it only gets past the failing request; the rest of the step is not known, since the step was not "
            "projected"
        )
        # The ranked table says the same of that row.
        row = page.locator('table.ranked tr[data-id="expandable_segments"]')
        assert row.get_attribute("data-state") == "not-known"
        _clean(visit)
        _fits_the_screen(visit, WIDTHS[form][0])
        runner.scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"words35-runner-up-qualified-{form}.png"), full_page=False)
    finally:
        visit.close()


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_the_ddp_run_page_names_the_change_with_copy_and_one_verdict(
    form: str,
    browser: Any,
    project_runs: dict[str, Any],  # noqa: F811 (the fixture)
    live_server: Any,
    client: Any,
    alice: Any,
) -> None:
    """The real two-rank DDP run (tests/fixtures/runs): the page names the first OOM rank's change, with Copy
    (reached by keyboard), and its rank table says the run-level verdict its headline rests on."""
    from webapp.snapshots.models import Report, Upload

    run = project_runs["ddp"]
    rank0 = Upload.objects.get(run_ref=run, rank=0)
    dev = Report.objects.get(upload=rank0).data["devices"][0]
    change = dev["decision"]["change"]
    visit = _visit(
        browser, f"{live_server.url}/run/{run.code}/", _session_cookie(client, alice, live_server), form, charts=False
    )
    try:
        page = visit.page
        decision = page.locator("#run-decision")
        assert decision.get_by_role("heading", name="Rank 0 ran out of memory first").is_visible()
        box = decision.locator(".change")
        assert box.get_attribute("data-change") == change["id"] == "expandable_segments"
        assert box.locator("code#run-change-line").inner_text() == change["line"]
        assert "The change: set this environment variable for the job (every rank)" in box.inner_text()
        copy = box.get_by_role("button", name="Copy")
        for _ in range(40):  # reached by keyboard
            page.keyboard.press("Tab")
            if copy.evaluate("(b) => b === document.activeElement"):
                break
        else:
            raise AssertionError("Copy never took the focus")
        page.keyboard.press("Enter")
        visit.wait_for("() => document.querySelector('#run-decision button[data-copy]').textContent === 'Copied'")
        # The rank table's word is the run-level verdict the page rests on, not the failing request's alone.
        word = dev["oom"].get("run_verdict") or dev["oom"]["verdict"]
        assert page.locator("tr[data-rank='0'] .badge").inner_text() == f"out of memory ({word})"
        assert page.locator("tr[data-rank='1'] .badge.peer").inner_text() == "a peer died"
        _clean(visit)
        _fits_the_screen(visit, WIDTHS[form][0])
        page.screenshot(path=str(SCREENSHOTS / f"words35-run-change-{form}.png"), full_page=False)
    finally:
        visit.close()


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_the_webhook_is_validated_on_save_and_a_test_alert_reaches_a_real_receiver(
    form: str,
    browser: Any,
    transactional_db: Any,
    alice: Any,
    alpha: Any,
    live_server: Any,
    client: Any,
    settings: Any,
    receivers: Any,  # noqa: F811 (the fixture)
) -> None:
    """The project's runs page by keyboard: a private address is refused on save, saying why and what to set;
    a loopback receiver (the test-only allowance) is saved with the SITE_URL warning; "Send a test alert"
    reaches it, and a receiver answering 500 is reported as not delivered."""
    from webapp.snapshots.runs import runs

    settings.SITE_URL = ""
    visit = _visit(
        browser, f"{live_server.url}/p/alpha/runs/", _session_cookie(client, alice, live_server), form, charts=False
    )
    try:
        page = visit.page
        field = page.get_by_label("Webhook (Slack-compatible")
        field.fill("http://10.1.2.3/hook")
        with page.expect_navigation():  # the POST's redirect back to the page, not the page already there
            field.press("Enter")  # the form's first submit button: Save
        refused = page.locator(".notice.error").inner_text()
        assert "10.1.2.3, inside the network" in refused and "WEBHOOK_ALLOW_PRIVATE_HOSTS" in refused
        assert runs.policy_for(alpha).webhook_url == ""
        assert page.get_by_role("button", name="Send a test alert").count() == 0
        settings.WEBHOOK_ALLOW_PRIVATE_HOSTS = True  # the explicit test-only allowance: the receiver is on loopback
        port, handler = receivers()
        field = page.get_by_label("Webhook (Slack-compatible")
        field.fill(f"http://127.0.0.1:{port}/hook")
        with page.expect_navigation():
            field.press("Enter")
        assert "SITE_URL" in page.locator("ul.messages").inner_text()
        assert "SITE_URL is not set" in page.locator("form.policy .note").inner_text()
        test = page.get_by_role("button", name="Send a test alert")
        test.focus()
        with page.expect_navigation():
            page.keyboard.press("Enter")
        assert page.locator(".notice").first.inner_text() == (
            "The test alert was delivered: the receiver answered HTTP 200."
        )
        assert len(handler.seen) == 1 and json.loads(handler.seen[0]["body"])["oomscope"]["test"] is True
        handler.answer = (500, {})
        with page.expect_navigation():
            page.get_by_role("button", name="Send a test alert").click()
        failed = page.locator(".notice.error").inner_text()
        assert failed.startswith("The test alert was not delivered:") and "HTTP 500" in failed
        assert "Webhook deliveries" in page.locator("main").inner_text()
        _clean(visit)
        _fits_the_screen(visit, WIDTHS[form][0])
        page.screenshot(path=str(SCREENSHOTS / f"words35-webhook-{form}.png"), full_page=True)
    finally:
        visit.close()


HISTORY_CASES = ("leak_conv2", "optim_mlp", "eval_bert", "otherproc")


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_history_says_each_runs_verdict_beside_its_change(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    """History's "OOM (verdict for)" column says the run's verdict, the one the first screen rests on (a program
    cause explains the OOM: capacity), not "fragmentation" from the failing request alone, beside the change
    column naming the program's fix: the leak, optimizer, evaluation and other-process runs of
    tests/fixtures/diagnosis."""
    from webapp.snapshots.models import Report

    uploads = {case: _analysed(alpha, alice, f"diagnosis/{case}_default") for case in HISTORY_CASES}
    visit = _visit(browser, f"{live_server.url}/p/alpha/", _session_cookie(client, alice, live_server), form)
    try:
        page = visit.page
        request_words = []
        for case, upload in uploads.items():
            dev = Report.objects.get(upload=upload).data["devices"][0]
            row = page.locator("table tbody tr", has=page.get_by_role("link", name=f"{case}_default.pickle.gz"))
            cells = row.locator("td")
            verdict = cells.nth(8).locator(".badge").inner_text()
            assert verdict == dev["oom"]["run_verdict"], case
            assert cells.nth(10).inner_text().startswith(dev["decision"]["change"]["title"]), case
            request_words.append(dev["oom"]["verdict"])
            level = cells.nth(8).locator("small.level").inner_text()
            if dev["oom"]["run_verdict_basis"] == "cause":  # a program cause: no allocator setting undoes it
                assert (verdict, level) == ("capacity", "the program's cause"), case
            else:
                assert level in ("the whole step", "the request alone"), case
        assert "fragmentation" in request_words  # the requests alone would have said fragmentation
        _clean(visit)
        _fits_the_screen(visit, WIDTHS[form][0])
        page.screenshot(path=str(SCREENSHOTS / f"words35-history-{form}.png"), full_page=False)
    finally:
        visit.close()


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_the_capture_doctor_speaks_at_intake_and_on_the_report(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    """A 0-byte file on the upload page is refused beside the file field with the call that would have written
    it; a wrapped ring buffer's report says so in one line with the call that captures it right."""
    from django.urls import reverse

    cookies = _session_cookie(client, alice, live_server)
    visit = _visit(browser, f"{live_server.url}/upload/", cookies, form, charts=False)
    try:
        page = visit.page
        page.set_input_files(
            "#id_file", files=[{"name": "oom.pickle.gz", "mimeType": "application/gzip", "buffer": b""}]
        )
        page.get_by_role("button", name="Upload and analyse").click()
        page.wait_for_load_state()
        visit.wait_for("() => document.querySelector('[data-field=file] .errorlist') !== null")
        said = page.locator("[data-field=file] .errorlist").inner_text()
        assert "The file is empty (0 bytes)" in said and "torch.cuda.memory._dump_snapshot(path)" in said, said
        assert visit.csp_violations() == [] and [e for e in visit.errors() if "status of 4" not in e] == []
        _fits_the_screen(visit, WIDTHS[form][0])
        page.screenshot(path=str(SCREENSHOTS / f"words35-doctor-empty-{form}.png"), full_page=False)
    finally:
        visit.close()
    upload = _analysed(alpha, alice, "wrapped_ring")
    url = live_server.url + reverse("snapshots:detail", args=[upload.code])
    visit = _visit(browser, url, cookies, form)
    try:
        page = visit.page
        doctor = page.get_by_role("region", name="How this file was captured")
        item = doctor.locator('[data-code="trace-truncated"]')
        assert "torch.cuda.memory._record_memory_history(max_entries=1_000_000)" in item.inner_text()
        _clean(visit)
        _fits_the_screen(visit, WIDTHS[form][0])
        doctor.scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"words35-doctor-ring-{form}.png"), full_page=False)
    finally:
        visit.close()
