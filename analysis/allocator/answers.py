"""The policy replay's answers as contract items: the check (``replay``) and a what-if (``whatif[]``).

``replay_check``: does the model, under the recorded settings, reproduce the recorded run? ``whatif``: the
recorded run under other settings. Both replay under the limit the trace shows (``fitted_limit``); a
what-if says which order of new segments gave its answer and whether the other order agrees
(``placement_report``) and where its replay started (``start_report``). ``analysis.projection`` makes
its own what-if items of the same parts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from analysis.allocator.config import AllocatorConfig
from analysis.allocator.limits import LimitEstimate, infer_limit
from analysis.allocator.policy import (
    placement_for,
    recorded_segment_events,
    simulate,
    step_end_indices,
    trace_is_complete,
)
from analysis.allocator.policytypes import PolicyResult
from analysis.allocator.requests import Requests, _device, requests_for
from analysis.model import OOM, DeviceData, Snapshot

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
