"""Issue 20's dead ends, closed, in a real browser at 1440 px and 390 px: Delete behind a confirmation and
never offered to a viewer; error pages in the site's layout; a tokens page whose command works for anyone;
a progress page with the elapsed time and an estimate, and a failure page that says why once."""

from __future__ import annotations

from typing import Any

import pytest

from tests.webapp import test_browser
from tests.webapp.helpers import FIXTURES, make_upload
from tests.webapp.test_browser import SCREENSHOTS, Visit, _analysed, _session_cookie
from tests.webapp.test_browser_honest import WIDTHS, _clean, _fits_the_screen

pytestmark = pytest.mark.browser
browser = test_browser.browser  # the module's Chromium, a pytest fixture shared with test_browser.py


def _viewer(team: Any, user: Any) -> None:
    from webapp.snapshots.teams import membership

    membership.membership_add(team=team, user=user, role="viewer")


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_delete_is_confirmed_and_only_for_who_may(
    form: str, browser: Any, transactional_db: Any, alice: Any, bob: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    from django.urls import reverse

    from webapp.snapshots.models import Upload

    width, height = WIDTHS[form]
    upload = _analysed(alpha, alice, "frag_oom")
    _viewer(alpha.team, bob)
    url = live_server.url + reverse("snapshots:detail", args=[upload.code])

    # A viewer reads the report and is offered no Delete; forcing the POST gets the site's 403 page.
    visit = Visit(browser, url, _session_cookie(client, bob, live_server), width=width, height=height)
    try:
        page = visit.page
        assert page.locator("section.decision").count() == 1
        assert page.locator(".delete-snapshot").count() == 0
        _clean(visit)
        page.evaluate(
            """(action) => { const f = document.createElement('form'); f.method = 'post'; f.action = action;
            const t = document.createElement('input'); t.type = 'hidden'; t.name = 'csrfmiddlewaretoken';
            t.value = document.cookie.split('; ').find((c) => c.startsWith('csrftoken=')).split('=')[1];
            f.appendChild(t); document.body.appendChild(f); f.submit(); }""",
            reverse("snapshots:delete", args=[upload.code]),
        )
        page.wait_for_selector(".error-page")
        assert page.locator(".error-page h1").inner_text() == "Not allowed"
        assert "Only the person who uploaded a snapshot" in page.locator(".error-page").inner_text()
        assert page.locator("nav.site-nav").count() == 1  # the site's layout, not bare text
        page.screenshot(path=str(SCREENSHOTS / f"error-403-{form}.png"), full_page=False)
        assert Upload.objects.filter(pk=upload.pk).exists()
    finally:
        visit.close()

    # The uploader: one click opens the fold, which says what goes; a second deletes.
    client.logout()
    visit = Visit(browser, url, _session_cookie(client, alice, live_server), width=width, height=height)
    try:
        page = visit.page
        fold = page.locator("details.delete-snapshot")
        assert fold.count() == 1 and fold.get_attribute("open") is None
        assert not page.get_by_role("button", name="Delete it for everyone").is_visible()
        fold.locator("summary").click()
        assert "for everyone in the team. It cannot be undone." in fold.inner_text()
        fold.scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"delete-confirm-{form}.png"), full_page=False)
        page.get_by_role("button", name="Delete it for everyone").click()
        page.wait_for_url(f"**/p/{alpha.slug}/")
        assert not Upload.objects.filter(pk=upload.pk).exists()
        assert "Snapshot deleted." in page.locator(".messages").inner_text()
        _clean(visit)
    finally:
        visit.close()


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_a_revoked_share_link_and_an_unknown_page_are_pages_of_the_site(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, settings: Any
) -> None:
    from django.urls import reverse

    from webapp.snapshots.teams import shares

    settings.DEBUG = False  # Django's own 404 page only when DEBUG is off, as in production
    width, height = WIDTHS[form]
    upload = make_upload(alpha, alice, FIXTURES / "frag_oom.pickle.gz")
    token = shares.share_create(upload, alice)
    shares.share_revoke(upload)
    for name, path in (("revoked", reverse("snapshots:share_view", args=[token])), ("unknown", "/no/such/page/")):
        visit = Visit(browser, live_server.url + path, charts=False, width=width, height=height)
        try:
            assert visit.response.status == 404
            page = visit.page
            assert page.locator(".error-page h1").inner_text() == "Not found"
            assert "revoked by the team that made it" in page.locator(".error-page").inner_text()
            assert page.locator("nav.site-nav").count() == 1
            assert page.get_by_role("link", name="Log in").count() >= 1
            # Chromium logs the page's own 404 as a failed load; nothing else may fail or complain.
            assert visit.failed == [live_server.url + path + " 404"]
            assert [e for e in visit.errors() if "status of 404" not in e] == [] and visit.csp_violations() == []
            _fits_the_screen(visit, width)
            page.screenshot(path=str(SCREENSHOTS / f"error-404-{name}-{form}.png"), full_page=False)
        finally:
            visit.close()


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_the_tokens_page_command_names_a_project_and_keeps_the_token_off_the_command_line(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any
) -> None:
    from webapp.snapshots.teams import membership

    width, height = WIDTHS[form]
    membership.project_create(team=alpha.team, name="Gamma", slug="gamma")  # two projects: --project is needed
    visit = Visit(
        browser,
        live_server.url + "/tokens/",
        _session_cookie(client, alice, live_server),
        charts=False,
        width=width,
        height=height,
    )
    visit.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    try:
        page = visit.page
        page.get_by_label("Name").fill("cluster")
        page.get_by_role("button", name="Make the token").click()
        page.wait_for_load_state()
        token = page.locator("#new-token").input_value()
        command = page.locator("#token-command").inner_text()
        assert token not in command
        assert f"OOMSCOPE_URL={live_server.url}\n" in command
        assert "--project alpha " in command and command.rstrip().endswith("--wait")
        assert "gamma" in page.locator(".new-token").inner_text()  # the other project is named
        page.get_by_role("button", name="Copy the commands").click()
        visit.wait_for("() => document.querySelector('[data-copy=\"token-command\"]').textContent === 'Copied'")
        assert page.evaluate("navigator.clipboard.readText()") == command
        _clean(visit)
        _fits_the_screen(visit, width)
        page.screenshot(path=str(SCREENSHOTS / f"tokens-command-{form}.png"), full_page=False)
    finally:
        visit.close()


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_progress_page_shows_elapsed_and_estimate_and_a_failure_once(
    form: str, browser: Any, transactional_db: Any, alice: Any, alpha: Any, live_server: Any, client: Any, tmp_path: Any
) -> None:
    from django.urls import reverse

    from webapp.snapshots.worker.tasks import analyse_upload

    width, height = WIDTHS[form]
    cookies = _session_cookie(client, alice, live_server)
    queued = make_upload(alpha, alice, FIXTURES / "gpt_varlen_oom.pickle.gz", run="waiting")
    visit = Visit(
        browser,
        live_server.url + reverse("snapshots:detail", args=[queued.code]),
        cookies,
        charts=False,
        width=width,
        height=height,
    )
    try:
        page = visit.page
        elapsed = page.locator("[data-field=elapsed]")
        first = elapsed.inner_text()
        page.wait_for_timeout(2200)
        assert elapsed.inner_text() != first and elapsed.inner_text().endswith(" s")  # it ticks
        # 257,016 bytes gzipped: 2 s + 1.5 s per MB, rounded up.
        assert page.locator("[data-field=estimate]").inner_text() == "3 s"
        assert "once a worker takes it" in page.locator(".elapsed").inner_text()
        assert page.locator("[data-field=stage]").inner_text() == ""
        _clean(visit)
        _fits_the_screen(visit, width)
        page.screenshot(path=str(SCREENSHOTS / f"status-queued-{form}.png"), full_page=False)
        # The worker finishes it: the page turns into the report by itself.
        analyse_upload(queued.id)
        visit.wait_for_whole_report()
    finally:
        visit.close()

    bad = tmp_path / "notes.pickle"
    bad.write_bytes(b"\x80\x04K\x01.")  # a valid pickle of the integer 1: not a snapshot
    failed = make_upload(alpha, alice, bad)
    analyse_upload(failed.id)
    visit = Visit(
        browser,
        live_server.url + reverse("snapshots:detail", args=[failed.code]),
        cookies,
        charts=False,
        width=width,
        height=height,
    )
    try:
        page = visit.page
        box = page.locator(".status-box")
        assert box.locator("[data-field=status]").inner_text() == "failed"
        assert box.locator("[data-field=stage]").inner_text() == ""  # not "failed failed"
        assert box.inner_text().count("failed") == 1 + box.locator("[data-field=error]").inner_text().count("failed")
        assert page.get_by_role("link", name="Upload another file").count() == 1
        _clean(visit)
        page.screenshot(path=str(SCREENSHOTS / f"status-failed-{form}.png"), full_page=False)
    finally:
        visit.close()
