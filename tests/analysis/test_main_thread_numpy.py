"""The report's main-thread numpy passes rewritten for issue 34 (fewer passes over the trace's columns, no
masked stores), each held to the plain formula it replaced: on every top-level fixture and a sample of the
captures where the input is a trace, and on random columns where ties and edge cases are easy to make."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis.allocator import requests
from analysis.allocator.reserved import (
    SEGMENT_ACTIONS,
    recorded_levels,
    recorded_reserved,
    reserved_ends,
    segment_events,
    segment_levels,
)
from analysis.categories import classify, next_marked, optimizer_windows, step_windows
from analysis.model import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    sorted_unique,
)
from analysis.phases import (
    BACKWARD,
    DECODE,
    FORWARD,
    GRAPH_CAPTURE,
    OPTIMIZER,
    PHASES,
    ForwardPass,
    _forward_passes,
    tag_phases,
)
from analysis.reader import read_snapshot
from analysis.stacks import StackCatalog, alloc_lifetimes
from analysis.stages.attribution import _frees_record_free_sites
from analysis.stages.outline import live_requested
from analysis.stages.workload import _halved_by_bounds, _peak_without
from analysis.steps import running_clock
from analysis.timeline import reserved_plateau

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = sorted(FIXTURES.glob("*.pickle.gz")) + sorted((FIXTURES / "captures").glob("*.pickle.gz"))[::40]
I64 = np.int64


def _traces(path: Path):  # type: ignore[no-untyped-def]
    snap = read_snapshot(path)
    return snap, [d for d in snap.devices if len(d.trace)]


# ------------------------------------------------------------------ the formulas replaced


def _reserved_reference(trace) -> np.ndarray:  # type: ignore[no-untyped-def]
    delta = np.zeros(len(trace), I64)
    grow = (trace.action == SEGMENT_ALLOC) | (trace.action == SEGMENT_MAP)
    shrink = (trace.action == SEGMENT_FREE) | (trace.action == SEGMENT_UNMAP)
    delta[grow] = trace.size[grow]
    delta[shrink] = -trace.size[shrink]
    return np.cumsum(delta)


def _ops_reference(act: np.ndarray, addr: np.ndarray) -> np.ndarray:
    """``_stream_of``'s op column by masked stores (no user flushes), from the same pairing of frees."""
    op = np.full(act.shape[0], -1, np.int8)
    is_fr, is_fc = act == FREE_REQUESTED, act == FREE_COMPLETED
    paired, completes = requests._free_pairing(is_fr, is_fc, addr)
    op[act == ALLOC] = requests._OP_ALLOC
    op[paired] = requests._OP_FREE
    op[is_fr & ~paired] = requests._OP_FREE_REQ
    op[is_fc & ~completes & ~paired] = requests._OP_FREE_DONE
    op[act == OOM] = requests._OP_OOM
    return op


def _plateau_reference(reserved, allocated, initial_reserved: int, initial_allocated: int):  # type: ignore[no-untyped-def]
    peak = max(initial_reserved, int(reserved.max()) if reserved.size else initial_reserved)
    if peak <= 0:
        return None
    events = np.flatnonzero(reserved == peak)
    idle = peak - allocated[events]
    at = events + 1
    if initial_reserved == peak:
        at = np.concatenate(([0], at))
        idle = np.concatenate(([peak - initial_allocated], idle))
    k = int(np.argmin(idle))
    return {
        "reserved_bytes": peak,
        "first_event_index": int(at[0]) - 1,
        "last_event_index": int(at[-1]) - 1,
        "events": int(at.shape[0]),
        "least_idle_bytes": int(idle[k]),
        "least_idle_event_index": int(at[k]) - 1,
        "idle_at_first_bytes": int(idle[0]),
    }


def _next_marked_reference(start: np.ndarray, marked: np.ndarray, n: int) -> np.ndarray:
    at = start[marked]
    j = np.searchsorted(at, start, side="right")
    return np.where(j < at.size, at[np.minimum(j, max(at.size - 1, 0))] if at.size else n, n)


