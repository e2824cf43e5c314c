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

A trace that starts mid-run (wrapped ring buffer) starts from the state before
its first event as the recorded replay (``allocator.recorded``) reconstructs it.

Addresses: ties between equal-sized free blocks go to the lower address, so
where new segments go matters. Replaying the recorded settings, a new segment
takes the driver's recorded address while the model's segment events match the
recording; otherwise (and for every what-if of other settings, from the start)
the driver's placement as learned from the captures gives it
(``analysis.allocator.placement``). Expandable reservations sit at fixed strides.

Requests come from the trace as recorded, so after a request that the model
fails (an OOM the real run did not hit) the replay continues: the failed block
simply does not exist and its later free is ignored. A recorded OOM request
that the model can serve is allocated and kept to the end (the real program
never freed it). ``oom_avoided`` asks whether the final recorded OOM request and
every request before it were served.

Speed: the hot path (a best-fit hit and a free with merges) runs inline in one
loop over pre-filtered columns, on sorted lists of packed ``size << 57 | addr``
integers searched with ``bisect``; everything else is a method call. Where it is
built, the whole replay runs in C on C state instead (``analysis.allocator.compiled``:
the model's state goes in once and comes back once, ``_Model.engine_rules`` /
``_Model.adopt``); this loop stays the reference.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator import compiled
from analysis.allocator.config import UNLIMITED, AllocatorConfig, is_small, limit_refuses
from analysis.allocator.limits import LimitEstimate, infer_limit
from analysis.allocator.placement import CHUNK, PLACEMENTS, TOP, DriverPlacement, MirrorPlacement, Placement
from analysis.allocator.requests import (
    _OP_ALLOC,
    _OP_FLUSH,
    _OP_FREE,
    _OP_FREE_DONE,
    _OP_FREE_REQ,
    _OP_OOM,
    _SEGMENT_ACTIONS,
    Requests,
    _device,
    _recorded_reserved,
    requests_for,
)
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
    address_runs,
)
from analysis.steps import find_steps

# The request codes, as the compiled engine takes them (``compiled.policy_engine``).
_OP_CODES = {
    "op_alloc": _OP_ALLOC,
    "op_free": _OP_FREE,
    "op_free_req": _OP_FREE_REQ,
    "op_free_done": _OP_FREE_DONE,
    "op_oom": _OP_OOM,
    "op_flush": _OP_FLUSH,
}

I64 = npt.NDArray[np.int64]

