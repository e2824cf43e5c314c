"""The run-level verdict where users read it (issue 32, item 4): the report page's badges and the API's summary
(which the history's OOM column, the webhook and the client read) say the run's verdict; the request's stays
named as the request's. An evaluation without no_grad: its failing request would have fitted (fragmentation),
and every setting's real rerun died in the same step (tests/fixtures/diagnosis/eval_bert.reruns.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

DIAG = Path(__file__).resolve().parents[1] / "fixtures" / "diagnosis"


@pytest.fixture(scope="module")
def eval_report() -> dict[str, Any]:
    from analysis.report import build_report

    message = json.loads((DIAG / "eval_bert_default.truth.json").read_text())["oom_message"]
    return json.loads(json.dumps(build_report(DIAG / "eval_bert_default.pickle.gz", oom_message=message)))


def test_the_api_summary_says_the_run_verdict(eval_report: dict[str, Any]) -> None:
    from webapp.snapshots.worker.jobs import summary_from_report

    summary = summary_from_report(json.loads(json.dumps(eval_report)))
    assert summary["oom"] is True
    assert summary["verdict"] == "capacity"
    assert summary["request_verdict"] == "fragmentation"


def test_the_page_shows_the_run_verdict_and_names_the_requests(eval_report: dict[str, Any], rf: Any) -> None:
    from django.template.loader import render_to_string

    from webapp.snapshots.pages.charts import build_charts

    request = rf.get("/")
    request.user = type("Anon", (), {"is_authenticated": False})()
    page = render_to_string(
        "snapshots/report.html",
        {
            "report": eval_report,
            "charts": build_charts(eval_report),
            "shared": True,
            "share_url": "https://x/r/t/",
            "markdown_snippet": "",
            "upload": {"filename": "f.pickle.gz", "code": "c"},
        },
        request=request,
    )
    assert '<span class="badge capacity" data-level="run">capacity</span></h3>' in page
    assert "Capacity, for the run:" in page
    assert "the failing request's own verdict (fragmentation)" in page
    assert 'class="badge fragmentation"' not in page.split("<h3>The out-of-memory error")[1].split("</h3>")[0]
