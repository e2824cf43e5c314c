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

from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.config import K_SMALL_BUFFER, K_SMALL_SIZE, UNLIMITED, AllocatorConfig
from analysis.model import (
    ACTIONS,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
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
    "infer_limit",
    "recorded_segment_events",
    "replay_check",
    "simulate",
    "step_end_indices",
    "whatif",
]

# Free-list keys pack a block as (size << _SH) | address, so one bisect on
# plain ints orders by (size, address) as the C++ comparator does per stream.
_SH = 57
_MASK = (1 << _SH) - 1

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
    peak_allocated: int
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
    (at least the peak reserved memory); ``upper``
    (None: no evidence of any limit) is one less than the smallest
    ``reserved + alloc_size`` that the allocator refused: at a flush-and-retry
    before a new segment, and at an OOM. ``device_full`` is
    ``reserved + device_free`` at an OOM where the device itself had less free
    memory than the segment needed (no per-process cap was binding).
    """

    lower: int
    upper: int | None
    device_full: int | None
    evidence: int  # how many refusals bound ``upper``

    @property
    def binding(self) -> bool:
        return self.upper is not None or self.device_full is not None

    @property
    def value(self) -> int | None:
        """The limit to replay under: None when nothing shows one was reached."""
        if self.device_full is not None:
            return max(self.device_full, self.lower)
        if self.upper is None:
            return None
        return self.lower


# --------------------------------------------------------------------------- the model


class _Model:
    """State of one simulated ``DeviceCachingAllocator``.

    Blocks are keyed by their simulated address: ``sz``/``pv``/``nx`` hold size
    and the previous/next block of the same segment (0: none). ``fr`` holds the
    free mapped blocks (those in a free list), ``ump`` the unmapped ranges of
    expandable reservations. A free-list index ``lk`` is
    ``(pool * 2 + large) * n_streams + stream``.
    """

    def __init__(
        self,
        cfg: AllocatorConfig,
        limit: int | None,
        n_pools: int,
        streams: list[int],
        freeable_from: dict[int, int],
    ) -> None:
        self.cfg = cfg
        self.limit = limit
        self.mss = cfg.max_split_size
        self.nsr = cfg.max_non_split_rounding_size
        self.exp = cfg.expandable_segments
        self.gc_on = cfg.garbage_collection_threshold > 0.0 and limit is not None
        self.large_page = cfg.large_segment_size
        self.ns = len(streams) or 1
        n_lists = n_pools * 2 * self.ns
        self.lists: list[list[int]] = [[] for _ in range(n_lists)]
        self.ulists: list[list[int]] = [[] for _ in range(n_lists)]
        # Free lists of one BlockPool in the C++ set's order: by raw stream value.
        order = sorted(range(self.ns), key=lambda s: streams[s] if s < len(streams) else 0)
        self.bp_lists = [[bp * self.ns + s for s in order] for bp in range(n_pools * 2)]
        self.freeable_from = freeable_from
        self.sz: dict[int, int] = {}
        self.pv: dict[int, int] = {}
        self.nx: dict[int, int] = {}
        self.fr: set[int] = set()
        self.ump: set[int] = set()
        self.pend: dict[int, int] = {}  # pending frees: address -> lk, in request order
        self.pmap: dict[int, int] = {}  # recorded address -> simulated, for pending frees
        self.reserved = 0
        self.peak = 0
        self.seg_act: list[int] = []
        self.seg_size: list[int] = []
        self.seg_idx: list[int] = []
        self.flushes: list[int] = []
        self.next_seg = _SEG_BASE
        self.next_resv = _RESV_STRIDE
        self.gcc = 0  # get_free_block calls on the default large pool (GC ages)
        self.gcb: dict[int, int] = {}  # block -> gcc when it entered a free list
        self.cur = 0  # event index being served

    # -- bookkeeping ------------------------------------------------------------
    def _record(self, action: int, size: int) -> None:
        self.seg_act.append(action)
        self.seg_size.append(size)
        self.seg_idx.append(self.cur)

    def _insert(self, lk: int, a: int) -> None:
        insort(self.lists[lk], (self.sz[a] << _SH) | a)
        self.fr.add(a)
        if self.gc_on:
            self.gcb[a] = self.gcc

    def _remove(self, lk: int, a: int) -> None:
        lst = self.lists[lk]
        del lst[bisect_left(lst, (self.sz[a] << _SH) | a)]
        self.fr.discard(a)

    def _forget(self, a: int) -> None:
        del self.sz[a], self.pv[a], self.nx[a]

    def _page(self, lk: int) -> int:
        return self.large_page if (lk // self.ns) & 1 else K_SMALL_BUFFER

    # -- malloc -------------------------------------------------------------------
    def get_free_block(self, lk: int, size: int) -> int:
        """Best fit on the request's (pool, stream); removes and returns the block or 0."""
        if self.gc_on and lk // self.ns == 1:
            self.gcc += 1
        lst = self.lists[lk]
        i = bisect_left(lst, size << _SH)
        n = len(lst)
        if i >= n:
            return 0
        if self.exp:
            # Best fit by "free block + the unmapped range after it": walk on while
            # the next candidate can grow to less than the current one.
            sz, nx, ump = self.sz, self.nx, self.ump

            def grown(key: int) -> int:
                nb = nx[key & _MASK]
                return (key >> _SH) + (sz[nb] if nb and nb in ump else 0)

            cur = grown(lst[i])
            while i + 1 < n:
                nxt = grown(lst[i + 1])
                if nxt >= cur:
                    break
                i += 1
                cur = nxt
        key = lst[i]
        bs = key >> _SH
        mss = self.mss
        if size < mss and bs >= mss:
            return 0  # never hand out an oversize block for a small request
        if size >= mss and bs >= size + self.nsr:
            return 0  # oversize blocks serve only requests within the rounding limit
        a = key & _MASK
        del lst[i]
        self.fr.discard(a)
        return a

    def miss(self, lk: int, size: int, alloc_size: int) -> int:
        """``malloc`` after ``get_free_block`` missed: GC, new segment, flushes. 0 = OOM."""
        if self.gc_on:
            self.garbage_collect()
        a = self.alloc_block(lk, size, alloc_size)
        if not a and self.mss != UNLIMITED and self.release_available(lk, size):
            a = self.alloc_block(lk, size, alloc_size)
        # A request into a private pool means a capture is underway: no flush then.
        if not a and lk // self.ns < 2:
            self.release_cached(self.cur)
            a = self.alloc_block(lk, size, alloc_size)
        return a

    def split(self, lk: int, a: int, size: int) -> int:
        """``should_split`` + ``alloc_found_block``: returns the handed-out size."""
        sz = self.sz
        rem = sz[a] - size
        if size <= K_SMALL_SIZE or self.exp:
            do = rem >= 512
        else:
            do = size < self.mss and rem > K_SMALL_SIZE
        if not do:
            return sz[a]
        r = a + size
        sz[r] = rem
        sz[a] = size
        n = self.nx[a]
        self.nx[r] = n
        self.pv[r] = a
        self.nx[a] = r
        if n:
            self.pv[n] = r
        self._insert(lk, r)
        return size

    def free_block(self, lk: int, a: int) -> None:
        """``free_block``: merge with free neighbours, back into the free list."""
        sz, pv, nx, fr = self.sz, self.pv, self.nx, self.fr
        p = pv[a]
        if p and p in fr:
            self._remove(lk, p)
            n = nx[a]
            nx[p] = n
            if n:
                pv[n] = p
            sz[p] += sz[a]
            self._forget(a)
            a = p
        n = nx[a]
        if n and n in fr:
            self._remove(lk, n)
            nn = nx[n]
            nx[a] = nn
            if nn:
                pv[nn] = a
            sz[a] += sz[n]
            self._forget(n)
        self._insert(lk, a)

    def alloc_block(self, lk: int, size: int, alloc_size: int) -> int:
        """A new segment (or mapped pages) for the request; 0 when the limit refuses it."""
        if self.limit is not None and self.reserved + alloc_size > self.limit:
            return 0
        if self.exp:
            return self._alloc_expandable(lk, size)
        a = self.next_seg
        self.next_seg += alloc_size
        self.sz[a] = alloc_size
        self.pv[a] = 0
        self.nx[a] = 0
        self.reserved += alloc_size
        if self.reserved > self.peak:
            self.peak = self.reserved
        self._record(SEGMENT_ALLOC, alloc_size)
        return a

    def _release_block(self, lk: int, a: int) -> None:
        """``release_block``: cudaFree a whole free segment."""
        self._remove(lk, a)
        s = self.sz[a]
        self._forget(a)
        self.reserved -= s
        self._record(SEGMENT_FREE, s)

    def release_available(self, lk: int, size: int) -> bool:
        """``release_available_cached_blocks``: free oversize segments, just enough."""
        mss = self.mss
        lst = self.lists[lk]
        want = max(size, mss)
        i = bisect_left(lst, want << _SH)
        if i < len(lst) and not self.exp:
            self._release_block(lk, lst[i] & _MASK)
            return True
        released = 0
        j = i - 1
        while released < want and j >= 0:
            key = lst[j]
            if key >> _SH < mss:
                break
            if not self.exp:  # expandable blocks are never cudaFree'd here
                self._release_block(lk, key & _MASK)
                released += key >> _SH
            j -= 1
        return released >= want

    def release_cached(self, upto: int) -> None:
        """``release_cached_blocks`` (``empty_cache``): sync pending frees, free every
        unsplit segment, unmap free pages; private pools once the trace released them."""
        self.flushes.append(self.cur)
        for a, lk in list(self.pend.items()):
            self.free_block(lk, a)
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
        pv, nx, sz = self.pv, self.nx, self.sz
        to_unmap: list[tuple[int, int]] = []
        for lk in self.bp_lists[bp]:
            lst = self.lists[lk]
            if not lst:
                continue
            if self.exp:
                to_unmap.extend((lk, key & _MASK) for key in lst)
                continue
            keep = []
            for key in lst:
                a = key & _MASK
                if pv[a] or nx[a]:
                    keep.append(key)
                    continue
                s = sz[a]
                self.fr.discard(a)
                self._forget(a)
                self.reserved -= s
                self._record(SEGMENT_FREE, s)
            lst[:] = keep
        for lk, a in to_unmap:
            self._unmap(lk, a)

    def garbage_collect(self) -> None:
        """``garbage_collect_cached_blocks``: free old unsplit segments of the default
        large pool once reserved memory passes threshold x limit."""
        assert self.limit is not None
        threshold = int(self.cfg.garbage_collection_threshold * self.limit)
        if self.reserved <= threshold:
            return
        target = self.reserved - threshold
        pv, nx, sz, gcb = self.pv, self.nx, self.sz, self.gcb
        lks = self.bp_lists[1]
        total_age = 0
        count = 0
        for lk in lks:
            for key in self.lists[lk]:
                a = key & _MASK
                if not pv[a] and not nx[a]:
                    total_age += self.gcc - gcb.get(a, 0)
                    count += 1
        if count == 0:
            return
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold = total_age / count
            freed = False
            for lk in lks:
                for key in list(self.lists[lk]):
                    a = key & _MASK
                    if pv[a] or nx[a] or self.exp:
                        continue
                    age = self.gcc - gcb.get(a, 0)
                    if age >= age_threshold:
                        freed = True
                        reclaimed += sz[a]
                        total_age -= age
                        count -= 1
                        self._release_block(lk, a)

    # -- expandable segments ----------------------------------------------------------
    def _alloc_expandable(self, lk: int, size: int) -> int:
        """``try_allocate_expandable_block``: map pages until a free block of ``size``."""
        c = self._find_expandable(lk, size)
        sz = self.sz
        if c in self.ump:
            c = self._map(lk, c, min(sz[c], size))
        while sz[c] < size:
            n = self.nx[c]
            c = self._map(lk, n, min(size - sz[c], sz[n]))
        self._remove(lk, c)
        return c

    def _find_expandable(self, lk: int, size: int) -> int:
        """``find_expandable_block``: lowest address where free + unmapped space fits."""
        sz, pv, nx, fr, ump = self.sz, self.pv, self.nx, self.fr, self.ump
        for u in self.ulists[lk]:
            c = u
            p = pv[u]
            if p and p in fr:
                c = p
            total = 0
            b = c
            while total < size and b and (b in fr or b in ump):
                total += sz[b]
                b = nx[b]
            if total >= size:
                return c
        page = self._page(lk)
        base = self.next_resv
        self.next_resv += _RESV_STRIDE
        sz[base] = -(-_RESV_BYTES // page) * page
        pv[base] = 0
        nx[base] = 0
        self.ump.add(base)
        insort(self.ulists[lk], base)
        return base

    def _map(self, lk: int, u: int, size: int) -> int:
        """``map_block``: map whole pages at the start of unmapped range ``u``; merge."""
        sz, pv, nx, fr = self.sz, self.pv, self.nx, self.fr
        page = self._page(lk)
        mapped = -(-size // page) * page
        ul = self.ulists[lk]
        del ul[bisect_left(ul, u)]
        self.ump.discard(u)
        if mapped < sz[u]:
            r = u + mapped
            sz[r] = sz[u] - mapped
            n = nx[u]
            pv[r] = u
            nx[r] = n
            if n:
                pv[n] = r
            nx[u] = r
            sz[u] = mapped
            self.ump.add(r)
            insort(ul, r)
        a = u
        p = pv[a]
        if p and p in fr:
            self._remove(lk, p)
            n = nx[a]
            nx[p] = n
            if n:
                pv[n] = p
            sz[p] += sz[a]
            self._forget(a)
            a = p
        n = nx[a]
        if n and n in fr:
            self._remove(lk, n)
            nn = nx[n]
            nx[a] = nn
            if nn:
                pv[nn] = a
            sz[a] += sz[n]
            self._forget(n)
        self._insert(lk, a)
        self.reserved += mapped
        if self.reserved > self.peak:
            self.peak = self.reserved
        self._record(SEGMENT_MAP, mapped)
        return a

    def _unmap(self, lk: int, a: int) -> None:
        """``unmap_block``: unmap the whole pages strictly inside free block ``a``."""
        sz, pv, nx, ump = self.sz, self.pv, self.nx, self.ump
        page = self._page(lk)
        base = a - a % _RESV_STRIDE
        start = a - base
        end = start + sz[a]
        first = -(-start // page)
        last = end // page
        if first >= last:
            return
        self._remove(lk, a)
        prev, nxt = pv[a], nx[a]
        u = base + first * page
        usize = (last - first) * page
        before = u - a
        after = end - last * page
        left = prev
        if before > 0:
            sz[a] = before
            nx[a] = u
            self._insert(lk, a)
            left = a
        else:
            self._forget(a)
        sz[u] = usize
        pv[u] = left
        if left:
            nx[left] = u
        if after > 0:
            w = u + usize
            sz[w] = after
            pv[w] = u
            nx[w] = nxt
            if nxt:
                pv[nxt] = w
            nx[u] = w
            self._insert(lk, w)
        else:
            nx[u] = nxt
            if nxt:
                pv[nxt] = u
        ul = self.ulists[lk]
        p = pv[u]
        if p and p in ump:  # merge into the unmapped range before
            n = nx[u]
            nx[p] = n
            if n:
                pv[n] = p
            sz[p] += usize
            self._forget(u)
            u = p
        else:
            ump.add(u)
            insort(ul, u)
        n = nx[u]
        if n and n in ump:
            nn = nx[n]
            nx[u] = nn
            if nn:
                pv[nn] = u
            sz[u] += sz[n]
            ump.discard(n)
            del ul[bisect_left(ul, n)]
            self._forget(n)
        self.reserved -= usize
        self._record(SEGMENT_UNMAP, usize)
        if not pv[u] and not nx[u]:  # the whole reservation is unmapped: give it back
            ump.discard(u)
            del ul[bisect_left(ul, u)]
            self._forget(u)

    # -- the request stream --------------------------------------------------------------
    def run(
        self,
        ops: list[int],
        idxs: list[int],
        raddrs: list[int],
        sizes: list[int],
        lks: list[int],
        alloc_sizes: list[int],
    ) -> tuple[list[int], int]:
        """Serve every request; returns the event indices the model failed, and the
        peak of allocated (block) bytes."""
        lists, sz, pv, nx, fr = self.lists, self.sz, self.pv, self.nx, self.fr
        pend, pmap = self.pend, self.pmap
        amap: dict[int, int] = {}
        failed: list[int] = []
        gc_on = self.gc_on
        exp = self.exp
        fast = not exp and not gc_on
        mss, nsr = self.mss, self.nsr
        sh, mask = _SH, _MASK
        small = K_SMALL_SIZE
        allocated = 0
        peak_alloc = 0
        for op, idx, ra, rs, lk, asz in zip(ops, idxs, raddrs, sizes, lks, alloc_sizes, strict=True):
            if op == _OP_FREE:
                a = amap.pop(ra, 0)
                if not a:
                    continue  # the model never served this request
                s = sz[a]
                allocated -= s
                lst = lists[lk]
                p = pv[a]
                if p and p in fr:
                    ps = sz[p]
                    del lst[bisect_left(lst, (ps << sh) | p)]
                    fr.remove(p)
                    n = nx[a]
                    nx[p] = n
                    if n:
                        pv[n] = p
                    del sz[a], pv[a], nx[a]
                    s += ps
                    a = p
                n = nx[a]
                if n and n in fr:
                    ns = sz[n]
                    del lst[bisect_left(lst, (ns << sh) | n)]
                    fr.remove(n)
                    nn = nx[n]
                    nx[a] = nn
                    if nn:
                        pv[nn] = a
                    del sz[n], pv[n], nx[n]
                    s += ns
                sz[a] = s
                insort(lst, (s << sh) | a)
                fr.add(a)
                if gc_on:
                    self.gcb[a] = self.gcc
            elif op == _OP_ALLOC:
                lst = lists[lk]
                a = 0
                if fast:
                    i = bisect_left(lst, rs << sh)
                    if i < len(lst):
                        key = lst[i]
                        bs = key >> sh
                        if not ((rs < mss and bs >= mss) or (rs >= mss and bs >= rs + nsr)):
                            a = key & mask
                            del lst[i]
                            fr.remove(a)
                else:
                    a = self.get_free_block(lk, rs)
                if not a:
                    self.cur = idx
                    a = self.miss(lk, rs, asz)
                    if not a:
                        failed.append(idx)
                        continue
                bs = sz[a]
                rem = bs - rs
                if (rem >= 512) if (rs <= small or exp) else (rs < mss and rem > small):
                    r = a + rs
                    sz[r] = rem
                    sz[a] = rs
                    n = nx[a]
                    nx[r] = n
                    pv[r] = a
                    nx[a] = r
                    if n:
                        pv[n] = r
                    insort(lst, (rem << sh) | r)
                    fr.add(r)
                    if gc_on:
                        self.gcb[r] = self.gcc
                    bs = rs
                allocated += bs
                if allocated > peak_alloc:
                    peak_alloc = allocated
                amap[ra] = a
            elif op == _OP_FREE_REQ:  # freed, but in use on another stream until completed
                a = amap.pop(ra, 0)
                if a:
                    allocated -= sz[a]
                    pend[a] = lk
                    pmap[ra] = a
            elif op == _OP_FREE_DONE:
                a = pmap.pop(ra, 0)
                if a and a in pend:
                    del pend[a]
                    self.free_block(lk, a)
            elif op == _OP_OOM:
                self.cur = idx
                a = self.get_free_block(lk, rs) or self.miss(lk, rs, asz)
                if not a:
                    failed.append(idx)
                    continue
                allocated += self.split(lk, a, rs)  # kept: the program never freed it
                if allocated > peak_alloc:
                    peak_alloc = allocated
            elif op == _OP_FLUSH:
                self.cur = idx
                self.release_cached(ra)
        return failed, peak_alloc


# --------------------------------------------------------------------------- trace analysis


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
    kind: str  # "user" (empty_cache), "retry" (flush before a new segment), "oom"
    request: int  # event index of the request that followed (-1: none)


def _request_of(act: npt.NDArray[np.int8], idx: I64) -> I64:
    """For each event index, the next request (alloc or oom) at or after it; -1 if none."""
    requests = np.flatnonzero((act == ALLOC) | (act == OOM))
    pos = np.searchsorted(requests, idx)
    return np.where(pos < requests.shape[0], requests[np.minimum(pos, max(requests.shape[0] - 1, 0))], -1) if requests.size else np.full(idx.shape, -1, np.int64)


def _request_alloc_size(device: DeviceData, cfg: AllocatorConfig, req: int) -> int:
    """``alloc_size`` of the request at event ``req`` (an oom entry's size is already rounded)."""
    t = device.trace
    size = int(t.size[req]) if t.action[req] == OOM else cfg.round_size(int(t.size[req]))
    return cfg.allocation_size(size)


def _limit_floor(device: DeviceData, cfg: AllocatorConfig, reserved: I64) -> int:
    """The least limit the trace is consistent with.

    Every level reached was allowed, and every new segment was allowed *before*
    it was made: ``alloc_block`` checks ``reserved + alloc_size``, and with
    expandable segments ``alloc_size`` can exceed the pages actually mapped.
    """
    t = device.trace
    act = t.action
    floor = int(reserved.max()) if reserved.size else 0
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


def _bursts(device: DeviceData, cfg: AllocatorConfig) -> list[_Burst]:
    """Classify each run of segment_free/segment_unmap events.

    Before an ``oom`` it is the malloc's flush. Before a new segment it is a
    malloc's flush-and-retry only if the limit could have refused that segment,
    i.e. ``reserved + alloc_size`` exceeds the least limit the trace allows
    (``_limit_floor``); otherwise it is ``empty_cache()`` called by user code
    just before an allocation. With ``garbage_collection_threshold`` recorded, a
    run without small-pool segments before a new segment may also be the GC.
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
    out = []
    for s, e, req in zip(starts.tolist(), ends.tolist(), reqs.tolist(), strict=True):
        k = e + 1
        nxt = int(act[k]) if k < n else -1
        if nxt == OOM:
            kind = "oom"
        elif nxt in (SEGMENT_ALLOC, SEGMENT_MAP) and req >= 0:
            before = int(reserved[s - 1]) if s > 0 else 0
            if before + _request_alloc_size(device, cfg, req) > floor:
                kind = "retry"
            elif gc_recorded and not (t.size[s : e + 1] == K_SMALL_BUFFER).any():
                kind = "retry"  # garbage collection before a new segment
            else:
                kind = "user"
        else:
            kind = "user"
        out.append(_Burst(s, e, kind, req))
    return out


def infer_limit(snapshot: Snapshot, device: DeviceData | int, config: AllocatorConfig | None = None) -> LimitEstimate:
    """The interval the process's memory limit must lie in, from the trace alone.

    The snapshot does not record a per-process cap (``set_per_process_memory_fraction``).
    Every reserved level the trace reached was allowed, and so was every
    ``reserved + alloc_size`` checked before a new segment: ``lower`` is the
    largest of these. Each time the allocator refused a segment, reserved plus that
    segment's ``alloc_size`` exceeded the limit: at the flush before a
    flush-and-retry (``reserved`` before the flush) and at an OOM (``reserved``
    after the flush). ``upper`` is one less than the smallest such sum.
    """
    dev = _device(snapshot, device)
    cfg = config or AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    t = dev.trace
    n = len(t)
    if n == 0:
        return LimitEstimate(0, None, None, 0)
    reserved = _recorded_reserved(dev)
    lower = _limit_floor(dev, cfg, reserved)
    upper: int | None = None
    device_full: int | None = None
    evidence = 0
    for b in _bursts(dev, cfg):
        if b.kind != "retry" or b.request < 0:
            continue
        before = int(reserved[b.start - 1]) if b.start > 0 else 0
        bound = before + _request_alloc_size(dev, cfg, b.request) - 1
        upper = bound if upper is None else min(upper, bound)
        evidence += 1
    for i in np.flatnonzero(t.action == OOM).tolist():
        need = cfg.allocation_size(int(t.size[i]))
        bound = int(reserved[i]) + need - 1
        upper = bound if upper is None else min(upper, bound)
        evidence += 1
        device_free = int(t.addr[i])
        if device_free < need:
            full = int(reserved[i]) + device_free
            device_full = full if device_full is None else min(device_full, full)
    return LimitEstimate(lower, upper, device_full, evidence)


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


def _prepare(
    snapshot: Snapshot, dev: DeviceData, cfg: AllocatorConfig, bursts: list[_Burst]
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    """Filter the trace down to the requests, as plain lists for the hot loop."""
    t = dev.trace
    n = len(t)
    act = t.action
    addr = t.addr
    op = np.full(n, -1, np.int8)
    is_fr = act == FREE_REQUESTED
    paired = np.zeros(n, bool)
    if n > 1:
        paired[:-1] = is_fr[:-1] & (act[1:] == FREE_COMPLETED) & (addr[1:] == addr[:-1])
    completes = np.zeros(n, bool)
    completes[1:] = paired[:-1]
    op[act == ALLOC] = _OP_ALLOC
    op[paired] = _OP_FREE
    op[is_fr & ~paired] = _OP_FREE_REQ
    op[(act == FREE_COMPLETED) & ~completes] = _OP_FREE_DONE
    op[act == OOM] = _OP_OOM
    raddr = addr.copy()
    for b in bursts:
        if b.kind == "user":
            op[b.start] = _OP_FLUSH
            raddr[b.start] = b.end
    sel = np.flatnonzero(op >= 0)
    ops = op[sel]
    sizes = t.size[sel]
    rounded = cfg.round_sizes(sizes)
    # An oom entry's size is already the rounded request.
    rounded = np.where(ops == _OP_OOM, sizes, rounded)
    large = (rounded > K_SMALL_SIZE).astype(np.int64)
    ns = max(len(dev.streams), 1)
    lks = (t.pool[sel].astype(np.int64) * 2 + large) * ns + t.stream[sel].astype(np.int64)
    alloc_sizes = cfg.allocation_sizes(rounded)
    return (
        ops.tolist(),
        sel.tolist(),
        raddr[sel].tolist(),
        rounded.tolist(),
        lks.tolist(),
        alloc_sizes.tolist(),
    )


def _freeable_from(dev: DeviceData) -> dict[int, int]:
    """Private pool -> first event index where the trace shows it being released."""
    t = dev.trace
    rel = np.flatnonzero(((t.action == SEGMENT_FREE) | (t.action == SEGMENT_UNMAP)) & (t.pool != 0))
    out: dict[int, int] = {}
    for i in rel.tolist():
        out.setdefault(int(t.pool[i]), i)
    return out


def simulate(
    snapshot: Snapshot,
    device: DeviceData | int,
    config: AllocatorConfig,
    limit_bytes: int | None = None,
    step_ends: Sequence[int] = (),
) -> PolicyResult:
    """Replay one device's requests through the allocator model under ``config``.

    ``limit_bytes`` is the memory the process may reserve (a per-process cap or
    the device's size); None means unlimited. The replay continues past requests
    it cannot serve (see the module docstring); ``oom`` is the first of them.
    """
    dev = _device(snapshot, device)
    recorded_cfg = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    bursts = _bursts(dev, recorded_cfg)
    columns = _prepare(snapshot, dev, config, bursts)
    model = _Model(config, limit_bytes, len(snapshot.pools), dev.streams, _freeable_from(dev))
    failed, peak_alloc = model.run(*columns)
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
    running = np.cumsum(sign * seg_size) if seg_size.size else np.zeros(0, np.int64)
    # Keep the last change of each event index.
    if seg_idx.size:
        last = np.r_[seg_idx[1:] != seg_idx[:-1], True]
        change_index, change_reserved = seg_idx[last], running[last]
    else:
        change_index, change_reserved = np.zeros(0, np.int64), np.zeros(0, np.int64)
    result = PolicyResult(
        config=config,
        limit_bytes=limit_bytes,
        events=n,
        peak_reserved=model.peak,
        peak_allocated=peak_alloc,
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
    result.step_ends = [int(i) for i in step_ends]
    result.step_reserved = result.reserved_at(result.step_ends)
    return result


def replay_check(snapshot: Snapshot, device: DeviceData | int) -> dict[str, Any]:
    """Contract ``replay``: does the model, under the recorded settings, reproduce
    every recorded segment event (same action, same size, same order)?

    The limit is inferred from the trace (``infer_limit``) so that the recorded
    flush-and-retry bursts and OOMs happen at the same requests.
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
    return {
        "recorded_config": cfg.to_conf(),
        "segment_events_recorded": len(recorded),
        "segment_events_reproduced": same,
        "exact": same == len(recorded) == len(reproduced),
        "limit_bytes": estimate.value,
        "ooms_recorded": recorded_ooms,
        "ooms_reproduced": result.ooms == recorded_ooms,
        "peak_reserved_bytes": result.peak_reserved,
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

    Without ``limit_bytes`` the limit is inferred (``infer_limit(...).value``: the
    peak reserved memory when the trace shows a limit binding, else unlimited).
    Without ``step_ends`` the steps come from the annotations.
    """
    dev = _device(snapshot, device)
    base = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    cfg = AllocatorConfig.parse(conf, base=base)
    if limit_bytes is None:
        limit_bytes = infer_limit(snapshot, dev, base).value
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
