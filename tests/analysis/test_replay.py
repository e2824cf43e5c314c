"""The recorded replay against what the processes reported about themselves.

Every fixture with a truth file is covered: its ``memory_stats()`` at dump time
are the oracle for the replay's peaks and final figures, and its ``segments`` for
the replay's end state, block by block.
"""

from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import analysis.report as report_module
import analysis.stages.source as source_stage
from analysis.allocator import compiled
from analysis.allocator.config import AllocatorConfig
from analysis.allocator.recorded import RecordedReplay, recorded_replay
from analysis.allocator.replayer import _Replayer
from analysis.allocator.states import AllocatorState, BlockState, SegmentState
from analysis.errors import SnapshotError
from analysis.model import (
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    INACTIVE,
    DeviceData,
    Snapshot,
    Trace,
)
from analysis.reader import read_snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = sorted(
    p.name.removesuffix(".pickle.gz")
    for p in FIXTURES.glob("*.pickle.gz")
    if (FIXTURES / p.name.replace(".pickle.gz", ".truth.json")).exists()
)
INCOMPLETE_CODES = {"trace-truncated", "history-started-late", "state-only"}


@cache
def _snapshot(case: str) -> Snapshot:
    return read_snapshot(FIXTURES / f"{case}.pickle.gz")


