"""The policy replay (analysis.allocator) against the real runs' own figures.

Every complete-trace fixture must be reproduced segment event by segment event
from its requests alone, and the what-if replays must agree with the real runs
that used those settings.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.allocator import (
    floor_estimate,
    infer_limit,
    recorded_layout,
    recorded_segment_events,
    replay_check,
    same_layout,
    simulate,
    simulate_layout,
    step_end_indices,
    trace_is_complete,
    whatif,
)
from analysis.allocator.config import AllocatorConfig, ConfigError
from analysis.allocator.requests import requests_for
from analysis.model import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    DeviceData,
    Snapshot,
    Trace,
)
from analysis.reader import read_snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GIB = 1 << 30
CASES = sorted(p.name.removesuffix(".truth.json") for p in FIXTURES.glob("*.truth.json"))


@cache
def snap(case: str) -> Snapshot:
    return read_snapshot(FIXTURES / f"{case}.pickle.gz")


@cache
def truth(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{case}.truth.json").read_text())
    return data


# Recorded with enabled="state" (one event kept); capture.py does not keep that in the truth.
STATE_ONLY = {"state_only"}


def complete(case: str) -> bool:
    """Recorded from process start, with a ring buffer that never wrapped."""
    t = truth(case)
    return case not in STATE_ONLY and all(n < t["max_entries"] for n in t["n_trace_events"])


def device_stats(case: str, device: int) -> dict[str, Any]:
    t = truth(case)
    per = t.get("memory_stats_per_device") or [t["memory_stats"]]
    stats: dict[str, Any] = per[device]
    return stats


def cap_of(case: str) -> int:
    return int(truth(case)["kwargs"].get("cap_gib", 7.0) * GIB)


COMPLETE = [(c, d.device) for c in CASES if complete(c) for d in snap(c).devices if len(d.trace)]
PARTIAL = [c for c in CASES if not complete(c)]


def test_the_fixture_set_is_the_expected_one() -> None:
    # Guards the parametrisation: a renamed fixture must not silently drop out.
    names = {c for c, _ in COMPLETE}
    assert {
        "frag_oom",
        "gpt_varlen_oom",
        "gpt_varlen_expandable",
        "gpt_varlen_maxsplit256",
        "infer_varbatch",
        "two_gpu_pipeline",
        "compiled_train",
        "no_context",
        "big_all_stacks",
        # expandable_segments with max_split_size: requests above max_split_size still split
        "gpu_expandable_maxsplit",
    } <= names
    assert ("two_gpu_pipeline", 1) in COMPLETE
    assert set(PARTIAL) >= {"wrapped_ring", "state_only"}


@pytest.mark.parametrize(("case", "device"), COMPLETE)
def test_replay_reproduces_every_recorded_segment_event(case: str, device: int) -> None:
    s = snap(case)
    dev = s.device(device)
    check = replay_check(s, dev)
    recorded = recorded_segment_events(dev)
    assert check["trace_complete"] is True
    assert check["segment_events_recorded"] == len(recorded)
    assert check["first_mismatch"] is None, check["first_mismatch"]
    assert check["segment_events_reproduced"] == len(recorded)
    assert check["exact"] is True
    # The recorded OOMs (frag_oom has two) fail in the model at the same requests.
    assert check["ooms_reproduced"] is True
    assert check["ooms_recorded"] == np.flatnonzero(dev.trace.action == OOM).tolist()


@pytest.mark.parametrize(("case", "device"), COMPLETE)
def test_replayed_peak_and_final_reserved_equal_the_process_stats(case: str, device: int) -> None:
    check = replay_check(snap(case), device)
    stats = device_stats(case, device)
    assert check["peak_reserved_bytes"] == stats["reserved_bytes.all.peak"]
    if case != "gpu_client_oom":  # its stats were read inside the failing allocation, before the flush
        assert check["final_reserved_bytes"] == stats["reserved_bytes.all.current"]


@pytest.mark.parametrize("case", PARTIAL)
def test_partial_traces_are_never_called_exact(case: str) -> None:
    s = snap(case)
    dev = s.devices[0]
    assert trace_is_complete(dev) is False
    check = replay_check(s, dev)
    assert check["trace_complete"] is False
    assert check["exact"] is False


def test_recorded_settings_are_what_the_runs_used() -> None:
    assert replay_check(snap("gpt_varlen_expandable"), 0)["recorded_config"] == "expandable_segments:True"
    assert replay_check(snap("gpt_varlen_maxsplit256"), 0)["recorded_config"] == "max_split_size_mb:256"
    assert replay_check(snap("gpt_varlen_oom"), 0)["recorded_config"] == ""


# --------------------------------------------------------------------------- the what-if


WHATIF_PAIRS = [
    # (run that hit the OOM, setting, the real run with that setting)
    ("gpt_varlen_oom", "expandable_segments:True", "gpt_varlen_expandable"),
    ("gpt_varlen_oom", "max_split_size_mb:256", "gpt_varlen_maxsplit256"),
    ("gpu_grow_oom", "expandable_segments:True", "gpu_expandable_oom"),
    ("gpu_grow_oom", "max_split_size_mb:64", "gpu_maxsplit_oom"),
]


@pytest.mark.parametrize(("case", "conf", "real"), WHATIF_PAIRS)
def test_whatif_avoids_the_oom_and_predicts_each_steps_reserved_memory(case: str, conf: str, real: str) -> None:
    s = snap(case)
    result = whatif(s, 0, conf, cap_of(case), step_end_indices(s, 0))
    assert result["config"] == conf
    assert result["oom_avoided"] is True
    # The runs share a seed: the same requests up to the original OOM, so every
    # step the original run completed can be compared with the real run's log.
    done = len(truth(case)["workload_log"])
    assert len(result["steps"]) == done
    real_log = truth(real)["workload_log"]
    predicted = [row["reserved_end_bytes"] for row in result["steps"]]
    measured = [row["reserved"] for row in real_log[:done]]
    worst = max(abs(p - m) / m for p, m in zip(predicted, measured, strict=True))
    assert worst <= 0.05
    assert predicted == measured  # in fact exact at every step
    assert [row["index"] for row in result["steps"]] == list(range(done))


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "gpu_grow_oom"])
def test_whatif_of_the_recorded_settings_is_the_run_itself(case: str) -> None:
    s = snap(case)
    ends = step_end_indices(s, 0)
    result = whatif(s, 0, "", cap_of(case), ends)
    assert result["oom_avoided"] is False
    assert result["oom_event_index"] == int(np.flatnonzero(s.devices[0].trace.action == OOM)[-1])
    assert [r["reserved_end_bytes"] for r in result["steps"]] == [r["reserved"] for r in truth(case)["workload_log"]]
    assert result["peak_reserved_bytes"] == truth(case)["memory_stats"]["reserved_bytes.all.peak"]


def test_whatif_keeps_the_recorded_settings_under_the_new_one() -> None:
    # max_split_size_mb:256 was recorded; adding expandable segments keeps it.
    s = snap("gpt_varlen_maxsplit256")
    both = AllocatorConfig.parse("expandable_segments:True,max_split_size_mb:256")
    direct = simulate(s, 0, both, 7 * GIB)
    via = whatif(s, 0, "expandable_segments:True", 7 * GIB, [])
    assert via["peak_reserved_bytes"] == direct.peak_reserved
    assert via["oom_avoided"] is direct.oom_avoided


def test_whatif_without_a_limit_infers_one_and_without_steps_reads_the_annotations() -> None:
    s = snap("gpt_varlen_oom")
    result = whatif(s, 0, "expandable_segments:True")
    assert result["limit_bytes"] == infer_limit(s, 0).value
    assert len(result["steps"]) == 23
    assert result["oom_avoided"] is True


def test_a_trace_without_an_oom_has_no_oom_avoided() -> None:
    result = whatif(snap("compiled_train"), 0, "expandable_segments:True")
    assert result["oom_avoided"] is None
    # No cap shown: the what-if runs in the memory the recorded run reached.
    assert result["limit_bytes"] == truth("compiled_train")["memory_stats"]["reserved_bytes.all.peak"]
    assert result["peak_reserved_bytes"] <= result["limit_bytes"]
    assert len(result["steps"]) == len(truth("compiled_train")["workload_log"])


def test_max_split_whatif_without_a_cap_stays_within_the_recorded_memory() -> None:
    # Unlimited, oversize segments would only pile up; the default limit makes the model flush.
    s = snap("infer_varbatch")
    peak = truth("infer_varbatch")["memory_stats"]["reserved_bytes.all.peak"]
    unlimited = simulate(s, 0, AllocatorConfig.parse("max_split_size_mb:256"), None)
    assert unlimited.peak_reserved > peak
    result = whatif(s, 0, "max_split_size_mb:256")
    assert result["limit_bytes"] == peak
    assert result["peak_reserved_bytes"] <= peak


def test_a_tighter_limit_fails_earlier_and_the_replay_goes_on() -> None:
    s = snap("gpt_varlen_oom")
    cfg = AllocatorConfig()
    result = simulate(s, 0, cfg, 5 * GIB)
    assert result.oom is not None
    assert result.oom < int(np.flatnonzero(s.devices[0].trace.action == OOM)[0])
    assert result.oom_avoided is False
    assert len(result.ooms) > 1  # it continued past the first failure
    assert result.peak_reserved <= 5 * GIB


def test_reserved_column_follows_the_segment_events() -> None:
    s = snap("gpt_varlen_expandable")
    dev = s.devices[0]
    check = replay_check(s, dev)
    result = simulate(s, dev, AllocatorConfig.parse("expandable_segments:True"), check["limit_bytes"])
    column = result.reserved_per_event()
    assert column.shape == (len(dev.trace),)
    assert int(column.max()) == result.peak_reserved
    assert int(column[-1]) == result.final_reserved
    ends = step_end_indices(s, dev)
    assert result.reserved_at(ends) == [int(column[i]) for i in ends]
    assert result.reserved_at([-1]) == [0]


# --------------------------------------------------------------------------- the limit


@pytest.mark.parametrize(
    "case",
    [
        "frag_oom",
        "gpt_varlen_oom",
        "gpt_varlen_expandable",
        "gpt_varlen_maxsplit256",
        "gpu_grow_oom",
        "gpu_expandable_oom",
        "gpu_maxsplit_oom",
    ],
)
def test_inferred_limit_interval_holds_the_real_cap(case: str) -> None:
    est = infer_limit(snap(case), 0)
    s = snap(case)
    floor = floor_estimate(s, 0, AllocatorConfig.from_settings(s.settings.raw, s.settings.conf))
    assert (floor.lower, floor.device_full) == (est.lower, est.device_full)
    cap = int(truth(case)["kwargs"].get("cap_gib", 4.0 if case == "frag_oom" else 7.0) * GIB)
    assert est.upper is not None
    assert est.lower <= cap <= est.upper
    assert est.device_full is None  # the cap bound, not the 140 GB device
    assert est.binding


def test_gc_runs_bound_the_limit_from_above() -> None:
    est = infer_limit(snap("gpu_gc_threshold"), 0)
    cap = cap_of("gpu_gc_threshold")
    assert est.upper is None  # no refusal: only the GC says a cap was set
    assert est.gc_upper is not None
    assert est.lower <= cap <= est.gc_upper
    assert est.gc_upper - cap < 8 * (1 << 20)


def test_a_run_that_never_met_its_limit_replays_unlimited() -> None:
    est = infer_limit(snap("infer_varbatch"), 0)
    assert est.upper is None and est.gc_upper is None
    assert est.value is None
    assert est.lower == truth("infer_varbatch")["memory_stats"]["reserved_bytes.all.peak"]


# --------------------------------------------------------------------------- steps


def test_step_ends_are_the_last_event_of_each_optimizer_step() -> None:
    s = snap("gpt_varlen_oom")
    ends = step_end_indices(s, 0)
    assert len(ends) == 23
    times = s.devices[0].trace.time_us
    step_end_times = sorted(
        a.time_us for a in s.annotations if a.stage == "END" and a.name.startswith("Optimizer.step#")
    )
    for i, t_end in zip(ends, step_end_times, strict=True):
        assert times[i] <= t_end
        assert i + 1 == len(times) or times[i + 1] > t_end


def test_both_devices_of_one_process_replay_every_step() -> None:
    s = snap("two_gpu_pipeline")
    log = truth("two_gpu_pipeline")["workload_log"]
    for device in (0, 1):
        result = whatif(s, device, "", None, step_end_indices(s, device))
        assert [r["reserved_end_bytes"] for r in result["steps"]] == [row["reserved"][device] for row in log]


def test_user_empty_cache_calls_are_replayed_where_they_happened() -> None:
    s = snap("gpu_empty_cache")
    dev = s.devices[0]
    log = truth("gpu_empty_cache")["workload_log"]
    emptied = [row for row in log if row.get("empty_cache")]
    assert len(emptied) == 4
    ends = step_end_indices(s, dev)
    for cfg in (AllocatorConfig(), AllocatorConfig.parse("expandable_segments:True")):
        result = simulate(s, dev, cfg, None, ends)
        # One flush per call, right after the step it followed (none of the model's own).
        assert len(result.flushes) == 4
        assert [bisect_right(ends, f) for f in result.flushes] == [row["step"] + 1 for row in emptied]
    recorded = simulate(s, dev, AllocatorConfig(), None, ends)
    after = recorded.reserved_at(recorded.flushes)
    assert after == [row["reserved_after_empty_cache"] for row in emptied]
    assert recorded.step_reserved == [row["reserved"] for row in log]


def test_gc_threshold_replays_exactly_under_the_real_cap() -> None:
    # The GC only runs with a cap; at the run's real 4.5 GiB it frees the same segments.
    s = snap("gpu_gc_threshold")
    dev = s.devices[0]
    cfg = AllocatorConfig.from_settings(s.settings.raw, s.settings.conf)
    assert cfg.garbage_collection_threshold == pytest.approx(0.6)
    result = simulate(s, dev, cfg, cap_of("gpu_gc_threshold"), step_end_indices(s, dev))
    assert result.segment_events == recorded_segment_events(dev)
    assert result.step_reserved == [row["reserved"] for row in truth("gpu_gc_threshold")["workload_log"]]
    # Without a cap the threshold does nothing: no segment is ever freed.
    unlimited = simulate(s, dev, cfg, None)
    assert not any(action == "segment_free" for action, _ in unlimited.segment_events)


def test_an_oom_on_a_full_device_sets_the_limit_to_what_was_free() -> None:
    # Same trace, but as if the GPU itself had run out: cudaMemGetInfo's free memory
    # (the oom entry's device_free) below the segment the request needed.
    s = snap("gpt_varlen_oom")
    dev = s.devices[0]
    t = dev.trace
    i = int(np.flatnonzero(t.action == OOM)[-1])
    saved = int(t.addr[i])
    reserved_at_oom = replay_check(s, dev)["final_reserved_bytes"]
    try:
        t.addr[i] = 300 << 20
        est = infer_limit(s, dev)
        assert est.device_full == reserved_at_oom + (300 << 20)
        assert est.value == max(est.device_full, est.lower)
        assert est.stated() == (est.value, "device-full")
        # What the report states comes from infer_limit's bounds from below alone: the same figures.
        floor = floor_estimate(s, dev, AllocatorConfig.from_settings(s.settings.raw, s.settings.conf))
        assert (floor.lower, floor.device_full, floor.stated()) == (est.lower, est.device_full, est.stated())
        # The boundary: cudaMalloc of the segment (the request's allocation size) fails only when the
        # device has less free than that segment; exactly enough free means a cap refused it.
        need = AllocatorConfig.from_settings(s.settings.raw, s.settings.conf).allocation_size(int(t.size[i]))
        t.addr[i] = need
        assert infer_limit(s, dev).device_full is None
        t.addr[i] = need - 1
        assert infer_limit(s, dev).device_full == reserved_at_oom + need - 1
    finally:
        t.addr[i] = saved
    assert infer_limit(s, dev).device_full is None


def test_whatif_refuses_a_setting_torch_would_refuse() -> None:
    with pytest.raises(ConfigError):
        whatif(snap("gpt_varlen_oom"), 0, "max_split_size_mb:10", 7 * GIB, [])


@pytest.mark.parametrize("case", PARTIAL)
def test_partial_traces_start_from_the_recorded_state_before_the_window(case: str) -> None:
    # Seeded from replay's reconstruction of the state before the first event,
    # the replay ends where the process was, instead of from an empty cache.
    s = snap(case)
    result = simulate(s, 0, AllocatorConfig(), None, step_end_indices(s, 0))
    stats = device_stats(case, 0)
    assert result.final_reserved == stats["reserved_bytes.all.current"]
    assert result.reserved_at([-1]) == [stats["reserved_bytes.all.current"]]  # no segment event in the window
    assert result.segment_events == []
    log = truth(case)["workload_log"]
    assert result.step_reserved == [row["reserved"] for row in log[len(log) - len(result.step_reserved) :]]
    assert whatif(s, 0, "expandable_segments:True")["limit_bytes"] == stats["reserved_bytes.all.current"]


@pytest.mark.parametrize("case", ["frag_oom", "gpu_side_stream", "gpu_cuda_graph", "gpu_empty_cache", "wrapped_ring"])
@pytest.mark.parametrize(
    "conf",
    [
        "expandable_segments:True,max_split_size_mb:64",
        "expandable_segments:True,garbage_collection_threshold:0.7",
        "max_split_size_mb:20,max_non_split_rounding_mb:40,garbage_collection_threshold:0.5",
        "roundup_power2_divisions:[1:2,64:8,>:4],large_segment_size_mb:64",
    ],
)
def test_any_setting_stays_within_the_limit(case: str, conf: str) -> None:
    # Paths the real runs do not combine: the model must keep its books and its limit.
    s = snap(case)
    cfg = AllocatorConfig.parse(conf)
    peak = infer_limit(s, 0).lower
    for limit in (peak // 2, int(peak * 0.8), peak):
        result = simulate(s, 0, cfg, limit)
        column = result.reserved_per_event()
        assert int(column.min()) >= 0
        assert int(column.max()) <= result.peak_reserved
        # Only whole expandable pages may end above the limit (alloc_size is what is checked).
        slack = cfg.large_segment_size if cfg.expandable_segments else 0
        assert result.peak_reserved <= max(limit + slack, result.reserved_at([-1])[0])
        assert all(size > 0 for _, size in result.segment_events)


@pytest.mark.parametrize("case", ["gpu_empty_cache", "gpu_cuda_graph", "gpt_varlen_oom", "gpu_gc_threshold"])
@pytest.mark.parametrize("context", ["alloc", "none"])
def test_flushes_are_told_apart_without_the_empty_cache_frame(case: str, context: str) -> None:
    # With context="alloc" a released segment carries the stack that created it, and
    # without context none at all: user flushes must still be found from the cache
    # state (a malloc flushes only after missing), and the replay stays exact.
    s = read_snapshot(FIXTURES / f"{case}.pickle.gz")  # a private copy: its stacks get rewritten
    t = s.devices[0].trace
    if context == "none":
        t.stack[:] = -1
    else:
        creator: dict[int, int] = {}
        for i in np.flatnonzero(np.isin(t.action, [SEGMENT_ALLOC, SEGMENT_FREE])).tolist():
            if t.action[i] == SEGMENT_ALLOC:
                creator[int(t.addr[i])] = int(t.stack[i])
            else:
                t.stack[i] = creator.pop(int(t.addr[i]), -1)
    check = replay_check(s, 0)
    assert check["exact"] is True
    assert check["peak_reserved_bytes"] == truth(case)["memory_stats"]["reserved_bytes.all.peak"]


@pytest.mark.parametrize("dropped", [FREE_COMPLETED, FREE_REQUESTED])
def test_a_trace_recorded_with_skip_actions_on_one_free_kind_still_replays(dropped: int) -> None:
    # torch 2.10+ skip_actions can leave out free_completed (or free_requested) entirely.
    s = snap("gpt_varlen_oom")
    dev = s.devices[0]
    t = dev.trace
    keep = t.action != dropped
    columns = (t.action, t.addr, t.size, t.stream, t.time_us, t.stack, t.pool)
    thinned = DeviceData(dev.device, Trace(*(c[keep] for c in columns)), dev.segments, dev.streams)
    check = replay_check(s, thinned)
    assert check["trace_complete"] is True
    assert check["exact"] is True
    assert check["peak_reserved_bytes"] == truth("gpt_varlen_oom")["memory_stats"]["reserved_bytes.all.peak"]


# --------------------------------------------------------------------------- one home for the rules


@pytest.mark.parametrize(("case", "device"), COMPLETE)
def test_final_block_layout_equals_the_snapshots_segments(case: str, device: int) -> None:
    # Under the recorded settings every segment ends with the recorded blocks, in
    # order, with their states (allocated / pending free / free): not only the
    # segment events but where each request went.
    s = snap(case)
    cfg = AllocatorConfig.from_settings(s.settings.raw, s.settings.conf)
    dev = s.device(device)
    _result, layout = simulate_layout(s, dev, cfg, infer_limit(s, dev, cfg).value)
    recorded = recorded_layout(dev)
    assert same_layout(layout, recorded)
    assert sum(seg.total_size for seg in recorded) == device_stats(case, device)["reserved_bytes.all.current"]


REFERENCE_CONFIGS = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:64",
    "garbage_collection_threshold:0.5",
    "roundup_power2_divisions:[256:1,512:2,>:8]",
    "expandable_segments:True,max_split_size_mb:64",
]


@pytest.mark.parametrize("conf", REFERENCE_CONFIGS)
@pytest.mark.parametrize(
    "case", ["frag_oom", "gpu_side_stream", "gpu_cuda_graph", "gpu_gc_threshold", "gpu_grow_oom", "wrapped_ring"]
)
def test_the_fast_loop_does_what_the_rule_methods_do(case: str, conf: str) -> None:
    # _Model.run inlines get_free_block's filter, should_split and free_block's
    # merge for speed; run_reference calls the methods built on analysis.allocator.config.
    # Same segment events, same OOMs, same final layout, under a limit that bites.
    s = snap(case)
    base = AllocatorConfig.from_settings(s.settings.raw, s.settings.conf)
    cfg = AllocatorConfig.parse(conf, base=base)
    limit = int(infer_limit(s, 0, base).lower * 0.9)
    fast, fast_layout = simulate_layout(s, 0, cfg, limit)
    ref, ref_layout = simulate_layout(s, 0, cfg, limit, reference=True)
    assert fast.segment_events == ref.segment_events
    assert fast.ooms == ref.ooms
    assert fast.peak_reserved == ref.peak_reserved
    assert fast_layout == ref_layout


def test_requests_are_built_once_and_passed() -> None:
    from analysis.allocator import build_requests, requests_for

    s = snap("gpu_grow_oom")
    req = build_requests(s, 0)
    cfg = AllocatorConfig.parse("expandable_segments:True")
    passed = simulate(s, 0, cfg, cap_of("gpu_grow_oom"), requests=req)
    built = simulate(s, 0, cfg, cap_of("gpu_grow_oom"))
    assert passed.segment_events == built.segment_events
    assert replay_check(s, 0, requests=req) == replay_check(s, 0)
    # The memo matches the live trace itself: a re-read of the same file is another
    # trace and gets its own requests (an id() reused after a free cannot alias).
    again = read_snapshot(FIXTURES / "gpu_grow_oom.pickle.gz")
    assert requests_for(again, 0) is not requests_for(s, 0)
    assert requests_for(s, 0) is requests_for(s, 0)


def _from(snapshot: Snapshot, start: int) -> Snapshot:
    """The snapshot as a wrapped ring buffer would hold it: device 0's trace from event ``start`` on."""
    dev = snapshot.devices[0]
    t = dev.trace
    trace = replace(t, **{f: getattr(t, f)[start:] for f in t.__dataclass_fields__})
    return replace(snapshot, devices=[replace(dev, trace=trace), *snapshot.devices[1:]])