def _carry_reference(ms: np.ndarray) -> np.ndarray:
    known = np.flatnonzero(ms >= 0)
    if not 0 < known.size < ms.size:
        return ms
    last_known = np.maximum.accumulate(np.where(ms >= 0, np.arange(ms.size), -1))
    return np.where(last_known >= 0, ms[np.maximum(last_known, 0)], ms[known[0]])


def _forward_passes_reference(codes: np.ndarray, sites: np.ndarray, names: dict[int, str]) -> list[ForwardPass]:
    """``phases._forward_passes`` over every marked allocation: each one's site carried, the neighbours compared."""
    marked = np.flatnonzero(
        (codes == FORWARD) | (codes == BACKWARD) | (codes == OPTIMIZER) | (codes == DECODE) | (codes == GRAPH_CAPTURE)
    )
    if marked.size == 0:
        return []
    mc, ms = codes[marked], _carry_reference(sites[marked])
    fwd = mc == FORWARD
    differs = (mc[1:] != mc[:-1]) | (ms[1:] != ms[:-1])
    starts = np.flatnonzero(fwd & np.r_[True, differs])
    ends = np.flatnonzero(fwd & np.r_[differs, True])
    after = np.where(ends + 1 < mc.size, mc[np.minimum(ends + 1, mc.size - 1)], -1)
    followed = (after == BACKWARD).tolist()
    site_ids = ms[starts].tolist()
    training = {site for site, f in zip(site_ids, followed, strict=True) if f}
    return [
        ForwardPass(int(first), int(last), names.get(site, ""), f, PHASES[a] if a >= 0 else "", site in training)
        for first, last, site, f, a in zip(
            marked[starts], marked[ends], site_ids, followed, after.tolist(), strict=True
        )
    ]


def _live_reference(lifetimes) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    n, m = lifetimes.n_events, lifetimes.start.shape[0]
    runs = np.diff(np.concatenate(([0], lifetimes.start + 1, [n + 1])))
    before = np.repeat(np.arange(m + 1), runs)
    end_rank = before[lifetimes.end].astype(I64)
    ended = np.bincount(end_rank, lifetimes.size.astype(np.float64), m + 1)
    return np.cumsum(lifetimes.size - ended[:-1].astype(I64)), end_rank


def _peak_without_reference(live, halves: np.ndarray, cut: np.ndarray) -> int:  # type: ignore[no-untyped-def]
    half = np.where(cut, halves, 0)
    ended = np.bincount(live.end_rank[cut], half[cut].astype(np.float64), half.shape[0] + 1)
    return int((live.after - np.cumsum(half - ended[:-1].astype(I64))).max())