__all__ = [
    "LimitEstimate",
    "PolicyResult",
    "ProjectedTail",
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

# Simulated virtual addresses (all below 2**_SH). cudaMalloc'd segments: placement.TOP and down
# (``placement.DriverPlacement``), or up from it (``MirrorPlacement``).
_RESV_STRIDE = 1 << 41  # expandable reservations at multiples of this (below placement.TOP)
_RESV_BYTES = 1 << 40  # VA of one reservation (torch: 1.125 x the GPU's memory)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class ProjectedTail:
    """Requests standing in for the part of a step the trace does not hold (built by
    ``analysis.projection``): the recorded requests stop before event ``cut`` (the
    OOM: what follows it is the exception unwinding), then these run in order.

    ``alloc[j]`` True: allocate ``size[j]`` bytes (requested, rounded here) under
    the address ``addr[j]``; False: free the block held under ``addr[j]`` (a
    recorded address, or one an earlier tail request allocated). ``like[j]`` is a
    recorded event whose stream and pool the request takes. Request 0 is the
    recorded OOM request and keeps the event index ``cut``; request ``j`` > 0 has
    the synthetic index ``len(trace) + j``.
    """

    cut: int
    alloc: list[bool]
    addr: list[int]
    size: list[int]
    like: list[int]


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
    # Where the replay started (``start_state``): "empty" (a complete trace), "recorded" (the
    # recorded state before the first event, under the settings that made it), "live-blocks"
    # (an expandable what-if of a partial trace: its live blocks alone), "recorded-other-settings"
    # (a partial trace under other settings: the recorded segments, which they would not have made).
    start: str = "empty"

    def reserved_at(self, indices: Sequence[int]) -> list[int]:
        """Reserved bytes right after each event index (-1: before the first event)."""
        if len(indices) == 0:
            return []
        if not self.change_index.size:  # no segment ever: nothing reserved
            return [0] * len(indices)
        idx = np.asarray(indices, dtype=np.int64)
        pos = np.searchsorted(self.change_index, idx, side="right") - 1
        vals = np.where(pos >= 0, self.change_reserved[np.maximum(pos, 0)], 0)
        return [int(v) for v in vals]

    def reserved_per_event(self) -> I64:
        """Reserved bytes after every event, one int64 per trace event."""
        if not self.change_index.size:
            return np.zeros(self.events, np.int64)
        pos = np.searchsorted(self.change_index, np.arange(self.events), side="right") - 1
        return np.where(pos >= 0, self.change_reserved[np.maximum(pos, 0)], 0).astype(np.int64)


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

    # -- the compiled engine's hand-over (analysis.allocator.compiled.policy_engine) -------------
    def engine_rules(self, split_over: list[int], split_below: list[int]) -> dict[str, Any]:
        """Every number the compiled engine needs, each from its one definition (``config``,
        ``placement``, this module): the same ones ``run`` inlines, plus those of the methods."""
        cfg, limit, n_lists = self.cfg, self.limit, len(self.keys)
        rec: tuple[Any, ...] | None = self.rec_cols
        if rec is None:
            rec = tuple(np.asarray(x, np.int64).reshape(-1) for x in (self.rec_act, self.rec_size, self.rec_addr))
        return {
            "sh": _SH,
            "ns": self.ns,
            "n_lists": n_lists,
            "exp": self.exp,
            "gc_on": self.gc_on,
            "mss_on": self.mss != UNLIMITED,
            "mirror": self.placement_kind == MirrorPlacement.name,
            "mss": self.mss,
            "nsr": self.nsr,
            "limit": limit,
            "gc_threshold": cfg.gc_threshold_bytes(limit) if self.gc_on and limit is not None else 0,
            "split_over": split_over,
            "split_below": split_below,
            "page": np.array([self._page(lk) for lk in range(n_lists)], np.int64),
            "bp_lists": np.array([lk for lks in self.bp_lists for lk in lks], np.int64),
            "resv_stride": _RESV_STRIDE,
            "resv_bytes": _RESV_BYTES,
            "chunk": CHUNK,
            "top": TOP,
            "allocation_size": cfg.allocation_size,
            "rec_act": rec[0],
            "rec_size": rec[1],
            "rec_addr": rec[2],
            "freeable_pools": np.array(list(self.freeable_from), np.int64),
            "freeable_since": np.array(list(self.freeable_from.values()), np.int64),
            "transient": np.array(sorted(self.transient), np.int64),
            **_OP_CODES,
        }

    def adopt(self, state: dict[str, Any]) -> None:
        """Take the compiled engine's final state: the attributes ``run`` would have left, and the
        placement model it made (``va``: None, ("driver", low, free ranges) or ("mirror", next))."""
        va = state.pop("va")
        for name, value in state.items():
            setattr(self, name, value)
        if va is None:
            return
        if va[0] == MirrorPlacement.name:
            mirror = MirrorPlacement()
            mirror.next = va[1]
            self.va = mirror
        else:
            driver = DriverPlacement()
            driver.low, driver.free = va[1], va[2]
            self.va = driver

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
        # analysis.allocator.config (test_allocator checks this loop against run_reference,
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
        if compiled.wanted() and self.placement_kind in PLACEMENTS:
            # The whole replay in C on C state, fed the same numbers (analysis.allocator.compiled);
            # None: the engine declined a state outside its bounds, and this loop serves instead.
            numbers = self.engine_rules(split_over, split_below)
            served = compiled.policy_engine(self, numbers, events, ops, raddrs, sizes, lks)
            if served is not None:
                return served
            events, ops, raddrs, sizes, lks = _loop_inputs(events, ops, raddrs, sizes, lks)
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
                if self.cur in self.transient:
                    self.free_block(lk, b)
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
                elif self.cur in self.transient:
                    self.free_block(lk, b)
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


def recorded_segment_events(device: DeviceData) -> list[tuple[str, int]]:
    """The recorded segment_alloc/free/map/unmap events, as (action, size), in order."""
    act = device.trace.action
    sel = np.isin(act, _SEGMENT_ACTIONS)
    return [(ACTIONS[a], int(s)) for a, s in zip(act[sel].tolist(), device.trace.size[sel].tolist(), strict=True)]


def step_end_indices(snapshot: Snapshot, device: DeviceData | int) -> list[int]:
    """Event index at the end of each step: the last event with ``time_us`` at or
    before the END of a ``ProfilerStep#N`` (else ``Optimizer.step#...``) annotation.

    Delegates to ``analysis.steps`` (a base module, like ``analysis.model``) so the report's steps and the
    what-if's agree.
    """
    dev = _device(snapshot, device)
    steps = find_steps(snapshot.annotations, dev.device, dev.trace.time_us)
    return [int(i) for i in steps.last_event.tolist()]


# --------------------------------------------------------------------------- entry points


# id(trace.action) -> requests; an entry goes when its trace's action column is freed.


def simulate(
    snapshot: Snapshot,
    device: DeviceData | int,
    config: AllocatorConfig,
    limit_bytes: int | None = None,
    step_ends: Sequence[int] | None = (),
    tail: ProjectedTail | None = None,
    *,
    requests: Requests | None = None,
    placement: str = "recorded",
    caught: str = "hold",
) -> PolicyResult:
    """Replay one device's requests through the allocator model under ``config``.

    ``limit_bytes`` is the memory the process may reserve (a per-process cap or
    the device's size); None means unlimited. The replay continues past requests
    it cannot serve (see the module docstring); ``oom`` is the first of them.
    With ``tail`` the recorded requests stop at ``tail.cut`` and the tail's run
    instead (``ProjectedTail``); ``ooms`` may then hold indices past the trace.
    ``requests``: the trace's ``requests.Requests`` when the caller built them
    (``build_requests``), else they are built (and remembered, ``requests_for``).
    ``placement``: where new cudaMalloc'd segments go. "recorded" (a replay of the
    recorded run): the driver's own addresses while the model's segment events match
    the recorded ones, the placement model after; "driver": the placement model from
    the start (what-ifs: the answer then does not depend on which run's trace is
    replayed); "mirror": the opposite order (``analysis.allocator.placement``).
    ``caught``: what a served OOM entry that the program survived (every one but the
    trace's last: cuDNN's workspace probes, a retry) holds. "hold": its block, to the
    end (the recorded run never freed it); "free": nothing, freed at once (a
    workspace, used and given back). Where the replay serves such an entry the
    program would have gone another way than the trace's, and the two bound it
    (issue 23: a UNet's 32 failed workspace probes, all kept, sank a what-if whose
    real run completed).
    """
    return _simulate(
        snapshot,
        device,
        config,
        limit_bytes,
        step_ends,
        requests=requests,
        tail=tail,
        placement=placement,
        caught=caught,
    )[0]


def simulate_layout(
    snapshot: Snapshot,
    device: DeviceData | int,
    config: AllocatorConfig,
    limit_bytes: int | None = None,
    *,
    reference: bool = False,
    requests: Requests | None = None,
    placement: str = "recorded",
) -> tuple[PolicyResult, list[SegmentLayout]]:
    """``simulate``, plus the model's final segments (``SegmentLayout``, comparable
    with ``recorded_layout``). ``reference``: serve the requests with
    ``_Model.run_reference`` (every rule through its method) instead of the fast loop."""
    result, model = _simulate(
        snapshot, device, config, limit_bytes, (), reference=reference, requests=requests, placement=placement
    )
    return result, model.layout()


def _inputs(req: Requests, dev: DeviceData, config: AllocatorConfig, tail: ProjectedTail | None, columns: bool) -> Any:
    """(events, ops, raddrs, sizes, free lists) of a replay: int64 columns for the compiled engine
    (``columns``), else the Python loop's lists (events stay an array: ``_loop_events``)."""
    if columns:
        if tail is not None:
            return req.tail_columns(dev, config, tail)
        return (req.events, req.op_col, req.raddr_col, *req.columns(config))
    if tail is not None:
        return req.with_tail(dev, config, tail)
    return (req.events, req.ops, req.raddrs, *req.lists(config))


def _loop_events(events: Any) -> Any:
    """The event indices as the Python loop reads them: Python ints, a list when short."""
    return events.tolist() if len(events) < 4096 else _LazyList(events)


def _loop_inputs(events: Any, ops: Any, raddrs: Any, sizes: Any, lks: Any) -> tuple[Any, ...]:
    """The Python loop's inputs from the compiled engine's (its columns become lists)."""
    ev = _loop_events(events) if isinstance(events, np.ndarray) else events
    listed = [x.tolist() if isinstance(x, np.ndarray) else x for x in (ops, raddrs, sizes, lks)]
    return (ev, *listed)


def _simulate(
    snapshot: Snapshot,
    device: DeviceData | int,
    config: AllocatorConfig,
    limit_bytes: int | None,
    step_ends: Sequence[int] | None,
    *,
    reference: bool = False,
    requests: Requests | None = None,
    tail: ProjectedTail | None = None,
    placement: str = "recorded",
    caught: str = "hold",
) -> tuple[PolicyResult, _Model]:
    dev = _device(snapshot, device)
    req = requests if requests is not None else requests_for(snapshot, dev)
    columns = compiled.wanted() and not reference
    events, ops, raddrs, sizes, lks = _inputs(req, dev, config, tail, columns)
    model = _Model(
        config, limit_bytes, len(snapshot.pools), dev.streams, req.freeable_from, req.recorded_segments, placement
    )
    start = "empty"
    if req.complete is None:
        req.complete = _segments_complete(dev)
    if not req.complete:
        state = req.source.get().blocks_at(-1)
        start = start_state(config, req.recorded_config)
        if start == "live-blocks":
            model.seed_live(state)
        else:
            model.seed(state)
    if caught == "free":
        model.transient = frozenset(caught_ooms(dev))
    model.rec_cols = req.segment_cols
    initial = model.reserved
    serve = model.run_reference if reference else model.run
    failed = serve(events if columns else _loop_events(events), ops, raddrs, sizes, lks)
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
        start=start,
    )
    result.step_ends = [int(i) for i in step_ends or ()]
    result.step_reserved = result.reserved_at(result.step_ends)
    return result, model


