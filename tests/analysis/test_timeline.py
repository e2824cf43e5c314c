"""Timeline: downsampling keeps every extreme, the peaks and the OOM exact."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from analysis.allocator.recorded import RecordedReplay, recorded_replay
from analysis.model import FREE_COMPLETED, FREE_REQUESTED, OOM
from analysis.reader import read_snapshot
from analysis.timeline import (
    PRIMARY,
    build_timeline,
    columns_of,
    extreme_indices,
    fused_free_settler,
    settled_points,
    timeline_window,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@cache
def replayed(case: str) -> tuple[RecordedReplay, np.ndarray]:
    s = read_snapshot(FIXTURES / f"{case}.pickle.gz")
    dev = s.devices[0]
    return recorded_replay(s, dev), dev.trace.time_us


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "infer_varbatch", "wrapped_ring"])
def test_timeline_peaks_equal_the_replay_peaks(case: str) -> None:
    rep, times = replayed(case)
    action = read_snapshot(FIXTURES / f"{case}.pickle.gz").devices[0].trace.action
    ooms = np.flatnonzero(action == OOM)
    oom = int(ooms[-1]) if ooms.size else None
    tl = build_timeline(columns_of(rep), times, buckets=200, oom_index=oom)
    assert max(tl["reserved_bytes"]) == rep.peak_reserved
    assert max(tl["allocated_bytes"]) == rep.peak_allocated
    assert max(tl["requested_bytes"]) == rep.peak_requested
    assert tl["peaks"]["allocated"] == {"event_index": rep.peak_allocated_index, "bytes": rep.peak_allocated}
    assert tl["index"] == sorted(set(tl["index"]))
    assert (oom is not None) == (case == "gpt_varlen_oom")
    if oom is not None:
        assert oom in tl["index"] and tl["oom_index"] == oom
    assert tl["downsampled"] is True
    assert tl["points"] <= 2 * len(PRIMARY) * 200 + 8


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "infer_varbatch", "wrapped_ring"])
def test_fused_frees_are_settled_before_the_series_are_read(case: str) -> None:
    """The settled timeline keeps the points ``settled_points`` moves the unsettled one's to, each series read
    at them, and its peaks: no point sits between a free's request and its completion."""
    rep, times = replayed(case)
    trace = read_snapshot(FIXTURES / f"{case}.pickle.gz").devices[0].trace
    plain = build_timeline(columns_of(rep), times, buckets=50)
    tl = build_timeline(columns_of(rep), times, buckets=50, settle=fused_free_settler(trace))
    points = settled_points(np.asarray(plain["index"], np.int64), trace.action, trace.addr)
    assert tl["index"] == points.tolist() and tl["points"] == points.size
    assert tl["peaks"] == plain["peaks"] and tl["downsampled"] is True
    for name, key in (("reserved", "reserved_bytes"), ("requested", "requested_bytes")):
        assert tl[key] == np.asarray(getattr(rep, name))[points].tolist()
    assert tl["time_us"] == times[points].tolist()
    nxt = np.minimum(points + 1, len(trace) - 1)
    fused = (trace.action[points] == FREE_REQUESTED) & (trace.action[nxt] == FREE_COMPLETED)
    assert not (fused & (trace.addr[nxt] == trace.addr[points]) & (points + 1 < len(trace))).any()


def test_every_bucket_keeps_its_min_and_max() -> None:
    rep, times = replayed("gpt_varlen_oom")
    cols = columns_of(rep)
    n = rep.events
    buckets = 300
    tl = build_timeline(cols, times, buckets=buckets)
    kept = np.array(tl["index"])
    width = -(-n // buckets)
    for name in PRIMARY:
        col = cols[name]
        for lo in range(0, n, width):
            seg = col[lo : lo + width]
            in_bucket = kept[(kept >= lo) & (kept < lo + width)]
            values = col[in_bucket]
            assert values.max() == seg.max() and values.min() == seg.min()


def test_series_are_read_at_the_kept_events_and_ratios_follow() -> None:
    rep, times = replayed("gpt_varlen_oom")
    cols = columns_of(rep)
    tl = build_timeline(cols, times, buckets=100)
    idx = np.array(tl["index"])
    assert tl["cached_free_bytes"] == cols["cached_free"][idx].tolist()
    assert tl["time_us"] == times[idx].tolist()
    k = int(np.argmax(tl["reserved_bytes"]))
    res, alloc = tl["reserved_bytes"][k], tl["allocated_bytes"][k]
    assert tl["stranded"][k] == pytest.approx((res - alloc) / res, abs=1e-4)
    cached, largest = tl["cached_free_bytes"][k], tl["largest_free_bytes"][k]
    assert tl["external_fragmentation"][k] == pytest.approx(1 - largest / cached if cached else 0.0, abs=1e-4)
    assert all(0.0 <= v <= 1.0 for v in tl["stranded"] + tl["external_fragmentation"])


def test_window_gives_full_detail_or_downsamples() -> None:
    rep, times = replayed("gpt_varlen_oom")
    win = timeline_window(rep, 1000, 1500, max_points=1000, time_us=times)
    assert win["full_detail"] is True
    assert win["index"] == list(range(1000, 1500))
    assert win["reserved_bytes"] == rep.reserved[1000:1500].tolist()
    big = timeline_window(rep, 0, rep.events, max_points=600, time_us=times)
    assert big["full_detail"] is False and big["points"] <= 600 + 2
    assert max(big["allocated_bytes"]) == rep.peak_allocated


def test_extreme_indices_small_inputs_are_kept_whole() -> None:
    values = np.array([5, 1, 9, 3], np.int64)
    assert extreme_indices(values, 0, 4, 10).tolist() == [0, 1, 2, 3]
    assert extreme_indices(values, 2, 2, 10).size == 0