# ------------------------------------------------------------------ on the fixtures


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_the_trace_passes_match_their_formulas(path: Path) -> None:
    snap, devices = _traces(path)
    for dev in devices:
        t = dev.trace
        reserved = recorded_reserved(dev)
        np.testing.assert_array_equal(reserved, _reserved_reference(t))
        at, level = segment_levels(dev)
        np.testing.assert_array_equal(at, np.flatnonzero(np.isin(t.action, SEGMENT_ACTIONS)))
        np.testing.assert_array_equal(level, reserved[at])
        assert reserved_ends(dev) == (int(reserved[-1]), int(reserved.min()))
        levels = recorded_levels(dev)
        some = np.unique(np.r_[0, len(t) - 1, at, np.maximum(at - 1, 0), np.linspace(0, len(t) - 1, 50).astype(I64)])
        assert [levels[i] for i in some.tolist()] == reserved[some].tolist()
        pools = requests._event_pools(dev)
        released = np.isin(t.action, (SEGMENT_FREE, SEGMENT_UNMAP)) & (pools != 0)
        want_freeable: dict[int, int] = {}
        for i in np.flatnonzero(released).tolist():
            want_freeable.setdefault(int(pools[i]), i)
        assert requests._freeable_from(dev, pools, segment_events(t.action)) == want_freeable
        sel, ops = requests._stream_of(snap, dev, [], pools)[:2]
        ref = _ops_reference(t.action, t.addr)
        np.testing.assert_array_equal(sel, np.flatnonzero(ref >= 0))
        np.testing.assert_array_equal(ops, ref[sel].astype(I64))
        lifetimes = alloc_lifetimes(t.action, t.addr, t.size, t.stack)
        freed = lifetimes.end < lifetimes.n_events
        want = bool(freed.any()) and bool((t.stack[lifetimes.end[freed]] != lifetimes.stack[freed]).mean() > 0.5)
        assert _frees_record_free_sites(t, lifetimes) == want
        rng = np.random.default_rng(34)
        marked = rng.random(lifetimes.start.shape[0]) < 0.3
        np.testing.assert_array_equal(
            next_marked(lifetimes.start, marked, len(t)), _next_marked_reference(lifetimes.start, marked, len(t))
        )
        live = live_requested(lifetimes)
        if live is not None:
            after, end_rank = _live_reference(lifetimes)
            np.testing.assert_array_equal(live.after, after)
            np.testing.assert_array_equal(live.end_rank, end_rank)
            halves = lifetimes.size // 2
            for cut in (marked, ~marked, np.ones_like(marked)):
                assert _peak_without(live, halves, cut) == _peak_without_reference(live, halves, cut)
        catalog = StackCatalog(snap.stacks)
        gids = catalog.groups_of(lifetimes.stack)
        n_groups = len(catalog.groups)
        for upper_groups in (rng.random(n_groups) < 0.7, np.ones(n_groups, bool), np.zeros(n_groups, bool)):
            lower_groups = upper_groups & (rng.random(n_groups) < 0.5)
            upper, lower = _halved_by_bounds(marked, gids, upper_groups, lower_groups)
            np.testing.assert_array_equal(upper, marked & upper_groups[gids])
            np.testing.assert_array_equal(lower, marked & lower_groups[gids])
        traits = catalog.stack_traits(lifetimes.stack)
        assert traits.dtype == np.uint8
        np.testing.assert_array_equal(traits, catalog.traits[catalog.groups_of(lifetimes.stack)])
        alloc = np.cumsum(np.where(t.action == ALLOC, t.size, 0))
        got = reserved_plateau(reserved, alloc, 0, 0)
        assert (None if got is None else got.to_json()) == _plateau_reference(reserved, alloc, 0, 0)


@pytest.mark.parametrize("path", CASES[::3], ids=lambda p: p.name)
def test_the_step_windows_made_once_tag_as_each_stage_made_them(path: Path) -> None:
    """The attribution makes the optimizer windows once (``step_windows``): the categories and the phases
    given them answer as they do making their own."""
    snap, devices = _traces(path)
    for dev in devices:
        t = dev.trace
        lifetimes = alloc_lifetimes(t.action, t.addr, t.size, t.stack)
        catalog = StackCatalog(snap.stacks)
        marks = [(a.name, a.stage, a.time_us) for a in snap.annotations]
        opt_start, opt_end = optimizer_windows(marks, t.time_us)
        windows = step_windows(lifetimes.start, opt_start, opt_end, lifetimes.n_events)
        frames = bool((t.stack >= 0).any())
        np.testing.assert_array_equal(
            classify(lifetimes, catalog, opt_start, opt_end, trace_has_frames=frames, windows=windows),
            classify(lifetimes, catalog, opt_start, opt_end, trace_has_frames=frames),
        )
        given = tag_phases(t, lifetimes, catalog, snap.stacks, opt_start, opt_end, in_window=windows[0])
        made = tag_phases(t, lifetimes, catalog, snap.stacks, opt_start, opt_end)
        np.testing.assert_array_equal(given.of_alloc, made.of_alloc)
        assert (given.passes, given.has_frames) == (made.passes, made.has_frames)


