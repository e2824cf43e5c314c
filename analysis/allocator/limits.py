"""The memory limit a trace was recorded under, bounded from the trace alone.

A snapshot does not record ``set_per_process_memory_fraction``; ``infer_limit``
bounds it from what the allocator did (docs/allocator.md, "The limit").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from analysis.allocator.bursts import Burst, bursts_of, limit_floor, request_alloc_size, request_of
from analysis.allocator.config import AllocatorConfig, limit_refuses
from analysis.allocator.recording import ReplaySource
from analysis.allocator.requests import Requests, _device, requests_for
from analysis.allocator.reserved import ReservedLevels, recorded_levels
from analysis.model import FREE_COMPLETED, OOM, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, DeviceData, Snapshot


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
        # A miss that the GC let pass with a whole free segment at hand (gc_lower) bounds the
        # limit from below too: under the least limit alone the GC would have freed it.
        return min(max(self.lower, self.gc_lower or 0), self.upper)

    def stated(self) -> tuple[int, str]:
        """The limit a report states from the trace alone, and how it was found.

        ``device-full`` where an OOM found the device with less free memory than
        the segment it needed (reserved plus that free memory, at least
        ``lower``); else ``cap-lower-bound``: ``lower``, the most that the
        limit check let through, so a true lower bound of the per-process cap.
        The peak reserved memory is that too without expandable segments, but
        not with them: whole pages are mapped after the check of the request
        alone, and reserved memory can end above the cap (gpu_expandable_oom:
        3,231,711,232 B reserved under a 3 GiB cap; ``lower`` 3,214,934,016 B).
        """
        if self.device_full is not None:
            return max(self.device_full, self.lower), "device-full"
        return self.lower, "cap-lower-bound"


def infer_limit(
    snapshot: Snapshot,
    device: DeviceData | int,
    config: AllocatorConfig | None = None,
    requests: Requests | None = None,
) -> LimitEstimate:
    """The interval the process's memory limit must lie in, from the trace alone.

    The snapshot does not record a per-process cap (``set_per_process_memory_fraction``).
    Every ``reserved + alloc_size`` checked before a new segment was allowed:
    ``lower`` is the largest of these. Each time the allocator refused a segment, reserved plus that
    segment's ``alloc_size`` exceeded the limit: at the flush before a
    flush-and-retry (``reserved`` before the flush) and at an OOM (``reserved``
    after the flush). ``upper`` is one less than the smallest such sum. A GC run
    (``garbage_collection_threshold``) starts only above threshold x limit, which
    bounds the limit too (``gc_upper``), and so does a miss where it did not run
    (``gc_lower``). ``requests``: the trace's ``Requests`` if built already (the bounds are then kept
    with them, ``Requests.remembered``).
    """
    dev = _device(snapshot, device)
    req = requests if requests is not None else requests_for(snapshot, dev)
    cfg = config or req.recorded_config
    if requests is None:
        return _inferred_limit(snapshot, dev, cfg, req)
    # The requests a caller built and hands to every replay (a report's check and what-ifs, on their own
    # threads, most for the recorded settings): the bounds found once, for all of them.
    return req.remembered(("infer_limit", cfg), lambda: _inferred_limit(snapshot, dev, cfg, req))  # type: ignore[no-any-return]


def _inferred_limit(snapshot: Snapshot, dev: DeviceData, cfg: AllocatorConfig, req: Requests) -> LimitEstimate:
    """``infer_limit``'s bounds, found (``req``: ``dev``'s requests)."""
    bursts = req.bursts if cfg == req.recorded_config else bursts_of(snapshot, dev, cfg, req.pools, req.source)
    t = dev.trace
    reserved = recorded_levels(dev)
    lower = limit_floor(dev, cfg, reserved)
    upper, gc_upper, evidence = _burst_bounds(dev, cfg, reserved, bursts)
    # Also without a GC run: a miss that made a new segment with nothing released bounds it.
    has_gc = cfg.garbage_collection_threshold > 0
    gc_lower = _gc_lower(req.source, cfg, reserved, bursts) if has_gc else None
    if gc_upper is not None:
        # A run taken for the GC whose bound contradicts the rest of the trace (the GC
        # could not have started under any limit it allows) and that frees exactly what
        # release_available_cached_blocks frees for its request: it was that.
        floor = max(lower, gc_lower or 0)
        redo = [b for b in bursts if b.kind == "gc" and _gc_bound(cfg, reserved, b) < floor]
        redo = [b for b in redo if _release_available_run(dev, cfg, reserved, b, floor)]
        if redo:
            again = {b.start for b in redo}
            bursts = [replace(b, kind="avail") if b.start in again else b for b in bursts]
            upper, gc_upper, evidence = _burst_bounds(dev, cfg, reserved, bursts)
            gc_lower = _gc_lower(req.source, cfg, reserved, bursts)
    for i in np.flatnonzero(t.action == OOM).tolist():
        need = cfg.allocation_size(int(t.size[i]))
        bound = int(reserved[i]) + need - 1
        upper = bound if upper is None else min(upper, bound)
        evidence += 1
    device_full = _device_full(dev, cfg, reserved)
    return LimitEstimate(lower, upper, device_full, evidence, gc_upper, gc_lower)


def floor_estimate(snapshot: Snapshot, device: DeviceData | int, config: AllocatorConfig) -> LimitEstimate:
    """``infer_limit``'s bounds from below alone: the same ``lower`` and ``device_full``,
    no bound from above (``upper`` None, no evidence counted).

    They need no request stream (no bursts, no recorded replay), so a report states its
    limit from them (``.stated()``) and floors a message's limit with ``.lower`` at the
    cost of one pass over the segment events.
    """
    dev = _device(snapshot, device)
    reserved = recorded_levels(dev)
    return LimitEstimate(limit_floor(dev, config, reserved), None, _device_full(dev, config, reserved), 0)


def _device_full(dev: DeviceData, cfg: AllocatorConfig, reserved: ReservedLevels) -> int | None:
    """The least ``reserved + device_free`` at an OOM where the device had less free
    memory than the segment the request needed (cudaMalloc itself failed)."""
    t = dev.trace
    device_full: int | None = None
    for i in np.flatnonzero(t.action == OOM).tolist():
        device_free = int(t.addr[i])
        if device_free < cfg.allocation_size(int(t.size[i])):
            full = int(reserved[i]) + device_free
            device_full = full if device_full is None else min(device_full, full)
    return device_full


def _gc_bound(cfg: AllocatorConfig, reserved: ReservedLevels, b: Burst) -> int:
    """The largest limit under which a GC run at ``b`` starts: before > int(threshold x limit)."""
    before = int(reserved[b.start - 1]) if b.start > 0 else 0
    bound = int(before / cfg.garbage_collection_threshold)
    while bound > 0 and cfg.gc_threshold_bytes(bound) >= before:
        bound -= 1
    return bound


def _burst_bounds(
    dev: DeviceData, cfg: AllocatorConfig, reserved: ReservedLevels, bursts: list[Burst]
) -> tuple[int | None, int | None, int]:
    """``upper`` from the refusals before a flush, ``gc_upper`` from the GC runs, and how many bound it."""
    upper: int | None = None
    gc_upper: int | None = None
    evidence = 0
    for b in bursts:
        before = int(reserved[b.start - 1]) if b.start > 0 else 0
        if b.kind in ("retry", "avail") and b.request >= 0 and not b.second:
            bound = before + request_alloc_size(dev, cfg, b.request) - 1
            upper = bound if upper is None else min(upper, bound)
            evidence += 1
        elif b.kind == "gc" and cfg.garbage_collection_threshold > 0:
            bound = _gc_bound(cfg, reserved, b)
            gc_upper = bound if gc_upper is None else min(gc_upper, bound)
            evidence += 1
    return upper, gc_upper, evidence


def _release_available_run(
    dev: DeviceData, cfg: AllocatorConfig, reserved: ReservedLevels, b: Burst, floor: int
) -> bool:
    """Whether the run ``b`` can be release_available_cached_blocks' for its request under a
    limit of at least ``floor``: it runs only after the limit refused the request's segment,
    and frees exactly its segments (``AllocatorConfig.release_available_frees``), of the
    request's stream; when they fall short the malloc goes on to flush (``b``'s next run)."""
    t = dev.trace
    r = b.request
    if r < 0 or b.start == 0:
        return False
    if not limit_refuses(int(reserved[b.start - 1]), request_alloc_size(dev, cfg, r), floor):
        return False
    run = slice(b.start, b.end + 1)
    if (t.action[run] != SEGMENT_FREE).any() or (t.stream[run] != t.stream[r]).any():
        return False
    k = b.end + 1
    while k < len(t) and t.action[k] == FREE_COMPLETED:
        k += 1
    flush_follows = k < len(t) and int(t.action[k]) in (SEGMENT_FREE, OOM)
    return cfg.release_available_frees(
        t.size[run].tolist(), cfg.round_size(int(t.size[r])), flush_follows=flush_follows
    )


def _gc_lower(source: ReplaySource, cfg: AllocatorConfig, reserved: ReservedLevels, bursts: list[Burst]) -> int | None:
    """A lower bound of the limit from where ``garbage_collect_cached_blocks`` did
    not run, or stopped (checked on the recorded replay's state).

    With a threshold and a cap, every malloc that misses calls the GC. It frees
    nothing only when reserved memory is at most ``threshold x limit`` or no
    whole free segment of the default large pool exists; and once it runs, it
    stops with such segments left only after reclaiming ``reserved - threshold x
    limit``. So a miss with no GC frees while a freeable segment existed, and a
    GC run that left one, each put ``threshold x limit`` at or above what was
    reserved (minus what that run freed). ``source``: the device's recorded replay.
    """
    dev = source.device
    t = dev.trace
    act = t.action
    first_burst: dict[int, Burst] = {}
    for b in bursts:
        if b.request >= 0 and b.kind != "user":
            first_burst.setdefault(b.request, b)
    grow = np.flatnonzero((act == SEGMENT_ALLOC) | (act == SEGMENT_MAP))
    if grow.size == 0:
        return None
    reqs = request_of(act, grow)
    replay = source.get()

    def freeable(index: int) -> bool:
        # A whole free segment of the default large pool, not expandable: a column of the one pass.
        return replay.whole_free_segments(index) > 0

    need = 0
    seen: set[int] = set()
    for i, r in zip(grow.tolist(), reqs.tolist(), strict=True):
        if r < 0 or r in seen:
            continue
        seen.add(r)
        fb = first_burst.get(r)
        if fb is not None and fb.kind == "gc":
            before = int(reserved[fb.start - 1]) if fb.start > 0 else 0
            freed = before - int(reserved[fb.end])
            if freeable(fb.end):
                need = max(need, before - freed)
        elif fb is None:
            # A new segment with nothing released first: the GC ran (after process_events)
            # and freed nothing. A flush's run is no such evidence: a GC that freed some
            # segments in the pool's order right before it leaves no mark in that run.
            at = i - 1
            if at >= 0 and freeable(at):
                need = max(need, int(reserved[at]))
    if need == 0:
        return None
    threshold = cfg.garbage_collection_threshold
    bound = int(need / threshold)
    while cfg.gc_threshold_bytes(bound) < need:
        bound += 1
    return bound


def allowed_for_fraction(fraction: float, device_total: int) -> int:
    """The bytes ``set_per_process_memory_fraction(fraction)`` lets the allocator reserve.

    torch stores ``static_cast<size_t>(fraction * total)``: the double product, truncated. A cap
    asked for as ``bytes / total`` can so come out one byte under ``bytes``, and a model given
    ``bytes`` would let a segment through that ends exactly there, which the real run refused
    (densenet_c75: 8,562,671,616 asked, 8,562,671,615 allowed).
    """
    return int(fraction * device_total)
