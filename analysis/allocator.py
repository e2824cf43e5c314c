"""Policy replay: a model of PyTorch's native CUDA caching allocator, fed the requests alone.

``recorded_replay`` (replay.py) follows the addresses the trace recorded. This
module forgets every decision the allocator made and takes only the *requests*
of one device's trace: the ``alloc`` sizes with their stream and pool, the order
of the frees, cross-stream frees that complete later (``free_requested`` without
its ``free_completed``), ``oom`` requests, and the ``empty_cache()`` calls made by
user code. It then chooses blocks and segments as ``DeviceCachingAllocator``
does (c10/cuda/CUDACachingAllocator.cpp, torch 2.11; see
../shared/docs/snapshot-format.md §3) under an ``AllocatorConfig`` and a memory
limit, so it can answer "would ``expandable_segments:True`` have saved this run".

What is modelled (the names are those of the C++ source):

- ``round_size`` / ``get_allocation_size`` / ``should_split`` from
  ``analysis.config``; small (<= 1 MiB) and large pools; one free list per
  (pool, small|large, stream), best fit ordered by (size, address).
- ``get_free_block`` with the ``max_split_size`` filters (oversize blocks serve
  only requests within ``max_non_split_rounding_size``), and with expandable
  segments the walk that compares "free block + unmapped tail".
- ``malloc``'s miss path in order: ``garbage_collect_cached_blocks`` (only with
  a limit, i.e. a per-process cap, and a threshold), ``alloc_block`` (fails when
  ``reserved + alloc_size > limit``), ``release_available_cached_blocks`` (only
  with ``max_split_size``), ``release_cached_blocks`` (the ``empty_cache``
  flush, skipped while a CUDA graph captures into a private pool), then OOM.
- Expandable segments: one VA reservation per (pool, stream), grown by mapping
  whole pages (2 MiB small, ``large_segment_size`` large) at the lowest
  address with room; the flush unmaps only whole free pages and gives back a
  reservation once it is entirely unmapped.
- Frees merge with free neighbours of the same segment; a pending free
  (``record_stream``) is not reusable until its recorded ``free_completed``, or
  until a flush synchronises every pending free.
- Private pools (CUDA graphs, ``MemPool``) keep their own free lists; a flush
  releases one only from the moment the trace shows it being released.

A trace that starts mid-run (wrapped ring buffer) starts from the state before
its first event as ``analysis.replay`` reconstructs it.

Addresses are simulated: cudaMalloc'd segments come from a bump pointer and
expandable reservations sit at fixed strides. Only sizes, order and fit matter;
ties between equal-sized free blocks are broken by these simulated addresses.

Requests come from the trace as recorded, so after a request that the model
fails (an OOM the real run did not hit) the replay continues: the failed block
simply does not exist and its later free is ignored. A recorded OOM request
that the model can serve is allocated and kept to the end (the real program
never freed it). ``oom_avoided`` asks whether the final recorded OOM request and
every request before it were served.

Speed: the hot path (a best-fit hit and a free with merges) runs inline in one
loop over pre-filtered columns, on sorted lists of packed ``size << 57 | addr``
integers searched with ``bisect``; everything else is a method call.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.config import K_SMALL_BUFFER, UNLIMITED, AllocatorConfig, is_small, limit_refuses, small_pool
from analysis.model import (
    ACTIONS,
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    INACTIVE,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    DeviceData,
    Snapshot,
)

I64 = npt.NDArray[np.int64]

__all__ = [
    "LimitEstimate",
    "PolicyResult",
    "SegmentLayout",
    "infer_limit",
    "recorded_layout",
    "recorded_segment_events",
    "replay_check",
    "same_layout",
    "simulate",
    "simulate_layout",
    "step_end_indices",
    "trace_is_complete",
    "whatif",
]

# Free-list keys pack a block as (size << _SH) | address, so one bisect on
# plain ints orders by (size, address) as the C++ comparator does per stream.
_SH = 57

# Simulated virtual addresses (all below 2**_SH).
_SEG_BASE = 1 << 52  # cudaMalloc'd segments: a bump pointer from here
_RESV_STRIDE = 1 << 41  # expandable reservations at multiples of this (below _SEG_BASE)
_RESV_BYTES = 1 << 40  # VA of one reservation (torch: 1.125 x the GPU's memory)

# Operation codes of the pre-filtered request stream.
_OP_ALLOC, _OP_FREE, _OP_FREE_REQ, _OP_FREE_DONE, _OP_OOM, _OP_FLUSH = 0, 1, 2, 3, 4, 5

_SEGMENT_ACTIONS = (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP)


# --------------------------------------------------------------------------- results


@dataclass(slots=True)
class PolicyResult:
    """What the model did with one device's requests.

    ``oom`` is the event index of the first request the model could not serve
    (``ooms`` lists all of them; the replay continues past each). Reserved
    memory after any event is ``reserved_at([i])``; the whole column is
    ``reserved_per_event()``.
    """

    config: AllocatorConfig
    limit_bytes: int | None
    events: int
    peak_reserved: int
    final_reserved: int
    oom: int | None
    ooms: list[int]
    oom_avoided: bool | None
    segment_events: list[tuple[str, int]]
    segment_event_index: list[int]
    flushes: list[int]  # event indices where the model ran release_cached_blocks
    step_ends: list[int] = field(default_factory=list)
    step_reserved: list[int] = field(default_factory=list)
    change_index: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    change_reserved: I64 = field(default_factory=lambda: np.zeros(0, np.int64))

    def reserved_at(self, indices: Sequence[int]) -> list[int]:
        """Reserved bytes right after each event index (-1: before the first event)."""
        if len(indices) == 0:
            return []
        idx = np.asarray(indices, dtype=np.int64)
        pos = np.searchsorted(self.change_index, idx, side="right") - 1
        vals = np.where(pos >= 0, self.change_reserved[np.maximum(pos, 0)], 0)
        return [int(v) for v in vals]

    def reserved_per_event(self) -> I64:
        """Reserved bytes after every event, one int64 per trace event."""
        pos = np.searchsorted(self.change_index, np.arange(self.events), side="right") - 1
        return np.where(pos >= 0, self.change_reserved[np.maximum(pos, 0)], 0).astype(np.int64)


@dataclass(frozen=True, slots=True)
class LimitEstimate:
    """The interval the memory limit must lie in, from the trace alone.

    ``lower`` is the largest ``reserved + alloc_size`` the limit let through
    (the peak reserved memory, without expandable segments); ``upper``
    (None: no evidence of any limit) is one less than the smallest
    ``reserved + alloc_size`` that the allocator refused: at a flush-and-retry
    before a new segment, and at an OOM. ``device_full`` is
    ``reserved + device_free`` at an OOM where the device itself had less free
    memory than the segment needed (no per-process cap was binding).
    """

    lower: int
    upper: int | None
    device_full: int | None
    evidence: int  # how many refusals (and GC runs) bound the limit
    gc_upper: int | None = None  # largest limit under which every recorded GC run starts
    gc_lower: int | None = None  # least limit under which every miss without a GC run skips it

    @property
    def binding(self) -> bool:
        return self.upper is not None or self.device_full is not None or self.gc_upper is not None

    @property
    def value(self) -> int | None:
        """The limit to replay under: None when nothing shows one was reached.

        With GC runs recorded it is the largest limit that starts every one of
        them (the GC's target depends on it); otherwise the least limit the trace
        allows, which a flush or an OOM already shows was binding.
        """
        if self.device_full is not None:
            return max(self.device_full, self.lower)
        if self.gc_upper is not None:
            bound = self.gc_upper if self.upper is None else min(self.gc_upper, self.upper)
            floor = max(self.lower, self.gc_lower or 0)
            # Every limit in [floor, bound] starts and skips the GC where the trace
            # did; the middle keeps the GC's target (reserved - threshold x limit)
            # nearest to the real one whichever end the real cap lies at.
            return max(bound, floor) if floor >= bound else (floor + bound) // 2
        if self.upper is None:
            return None
        return self.lower


# --------------------------------------------------------------------------- the model


# A block is a small list, so the hot path follows neighbours without hashing:
# [size, address, prev | None, next | None, state]; state is True for a block in
# a free list, None for an unmapped range of an expandable reservation, False for
# an allocated block or a pending free (so "is free" is one truth test).
_SIZE, _ADDR, _PREV, _NEXT, _STATE = 0, 1, 2, 3, 4


def _grown(b: list[Any]) -> int:
    """A free block's size plus the unmapped range right after it (expandable segments)."""
    nb = b[_NEXT]
    return int(b[_SIZE]) + (nb[_SIZE] if nb and nb[_STATE] is None else 0)


class _Model:
    """State of one simulated ``DeviceCachingAllocator``.

    A free list is two parallel Python lists: sorted packed keys (searched with
    ``bisect``) and the blocks they stand for, kept in step by inserting and
    deleting at the same position (cheaper than a dict from address to block).
    Unmapped ranges of expandable reservations are kept the same way, by address.
    A free-list index ``lk`` is ``(pool * 2 + large) * n_streams + stream``.
    """

    def __init__(
        self,
        cfg: AllocatorConfig,
        limit: int | None,
        n_pools: int,
        streams: list[int],
        freeable_from: dict[int, int],
        recorded: tuple[list[int], list[int], list[int]] = ([], [], []),
    ) -> None:
        self.cfg = cfg
        # The recorded segment events (action, size, address). While the model's own
        # segment events equal them one for one (``lockstep``), a new cudaMalloc'd
        # segment takes the address the driver really returned: free blocks of equal
        # size are chosen by address, and the driver's placement is not a bump pointer.
        self.rec_act, self.rec_size, self.rec_addr = recorded
        self.lockstep = True
        self.limit = limit
        self.mss = cfg.max_split_size
        self.nsr = cfg.max_non_split_rounding_size
        self.exp = cfg.expandable_segments
        self.gc_on = cfg.garbage_collection_threshold > 0.0 and limit is not None
        self.ns = len(streams) or 1
        n_lists = n_pools * 2 * self.ns
        self.keys: list[list[int]] = [[] for _ in range(n_lists)]
        self.blks: list[list[list[Any]]] = [[] for _ in range(n_lists)]
        self.ukeys: list[list[int]] = [[] for _ in range(n_lists)]  # unmapped ranges, by address
        self.ublks: list[list[list[Any]]] = [[] for _ in range(n_lists)]
        # Free lists of one BlockPool in the C++ set's order: by raw stream value.
        order = sorted(range(self.ns), key=lambda s: streams[s] if s < len(streams) else 0)
        self.bp_lists = [[bp * self.ns + s for s in order] for bp in range(n_pools * 2)]
        self.freeable_from = freeable_from
        self.pend: dict[int, tuple[list[Any], int]] = {}  # pending frees by address, in order
        self.pmap: dict[int, list[Any]] = {}  # recorded address -> pending block
        self.amap: dict[int, list[Any]] = {}  # recorded address -> allocated block
        self.reserved = 0
        self.peak = 0
        self.seg_act: list[int] = []
        self.seg_size: list[int] = []
        self.seg_idx: list[int] = []
        self.flushes: list[int] = []
        self.next_seg = _SEG_BASE
        self.next_resv = _RESV_STRIDE
        self.gcc = 0  # get_free_block calls on the default large pool (GC ages)
        self.gcb: dict[int, int] = {}  # address -> gcc when that block entered a free list
        self.cur = 0  # event index being served
        # Segment heads (first block of a cudaMalloc'd segment or of an expandable
        # reservation), by simulated address, with their free-list index: the final
        # layout walks them.
        self.heads: dict[int, tuple[list[Any], int]] = {}

    # -- bookkeeping ------------------------------------------------------------
    def _record(self, action: int, size: int) -> None:
        if self.lockstep:
            j = len(self.seg_act)
            if j >= len(self.rec_act) or self.rec_act[j] != action or self.rec_size[j] != size:
                self.lockstep = False
        self.seg_act.append(action)
        self.seg_size.append(size)
        self.seg_idx.append(self.cur)

    def _insert(self, lk: int, b: list[Any]) -> None:
        kl = self.keys[lk]
        key = (b[_SIZE] << _SH) | b[_ADDR]
        j = bisect_left(kl, key)
        kl.insert(j, key)
        self.blks[lk].insert(j, b)
        b[_STATE] = True
        if self.gc_on:
            self.gcb[b[_ADDR]] = self.gcc

    def _remove(self, lk: int, b: list[Any]) -> None:
        kl = self.keys[lk]
        j = bisect_left(kl, (b[_SIZE] << _SH) | b[_ADDR])
        del kl[j]
        del self.blks[lk][j]
        b[_STATE] = False

    def _uinsert(self, lk: int, b: list[Any]) -> None:
        ul = self.ukeys[lk]
        j = bisect_left(ul, b[_ADDR])
        ul.insert(j, b[_ADDR])
        self.ublks[lk].insert(j, b)
        b[_STATE] = None

    def _uremove(self, lk: int, b: list[Any]) -> None:
        ul = self.ukeys[lk]
        j = bisect_left(ul, b[_ADDR])
        del ul[j]
        del self.ublks[lk][j]

    def _page(self, lk: int) -> int:
        return self.cfg.page_size(not (lk // self.ns) & 1)

    # -- malloc -------------------------------------------------------------------
    def get_free_block(self, lk: int, size: int) -> list[Any] | None:
        """Best fit on the request's (pool, stream); removes and returns the block."""
        if self.gc_on and lk // self.ns == 1:
            self.gcc += 1
        kl = self.keys[lk]
        bl = self.blks[lk]
        i = bisect_left(kl, size << _SH)
        n = len(kl)
        if i >= n:
            return None
        if self.exp:
            # Best fit by "free block + the unmapped range after it": walk on while
            # the next candidate can grow to less than the current one.
            cur = _grown(bl[i])
            while i + 1 < n:
                nxt = _grown(bl[i + 1])
                if nxt >= cur:
                    break
                i += 1
                cur = nxt
        if kl[i] >> _SH >= self.cfg.fit_limit(size):
            return None  # the max_split_size filter (config.block_fits)
        del kl[i]
        b = bl.pop(i)
        b[_STATE] = False
        return b

    def miss(self, lk: int, size: int, alloc_size: int) -> list[Any] | None:
        """``malloc`` after ``get_free_block`` missed: GC, new segment, flushes. None = OOM."""
        if self.gc_on:
            self.garbage_collect()
        b = self.alloc_block(lk, size, alloc_size)
        if b is None and self.mss != UNLIMITED and self.release_available(lk, size):
            b = self.alloc_block(lk, size, alloc_size)
        # A request into a private pool means a capture is underway: no flush then.
        if b is None and lk // self.ns < 2:
            self.release_cached(self.cur)
            b = self.alloc_block(lk, size, alloc_size)
        return b

    def split(self, lk: int, b: list[Any], size: int) -> int:
        """``should_split`` + ``alloc_found_block``: returns the handed-out size."""
        rem = b[_SIZE] - size
        if not self.cfg.should_split(b[_SIZE], size, is_small(size)):
            return int(b[_SIZE])
        n = b[_NEXT]
        r = [rem, b[_ADDR] + size, b, n, True]
        if n:
            n[_PREV] = r
        b[_NEXT] = r
        b[_SIZE] = size
        self._insert(lk, r)
        return size

    def free_block(self, lk: int, b: list[Any]) -> list[Any]:
        """``free_block``: merge with free neighbours, back into the free list; returns
        the merged block."""
        p = b[_PREV]
        if p and p[_STATE]:
            self._remove(lk, p)
            n = b[_NEXT]
            p[_NEXT] = n
            if n:
                n[_PREV] = p
            p[_SIZE] += b[_SIZE]
            b = p
        n = b[_NEXT]
        if n and n[_STATE]:
            self._remove(lk, n)
            nn = n[_NEXT]
            b[_NEXT] = nn
            if nn:
                nn[_PREV] = b
            b[_SIZE] += n[_SIZE]
        self._insert(lk, b)
        return b

    def alloc_block(self, lk: int, size: int, alloc_size: int) -> list[Any] | None:
        """A new segment (or mapped pages) for the request; None when the limit refuses."""
        if limit_refuses(self.reserved, alloc_size, self.limit):
            return None
        if self.exp:
            return self._alloc_expandable(lk, size)
        j = len(self.seg_act)
        rec_act, rec_size = self.rec_act, self.rec_size
        if self.lockstep and j < len(rec_act) and rec_act[j] == SEGMENT_ALLOC and rec_size[j] == alloc_size:
            address = self.rec_addr[j]
        else:
            address = self.next_seg
            self.next_seg += alloc_size
        b = [alloc_size, address, None, None, False]
        self.heads[address] = (b, lk)
        self.reserved += alloc_size
        if self.reserved > self.peak:
            self.peak = self.reserved
        self._record(SEGMENT_ALLOC, alloc_size)
        return b

    def _release_block(self, lk: int, b: list[Any]) -> None:
        """``release_block``: cudaFree a whole free segment."""
        self._remove(lk, b)
        del self.heads[b[_ADDR]]
        self.reserved -= b[_SIZE]
        self._record(SEGMENT_FREE, b[_SIZE])

    def release_available(self, lk: int, size: int) -> bool:
        """``release_available_cached_blocks``: free oversize segments, just enough.

        The smallest free block of at least ``max(size, max_split_size)`` on the
        request's stream, else the largest oversize ones, walking down, until that
        much is released. Expandable blocks are never cudaFree'd here (torch skips
        them too). torch releases the block it finds without asking whether it is
        split: under a fixed ``max_split_size`` an oversize free block is always a
        whole segment. A split one only exists in a state torch itself cannot reach
        (settings changed mid-run, or a seeded start recorded under other settings),
        and is skipped like an expandable one instead of freeing part of a segment.
        """
        mss = self.mss
        kl, bl = self.keys[lk], self.blks[lk]
        want = max(size, mss)
        i = bisect_left(kl, want << _SH)
        if i < len(kl) and not self.exp and not (bl[i][_PREV] or bl[i][_NEXT]):
            self._release_block(lk, bl[i])
            return True
        released = 0
        j = i - 1
        while released < want and j >= 0:
            key = kl[j]
            if key >> _SH < mss:
                break
            b = bl[j]
            if not self.exp and not (b[_PREV] or b[_NEXT]):
                self._release_block(lk, b)
                released += key >> _SH
            j -= 1
        return released >= want

    def release_cached(self, upto: int) -> None:
        """``release_cached_blocks`` (``empty_cache``): sync pending frees, free every
        unsplit segment, unmap free pages; private pools once the trace released them."""
        self.flushes.append(self.cur)
        for b, lk in list(self.pend.values()):
            self.free_block(lk, b)
        self.pend.clear()
        self.pmap.clear()
        self._release_pool(1)  # default large pool, then small
        self._release_pool(0)
        for pool, since in self.freeable_from.items():
            if since <= upto and pool * 2 + 1 < len(self.bp_lists):
                self._release_pool(pool * 2)
                self._release_pool(pool * 2 + 1)

    def _release_pool(self, bp: int) -> None:
        """``release_blocks`` of one BlockPool, in its (stream, size, address) order."""
        to_unmap: list[tuple[int, list[Any]]] = []
        for lk in self.bp_lists[bp]:
            kl, bl = self.keys[lk], self.blks[lk]
            if not kl:
                continue
            if self.exp:
                to_unmap.extend((lk, b) for b in bl)
                continue
            keep_keys, keep_blocks = [], []
            for key, b in zip(kl, bl, strict=True):
                if b[_PREV] or b[_NEXT]:
                    keep_keys.append(key)
                    keep_blocks.append(b)
                    continue
                b[_STATE] = False
                del self.heads[b[_ADDR]]
                self.reserved -= b[_SIZE]
                self._record(SEGMENT_FREE, b[_SIZE])
            kl[:] = keep_keys
            bl[:] = keep_blocks
        for lk, b in to_unmap:
            self._unmap(lk, b)

    def garbage_collect(self) -> None:
        """``garbage_collect_cached_blocks``: free old unsplit segments of the default
        large pool once reserved memory passes threshold x limit."""
        assert self.limit is not None
        threshold = self.cfg.gc_threshold_bytes(self.limit)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        lks = self.bp_lists[1]
        total_age = 0
        count = 0
        for lk in lks:
            for b in self.blks[lk]:
                if not b[_PREV] and not b[_NEXT]:
                    total_age += self.gcc - self.gcb.get(b[_ADDR], 0)
                    count += 1
        if count == 0:
            return
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for lk in lks:
                for b in list(self.blks[lk]):
                    if b[_PREV] or b[_NEXT] or self.exp:
                        continue
                    age = self.gcc - self.gcb.get(b[_ADDR], 0)
                    if age >= age_threshold:
                        freed = True
                        reclaimed += b[_SIZE]
                        total_age -= age
                        count -= 1
                        self._release_block(lk, b)

    # -- expandable segments ----------------------------------------------------------
    def _alloc_expandable(self, lk: int, size: int) -> list[Any]:
        """``try_allocate_expandable_block``: map pages until a free block of ``size``."""
        c = self._find_expandable(lk, size)
        if c[_STATE] is None:
            c = self._map(lk, c, min(c[_SIZE], size))
        while c[_SIZE] < size:
            n = c[_NEXT]
            c = self._map(lk, n, min(size - c[_SIZE], n[_SIZE]))
        self._remove(lk, c)
        return c

    def _find_expandable(self, lk: int, size: int) -> list[Any]:
        """``find_expandable_block``: lowest address where free + unmapped space fits."""
        for u in self.ublks[lk]:
            c = u
            p = c[_PREV]
            if p and p[_STATE]:
                c = p
            total = 0
            b = c
            while total < size and b and b[_STATE] is not False:
                total += b[_SIZE]
                b = b[_NEXT]
            if total >= size:
                return c
        page = self._page(lk)
        base = self.next_resv
        self.next_resv += _RESV_STRIDE
        r = [-(-_RESV_BYTES // page) * page, base, None, None, None]
        self._uinsert(lk, r)
        self.heads[base] = (r, lk)
        return r

    def _map(self, lk: int, u: list[Any], size: int) -> list[Any]:
        """``map_block``: map whole pages at the start of unmapped range ``u``; merge."""
        page = self._page(lk)
        mapped = -(-size // page) * page
        self._uremove(lk, u)
        if mapped < u[_SIZE]:
            n = u[_NEXT]
            r = [u[_SIZE] - mapped, u[_ADDR] + mapped, u, n, None]
            if n:
                n[_PREV] = r
            u[_NEXT] = r
            u[_SIZE] = mapped
            self._uinsert(lk, r)
        # The newly mapped pages are a free block like any other: merge as a free does.
        u[_STATE] = False
        b = self.free_block(lk, u)
        self.reserved += mapped
        if self.reserved > self.peak:
            self.peak = self.reserved
        self._record(SEGMENT_MAP, mapped)
        return b

    def _unmap(self, lk: int, b: list[Any]) -> None:
        """``unmap_block``: unmap the whole pages strictly inside free block ``b``."""
        page = self._page(lk)
        a = b[_ADDR]
        base = a - a % _RESV_STRIDE
        start = a - base
        end = start + b[_SIZE]
        first = -(-start // page)
        last = end // page
        if first >= last:
            return
        self._remove(lk, b)
        nxt = b[_NEXT]
        ustart = base + first * page
        usize = (last - first) * page
        after = end - last * page
        if ustart > a:  # a free mapped piece stays before the unmapped range
            b[_SIZE] = ustart - a
            u = [usize, ustart, b, None, None]
            b[_NEXT] = u
            self._insert(lk, b)
        else:
            u = b
            u[_SIZE] = usize
            u[_STATE] = None
        if after > 0:
            w = [after, ustart + usize, u, nxt, True]
            if nxt:
                nxt[_PREV] = w
            u[_NEXT] = w
            self._insert(lk, w)
        else:
            u[_NEXT] = nxt
            if nxt:
                nxt[_PREV] = u
        p = u[_PREV]
        if p and p[_STATE] is None:  # merge into the unmapped range before
            n = u[_NEXT]
            p[_NEXT] = n
            if n:
                n[_PREV] = p
            p[_SIZE] += usize
            u = p
        else:
            self._uinsert(lk, u)
        n = u[_NEXT]
        if n and n[_STATE] is None:
            self._uremove(lk, n)
            nn = n[_NEXT]
            u[_NEXT] = nn
            if nn:
                nn[_PREV] = u
            u[_SIZE] += n[_SIZE]
        self.reserved -= usize
        self._record(SEGMENT_UNMAP, usize)
        if not u[_PREV] and not u[_NEXT]:  # the whole reservation is unmapped: give it back
            self._uremove(lk, u)
            del self.heads[u[_ADDR]]

    # -- a trace that starts mid-run -------------------------------------------------------
    def seed(self, state: Any) -> None:
        """Start from the recorded state before the first event (``replay.AllocatorState``).

        For a trace that does not start at the allocator's birth (a wrapped ring
        buffer, history enabled late): its cudaMalloc'd segments and their blocks,
        at their recorded addresses (below the simulated ones), allocated blocks
        ready for their recorded frees. Expandable ranges are left out: their
        reservations cannot be rebuilt from mapped ranges alone.
        """
        for seg in state.segments:
            if seg.is_expandable:
                continue
            lk = (seg.pool * 2 + (0 if seg.segment_type == "small" else 1)) * self.ns + seg.stream
            prev: list[Any] | None = None
            for block in seg.blocks:
                b = [block.size, block.address, prev, None, False]
                if prev:
                    prev[_NEXT] = b
                else:
                    self.heads[block.address] = (b, lk)
                prev = b
                if block.state == INACTIVE:
                    self._insert(lk, b)
                elif block.state == ACTIVE_PENDING_FREE:
                    self.pend[block.address] = (b, lk)
                    self.pmap[block.address] = b
                else:
                    self.amap[block.address] = b
            self.reserved += seg.total_size
        self.peak = self.reserved

    # -- the request stream --------------------------------------------------------------
    def run(self, events: Any, ops: list[int], raddrs: list[int], sizes: list[int], lks: list[int]) -> list[int]:
        """Serve every request; returns the event indices the model failed.
        ``events[k]`` is the trace index of request k."""
        keys, blks, gcb = self.keys, self.blks, self.gcb
        pend, pmap, amap = self.pend, self.pmap, self.amap
        failed: list[int] = []
        gc_on = self.gc_on
        fast = not self.exp and not gc_on
        exp_hit = self.exp and not gc_on
        sh = _SH
        bisect = bisect_left
        cfg = self.cfg
        # The rules inlined below, as numbers taken from their one definition in
        # analysis.config (test_allocator checks this loop against run_reference,
        # which calls the methods):
        # - get_free_block's max_split_size filter (AllocatorConfig.fit_limit): a
        #   block fits if smaller than mss (request below mss) or than request + nsr;
        #   unset (UNLIMITED), every block fits.
        mss, nsr = cfg.max_split_size, cfg.max_non_split_rounding_size
        mss_on = mss != UNLIMITED
        # - should_split (AllocatorConfig.split_rule): split iff remainder > over and
        #   request < below, per pool kind (the free-list index's small|large bit).
        rules = (cfg.split_rule(True), cfg.split_rule(False))
        split_over = [rules[(lk // self.ns) & 1][0] for lk in range(len(keys))]
        split_below = [rules[(lk // self.ns) & 1][1] for lk in range(len(keys))]
        allocation_size = cfg.allocation_size
        for k, op, ra, rs, lk in zip(count(), ops, raddrs, sizes, lks):
            if op == 1:  # _OP_FREE: free_requested + free_completed
                b = amap.pop(ra, None)
                if b is None:
                    continue  # the model never served this request
                s = b[0]
                kl = keys[lk]
                bl = blks[lk]
                p = b[2]
                if p and p[4]:  # merge into the free block before
                    ps = p[0]
                    j = bisect(kl, (ps << sh) | p[1])
                    del kl[j]
                    del bl[j]
                    n = b[3]
                    p[3] = n
                    if n:
                        n[2] = p
                    s += ps
                    b = p
                n = b[3]
                if n and n[4]:  # absorb the free block after
                    ns = n[0]
                    j = bisect(kl, (ns << sh) | n[1])
                    del kl[j]
                    del bl[j]
                    nn = n[3]
                    b[3] = nn
                    if nn:
                        nn[2] = b
                    s += ns
                b[0] = s
                b[4] = True
                key = (s << sh) | b[1]
                j = bisect(kl, key)
                kl.insert(j, key)
                bl.insert(j, b)
                if gc_on:
                    gcb[b[1]] = self.gcc
            elif op == 0:  # _OP_ALLOC
                kl = keys[lk]
                b = None
                if fast:
                    i = bisect(kl, rs << sh)
                    if i < len(kl):
                        key = kl[i]
                        if not mss_on or key >> sh < (mss if rs < mss else rs + nsr):
                            del kl[i]
                            b = blks[lk].pop(i)
                            b[4] = False
                elif exp_hit:
                    # get_free_block's expandable walk, inline: best fit by "free block
                    # + the unmapped range after it" (state None marks unmapped).
                    i = bisect(kl, rs << sh)
                    nk = len(kl)
                    if i < nk:
                        bl = blks[lk]
                        c = bl[i]
                        nb = c[3]
                        cur = c[0] + nb[0] if nb and nb[4] is None else c[0]
                        while i + 1 < nk:
                            c = bl[i + 1]
                            nb = c[3]
                            nxt = c[0] + nb[0] if nb and nb[4] is None else c[0]
                            if nxt >= cur:
                                break
                            i += 1
                            cur = nxt
                        key = kl[i]
                        if not mss_on or key >> sh < (mss if rs < mss else rs + nsr):
                            del kl[i]
                            b = bl.pop(i)
                            b[4] = False
                else:
                    b = self.get_free_block(lk, rs)
                if b is None:
                    self.cur = events[k]
                    b = self.miss(lk, rs, allocation_size(rs))
                    if b is None:
                        failed.append(events[k])
                        continue
                rem = b[0] - rs
                if rem > split_over[lk] and rs < split_below[lk]:
                    n = b[3]
                    a = b[1] + rs
                    r = [rem, a, b, n, True]
                    if n:
                        n[2] = r
                    b[3] = r
                    b[0] = rs
                    key = (rem << sh) | a
                    j = bisect(kl, key)
                    kl.insert(j, key)
                    blks[lk].insert(j, r)
                    if gc_on:
                        gcb[a] = self.gcc
                amap[ra] = b
            elif op == _OP_FREE_REQ:  # freed, but in use on another stream until completed
                b = amap.pop(ra, None)
                if b is not None:
                    pend[b[1]] = (b, lk)
                    pmap[ra] = b
            elif op == _OP_FREE_DONE:
                b = pmap.pop(ra, None)
                if b is not None and pend.pop(b[1], None) is not None:
                    self.free_block(lk, b)
            elif op == _OP_OOM:
                self.cur = events[k]
                b = self.get_free_block(lk, rs) or self.miss(lk, rs, allocation_size(rs))
                if b is None:
                    failed.append(events[k])
                    continue
                self.split(lk, b, rs)  # kept to the end: the program never freed it
            elif op == _OP_FLUSH:
                self.cur = events[k]
                self.release_cached(ra)
        return failed

    def run_reference(
        self, events: Any, ops: list[int], raddrs: list[int], sizes: list[int], lks: list[int]
    ) -> list[int]:
        """``run`` written with the methods only (``get_free_block``, ``split``,
        ``free_block``): no inlined rule. Slower; the tests check that ``run``, whose
        hot path inlines those rules for speed, does exactly the same."""
        pend, pmap, amap = self.pend, self.pmap, self.amap
        failed: list[int] = []
        allocation_size = self.cfg.allocation_size
        for k, op, ra, rs, lk in zip(count(), ops, raddrs, sizes, lks):
            if op == _OP_FREE:
                b = amap.pop(ra, None)
                if b is not None:
                    self.free_block(lk, b)
            elif op in (_OP_ALLOC, _OP_OOM):
                self.cur = events[k]
                b = self.get_free_block(lk, rs) or self.miss(lk, rs, allocation_size(rs))
                if b is None:
                    failed.append(events[k])
                    continue
                self.split(lk, b, rs)
                if op == _OP_ALLOC:
                    amap[ra] = b
            elif op == _OP_FREE_REQ:
                b = amap.pop(ra, None)
                if b is not None:
                    pend[b[_ADDR]] = (b, lk)
                    pmap[ra] = b
            elif op == _OP_FREE_DONE:
                b = pmap.pop(ra, None)
                if b is not None and pend.pop(b[_ADDR], None) is not None:
                    self.free_block(lk, b)
            elif op == _OP_FLUSH:
                self.cur = events[k]
                self.release_cached(ra)
        return failed

    def layout(self) -> list[SegmentLayout]:
        """The final segments as the snapshot would list them: one per cudaMalloc'd
        segment and one per contiguous mapped range of an expandable reservation."""
        out: list[SegmentLayout] = []
        pending = {b[_ADDR] for b, _lk in self.pend.values()}
        for _addr, (head, lk) in sorted(self.heads.items()):
            bp, stream = divmod(lk, self.ns)
            pool, large = divmod(bp, 2)
            kind = "large" if large else "small"
            expandable = head[_STATE] is None or self.exp
            run: list[tuple[int, str]] = []
            b: list[Any] | None = head
            while b is not None:
                if b[_STATE] is None:  # unmapped: ends a mapped range
                    if run:
                        out.append(SegmentLayout(pool, kind, stream, True, tuple(run)))
                        run = []
                else:
                    state = INACTIVE if b[_STATE] else ACTIVE_PENDING_FREE if b[_ADDR] in pending else ACTIVE_ALLOCATED
                    run.append((int(b[_SIZE]), state))
                b = b[_NEXT]
            if run:
                out.append(SegmentLayout(pool, kind, stream, expandable, tuple(run)))
        return out


@dataclass(frozen=True, slots=True)
class SegmentLayout:
    """One segment's shape, comparable between the model and a snapshot (whose
    addresses the model does not reproduce): its pool, kind, stream, whether it
    is an expandable range, and its blocks' (size, state) in address order."""

    pool: int
    segment_type: str
    stream: int
    is_expandable: bool
    blocks: tuple[tuple[int, str], ...]

    @property
    def total_size(self) -> int:
        return sum(size for size, _state in self.blocks)


def recorded_layout(device: DeviceData) -> list[SegmentLayout]:
    """The snapshot's final segments as ``SegmentLayout`` s (address order)."""
    return [
        SegmentLayout(
            seg.pool, seg.segment_type, seg.stream, seg.is_expandable, tuple((b.size, b.state) for b in seg.blocks)
        )
        for seg in sorted(device.segments, key=lambda x: x.address)
    ]


def same_layout(a: Sequence[SegmentLayout], b: Sequence[SegmentLayout]) -> bool:
    """Equal as multisets: the model places segments at simulated addresses."""
    key = lambda x: (x.pool, x.segment_type, x.stream, x.is_expandable, x.blocks)  # noqa: E731
    return sorted(a, key=key) == sorted(b, key=key)


# --------------------------------------------------------------------------- trace analysis


class _LazyList:
    """Index access to a numpy column as Python ints, without converting it all."""

    __slots__ = ("_a",)

    def __init__(self, a: npt.NDArray[Any]) -> None:
        self._a = a

    def __getitem__(self, i: int) -> int:
        return int(self._a[i])


def _device(snapshot: Snapshot, device: DeviceData | int) -> DeviceData:
    return device if isinstance(device, DeviceData) else snapshot.device(device)


def recorded_segment_events(device: DeviceData) -> list[tuple[str, int]]:
    """The recorded segment_alloc/free/map/unmap events, as (action, size), in order."""
    act = device.trace.action
    sel = np.isin(act, _SEGMENT_ACTIONS)
    return [(ACTIONS[a], int(s)) for a, s in zip(act[sel].tolist(), device.trace.size[sel].tolist(), strict=True)]


def _recorded_reserved(device: DeviceData) -> I64:
    """Reserved bytes after every event, from the recorded segment events."""
    t = device.trace
    delta = np.zeros(len(t), np.int64)
    grow = (t.action == SEGMENT_ALLOC) | (t.action == SEGMENT_MAP)
    shrink = (t.action == SEGMENT_FREE) | (t.action == SEGMENT_UNMAP)
    delta[grow] = t.size[grow]
    delta[shrink] = -t.size[shrink]
    return np.cumsum(delta)


@dataclass(frozen=True, slots=True)
class _Burst:
    start: int  # first segment_free/segment_unmap of the run
    end: int  # last one
    # "user" (empty_cache), "retry" (flush before a new segment), "avail" (release_available_cached_blocks),
    # "gc", "oom"
    kind: str
    request: int  # event index of the request that followed (-1: none)
    # The free_completed entries right before the run are its own flush's
    # synchronize_and_free_events (retry and oom runs only; see _synced_before).
    synced: bool = False
    # The run right before it, in the same malloc, was the GC or release_available
    # (the refusal that bounds the limit was seen there).
    second: bool = False


def _request_of(act: npt.NDArray[np.int8], idx: I64) -> I64:
    """For each event index, the next request (alloc or oom) at or after it; -1 if none."""
    requests = np.flatnonzero((act == ALLOC) | (act == OOM))
    if requests.size == 0:
        return np.full(idx.shape, -1, np.int64)
    pos = np.searchsorted(requests, idx)
    return np.where(pos < requests.shape[0], requests[np.minimum(pos, requests.shape[0] - 1)], -1)


def _request_alloc_size(device: DeviceData, cfg: AllocatorConfig, req: int) -> int:
    """``alloc_size`` of the request at event ``req`` (an oom entry's size is already rounded)."""
    t = device.trace
    size = int(t.size[req]) if t.action[req] == OOM else cfg.round_size(int(t.size[req]))
    return cfg.allocation_size(size)


def _limit_floor(device: DeviceData, cfg: AllocatorConfig, reserved: I64) -> int:
    """The least limit the trace is consistent with.

    Every new segment was allowed *before* it was made: ``alloc_block`` checks
    ``reserved + alloc_size``. That is the level reached for a cudaMalloc'd
    segment; with expandable segments the whole pages mapped can end above it
    (a 12 MiB request checks 12 MiB and maps a 20 MiB page), so the peak
    reserved memory may exceed the limit there and is not itself a bound.
    """
    t = device.trace
    act = t.action
    # The cudaMalloc'd segments at the dump were allowed too (all that a partial trace may show).
    floor = sum(seg.total_size for seg in device.segments if not seg.is_expandable)
    grow = np.flatnonzero((act == SEGMENT_ALLOC) | (act == SEGMENT_MAP))
    if grow.size == 0:
        return floor
    req = _request_of(act, grow)
    first = np.r_[True, req[1:] != req[:-1]]  # a request may map several ranges
    for i, r in zip(grow[first].tolist(), req[first].tolist(), strict=True):
        if r < 0:
            continue
        before = int(reserved[i - 1]) if i > 0 else 0
        floor = max(floor, before + _request_alloc_size(device, cfg, r))
    return floor


def _empty_cache_stacks(snapshot: Snapshot, stack_ids: set[int]) -> dict[int, bool]:
    """Which of these stacks pass through ``torch.cuda.empty_cache`` (Python frame
    ``empty_cache``, or the C++ ``emptyCache`` with ``stacks="all"``)."""
    out = {}
    for sid in stack_ids:
        frames = snapshot.stacks.frames_of(sid)
        out[sid] = any(f.name == "empty_cache" or "emptyCache" in f.name for f in frames)
    return out


def _bursts(snapshot: Snapshot, device: DeviceData, cfg: AllocatorConfig) -> list[_Burst]:
    """Classify each run of segment_free/segment_unmap events.

    A released segment's event carries the stack of the call that released it
    (with ``context="all"``), else the stack that created the segment. So: a run
    with ``empty_cache`` on a stack is user code; before an ``oom`` it is the
    malloc's flush; a run whose stacks differ from the segments' creation stacks
    was released inside a malloc (the GC when a threshold is recorded and no
    small-pool segment went, which the GC never frees; else a flush-and-retry).
    Otherwise (no stacks, or only creation stacks): before a new segment it is
    the GC (as above) or a flush-and-retry, if the limit could have refused that
    segment (``reserved + alloc_size`` above the least limit the trace allows,
    ``_limit_floor``) and the cache held no block for the request (a malloc
    flushes only after missing); anything else is ``empty_cache()`` by user code.
    """
    t = device.trace
    act = t.action
    n = len(t)
    is_rel = (act == SEGMENT_FREE) | (act == SEGMENT_UNMAP)
    if not is_rel.any():
        return []
    reserved = _recorded_reserved(device)
    floor = _limit_floor(device, cfg, reserved)
    rel = np.flatnonzero(is_rel)
    breaks = np.flatnonzero(np.diff(rel) != 1)
    starts = np.r_[rel[0], rel[breaks + 1]]
    ends = np.r_[rel[breaks], rel[-1]]
    reqs = _request_of(act, ends + 1)
    gc_recorded = cfg.garbage_collection_threshold > 0.0
    stack_ids = {int(x) for x in t.stack[rel].tolist() if x >= 0}
    via_empty_cache = _empty_cache_stacks(snapshot, stack_ids)
    ambiguous = _CacheProbe(snapshot, device, cfg)
    # Stack of the segment_alloc that created the segment each segment_free releases.
    created: dict[int, int] = {}
    last_alloc: dict[int, int] = {}
    for i in np.flatnonzero((act == SEGMENT_ALLOC) | (act == SEGMENT_FREE)).tolist():
        a = int(t.addr[i])
        if act[i] == SEGMENT_ALLOC:
            last_alloc[a] = int(t.stack[i])
        elif a in last_alloc:
            created[i] = last_alloc.pop(a)
    out = []
    later_burst = set(starts.tolist())
    follows_chained = False  # the run before this one was chained to it (same malloc)
    for s, e, req in zip(starts.tolist(), ends.tolist(), reqs.tolist(), strict=True):
        k = e + 1
        while k < n and act[k] == FREE_COMPLETED:
            k += 1
        # Only free_completed entries between this run and the next: the next is the
        # same malloc's release_cached_blocks (it syncs pending frees first), so this
        # one ran inside that malloc before it: the GC, or release_available_cached_blocks.
        chained = k < n and k in later_burst and k > e + 1
        k = e + 1
        nxt = int(act[k]) if k < n else -1
        stacks = t.stack[s : e + 1].tolist()
        no_small = not (t.size[s : e + 1] == K_SMALL_BUFFER).any()
        in_malloc = any(x >= 0 and i in created and created[i] != x for i, x in enumerate(stacks, start=s))
        # With max_split_size too, a run of oversize segments of the request's stream
        # is release_available's when the GC could not have started: it needs
        # reserved > threshold x limit, and the limit is at least the floor.
        gc_like = gc_recorded and no_small
        if gc_like and s > 0 and int(reserved[s - 1]) <= cfg.gc_threshold_bytes(floor):
            gc_like = not _looks_like_release_available(device, cfg, s, e, req)
        if any(x >= 0 and via_empty_cache[x] for x in stacks):
            kind = "user"
        elif nxt == OOM:
            kind = "oom"
        elif chained:
            kind = "gc" if gc_like else "avail"
        elif follows_chained:
            kind = "retry"  # release_cached_blocks after the GC or release_available did not make room
        elif in_malloc:
            kind = "gc" if gc_like else "retry"
        elif nxt in (SEGMENT_ALLOC, SEGMENT_MAP) and req >= 0:
            before = int(reserved[s - 1]) if s > 0 else 0
            refusable = limit_refuses(before, _request_alloc_size(device, cfg, req), floor)
            if not refusable and not gc_like:
                kind = "user"  # the limit could not have refused that segment
            elif ambiguous.served(_before_completions(act, s) - 1, req):
                # The cache held a block for the request: a malloc would not have
                # flushed. (Checked before the free_completed entries right before the
                # run: a flush syncs pending frees first, so they may be its own.)
                kind = "user"
            else:
                kind = "gc" if gc_like else "retry"
        else:
            kind = "user"
        synced = kind in ("retry", "oom") and req >= 0 and _synced_before(device, s, e)
        out.append(_Burst(s, e, kind, req, synced, follows_chained))
        follows_chained = chained and kind != "user"
    return out


def _looks_like_release_available(device: DeviceData, cfg: AllocatorConfig, s: int, e: int, req: int) -> bool:
    """Whether the segment_free run [s, e] can be release_available_cached_blocks
    for request ``req`` (only with ``max_split_size``): oversize segments of the
    request's stream, one (the smallest that fits) or several from the largest down.
    The GC instead frees old segments of any size and stream, in the pool's order."""
    mss = cfg.max_split_size
    if mss == UNLIMITED or req < 0:
        return False
    t = device.trace
    stream = int(t.stream[req])
    sizes = t.size[s : e + 1]
    if (t.action[s : e + 1] != SEGMENT_FREE).any() or (sizes < mss).any() or (t.stream[s : e + 1] != stream).any():
        return False
    return bool((np.diff(sizes) <= 0).all())


def _before_completions(act: npt.NDArray[np.int8], s: int) -> int:
    """The start of the run of free_completed entries that ends right before ``s``."""
    j = s
    while j > 0 and act[j - 1] == FREE_COMPLETED:
        j -= 1
    return j


def _synced_before(device: DeviceData, s: int, e: int) -> bool:
    """Whether the free_completed entries right before the segment_free run [s, e]
    (a malloc's flush) were emitted by that flush's synchronize_and_free_events.

    In one malloc, ``process_events`` completes finished cross-stream frees first
    (before ``get_free_block``); ``release_cached_blocks`` syncs the rest later,
    after ``release_available_cached_blocks`` (with ``max_split_size``) may have
    freed oversize segments, which does not sync. When that step freed nothing the
    run is one ``release_blocks`` pass, in the pool's order (large pool, then small;
    by stream, size, address), and the completions before it are the flush's own,
    or ``process_events``' right before them: treating all as the flush's is then
    harmless (the request missed either way, and the flush syncs everything). A
    run out of that order starts with release_available's frees: the completions
    came before those, from ``process_events``.
    """
    t = device.trace
    act, addr = t.action, t.addr
    j = s - 1
    if j < 0 or act[j] != FREE_COMPLETED or (j > 0 and act[j - 1] == FREE_REQUESTED and addr[j - 1] == addr[j]):
        return False
    streams = device.streams
    order = [
        (int(t.size[i]) == K_SMALL_BUFFER, streams[int(t.stream[i])] if streams else 0, int(t.size[i]), int(addr[i]))
        for i in range(s, e + 1)
        if act[i] == SEGMENT_FREE
    ]
    return order == sorted(order)


_BURSTS: dict[tuple[int, AllocatorConfig], tuple[npt.NDArray[np.int8], list[_Burst]]] = {}


def _bursts_of(snapshot: Snapshot, device: DeviceData, cfg: AllocatorConfig) -> list[_Burst]:
    """``_bursts``, remembered for the last few traces: a report replays one trace
    several times (the check and each what-if), and telling flushes apart may
    need a recorded replay."""
    action = device.trace.action
    key = (id(action), cfg)
    hit = _BURSTS.get(key)
    if hit is not None and hit[0] is action:
        return hit[1]
    found = _bursts(snapshot, device, cfg)
    if len(_BURSTS) >= 8:
        del _BURSTS[next(iter(_BURSTS))]
    _BURSTS[key] = (action, found)
    return found


class _CacheProbe:
    """Whether the recorded cache could serve a request, checked on the recorded
    replay's state (built only if a burst needs it: a malloc flushes only after
    ``get_free_block`` missed)."""

    def __init__(self, snapshot: Snapshot, device: DeviceData, cfg: AllocatorConfig) -> None:
        self.snapshot, self.device, self.cfg = snapshot, device, cfg
        self._replay: Any = None
        self._pools: npt.NDArray[np.int32] | None = None

    def served(self, index: int, req: int) -> bool:
        if index < 0:
            return False
        if self._replay is None:
            from analysis.replay import recorded_replay  # local: needed for rare traces only

            self._replay = recorded_replay(self.snapshot, self.device)
            self._pools = _event_pools(self.device)
        assert self._pools is not None
        t, cfg = self.device.trace, self.cfg
        size = int(t.size[req]) if t.action[req] == OOM else cfg.round_size(int(t.size[req]))
        small = is_small(size)
        stream, pool = int(t.stream[req]), int(self._pools[req])
        for seg in self._replay.blocks_at(index).segments:
            if seg.stream != stream or seg.pool != pool or (seg.segment_type == "small") != small:
                continue
            if any(b.state == INACTIVE and cfg.block_fits(b.size, size) for b in seg.blocks):
                return True
        return False


def infer_limit(snapshot: Snapshot, device: DeviceData | int, config: AllocatorConfig | None = None) -> LimitEstimate:
    """The interval the process's memory limit must lie in, from the trace alone.

    The snapshot does not record a per-process cap (``set_per_process_memory_fraction``).
    Every ``reserved + alloc_size`` checked before a new segment was allowed:
    ``lower`` is the largest of these. Each time the allocator refused a segment, reserved plus that
    segment's ``alloc_size`` exceeded the limit: at the flush before a
    flush-and-retry (``reserved`` before the flush) and at an OOM (``reserved``
    after the flush). ``upper`` is one less than the smallest such sum. A GC run
    (``garbage_collection_threshold``) starts only above threshold x limit, which
    bounds the limit too (``gc_upper``).
    """
    dev = _device(snapshot, device)
    cfg = config or AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    t = dev.trace
    reserved = _recorded_reserved(dev)
    lower = _limit_floor(dev, cfg, reserved)
    upper: int | None = None
    gc_upper: int | None = None
    device_full: int | None = None
    evidence = 0
    threshold = cfg.garbage_collection_threshold
    for b in _bursts_of(snapshot, dev, cfg):
        before = int(reserved[b.start - 1]) if b.start > 0 else 0
        if b.kind in ("retry", "avail") and b.request >= 0 and not b.second:
            bound = before + _request_alloc_size(dev, cfg, b.request) - 1
            upper = bound if upper is None else min(upper, bound)
            evidence += 1
        elif b.kind == "gc" and threshold > 0:
            # GC ran: before > int(threshold * limit); the largest such limit.
            bound = int(before / threshold)
            while bound > 0 and cfg.gc_threshold_bytes(bound) >= before:
                bound -= 1
            gc_upper = bound if gc_upper is None else min(gc_upper, bound)
            evidence += 1
    gc_lower = _gc_lower(snapshot, dev, cfg, reserved) if gc_upper is not None else None
    for i in np.flatnonzero(t.action == OOM).tolist():
        need = cfg.allocation_size(int(t.size[i]))
        bound = int(reserved[i]) + need - 1
        upper = bound if upper is None else min(upper, bound)
        evidence += 1
        device_free = int(t.addr[i])
        if device_free < need:
            full = int(reserved[i]) + device_free
            device_full = full if device_full is None else min(device_full, full)
    return LimitEstimate(lower, upper, device_full, evidence, gc_upper, gc_lower)


def _gc_lower(snapshot: Snapshot, dev: DeviceData, cfg: AllocatorConfig, reserved: I64) -> int | None:
    """A lower bound of the limit from where ``garbage_collect_cached_blocks`` did
    not run, or stopped (checked on the recorded replay's state).

    With a threshold and a cap, every malloc that misses calls the GC. It frees
    nothing only when reserved memory is at most ``threshold x limit`` or no
    whole free segment of the default large pool exists; and once it runs, it
    stops with such segments left only after reclaiming ``reserved - threshold x
    limit``. So a miss with no GC frees while a freeable segment existed, and a
    GC run that left one, each put ``threshold x limit`` at or above what was
    reserved (minus what that run freed).
    """
    from analysis.replay import recorded_replay  # local: only GC traces need it

    t = dev.trace
    act = t.action
    bursts = _bursts_of(snapshot, dev, cfg)
    first_burst: dict[int, _Burst] = {}
    for b in bursts:
        if b.request >= 0 and b.kind != "user":
            first_burst.setdefault(b.request, b)
    grow = np.flatnonzero((act == SEGMENT_ALLOC) | (act == SEGMENT_MAP))
    if grow.size == 0:
        return None
    reqs = _request_of(act, grow)
    replay = recorded_replay(snapshot, dev)

    def freeable(index: int) -> bool:
        state = replay.blocks_at(index)
        return any(
            seg.pool == 0
            and seg.segment_type == "large"
            and not seg.is_expandable
            and len(seg.blocks) == 1
            and seg.blocks[0].state == INACTIVE
            for seg in state.segments
        )

    need = 0
    seen: set[int] = set()
    for i, r in zip(grow.tolist(), reqs.tolist(), strict=True):
        if r < 0 or r in seen:
            continue
        seen.add(r)
        b = first_burst.get(r)
        if b is not None and b.kind == "gc":
            before = int(reserved[b.start - 1]) if b.start > 0 else 0
            freed = before - int(reserved[b.end])
            if freeable(b.end):
                need = max(need, before - freed)
        else:
            # The GC ran after process_events and before the flush's own sync.
            at = (i if b is None else _before_completions(act, b.start) if b.synced else b.start) - 1
            if at >= 0 and freeable(at):
                need = max(need, int(reserved[at]))
    if need == 0:
        return None
    threshold = cfg.garbage_collection_threshold
    bound = int(need / threshold)
    while cfg.gc_threshold_bytes(bound) < need:
        bound += 1
    return bound


def step_end_indices(snapshot: Snapshot, device: DeviceData | int) -> list[int]:
    """Event index at the end of each step: the last event with ``time_us`` at or
    before the END of a ``ProfilerStep#N`` (else ``Optimizer.step#...``) annotation.

    Delegates to ``analysis.steps`` so the report's steps and the what-if's agree.
    """
    from analysis.steps import find_steps  # local: steps is a sibling analysis

    dev = _device(snapshot, device)
    steps = find_steps(snapshot.annotations, dev.device, dev.trace.time_us)
    return [int(i) for i in steps.last_event.tolist()]


# --------------------------------------------------------------------------- entry points


@dataclass
class _Requests:
    """The request stream of one trace, config-free: computed once per trace and
    reused by every ``simulate`` of it (a report runs the check and each what-if;
    turning 1.6M requests into lists costs about a quarter of a second each)."""

    key: tuple[Any, ...]
    sel: npt.NDArray[np.intp]
    ops: list[int]
    raddrs: list[int]
    sizes: I64
    is_oom: npt.NDArray[np.bool_]
    lane: I64 | None  # (pool * 2) * streams + stream per request; None: one pool, one stream
    rounded: I64 | None = None  # the last config's rounded sizes and their lists
    rounded_list: list[int] = field(default_factory=list)
    lks_list: list[int] = field(default_factory=list)


# id(trace.action) -> requests; an entry goes when its trace's action column is freed.
_REQUESTS: dict[int, _Requests] = {}


def _requests_of(snapshot: Snapshot, dev: DeviceData, bursts: list[_Burst], pools: npt.NDArray[np.int32]) -> _Requests:
    t = dev.trace
    user = [(b.start, b.end) for b in bursts if b.kind == "user"]
    malloc_flushes = tuple((b.start, b.request) for b in bursts if b.synced)
    key = (len(t), len(dev.streams), len(snapshot.pools), tuple(user), malloc_flushes)
    hit = _REQUESTS.get(id(t.action))
    if hit is not None and hit.key == key:
        return hit
    n = len(t)
    act = t.action
    addr = t.addr
    op = np.full(n, -1, np.int8)
    is_fr = act == FREE_REQUESTED
    is_fc = act == FREE_COMPLETED
    paired = np.zeros(n, bool)
    if n > 1:
        paired[:-1] = is_fr[:-1] & is_fc[1:] & (addr[1:] == addr[:-1])
    completes = np.zeros(n, bool)
    completes[1:] = paired[:-1]
    # skip_actions (torch 2.10+) may drop one of the two: the other is then the free.
    if not is_fc.any():
        paired = is_fr
    elif not is_fr.any():
        paired, completes = is_fc, np.zeros(n, bool)
    op[act == ALLOC] = _OP_ALLOC
    op[paired] = _OP_FREE
    op[is_fr & ~paired] = _OP_FREE_REQ
    op[is_fc & ~completes & ~paired] = _OP_FREE_DONE
    op[act == OOM] = _OP_OOM
    for start, _end in user:
        op[start] = _OP_FLUSH
    sel = np.flatnonzero(op >= 0)
    ops = op[sel]
    raddr = addr[sel]
    if user:  # a flush carries the end of its burst instead of an address
        pos = np.searchsorted(sel, [start for start, _end in user])
        raddr[pos] = [end for _start, end in user]
    # A flush inside malloc (release_cached_blocks, after get_free_block missed and
    # the limit refused a segment) first runs synchronize_and_free_events: the
    # free_completed entries right before its segment_free run are its own doing,
    # not frees the request could have used. The model makes that flush itself, so
    # those completions move to just after the request: under the recorded settings
    # the model's flush has synced them already; under others, a block whose
    # stream work was only forced to finish by the flush finishes then.
    late: list[tuple[int, int]] = []
    for start, request in malloc_flushes:
        j = start - 1
        while j >= 0 and op[j] == _OP_FREE_DONE:
            late.append((j, request))
            j -= 1
    if late:
        order_key = sel.astype(np.float64)
        order_key[np.searchsorted(sel, [j for j, _r in late])] = [r + 0.5 for _j, r in late]
        order = np.argsort(order_key, kind="stable")
        sel, ops, raddr = sel[order], ops[order], raddr[order]
    ns = max(len(dev.streams), 1)
    lane = None
    if not (ns == 1 and len(snapshot.pools) == 1):
        lane = pools[sel].astype(np.int64) * 2 * ns + t.stream[sel]
    req = _Requests(key, sel, ops.tolist(), raddr.tolist(), t.size[sel], ops == _OP_OOM, lane)
    if len(_REQUESTS) >= 8:
        del _REQUESTS[next(iter(_REQUESTS))]
    _REQUESTS[id(act)] = req
    weakref.finalize(act, _REQUESTS.pop, id(act), None)
    return req


def _prepare(
    snapshot: Snapshot, dev: DeviceData, cfg: AllocatorConfig, bursts: list[_Burst], pools: npt.NDArray[np.int32]
) -> tuple[npt.NDArray[np.intp], list[int], list[int], list[int], list[int]]:
    """Filter the trace down to the requests: their event indices, and plain lists
    (op, recorded address, rounded size, free-list index) for the hot loop.
    Only the rounding depends on ``cfg``; configs that round alike share the lists."""
    req = _requests_of(snapshot, dev, bursts, pools)
    sizes = req.sizes
    rounded = cfg.round_sizes(sizes)
    if req.is_oom.any():  # an oom entry's size is already the rounded request
        rounded[req.is_oom] = sizes[req.is_oom]
    if req.rounded is None or not np.array_equal(rounded, req.rounded):
        large = ~small_pool(rounded)
        if req.lane is None:
            lks = large.view(np.int8)
        else:
            ns = max(len(dev.streams), 1)
            lks = req.lane + large * ns
        req.rounded, req.rounded_list, req.lks_list = rounded, rounded.tolist(), lks.tolist()
    return req.sel, req.ops, req.raddrs, req.rounded_list, req.lks_list


def _event_pools(dev: DeviceData) -> npt.NDArray[np.int32]:
    """Pool of every event, recovering what torch 2.11 traces leave out.

    Before ``pool_id`` was recorded on trace entries (2.12), every event reads as
    the default pool even while a CUDA graph captured into a private one. The
    final ``segments`` do name each live segment's pool, and every block lies in
    a segment, so an event's pool is that of the recorded segment holding its
    address at the time. Segments released before the dump (a deleted graph's
    pool, or default-pool segments freed by a flush) read as the default pool.
    """
    t = dev.trace
    if (t.pool != 0).any() or not any(seg.pool != 0 for seg in dev.segments):
        return t.pool
    act = t.action
    final = sorted((seg.address, seg.address + seg.total_size, seg.pool) for seg in dev.segments)
    final_starts = [f[0] for f in final]

    def final_pool(addr: int) -> int:
        i = bisect_left(final_starts, addr + 1) - 1
        return final[i][2] if i >= 0 and addr < final[i][1] else 0

    seg_events = np.flatnonzero(np.isin(act, _SEGMENT_ACTIONS))
    # A segment_alloc's segment lives to the end unless a later segment_free has its address.
    survives = {}
    freed_later: set[int] = set()
    for i in seg_events[::-1].tolist():
        a = int(t.addr[i])
        if act[i] == SEGMENT_FREE:
            freed_later.add(a)
        elif act[i] == SEGMENT_ALLOC:
            survives[i] = a not in freed_later
            freed_later.discard(a)
    pools = np.zeros(len(t), np.int32)
    live: dict[int, tuple[int, int]] = {}  # start -> (end, pool)
    has_addr = (act == ALLOC) | (act == FREE_REQUESTED) | (act == FREE_COMPLETED)
    bounds = [*seg_events.tolist(), len(t)]
    prev = -1
    for i in bounds:
        lo, hi = prev + 1, i
        if hi > lo and live:
            idx = lo + np.flatnonzero(has_addr[lo:hi])
            if idx.size:
                starts = sorted(live)
                sa = np.asarray(starts, np.int64)
                ends = np.asarray([live[x][0] for x in starts], np.int64)
                pl = np.asarray([live[x][1] for x in starts], np.int32)
                addr = t.addr[idx]
                pos = np.searchsorted(sa, addr, side="right") - 1
                ok = (pos >= 0) & (addr < ends[np.maximum(pos, 0)])
                pools[idx] = np.where(ok, pl[np.maximum(pos, 0)], 0)
        if i < len(t):
            a, size, kind = int(t.addr[i]), int(t.size[i]), int(act[i])
            if kind == SEGMENT_ALLOC:
                live[a] = (a + size, final_pool(a) if survives.get(i) else 0)
                pools[i] = live[a][1]
            elif kind == SEGMENT_MAP:
                live[a] = (a + size, final_pool(a))
                pools[i] = live[a][1]
            elif kind == SEGMENT_FREE:
                pools[i] = live.pop(a, (0, 0))[1]
            else:  # SEGMENT_UNMAP: cut [a, a + size) out of the mapped ranges
                for start, (end, pool) in list(live.items()):
                    if end <= a or start >= a + size:
                        continue
                    pools[i] = pool
                    del live[start]
                    if start < a:
                        live[start] = (a, pool)
                    if end > a + size:
                        live[a + size] = (end, pool)
        prev = i
    return pools


def _freeable_from(dev: DeviceData, pools: npt.NDArray[np.int32]) -> dict[int, int]:
    """Private pool -> first event index where the trace shows it being released."""
    t = dev.trace
    rel = np.flatnonzero(((t.action == SEGMENT_FREE) | (t.action == SEGMENT_UNMAP)) & (pools != 0))
    out: dict[int, int] = {}
    for i in rel.tolist():
        out.setdefault(int(pools[i]), i)
    return out


def simulate(
    snapshot: Snapshot,
    device: DeviceData | int,
    config: AllocatorConfig,
    limit_bytes: int | None = None,
    step_ends: Sequence[int] | None = (),
) -> PolicyResult:
    """Replay one device's requests through the allocator model under ``config``.

    ``limit_bytes`` is the memory the process may reserve (a per-process cap or
    the device's size); None means unlimited. The replay continues past requests
    it cannot serve (see the module docstring); ``oom`` is the first of them.
    """
    return _simulate(snapshot, device, config, limit_bytes, step_ends)[0]


def simulate_layout(
    snapshot: Snapshot,
    device: DeviceData | int,
    config: AllocatorConfig,
    limit_bytes: int | None = None,
    *,
    reference: bool = False,
) -> tuple[PolicyResult, list[SegmentLayout]]:
    """``simulate``, plus the model's final segments (``SegmentLayout``, comparable
    with ``recorded_layout``). ``reference``: serve the requests with
    ``_Model.run_reference`` (every rule through its method) instead of the fast loop."""
    result, model = _simulate(snapshot, device, config, limit_bytes, (), reference=reference)
    return result, model.layout()


def _simulate(
    snapshot: Snapshot,
    device: DeviceData | int,
    config: AllocatorConfig,
    limit_bytes: int | None,
    step_ends: Sequence[int] | None,
    *,
    reference: bool = False,
) -> tuple[PolicyResult, _Model]:
    dev = _device(snapshot, device)
    recorded_cfg = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    bursts = _bursts_of(snapshot, dev, recorded_cfg)
    pools = _event_pools(dev)
    events, ops, raddrs, sizes, lks = _prepare(snapshot, dev, config, bursts, pools)
    t = dev.trace
    seg = np.flatnonzero(np.isin(t.action, _SEGMENT_ACTIONS))
    recorded = (t.action[seg].tolist(), t.size[seg].tolist(), t.addr[seg].tolist())
    model = _Model(config, limit_bytes, len(snapshot.pools), dev.streams, _freeable_from(dev, pools), recorded)
    if not _segments_complete(dev):
        from analysis.replay import recorded_replay  # local: only partial traces need it

        model.seed(recorded_replay(snapshot, dev).blocks_at(-1))
    initial = model.reserved
    serve = model.run_reference if reference else model.run
    failed = serve(events.tolist() if len(events) < 4096 else _LazyList(events), ops, raddrs, sizes, lks)
    t = dev.trace
    n = len(t)
    recorded_ooms = np.flatnonzero(t.action == OOM)
    oom_avoided: bool | None = None
    if recorded_ooms.size:
        final = int(recorded_ooms[-1])
        failed_set = set(failed)
        served_all = not any(i <= final and t.action[i] == ALLOC for i in failed)
        oom_avoided = served_all and final not in failed_set
    seg_idx = np.asarray(model.seg_idx, np.int64)
    seg_act = np.asarray(model.seg_act, np.int64)
    seg_size = np.asarray(model.seg_size, np.int64)
    sign = np.where((seg_act == SEGMENT_ALLOC) | (seg_act == SEGMENT_MAP), 1, -1)
    running = initial + np.cumsum(sign * seg_size) if seg_size.size else np.zeros(0, np.int64)
    # Keep the last change of each event index; a seeded start counts from event -1.
    if seg_idx.size:
        last = np.r_[seg_idx[1:] != seg_idx[:-1], True]
        change_index, change_reserved = seg_idx[last], running[last]
    else:
        change_index, change_reserved = np.zeros(0, np.int64), np.zeros(0, np.int64)
    if initial:
        change_index = np.r_[-1, change_index]
        change_reserved = np.r_[initial, change_reserved]
    result = PolicyResult(
        config=config,
        limit_bytes=limit_bytes,
        events=n,
        peak_reserved=model.peak,
        final_reserved=model.reserved,
        oom=failed[0] if failed else None,
        ooms=failed,
        oom_avoided=oom_avoided,
        segment_events=[(ACTIONS[a], s) for a, s in zip(model.seg_act, model.seg_size, strict=True)],
        segment_event_index=model.seg_idx,
        flushes=model.flushes,
        change_index=change_index.astype(np.int64),
        change_reserved=change_reserved.astype(np.int64),
    )
    result.step_ends = [int(i) for i in step_ends or ()]
    result.step_reserved = result.reserved_at(result.step_ends)
    return result, model


def _segments_complete(device: DeviceData) -> bool:
    """The segment history is whole: replayed from zero, reserved memory never goes
    negative and ends at the final segments' total (cheap; see ``trace_is_complete``)."""
    t = device.trace
    final_total = sum(seg.total_size for seg in device.segments)
    if len(t) == 0:
        return final_total == 0
    reserved = _recorded_reserved(device)
    return int(reserved[-1]) == final_total and int(reserved.min()) >= 0


def trace_is_complete(device: DeviceData) -> bool:
    """Whether the trace can be the whole history of the device's allocator.

    Replaying the recorded segment events must end at the final segments' total,
    and, address by address, blocks must be allocated before they are freed.
    A wrapped ring buffer or history started late fails one of the two.
    """
    t = device.trace
    final_total = sum(seg.total_size for seg in device.segments)
    if len(t) == 0:
        return final_total == 0
    if int(_recorded_reserved(device)[-1]) != final_total:
        return False
    # The free of a block is its free_requested; with skip_actions dropping those, its free_completed.
    free = FREE_REQUESTED if (t.action == FREE_REQUESTED).any() else FREE_COMPLETED
    sel = np.flatnonzero((t.action == ALLOC) | (t.action == free))
    if sel.size == 0:
        return True
    addr = t.addr[sel]
    order = np.lexsort((sel, addr))
    a = addr[order]
    k = t.action[sel][order]
    first = np.r_[True, a[1:] != a[:-1]]
    repeated = (k[1:] == k[:-1]) & (a[1:] == a[:-1])
    return bool((k[first] == ALLOC).all() and not repeated.any())


def replay_check(snapshot: Snapshot, device: DeviceData | int) -> dict[str, Any]:
    """Contract ``replay``: does the model, under the recorded settings, reproduce
    every recorded segment event (same action, same size, same order)?

    The limit is inferred from the trace (``infer_limit``) so that the recorded
    flush-and-retry bursts and OOMs happen at the same requests. Besides the
    contract keys: ``trace_complete``, the ``limit_bytes`` used, whether the
    recorded OOMs failed in the model too, the model's peak and final reserved
    memory, and the first mismatch.
    """
    dev = _device(snapshot, device)
    cfg = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    estimate = infer_limit(snapshot, dev, cfg)
    result = simulate(snapshot, dev, cfg, estimate.value)
    recorded = recorded_segment_events(dev)
    reproduced = result.segment_events
    same = 0
    for r, m in zip(recorded, reproduced, strict=False):
        if r != m:
            break
        same += 1
    mismatch = None
    if same < max(len(recorded), len(reproduced)):
        mismatch = {
            "position": same,
            "recorded": list(recorded[same]) if same < len(recorded) else None,
            "reproduced": list(reproduced[same]) if same < len(reproduced) else None,
        }
    recorded_ooms = [int(i) for i in np.flatnonzero(dev.trace.action == OOM).tolist()]
    complete = trace_is_complete(dev)
    return {
        "recorded_config": cfg.to_conf(),
        "segment_events_recorded": len(recorded),
        "segment_events_reproduced": same,
        # A partial trace has no starting state to replay from: never called exact.
        "exact": complete and same == len(recorded) == len(reproduced),
        "trace_complete": complete,
        "limit_bytes": estimate.value,
        "ooms_recorded": recorded_ooms,
        "ooms_reproduced": result.ooms == recorded_ooms,
        "peak_reserved_bytes": result.peak_reserved,
        "final_reserved_bytes": result.final_reserved,
        "first_mismatch": mismatch,
    }


def whatif(
    snapshot: Snapshot,
    device: DeviceData | int,
    conf: str,
    limit_bytes: int | None = None,
    step_ends: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Contract ``whatif`` item: the recorded settings with ``conf`` applied on top.

    Without ``limit_bytes`` the limit is inferred: ``infer_limit(...).value`` when
    the trace shows a limit binding, else ``infer_limit(...).lower`` (the recorded
    peak: the least memory the device had). Pass the device's size for more room.
    Without ``step_ends`` the steps come from the annotations.
    """
    dev = _device(snapshot, device)
    base = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    cfg = AllocatorConfig.parse(conf, base=base)
    if limit_bytes is None:
        # The cap the trace shows, else the least memory the device must have had
        # (the recorded peak): without any limit a what-if would never flush, and
        # e.g. max_split_size_mb would pile up segments far past any real GPU.
        estimate = infer_limit(snapshot, dev, base)
        limit_bytes = estimate.value if estimate.value is not None else (estimate.lower or None)
    ends = step_end_indices(snapshot, dev) if step_ends is None else list(step_ends)
    result = simulate(snapshot, dev, cfg, limit_bytes, ends)
    return {
        "config": conf,
        "peak_reserved_bytes": result.peak_reserved,
        "oom_avoided": result.oom_avoided,
        "steps": [{"index": k, "reserved_end_bytes": v} for k, v in enumerate(result.step_reserved)],
        "limit_bytes": limit_bytes,
        "oom_event_index": result.oom,
    }
