"""Follow-ups and the noise gate in a real browser (issue 33, item 4), at 1440 and 390 px: the incident's
page names its follow-up, the follow-up's page its outcome and the horizon scored, the project's history
shows each incident with its follow-ups and outcomes, the team page the per-change record, the run page
the figures beyond the noise. No console error, no CSP violation, nothing wider than the screen.

Data: real H200 captures (gpt_varlen_oom and its expandable_segments rerun, which died 4 steps later;
bert_mlm_c85_default and its expandable_segments rerun, which lived) analysed by the worker's functions in
this process; for the run page, real repeat runs of one GPT (``tests/fixtures/followups/fnoise_*``, H100).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES, make_upload
from tests.webapp.test_browser import SCREENSHOTS, Visit, browser  # noqa: F401 (the fixture)
from tests.webapp.test_browser_honest import WIDTHS
from tests.webapp.test_runs_browser import clean, login_cookie

pytestmark = pytest.mark.browser

PAIRS = (
    (FIXTURES / "gpt_varlen_oom.pickle.gz", FIXTURES / "gpt_varlen_expandable.pickle.gz"),
    (
        FIXTURES / "captures" / "bert_mlm_c85_default.pickle.gz",
        FIXTURES / "captures" / "bert_mlm_c85_expandable.pickle.gz",
    ),
)


def _message(path: Path) -> str:
    truth = json.loads(path.with_name(path.name.replace(".pickle.gz", ".truth.json")).read_text())
    return str(truth.get("oom_message") or "")


@pytest.fixture
def pairs(transactional_db: Any, alice: Any, alpha: Any) -> list[tuple[Any, Any]]:
    from webapp.snapshots.models import Upload
    from webapp.snapshots.runs import followups
    from webapp.snapshots.worker.tasks import analyse_upload

    made = []
    for incident_path, rerun_path in PAIRS:
        incident = make_upload(alpha, alice, incident_path, oom_message=_message(incident_path))
        analyse_upload(incident.id)
        rerun = make_upload(alpha, alice, rerun_path, oom_message=_message(rerun_path))
        followups.link(rerun, incident.code, [], several_ranks=False)
        analyse_upload(rerun.id)  # the comparison runs when its analysis ends (both reports stored)
        made.append((Upload.objects.get(pk=incident.pk), Upload.objects.get(pk=rerun.pk)))
    return made


def _fits(visit: Visit, width: int) -> None:
    assert visit.page.evaluate("document.documentElement.scrollWidth") <= width, visit.page.evaluate(WIDEST)


# Every element whose right edge passes the screen's, with its tag, class and width (the page's own check,
# WIDER_THAN_SCREEN, leaves out what sits in a box that scrolls; this one names those too).
WIDEST = """() => [...document.querySelectorAll('body *')]
  .filter((el) => el.getBoundingClientRect().right > window.innerWidth + 1)
  .slice(0, 8)
  .map((el) => `${el.tagName}.${el.className} ${Math.round(el.getBoundingClientRect().right)}`)"""


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_incidents_follow_ups_history_and_the_team_record(
    form: str,
    browser: Any,  # noqa: F811
    pairs: list[tuple[Any, Any]],
    live_server: Any,
    client: Any,
    alice: Any,
) -> None:
    width, height = WIDTHS[form]
    cookies = login_cookie(client, alice, live_server)
    (grew, grew_rerun), (saved, saved_rerun) = pairs
    assert (grew_rerun.followup["outcome"], saved_rerun.followup["outcome"]) == ("postponed", "borne_out")

    def visit(path: str, shot: str) -> Visit:
        v = Visit(browser, f"{live_server.url}{path}", cookies, charts=False, width=width, height=height)
        clean(v)
        v.page.screenshot(path=str(SCREENSHOTS / f"followup-{shot}-{form}.png"), full_page=True)
        _fits(v, width)
        return v

    v = visit(f"/s/{grew_rerun.code}/", "rerun")
    try:
        note = v.page.locator("section.followup-note").inner_text()
        assert f"Follow-up of {grew.code}" in note and "postponed (the same OOM later)" in note
        assert "Horizon: predicted about step 26, died in step 27" in note
        assert v.page.locator("section.followup-note [data-outcome='postponed']").is_visible()
    finally:
        v.close()
    v = visit(f"/s/{grew.code}/", "horizons")
    try:
        # The incident's page says how long each advised change lasts, before and beside its follow-up.
        v.page.locator("details.horizons summary").click()
        line = v.page.locator("details.horizons li[data-change='expandable_segments']")
        assert line.get_attribute("data-horizon") == "postpones" and "about step 26" in line.inner_text()
        assert (
            v.page.locator("details.horizons li[data-change='growing_workload']").get_attribute("data-horizon")
            == "steady"
        )
        _fits(v, width)
    finally:
        v.close()
    v = visit(f"/s/{saved.code}/", "incident")
    try:
        note = v.page.locator("section.followup-note").inner_text()
        assert f"Followed by {saved_rerun.code}" in note and "borne out" in note
    finally:
        v.close()
    v = visit("/p/alpha/", "history")
    try:
        for incident, rerun, words in ((grew, grew_rerun, "postponed"), (saved, saved_rerun, "borne out")):
            row = v.page.locator(f"small.followed-by:has(a[href='/s/{rerun.code}/'])")
            assert row.is_visible() and words in row.inner_text()
            back = v.page.locator(f"small.followup:has(a[href='/s/{incident.code}/'])")
            assert back.is_visible() and words in back.inner_text()
    finally:
        v.close()
    v = visit("/t/team-a/", "team")
    try:
        record = v.page.locator("ul.advice-record").inner_text()
        # bert: expandable_segments advised, made, borne out; gpt_varlen: capping the growth advised, the
        # setting made instead (tried: the incident predicted it postpones), the OOM came later.
        assert "expandable_segments: advised 1, followed 1, tried 2, borne out 1, postponed 1" in record
        assert "growing_workload: advised 1" in record
    finally:
        v.close()


@pytest.fixture
def leak_run(transactional_db: Any, alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    from django.db import transaction

    from webapp.snapshots.models import Run
    from webapp.snapshots.runs import runs
    from webapp.snapshots.worker.tasks import analyse_upload

    monkeypatch.setattr(runs, "publish_run", lambda run_id: True)
    followups = Path(__file__).resolve().parents[1] / "fixtures" / "followups"
    for name, branch, capture in (  # real repeat runs of one GPT on main, and commit 2 of its leak
        ("m0", "main", "fnoise_main_s00"),
        ("m1", "main", "fnoise_main_s01"),
        ("m2", "main", "fnoise_main_s02"),
        ("pr", "feature", "fnoise_c2_s12"),
    ):
        path = tmp_path / f"{name}.pickle.gz"
        path.write_bytes((followups / f"{capture}.pickle.gz").read_bytes())
        upload = make_upload(alpha, alice, path, run=name)
        with transaction.atomic():
            runs.run_attach(upload, {"branch": branch, "commit": "c0" if branch == "main" else "c1"})
        analyse_upload(upload.id)
    return Run.objects.get(name="pr")


@pytest.mark.parametrize("form", ["desktop", "phone"])
def test_the_run_page_names_what_grew_beyond_the_noise(
    form: str,
    browser: Any,  # noqa: F811
    leak_run: Any,
    live_server: Any,
    client: Any,
    alice: Any,
) -> None:
    width, height = WIDTHS[form]
    assert leak_run.regression["regressed"] and leak_run.regression["tolerance"] == "noise"
    cookies = login_cookie(client, alice, live_server)
    v = Visit(browser, f"{live_server.url}/run/{leak_run.code}/", cookies, charts=False, width=width, height=height)
    try:
        clean(v)
        _fits(v, width)
        assert (
            "Tolerance learned from 3 runs of the baseline branch (1 commit)"
            in v.page.locator("#noise-model").inner_text()
        )
        table = v.page.locator("table#beyond-noise")
        assert table.is_visible()
        first = leak_run.regression["beyond_noise"][0]
        assert first["name"] in table.inner_text()
        v.page.screenshot(path=str(SCREENSHOTS / f"run-noise-{form}.png"), full_page=True)
    finally:
        v.close()
