"""A real browser on the triage page: from the upload page's link, paste a real OOM message, read the answer.

Launched as tests/webapp/test_browser.py launches Debian's chromium (its ``browser`` fixture and
``Visit`` are reused). The message and summary are a real H200 run's
(tests/fixtures/triage/triage_other_process.truth.json: another process held 100.51 GiB of the
device), pasted inside the traceback a user would copy. The screenshot goes to test-results/ unless
``OOMSCOPE_SCREENSHOTS=docs/screenshots`` asks for the committed one.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.webapp.helpers import FIXTURES

# The fixtures and helpers of the main browser test: one way to launch chromium. The autouse fixture
# keeps docs/screenshots/ untouched here too unless asked.
from tests.webapp.test_browser import (  # noqa: F401 (pytest finds fixtures by name)
    SCREENSHOTS,
    Visit,
    _docs_screenshots_untouched,
    browser,
)

pytestmark = pytest.mark.browser


def test_paste_a_real_message_and_read_the_answer(
    browser: Any,  # noqa: F811 (the imported fixture)
    live_server: Any,
    transactional_db: Any,  # the live server's thread must see the user and the session
    client: Any,
    alice: Any,
    alpha: Any,
) -> None:
    from django.urls import reverse

    run = json.loads((FIXTURES / "triage" / "triage_other_process.truth.json").read_text())
    pasted = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 88, in <module>\n'
        "    loss = model(batch).sum()\n"
        f"torch.OutOfMemoryError: {run['oom_message']}"
    )
    client.force_login(alice)
    cookies = [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": live_server.url}]
    visit = Visit(browser, live_server.url + reverse("snapshots:upload"), cookies, charts=False)
    try:
        page = visit.page
        page.get_by_role("link", name="Triage the OOM message alone").click()
        page.wait_for_url("**/triage/")
        page.get_by_label("OOM message").fill(pasted)
        page.get_by_label("torch.cuda.memory_summary() (optional)").fill(run["memory_summary"])
        page.get_by_role("button", name="Triage").click()
        result = page.locator("#triage-result")
        result.wait_for(timeout=15_000)
        assert result.get_attribute("data-cause") == "outside-process"
        assert result.get_attribute("data-confidence") == "high"
        headline = result.locator(".headline").inner_text()
        assert headline.startswith("The device was full")
        assert "another process (100.51 GiB)" in headline and "2.00 GiB was 1.23 GiB short" in headline
        assert "no PYTORCH_CUDA_ALLOC_CONF setting gives it back" in result.locator(".change").inner_text()
        findings = page.locator("ul.findings li")
        other = page.locator('ul.findings li[data-key="other-processes"]').inner_text()
        assert f"{run['holder']['pid']} (100.51 GiB)" in other
        assert findings.count() >= 6
        assert (
            "torch.cuda.memory._record_memory_history(max_entries=1_000_000)"
            in page.locator("pre.record-snapshot").inner_text()
        )
        assert visit.errors() == [] and visit.csp_violations() == []
        host = urlsplit(live_server.url).netloc
        assert all(urlsplit(u).netloc == host for u in visit.requests if urlsplit(u).scheme in ("http", "https"))
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(SCREENSHOTS / "triage.png"), full_page=True)
    finally:
        visit.close()