def caught_ooms(device: DeviceData) -> list[int]:
    """Event indices of the OOM entries the program survived: every one but the trace's last
    (after which it died, or the trace ends)."""
    return [int(i) for i in np.flatnonzero(device.trace.action == OOM)[:-1].tolist()]


def caught_served(result: PolicyResult, device: DeviceData) -> bool:
    """Whether ``result`` served an OOM entry the program survived: the program would then have
    asked for other things than the trace shows (its fallback would not have run)."""
    failed = set(result.ooms)
    return any(i not in failed for i in caught_ooms(device))


def start_state(config: AllocatorConfig, recorded: AllocatorConfig) -> str:
    """How a replay under ``config`` of a trace that starts mid-run (recorded under ``recorded``)
    begins (``PolicyResult.start``). The recorded state before the first event is what the
    recorded settings made: it is the start only under them. Expandable segments (recorded
    without) start from the live blocks alone: they hold no cache of cudaMalloc'd segments.
    Any other change keeps the recorded segments, a state those settings would not have made,
    and says so ("recorded-other-settings")."""
    if config == recorded:
        return "recorded"
    if config.expandable_segments and not recorded.expandable_segments:
        return "live-blocks"
    return "recorded-other-settings"


_START_NOTES = {
    "empty": None,
    "recorded": None,
    "live-blocks": (
        "the trace starts mid-run: the what-if starts from the blocks live before its first event, packed into "
        "expandable segments; what they would have cached before is not in the trace, so reserved memory is a "
        "lower bound early on"
    ),
    "recorded-other-settings": (
        "the trace starts mid-run: its state before the first event was made by the recorded settings, and "
        "these settings would have made another one, which the trace cannot show; the answer may not hold"
    ),
}


