"""Recorded replay: rebuild the caching allocator's block-level state at every event.

The trace records *where* every block went, not how big it was: an ``alloc`` event
carries the requested size, while the allocator holds a rounded block that may
also keep an unsplit remainder. The replay follows the recorded addresses and
infers each block's size the way ``DeviceCachingAllocator`` chose it: the free
block that starts at that address, ``round_size`` of the request, and
``should_split`` under the recorded settings (see
../shared/docs/snapshot-format.md §1.5, §3).

Where each statistic of ``torch.cuda.memory_stats()`` moves (CUDACachingAllocator.cpp):
- ``allocated_bytes`` rises by the block size in ``alloc_found_block`` (event
  ``alloc``) and falls by it in ``free()`` (event ``free_requested``);
- ``active_bytes`` and ``requested_bytes`` rise at ``alloc`` and fall in
  ``free_block()`` (event ``free_completed``): a pending free (``record_stream``)
  still counts;
- ``reserved_bytes`` rises at ``segment_alloc`` / ``segment_map`` and falls at
  ``segment_free`` / ``segment_unmap``;
- ``inactive_split_bytes`` holds the free blocks of split segments, expandable
  ones excluded.

A trace that does not start from an empty allocator (ring buffer wrapped, history
enabled late, ``enabled="state"``) is detected by the symptoms of §1.9; the state
at its first event is then rebuilt backwards from the final ``segments`` and the
replay runs forward from there. Its peaks are lower bounds.

Here: the entry point (``recorded_replay``), what it answers (``RecordedReplay``: per-event columns,
peaks, warnings, states), and the columns summed from its pass. The states are ``states``' types, the
pass that moves them is ``replayer._Replayer``, and the state before an incomplete trace is rebuilt in
``rebuild``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator.config import AllocatorConfig, recorded_settings
from analysis.allocator.rebuild import _final_state, _rebuild_initial, _Rebuilt
from analysis.allocator.replayer import _Inconsistent, _Replayer
from analysis.allocator.states import AllocatorState, StateFigures
from analysis.errors import SchemaError
from analysis.model import (
    ACTIONS,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    I64,
    INACTIVE,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    DeviceData,
    Snapshot,
    Warning_,
)

# The columns a report reads at a few events only (the timeline's points, the OOMs): the C state's pass
# evaluates them there (``_PointColumns``) and makes them whole only when read whole (the explore store).
AT_POINTS = ("requested", "cached_free", "inactive_split", "largest_free")


class _PointColumns:
    """``AT_POINTS``' columns of one replay: whole ones as made (the Python loop's), else made when first
    read whole (``whole``) by the C state's pass, which answers ``at`` some events without them (its
    checkpoints, ``columns_at``): 8 bytes an event each that the report would fault in and never read."""

    __slots__ = ("_core", "_lock", "_reserved", "_start", "_whole")

    def __init__(self, core: Any, start: tuple[int, ...], reserved: I64, whole: dict[str, I64]) -> None:
        self._core, self._start, self._reserved, self._whole = core, start, reserved, whole
        self._lock = threading.Lock()

    def whole(self, name: str) -> I64:
        with self._lock:
            if name not in self._whole:
                n = self._reserved.shape[0]
                made = {k: np.empty(n, dtype=np.int64) for k in AT_POINTS}
                requested, cached_free, inactive_split, largest_free = made.values()
                # None: allocated and reserved, the pass's own, not written again
                self._core.columns(
                    None, requested, None, cached_free, inactive_split, largest_free, self._start, CORE_COLUMNS_SCATTER
                )
                self._whole.update(made)
            return self._whole[name]

    def at(self, points: I64) -> dict[str, I64]:
        """Each column's values at ``points`` (event indices in [0, events), best in increasing order)."""
        if len(self._whole) < len(AT_POINTS):
            out = {k: np.empty(points.shape[0], dtype=np.int64) for k in AT_POINTS}
            if self._core.columns_at(points, self._reserved, *out.values()):
                return out
        return {k: self.whole(k)[points] for k in AT_POINTS}