# ------------------------------------------------------------------ on random columns


def test_the_plateau_matches_its_formula_with_ties_and_the_state_before() -> None:
    rng = np.random.default_rng(34)
    for _ in range(3000):
        n = int(rng.integers(0, 12))
        reserved, allocated = rng.integers(-1, 4, n).astype(I64), rng.integers(0, 4, n).astype(I64)
        init_r, init_a = int(rng.integers(-1, 4)), int(rng.integers(0, 4))
        got = reserved_plateau(reserved, allocated, init_r, init_a)
        assert (None if got is None else got.to_json()) == _plateau_reference(reserved, allocated, init_r, init_a)
        if n:  # given the column's first maximum, as the replay's peak_reserved_index gives it
            given = reserved_plateau(reserved, allocated, init_r, init_a, int(reserved.argmax()))
            assert (None if given is None else given.to_json()) == (None if got is None else got.to_json())


def test_next_marked_both_ways_and_carried_sites_match_their_formulas() -> None:
    rng = np.random.default_rng(34)
    for _ in range(2000):
        m = int(rng.integers(0, 15))
        strict = np.cumsum(rng.integers(1, 4, m)).astype(I64)
        ties = np.sort(rng.integers(0, 6, m)).astype(I64)  # equal starts: the searched way
        marked = rng.random(m) < 0.4
        for start in (strict, ties):
            n = int(start[-1]) + 2 if m else 0
            np.testing.assert_array_equal(next_marked(start, marked, n), _next_marked_reference(start, marked, n))

    # The forward passes: codes of every phase the tagging has set by then, sites known or not (a forward
    # allocation's unknown site carried from the marked one before it, whatever its phase).
    codes_of = np.array([0, FORWARD, BACKWARD, OPTIMIZER, DECODE, GRAPH_CAPTURE, 7], np.int8)
    for _ in range(3000):
        m = int(rng.integers(0, 25))
        codes = codes_of[rng.choice(7, m, p=[0.1, 0.4, 0.2, 0.1, 0.05, 0.05, 0.1])]
        site_of_row = np.r_[-1, rng.integers(-1, 4, 6)].astype(I64)  # by stack id + 1
        row = rng.integers(0, 7, m).astype(I64)
        names = {0: "a", 1: "b", 3: "d"}
        want = _forward_passes_reference(codes, site_of_row[row], names)
        assert _forward_passes(codes, site_of_row, row, names) == want


def test_sorted_unique_and_the_running_clock() -> None:
    rng = np.random.default_rng(34)
    for _ in range(200):
        values = rng.integers(-5, 50, int(rng.integers(0, 200))).astype(I64)
        np.testing.assert_array_equal(sorted_unique(values), np.unique(values))
    steady = np.arange(10, dtype=I64)
    jitter = np.array([0, 3, 2, 5, 4, 9], I64)
    assert running_clock(steady) is steady and running_clock(steady) is steady
    np.testing.assert_array_equal(running_clock(jitter), [0, 3, 3, 5, 5, 9])
    np.testing.assert_array_equal(running_clock(jitter), [0, 3, 3, 5, 5, 9])  # kept: the same answer
    assert running_clock(steady) is steady  # another column: its own answer


def test_free_sites_count_only_the_freed_allocations() -> None:
    from types import SimpleNamespace

    from analysis.stacks import Lifetimes

    # Two freed allocations whose frees carry their own stacks, three live ones (their end: the trace's length).
    stack = np.array([1, 2, 9, 9, 1, 2, 7], np.int32)
    n = stack.shape[0]
    lifetimes = Lifetimes(
        start=np.array([0, 1, 2, 3, 5], I64),
        end=np.array([4, 5, n, n, n], I64),
        addr=np.arange(5, dtype=I64),
        size=np.ones(5, I64),
        stack=np.array([1, 2, 3, 3, 3], np.int32),
        n_events=n,
    )
    assert not _frees_record_free_sites(SimpleNamespace(stack=stack), lifetimes)
    freed_elsewhere = stack.copy()
    freed_elsewhere[[4, 5]] = [8, 8]
    assert _frees_record_free_sites(SimpleNamespace(stack=freed_elsewhere), lifetimes)