def start_report(start: str) -> dict[str, Any]:
    """The ``start`` item of a what-if: where the replay began, whether the answer can be held to
    these settings (``holds``), and why not."""
    return {"state": start, "holds": start != "recorded-other-settings", "note": _START_NOTES[start]}


def _segments_complete(device: DeviceData) -> bool:
    """The segment history is whole: replayed from zero, reserved memory never goes
    negative and ends at the final segments' total (cheap; see ``trace_is_complete``)."""
    t = device.trace
    final_total = sum(seg.total_size for seg in device.segments)
    if len(t) == 0:
        return final_total == 0
    reserved = _recorded_reserved(device)
    return int(reserved[-1]) == final_total and int(reserved.min()) >= 0


def needs_recorded_state(device: DeviceData, recorded: AllocatorConfig) -> bool:
    """Whether a policy replay of ``device`` (the check, a what-if) reads the recorded replay
    (``recording.ReplaySource``): a partial trace starts from its state before the first event,
    and a recorded GC threshold bounds the limit from states where the GC did not run
    (``infer_limit``). An owner that forks the replays builds the source first when so."""
    return len(device.trace) > 0 and (not _segments_complete(device) or recorded.garbage_collection_threshold > 0)


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
    paired = compiled.alloc_ends(t.action, t.addr, free, ends=False)
    if paired is not None:
        return paired[1]
    sel = np.flatnonzero((t.action == ALLOC) | (t.action == free))
    if sel.size == 0:
        return True
    # Each address's events in trace order (a stable sort by address; the lifetimes' own order).
    pos, same = address_runs(t.addr, sel)
    alloc = (t.action[sel] == ALLOC)[pos]  # else the free: two kinds only
    # Each address starts with an alloc, and its kinds alternate.
    return bool(alloc[0] and alloc[1:][~same].all() and not (same & (alloc[1:] == alloc[:-1])).any())


