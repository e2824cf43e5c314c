"""``manage.py report SNAPSHOT --html OUT``: one self-contained page with the site's charts and sections."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOSTILE = '</script><img src=x onerror="alert(1)">{{ 7*7 }}'


@pytest.fixture(scope="module")
def gpt_report() -> dict[str, Any]:
    from analysis.report import build_report

    return json.loads(json.dumps(build_report(FIXTURES / "gpt_varlen_oom.pickle.gz")))


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("html") / "report.html"
    call_command("report", str(FIXTURES / "gpt_varlen_oom.pickle.gz"), "--html", str(out))
    return out.read_text(encoding="utf-8")


def test_standalone_page_has_every_chart_and_the_figures(standalone: str, gpt_report: dict) -> None:
    from webapp.snapshots.pages.charts import build_charts

    for name in build_charts(gpt_report):
        if name.startswith(("active-", "segtime-")):  # filled from the server's JSON: not in a file without one
            assert f'data-chart="{name}"' not in standalone
            continue
        assert f'id="chart-data-{name}"' in standalone
        assert f'data-chart="{name}"' in standalone
    dev = gpt_report["devices"][0]
    assert f"{dev['summary']['peak_reserved_bytes']:,} B" in standalone  # 7,440,695,296 B
    assert f"{dev['oom']['requested_bytes']:,} B" in standalone
    assert 'class="badge fragmentation"' in standalone
    for suggestion in dev["suggestions"]:
        assert f'data-id="{suggestion["id"]}"' in standalone


def test_standalone_page_makes_no_outside_request(standalone: str) -> None:
    # Every resource is inline: no src/href pointing anywhere, and a CSP that forbids fetching.
    assert not re.search(r"""<(script|link|img|iframe)[^>]*\s(src|href)\s*=\s*(?!["']?data:)""", standalone, re.I)
    assert "default-src 'none'" in standalone
    assert "connect-src 'none'" in standalone
    # BokehJS itself is inlined, pinned to the installed version.
    from importlib.metadata import version

    assert "Bokeh" in standalone and version("bokeh") in standalone
    assert len(standalone.encode()) < 5_000_000


def test_hostile_strings_in_a_snapshot_stay_text(gpt_report: dict) -> None:
    from webapp.snapshots.management.commands.report import render_standalone
    from webapp.snapshots.pages.charts import build_charts

    report = copy.deepcopy(gpt_report)
    dev = report["devices"][0]
    for stack in dev["top_stacks"]:
        for frame in stack["frames"]:
            frame["name"] = HOSTILE
        stack["label"] = HOSTILE
    dev["suggestions"][0]["evidence"] = HOSTILE
    report["source"]["filename"] = HOSTILE
    page = render_standalone(report, build_charts(report))
    assert "</script><img src=x" in json.dumps(build_charts(report))  # the chart data does carry it...
    assert "<img src=x" not in page  # ...but nowhere as markup, in HTML or in a json_script element
    # Each chart's JSON element runs to its own end: a "</script>" in the data would cut it short.
    blocks = re.findall(r'<script id="chart-data-[^"]+" type="application/json">(.*?)</script>', page, re.S)
    server_only = ("active-", "segtime-")  # see above
    assert len(blocks) == len([n for n in build_charts(report) if not n.startswith(server_only)])
    for block in blocks:
        json.loads(block)
    assert "&lt;/script&gt;&lt;img src=x" in page  # escaped in the tables
    assert "\\u003C/script\\u003E" in page  # escaped inside the chart JSON


def test_the_site_page_template_escapes_the_same_way(gpt_report: dict, rf: Any) -> None:
    from django.template.loader import render_to_string

    from webapp.snapshots.pages.charts import build_charts

    report = copy.deepcopy(gpt_report)
    report["devices"][0]["top_stacks"][1]["label"] = HOSTILE
    request = rf.get("/")
    request.user = type("Anon", (), {"is_authenticated": False})()
    page = render_to_string(
        "snapshots/report.html",
        {
            "report": report,
            "charts": build_charts(report),
            "shared": True,
            "share_url": "https://x/r/t/",
            "markdown_snippet": HOSTILE,
            "upload": {"filename": "f.pickle.gz", "code": "c"},
        },
        request=request,
    )
    assert "<img src=x" not in page
    assert 'id="chart-data-timeline-0"' in page


def test_unreadable_file_is_a_command_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"<html>not a snapshot</html>")
    with pytest.raises(CommandError, match="snapshot:"):
        call_command("report", str(bad), "--html", str(tmp_path / "out.html"))


@pytest.mark.parametrize("case", ["state_only", "no_context", "wrapped_ring"])
def test_odd_captures_render_with_what_they_have(case: str) -> None:
    """No history, no frames, a wrapped ring buffer: the page says so and draws what exists."""
    from analysis.report import build_report
    from webapp.snapshots.management.commands.report import render_standalone
    from webapp.snapshots.pages.charts import build_charts

    report = json.loads(json.dumps(build_report(FIXTURES / f"{case}.pickle.gz")))
    charts = build_charts(report)
    page = render_standalone(report, charts)
    dev = report["devices"][0]
    assert f"{dev['summary']['peak_reserved_bytes']:,} B" in page
    assert "segments-peak-0" in charts  # the final state is always there to map
    for warning in report["capture"]["warnings"]:
        assert str(warning["message"]).split("(")[0][:40] in page.replace("&#x27;", "'")
    if case == "state_only":
        assert "timeline-0" not in charts  # one event is not a timeline
        assert "Memory over time" not in page
    else:
        assert "timeline-0" in charts
    if dev["summary"]["peak_is_lower_bound"]:
        assert "peaks are lower bounds" in page


def test_a_step_answer_that_depends_on_the_exact_cap_is_shown_as_not_known() -> None:
    # gpt_autocast_c75 with its OOM message: the GC what-if completes at one end of the message's
    # "5.10 GiB allowed" range and not at the other (docs/report.md), so the page says so.
    from analysis.report import build_report
    from webapp.snapshots.management.commands.report import render_standalone
    from webapp.snapshots.pages.charts import build_charts

    caps = FIXTURES / "captures"
    truth = json.loads((caps / "gpt_autocast_c75_default.truth.json").read_text())
    conf = "garbage_collection_threshold:0.7"
    report = json.loads(
        json.dumps(
            build_report(caps / "gpt_autocast_c75_default.pickle.gz", whatif=(conf,), oom_message=truth["oom_message"])
        )
    )
    w = next(x for x in report["devices"][0]["whatif"] if x["config"] == conf)
    assert w["step_completes"] is None and w["step_completes_range"] is not None
    page = render_standalone(report, build_charts(report))
    assert "not known: it completes at one end of the OOM message's rounding of the cap and not at the other" in page