@dataclass(slots=True)
class RecordedReplay:
    """Per-event columns of the state *after* each event, and what they add up to.

    Every column is int64 with one entry per trace event: ``allocated`` and ``reserved`` made by the
    pass, ``AT_POINTS``' (``requested``, ``cached_free``, ``inactive_split``, ``largest_free``) made
    when first read, and every one at some events by ``values_at`` without making them. A
    ``*_index`` of -1 means the figure was reached before the first event (only possible on an
    incomplete trace). On an incomplete trace (``trace_complete`` false) the
    peaks are lower bounds; ``warnings`` says why.
    """

    device: int
    events: int
    allocated: I64
    reserved: I64
    initial: StateFigures
    final: StateFigures
    peak_allocated: int
    peak_allocated_index: int
    peak_requested: int
    peak_requested_index: int
    peak_reserved: int
    peak_reserved_index: int
    trace_complete: bool
    warnings: list[Warning_]
    _replayer: _Replayer = field(repr=False)
    _at_points: _PointColumns = field(repr=False)
    _requested_top: int = field(repr=False)  # requested's first maximum (argmax's; -1: no events)
    _states: dict[int, AllocatorState] = field(default_factory=dict, repr=False)
    # One replay again at a time: the policy replays of a report run on threads and share this
    # replay, and a second pass on the one ``_replayer`` mid-way through the first corrupts both.
    _replaying: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # whole_free_segments as a step column: the events where it changes, its value from each on,
    # and its value before the first event.
    _whole_free: tuple[I64, I64, int] = field(
        default_factory=lambda: (np.zeros(0, np.int64), np.zeros(0, np.int64), 0), repr=False
    )
    _active: I64 | None = field(default=None, repr=False)

    @property
    def requested(self) -> I64:
        """``requested_bytes`` after each event, made when first read."""
        return self._at_points.whole("requested")

    @property
    def cached_free(self) -> I64:
        """Reserved bytes held by no active block after each event, made when first read."""
        return self._at_points.whole("cached_free")

    @property
    def inactive_split(self) -> I64:
        """``inactive_split_bytes`` after each event, made when first read."""
        return self._at_points.whole("inactive_split")

    @property
    def largest_free(self) -> I64:
        """The largest free block after each event, made when first read."""
        return self._at_points.whole("largest_free")

    def values_at(self, points: npt.ArrayLike) -> dict[str, I64]:
        """Every column's values at ``points`` (event indices in [0, events)), by name, without making
        whole the columns made when first read."""
        at = np.ascontiguousarray(points, dtype=np.int64)
        return {"allocated": self.allocated[at], "reserved": self.reserved[at], **self._at_points.at(at)}

    def first_max(self, name: str) -> int:
        """The first event where column ``name`` is at its maximum (numpy's ``argmax``; -1: no events),
        found by the pass where the column is made only when read."""
        if name == "requested":
            return self._requested_top
        column = getattr(self, name)
        return int(column.argmax()) if column.shape[0] else -1

    @property
    def active(self) -> I64:
        """``active_bytes`` after each event: ``reserved - cached_free``, made when first read. Nothing
        of a report reads it, so the pass does not write it (a column of 8 bytes an event)."""
        if self._active is None:
            self._active = self.reserved - self.cached_free
        return self._active

    def whole_free_segments(self, index: int) -> int:
        """How many segments ``garbage_collect_cached_blocks`` could free after event ``index``
        (-1: before the trace): whole free ones of the default pool, large, not expandable. Read
        off the one pass (a step column), so the GC's limit bound replays nothing again."""
        at, count, initial = self._whole_free
        k = int(np.searchsorted(at, index, side="right"))
        return int(count[k - 1]) if k else initial

    def blocks_at(self, index: int) -> AllocatorState:
        """Segments and blocks after event ``index``; -1 gives the state before the trace.

        States asked for through ``recorded_replay(keep_at=...)`` (and the initial and
        final ones) are ready; any other index replays the trace again up to it.
        """
        if not -1 <= index < self.events:
            raise IndexError(f"event index {index} outside [-1, {self.events})")
        state = self._states.get(index)
        if state is None:
            with self._replaying:
                state = self._states.get(index)
                if state is None:
                    state = self._replayer.state_after(index)
                    self._states[index] = state
        return state