# Limits tried inside the GC's interval (fitted_limit); each is one replay, so the
# fit is skipped on traces with more requests than _GC_FIT_MAX_REQUESTS (~0.1 s per
# 100k requests and replay).
_GC_FIT_POINTS = 9
_GC_FIT_MAX_REQUESTS = 500_000


def fitted_limit(
    snapshot: Snapshot, device: DeviceData, cfg: AllocatorConfig, estimate: LimitEstimate, requests: Requests
) -> int | None:
    """``estimate.value``, except under ``garbage_collection_threshold``: there every
    limit in the interval starts and skips the GC where the trace did, but how much a
    run frees (until ``reserved - threshold x limit`` is reclaimed) depends on where in
    it the limit lies. Then a few limits across the interval are replayed under the
    recorded settings and the one reproducing the longest prefix of the recorded
    segment events is taken (ties: nearest ``value``). Like the interval itself, an
    estimate from the trace alone; a known cap (``--limit``) replaces it.
    """
    value = estimate.value
    if value is None or estimate.gc_upper is None or estimate.device_full is not None:
        return value
    if len(requests.op_col) > _GC_FIT_MAX_REQUESTS:
        return value
    hi = estimate.gc_upper if estimate.upper is None else min(estimate.gc_upper, estimate.upper)
    lo = max(estimate.lower, estimate.gc_lower or 0)
    if hi <= lo:
        return value
    recorded = recorded_segment_events(device)
    step = (hi - lo) / (_GC_FIT_POINTS - 1)
    candidates = sorted({value, *(int(lo + k * step) for k in range(_GC_FIT_POINTS))}, key=lambda x: abs(x - value))
    best, best_len = value, -1
    for limit in candidates:
        events = simulate(snapshot, device, cfg, limit, requests=requests).segment_events
        same = next((k for k, (a, b) in enumerate(zip(recorded, events, strict=False)) if a != b), None)
        length = min(len(recorded), len(events)) if same is None else same
        if same is None and len(recorded) == len(events):
            return limit
        if length > best_len:
            best, best_len = limit, length
    return best


