"""One wording of a report for the page, the API's summary and the CLI (issue 20, item 4): the summary says
what the report's decision says, with the limit and its source, and sizes read as torch prints them."""

from __future__ import annotations

from typing import Any

import pytest

from analysis.readout import size
from tests.webapp.helpers import FIXTURES, bearer, make_upload

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "grow_gpt2_default"])
def test_api_summary_is_the_reports_decision(case: str, client: Any, alice: Any, alpha: Any, alice_token: str) -> None:
    from webapp.snapshots.models import Report
    from webapp.snapshots.worker.tasks import analyse_upload

    upload = make_upload(alpha, alice, FIXTURES / f"{case}.pickle.gz")
    analyse_upload(upload.id)
    dev = Report.objects.get(upload=upload).data["devices"][0]
    summary = client.get(f"/api/v1/snapshots/{upload.code}", **bearer(alice_token)).json()["summary"]
    change = dev["decision"]["change"]
    # The summary used to give the first suggestion, which is not the decision on gpt_varlen_oom (the
    # advisor puts smaller_batch first, the decision a free setting that finishes the step).
    if case == "gpt_varlen_oom":
        assert dev["suggestions"][0]["id"] != change["id"]
    assert summary["top_suggestion"] == change["title"] and summary["change_line"] == change["line"]
    assert summary["headline"] == dev["decision"]["headline"]
    assert summary["limit_bytes"] == dev["oom"]["limit_bytes"]
    assert summary["limit_source"] == "cap-lower-bound" and summary["limit_is_lower_bound"] is True
    assert summary["limit_text"] == f"at least {size(dev['oom']['limit_bytes'])}"
    assert summary["verdict_level"] == dev["oom"]["verdict_level"] == "step"
    assert summary["message_could_change_verdict"] is (dev["oom"]["verdict"] == "capacity")
    runs = client.get(f"/api/v1/projects/{alpha.slug}/runs", **bearer(alice_token)).json()
    row = next(r for r in runs["runs"] if r["id"] == upload.code)
    assert row["summary"]["top_suggestion"] == change["title"]


def test_cli_summary_words_the_decision_as_the_page_does(capsys: pytest.CaptureFixture[str]) -> None:
    from analysis.__main__ import main

    assert main(["report", str(FIXTURES / "grow_gpt2_default.pickle.gz"), "--jobs", "1"]) == 0
    text = capsys.readouterr().out
    assert "  rests on: Limit at least 5.80 GiB, inferred from the trace" in text
    assert "this verdict could change with torch's OOM message" in text
    assert "change: batch_size = " in text
    assert "0.00 GiB" not in text.split("suggest [")[0]  # the lines worded here (the advice's own are not)
