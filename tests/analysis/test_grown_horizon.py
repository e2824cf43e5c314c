"""A growing run's horizon replayed over grown steps under the setting (issue 32, item 7; analysis.horizon), on
real H200 captures with the real reruns of each setting: gpt_varlen_oom (lengths growing with jitter, died in step
23 under a 7 GiB cap; its expandable_segments and max_split_size_mb:256 reruns died in step 27), gpu_grow_oom
(a growing batch under 3 GiB, died in step 13, and so did its expandable_segments and max_split_size_mb:64
reruns), gpt_varlen_c70 (the same GPT workload; its roundup_power2_divisions:4 rerun died in step 23 too)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.allocator import build_requests, trace_is_complete
from analysis.allocator.config import AllocatorConfig
from analysis.horizon import GrownHorizon, grown_horizon, grown_tail, horizon_is_near
from analysis.model import FREE_REQUESTED
from analysis.projection import Projection, project_failing_step
from analysis.reader import read_snapshot
from analysis.report import build_report
from analysis.stacks import alloc_lifetimes
from analysis.steps import find_steps

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
GPT = FIXTURES / "gpt_varlen_oom.pickle.gz"


def _truth(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.truth.json").read_text())  # type: ignore[no-any-return]


def _died_in(name: str) -> int:
    """The step a run died in: its truth logs one row per completed step, and it died of an OOM."""
    truth = _truth(name)
    assert truth["oom_message"]
    return len(truth["workload_log"])


@functools.cache
def _setup(path: Path = GPT) -> tuple[Any, ...]:
    truth = json.loads(path.with_name(path.name.replace(".pickle.gz", ".truth.json")).read_text())
    report = build_report(path, oom_message=truth["oom_message"])
    dev_report = next(d for d in report["devices"] if d.get("oom"))
    cause = next(c for c in dev_report["diagnosis"]["causes"] if c["id"] == "growing_workload")
    snap = read_snapshot(path)
    dev = next(d for d in snap.devices if len(d.trace))
    steps = find_steps(snap.annotations, dev.device, dev.trace.time_us)
    oom_index = int(dev_report["oom"]["event_index"])
    recorded = AllocatorConfig.from_settings(snap.settings.raw, snap.settings.conf)
    projection = project_failing_step(dev.trace, steps, oom_index, recorded, trace_complete=trace_is_complete(dev))
    assert projection.available
    return snap, dev, steps, projection, dev_report, cause


def _horizon(conf: str, steps: int = 20, path: Path = GPT) -> GrownHorizon:
    snap, dev, found, projection, dev_report, cause = _setup(path)
    return grown_horizon(
        snap, dev, conf, int(dev_report["oom"]["limit_bytes"]), found.last_event.tolist(), projection,
        int(cause["figures"]["growth_per_step_bytes"]), steps, requests=build_requests(snap, dev),
    )  # fmt: skip


def test_the_recorded_settings_die_in_the_failing_step_as_the_run_did() -> None:
    assert _horizon("").dies_in_step == 23 == _died_in("gpt_varlen_oom")


@pytest.mark.parametrize(
    ("conf", "rerun"), [("expandable_segments:True", "expandable"), ("max_split_size_mb:256", "maxsplit256")]
)
def test_a_settings_grown_replay_dies_soon_as_its_real_rerun_did(conf: str, rerun: str) -> None:
    """The grown steps replayed under the setting die one or two steps after the failing one; the real rerun died
    four steps later: both near for a run of 23 steps (no setting saves it), where the perfectly packed estimate
    (step 30) would have said far."""
    horizon = _horizon(conf)
    real = _died_in(f"gpt_varlen_{rerun}")
    assert real == 27
    assert horizon.dies_in_step is not None and 23 < horizon.dies_in_step <= real
    assert horizon_is_near(23, horizon.dies_in_step) and horizon_is_near(23, real)
    packed = 23 + int(_setup()[5]["figures"]["postpone_packed_steps"])
    assert not horizon_is_near(23, packed)  # the perfectly packed estimate would have said "far": wrong


def test_each_grown_step_is_the_failing_steps_transient_part_grown_by_the_measured_rate() -> None:
    _, dev, _, projection, _, cause = _setup()
    assert isinstance(projection, Projection)
    assert projection.tail is not None
    trace = dev.trace
    lifetimes = alloc_lifetimes(trace.action, trace.addr, trace.size, trace.stack)
    assert bool((trace.action == FREE_REQUESTED).any())
    rate = int(cause["figures"]["growth_per_step_bytes"])
    tail, n_tail, n_copy = grown_tail(lifetimes, projection, rate, 3)
    assert len(tail.alloc) == n_tail + 3 * n_copy and n_copy > 0
    peaks = []
    for k in range(3):
        lo = n_tail + k * n_copy
        live, peak = 0, 0
        for is_alloc, size in zip(tail.alloc[lo : lo + n_copy], tail.size[lo : lo + n_copy], strict=True):
            live += size if is_alloc else -size
            peak = max(peak, live)
        assert live == 0  # a grown step frees all it made
        peaks.append(peak)
    steps_up = np.diff(np.array(peaks, np.int64))
    assert (np.abs(steps_up - rate) <= n_copy).all()  # each step's transient peak a rate higher (int rounding)


@pytest.mark.parametrize(
    ("base", "conf", "rerun", "died"),
    [
        ("gpu_grow_oom", "expandable_segments:True", "gpu_expandable_oom", 13),
        ("gpu_grow_oom", "max_split_size_mb:64", "gpu_maxsplit_oom", 13),
        ("captures/gpt_varlen_c70_default", "roundup_power2_divisions:4", "captures/gpt_varlen_c70_roundup4", 23),
    ],
)
def test_where_a_settings_rerun_died_in_the_same_step_so_does_its_grown_replay(
    base: str, conf: str, rerun: str, died: int
) -> None:
    assert _died_in(rerun) == died == _died_in(base)
    assert _horizon(conf, path=FIXTURES / f"{base}.pickle.gz").dies_in_step == died