def test_a_wrapped_cuda_graph_trace_keeps_its_private_pool_from_the_first_event() -> None:
    # gpu_cuda_graph from event 99 on: the graph's private-pool segments (pool 1 in the final segments)
    # were made before the first kept event. Read as the default pool, a free of a block in one of them
    # looked for its free neighbour in the default pool's free list and the replay failed (IndexError),
    # from 223 of 244 such cuts. The pool of a segment the trace never makes holds from its start.
    full = read_snapshot(FIXTURES / "gpu_cuda_graph.pickle.gz")
    graph_segments = [seg for seg in full.devices[0].segments if seg.pool != 0]
    assert graph_segments
    for start in (99, 500, 1000):
        s = _from(full, start)
        dev = s.devices[0]
        req = requests_for(s, dev)
        t = dev.trace
        inside = np.zeros(len(t), bool)
        for seg in graph_segments:
            inside |= (t.addr >= seg.address) & (t.addr < seg.address + seg.total_size)
        blocks = inside & np.isin(t.action, (ALLOC, FREE_REQUESTED, FREE_COMPLETED))
        assert blocks.any() and (req.pools[blocks] != 0).all()
        check = replay_check(s, dev)
        assert not check["exact"] and not check["trace_complete"]  # a cut trace is never called exact
        for conf in ("expandable_segments:True", "max_split_size_mb:256"):
            assert whatif(s, dev, conf)["peak_reserved_bytes"] > 0


