"""The whole-device ledger on the decision screen (one labelled bar) and in the API's summary (issue 32)."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
OTHERPROC = FIXTURES / "diagnosis" / "otherproc_default"


@cache
def otherproc_report() -> str:
    from analysis.report import build_report

    message = json.loads(OTHERPROC.with_suffix(".truth.json").read_text())["oom_message"]
    return json.dumps(build_report(OTHERPROC.with_suffix(".pickle.gz"), oom_message=message))


def test_the_decision_screen_draws_the_ledger_as_one_labelled_bar() -> None:
    from analysis.readout import size
    from webapp.snapshots.management.commands.report import render_standalone
    from webapp.snapshots.pages.charts import build_charts

    report: dict[str, Any] = json.loads(otherproc_report())
    rows = {r["id"]: r for r in report["devices"][0]["ledger"]["rows"]}
    page = render_standalone(report, build_charts(report))
    decision = page[page.index('<section class="decision"') : page.index("</section>", page.index('class="decision"'))]
    bar = re.search(r'<div class="ledger-bar" role="img" aria-label="([^"]+)">(.*?)</div>', decision, re.S)
    assert bar is not None
    label = bar.group(1).replace("&#x27;", "'")
    # The label says it all in words: where the 139.80 GiB went at the OOM, row by row, with shares.
    assert label.startswith("Where the GPU's 139.80 GiB went at the OOM (event 588): ")
    assert "other processes 132.81 GiB (95%)" in label
    assert "allocated by PyTorch (live tensors) 6.30 GiB (5%)" in label
    # One segment per row with bytes, server-rendered, in the ledger's order, widths adding up to the bar.
    segments = re.findall(r'data-row="(\w+)" data-bytes="(\d+)" style="width: ([0-9.]+)%"', bar.group(2))
    assert [s[0] for s in segments] == [k for k, r in rows.items() if r["bytes"] > 0]
    assert all(int(b) == rows[k]["bytes"] for k, b, _ in segments)
    assert abs(sum(float(w) for _, _, w in segments) - 100) < 0.01
    # The key below it names the other process by its PID and says where each figure comes from.
    other = next(p for p in rows["other_processes"]["parts"] if p["id"] == "process_5776")
    assert f"process 5776: {size(other['bytes'])}" in decision
    assert "from the OOM message" in decision and "from the trace" in decision
    assert "http://" not in decision and "https://" not in decision


def test_the_api_summary_carries_the_ledger_rows() -> None:
    from webapp.snapshots.worker.jobs import summary_from_report

    report = json.loads(otherproc_report())
    summary = summary_from_report(report)
    ledger = summary["ledger"]
    full = report["devices"][0]["ledger"]
    assert (ledger["moment"], ledger["event_index"], ledger["total_bytes"]) == ("oom", 588, full["total_bytes"])
    assert [(r["id"], r["bytes"], r["source"]) for r in ledger["rows"]] == [
        (r["id"], r["bytes"], r["source"]) for r in full["rows"]
    ]
    assert sum(r["bytes"] for r in ledger["rows"]) == ledger["total_bytes"]


@pytest.mark.django_db
def test_the_triage_page_and_api_draw_the_ledger_from_the_message(alice_client: Any, alice_token: str) -> None:
    """The text-only triage: the same bar from the message's figures (another process held 100.51 GiB of
    the H200), and the summary printed at the OOM splits the cache; the API answers the same rows."""
    from django.test import Client

    from analysis.limits import parse_oom_message
    from tests.webapp.helpers import bearer

    t = json.loads((FIXTURES / "triage" / "triage_other_process.truth.json").read_text())
    html = alice_client.post("/triage/", {"oom_message": t["oom_message"], "memory_summary": t["memory_summary"]})
    html = html.content.decode()
    bar = re.search(r'<div class="ledger-bar" role="img" aria-label="([^"]+)">', html)
    assert bar is not None
    label = bar.group(1).replace("&#x27;", "'")
    assert label.startswith("Where the GPU's 139.80 GiB went at the OOM: allocated by PyTorch (live tensors) 38.00 GiB")
    assert "other processes 100.51 GiB (72%)" in label and "free on the device 793.56 MiB" in label
    assert "from the OOM message" in html

    answer = (
        Client()
        .post(
            "/api/v1/triage",
            data=json.dumps({"oom_message": t["oom_message"], "memory_summary": t["memory_summary"]}),
            content_type="application/json",
            **bearer(alice_token),
        )
        .json()
    )
    ledger = answer["ledger"]
    rows = {r["id"]: r for r in ledger["rows"]}
    assert sum(r["bytes"] for r in ledger["rows"]) == ledger["total_bytes"]
    assert abs(ledger["total_bytes"] - t["total_memory"]) <= 0.01 * t["total_memory"]
    stats = t["memory_stats"]
    assert (
        abs(rows["allocated"]["bytes"] - stats["allocated_bytes.all.current"])
        <= 0.01 * stats["allocated_bytes.all.current"]
    )
    msg = parse_oom_message(t["oom_message"])
    assert msg.other_processes[0][0] == 3958
    assert (
        abs(rows["other_processes"]["bytes"] - msg.other_processes[0][1].value)
        <= 0.01 * msg.other_processes[0][1].value
    )
    assert ledger["event_index"] is None and ledger["moment"] == "oom"