def replay_check(snapshot: Snapshot, device: DeviceData | int, *, requests: Requests | None = None) -> dict[str, Any]:
    """Contract ``replay``: does the model, under the recorded settings, reproduce
    every recorded segment event (same action, same size, same order) and fail
    exactly the requests that the recorded OOM entries failed?

    The limit is inferred from the trace (``infer_limit``) so that the recorded
    flush-and-retry bursts and OOMs happen at the same requests. Besides the
    contract keys: ``trace_complete``, the ``limit_bytes`` used, whether the
    recorded OOMs failed in the model too, the model's peak and final reserved
    memory, and the first mismatch.
    """
    dev = _device(snapshot, device)
    req = requests if requests is not None else requests_for(snapshot, dev)
    cfg = req.recorded_config
    estimate = infer_limit(snapshot, dev, cfg, req)
    limit = fitted_limit(snapshot, dev, cfg, estimate, req)
    result = simulate(snapshot, dev, cfg, limit, requests=req)
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
    ooms_reproduced = result.ooms == recorded_ooms
    complete = trace_is_complete(dev)
    return {
        "recorded_config": cfg.to_conf(),
        "segment_events_recorded": len(recorded),
        "segment_events_reproduced": same,
        # A partial trace has no starting state to replay from: never called exact. An
        # OOM the model served (or one it made up) is no exact replay either, even
        # when no segment event differs: the failed request reserves nothing.
        "exact": complete and same == len(recorded) == len(reproduced) and ooms_reproduced,
        "trace_complete": complete,
        "limit_bytes": limit,
        "ooms_recorded": recorded_ooms,
        "ooms_reproduced": ooms_reproduced,
        "peak_reserved_bytes": result.peak_reserved,
        "final_reserved_bytes": result.final_reserved,
        "first_mismatch": mismatch,
    }


# Starts a replay that a what-if needs later and returns its getter (``analysis.parallel.Pool.beside``).
Beside = Callable[[Callable[[], PolicyResult]], Callable[[], PolicyResult]]


def mirror_replay(
    order: str, cfg: AllocatorConfig, replay: Callable[[], PolicyResult], beside: Beside | None
) -> Callable[[], PolicyResult] | None:
    """The getter of a what-if's replay in the opposite order of new segments (``replay``), started
    now through ``beside`` or, without it, run when asked for; None where the order cannot matter
    (``tie_order_matters``)."""
    if not tie_order_matters(order, cfg):
        return None
    return beside(replay) if beside is not None else replay


