"""``eventgroups.event_groups(..., at=points)``, the report timeline's event groups, pairs the frees only at
the addresses of the points' completions (issue 34): it must name, point for point, what the whole
trace's ``event_groups(...)[points]`` names, on every top-level fixture and a sample of the captures,
for the report's own timeline points and for random ones (the completions among them included)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis.eventgroups import event_groups
from analysis.model import FREE_COMPLETED
from analysis.reader import read_snapshot
from analysis.report import build_report
from analysis.stacks import StackCatalog, alloc_lifetimes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = sorted(FIXTURES.glob("*.pickle.gz")) + sorted((FIXTURES / "captures").glob("*.pickle.gz"))[::60]


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_the_points_groups_are_the_whole_traces(path: Path) -> None:
    snap = read_snapshot(path)
    rng = np.random.default_rng(34)
    report = build_report(path)
    timelines = {d["device"]: d.get("timeline") for d in report["devices"]}
    compared = 0
    for dev in snap.devices:
        trace = dev.trace
        n = len(trace)
        if n == 0:
            continue
        catalog = StackCatalog(snap.stacks)
        lifetimes = alloc_lifetimes(trace.action, trace.addr, trace.size, trace.stack)
        whole = event_groups(trace, catalog, lifetimes)
        completions = np.flatnonzero(np.asarray(trace.action) == FREE_COMPLETED)
        timeline = timelines.get(dev.device)
        sets = [
            np.asarray(timeline["index"], np.int64) if timeline else np.zeros(0, np.int64),
            np.sort(rng.integers(0, n, size=min(n, 500))),
            completions[:: max(1, completions.size // 300)],
            np.zeros(0, np.int64),
        ]
        for points in sets:
            got = event_groups(trace, catalog, lifetimes, at=points)
            np.testing.assert_array_equal(got, whole[points], err_msg=f"{path.name} device {dev.device}")
            compared += int(points.size)
    if any(len(d.trace) for d in snap.devices):
        assert compared > 0
