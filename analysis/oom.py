"""An OOM explained: the request, the memory at that moment, the limit, the verdict.

Verdict rule (contract): ``fragmentation`` when ``allocated + requested <=
limit`` - the memory existed but not in one piece - else ``capacity``.

The limit is the report's (``analysis.limits.choose_limit``): ``--limit`` when
given, the client's sidecar, the pasted OOM message, and only then inferred
from the trace by the allocator package's one rule
(``analysis.allocator.floor_estimate(...).stated()``, ``infer_limit``'s bounds from
below): the device itself was full
(``reserved + device_free``), else a per-process cap was binding and the limit
is the most the trace shows the cap let through, a lower bound of that cap
(labelled so in ``limit_is_lower_bound`` and in the explanation).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator.config import AllocatorConfig, is_small
from analysis.allocator.states import AllocatorState
from analysis.limits import GIVEN, INFERRED, OOM_MESSAGE, SIDECAR, Limit
from analysis.model import FREE_COMPLETED, INACTIVE, OOM, SEGMENT_FREE, SEGMENT_UNMAP, Trace
from analysis.readout import size

I64 = npt.NDArray[np.int64]

# OOMs per device whose usable free block is worked out (each keeps two replay states).
MAX_OOMS_EXPLAINED = 32

# Events the flush-and-retry before an OOM emits: pending frees retired, then
# cached segments released.
_FLUSH_ACTIONS = (FREE_COMPLETED, SEGMENT_FREE, SEGMENT_UNMAP)


def oom_indices(trace: Trace) -> I64:
    return np.flatnonzero(trace.action == OOM).astype(np.int64)


def verdict(allocated: int, requested: int, limit: int) -> str:
    return "fragmentation" if allocated + requested <= limit else "capacity"


def flush_before(trace: Trace, index: int) -> dict[str, int]:
    """The burst of free_completed/segment_free/segment_unmap right before event ``index``."""
    lo = flush_window_start(trace, index)
    window = slice(lo, index)
    actions = trace.action[window]
    sizes = trace.size[window]
    released = (actions == SEGMENT_FREE) | (actions == SEGMENT_UNMAP)
    return {
        "first_event": int(lo),
        "events": int(index - lo),
        "segments_released": int(released.sum()),
        "released_bytes": int(sizes[released].sum()),
        "frees_completed": int((actions == FREE_COMPLETED).sum()),
    }


def flush_window_start(trace: Trace, index: int) -> int:
    """The first event of the run of completions and segment releases right before the OOM
    entry ``index``: the failing malloc's own work (its process_events, GC, flushes)."""
    lo = index
    while lo > 0 and int(trace.action[lo - 1]) in _FLUSH_ACTIONS:
        lo -= 1
    return lo


class UsableFree:
    """What the failing request could have used, read off the recorded replay's states.

    ``largest`` is the largest free block ``get_free_block`` could hand this request
    when it searched: before the malloc's own flush, on the request's stream, in its
    pool (private pools apart, small or large), allowed by ``max_split_size``.
    ``why_not`` (None when no free block at the failure was as big as the request)
    says why a block that was free when the request failed did not serve it.
    """

    __slots__ = ("largest", "why_not")

    def __init__(
        self, trace: Trace, index: int, before: AllocatorState, at_oom: AllocatorState, cfg: AllocatorConfig
    ) -> None:
        size, stream, pool = int(trace.size[index]), int(trace.stream[index]), int(trace.pool[index])
        small = is_small(size)

        def usable(seg: Any, size_of_block: int) -> bool:  # of any size up to max_split_size's bound
            return (
                seg.stream == stream
                and seg.pool == pool
                and (seg.segment_type == "small") == small
                and size_of_block < cfg.fit_limit(size)
            )

        self.largest = max(
            (b.size for seg in before.segments for b in seg.blocks if b.state == INACTIVE and usable(seg, b.size)),
            default=0,
        )
        big = [(b.size, seg) for seg in at_oom.segments for b in seg.blocks if b.state == INACTIVE and b.size >= size]
        self.why_not: str | None = None
        if big:
            block, seg = max(big, key=lambda x: x[0])
            if seg.stream != stream:
                self.why_not = "it belonged to another stream's blocks, which a request never takes"
            elif seg.pool != pool:
                self.why_not = "it was in another memory pool (a CUDA graph's or a MemPool's)"
            elif (seg.segment_type == "small") != small:
                self.why_not = f"it was in the {seg.segment_type}-block pool, and this request is served from the other"
            elif not cfg.block_fits(block, size):
                self.why_not = "max_split_size_mb keeps blocks that big whole, for requests of their own size"
            else:
                self.why_not = (
                    "it became free only in the allocator's own flush, after its search, and torch does not "
                    "search the cache again after flushing"
                )


# How an OOM's texts name the free block they give: the one the request could use, or (not
# worked out: old reports, OOMs past MAX_OOMS_EXPLAINED) the largest of all.
USABLE_BLOCK = "the largest free block the request could use"
ANY_BLOCK = "its largest free block"