def whatif(
    snapshot: Snapshot,
    device: DeviceData | int,
    conf: str,
    limit_bytes: int | None = None,
    step_ends: Sequence[int] | None = None,
    *,
    requests: Requests | None = None,
    capped: bool = True,
    beside: Beside | None = None,
) -> dict[str, Any]:
    """Contract ``whatif`` item: the recorded settings with ``conf`` applied on top.

    Without ``limit_bytes`` the limit is inferred: ``infer_limit(...).value`` when
    the trace shows a limit binding, else ``infer_limit(...).lower`` (the recorded
    peak: the least memory the device had). Pass the device's size for more room.
    Without ``step_ends`` the steps come from the annotations. ``capped`` false:
    the limit is the device's own memory, no per-process fraction, so no GC runs
    (``AllocatorConfig.acting``). ``beside`` starts the replay in the opposite order of new
    segments beside this one (``analysis.parallel.Pool.beside``); without it, it runs after.
    """
    dev = _device(snapshot, device)
    req = requests if requests is not None else requests_for(snapshot, dev)
    base = req.recorded_config
    cfg = AllocatorConfig.parse(conf, base=base).acting(capped)
    if limit_bytes is None:
        # The cap the trace shows, else the least memory the device must have had
        # (the recorded peak): without any limit a what-if would never flush, and
        # e.g. max_split_size_mb would pile up segments far past any real GPU.
        estimate = infer_limit(snapshot, dev, base, req)
        fitted = fitted_limit(snapshot, dev, base, estimate, req)
        limit_bytes = fitted if fitted is not None else (estimate.lower or None)
    ends = step_end_indices(snapshot, dev) if step_ends is None else list(step_ends)
    order = placement_for(cfg, base)
    mirror = mirror_replay(
        order,
        cfg,
        functools.partial(simulate, snapshot, dev, cfg, limit_bytes, ends, requests=req, placement="mirror"),
        beside,
    )
    result = simulate(snapshot, dev, cfg, limit_bytes, ends, requests=req, placement=order)
    other = mirror() if mirror is not None else None
    return {
        "config": conf,
        "peak_reserved_bytes": result.peak_reserved,
        "oom_avoided": result.oom_avoided,
        "steps": [{"index": k, "reserved_end_bytes": v} for k, v in enumerate(result.step_reserved)],
        "limit_bytes": limit_bytes,
        "oom_event_index": result.oom,
        "placement": placement_report(order, result.oom, result.oom_avoided, result.peak_reserved, other),
        "start": start_report(result.start),
    }


def placement_for(cfg: AllocatorConfig, recorded: AllocatorConfig) -> str:
    """The ``placement`` a replay under ``cfg`` takes: the recorded run's own addresses when
    ``cfg`` is the recorded settings (the replay is then that run), else the driver's rule
    from the start, so that the what-if does not depend on which run's trace it replays."""
    return "recorded" if cfg == recorded else "driver"


def tie_order_matters(order: str, cfg: AllocatorConfig) -> bool:
    """Whether a what-if is replayed again with new segments in the opposite order: not for the
    recorded settings (the run's own addresses), nor under expandable segments (no cudaMalloc'd
    segment is placed: reservations sit at fixed strides, one per pool and stream)."""
    return order != "recorded" and not cfg.expandable_segments


def placement_report(
    order: str, oom: int | None, avoided: bool | None, peak: int, other: PolicyResult | None
) -> dict[str, Any]:
    """The ``placement`` item of a what-if: which order gave the answer, and whether the
    opposite order of new segments (``MirrorPlacement``: equal free blocks tied the other
    way) gives the same one. ``certain`` false: whether the run dies hangs on where the
    driver puts segments, which no trace of another run shows. ``outcomes`` (both orders'
    failing event, ``oom_avoided`` and peak) whenever the two differ at all."""
    out: dict[str, Any] = {"order": order, "certain": True, "outcomes": None}
    if other is None:
        return out
    # The answer is whether the run dies (and, with a recorded OOM, whether it is avoided);
    # where only the request it dies at moves, the answer holds and both outcomes are given.
    out["certain"] = ((other.oom is None), other.oom_avoided) == ((oom is None), avoided)
    if other.oom != oom or not out["certain"]:
        out["outcomes"] = [
            {"order": order, "oom_event_index": oom, "oom_avoided": avoided, "peak_reserved_bytes": peak},
            {
                "order": "mirror",
                "oom_event_index": other.oom,
                "oom_avoided": other.oom_avoided,
                "peak_reserved_bytes": other.peak_reserved,
            },
        ]
    return out