def resume_state(device: DeviceData, cfg: AllocatorConfig, start: AllocatorState, index: int) -> AllocatorState:
    """The state after event ``index``, moved on from ``start`` (a state of the same replay, taken
    after event ``start.index <= index``) by the lenient pass that ``RecordedReplay.blocks_at`` runs.

    This is how a site answers a click from stored checkpoints: only the events between the
    checkpoint and ``index`` are replayed. ``cfg`` is the recorded config (``recorded_config``).
    """
    if index < start.index:
        raise ValueError(f"event {index} is before the checkpoint after event {start.index}")
    if index == start.index:
        return start
    rep = _Replayer(device, cfg)
    rep.seed(start, strict=False, window=(start.index + 1, index + 1))
    rep.run(start.index + 1, index + 1)
    return rep.export(index)


def recorded_config(snapshot: Snapshot) -> AllocatorConfig:
    """The config the recorded replay of ``snapshot`` runs under."""
    return _config_of(snapshot)[0]


def _config_of(snapshot: Snapshot) -> tuple[AllocatorConfig, list[Warning_]]:
    cfg, problems = recorded_settings(snapshot.settings.raw, snapshot.settings.conf)
    if not problems:
        return cfg, []
    warning = Warning_(
        "allocator-settings-unreadable",
        f"the recorded allocator settings could not all be read ({'; '.join(problems)[:300]}); "
        "those are taken at their defaults",
    )
    return cfg, [warning]


def _looks_like_ring_capacity(n: int) -> bool:
    """A wrapped ring holds exactly max_entries events, which people pick round."""
    if n < 1000:
        return False
    digits = str(n).rstrip("0")
    return len(digits) <= 2 or (n & (n - 1)) == 0


def _end_differences(got: AllocatorState, want: AllocatorState) -> list[str]:
    """What differs between two states, segment by segment (empty when equal)."""

    def shape(s: AllocatorState) -> dict[int, tuple[int, tuple[tuple[int, int, str], ...]]]:
        return {
            seg.address: (seg.total_size, tuple((b.address, b.size, b.state) for b in seg.blocks)) for seg in s.segments
        }

    a, b = shape(got), shape(want)
    diffs = []
    for addr in sorted(set(a) | set(b)):
        if addr not in a:
            diffs.append(f"segment {addr:#x} of the snapshot is missing from the replay")
        elif addr not in b:
            diffs.append(f"segment {addr:#x} of the replay is not in the snapshot")
        elif a[addr] != b[addr]:
            diffs.append(f"segment {addr:#x} has different blocks")
    return diffs


def _peak(column: I64, initial: int) -> tuple[int, int]:
    if column.shape[0] == 0:
        return initial, -1
    j = int(np.argmax(column))
    return _peak_over(int(column[j]), j, initial)


def _peak_over(value: int, event: int, initial: int) -> tuple[int, int]:
    """A column's peak (its maximum at ``event``, -1: no events) against the state before the trace: that
    state's figure, at -1, where the trace never rose above it."""
    return (value, event) if event >= 0 and value >= initial else (initial, -1)


def _run_keeping(rep: _Replayer, keep: list[int], states: dict[int, AllocatorState]) -> None:
    lo = 0
    for k in keep:
        rep.run(lo, k + 1)
        states[k] = rep.export(k)
        lo = k + 1
    rep.run(lo, rep.n)


# Sign of each action's effect on a running total (indexed by action code).
def _signs(plus: tuple[int, ...], minus: tuple[int, ...]) -> npt.NDArray[np.int8]:
    table = np.zeros(len(ACTIONS), dtype=np.int8)
    table[list(plus)] = 1
    table[list(minus)] = -1
    return table


_ALLOCATED_SIGN = _signs((ALLOC,), (FREE_REQUESTED,))
_ACTIVE_SIGN = _signs((ALLOC,), (FREE_COMPLETED,))  # also requested_bytes
_RESERVED_SIGN = _signs((SEGMENT_ALLOC, SEGMENT_MAP), (SEGMENT_FREE, SEGMENT_UNMAP))


