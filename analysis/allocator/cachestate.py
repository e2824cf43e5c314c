"""The allocator model's state and rules: one simulated CUDA caching allocator, each rule a method.

``_Allocator`` holds one ``DeviceCachingAllocator``'s segments, blocks and free lists and moves them as
c10/cuda/CUDACachingAllocator.cpp does (torch 2.11; see ../shared/docs/snapshot-format.md §3), under an
``AllocatorConfig`` and a memory limit; ``cachemodel._Model`` feeds it a request stream, and
``policy.simulate`` one device's requests.

What is modelled (the names are those of the C++ source):

- ``round_size`` / ``get_allocation_size`` / ``should_split`` from
  ``allocator.config``; small (<= 1 MiB) and large pools; one free list per
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

A trace that starts mid-run (wrapped ring buffer) starts from the state before its first event as the
recorded replay (``allocator.recorded``) reconstructs it (``seed``; ``seed_live`` for an expandable
segments what-if of a trace recorded without them).

Addresses: ties between equal-sized free blocks go to the lower address, so
where new segments go matters. Replaying the recorded settings, a new segment
takes the driver's recorded address while the model's segment events match the
recording; otherwise (and for every what-if of other settings, from the start)
the driver's placement as learned from the captures gives it
(``analysis.allocator.placement``). Expandable reservations sit at fixed strides.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator.config import UNLIMITED, AllocatorConfig, is_small, limit_refuses
from analysis.allocator.placement import PLACEMENTS, Placement
from analysis.allocator.policytypes import SegmentLayout
from analysis.model import (
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    INACTIVE,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
)

I64 = npt.NDArray[np.int64]


# Free-list keys pack a block as (size << _SH) | address, so one bisect on
# plain ints orders by (size, address) as the C++ comparator does per stream.
_SH = 57

# Simulated virtual addresses (all below 2**_SH). cudaMalloc'd segments: placement.TOP and down
# (``placement.DriverPlacement``), or up from it (``MirrorPlacement``).
_RESV_STRIDE = 1 << 41  # expandable reservations at multiples of this (below placement.TOP)
_RESV_BYTES = 1 << 40  # VA of one reservation (torch: 1.125 x the GPU's memory)


# A block is a small list, so the hot path follows neighbours without hashing:
# [size, address, prev | None, next | None, state]; state is True for a block in
# a free list, None for an unmapped range of an expandable reservation, False for
# an allocated block or a pending free (so "is free" is one truth test).
_SIZE, _ADDR, _PREV, _NEXT, _STATE = 0, 1, 2, 3, 4


def _grown(b: list[Any]) -> int:
    """A free block's size plus the unmapped range right after it (expandable segments)."""
    nb = b[_NEXT]
    return int(b[_SIZE]) + (nb[_SIZE] if nb and nb[_STATE] is None else 0)


