"""Steps from annotations, checked against each run's own per-step log."""

from __future__ import annotations

import itertools
import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.allocator.recorded import recorded_replay
from analysis.model import SEGMENT_FREE, Annotation
from analysis.reader import read_snapshot
from analysis.steps import find_steps, first_growth_step, per_step_figures, step_end_times

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def truth(case: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{case}.truth.json").read_text())


@cache
def rows_of(case: str) -> tuple[list[dict[str, Any]], Any]:
    s = read_snapshot(FIXTURES / f"{case}.pickle.gz")
    dev = s.devices[0]
    rep = recorded_replay(s, dev)
    steps = find_steps(s.annotations, dev.device, dev.trace.time_us)
    return per_step_figures(steps, rep.allocated, rep.reserved), rep


@pytest.mark.parametrize(
    "case",
    [
        "gpt_varlen_oom",
        "gpt_varlen_expandable",
        "gpt_varlen_maxsplit256",
        "no_context",
        "compiled_train",
        "wrapped_ring",
    ],
)
def test_reserved_at_each_step_end_matches_the_run_log(case: str) -> None:
    rows, rep = rows_of(case)
    log = truth(case)["workload_log"]
    # zero_grad frees blocks but never segments: reserved right after it equals
    # reserved at the end of the optimizer step.
    got = [r["reserved_end_bytes"] for r in rows]
    assert got == [row["reserved"] for row in log][-len(got) :]
    if case != "wrapped_ring":
        assert len(rows) == len(log)
    for r in rows:
        assert r["peak_reserved_bytes"] >= r["reserved_end_bytes"]
        assert r["peak_allocated_bytes"] <= rep.peak_allocated
        assert 0.0 <= r["fragmentation"] <= 1.0
    assert max(r["peak_reserved_bytes"] for r in rows) <= rep.peak_reserved


def test_wrapped_ring_keeps_only_steps_inside_the_trace() -> None:
    rows, _ = rows_of("wrapped_ring")
    assert 0 < len(rows) < len(truth("wrapped_ring")["workload_log"])
    assert all(r["first_event"] <= r["last_event"] for r in rows)


def test_step_peaks_are_maxima_over_their_events() -> None:
    rows, rep = rows_of("gpt_varlen_oom")
    for r in rows:
        lo, hi = r["first_event"], r["last_event"]
        assert r["peak_allocated_bytes"] == int(rep.allocated[lo : hi + 1].max())
        assert r["peak_reserved_bytes"] == int(rep.reserved[lo : hi + 1].max())
    # Steps tile the trace up to the last step end.
    assert rows[0]["first_event"] == 0
    assert all(b["first_event"] == a["last_event"] + 1 for a, b in itertools.pairwise(rows))


def test_first_growth_step_matches_the_log_when_reserved_only_grows() -> None:
    case = "gpt_varlen_oom"
    rows, _ = rows_of(case)
    log = [row["reserved"] for row in truth(case)["workload_log"]]
    expected = next(k for k in range(1, len(log)) if log[k] > log[k - 1])
    # The expectation holds while no segment was freed (reserved then only grows).
    trace = read_snapshot(FIXTURES / f"{case}.pickle.gz").devices[0].trace
    first_free = int(np.flatnonzero(trace.action == SEGMENT_FREE)[0])
    assert first_free > rows[expected]["last_event"]
    assert first_growth_step(rows) == expected == 2


def test_profiler_steps_win_over_optimizer_steps_and_other_devices_count() -> None:
    ann = [
        Annotation("Optimizer.step#SGD.step", "END", 0, 50),
        Annotation("ProfilerStep#0", "START", 0, 0),
        Annotation("ProfilerStep#0", "END", 0, 100),
        Annotation("ProfilerStep#1", "END", 0, 200),
    ]
    assert step_end_times(ann, 0) == ("ProfilerStep", [100, 200])
    assert step_end_times(ann[:1], 0) == ("Optimizer.step", [50])
    assert step_end_times(ann[:1], 3) == ("Optimizer.step", [50])
    assert step_end_times([Annotation("forward", "END", 0, 5)], 0) == ("", [])
    times = np.array([10, 60, 100, 150, 250], np.int64)
    steps = find_steps(ann, 0, times)
    assert steps.last_event.tolist() == [2, 3]
    assert steps.first_event.tolist() == [0, 3]