def _columns(rep: _Replayer, device: DeviceData, init: StateFigures) -> dict[str, I64]:
    """The per-event columns from one pass's outputs.

    Totals that move by a known amount per event are cumulative sums: block sizes
    (``bs``) for allocated/active, the recorded sizes for requested/reserved. Sums
    run in place: on millions of events fresh temporaries cost more than the math.
    """
    n = rep.n
    act = rep.action
    bs = np.array(rep.bs, dtype=np.int64)[:n]
    bs[rep.fused] = bs[rep.fused + 1]  # a fused free wrote its block size once, at the completion
    sizes = device.trace.size
    moves = {
        "allocated": bs * _ALLOCATED_SIGN[act],
        "active": bs * _ACTIVE_SIGN[act],
        "requested": sizes * _ACTIVE_SIGN[act],
        "reserved": sizes * _RESERVED_SIGN[act],
    }
    if rep.ignored:
        ignored = np.array(rep.ignored, dtype=np.int64)
        moves["requested"][ignored] = 0
        moves["reserved"][ignored] = 0
    for i, v in rep.adj_alloc.items():
        moves["allocated"][i] += v
    for i, v in rep.adj_active.items():
        moves["active"][i] += v
    start = {
        "allocated": init.allocated,
        "active": init.active,
        "requested": init.requested,
        "reserved": init.reserved,
    }
    for name, col in moves.items():
        np.cumsum(col, out=col)
        col += start[name]
    moves["nonsplit"] = _step_sum(rep.ns_i, rep.ns_v, n, init.cached_free - init.inactive_split)
    moves["largest_free"] = _step_column(rep.lf_i, rep.lf_v, n, init.largest_free)
    return moves


# The C columns' second form (every event's moves scattered, then summed) runs only for records out of event
# order, which no pass leaves: the tests set this to hold it to the one-pass form on every fixture.
CORE_COLUMNS_SCATTER = False


def _core_columns(
    core: Any, n: int, init: StateFigures
) -> tuple[dict[str, I64], list[tuple[int, int]], _PointColumns, int]:
    """``_columns``' allocated and reserved, summed by the C state itself (its records never become Python
    objects): reserved into a fresh array, allocated over the state's own block sizes, which nothing reads
    after the pass (19 MB on the 460 MB trace that a fresh column would fault in: 27 -> 20 ms), the array
    on the core's buffer; ``_peak`` of allocated, requested and reserved, found by the same pass; the other
    columns as ``_PointColumns`` (evaluated at the events asked for, from the same records; ``active``,
    ``reserved - cached_free``, made when read: ``RecordedReplay.active``); and the first event of
    requested's maximum."""
    reserved = np.empty(n, dtype=np.int64)
    nonsplit = init.cached_free - init.inactive_split
    start = (init.allocated, init.requested, init.reserved, init.active, nonsplit, init.largest_free)
    # ((value, first event), ...); -1: none
    maxima = core.columns(True, None, reserved, None, None, None, start, CORE_COLUMNS_SCATTER)
    cols = {"allocated": np.frombuffer(core, dtype=np.int64), "reserved": reserved}
    peaks = [
        _peak_over(v, j, initial)
        for (v, j), initial in zip(maxima, (init.allocated, init.requested, init.reserved), strict=True)
    ]
    return cols, peaks, _PointColumns(core, start, cols["reserved"], {}), int(maxima[1][1])


def _step_column(index: list[int], value: list[int], n: int, initial: int) -> I64:
    """A column that takes ``value[k]`` from event ``index[k]`` on (the last wins)."""
    at = np.array(index, dtype=np.int64)
    values = np.array([initial, *value], dtype=np.int64)  # values[0]: before any record
    last = np.ones(len(at), dtype=bool)  # index is sorted: keep the last record per event
    last[:-1] = at[1:] != at[:-1]
    keep = np.nonzero(last & (at >= 0))[0]
    source = np.zeros(n, dtype=np.int32 if len(values) < 2**31 else np.int64)
    source[at[keep]] = keep + 1
    np.maximum.accumulate(source, out=source)
    out: I64 = values[source]
    return out


def _step_sum(index: list[int], delta: list[int], n: int, initial: int) -> I64:
    """A column that starts at ``initial`` and moves by ``delta[k]`` at event ``index[k]``."""
    moves = np.zeros(n, dtype=np.int64)
    if index:
        np.add.at(moves, np.array(index, dtype=np.int64), np.array(delta, dtype=np.int64))
    np.cumsum(moves, out=moves)
    moves += initial
    return moves