def named_free_block(oom: Mapping[str, Any]) -> tuple[int, str]:
    """The free block an OOM's text names and the words for it: ``largest_usable_free_block_bytes``
    (``USABLE_BLOCK``), else the largest free block of all (``ANY_BLOCK``)."""
    usable = oom.get("largest_usable_free_block_bytes")
    if usable is None:
        return int(oom.get("largest_free_block_bytes") or 0), ANY_BLOCK
    return int(usable), USABLE_BLOCK


def explain_oom(
    trace: Trace,
    index: int,
    *,
    allocated: int,
    reserved: int,
    cached_free: int,
    largest_free: int,
    chosen: Limit,
    all_ooms: int = 1,
    usable: UsableFree | None = None,
) -> dict[str, Any]:
    """The contract ``oom`` object (plus explanation keys) for the OOM at event ``index``,
    under ``chosen``, the device's limit (given, sidecar, OOM message or inferred);
    ``usable``: what the request could have used (None: not worked out)."""
    requested = int(trace.size[index])
    device_free = int(trace.addr[index])  # the model stores device_free in addr for oom events
    limit_bytes, limit_source = chosen.bytes, chosen.source
    kind = verdict(allocated, requested, limit_bytes)
    flush = flush_before(trace, index)
    out: dict[str, Any] = {
        "event_index": int(index),
        "time_us": int(trace.time_us[index]),
        "requested_bytes": requested,
        "device_free_bytes": device_free,
        "reserved_bytes": int(reserved),
        "allocated_bytes": int(allocated),
        "cached_free_bytes": int(cached_free),
        "largest_free_block_bytes": int(largest_free),
        "largest_usable_free_block_bytes": None if usable is None else int(usable.largest),
        "limit_bytes": limit_bytes,
        "limit_source": limit_source,
        "limit_is_lower_bound": chosen.is_lower_bound,
        "limit_inference": chosen.inference,
        "limit_kind": chosen.kind,
        "verdict": kind,
        "request_verdict": kind,
        "verdict_level": "request",
        # Only "capacity" can be wrong from a lower bound: the real cap may hold the request.
        "verdict_certain": not (kind == "capacity" and chosen.is_lower_bound),
        "shortfall_bytes": int(max(0, allocated + requested - limit_bytes)),
        "headroom_bytes": int(max(0, limit_bytes - reserved)),
        "flush": flush,
        "ooms_in_trace": int(all_ooms),
        "explanation": _explain(kind, requested, allocated, cached_free, largest_free, chosen, reserved, usable),
    }
    return out


def _gib(n: int) -> str:
    # Two decimals of GiB would word a few MiB as "0.00 GiB": those are worded in their own unit.
    if 0 < abs(n) < 2**30 // 200:
        return size(n)
    return f"{n / 2**30:.2f} GiB"


def _left_to_reserve(left: int) -> str:
    return "nothing was left to reserve" if left <= 0 else f"{_gib(left)} was left to reserve"


def _explain(
    kind: str,
    requested: int,
    allocated: int,
    cached_free: int,
    largest_free: int,
    chosen: Limit,
    reserved: int,
    usable: UsableFree | None = None,
) -> str:
    limit = chosen.bytes
    if chosen.source == INFERRED:
        limit_text = (
            "the per-process cap (at least what the trace shows it allowed)"
            if chosen.is_lower_bound
            else "the device's memory"
        )
    else:
        what = "the device's memory" if chosen.kind == "device-full" else "the limit"
        limit_text = {
            GIVEN: "the given limit",
            SIDECAR: f"{what} the client read",
            OOM_MESSAGE: f"{'the per-process cap' if chosen.kind == 'per-process-cap' else what} of the OOM message",
        }[chosen.source]
    # "at least" once: an inferred cap's text already says it is a lower bound
    lower_said = chosen.source == INFERRED
    of = f"of at least {_gib(limit)}" if chosen.is_lower_bound and not lower_said else f"of {_gib(limit)}"
    if kind == "fragmentation":
        block, named = (largest_free, ANY_BLOCK) if usable is None else (usable.largest, USABLE_BLOCK)
        text = (
            f"The request for {_gib(requested)} would have fit: {_gib(allocated)} allocated plus the request is "
            f"within {limit_text} {of}, and the cache held {_gib(cached_free)} free, but {named} was {_gib(block)} "
            f"and {_left_to_reserve(max(0, limit - reserved))}. The memory existed, not in one piece."
        )
        if usable is not None and usable.why_not is not None:
            text += f" A free block of {_gib(largest_free)} was there when it failed, but {usable.why_not}."
        return text
    if chosen.is_lower_bound:
        # A lower bound proves nothing about capacity: the real cap may be higher.
        return (
            f"The request for {_gib(requested)} on top of {_gib(allocated)} allocated exceeds {_gib(limit)}, "
            "the most the trace shows the cap allowed; the real per-process cap is not in the snapshot and may be "
            "higher, so whether an allocator setting can make it fit is unknown: paste the OOM message or give the "
            "memory cap."
        )
    return (
        f"The request for {_gib(requested)} on top of {_gib(allocated)} allocated exceeds {limit_text} "
        f"{of}: no allocator setting can make it fit; the workload needs less memory."
    )
