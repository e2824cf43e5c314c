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

The inner loop is plain Python over lists with dicts keyed by address (blocks of
one device never overlap, so an address names one block at a time); the figures
that need no block sizes (``requested``, ``reserved``) are computed with numpy.
Where it is built, the state and its moves live in C instead (``analysis.allocator.compiled``:
maps of int64 keyed by address, the columns summed into numpy arrays), every method that moves
the state written again there; this one stays the reference.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator import compiled
from analysis.allocator.config import (
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    AllocatorConfig,
    is_small,
    recorded_settings,
)
from analysis.errors import SchemaError
from analysis.model import (
    ACTIONS,
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
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

# Upper bound on how far to look for the alloc that a new segment was made for.
_LOOKAHEAD = 64
# Loop-only action code: a free_requested fused with the free_completed after it.
_FUSED_FREE = 9
# Distinct free-block sizes tracked for largest_free before the set is rebuilt.
_TRACK_LIMIT = 8


# ----------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockState:
    """One block at a moment of the replay.

    ``stack`` is the stack of the block's ``alloc`` event; for a block that was
    live before the trace it is the final snapshot's frames or the stack of the
    event that freed it. ``alloc_index`` is the event index of the ``alloc``
    (-1 for free blocks and blocks from before the trace).
    """

    address: int
    size: int
    requested_size: int
    state: str  # model.ACTIVE_ALLOCATED | model.ACTIVE_PENDING_FREE | model.INACTIVE
    stack: int = -1
    alloc_index: int = -1

    @property
    def live(self) -> bool:
        return self.state != INACTIVE


@dataclass(frozen=True, slots=True)
class SegmentState:
    """A segment (for expandable segments: one contiguous mapped range)."""

    address: int
    total_size: int
    stream: int  # ordinal into DeviceData.streams
    pool: int  # ordinal into Snapshot.pools
    segment_type: str  # "small" | "large"
    is_expandable: bool
    blocks: tuple[BlockState, ...]
    stack: int = -1


@dataclass(frozen=True, slots=True)
class StateFigures:
    """The allocator's totals at one moment, as ``memory_stats()`` counts them."""

    allocated: int
    requested: int
    reserved: int
    active: int
    cached_free: int  # reserved - active
    inactive_split: int
    largest_free: int


@dataclass(frozen=True, slots=True)
class AllocatorState:
    """Segments and blocks after event ``index`` (-1: before the first event)."""

    index: int
    segments: tuple[SegmentState, ...]

    def live_blocks(self) -> Iterator[tuple[SegmentState, BlockState]]:
        for seg in self.segments:
            for block in seg.blocks:
                if block.state != INACTIVE:
                    yield seg, block

    def figures(self) -> StateFigures:
        allocated = requested = reserved = active = inactive_split = largest = 0
        for seg in self.segments:
            reserved += seg.total_size
            split = len(seg.blocks) > 1 and not seg.is_expandable
            for b in seg.blocks:
                if b.state == INACTIVE:
                    largest = max(largest, b.size)
                    if split:
                        inactive_split += b.size
                    continue
                active += b.size
                requested += b.requested_size
                if b.state == ACTIVE_ALLOCATED:
                    allocated += b.size
        return StateFigures(allocated, requested, reserved, active, reserved - active, inactive_split, largest)


@dataclass(slots=True)
class RecordedReplay:
    """Per-event columns of the state *after* each event, and what they add up to.

    Every column is int64 with one entry per trace event. A ``*_index`` of -1
    means the figure was reached before the first event (only possible on an
    incomplete trace). On an incomplete trace (``trace_complete`` false) the
    peaks are lower bounds; ``warnings`` says why.
    """

    device: int
    events: int
    allocated: I64
    requested: I64
    reserved: I64
    cached_free: I64
    inactive_split: I64
    largest_free: I64
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


# ----------------------------------------------------------------------------------
# The replay engine
# ----------------------------------------------------------------------------------


class _Inconsistent(Exception):
    """Raised (strict mode only) at the first event the current state cannot explain."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"event {index}: {reason}")
        self.index = index
        self.reason = reason


_Meta = tuple[int, int, str, bool, int]  # stream, pool, segment_type, is_expandable, stack


class _Replayer:
    """Block-level state of one device, moved forward event by event.

    State, all keyed by start address:
    - ``free_sz``/``free_end``: free (cached) blocks, by start and by end address;
    - ``used``: active blocks -> ``ref``, the index of their ``alloc`` event, or
      ``n + k`` for ``pre[k]``, a block that existed before the trace; a pending
      free (requested, not completed) is stored as ``~ref``. ``bs[ref]`` is the
      block's size, so a block costs one dict entry;
    - ``seg_size``/``seg_meta``: segments; ``seg_end`` maps expandable ranges' ends.
    ``fcount`` counts the free blocks of each size of at least ``tmin`` and ``dist``
    keeps those sizes sorted (after a 0 sentinel), so the largest free block is
    ``dist[-1]``. Tracking only the big blocks (``tmin`` is a quarter of the largest
    when the set is rebuilt) spares most events the bookkeeping: the churn of a
    training step is in blocks far smaller than the largest free one.
    """

    def __init__(self, device: DeviceData, cfg: AllocatorConfig) -> None:
        tr = device.trace
        self.n = len(tr)
        self.action = tr.action
        # bytes iterate to small ints faster than a list of them is built
        self.act: bytes = tr.action.astype(np.uint8).tobytes()
        self.trace_addr = tr.addr
        self.trace_size = tr.size
        # Trace entries of torch <= 2.11 carry no pool_id: a segment that lives to
        # the end takes its pool and kind from the final snapshot.
        self.final_meta = {s.address: (s.total_size, s.pool, s.segment_type) for s in device.segments}
        self.stream = tr.stream
        self.pool = tr.pool
        self.stack = tr.stack
        self.cfg = cfg
        self.plain_round = cfg.rounds_plainly  # the loop inlines plain rounding then
        self.strict = True
        self.initial: AllocatorState = AllocatorState(-1, ())
        self.demand_pos: int | None = None  # next event of the on-demand pass, if one runs
        self._reset()

    # -- state --------------------------------------------------------------------
    def _reset(self) -> None:
        self.free_sz: dict[int, int] = {}
        self.free_end: dict[int, int] = {}
        self.used: dict[int, int] = {}
        self.pre: list[BlockState] = []
        self.seg_size: dict[int, int] = {}
        self.seg_end: dict[int, int] = {}
        self.seg_meta: dict[int, _Meta] = {}
        self.n_exp = 0
        self.cmode = 0  # inactive_split counts: 0 every segment, 1 none, 2 look up
        self.starts: list[int] = []  # segment starts, sorted
        self.fcount: dict[int, int] = {}
        self.dist: list[int] = [0]
        self.tmin = 0
        self.tlimit = _TRACK_LIMIT
        # Outputs of a pass (lists written by index, turned into numpy once); bs is made by seed,
        # only for the Python loop (the C state keeps its own).
        self.bs: list[int] = []
        # inactive_split = cached_free - "nonsplit": free bytes of whole segments and of
        # expandable ones. Without expandable segments that changes only when a segment
        # turns wholly free or stops being so: (event, change) pairs, not a column.
        self.ns_i: list[int] = []
        self.ns_v: list[int] = []
        # largest_free changes only where the tracked sizes do: (event, value) pairs.
        self.lf_i: list[int] = []
        self.lf_v: list[int] = []
        # Whole free segments the GC may free (the default pool's, large, not expandable) turning
        # so (+1) or not (-1), recorded where nonsplit's whole-segment changes are: (event, change).
        self.wf_i: list[int] = []
        self.wf_v: list[int] = []
        self.cur = -1  # event being applied, for the slow paths' records
        self.adj_alloc: dict[int, int] = {}
        self.adj_active: dict[int, int] = {}
        self.ignored: list[int] = []
        self.issues: dict[str, int] = {}
        self.first_issue: tuple[int, str] | None = None
        # The same state in C (analysis.allocator.compiled), when the compiled loops run: the
        # attributes above then stay empty, and run, export and the columns read the core.
        self.core: Any = None

    def seed(
        self, state: AllocatorState, *, strict: bool, stops: Iterable[int] = (), window: tuple[int, int] | None = None
    ) -> None:
        """Start from ``state`` (the empty allocator for a complete trace).

        ``stops``: indices the pass will stop after (kept states); a free is never
        fused across one, so the state after it is exact. ``window``: a lenient
        pass that will only run events ``[lo, hi)`` (from a checkpoint) plans those.
        """
        self._reset()
        self.strict = strict
        self.initial = state
        if compiled.wanted():
            self._seed_core(state, strict, stops)
            return
        self.bs = [0] * self.n
        self._plan(fuse=strict, stops=stops, window=window)
        for seg in state.segments:
            meta = (seg.stream, seg.pool, seg.segment_type, seg.is_expandable, seg.stack)
            self._add_segment(seg.address, seg.total_size, meta)
            for b in seg.blocks:
                if b.state == INACTIVE:
                    self._add_free(b.address, b.size)
                    continue
                ref = self.n + len(self.pre)
                self.pre.append(b)
                self.bs.append(b.size)
                self.used[b.address] = ~ref if b.state == ACTIVE_PENDING_FREE else ref

    def _seed_core(self, state: AllocatorState, strict: bool, stops: Iterable[int]) -> None:
        """``seed`` into the C state: it moves every event itself, so no plan is made."""
        (over_s, below_s), (over_l, below_l) = self.cfg.split_rule(True), self.cfg.split_rule(False)
        self.core = core = compiled.recorded_core(
            self.act, np.ascontiguousarray(self.trace_addr, dtype=np.int64),
            np.ascontiguousarray(self.trace_size, dtype=np.int64), self.stream, self.pool, [int(k) for k in stops],
            plain=self.plain_round, round_size=self.cfg.round_size, min_block=K_MIN_BLOCK_SIZE, small=K_SMALL_SIZE,
            over_s=over_s, below_s=below_s, over_l=over_l, below_l=below_l, strict=strict,
            inconsistent=_Inconsistent, track_limit=_TRACK_LIMIT,
        )  # fmt: skip
        for seg in state.segments:
            core.add_segment(
                seg.address, seg.total_size, (seg.stream, seg.pool, seg.segment_type, seg.is_expandable, seg.stack)
            )
            for b in seg.blocks:
                if b.state == INACTIVE:
                    core.add_free(b.address, b.size)
                    continue
                self.pre.append(b)
                core.add_used(b.address, b.size, b.state == ACTIVE_PENDING_FREE)

    def internals(self) -> dict[str, Any]:
        """The state's dicts and records (the Python loop's attributes, or the C state's copy)."""
        if self.core is not None:
            got: dict[str, Any] = self.core.internals()
            return got
        state = ("free_sz", "free_end", "used", "seg_size", "seg_end", "fcount", "dist", "starts", "bs", "tmin")
        records = ("ns_i", "ns_v", "lf_i", "lf_v", "ignored", "adj_alloc", "adj_active", "tlimit", "cmode", "n_exp")
        records_gc = ("wf_i", "wf_v")  # whole_free_segments' records
        return {k: getattr(self, k) for k in state + records + records_gc}

    def _add_segment(self, start: int, size: int, meta: _Meta) -> None:
        bisect.insort(self.starts, start)
        self.seg_size[start] = size
        self.seg_meta[start] = meta
        if meta[3]:
            self.seg_end[start + size] = start
            self.n_exp += 1
        self._segments_changed()

    def _drop_segment(self, start: int) -> _Meta:
        del self.starts[bisect.bisect_left(self.starts, start)]
        size = self.seg_size.pop(start)
        meta = self.seg_meta.pop(start)
        if meta[3]:
            del self.seg_end[start + size]
            self.n_exp -= 1
        self._segments_changed()
        return meta

    def _segments_changed(self) -> None:
        n_seg = len(self.seg_size)
        self.cmode = 0 if self.n_exp == 0 else (1 if self.n_exp == n_seg else 2)

    def _segment_of(self, addr: int) -> int | None:
        j = bisect.bisect_right(self.starts, addr) - 1
        if j < 0:
            return None
        start = self.starts[j]
        return start if addr < start + self.seg_size[start] else None

    def _counts_split(self, addr: int) -> bool:
        """Whether a free block at ``addr`` counts in inactive_split (not expandable)."""
        if self.cmode != 2:
            return self.cmode == 0
        seg = self._segment_of(addr)
        return seg is not None and not self.seg_meta[seg][3]

    def _whole_free(self, i: int, start: int, change: int) -> None:
        """The whole segment at ``start`` turned free (``change`` +1) or stopped being so (-1):
        recorded where it is one ``garbage_collect_cached_blocks`` may free (the default pool's,
        large, not expandable; ``RecordedReplay.whole_free_segments``)."""
        meta = self.seg_meta.get(start)
        if meta is not None and meta[1] == 0 and meta[2] == "large" and not meta[3]:
            self.wf_i.append(i)
            self.wf_v.append(change)

    def _add_free(self, start: int, size: int) -> None:
        """Add a free block without merging (slow paths and seeding)."""
        self.free_sz[start] = size
        self.free_end[start + size] = start
        if size >= self.tmin:
            c = self.fcount.get(size, 0)
            if c:
                self.fcount[size] = c + 1
            else:
                self.fcount[size] = 1
                bisect.insort(self.dist, size)
                if len(self.dist) > self.tlimit:
                    self._retrack()
                self.lf_i.append(self.cur)
                self.lf_v.append(self.dist[-1])
        if self.seg_size.get(start) == size and self.cur >= 0:
            self._whole_free(self.cur, start, 1)
        if (self.seg_size.get(start) == size or not self._counts_split(start)) and self.cur >= 0:
            self.ns_i.append(self.cur)
            self.ns_v.append(size)

    def _remove_free(self, start: int) -> int:
        size = self.free_sz.pop(start)
        del self.free_end[start + size]
        if size >= self.tmin:
            c = self.fcount[size]
            if c > 1:
                self.fcount[size] = c - 1
            else:
                del self.fcount[size]
                del self.dist[bisect.bisect_left(self.dist, size)]
                if len(self.dist) == 1:
                    self._retrack()
                self.lf_i.append(self.cur)
                self.lf_v.append(self.dist[-1])
        if self.seg_size.get(start) == size and self.cur >= 0:
            self._whole_free(self.cur, start, -1)
        if (self.seg_size.get(start) == size or not self._counts_split(start)) and self.cur >= 0:
            self.ns_i.append(self.cur)
            self.ns_v.append(-size)
        return size

    def _retrack(self) -> None:
        """Rebuild the tracked sizes: those at least a quarter of the largest free block."""
        if self.core is not None:
            self.core.retrack()
            return
        largest = max(self.free_sz.values(), default=0)
        self.tmin = largest >> 2
        fcount: dict[int, int] = {}
        for size in self.free_sz.values():
            if size >= self.tmin:
                fcount[size] = fcount.get(size, 0) + 1
        self.fcount.clear()
        self.fcount.update(fcount)
        self.dist[:] = [0, *sorted(fcount)]
        self.tlimit = max(_TRACK_LIMIT, 2 * len(self.dist))

    def _free_containing(self, addr: int) -> int | None:
        for start, size in self.free_sz.items():
            if start <= addr < start + size:
                return start
        return None

    def _used_containing(self, addr: int) -> int | None:
        bs = self.bs
        for start, ref in self.used.items():
            if start <= addr < start + bs[ref if ref >= 0 else ~ref]:
                return start
        return None

    def _issue(self, index: int, kind: str, reason: str) -> None:
        """An event the state cannot explain: fatal in strict mode, counted otherwise."""
        if self.strict:
            raise _Inconsistent(index, reason)
        self.issues[kind] = self.issues.get(kind, 0) + 1
        if self.first_issue is None:
            self.first_issue = (index, reason)

    # -- the pass -----------------------------------------------------------------
    def _plan(self, *, fuse: bool, stops: Iterable[int], window: tuple[int, int] | None = None) -> None:
        """The events the loop visits.

        Almost every ``free_requested`` is followed at once by the ``free_completed``
        of the same block. In strict mode (the fast path for complete traces) such
        a pair is visited once, as code ``_FUSED_FREE`` at the first index; the loop
        writes the second event's figures itself. Lenient passes visit every event.
        """
        act = self.action
        n = self.n
        self.fused: npt.NDArray[np.intp] = np.zeros(0, dtype=np.intp)
        if not fuse or n < 2:
            lo, hi = (0, n) if window is None else (max(0, window[0]), min(n, window[1]))
            self.p_idx: list[int] = list(range(lo, hi))
            self.p_act: bytes = self.act[lo:hi]
            self.p_addr: list[int] = self.trace_addr[lo:hi].tolist()
            self.p_size: list[int] = self.trace_size[lo:hi].tolist()
            return
        addr = self.trace_addr
        first = np.zeros(n, dtype=bool)
        first[:-1] = (act[:-1] == FREE_REQUESTED) & (act[1:] == FREE_COMPLETED) & (addr[:-1] == addr[1:])
        for k in stops:
            if 0 <= k < n:
                first[k] = False
        visit = np.ones(n, dtype=bool)
        visit[1:] = ~first[:-1]
        idx = np.nonzero(visit)[0]
        codes = act.astype(np.uint8)
        codes[first] = _FUSED_FREE
        self.fused = np.nonzero(first)[0]
        self.p_idx = idx.tolist()
        self.p_act = codes[idx].tobytes()
        self.p_addr = addr[idx].tolist()
        self.p_size = self.trace_size[idx].tolist()

    def run(self, lo: int, hi: int) -> None:
        """Apply events [lo, hi). Raises _Inconsistent in strict mode.

        Action codes are literals here (model.ALLOC == 0, ...): this loop runs once
        per event, and a global lookup per test costs more than the rest of a free.
        """
        if self.core is not None:  # the same loop in C, over the C state (analysis.allocator.compiled)
            self.core.run(self, lo, hi)
            return
        plo = bisect.bisect_left(self.p_idx, lo)
        phi = bisect.bisect_left(self.p_idx, hi)
        p_idx, act, addr, size = self.p_idx, self.p_act, self.p_addr, self.p_size
        if plo or phi < len(p_idx):  # a part of the pass: slice (copies) only then
            p_idx, act, addr, size = p_idx[plo:phi], act[plo:phi], addr[plo:phi], size[plo:phi]
        bs = self.bs
        ns_i, ns_v = self.ns_i, self.ns_v
        lf_i, lf_v = self.lf_i, self.lf_v
        free_sz, free_end, used = self.free_sz, self.free_end, self.used
        seg_size = self.seg_size
        fcount, dist = self.fcount, self.dist
        tmin, tlimit = self.tmin, self.tlimit
        insort, bisect_left = bisect.insort, bisect.bisect_left
        cmode = self.cmode
        plain = self.plain_round
        round_size = self.cfg.round_size
        # should_split, inlined below as numbers from its one definition
        # (AllocatorConfig.split_rule): split iff remainder > over and size < below,
        # small pool (rounded size <= 1 MiB, config.is_small) or large.
        (over_s, below_s), (over_l, below_l) = self.cfg.split_rule(True), self.cfg.split_rule(False)
        strict = self.strict
        counts_split = self._counts_split
        small = K_SMALL_SIZE
        for i, a, ad, sz in zip(p_idx, act, addr, size, strict=True):
            if a == 0:  # alloc
                f = free_sz.pop(ad, None)
                if f is None:
                    self.tmin, self.tlimit = tmin, tlimit
                    self.cur = i
                    self._alloc_slow(i, ad, sz)
                    cmode = self.cmode
                    tmin, tlimit = self.tmin, self.tlimit
                else:
                    r = ((sz + 511) & -512 if sz >= 512 else 512) if plain else round_size(sz)
                    rem = f - r
                    if f >= tmin:
                        c = fcount[f]
                        if c > 1:
                            fcount[f] = c - 1
                        else:
                            del fcount[f]
                            del dist[bisect_left(dist, f)]
                            if len(dist) == 1:
                                self._retrack()
                                tmin, tlimit = self.tmin, self.tlimit
                            lf_i.append(i)
                            lf_v.append(dist[-1])
                    cnt = cmode == 0 or (cmode == 2 and counts_split(ad))
                    if cnt:
                        if seg_size.get(ad) == f:  # a whole segment's block is taken
                            ns_i.append(i)
                            ns_v.append(-f)
                            self._whole_free(i, ad, -1)
                    else:
                        ns_i.append(i)
                        ns_v.append(-f)
                    if rem < 0:
                        self._issue(i, "block-too-small", "alloc larger than the free block")
                        rem = 0
                    if (rem > over_s and r < below_s) if r <= small else (rem > over_l and r < below_l):
                        nf = ad + r
                        free_sz[nf] = rem
                        free_end[ad + f] = nf
                        if rem >= tmin:
                            c = fcount.get(rem, 0)
                            if c:
                                fcount[rem] = c + 1
                            else:
                                fcount[rem] = 1
                                insort(dist, rem)
                                if len(dist) > tlimit:
                                    self._retrack()
                                    tmin, tlimit = self.tmin, self.tlimit
                                lf_i.append(i)
                                lf_v.append(dist[-1])
                        if not cnt:
                            ns_i.append(i)
                            ns_v.append(rem)
                        bs[i] = r
                    else:
                        del free_end[ad + f]
                        bs[i] = f
                    used[ad] = i
            elif a == 9 or a == 2:  # _FUSED_FREE (free_requested + free_completed), or free_completed
                ref = used.pop(ad, None)
                if a == 9:
                    j = i + 1
                    if ref is None or ref < 0:
                        raise _Inconsistent(i, "free of an address with no allocated block")
                    b = bs[ref]  # bs[i] (the request's) is copied from bs[j] after the pass
                else:
                    j = i
                    if ref is None:
                        self._issue(i, "unknown-free", "free of an address with no active block")
                        self.ignored.append(i)
                        continue
                    if ref < 0:
                        b = bs[~ref]
                    else:
                        b = bs[ref]
                        if strict:
                            used[ad] = ref
                            raise _Inconsistent(i, "free_completed without free_requested")
                        self._issue(i, "unrequested-free", "free_completed without free_requested")
                        self.adj_alloc[i] = -b
                bs[j] = b
                cnt = cmode == 0 or (cmode == 2 and counts_split(ad))
                start = ad
                end = ad + b
                # Merge with free neighbours of the same segment. The neighbour
                # is looked up first: a segment boundary matters only if it is free.
                ns = free_sz.pop(end, None)
                if ns is not None:
                    if end in seg_size:
                        free_sz[end] = ns
                    else:
                        del free_end[end + ns]
                        if ns >= tmin:
                            c = fcount[ns]
                            if c > 1:
                                fcount[ns] = c - 1
                            else:
                                del fcount[ns]
                                del dist[bisect_left(dist, ns)]
                        end += ns
                ps = free_end.pop(ad, None)
                if ps is not None:
                    if ad in seg_size:
                        free_end[ad] = ps
                    else:
                        psz = free_sz.pop(ps)
                        if psz >= tmin:
                            c = fcount[psz]
                            if c > 1:
                                fcount[psz] = c - 1
                            else:
                                del fcount[psz]
                                del dist[bisect_left(dist, psz)]
                        start = ps
                m = end - start
                free_sz[start] = m
                free_end[end] = start
                # m exceeds each block it absorbed: if one was tracked, m is too, and
                # if that one was the largest, m is a new size, recorded here.
                if m >= tmin:
                    c = fcount.get(m, 0)
                    if c:
                        fcount[m] = c + 1
                    else:
                        fcount[m] = 1
                        insort(dist, m)
                        if len(dist) > tlimit:
                            self._retrack()
                            tmin, tlimit = self.tmin, self.tlimit
                        lf_i.append(j)
                        lf_v.append(dist[-1])
                # Blocks merged into m were split ones: only m itself may change
                # the nonsplit bytes (a whole segment again, or expandable).
                if not cnt:
                    ns_i.append(j)
                    ns_v.append(b)
                elif seg_size.get(start) == m:
                    ns_i.append(j)
                    ns_v.append(m)
                    self._whole_free(j, start, 1)
                continue
            elif a == 1:  # free_requested
                ref = used.get(ad, -1)
                if ref < 0:
                    self._issue(i, "unknown-free", "free of an address with no allocated block")
                    self.ignored.append(i)
                else:
                    used[ad] = ~ref
                    bs[i] = bs[ref]
                # Only allocated moves here (by bs[i]); no block changes place.
                continue
            elif 3 <= a <= 6:
                self.tmin, self.tlimit = tmin, tlimit
                self.cur = i
                if a == 3:
                    self._segment_alloc(i, ad, sz)
                elif a == 4:
                    self._segment_free(i, ad, sz)
                elif a == 5:
                    self._segment_map(i, ad, sz)
                else:
                    self._segment_unmap(i, ad, sz)
                cmode = self.cmode
                tmin, tlimit = self.tmin, self.tlimit
        self.tmin, self.tlimit = tmin, tlimit

    # -- slow paths (rare events, or repairs on an incomplete trace) ----------------
    def _alloc_slow(self, i: int, ad: int, req: int) -> None:
        """An alloc where no free block starts: repair the state, then allocate."""
        self._issue(i, "alloc-outside-free", "alloc at an address where no free block starts")
        r = self.cfg.round_size(req)
        fs = self._free_containing(ad)
        if fs is None:
            us = self._used_containing(ad)
            if us is None:
                # Outside every known segment: keep the block, attached to nothing.
                self.used[ad] = i
                self.bs[i] = r
                return
            # Inside a live block whose size was guessed too large: cut it at ad.
            ref = self.used[us]
            ref = ref if ref >= 0 else ~ref
            cut = us + self.bs[ref] - ad
            self.bs[ref] -= cut
            if ref >= self.n:
                # A block from before the trace: the initial figures hold its old size.
                self.adj_active[i] = self.adj_active.get(i, 0) - cut
                if self.used[us] >= 0:
                    self.adj_alloc[i] = self.adj_alloc.get(i, 0) - cut
            self._add_free(ad, cut)
        else:
            total = self._remove_free(fs)
            self._add_free(fs, ad - fs)
            self._add_free(ad, fs + total - ad)
        f = self._remove_free(ad)
        b = f
        if f > r and self.cfg.should_split(f, r, is_small(r)):
            self._add_free(ad + r, f - r)
            b = r
        self.used[ad] = i
        self.bs[i] = b

    def _overlaps(self, start: int, size: int) -> bool:
        starts = self.starts
        j = bisect.bisect_right(starts, start) - 1
        if j >= 0 and starts[j] + self.seg_size[starts[j]] > start:
            return True
        return j + 1 < len(starts) and starts[j + 1] < start + size

    def _segment_type(self, i: int, size: int) -> str:
        """Small or large pool: from the request the segment was made for."""
        act, sizes = self.act, self.trace_size
        for j in range(i + 1, min(self.n, i + _LOOKAHEAD)):
            if act[j] == ALLOC:
                return "small" if is_small(self.cfg.round_size(int(sizes[j]))) else "large"
        return "small" if size == K_SMALL_BUFFER else "large"

    def _meta_of_event(self, i: int, size: int, expandable: bool) -> _Meta:
        pool = int(self.pool[i])
        final = self.final_meta.get(int(self.trace_addr[i]))
        if final is not None and (final[0] == size or expandable):
            return int(self.stream[i]), pool or final[1], final[2], expandable, int(self.stack[i])
        return int(self.stream[i]), pool, self._segment_type(i, size), expandable, int(self.stack[i])

    def _segment_alloc(self, i: int, ad: int, sz: int) -> None:
        if self._overlaps(ad, sz):
            self._issue(i, "segment-overlap", "segment_alloc over a known segment")
            self.ignored.append(i)
            return
        self._add_segment(ad, sz, self._meta_of_event(i, sz, False))
        self._add_free(ad, sz)

    def _segment_free(self, i: int, ad: int, sz: int) -> None:
        if self.seg_size.get(ad) != sz or self.free_sz.get(ad) != sz:
            self._issue(i, "unknown-segment", "segment_free of a segment not known whole and free")
            self.ignored.append(i)
            return
        self._remove_free(ad)
        self._drop_segment(ad)

    def _segment_map(self, i: int, ad: int, sz: int) -> None:
        end = ad + sz
        if self._overlaps(ad, sz):
            self._issue(i, "segment-overlap", "segment_map over a mapped range")
            self.ignored.append(i)
            return
        stream, pool = int(self.stream[i]), int(self.pool[i])
        start, stop = ad, end
        meta: _Meta | None = None

        # Mapped ranges of one reservation that touch become one segment (the
        # snapshot reports contiguous mapped ranges), and the allocator merges
        # their free blocks across the old boundary.
        # Pool 0 on the event may only mean "not recorded" (torch <= 2.11).
        def same_reservation(meta: _Meta) -> bool:
            return meta[3] and meta[0] == stream and (pool == 0 or meta[1] == pool)

        prev = self.seg_end.get(ad)
        if prev is not None and same_reservation(self.seg_meta[prev]):
            meta = self._drop_segment(prev)
            start = prev
        if end in self.seg_size:
            nmeta = self.seg_meta[end]
            if same_reservation(nmeta):
                stop = end + self.seg_size[end]
                self._drop_segment(end)
                meta = meta or nmeta
        if meta is None:
            meta = self._meta_of_event(i, sz, True)
        self._add_segment(start, stop - start, meta)
        lo, hi = ad, end
        if start < ad:
            ps = self.free_end.get(ad)
            if ps is not None:
                self._remove_free(ps)
                lo = ps
        if end < stop and end in self.free_sz:
            hi = end + self._remove_free(end)
        self._add_free(lo, hi - lo)

    def _segment_unmap(self, i: int, ad: int, sz: int) -> None:
        end = ad + sz
        fs = self._free_containing(ad)
        seg = self._segment_of(ad)
        if (
            fs is None
            or fs + self.free_sz[fs] < end
            or seg is None
            or not self.seg_meta[seg][3]
            or seg + self.seg_size[seg] < end
        ):
            self._issue(i, "unknown-segment", "segment_unmap outside a free mapped block")
            self.ignored.append(i)
            return
        fe = fs + self._remove_free(fs)
        seg_stop = seg + self.seg_size[seg]
        meta = self._drop_segment(seg)
        if seg < ad:
            self._add_segment(seg, ad - seg, meta)
        if end < seg_stop:
            self._add_segment(end, seg_stop - end, meta)
        if fs < ad:
            self._add_free(fs, ad - fs)
        if end < fe:
            self._add_free(end, fe - end)

    # -- views --------------------------------------------------------------------
    def export(self, index: int) -> AllocatorState:
        """The current state as segments and blocks."""
        n, size, stack, bs = self.n, self.trace_size, self.stack, self.bs
        blocks: list[tuple[int, int, bool, int]]  # (address, size, free, ref)
        if self.core is not None:
            blocks, held = self.core.blocks()
            seg_size = {s: z for s, z, _ in held}
            seg_meta = {s: m for s, _, m in held}
        else:
            blocks = [(a, s, True, 0) for a, s in self.free_sz.items()]
            for a, ref in self.used.items():
                blocks.append((a, bs[ref if ref >= 0 else ~ref], False, ref))
            seg_size, seg_meta = self.seg_size, self.seg_meta
        blocks.sort()
        addrs = [b[0] for b in blocks]
        segments = []
        for start in sorted(seg_size):
            stop = start + seg_size[start]
            stream, pool, seg_type, expandable, seg_stack = seg_meta[start]
            lo = bisect.bisect_left(addrs, start)
            hi = bisect.bisect_left(addrs, stop)
            out = []
            for a, s, free, ref in blocks[lo:hi]:
                if free:
                    out.append(BlockState(a, s, 0, INACTIVE))
                    continue
                state = ACTIVE_PENDING_FREE if ref < 0 else ACTIVE_ALLOCATED
                r = ref if ref >= 0 else ~ref
                if r < n:
                    out.append(BlockState(a, s, int(size[r]), state, int(stack[r]), r))
                else:
                    p = self.pre[r - n]  # alloc_index: -1, or the event of a block seeded from a checkpoint
                    out.append(BlockState(a, s, p.requested_size, state, p.stack, p.alloc_index))
            segments.append(
                SegmentState(start, stop - start, stream, pool, seg_type, expandable, tuple(out), seg_stack)
            )
        return AllocatorState(index, tuple(segments))

    def state_after(self, index: int) -> AllocatorState:
        """The state after ``index``, by a lenient pass from the initial state.

        The pass is resumed, not restarted, when calls come in increasing order, so
        a caller walking forward through many indices pays for one pass in all.
        """
        if index < 0:
            return self.initial
        if self.demand_pos is None or index + 1 < self.demand_pos:
            self.seed(self.initial, strict=False)
            self.demand_pos = 0
        self.run(self.demand_pos, index + 1)
        self.demand_pos = index + 1
        return self.export(index)


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


# ----------------------------------------------------------------------------------
# Rebuilding the state at the first event of an incomplete trace
# ----------------------------------------------------------------------------------


def _final_state(device: DeviceData, index: int) -> AllocatorState:
    segments = []
    for s in sorted(device.segments, key=lambda s: s.address):
        blocks = tuple(
            BlockState(b.address, b.size, b.requested_size if b.state != INACTIVE else 0, b.state, b.stack)
            for b in s.blocks
        )
        segments.append(
            SegmentState(
                s.address,
                s.total_size,
                s.stream,
                s.pool,
                s.segment_type,
                s.is_expandable,
                blocks,
                s.stack,
            )
        )
    return AllocatorState(index, tuple(segments))


@dataclass(slots=True)
class _Rebuilt:
    state: AllocatorState
    orphans: int  # blocks live before the trace that no segment at its start holds
    conflicts: int  # guessed sizes that had to be clipped to the next block


def _rebuild_initial(device: DeviceData, cfg: AllocatorConfig, final: AllocatorState) -> _Rebuilt:
    """The state at the first event, from the final segments and the trace.

    Segments: undo the segment events backwards from the final ones (as MemoryViz
    does). Live blocks: those freed in the trace before any alloc at their address,
    plus final live blocks that the trace never allocated. Their layout gives the
    free blocks (the allocator always merges neighbouring free blocks). The size of
    a block freed in the trace but allocated before it is not recorded: it is the
    rounded request, plus the rest of the gap behind it where ``should_split``
    would not have split that gap off.
    """
    tr = device.trace
    act = tr.action
    addr, size = tr.addr, tr.size
    segs: dict[int, tuple[int, _Meta]] = {
        s.address: (s.total_size, (s.stream, s.pool, s.segment_type, s.is_expandable, s.stack)) for s in final.segments
    }
    seg_events = np.nonzero((act >= SEGMENT_ALLOC) & (act <= SEGMENT_UNMAP))[0][::-1]
    for i in seg_events.tolist():
        a, ad, sz = int(act[i]), int(addr[i]), int(size[i])
        stream, pool, stack = int(tr.stream[i]), int(tr.pool[i]), int(tr.stack[i])
        if a == SEGMENT_ALLOC:
            segs.pop(ad, None)
        elif a == SEGMENT_FREE:
            kind = "small" if sz == K_SMALL_BUFFER else "large"
            segs[ad] = (sz, (stream, pool, kind, False, stack))
        elif a == SEGMENT_MAP:
            _unmap_range(segs, ad, sz)
        else:
            _map_range(segs, ad, sz, (stream, pool, "", True, stack))

    live: dict[int, int] = {}
    pre: dict[int, BlockState] = {}
    idx = np.nonzero(act <= FREE_COMPLETED)[0]
    stacks = tr.stack[idx].tolist()
    for a, ad, sz, st in zip(act[idx].tolist(), addr[idx].tolist(), size[idx].tolist(), stacks, strict=True):
        if a == ALLOC:
            live[ad] = 1
        elif a == FREE_REQUESTED:
            if ad not in live and ad not in pre:
                pre[ad] = BlockState(ad, 0, sz, ACTIVE_ALLOCATED, st)
            live[ad] = 2
        elif live.pop(ad, None) is None and ad not in pre:
            pre[ad] = BlockState(ad, 0, sz, ACTIVE_PENDING_FREE, st)
    exact: dict[int, BlockState] = {}
    for _, b in final.live_blocks():
        if b.address not in live and b.address not in pre:
            exact[b.address] = b

    starts = sorted(segs)
    per_seg: dict[int, list[BlockState]] = {s: [] for s in starts}
    orphans = 0
    for b in list(pre.values()) + list(exact.values()):
        j = bisect.bisect_right(starts, b.address) - 1
        if j < 0 or b.address >= starts[j] + segs[starts[j]][0]:
            orphans += 1
            continue
        per_seg[starts[j]].append(b)

    conflicts = 0
    segments = []
    for start in starts:
        total, (stream, pool, seg_type, expandable, stack) = segs[start]
        stop = start + total
        held = sorted(per_seg[start], key=lambda b: b.address)
        out: list[BlockState] = []
        cursor = start
        for k, b in enumerate(held):
            nxt = held[k + 1].address if k + 1 < len(held) else stop
            if b.address < cursor:
                conflicts += 1
                continue
            if b.address > cursor:
                out.append(BlockState(cursor, b.address - cursor, 0, INACTIVE))
            if b.size:
                bsize = b.size
            else:
                r = cfg.round_size(b.requested_size)
                gap = nxt - (b.address + r)
                if gap < 0:
                    conflicts += 1
                    bsize = max(nxt - b.address, K_MIN_BLOCK_SIZE)
                elif gap and not (expandable or cfg.should_split(r + gap, r, is_small(r))):
                    bsize = r + gap
                else:
                    bsize = r
            out.append(BlockState(b.address, bsize, b.requested_size, b.state, b.stack))
            cursor = b.address + bsize
        if cursor < stop:
            out.append(BlockState(cursor, stop - cursor, 0, INACTIVE))
        if not seg_type:  # a range put back by undoing an unmap, next to no other
            seg_type = "large" if total % K_LARGE_BUFFER == 0 else "small"
        segments.append(SegmentState(start, total, stream, pool, seg_type, expandable, tuple(out), stack))
    return _Rebuilt(AllocatorState(-1, tuple(segments)), orphans, conflicts)


def _unmap_range(segs: dict[int, tuple[int, _Meta]], ad: int, sz: int) -> None:
    """Undo a segment_map: cut [ad, ad+sz) out of the mapped range holding it."""
    end = ad + sz
    for start, (total, meta) in list(segs.items()):
        stop = start + total
        if meta[3] and start <= ad and end <= stop:
            del segs[start]
            if start < ad:
                segs[start] = (ad - start, meta)
            if end < stop:
                segs[end] = (stop - end, meta)
            return


def _map_range(segs: dict[int, tuple[int, _Meta]], ad: int, sz: int, meta: _Meta) -> None:
    """Undo a segment_unmap: put [ad, ad+sz) back, joined to touching ranges."""
    start, stop = ad, ad + sz
    for s, (total, m) in list(segs.items()):
        if not m[3] or m[0] != meta[0] or (meta[1] and m[1] != meta[1]):
            continue
        e = s + total
        if e == ad or s == stop:
            del segs[s]
            start, stop = min(start, s), max(stop, e)
            meta = m
    segs[start] = (stop - start, meta)


# ----------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------


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


def _core_columns(core: Any, n: int, init: StateFigures) -> tuple[dict[str, I64], list[tuple[int, int]]]:
    """``_columns`` and the two columns ``_finished`` derives from them, summed by the C state itself
    into fresh arrays (its records never become Python objects), less ``active`` (made when read:
    ``RecordedReplay.active``); and ``_peak`` of allocated, requested and reserved, found by the
    same pass."""
    names = ("allocated", "requested", "reserved", "cached_free", "inactive_split", "largest_free")
    cols = {k: np.empty(n, dtype=np.int64) for k in names}
    nonsplit = init.cached_free - init.inactive_split
    start = (init.allocated, init.requested, init.reserved, init.active, nonsplit, init.largest_free)
    maxima = core.columns(*cols.values(), start, CORE_COLUMNS_SCATTER)  # ((value, first event), ...); -1: none
    peaks = [
        _peak_over(v, j, initial)
        for (v, j), initial in zip(maxima, (init.allocated, init.requested, init.reserved), strict=True)
    ]
    return cols, peaks


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
        cols, peaks = _core_columns(rep.core, n, init)
        cached_free, inactive_split = cols["cached_free"], cols["inactive_split"]
    else:
        cols = _columns(rep, device, init)
        cached_free = cols["reserved"] - cols["active"]
        inactive_split = np.subtract(cached_free, cols["nonsplit"], out=cols["nonsplit"])
    allocated, requested, reserved = (cols["allocated"], cols["requested"], cols["reserved"])
    largest_free = cols["largest_free"]
    if rep.core is None:
        peaks = [_peak(allocated, init.allocated), _peak(requested, init.requested), _peak(reserved, init.reserved)]

    if n:
        final_figures = StateFigures(
            int(allocated[-1]),
            int(requested[-1]),
            int(reserved[-1]),
            int(reserved[-1]) - int(cached_free[-1]),  # active
            int(cached_free[-1]),
            int(inactive_split[-1]),
            int(largest_free[-1]),
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
        requested=requested,
        reserved=reserved,
        cached_free=cached_free,
        inactive_split=inactive_split,
        largest_free=largest_free,
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