@cache
def _truth(case: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{case}.truth.json").read_text())


@cache
def _replay(case: str, device: int) -> RecordedReplay:
    snap = _snapshot(case)
    return recorded_replay(snap, snap.device(device))


def _stats(case: str, device: int) -> dict[str, int]:
    truth = _truth(case)
    per_device = truth.get("memory_stats_per_device")
    return per_device[device] if per_device else truth["memory_stats"]


def _is_complete(case: str) -> bool:
    """History recorded from process start and the ring never filled (capture.py's facts)."""
    truth = _truth(case)
    counts = truth["n_trace_events"]
    counts = counts if isinstance(counts, list) else [counts]
    max_entries = truth.get("kwargs", {}).get("max_entries") or truth.get("max_entries")
    enabled = truth.get("kwargs", {}).get("enabled", "all")
    return enabled == "all" and all(1 < c < max_entries for c in counts)


def _device_cases(complete: bool) -> list[tuple[str, int]]:
    out = []
    for case in CASES:
        if _is_complete(case) != complete:
            continue
        out.extend((case, d.device) for d in _snapshot(case).devices)
    return out


COMPLETE = _device_cases(complete=True)
INCOMPLETE = _device_cases(complete=False)


def _shape(state: AllocatorState) -> list[tuple[int, int, list[tuple[int, int, str]]]]:
    return [(s.address, s.total_size, [(b.address, b.size, b.state) for b in s.blocks]) for s in state.segments]


def _final_shape(device: DeviceData) -> list[tuple[int, int, list[tuple[int, int, str]]]]:
    return [
        (s.address, s.total_size, [(b.address, b.size, b.state) for b in s.blocks])
        for s in sorted(device.segments, key=lambda s: s.address)
    ]


def test_fixture_sets_are_what_the_snapshots_readme_says() -> None:
    incomplete = {case for case, _ in INCOMPLETE}
    complete = {case for case, _ in COMPLETE}
    assert {"wrapped_ring", "state_only"} <= incomplete
    assert {"frag_oom", "gpt_varlen_oom", "gpt_varlen_expandable", "two_gpu_pipeline", "big_all_stacks"} <= complete


# -- complete traces: every figure to the byte --------------------------------------


@pytest.mark.parametrize(("case", "device"), COMPLETE)
def test_peaks_and_finals_equal_memory_stats(case: str, device: int) -> None:
    r = _replay(case, device)
    ms = _stats(case, device)
    assert r.trace_complete
    assert r.warnings == []
    assert r.peak_allocated == ms["allocated_bytes.all.peak"]
    assert r.peak_requested == ms["requested_bytes.all.peak"]
    assert r.peak_reserved == ms["reserved_bytes.all.peak"]
    assert r.final.allocated == ms["allocated_bytes.all.current"]
    assert r.final.requested == ms["requested_bytes.all.current"]
    assert r.final.reserved == ms["reserved_bytes.all.current"]


@pytest.mark.parametrize(("case", "device"), COMPLETE)
def test_active_and_inactive_split_equal_memory_stats(case: str, device: int) -> None:
    # active_bytes falls at free_completed, allocated_bytes at free_requested: the
    # two differ only where record_stream deferred frees (gpu_side_stream).
    r = _replay(case, device)
    ms = _stats(case, device)
    assert int(r.active.max()) == ms["active_bytes.all.peak"]
    assert r.final.active == ms["active_bytes.all.current"]
    assert int(r.inactive_split.max()) == ms["inactive_split_bytes.all.peak"]
    assert r.final.inactive_split == ms["inactive_split_bytes.all.current"]


@pytest.mark.parametrize(("case", "device"), COMPLETE)
def test_end_state_equals_final_segments(case: str, device: int) -> None:
    r = _replay(case, device)
    dev = _snapshot(case).device(device)
    assert _shape(r.blocks_at(r.events - 1)) == _final_shape(dev)


@pytest.mark.parametrize(("case", "device"), COMPLETE)
def test_peak_indices_hold_the_peaks(case: str, device: int) -> None:
    r = _replay(case, device)
    assert r.allocated[r.peak_allocated_index] == r.peak_allocated
    assert r.reserved[r.peak_reserved_index] == r.peak_reserved
    assert r.requested[r.peak_requested_index] == r.peak_requested
    assert r.initial.reserved == r.initial.allocated == 0
    assert r.blocks_at(-1).segments == ()


# -- incomplete traces: lower bounds, and said so ----------------------------------------


@pytest.mark.parametrize(("case", "device"), INCOMPLETE)
def test_incomplete_trace_is_flagged_with_a_reason(case: str, device: int) -> None:
    r = _replay(case, device)
    assert not r.trace_complete
    codes = {w.code for w in r.warnings}
    assert codes & INCOMPLETE_CODES
    if case == "wrapped_ring":
        assert "trace-truncated" in codes
    if case == "state_only":
        assert "state-only" in codes


@pytest.mark.parametrize(("case", "device"), INCOMPLETE)
def test_incomplete_trace_peaks_are_lower_bounds_and_finals_exact(case: str, device: int) -> None:
    r = _replay(case, device)
    ms = _stats(case, device)
    assert r.peak_allocated <= ms["allocated_bytes.all.peak"]
    assert r.peak_requested <= ms["requested_bytes.all.peak"]
    assert r.peak_reserved <= ms["reserved_bytes.all.peak"]
    assert r.final.allocated == ms["allocated_bytes.all.current"]
    assert r.final.requested == ms["requested_bytes.all.current"]
    assert r.final.reserved == ms["reserved_bytes.all.current"]
    assert _shape(r.blocks_at(r.events - 1)) == _final_shape(_snapshot(case).device(device))


def test_wrapped_ring_starts_from_a_rebuilt_state() -> None:
    r = _replay("wrapped_ring", 0)
    start = r.blocks_at(-1)
    # The ring kept the last 5000 events of a 20-step run: the cache was full then.
    assert r.initial.reserved > 0 and r.initial.allocated > 0
    assert start.figures() == r.initial
    assert r.peak_allocated >= r.initial.allocated
    assert not any(w.code == "replay-end-mismatch" for w in r.warnings)


def _cut(device: DeviceData, start: int) -> DeviceData:
    t = device.trace
    trace = Trace(*(getattr(t, f)[start:] for f in ("action", "addr", "size", "stream", "time_us", "stack", "pool")))
    return replace(device, trace=trace)


@pytest.mark.parametrize(
    ("case", "fraction"),
    [("gpt_varlen_oom", 0.37), ("gpt_varlen_expandable", 0.61), ("gpu_side_stream", 0.5), ("infer_varbatch", 0.8)],
)
def test_history_started_late_is_rebuilt_from_the_final_segments(case: str, fraction: float) -> None:
    """Dropping the head of a complete trace looks like a late start; the end still fits."""
    if case not in CASES:
        pytest.skip(f"{case} is not among the fixtures")
    snap = _snapshot(case)
    full = _replay(case, 0)
    start = int(full.events * fraction)
    r = recorded_replay(snap, _cut(snap.device(0), start))
    assert not r.trace_complete
    assert {w.code for w in r.warnings} & {"history-started-late", "trace-truncated"}
    assert r.final.allocated == full.final.allocated
    assert r.final.requested == full.final.requested
    assert r.final.reserved == full.final.reserved
    # Reserved memory needs no block sizes: the rebuilt start is exact there.
    assert r.initial.reserved == full.reserved[start - 1]
    assert r.initial.requested == full.requested[start - 1]
    np.testing.assert_array_equal(r.reserved, full.reserved[start:])
    assert r.peak_allocated <= full.peak_allocated
    assert _shape(r.blocks_at(r.events - 1)) == _final_shape(snap.device(0))


# -- the columns agree with the block-level state ---------------------------------------


def _check_figures(r: RecordedReplay, index: int) -> None:
    f = r.blocks_at(index).figures()
    got = (
        r.allocated[index],
        r.requested[index],
        r.reserved[index],
        r.active[index],
        r.cached_free[index],
        r.inactive_split[index],
        r.largest_free[index],
    )
    want = (f.allocated, f.requested, f.reserved, f.active, f.cached_free, f.inactive_split, f.largest_free)
    assert tuple(int(x) for x in got) == want, index


@pytest.mark.parametrize(
    "case", ["gpt_varlen_expandable", "gpu_side_stream", "gpu_cuda_graph", "frag_oom", "wrapped_ring", "gpu_roundup"]
)
def test_columns_match_the_blocks_kept_at_sampled_events(case: str) -> None:
    if case not in CASES:
        pytest.skip(f"{case} is not among the fixtures")
    snap = _snapshot(case)
    dev = snap.device(0)
    n = len(dev.trace)
    rng = np.random.default_rng(7)
    picks = sorted({*rng.integers(0, n, 12).tolist(), int(np.argmax(_replay(case, 0).allocated))})
    r = recorded_replay(snap, dev, keep_at=picks)
    for k in picks:
        assert k in r._states  # kept during the pass, no replay again
        _check_figures(r, k)
    # An index not kept is replayed on demand and agrees with the pass.
    other = (picks[0] + 1) % n
    _check_figures(r, other)


def test_kept_state_equals_state_replayed_on_demand() -> None:
    snap = _snapshot("gpt_varlen_oom")
    dev = snap.device(0)
    k = 12345
    kept = recorded_replay(snap, dev, keep_at=[k]).blocks_at(k)
    again = recorded_replay(snap, dev).blocks_at(k)
    assert kept == again
    assert kept.index == k


def test_pending_frees_stay_active_until_completed() -> None:
    """record_stream on a side stream: the block is pending between the two events."""
    snap = _snapshot("gpu_side_stream")
    dev = snap.device(0)
    t = dev.trace
    fr = np.nonzero(t.action == FREE_REQUESTED)[0]
    late = [int(i) for i in fr if not (t.action[i + 1] == FREE_COMPLETED and t.addr[i + 1] == t.addr[i])]
    assert late, "the fixture defers frees"
    i = late[0]
    r = recorded_replay(snap, dev, keep_at=[i])
    blocks = {b.address: b for _, b in r.blocks_at(i).live_blocks()}
    block = blocks[int(t.addr[i])]
    assert block.state == ACTIVE_PENDING_FREE
    assert r.allocated[i] == r.allocated[i - 1] - block.size
    assert r.active[i] == r.active[i - 1]
    assert r.requested[i] == r.requested[i - 1]


@pytest.mark.parametrize(("case", "device"), COMPLETE)
def test_live_blocks_carry_the_stack_of_their_alloc(case: str, device: int) -> None:
    r = _replay(case, device)
    dev = _snapshot(case).device(device)
    final = {b.address: b.stack for s in dev.segments for b in s.blocks if b.state != INACTIVE}
    live = list(r.blocks_at(r.events - 1).live_blocks())
    assert len(live) == len(final)
    for _, block in live:
        assert block.stack == final[block.address]
        assert block.alloc_index >= 0
        assert dev.trace.addr[block.alloc_index] == block.address


def test_private_pool_segments_keep_their_pool() -> None:
    if "gpu_cuda_graph" not in CASES:
        pytest.skip("gpu_cuda_graph is not among the fixtures")
    snap = _snapshot("gpu_cuda_graph")
    r = _replay("gpu_cuda_graph", 0)
    got = sorted((s.address, s.pool, s.segment_type) for s in r.blocks_at(r.events - 1).segments)
    want = sorted((s.address, s.pool, s.segment_type) for s in snap.device(0).segments)
    assert got == want
    assert any(pool != 0 for _, pool, _ in got)


def test_state_between_a_free_request_and_its_completion_is_kept_exactly() -> None:
    """The fast pass visits most request/complete pairs once, but never across a kept index."""
    snap = _snapshot("gpt_varlen_oom")
    dev = snap.device(0)
    t = dev.trace
    picks = np.nonzero(t.action == FREE_REQUESTED)[0][100:104].tolist()
    r = recorded_replay(snap, dev, keep_at=picks)
    for i in picks:
        assert t.action[i + 1] == FREE_COMPLETED and t.addr[i + 1] == t.addr[i]
        block = {b.address: b for _, b in r.blocks_at(i).live_blocks()}[int(t.addr[i])]
        assert block.state == ACTIVE_PENDING_FREE
        assert r.allocated[i] == r.allocated[i - 1] - block.size
        assert r.active[i] == r.active[i - 1] == r.active[i + 1] + block.size
        assert r.blocks_at(i) == r._replayer.state_after(i)


def test_no_events_gives_the_final_state() -> None:
    snap = _snapshot("no_context")
    dev = snap.device(0)
    r = recorded_replay(snap, _cut(dev, len(dev.trace)))
    ms = _stats("no_context", 0)
    assert r.events == 0
    assert not r.trace_complete
    assert [w.code for w in r.warnings] == ["state-only"]
    assert r.final.allocated == r.peak_allocated == ms["allocated_bytes.all.current"]
    assert r.final.reserved == r.peak_reserved == ms["reserved_bytes.all.current"]
    assert r.peak_reserved_index == -1
    assert _shape(r.blocks_at(-1)) == _final_shape(dev)


@pytest.mark.parametrize(
    "case", ["gpu_side_stream", "gpu_expandable_oom", "gpu_cuda_graph", "frag_oom", "gpu_gc_threshold", "wrapped_ring"]
)
def test_every_column_matches_the_block_state_at_every_event(case: str) -> None:
    """largest_free and inactive_split are tracked sparsely: check them everywhere
    (every event of traces up to 4000 events, every other one of longer ones)."""
    if case not in CASES:
        pytest.skip(f"{case} is not among the fixtures")
    snap = _snapshot(case)
    dev = snap.device(0)
    n = len(dev.trace)
    # Keeping every state stops the fast pass from fusing frees: the columns checked
    # are those of the ordinary (fused) pass.
    events = range(0, n, max(1, n // 2000))
    kept = recorded_replay(snap, dev, keep_at=events)
    r = _replay(case, 0)
    want = np.array(
        [
            (f.allocated, f.requested, f.reserved, f.active, f.cached_free, f.inactive_split, f.largest_free)
            for f in (kept.blocks_at(k).figures() for k in events)
        ],
        dtype=np.int64,
    )
    cols = (r.allocated, r.requested, r.reserved, r.active, r.cached_free, r.inactive_split, r.largest_free)
    got = np.stack([c[events.start : events.stop : events.step] for c in cols], axis=1)
    bad = np.nonzero((got != want).any(axis=1))[0]
    assert bad.size == 0, f"first differing event {bad[:1]}"


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "gpu_side_stream", "gpu_cuda_graph", "wrapped_ring"])
def test_the_inlined_plain_rounding_is_round_size(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The replay loop inlines round_size when the settings round plainly; with
    # the inline switched off it calls AllocatorConfig.round_size for every alloc.
    # Both must give every block the same size.
    from analysis.allocator.config import AllocatorConfig

    snap = _snapshot(case)
    fast = recorded_replay(snap, snap.devices[0])
    monkeypatch.setattr(AllocatorConfig, "rounds_plainly", property(lambda self: False))
    slow = recorded_replay(snap, snap.devices[0])
    for column in ("allocated", "active", "inactive_split", "largest_free"):
        assert np.array_equal(getattr(fast, column), getattr(slow, column)), column


# -- repairs of an incomplete trace (_Replayer._alloc_slow), hand-built ------------------------

SEG = 1 << 32  # a segment's address in the hand-built states
MiB = 1 << 20


@pytest.fixture(params=["python", "compiled"])
def loops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The repair tests run on both loops: the Python reference and the C state (compiled)."""
    if request.param == "compiled" and not compiled.available():
        pytest.skip("the compiled replay loops are not built")
    monkeypatch.setenv(compiled.ENV_VAR, "python" if request.param == "python" else "")
    return str(request.param)


def _repair(
    blocks: list[tuple[int, int, str]],
    *allocs: tuple[int, int],
    seg_size: int = 20 * MiB,
    conf: str = "",
    action: int = ALLOC,
) -> Any:
    """Seed one large segment at SEG with ``blocks`` (offset, size, state; from before the trace),
    replay events (offset, size) of ``action`` (alloc unless told) leniently, and return the replayer."""
    base = _snapshot("gpt_varlen_oom").device(0)
    n = len(allocs)
    trace = Trace(
        np.full(n, action, np.int8),
        np.asarray([SEG + offset for offset, _ in allocs], np.int64),
        np.asarray([size for _, size in allocs], np.int64),
        np.zeros(n, np.int32),
        np.zeros(n, np.int64),
        np.zeros(n, np.int32),
        np.zeros(n, np.int32),
    )
    dev = replace(base, trace=trace, segments=())
    seeded = tuple(BlockState(SEG + o, s, 0 if st == INACTIVE else s, st) for o, s, st in blocks)
    state = AllocatorState(-1, (SegmentState(SEG, seg_size, 0, 0, "large", False, seeded),))
    rep = _Replayer(dev, AllocatorConfig.parse(conf))
    rep.seed(state, strict=False)
    rep.run(0, n)
    return rep


def _blocks(rep: Any) -> list[tuple[int, int, str]]:
    (seg,) = rep.export(rep.n - 1).segments
    return [(b.address - SEG, b.size, b.state) for b in seg.blocks]


def test_an_alloc_inside_a_free_block_cuts_it_there_and_splits_by_the_rule(loops: str) -> None:
    # A free 16 MiB block at 4 MiB; the trace allocates 2 MiB at 8 MiB (the state was guessed, the
    # address is the driver's): the free block is cut at 8 MiB (4 MiB stay free before it), and
    # the 12 MiB from 8 MiB serves the 2 MiB: remainder 10 MiB > 1 MiB, split: 2 MiB + 10 MiB free.
    rep = _repair([(0, 4 * MiB, ACTIVE_ALLOCATED), (4 * MiB, 16 * MiB, INACTIVE)], (8 * MiB, 2 * MiB))
    assert _blocks(rep) == [
        (0, 4 * MiB, ACTIVE_ALLOCATED),
        (4 * MiB, 4 * MiB, INACTIVE),
        (8 * MiB, 2 * MiB, ACTIVE_ALLOCATED),
        (10 * MiB, 10 * MiB, INACTIVE),
    ]
    assert rep.issues == {"alloc-outside-free": 1}
    assert rep.first_issue == (0, "alloc at an address where no free block starts")
    # 11.5 MiB at 8 MiB: the remainder, 512 KiB, is not above 1 MiB: the whole 12 MiB is taken.
    rep = _repair([(0, 4 * MiB, ACTIVE_ALLOCATED), (4 * MiB, 16 * MiB, INACTIVE)], (8 * MiB, 23 * MiB // 2))
    assert _blocks(rep)[2:] == [(8 * MiB, 12 * MiB, ACTIVE_ALLOCATED)]
    # 700 KiB (small pool: the remainder need only be >= 512 B) at 19 MiB: 1 MiB left from there,
    # 324 KiB remainder: split.
    rep = _repair([(0, 4 * MiB, ACTIVE_ALLOCATED), (4 * MiB, 16 * MiB, INACTIVE)], (19 * MiB, 700 * 1024))
    assert _blocks(rep)[2:] == [(19 * MiB, 700 * 1024, ACTIVE_ALLOCATED), (19 * MiB + 700 * 1024, 324 * 1024, INACTIVE)]


def test_an_alloc_inside_a_live_block_cuts_that_block_and_corrects_the_figures(loops: str) -> None:
    # A block from before the trace, 8 MiB at 0, but the trace allocates 1.5 MiB at 6 MiB: its size
    # was guessed too large. It is cut to 6 MiB; the 2 MiB from 6 MiB serve the request (remainder
    # 512 KiB: no split). The initial figures counted the 8 MiB: active and allocated drop by 2 MiB
    # at this event.
    rep = _repair([(0, 8 * MiB, ACTIVE_ALLOCATED), (8 * MiB, 12 * MiB, INACTIVE)], (6 * MiB, 3 * MiB // 2))
    assert _blocks(rep) == [
        (0, 6 * MiB, ACTIVE_ALLOCATED),
        (6 * MiB, 2 * MiB, ACTIVE_ALLOCATED),
        (8 * MiB, 12 * MiB, INACTIVE),
    ]
    assert rep.internals()["adj_active"] == {0: -2 * MiB}
    assert rep.internals()["adj_alloc"] == {0: -2 * MiB}
    # The same block pending its free (freed on another stream, not yet completed): it is active
    # but no longer allocated, so only active drops.
    rep = _repair([(0, 8 * MiB, ACTIVE_PENDING_FREE), (8 * MiB, 12 * MiB, INACTIVE)], (6 * MiB, 3 * MiB // 2))
    assert _blocks(rep)[:2] == [(0, 6 * MiB, ACTIVE_PENDING_FREE), (6 * MiB, 2 * MiB, ACTIVE_ALLOCATED)]
    assert rep.internals()["adj_active"] == {0: -2 * MiB}
    assert rep.internals()["adj_alloc"] == {}


def test_an_alloc_inside_a_block_the_trace_allocated_cuts_it_without_correcting_figures(loops: str) -> None:
    # Event 0 allocates 8 MiB at 0 from the free 20 MiB (split: 12 MiB free after it); event 1
    # allocates 1.5 MiB at 6 MiB, inside it: event 0's block is cut to 6 MiB and event 1 gets the
    # 2 MiB from 6 MiB (remainder 512 KiB: no split). Event 0's size is the trace's own, counted as
    # the replay goes: no initial figure to correct.
    rep = _repair([(0, 20 * MiB, INACTIVE)], (0, 8 * MiB), (6 * MiB, 3 * MiB // 2))
    assert _blocks(rep) == [
        (0, 6 * MiB, ACTIVE_ALLOCATED),
        (6 * MiB, 2 * MiB, ACTIVE_ALLOCATED),
        (8 * MiB, 12 * MiB, INACTIVE),
    ]
    assert rep.internals()["bs"][:2] == [6 * MiB, 2 * MiB]
    assert rep.internals()["adj_active"] == rep.internals()["adj_alloc"] == {}
    assert rep.first_issue == (1, "alloc at an address where no free block starts")


def test_an_alloc_larger_than_the_free_block_at_its_address_takes_the_block_as_it_is(loops: str) -> None:
    # A free 4 MiB block at 0 (a live 16 MiB after it), and the trace allocates 6 MiB at 0: the
    # guessed state is wrong; the alloc takes the 4 MiB block whole (nothing to split off) and the
    # issue is counted, with its event and reason.
    rep = _repair([(0, 4 * MiB, INACTIVE), (4 * MiB, 16 * MiB, ACTIVE_ALLOCATED)], (0, 6 * MiB))
    assert _blocks(rep) == [(0, 4 * MiB, ACTIVE_ALLOCATED), (4 * MiB, 16 * MiB, ACTIVE_ALLOCATED)]
    assert rep.issues == {"block-too-small": 1}
    assert rep.first_issue == (0, "alloc larger than the free block")


def test_an_alloc_of_exactly_max_split_size_takes_its_free_block_whole(loops: str) -> None:
    # max_split_size 256 MiB: a request of 256 MiB is not below it, so the 270 MiB free block it
    # lands on is not split (remainder 14 MiB > 1 MiB would split a smaller request's block).
    blocks = [(0, 270 * MiB, INACTIVE)]
    rep = _repair(blocks, (0, 256 * MiB), seg_size=270 * MiB, conf="max_split_size_mb:256")
    assert _blocks(rep) == [(0, 270 * MiB, ACTIVE_ALLOCATED)]
    rep = _repair(blocks, (0, 256 * MiB - 512), seg_size=270 * MiB, conf="max_split_size_mb:256")
    assert _blocks(rep) == [(0, 256 * MiB - 512, ACTIVE_ALLOCATED), (256 * MiB - 512, 14 * MiB + 512, INACTIVE)]


def test_a_free_completed_without_its_request_frees_and_corrects_allocated(loops: str) -> None:
    # A live 4 MiB block from before the trace at 0 (a free 16 MiB after it); the trace's first
    # event completes its free without a free_requested (the ring lost it): lenient, the block is
    # freed and merged (20 MiB free, the whole segment) and allocated, which counted the block as
    # allocated, not pending, drops by its 4 MiB at that event.
    rep = _repair([(0, 4 * MiB, ACTIVE_ALLOCATED), (4 * MiB, 16 * MiB, INACTIVE)], (0, 4 * MiB), action=FREE_COMPLETED)
    assert _blocks(rep) == [(0, 20 * MiB, INACTIVE)]
    assert rep.issues == {"unrequested-free": 1}
    assert rep.internals()["adj_alloc"] == {0: -4 * MiB}


def test_an_alloc_outside_every_segment_is_kept_attached_to_nothing(loops: str) -> None:
    # 3 MiB + 1 B at 64 MiB past a 20 MiB segment: no segment holds it; the block is kept (its
    # free will come) with its rounded size, 3 MiB + 512 B, and the segment is unchanged.
    rep = _repair([(0, 20 * MiB, INACTIVE)], (64 * MiB, 3 * MiB + 1))
    assert rep.internals()["used"] == {SEG + 64 * MiB: 0}
    assert rep.internals()["bs"][0] == 3 * MiB + 512
    assert _blocks(rep) == [(0, 20 * MiB, INACTIVE)]


def test_a_merged_free_block_of_exactly_the_tracking_threshold_leaves_the_tracked_sizes(loops: str) -> None:
    # The replay tracks only free blocks of at least tmin (a quarter of the largest free block when
    # the tracked set was last rebuilt) to answer largest_free cheaply. A 64 MiB segment: P free at
    # 0 (4 MiB), Q live at 4 MiB (4 MiB), R live at 8 MiB (16 MiB), L free at 24 MiB (16 MiB), the rest
    # live. Rebuilt, tmin = 16 MiB / 4 = 4 MiB: P, exactly tmin, is tracked. Freeing Q merges P into
    # one 8 MiB block, so P's 4 MiB must leave the tracked sizes; after L and the 8 MiB block are taken
    # again nothing is free, and the largest free block is 0 (not a 4 MiB block no one has).
    base = _snapshot("gpt_varlen_oom").device(0)
    events = [
        (FREE_REQUESTED, 4 * MiB, 4 * MiB),
        (FREE_COMPLETED, 4 * MiB, 4 * MiB),
        (ALLOC, 24 * MiB, 16 * MiB),
        (ALLOC, 0, 8 * MiB),
    ]
    n = len(events)
    trace = Trace(
        np.asarray([a for a, _, _ in events], np.int8),
        np.asarray([SEG + o for _, o, _ in events], np.int64),
        np.asarray([s for _, _, s in events], np.int64),
        np.zeros(n, np.int32),
        np.zeros(n, np.int64),
        np.zeros(n, np.int32),
        np.zeros(n, np.int32),
    )
    dev = replace(base, trace=trace, segments=())
    layout = [
        (0, 4 * MiB, INACTIVE),
        (4 * MiB, 4 * MiB, ACTIVE_ALLOCATED),
        (8 * MiB, 16 * MiB, ACTIVE_ALLOCATED),
        (24 * MiB, 16 * MiB, INACTIVE),
        (40 * MiB, 24 * MiB, ACTIVE_ALLOCATED),
    ]
    seeded = tuple(BlockState(SEG + o, s, 0 if st == INACTIVE else s, st) for o, s, st in layout)
    state = AllocatorState(-1, (SegmentState(SEG, 64 * MiB, 0, 0, "large", False, seeded),))
    rep = _Replayer(dev, AllocatorConfig.parse(""))
    rep.seed(state, strict=False)
    rep._retrack()
    assert rep.internals()["tmin"] == 4 * MiB and rep.internals()["fcount"] == {4 * MiB: 1, 16 * MiB: 1}
    rep.run(0, 2)  # Q freed: P + Q is one 8 MiB free block
    assert rep.internals()["free_sz"] == {SEG: 8 * MiB, SEG + 24 * MiB: 16 * MiB}
    assert rep.internals()["fcount"] == {8 * MiB: 1, 16 * MiB: 1}
    rep.run(2, n)
    assert rep.internals()["free_sz"] == {} and rep.internals()["dist"][-1] == 0


def _without(snapshot: Any, keep: Any) -> Any:
    """The snapshot with device 0's trace cut down to the events ``keep`` (indices, in order)."""
    dev = snapshot.devices[0]
    t = dev.trace
    trace = replace(t, **{f: getattr(t, f)[keep] for f in t.__dataclass_fields__})
    return replace(snapshot, devices=[replace(dev, trace=trace), *snapshot.devices[1:]])


def test_a_trace_with_entries_cut_out_of_its_middle_is_refused_with_a_code(monkeypatch: pytest.MonkeyPatch) -> None:
    # rand_s24_c40_roundup4 without event 201 (a free_completed of a record_stream free): that block is
    # never freed, and past what the lenient pass absorbs the replay can no longer follow the blocks (it
    # failed with a KeyError inside its merge). torch never writes such a trace; the report refuses it
    # with a code instead.
    s = read_snapshot(FIXTURES / "captures" / "rand_s24_c40_roundup4.pickle.gz")
    assert s.devices[0].trace.action[201] == FREE_COMPLETED
    cut = _without(s, np.delete(np.arange(len(s.devices[0].trace)), 201))
    with pytest.raises(SnapshotError) as refused:
        recorded_replay(cut, cut.devices[0])
    assert refused.value.code == "snapshot:schema:inconsistent-trace"
    monkeypatch.setattr(source_stage, "read_snapshot", lambda *_a, **_k: cut)  # "the file" holds this trace
    # The report's allocator model names the event first (issue 36, ``eventorder.check_event_order``): the
    # block's next alloc follows its free_requested with no free_completed between.
    with pytest.raises(SnapshotError, match="event 334 \\(alloc at 0x7efd98000000\\) follows event 200") as model:
        report_module.build_report(FIXTURES / "captures" / "rand_s24_c40_roundup4.pickle.gz", jobs=1)
    assert model.value.code == "snapshot:schema:event-order"


def test_states_asked_for_from_several_threads_at_once_are_the_serial_ones() -> None:
    """A report's policy replays run on threads and share the device's recorded replay: each may
    ask for a state that replays the trace again (``infer_limit``'s GC bound reads several). Two such
    passes at once on the one replayer once corrupted both (KeyError, SystemError)."""
    snap = read_snapshot(FIXTURES / "captures" / "densenet_c90_gc07.pickle.gz")
    dev = snap.devices[0]
    n = len(dev.trace)
    wanted = [n // 7 * k for k in range(1, 7)]
    serial = recorded_replay(snap, dev)
    expected = {i: serial.blocks_at(i) for i in wanted}
    shared = recorded_replay(snap, dev)
    gate = threading.Barrier(len(wanted))

    def ask(i: int) -> AllocatorState:
        gate.wait(10)
        return shared.blocks_at(i)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the threads take turns between any two bytecodes
    try:
        with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
            got = dict(zip(wanted, pool.map(ask, wanted), strict=True))
    finally:
        sys.setswitchinterval(interval)
    assert got == expected


def test_the_columns_and_the_limit_asked_for_by_threads_at_once_are_made_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check and the what-ifs start together on the pool's threads and each asks the shared ``Requests``
    for its rounded columns and the inferred limit: each is made by one of them, the others wait for it and
    get the same objects (issue 34: two threads rounded every size, three inferred the limit)."""
    from analysis.allocator import config as config_module
    from analysis.allocator import limits as limits_module
    from analysis.allocator.limits import infer_limit
    from analysis.allocator.requests import build_requests

    snap = read_snapshot(FIXTURES / "captures" / "densenet_c90_gc07.pickle.gz")
    dev = snap.devices[0]
    req = build_requests(snap, dev)
    made = {"round_sizes": 0, "limit": 0}
    round_sizes, inferred = AllocatorConfig.round_sizes, limits_module._inferred_limit

    def counted_round(self: AllocatorConfig, sizes: Any) -> Any:
        made["round_sizes"] += 1
        return round_sizes(self, sizes)

    def counted_limit(*a: Any) -> Any:
        made["limit"] += 1
        return inferred(*a)

    monkeypatch.setattr(config_module.AllocatorConfig, "round_sizes", counted_round)
    monkeypatch.setattr(limits_module, "_inferred_limit", counted_limit)
    cfg = req.recorded_config
    threads = 6
    gate = threading.Barrier(threads)

    def ask(_: int) -> tuple[Any, Any]:
        gate.wait(10)
        return req.columns(cfg), infer_limit(snap, dev, cfg, req)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            got = list(pool.map(ask, range(threads)))
    finally:
        sys.setswitchinterval(interval)
    assert made == {"round_sizes": 1, "limit": 1}
    assert all(g[0] is got[0][0] and g[1] is got[0][1] for g in got)
    # The answer is the one a lone caller gets from a fresh ``Requests``: the same limit, the same columns.
    fresh = build_requests(snap, dev)
    monkeypatch.undo()
    assert infer_limit(snap, dev, cfg, fresh) == got[0][1]
    assert all(np.array_equal(a, b) for a, b in zip(fresh.columns(cfg), got[0][0], strict=True))
    assert got[0][1].lower > 0