def _start_warnings(n: int, rebuilt: _Rebuilt, failure: _Inconsistent | None) -> tuple[list[Warning_], bool]:
    """What the lenient pass's starting state says of the trace: the warnings, and whether the trace
    may still be the whole history (no state before its first event)."""
    warnings: list[Warning_] = []
    initial_figures = rebuilt.state.figures()
    before = initial_figures.reserved or initial_figures.active or rebuilt.orphans
    whole = True
    if n <= 1:
        whole = False
        warnings.append(
            Warning_(
                "state-only",
                f"the trace holds {n} event{'s' if n != 1 else ''}: history was not recorded "
                '(enabled="state", or recording off), so only the final state is known and '
                "the peaks are the final figures, lower bounds of the real ones",
            )
        )
    elif before:
        whole = False
        held = (
            f"{len(rebuilt.state.segments)} segments ({initial_figures.reserved} bytes) "
            f"and {sum(1 for _ in rebuilt.state.live_blocks())} live blocks "
            f"({initial_figures.active} bytes) existed before the first recorded event"
        )
        if _looks_like_ring_capacity(n):
            warnings.append(
                Warning_(
                    "trace-truncated",
                    f"the trace holds exactly {n} events and {held}: the ring buffer "
                    "(max_entries) most likely wrapped and dropped the oldest events; "
                    "peaks are lower bounds",
                )
            )
        else:
            warnings.append(
                Warning_(
                    "history-started-late",
                    f"{held}: history recording started after allocations existed (or the "
                    "ring buffer wrapped); peaks are lower bounds",
                )
            )
    elif failure is not None:
        warnings.append(
            Warning_(
                "replay-inexact",
                f"the trace starts from an empty allocator but the replay could not follow it "
                f"at {failure}; block sizes after that point are approximate",
            )
        )
    if rebuilt.orphans or rebuilt.conflicts:
        warnings.append(
            Warning_(
                "replay-rebuilt-approximately",
                f"rebuilding the state before the trace left {rebuilt.orphans} blocks outside "
                f"any segment and {rebuilt.conflicts} overlapping blocks",
            )
        )
    return warnings, whole


def _pass_warnings(rep: _Replayer, end_diffs: list[str]) -> list[Warning_]:
    """Events the pass could not fit, and an end state unlike the snapshot's."""
    warnings: list[Warning_] = []
    if rep.issues:
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(rep.issues.items()))
        first = rep.first_issue
        warnings.append(
            Warning_(
                "replay-inconsistent",
                f"{sum(rep.issues.values())} events did not fit the rebuilt state ({detail}); "
                f"first at event {first[0] if first else '?'}",
            )
        )
    if end_diffs:
        warnings.append(
            Warning_(
                "replay-end-mismatch",
                f"the replay's end state differs from the snapshot's segments in "
                f"{len(end_diffs)} segments (e.g. {end_diffs[0]})",
            )
        )
    return warnings


def recorded_replay(snapshot: Snapshot, device: DeviceData, keep_at: Iterable[int] = ()) -> RecordedReplay:
    """Replay one device's trace along its recorded addresses.

    ``keep_at``: event indices whose full state (``blocks_at``) should be kept
    from this pass, e.g. the peak or the OOM, so no second pass is needed.
    """
    cfg, warnings = _config_of(snapshot)
    rep = _Replayer(device, cfg)
    n = rep.n
    final = _final_state(device, n - 1)
    keep = sorted({int(k) for k in keep_at if 0 <= int(k) < n - 1})
    states: dict[int, AllocatorState] = {}

    complete = n > 1
    failure: _Inconsistent | None = None
    end_diffs: list[str] = []
    if complete:
        rep.seed(AllocatorState(-1, ()), strict=True, stops=keep)
        try:
            _run_keeping(rep, keep, states)
        except _Inconsistent as exc:
            failure = exc
        else:
            states[n - 1] = rep.export(n - 1)
            end_diffs = _end_differences(states[n - 1], final)
    rebuilt: _Rebuilt | None = None
    if n <= 1 or failure is not None or end_diffs:
        rebuilt = _rebuild_initial(device, cfg, final)
        states.clear()
        rep.seed(rebuilt.state, strict=False)
        try:
            _run_keeping(rep, keep, states)
        except (KeyError, IndexError) as exc:
            # Past what the lenient pass absorbs (frees of unknown blocks, completions without a
            # request): events torch never writes, e.g. a trace with entries cut out of its middle.
            raise SchemaError(
                "inconsistent-trace",
                f"device {device.device}'s trace contradicts itself (its blocks and segments cannot be followed "
                "from one event to the next: entries are missing or were changed), so it cannot be replayed",
            ) from exc
        if n:
            states[n - 1] = rep.export(n - 1)
            end_diffs = _end_differences(states[n - 1], final)
        start_warnings, starts_empty = _start_warnings(n, rebuilt, failure)
        warnings += start_warnings
        complete = complete and starts_empty
    warnings += _pass_warnings(rep, end_diffs)

    return _finished(rep, device, states, complete, warnings)


