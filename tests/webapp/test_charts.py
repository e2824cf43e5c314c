"""charts.build_charts on real reports: the charts show the report's own figures, stay small, use no CustomJS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.webapp import chartdata

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = ("frag_oom", "gpt_varlen_oom", "two_gpu_pipeline")


@pytest.fixture(scope="module")
def reports() -> dict[str, dict[str, Any]]:
    from analysis.report import build_report

    # JSON round trip: the worker stores the report as JSON and charts are built from that form.
    return {case: json.loads(json.dumps(build_report(FIXTURES / f"{case}.pickle.gz"))) for case in CASES}


@pytest.fixture(scope="module")
def charts(reports: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    from webapp.snapshots.pages.charts import build_charts

    return {case: build_charts(report) for case, report in reports.items()}


def _timeline(item: dict[str, Any]) -> dict[str, Any]:
    return chartdata.source_with(item, "x", "reserved", "largest_free")


@pytest.mark.parametrize("case", CASES)
def test_timeline_peaks_are_the_reports_peaks(case: str, reports: dict, charts: dict) -> None:
    for dev in reports[case]["devices"]:
        data = _timeline(charts[case][f"timeline-{dev['device']}"])
        summary = dev["summary"]
        # Exact, not approximate: downsampling must keep the peak events.
        assert int(data["reserved"].max()) == summary["peak_reserved_bytes"]
        assert int(data["allocated"].max()) == summary["peak_allocated_bytes"]
        assert int(data["requested"].max()) == summary["peak_requested_bytes"]
        assert len(data["x"]) <= 6500


def test_timeline_matches_truth_of_gpt_varlen_oom(reports: dict, charts: dict) -> None:
    truth = json.loads((FIXTURES / "gpt_varlen_oom.truth.json").read_text())
    data = _timeline(charts["gpt_varlen_oom"]["timeline-0"])
    assert int(data["reserved"].max()) == truth["memory_stats"]["reserved_bytes.all.peak"]
    assert int(data["allocated"].max()) == truth["memory_stats"]["allocated_bytes.all.peak"]


def test_timeline_marks_the_oom_where_the_report_puts_it(reports: dict, charts: dict) -> None:
    dev = reports["gpt_varlen_oom"]["devices"][0]
    oom = dev["oom"]
    item = charts["gpt_varlen_oom"]["timeline-0"]
    marker = chartdata.source_with(item, "requested", "largest")
    assert list(marker["requested"]) == [oom["requested_bytes"]]
    assert list(marker["largest"]) == [oom["largest_free_block_bytes"]]
    # The OOM line sits at the OOM's x, which is also an x of the timeline (its event is kept).
    data = _timeline(item)
    spans = [
        o["attributes"]["location"]
        for o in chartdata.objects(item, "Span")
        if o["attributes"].get("dimension") == "height"
    ]
    assert oom["event_index"] in set(data["x"].tolist())
    assert oom["event_index"] in spans
    # And the limit line at the report's limit.
    widths = [
        o["attributes"]["location"]
        for o in chartdata.objects(item, "Span")
        if o["attributes"].get("dimension", "width") == "width"
    ]  # the default is not serialised
    assert oom["limit_bytes"] in widths


def test_timeline_and_fragmentation_share_one_x_range(charts: dict) -> None:
    item = charts["gpt_varlen_oom"]["timeline-0"]
    assert chartdata.figure_count(item) == 2
    figures = list(chartdata.objects(item, "Figure"))
    ranges = [f["attributes"]["x_range"] for f in figures]
    # Linked pan/zoom: the second figure refers to the first one's range object.
    ids = {r["id"] for r in ranges}
    assert len(ids) == 1
    data = _timeline(item)
    assert "fragmentation" in data
    assert float(data["fragmentation"].min()) >= 0.0 and float(data["fragmentation"].max()) <= 1.0


def test_step_bands_cover_every_other_step(reports: dict, charts: dict) -> None:
    steps = reports["gpt_varlen_oom"]["devices"][0]["steps"]
    assert len(steps) >= 20
    bands = chartdata.source_with(charts["gpt_varlen_oom"]["timeline-0"], "left", "right", "step")
    assert list(bands["step"]) == [float(s["index"]) for s in steps[::2]]


@pytest.mark.parametrize(
    ("case", "moment"), [("frag_oom", "reserved_peak"), ("frag_oom", "oom"), ("gpt_varlen_oom", "oom")]
)
def test_segment_map_holds_every_byte_of_the_reports_map(case: str, moment: str, reports: dict, charts: dict) -> None:
    dev = reports[case]["devices"][0]
    segments = dev["segment_maps"][moment]["segments"]
    # The "segments-peak" chart draws the reserved peak's map (the moment the cache was largest).
    chart_name = "peak" if moment == "reserved_peak" else moment
    assert len(segments) > 60  # enough segments to be a real map (frag_oom has 178 at the OOM)
    data = chartdata.source_with(charts[case][f"segments-{chart_name}-0"], "x", "w", "state", "size")
    states = np.asarray(data["state"])
    assert len(set(data["y"])) == len(segments)
    allocated = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated")
    assert int(np.sum(data["size"][states == "allocated"])) == allocated
    # Pending frees still count as allocated (torch's accounting); runs of tiny blocks the report merged
    # ("mixed") hold some of each. At the OOM the segments' allocated bytes are the report's.
    live = int(np.sum(data["size"][(states == "allocated") | (states == "pending free")]))
    mixed = int(np.sum(data["size"][states == "small blocks, merged"]))
    reported = sum(s["allocated_bytes"] for s in segments)
    assert live <= reported <= live + mixed
    if not mixed:
        assert live == reported
    if moment == "oom":
        assert reported == dev["oom"]["allocated_bytes"]
    # Each row tiles its segment exactly: blocks plus unmapped gaps add up to the segment's size.
    rows = np.bincount(np.asarray(data["y"], np.int64), weights=np.asarray(data["size"], np.float64))
    assert sorted(rows.astype(np.int64).tolist()) == sorted(s["size"] for s in segments)


def test_segment_map_at_the_oom_shows_the_fragmentation(reports: dict, charts: dict) -> None:
    oom = reports["frag_oom"]["devices"][0]["oom"]
    data = chartdata.source_with(charts["frag_oom"]["segments-oom-0"], "x", "w", "state", "size")
    free = data["size"][np.asarray(data["state"]) == "free (cached)"]
    # The largest free box in the map is the largest free block the report names, and it is too small.
    assert int(free.max()) == oom["largest_free_block_bytes"]
    assert int(free.max()) < oom["requested_bytes"]


def test_icicle_widths_are_the_top_stacks_bytes(reports: dict, charts: dict) -> None:
    dev = reports["gpt_varlen_oom"]["devices"][0]
    data = chartdata.source_with(charts["gpt_varlen_oom"]["stacks-0"], "left", "right", "bytes")
    when = "oom" if any(s["when"] == "oom" for s in dev["top_stacks"]) else "peak"
    total = sum(s["bytes"] for s in dev["top_stacks"] if s["when"] == when)
    top = np.asarray(data["top"]) == 0  # the outermost level
    assert int(np.sum(data["bytes"][top])) == total
    assert float(np.sum(data["right"][top] - data["left"][top])) == pytest.approx(1.0)


def test_whatif_bars_are_the_replayed_peaks(reports: dict, charts: dict) -> None:
    dev = reports["gpt_varlen_oom"]["devices"][0]
    assert dev["whatif"], "gpt_varlen_oom must be replayed under other settings"
    data = chartdata.source_with(charts["gpt_varlen_oom"]["whatif-0"], "config", "peak")
    assert list(data["config"])[1:] == [w["config"] for w in dev["whatif"]]
    assert list(data["peak"]) == [dev["summary"]["peak_reserved_bytes"]] + [
        w["peak_reserved_bytes"] for w in dev["whatif"]
    ]
    steps_item = charts["gpt_varlen_oom"]["whatif-steps-0"]
    recorded = next(d for d in chartdata.sources(steps_item) if "config" in d and d["config"][0] == "recorded run")
    assert list(recorded["reserved"]) == [s["reserved_end_bytes"] for s in dev["steps"]]


def test_two_devices_get_their_own_charts(reports: dict, charts: dict) -> None:
    devices = [d["device"] for d in reports["two_gpu_pipeline"]["devices"]]
    assert len(devices) == 2
    for d in devices:
        assert f"timeline-{d}" in charts["two_gpu_pipeline"]
    a, b = (_timeline(charts["two_gpu_pipeline"][f"timeline-{d}"]) for d in devices)
    assert int(a["reserved"].max()) != int(b["reserved"].max())


@pytest.mark.parametrize("case", CASES)
def test_no_custom_js_and_pages_stay_small(case: str, charts: dict) -> None:
    text = json.dumps(charts[case])
    assert "CustomJS" not in text  # the CSP has no unsafe-eval: CustomJS cannot run
    assert len(text) < 1_500_000
    for item in charts[case].values():
        assert item["version"]  # json_item form, embeddable by Bokeh.embed.embed_item


def test_caps_hold_on_an_oversized_report() -> None:
    """A report far larger than any page should carry (huge_all_stacks-like and worse) stays bounded."""
    from webapp.snapshots.pages.charts import build_charts

    rng = np.random.default_rng(7)
    n = 200_000
    reserved = np.cumsum(rng.integers(-(2**21), 2**21 + 4096, n)).clip(0) + 2**30
    peak = int(reserved.max())
    blocks = [
        {
            "size": 2**20,
            "requested_size": 2**20 - 512,
            "state": s,
            "frames": [{"filename": "/x/train.py", "line": 1, "name": "f"}],
        }
        for s in ("active_allocated", "inactive") * 40
    ]
    report = {
        "devices": [
            {
                "device": 0,
                "summary": {"peak_reserved_bytes": peak},
                "timeline": {
                    "index": list(range(n)),
                    "time_us": list(range(0, 10 * n, 10)),
                    "reserved_bytes": reserved.tolist(),
                    "allocated_bytes": (reserved // 2).tolist(),
                    "requested_bytes": (reserved // 3).tolist(),
                    "largest_free_bytes": (reserved // 9).tolist(),
                    "cached_free_bytes": (reserved // 2).tolist(),
                },
                "steps": [
                    {"index": i, "start_us": i * 1000, "end_us": i * 1000 + 999, "reserved_end_bytes": 1}
                    for i in range(3000)
                ],
                "segment_maps": {
                    "peak": {
                        "segments": [
                            {"address": i << 32, "total_size": 80 * 2**20, "blocks": blocks} for i in range(2000)
                        ]
                    }
                },
                "top_stacks": [
                    {
                        "when": "peak",
                        "bytes": 2**20 * (i + 1),
                        "count": 1,
                        "frames": [{"filename": f"/x/m{i % 7}.py", "line": j, "name": f"fn{j}"} for j in range(60)],
                    }
                    for i in range(400)
                ],
            }
        ]
    }
    charts = build_charts(report)
    assert int(_timeline(charts["timeline-0"])["reserved"].max()) == peak
    total = sum(chartdata.size(item) for item in charts.values())
    assert total < 3_000_000, {name: chartdata.size(item) for name, item in charts.items()}
