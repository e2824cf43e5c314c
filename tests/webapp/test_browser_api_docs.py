"""Issue 35: the API's docs page (``/api/v1/docs``) in a real browser, reached from the tokens page by
keyboard: Swagger UI from our own static files renders the served OpenAPI document under the site's
strict CSP, with no request outside the site, no console error and no CSP violation; "Try it out" on
``GET /api/v1/projects`` answers from the live API with the signed-in session. Launched as
tests/webapp/test_browser.py launches Debian's chromium (its ``browser`` fixture and ``Visit`` are
reused), at 1440 and 390 px.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.webapp.test_browser import (  # noqa: F401 (pytest finds fixtures by name)
    SCREENSHOTS,
    Visit,
    _docs_screenshots_untouched,
    browser,
)

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("width", [1440, 390])
def test_the_docs_page_renders_the_document_from_our_own_files(
    browser: Any,  # noqa: F811 (the imported fixture)
    live_server: Any,
    transactional_db: Any,  # the live server's thread must see the user and the session
    client: Any,
    alice: Any,
    alpha: Any,
    width: int,
) -> None:
    client.force_login(alice)
    cookies = [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    visit = Visit(browser, live_server.url + "/tokens/", cookies, charts=False, width=width)
    try:
        page = visit.page
        # From the tokens page, by keyboard: the link to the API's documentation.
        page.get_by_role("link", name="the API's documentation").focus()
        with page.expect_navigation() as navigation:
            page.keyboard.press("Enter")
        docs = navigation.value
        assert docs is not None and docs.status == 200 and docs.url == live_server.url + "/api/v1/docs"
        assert "'nonce-" in docs.headers["content-security-policy"]
        # Swagger UI drew the document: its title, and one block per operation (24: contract.md's routes).
        visit.wait_for("() => document.querySelectorAll('.opblock').length > 0", timeout_s=30)
        assert page.locator(".info .title").inner_text().startswith("oomscope")
        assert page.locator(".opblock").count() == 24
        assert page.locator(".opblock-summary-path[data-path='/api/v1/projects/{slug}/regression']").count() == 1

        # Try it out: GET /api/v1/projects with the session, answered by the live API.
        block = page.locator("#operations-projects-webapp_snapshots_api_projects_projects")
        block.locator(".opblock-summary").click()
        block.get_by_role("button", name="Try it out").click()
        block.get_by_role("button", name="Execute").click()
        answer = block.locator(".live-responses-table tbody .response-col_status").first
        answer.wait_for(timeout=15_000)
        assert answer.inner_text().strip() == "200"
        assert '"slug": "alpha"' in block.locator(".live-responses-table .microlight").first.inner_text()

        host = urlsplit(live_server.url).netloc
        outside = [u for u in visit.requests if urlsplit(u).scheme in ("http", "https") and urlsplit(u).netloc != host]
        assert outside == [], outside
        static = [u for u in visit.requests if "/static/" in u]
        assert any(u.endswith("/static/ninja/swagger-ui-bundle.js") for u in static), static
        assert visit.errors() == [] and visit.csp_violations() == [] and visit.failed == []
        # Nothing wider than the window (at 390 px the paths wrap).
        wide = page.evaluate(
            "[...document.querySelectorAll('#swagger-ui *')].filter(e => e.getBoundingClientRect().right > "
            "document.documentElement.clientWidth + 1).slice(0, 8).map(e => e.tagName + '.' + e.className + ' ' + "
            "Math.round(e.getBoundingClientRect().right))"
        )
        assert page.evaluate("document.documentElement.scrollWidth") <= width, wide
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(SCREENSHOTS / f"api-docs-{width}.png"), full_page=False)
    finally:
        visit.close()


def test_the_docs_page_is_for_signed_in_callers(client: Any, db: Any) -> None:
    """Logged out, the page answers as every /api/v1/ path: 401 with the API's error body."""
    response = client.get("/api/v1/docs")
    assert response.status_code == 401 and response.json()["error"]["code"] == "auth-required"