class _Allocator:
    """State of one simulated ``DeviceCachingAllocator``.

    A free list is two parallel Python lists: sorted packed keys (searched with
    ``bisect``) and the blocks they stand for, kept in step by inserting and
    deleting at the same position (cheaper than a dict from address to block).
    Unmapped ranges of expandable reservations are kept the same way, by address.
    A free-list index ``lk`` is ``(pool * 2 + large) * n_streams + stream``.

    Each rule of the allocator is one method (``get_free_block``, ``miss``, ``split``, ``free_block``,
    ``release_cached``, ...); ``cachemodel._Model`` serves a request stream with them.
    """

    def __init__(
        self,
        cfg: AllocatorConfig,
        limit: int | None,
        n_pools: int,
        streams: list[int],
        freeable_from: dict[int, int],
        recorded: tuple[list[int], list[int], list[int]] = ([], [], []),
        placement: str = "recorded",
    ) -> None:
        self.cfg = cfg
        # The recorded segment events (action, size, address). With ``placement``
        # "recorded", while the model's own segment events equal them one for one
        # (``lockstep``), a new cudaMalloc'd segment takes the address the driver really
        # returned: free blocks of equal size are chosen by address. After that, and
        # from the start under "driver" or "mirror" (what-ifs: an answer must not hang
        # on which run's trace it starts from), the placement model gives it
        # (``analysis.allocator.placement``), continuing from the segments live then.
        self.rec_act, self.rec_size, self.rec_addr = recorded
        self.rec_cols: tuple[I64, I64, I64] | None = None  # the same as int64 columns, where the caller has them
        self.lockstep = placement == "recorded"
        self.placement_kind = "driver" if placement == "recorded" else placement
        self.va: Placement | None = None
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
        self.next_resv = _RESV_STRIDE
        self.gcc = 0  # get_free_block calls on the default large pool (GC ages)
        self.gcb: dict[int, int] = {}  # address -> gcc when that block entered a free list
        self.cur = 0  # event index being served
        # OOM entries the program survived (caught: cuDNN's workspace probes, a server's retry) whose
        # block, where this replay serves it, is freed at once (``simulate``'s ``caught="free"``);
        # otherwise it is kept to the end, as the fatal one's.
        self.transient: frozenset[int] = frozenset()
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
            if self.va is None:
                self.va = PLACEMENTS[self.placement_kind](self._segment_spans())
            address = self.va.place(alloc_size)
        b = [alloc_size, address, None, None, False]
        self.heads[address] = (b, lk)
        self.reserved += alloc_size
        if self.reserved > self.peak:
            self.peak = self.reserved
        self._record(SEGMENT_ALLOC, alloc_size)
        return b

    def _segment_spans(self) -> list[tuple[int, int]]:
        """(address, size) of every live cudaMalloc'd segment: where the placement model starts.
        Only asked for without expandable segments, so every head is a cudaMalloc'd segment."""
        spans: list[tuple[int, int]] = []
        for addr, (head, _lk) in self.heads.items():
            size, b = 0, head
            while b is not None:
                size += b[_SIZE]
                b = b[_NEXT]
            spans.append((addr, size))
        return spans

    def _freed(self, b: list[Any]) -> None:
        """A cudaMalloc'd segment goes back to the driver."""
        del self.heads[b[_ADDR]]
        if self.va is not None:
            self.va.release(b[_ADDR], b[_SIZE])

    def _release_block(self, lk: int, b: list[Any]) -> None:
        """``release_block``: cudaFree a whole free segment."""
        self._remove(lk, b)
        self._freed(b)
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
                self._freed(b)
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
        """Start from the recorded state before the first event (``states.AllocatorState``).

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

    def seed_live(self, state: Any) -> None:
        """Start an expandable-segments what-if of a trace that starts mid-run (recorded without
        them) from the blocks live before the first event alone, packed into the reservation
        of their (pool, stream) on whole mapped pages: the state expandable segments reach
        with those tensors, holding no cache of the recorded settings' cudaMalloc'd segments
        (what they would have cached instead is not in the trace, so reserved memory at the
        start is a lower bound). Packed in the order they were allocated, as a reservation
        fills: the driver puts each new segment below the earlier ones (``placement``), so
        segments from the highest address down, each one's blocks from its start. (In
        address order, a wrapped generate() trace's what-if peaked 15.6% over its real
        expandable rerun; in this order 0.7% under: docs/captures.md, gen16_c92.)
        """
        groups: dict[int, list[Any]] = {}
        for seg in sorted(state.segments, key=lambda x: x.address, reverse=True):
            lk = (seg.pool * 2 + (0 if seg.segment_type == "small" else 1)) * self.ns + seg.stream
            groups.setdefault(lk, []).extend(b for b in seg.blocks if b.state != INACTIVE)
        for lk, blocks in groups.items():
            if not blocks:
                continue
            c = self._alloc_expandable(lk, sum(block.size for block in blocks))
            end, after = c[_ADDR] + c[_SIZE], c[_NEXT]
            prev, addr = c[_PREV], c[_ADDR]
            for block in blocks:
                b = [block.size, addr, prev, None, False]
                if prev:
                    prev[_NEXT] = b
                prev, addr = b, addr + block.size
                if block.state == ACTIVE_PENDING_FREE:
                    self.pend[b[_ADDR]] = (b, lk)
                    self.pmap[block.address] = b
                else:
                    self.amap[block.address] = b
            if c[_ADDR] in self.heads:  # the reservation's head block was c: now the first live block
                self.heads[c[_ADDR]] = (self.amap.get(blocks[0].address) or self.pmap[blocks[0].address], lk)
            last = prev
            if addr < end:  # the rest of the last mapped page stays free
                rest = [end - addr, addr, last, after, True]
                last[_NEXT] = rest
                last = rest
                self._insert(lk, rest)
            last[_NEXT] = after
            if after:
                after[_PREV] = last
        # Mapping them is no segment event of the run: the replay starts from here.
        self.seg_act.clear()
        self.seg_size.clear()
        self.seg_idx.clear()
        self.peak = self.reserved

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
