"""The charts read the typed report (``analysis.contract``): a report stored in an older shape (the timeline's
columns under ``series`` and their plain names, segment maps as bare lists with ``total_size`` and
``segment_type``) draws the same charts as the current one, on a real fixture's report."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.contract import Report
from tests.webapp import chartdata

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Old column name -> the current one (contract.Timeline.FALLBACK reads the left ones).
OLD_COLUMNS = {
    "reserved": "reserved_bytes",
    "allocated": "allocated_bytes",
    "requested": "requested_bytes",
    "largest_free": "largest_free_bytes",
    "cached_free": "cached_free_bytes",
    "fragmentation": "external_fragmentation",
    "event_index": "index",
}


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    from analysis.report import build_report

    built: dict[str, Any] = json.loads(json.dumps(build_report(FIXTURES / "frag_oom.pickle.gz", jobs=1)))
    return built


def _older(report: dict[str, Any]) -> dict[str, Any]:
    old = copy.deepcopy(report)
    for dev in old["devices"]:
        timeline = dev["timeline"]
        timeline["series"] = {name: timeline.pop(now) for name, now in OLD_COLUMNS.items()}
        for moment, snap in list(dev["segment_maps"].items()):
            for seg in snap["segments"]:
                seg["total_size"], seg["segment_type"] = seg.pop("size"), seg.pop("type")
            dev["segment_maps"][moment] = snap["segments"]  # the first maps: the list alone
    return old


def test_an_older_timeline_reads_as_the_current_one(report: dict[str, Any]) -> None:
    from webapp.snapshots.pages.charts import timeline_columns

    now, old = Report.from_json(report), Report.from_json(_older(report))
    for dev_now, dev_old in zip(now.devices, old.devices, strict=True):
        cols_now, cols_old = timeline_columns(dev_now.timeline), timeline_columns(dev_old.timeline)
        assert cols_now is not None and cols_old is not None
        assert set(cols_now) == set(cols_old) >= {"reserved", "allocated", "largest_free", "event_index"}
        for key, values in cols_now.items():
            np.testing.assert_array_equal(values, cols_old[key])
        assert float(cols_now["reserved"].max()) == dev_now.summary.peak_reserved_bytes


def test_older_segment_maps_draw_the_same_segments(report: dict[str, Any]) -> None:
    from webapp.snapshots.pages.charts import build_charts

    now, old = build_charts(Report.from_json(report)), build_charts(Report.from_json(_older(report)))
    maps = [name for name in now if name.startswith("segments-")]
    assert maps and set(maps) == {name for name in old if name.startswith("segments-")}
    for name in maps:
        rows_now = _segment_rows(now[name])
        assert rows_now and rows_now == _segment_rows(old[name])


def _segment_rows(item: dict[str, Any]) -> list[tuple[float, float, str]]:
    """(size, segment, state) of every block the segment map draws."""
    data = chartdata.source_with(item, "size", "segment", "state")
    return list(
        zip(np.asarray(data["size"]).tolist(), np.asarray(data["segment"]).tolist(), data["state"], strict=True)
    )
