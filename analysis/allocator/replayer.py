"""The recorded replay's pass: one device's block-level state, moved forward event by event (``_Replayer``).

It follows the recorded addresses and infers each block's size the way ``DeviceCachingAllocator``
chose it (``allocator.recorded`` says how, and what each statistic counts); ``recorded_replay`` runs it
once over a trace and keeps the states asked for, ``RecordedReplay.blocks_at`` and ``resume_state``
run it again, leniently, to an event.

The inner loop is plain Python over lists with dicts keyed by address (blocks of
one device never overlap, so an address names one block at a time); the figures
that need no block sizes (``requested``, ``reserved``) are computed with numpy.
Where it is built, the state and its moves live in C instead (``analysis.allocator.compiled``:
maps of int64 keyed by address, the columns summed into numpy arrays), every method that moves
the state written again there; this one stays the reference.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator import compiled
from analysis.allocator.config import K_MIN_BLOCK_SIZE, K_SMALL_BUFFER, K_SMALL_SIZE, AllocatorConfig, is_small
from analysis.allocator.states import AllocatorState, BlockState, SegmentState, _Meta
from analysis.model import (
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    INACTIVE,
    DeviceData,
)

# Upper bound on how far to look for the alloc that a new segment was made for.
_LOOKAHEAD = 64
# Loop-only action code: a free_requested fused with the free_completed after it.
_FUSED_FREE = 9
# Distinct free-block sizes tracked for largest_free before the set is rebuilt.
_TRACK_LIMIT = 8


class _Inconsistent(Exception):
    """Raised (strict mode only) at the first event the current state cannot explain."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"event {index}: {reason}")
        self.index = index
        self.reason = reason


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
