"""The failing step's what-if: the recorded requests up to the OOM, then the projected tail, under one setting.

``step_whatif`` is ``allocator.whatif``'s item for a setting, replayed with the rest of the
failing step that ``projection.project_failing_step`` projected, plus the step-level answer:
whether the step completes (``step_completes``), by how much it falls short, and which
projected request fails. Where the trace cannot tell the answer (the limit's range, the order
of new segments, an OOM the program survived, the failing request's rounding), the step is
replayed at both ends and ``step_completes`` is None with both answers given. ``first_failure``
reads where a replay with the tail first fails (``horizon.grown_horizon`` reads it too).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.allocator import PolicyResult, ProjectedTail, Requests, simulate
from analysis.allocator.answers import Beside, mirror_replay, placement_report, start_report
from analysis.allocator.config import AllocatorConfig
from analysis.allocator.policy import caught_served, placement_for
from analysis.model import OOM, DeviceData, Snapshot
from analysis.projection import Projection


def first_failure(
    ooms: list[int], projection: Projection, n: int, caught: frozenset[int] = frozenset()
) -> tuple[int | None, int | None]:
    """Where a what-if first fails, as (event index, None) in the recorded part or
    (None, j) at tail request ``j`` (request 0, the OOM request, also gives its
    event index); (None, None) when every request up to the step's end was served.

    ``ooms`` is ``PolicyResult.ooms`` of a replay with ``projection.tail``, in
    replay order. ``caught`` are earlier recorded OOMs the program survived
    (``frag_oom`` catches one): failing them again is no death.
    """
    for i in ooms:
        if i == projection.oom_event:
            return i, 0
        if i >= n:
            return None, i - n
        if i not in caught:
            return i, None
    return None, None


def step_whatif(
    snapshot: Snapshot,
    dev: DeviceData,
    conf: str,
    limit_bytes: int | None,
    step_ends: list[int],
    projection: Projection,
    limit_range: tuple[int, int] | None = None,
    capped: bool = True,
    requests: Requests | None = None,
    beside: Beside | None = None,
) -> dict[str, Any]:
    """``allocator.whatif``'s item for ``conf``, replayed with the projected tail, plus the
    step-level keys (``step_completes``, ``step_shortfall_bytes``, ``oom_projected``,
    ``step_completes_range``).

    One replay per configuration, as before: the recorded requests up to the OOM,
    then the tail (the exception's unwinding after the OOM is not replayed; it only
    frees). ``peak_reserved_bytes`` is over the recorded part, comparable with the
    recorded run; ``step_peak_reserved_bytes`` includes the tail.

    ``limit_range`` (low, high): where the real limit may lie (an OOM message's two
    decimals). When the answer at ``limit_bytes`` is near an end of it (the step's
    peak reserved memory above ``low``, or the failing request short by less than
    ``high - limit_bytes``), the step is replayed once more at that end; if the two
    answers differ, the trace cannot tell which holds: ``step_completes`` is None
    and ``step_completes_range`` gives both. ``capped``, ``requests`` and ``beside`` as in
    ``allocator.whatif``.
    """
    assert projection.tail is not None
    base = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    cfg = AllocatorConfig.parse(conf, base=base).acting(capped)
    order = placement_for(cfg, base)
    n = len(dev.trace)
    caught = frozenset(int(i) for i in np.flatnonzero(dev.trace.action == OOM).tolist()) - {projection.oom_event}
    replay = _StepReplay(snapshot, dev, cfg, step_ends, projection, order, requests, caught)
    mirror = mirror_replay(order, cfg, functools.partial(replay.run, limit_bytes, placement="mirror"), beside)
    result = replay.run(limit_bytes)
    at_event, at_request = first_failure(result.ooms, projection, n, caught)
    completes = at_event is None and at_request is None
    request_shortfall, projected = 0, None
    if not completes:
        request_shortfall, projected = _failing_request(dev, cfg, projection, result, at_event, at_request, limit_bytes)
    shortfall = request_shortfall
    if limit_bytes is not None:
        shortfall = max(shortfall, projection.step_need_bytes - limit_bytes)
    across: dict[str, Any] | None = None
    gc = cfg.garbage_collection_threshold > 0.0
    probe = _range_probe(limit_range, limit_bytes, completes, result.peak_reserved, projection, request_shortfall, gc)
    if probe is not None and replay.completes(replay.run(probe)) != completes:
        assert limit_range is not None
        across = dict(zip(("low_bytes", "high_bytes"), limit_range, strict=True))
        across |= {"completes_at_limit": completes, "probed_bytes": probe, "completes_at_probe": not completes}
    fallback = _caught_ooms(replay, result, limit_bytes, completes)
    request_range = _request_range(
        projection, cfg, completes, lambda t: replay.completes(replay.run(limit_bytes, tail=t))
    )
    placement = _placement(replay, result, mirror, completes)
    # None where the answer flips inside the limit's range, with the order of new segments, with a
    # caught OOM's block kept or freed, or with the failing request's low or high end: the trace
    # cannot say which holds (step_completes_range, placement, caught_ooms, oom_request_range give both).
    bounds = (fallback, request_range)
    certain = across is None and placement["certain"] and all(b is None or b["certain"] for b in bounds)
    return {
        "config": conf,
        "peak_reserved_bytes": _recorded_part_peak(result, n),
        "oom_avoided": result.oom_avoided,
        "steps": [{"index": k, "reserved_end_bytes": v} for k, v in enumerate(result.step_reserved)],
        "limit_bytes": limit_bytes,
        "oom_event_index": None if completes else (at_event if at_event is not None else n + int(at_request or 0)),
        "step_completes": completes if certain else None,
        "step_completes_range": across,
        "caught_ooms": fallback,
        "oom_request_range": request_range,
        "step_shortfall_bytes": int(shortfall),
        "step_peak_reserved_bytes": int(result.peak_reserved),
        "oom_projected": projected,
        "placement": placement,
        "start": start_report(result.start),  # always "empty": a projection needs a complete trace
    }


@dataclass(frozen=True)
class _StepReplay:
    """The replays of one what-if's failing step (``step_whatif``): the recorded requests up to
    the OOM, then the projected tail, under one configuration; each variation a keyword."""

    snapshot: Snapshot
    dev: DeviceData
    cfg: AllocatorConfig
    step_ends: list[int]
    projection: Projection
    order: str  # the placement of new segments (``placement_for``)
    requests: Requests | None
    caught: frozenset[int]  # recorded OOMs the program survived (``first_failure``)

    def run(
        self, limit: int | None, placement: str | None = None, tail: ProjectedTail | None = None, caught: str = "hold"
    ) -> PolicyResult:
        return simulate(
            self.snapshot,
            self.dev,
            self.cfg,
            limit,
            self.step_ends,
            tail=tail if tail is not None else self.projection.tail,
            placement=placement if placement is not None else self.order,
            requests=self.requests,
            caught=caught,
        )

    def completes(self, result: PolicyResult) -> bool:
        return first_failure(result.ooms, self.projection, len(self.dev.trace), self.caught) == (None, None)


def _placement(
    replay: _StepReplay, result: PolicyResult, mirror: Callable[[], PolicyResult] | None, completes: bool
) -> dict[str, Any]:
    """``placement``, with the replay in the opposite order of new segments (``mirror``: equal free
    blocks tied the other way; None where the order cannot matter): where the step's answer flips,
    it hangs on where the driver puts segments, which the trace cannot show."""
    order = replay.order
    placement = placement_report(order, result.oom, result.oom_avoided, result.peak_reserved, None)
    if mirror is not None:
        other = mirror()
        if replay.completes(other) != completes:
            placement |= {"certain": False, "outcomes": _both_orders(order, completes, result.oom, other.oom)}
    return placement


def _caught_ooms(
    replay: _StepReplay, result: PolicyResult, limit_bytes: int | None, completes: bool
) -> dict[str, Any] | None:
    """``caught_ooms``: an OOM the program survived (cuDNN's workspace probes) that this what-if
    serves. The program would have used that block and given it back, and skipped its fallback,
    which the trace cannot show. Kept to the end (``result``) and freed at once bound it; where the
    step's answer differs between the two, the trace cannot say which holds. None where no such
    OOM is served."""
    if not replay.caught or not caught_served(result, replay.dev):
        return None
    freed = replay.completes(replay.run(limit_bytes, caught="free"))
    return {"caught_served": True, "completes_kept": completes, "completes_freed": freed, "certain": freed == completes}


def _both_orders(order: str, completes: bool, oom: int | None, mirror_oom: int | None) -> list[dict[str, Any]]:
    """``placement.outcomes`` of a step whose answer flips with the order of new segments."""
    return [
        {"order": order, "step_completes": completes, "oom_event_index": oom},
        {"order": "mirror", "step_completes": not completes, "oom_event_index": mirror_oom},
    ]


def _recorded_part_peak(result: PolicyResult, n: int) -> int:
    """The peak reserved memory over the recorded part of the replay (comparable with the recorded run)."""
    real = result.change_index < n
    return int(result.change_reserved[real].max()) if real.any() else 0


def _failing_request(
    dev: DeviceData,
    cfg: AllocatorConfig,
    projection: Projection,
    result: PolicyResult,
    at_event: int | None,
    at_request: int | None,
    limit_bytes: int | None,
) -> tuple[int, dict[str, Any] | None]:
    """What the request the step failed at lacked, and, when it is a projected one, which it is."""
    assert projection.tail is not None
    n = len(dev.trace)
    index = at_event if at_request in (None, 0) else n + int(at_request or 0)
    assert index is not None
    asked = int(dev.trace.size[index]) if index < n else int(projection.tail.size[int(at_request or 0)])
    rounded = cfg.round_size(asked)
    reserved = result.reserved_at([index])[0]
    # What that request lacked: a segment of alloc_size on top of what was reserved
    # after the model's own flush (a lower bound: later requests may need more).
    shortfall = max(0, reserved + cfg.allocation_size(rounded) - limit_bytes) if limit_bytes is not None else 0
    if at_request is None:
        return shortfall, None
    ordinal = projection.ordinal[at_request]
    return shortfall, {
        "request": int(at_request),
        "allocation": int(ordinal),
        "allocations_later": int(ordinal - projection.matched_allocs),
        "allocations_in_step": projection.template_allocs,
        "template_event_index": int(projection.template_event[at_request]),
        "requested_bytes": asked,
    }


def _range_probe(
    limit_range: tuple[int, int] | None,
    limit_bytes: int | None,
    completes: bool,
    peak_reserved: int,
    projection: Projection,
    request_shortfall: int,
    gc: bool,
) -> int | None:
    """The end of the limit's range where the step's answer may differ, to replay it there (None: neither).

    ``gc``: the what-if runs the garbage collector, whose threshold is a share of the limit: which
    blocks it frees, and so the answer, moves with the limit in no order (gpt_autocast_c75: 18 MB
    short at the message's 5.10 GiB, complete at the real cap 2 MB above it), so the range is
    always probed."""
    if limit_range is None or limit_bytes is None:
        return None
    low, high = limit_range
    if completes and low < limit_bytes and (peak_reserved > low or gc):
        return low  # a cap at the range's low end may refuse a segment the step needs
    if (
        not completes
        and high > limit_bytes
        and ((projection.step_need_bytes <= high and request_shortfall <= high - limit_bytes) or gc)
    ):
        return high  # a cap at the high end may hold the request that failed
    return None


def _request_range(
    projection: Projection, cfg: AllocatorConfig, completes: bool, completes_with: Callable[[ProjectedTail], bool]
) -> dict[str, Any] | None:
    """``oom_request_range``: the failing request itself, where the recorded rounding hides part of
    it (a what-if from a run under roundup divisions, with finer rounding), replayed at the least
    request the entry may stand for too (``completes_with`` a tail); where the step's answer
    differs, the trace cannot say which holds. None where that rounds as the entry does."""
    tail, least = projection.tail, projection.oom_request_low
    assert tail is not None
    if least is None or cfg.round_size(least) == cfg.round_size(tail.size[0]):
        return None
    low_completes = completes_with(ProjectedTail(tail.cut, tail.alloc, tail.addr, [least, *tail.size[1:]], tail.like))
    return {
        "low_bytes": least,
        "high_bytes": int(tail.size[0]),
        "completes_low": low_completes,
        "completes_high": completes,
        "certain": low_completes == completes,
    }
