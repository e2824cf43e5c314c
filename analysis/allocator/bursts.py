"""The runs of released segments in a trace, told apart: a user's ``empty_cache()`` or a malloc's own flush.

A malloc flushes by itself in the GC, ``release_available_cached_blocks`` and ``release_cached_blocks`` (before
a retry or an OOM). ``bursts_of`` classifies each run (``Burst``); ``requests.build_requests`` turns the user's
into flush requests of the stream the policy replay is fed, and ``limits`` reads the malloc's for the bounds on
the limit. Where the trace alone cannot tell, the recorded cache is probed (``_CacheProbe``: could it have
served the request that followed?)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analysis.allocator.config import (
    K_SMALL_BUFFER,
    UNLIMITED,
    AllocatorConfig,
    is_small,
    limit_refuses,
)
from analysis.allocator.recording import ReplaySource
from analysis.allocator.reserved import ReservedLevels, recorded_levels
from analysis.model import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    I32,
    I64,
    INACTIVE,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    DeviceData,
    Snapshot,
)


@dataclass(frozen=True, slots=True)
class Burst:
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


def request_of(act: npt.NDArray[np.int8], idx: I64) -> I64:
    """For each event index, the next request (alloc or oom) at or after it; -1 if none."""
    requests = np.flatnonzero((act == ALLOC) | (act == OOM))
    if requests.size == 0:
        return np.full(idx.shape, -1, np.int64)
    pos = np.searchsorted(requests, idx)
    return np.where(pos < requests.shape[0], requests[np.minimum(pos, requests.shape[0] - 1)], -1)


def request_alloc_size(device: DeviceData, cfg: AllocatorConfig, req: int) -> int:
    """``alloc_size`` of the request at event ``req`` (an oom entry's size is already rounded)."""
    t = device.trace
    size = int(t.size[req]) if t.action[req] == OOM else cfg.round_size(int(t.size[req]))
    return cfg.allocation_size(size)


def limit_floor(device: DeviceData, cfg: AllocatorConfig, reserved: ReservedLevels) -> int:
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
    req = request_of(act, grow)
    first = np.r_[True, req[1:] != req[:-1]]  # a request may map several ranges
    for i, r in zip(grow[first].tolist(), req[first].tolist(), strict=True):
        if r < 0:
            continue
        before = int(reserved[i - 1]) if i > 0 else 0
        floor = max(floor, before + request_alloc_size(device, cfg, r))
    return floor


def _empty_cache_stacks(snapshot: Snapshot, stack_ids: set[int]) -> dict[int, bool]:
    """Which of these stacks pass through ``torch.cuda.empty_cache`` (Python frame
    ``empty_cache``, or the C++ ``emptyCache`` with ``stacks="all"``)."""
    out = {}
    for sid in stack_ids:
        frames = snapshot.stacks.frames_of(sid)
        out[sid] = any(f.name == "empty_cache" or "emptyCache" in f.name for f in frames)
    return out


def reads_recorded_state(device: DeviceData) -> bool:
    """Whether ``build_requests`` may read the recorded replay (``bursts_of``' cache probe): only a
    trace that releases segments can; an owner that learns the states to keep later builds the
    requests once it knows them."""
    act = device.trace.action
    return bool(((act == SEGMENT_FREE) | (act == SEGMENT_UNMAP)).any())


def bursts_of(
    snapshot: Snapshot,
    device: DeviceData,
    cfg: AllocatorConfig,
    pools: I32,
    source: ReplaySource | None = None,
) -> list[Burst]:
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
    ``limit_floor``) and the cache held no block for the request (a malloc
    flushes only after missing); anything else is ``empty_cache()`` by user code.
    ``source``: the device's recorded replay (``recording.ReplaySource``), read only there.
    """
    t = device.trace
    act = t.action
    n = len(t)
    is_rel = (act == SEGMENT_FREE) | (act == SEGMENT_UNMAP)
    if not is_rel.any():
        return []
    reserved = recorded_levels(device)
    floor = limit_floor(device, cfg, reserved)
    rel = np.flatnonzero(is_rel)
    breaks = np.flatnonzero(np.diff(rel) != 1)
    starts = np.r_[rel[0], rel[breaks + 1]]
    ends = np.r_[rel[breaks], rel[-1]]
    reqs = request_of(act, ends + 1)
    gc_recorded = cfg.garbage_collection_threshold > 0.0
    stack_ids = {int(x) for x in t.stack[rel].tolist() if x >= 0}
    via_empty_cache = _empty_cache_stacks(snapshot, stack_ids)
    ambiguous = _CacheProbe(source if source is not None else ReplaySource(snapshot, device), cfg, pools)
    ambiguous.expect(_probe_candidates(device, cfg, starts, ends, reqs, floor, gc_recorded))
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
        # The GC starts only above threshold x limit, and the limit is at least the
        # floor: at or below threshold x floor the run is not the GC, whatever else it is
        # (release_available's oversize segments with max_split_size, a flush, user code).
        gc_possible = gc_recorded and not (s > 0 and int(reserved[s - 1]) <= cfg.gc_threshold_bytes(floor))
        # ... and it frees whole cudaMalloc'd segments only: never a small-pool one, never
        # pages of an expandable segment (it skips those), so never a segment_unmap.
        gc_like = gc_possible and no_small and bool((act[s : e + 1] == SEGMENT_FREE).all())
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
            refusable = limit_refuses(before, request_alloc_size(device, cfg, req), floor)
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
        # A run release_available could have made on its own (with max_split_size) is
        # taken for it: it does not sync, so the completions before it are process_events'.
        synced = (
            kind in ("retry", "oom")
            and req >= 0
            and _synced_before(device, s, e)
            and not _looks_like_release_available(device, cfg, s, e, req)
        )
        split = None
        if kind in ("retry", "oom") and gc_possible and not chained and not follows_chained:
            split = _gc_then_flush(device, s, e)
            if split is not None and _looks_like_release_available(device, cfg, s, split - 1, req):
                split = None  # with max_split_size: release_available's oversize segments, then the flush
        if split is not None:
            # One malloc's GC, then (no pending frees to sync between them) its flush: two runs.
            out.append(Burst(s, split - 1, "gc", req, False, False))
            out.append(Burst(split, e, kind, req, False, False))
        else:
            out.append(Burst(s, e, kind, req, synced, follows_chained))
        follows_chained = chained and kind != "user"
    return out


def _gc_then_flush(device: DeviceData, s: int, e: int) -> int | None:
    """Where a flush's run [s, e] began, when the same malloc's GC ran right before it.

    ``garbage_collect_cached_blocks`` releases whole large-pool segments in the pool's
    order (stream, size, address) and stops once it reclaimed enough; the flush
    (``release_cached_blocks``) then releases every whole free segment from the start of
    that order again, the large pool before the small one. With no pending frees to sync
    in between the two are one run; a step back in the order within its large-pool part
    is where the flush began (None: no step back, one run).
    """
    t = device.trace
    prev: tuple[bool, int, int, int] | None = None
    for i in range(s, e + 1):
        if t.action[i] != SEGMENT_FREE:
            return None
        key = _pool_order(device, i)
        if key[0]:
            return None  # a small-pool segment before any step back: the GC never frees those
        if prev is not None and key < prev:
            return i
        prev = key
    return None


def _pool_order(device: DeviceData, i: int) -> tuple[bool, int, int, int]:
    """Where the segment that event ``i`` releases stands in the order a flush releases them:
    large pool before small, then by stream, size, address (the pools' ``BlockComparatorSize``)."""
    t = device.trace
    streams = device.streams
    stream = streams[int(t.stream[i])] if streams else 0
    return (int(t.size[i]) == K_SMALL_BUFFER, stream, int(t.size[i]), int(t.addr[i]))


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


def _probe_candidates(
    device: DeviceData, cfg: AllocatorConfig, starts: I64, ends: I64, reqs: I64, floor: int, gc_recorded: bool
) -> list[int]:
    """Where ``bursts_of`` may probe the cache (``_CacheProbe.served``): before each run of releases
    followed by a new segment for a request that the limit could have refused (or the GC freed),
    at the state before the run's completions. A superset of the probes: the stacks and the runs
    chained to others, which rule some of these out, are ``bursts_of``' to read."""
    act = device.trace.action
    reserved = recorded_levels(device)
    out = []
    for s, e, req in zip(starts.tolist(), ends.tolist(), reqs.tolist(), strict=True):
        if req < 0 or e + 1 >= len(act) or int(act[e + 1]) not in (SEGMENT_ALLOC, SEGMENT_MAP):
            continue
        before = int(reserved[s - 1]) if s > 0 else 0
        if gc_recorded or limit_refuses(before, request_alloc_size(device, cfg, req), floor):
            at = _before_completions(act, s) - 1
            if at >= 0:
                out.append(at)
    return out


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
    order = [_pool_order(device, i) for i in range(s, e + 1) if act[i] == SEGMENT_FREE]
    return order == sorted(order)


class _CacheProbe:
    """Whether the recorded cache could serve a request, checked on the recorded
    replay's state (the source builds it only if a burst needs it: a malloc flushes
    only after ``get_free_block`` missed)."""

    def __init__(self, source: ReplaySource, cfg: AllocatorConfig, pools: I32) -> None:
        self.source, self.device, self.cfg, self._pools = source, source.device, cfg, pools

    def expect(self, indices: list[int]) -> None:
        """The states ``served`` may read: kept by the recorded replay's one pass when it has not run
        yet (``ReplaySource.keep``), so that no probe replays the trace again (issue 31)."""
        if indices and not self.source.built:
            self.source.keep(indices)

    def served(self, index: int, req: int) -> bool:
        if index < 0:
            return False
        t, cfg = self.device.trace, self.cfg
        size = int(t.size[req]) if t.action[req] == OOM else cfg.round_size(int(t.size[req]))
        small = is_small(size)
        stream, pool = int(t.stream[req]), int(self._pools[req])
        for seg in self.source.get().blocks_at(index).segments:
            if seg.stream != stream or seg.pool != pool or (seg.segment_type == "small") != small:
                continue
            if any(b.state == INACTIVE and cfg.block_fits(b.size, size) for b in seg.blocks):
                return True
        return False