def test_reserved_at_without_any_segment_event_is_zero() -> None:
    # A replay whose model made and seeded no segment (no change recorded): nothing is reserved at any event.
    s = read_snapshot(FIXTURES / "frag_oom.pickle.gz")
    result = simulate(s, 0, AllocatorConfig())
    empty = replace(result, change_index=np.zeros(0, np.int64), change_reserved=np.zeros(0, np.int64))
    assert empty.reserved_at([-1, 0, 5]) == [0, 0, 0]
    assert empty.reserved_per_event().tolist() == [0] * result.events


def test_without_a_per_process_cap_the_gc_threshold_never_acts() -> None:
    # torch runs garbage_collect_cached_blocks only when set_fraction is set
    # (set_per_process_memory_fraction was called); on a device that fills up by itself the
    # threshold is read and ignored. gpu_gc_threshold ran under a 4.5 GiB fraction, GC 0.6.
    s = read_snapshot(FIXTURES / "gpu_gc_threshold.pickle.gz")
    cfg = AllocatorConfig.from_settings(s.settings.raw, s.settings.conf)
    assert cfg.garbage_collection_threshold == 0.6
    assert cfg.acting(True) is cfg and cfg.acting(False).garbage_collection_threshold == 0.0
    assert AllocatorConfig().acting(False) == AllocatorConfig()
    cap = int(4.5 * (1 << 30))
    gc = simulate(s, 0, cfg, cap)
    no_gc = simulate(s, 0, cfg.acting(False), cap)
    assert gc.segment_events == recorded_segment_events(s.devices[0])  # the GC's releases, as recorded
    assert no_gc.segment_events != gc.segment_events
    ends = step_end_indices(s, 0)
    # A what-if of other settings places new segments by the driver's rule from the start (issue 23).
    plain = simulate(
        s, 0, AllocatorConfig.parse("max_split_size_mb:64", base=cfg.acting(False)), cap, ends, placement="driver"
    )
    with_gc = simulate(s, 0, AllocatorConfig.parse("max_split_size_mb:64", base=cfg), cap, ends, placement="driver")
    uncapped = whatif(s, 0, "max_split_size_mb:64", cap, ends, capped=False)
    assert uncapped["config"] == "max_split_size_mb:64" and uncapped["peak_reserved_bytes"] == plain.peak_reserved
    assert [x["reserved_end_bytes"] for x in uncapped["steps"]] == plain.step_reserved != with_gc.step_reserved
    assert [x["reserved_end_bytes"] for x in whatif(s, 0, "max_split_size_mb:64", cap, ends)["steps"]] == (
        with_gc.step_reserved
    )


def test_recorded_reserved_is_kept_for_its_columns_and_matches_the_process_peak() -> None:
    from analysis.allocator.reserved import recorded_reserved

    dev = snap("gpt_varlen_oom").device(0)
    reserved = recorded_reserved(dev)
    assert int(reserved.max()) == device_stats("gpt_varlen_oom", 0)["reserved_bytes.all.peak"]
    assert recorded_reserved(dev) is reserved  # asked again (seven times a report): the same answer
    with pytest.raises(ValueError, match="read-only"):
        reserved[0] = 1  # shared between threads: read-only
    # Other columns (a trace cut short, as replays of a window build): answered from them, not the memo.
    cut = replace(dev, trace=replace(dev.trace, action=dev.trace.action[:100], size=dev.trace.size[:100]))
    assert np.array_equal(recorded_reserved(cut), reserved[:100])
    assert recorded_reserved(dev) is not reserved and np.array_equal(recorded_reserved(dev), reserved)