def _finished(
    rep: _Replayer, device: DeviceData, states: dict[int, AllocatorState], complete: bool, warnings: list[Warning_]
) -> RecordedReplay:
    """The replay's columns and peaks, from the pass's records; the states kept go with it."""
    n = rep.n
    initial_state = rep.initial
    init = initial_state.figures()
    if rep.core is not None:
        cols, peaks, at_points, requested_top = _core_columns(rep.core, n, init)
    else:
        cols = _columns(rep, device, init)
        cached_free = cols["reserved"] - cols["active"]
        inactive_split = np.subtract(cached_free, cols["nonsplit"], out=cols["nonsplit"])
        whole = {"requested": cols["requested"], "cached_free": cached_free, "inactive_split": inactive_split}
        at_points = _PointColumns(None, (), cols["reserved"], {**whole, "largest_free": cols["largest_free"]})
        requested = cols["requested"]
        requested_top = int(np.argmax(requested)) if n else -1
        peaks = [
            _peak(cols["allocated"], init.allocated),
            _peak(requested, init.requested),
            _peak(cols["reserved"], init.reserved),
        ]
    allocated, reserved = cols["allocated"], cols["reserved"]

    if n:
        last = {k: int(v[0]) for k, v in at_points.at(np.array([n - 1], dtype=np.int64)).items()}
        final_figures = StateFigures(
            int(allocated[-1]),
            last["requested"],
            int(reserved[-1]),
            int(reserved[-1]) - last["cached_free"],  # active
            last["cached_free"],
            last["inactive_split"],
            last["largest_free"],
        )
    else:
        final_figures = init
    states[-1] = initial_state
    (pa, pai), (pq, pqi), (pr, pri) = peaks
    whole_free = _whole_free_column(rep, initial_state)
    # The per-pass lists are only needed again by blocks_at's replays.
    rep.bs = []
    rep.core = None
    return RecordedReplay(
        device=device.device,
        events=n,
        allocated=allocated,
        reserved=reserved,
        initial=init,
        final=final_figures,
        peak_allocated=pa,
        peak_allocated_index=pai,
        peak_requested=pq,
        peak_requested_index=pqi,
        peak_reserved=pr,
        peak_reserved_index=pri,
        trace_complete=complete,
        warnings=warnings,
        _replayer=rep,
        _states=states,
        _whole_free=whole_free,
        _active=cols.get("active"),  # the Python loop's; the C state's pass writes none
        _at_points=at_points,
        _requested_top=requested_top,
    )


def _whole_free_column(rep: _Replayer, initial: AllocatorState) -> tuple[I64, I64, int]:
    """``RecordedReplay.whole_free_segments`` from the pass's (event, change) records."""
    if rep.core is not None:  # the C state's records, as the bytes of int64 arrays
        at, change = (np.frombuffer(b, np.int64) for b in rep.core.whole_free())
    else:
        at, change = np.asarray(rep.wf_i, np.int64), np.asarray(rep.wf_v, np.int64)
    start = sum(
        1
        for seg in initial.segments
        if seg.pool == 0
        and seg.segment_type == "large"
        and not seg.is_expandable
        and len(seg.blocks) == 1
        and seg.blocks[0].state == INACTIVE
    )
    return at, start + np.cumsum(change), start