def test_free_sites_counted_by_blocks_decide_as_the_whole_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The count stops once a block decides it either way: blocks of 4 on random traces, the majority near
    a half (ties included), agree with the count over every allocation."""
    from types import SimpleNamespace

    from analysis.stacks import Lifetimes
    from analysis.stages import attribution

    monkeypatch.setattr(attribution, "_FREE_SITES_BLOCK", 4)
    rng = np.random.default_rng(34)
    for _ in range(3000):
        m = int(rng.integers(1, 40))
        n = 2 * m + 1
        start = np.sort(rng.choice(n - 1, m, replace=False)).astype(I64)
        end = np.where(rng.random(m) < 0.8, np.minimum(start + rng.integers(1, 5, m), n - 1), n).astype(I64)
        stack = rng.integers(0, 3, n).astype(np.int32)
        lifetimes = Lifetimes(start, end, start.copy(), np.ones(m, I64), stack[start], n)
        freed = end < n
        want = bool(freed.any()) and 2 * int((stack[end[freed]] != stack[start][freed]).sum()) > int(freed.sum())
        assert _frees_record_free_sites(SimpleNamespace(stack=stack), lifetimes) == want


def test_a_private_pool_is_freeable_from_its_first_release() -> None:
    from types import SimpleNamespace

    act = np.array(
        [SEGMENT_ALLOC, ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, SEGMENT_FREE, SEGMENT_UNMAP, SEGMENT_FREE],
        np.int8,
    )
    pools = np.array([2, 2, 0, 3, 3, 2, 0, 3], np.int32)  # the default pool's releases (0) never count
    dev = SimpleNamespace(trace=SimpleNamespace(action=act))
    assert requests._freeable_from(dev, pools, segment_events(act)) == {3: 4, 2: 5}  # type: ignore[arg-type]


def test_a_peak_found_among_the_bucket_extremes_is_the_first_one() -> None:
    from analysis.timeline import extreme_indices, peak_of

    rng = np.random.default_rng(34)
    for _ in range(3000):
        n = int(rng.integers(1, 80))
        values = rng.integers(0, int(rng.integers(1, 6)), n).astype(I64)  # few values: ties everywhere
        among = extreme_indices(values, 0, n, int(rng.integers(1, 12)))
        first = int(values.argmax())
        assert peak_of(values, among) == peak_of(values) == {"event_index": first, "bytes": int(values[first])}


def test_the_reserved_levels_and_ends_match_the_column_on_random_traces() -> None:
    """``recorded_levels`` at every event, and ``reserved_ends`` (the last and least of ``recorded_reserved``),
    where the trace starts with a segment event or not, releases before it reserves (a wrapped ring buffer: a
    negative level), or has none."""
    from types import SimpleNamespace

    class _Trace(SimpleNamespace):
        def __len__(self) -> int:
            return int(self.action.shape[0])

    rng = np.random.default_rng(34)
    kinds = np.array([ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP])
    for case in range(300):
        n = int(rng.integers(1, 40))
        pick = kinds[:3] if case % 10 == 0 else kinds
        act = rng.choice(pick, n).astype(np.int8)
        size = rng.integers(1, 1000, n).astype(np.int64)
        dev = SimpleNamespace(trace=_Trace(action=act, size=size))
        reserved = _reserved_reference(dev.trace)
        assert reserved_ends(dev) == (int(reserved[-1]), int(reserved.min()))  # type: ignore[arg-type]
        levels = recorded_levels(dev)  # type: ignore[arg-type]
        assert [levels[i] for i in range(-n, n)] == reserved.tolist() * 2
        with pytest.raises(IndexError):
            levels[n]
