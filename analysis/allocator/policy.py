"""Policy replay: the model of PyTorch's native CUDA caching allocator, fed one device's requests alone.

``recorded_replay`` (``allocator.recorded``) follows the addresses the trace recorded. This
module forgets every decision the allocator made and takes only the *requests*
of one device's trace: the ``alloc`` sizes with their stream and pool, the order
of the frees, cross-stream frees that complete later (``free_requested`` without
its ``free_completed``), ``oom`` requests, and the ``empty_cache()`` calls made by
user code. It then chooses blocks and segments as ``DeviceCachingAllocator``
does (c10/cuda/CUDACachingAllocator.cpp, torch 2.11; see
../shared/docs/snapshot-format.md §3) under an ``AllocatorConfig`` and a memory
limit, so it can answer "would ``expandable_segments:True`` have saved this run".

The model is ``cachestate._Allocator`` (its state and rules) fed by ``cachemodel._Model`` (the request
stream); its types are in ``policytypes``, and the contract items made of its replays (``replay_check``,
``whatif``) in ``answers``. Here: ``simulate``, and what a replay needs of the trace (whether its history
is whole, the state it starts from, its steps, its recorded segment events, where new segments go).

Requests come from the trace as recorded, so after a request that the model
fails (an OOM the real run did not hit) the replay continues: the failed block
simply does not exist and its later free is ignored. A recorded OOM request
that the model can serve is allocated and kept to the end (the real program
never freed it). ``oom_avoided`` asks whether the final recorded OOM request and
every request before it were served.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from analysis.allocator import compiled
from analysis.allocator.cachemodel import _loop_events, _Model
from analysis.allocator.config import AllocatorConfig
from analysis.allocator.policytypes import PolicyResult, ProjectedTail, SegmentLayout
from analysis.allocator.requests import Requests, _device, requests_for
from analysis.allocator.reserved import reserved_ends, segment_events
from analysis.model import (
    ACTIONS,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_MAP,
    DeviceData,
    Snapshot,
    address_runs,
)
from analysis.steps import find_steps


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


def placement_for(cfg: AllocatorConfig, recorded: AllocatorConfig) -> str:
    """The ``placement`` a replay under ``cfg`` takes: the recorded run's own addresses when
    ``cfg`` is the recorded settings (the replay is then that run), else the driver's rule
    from the start, so that the what-if does not depend on which run's trace it replays."""
    return "recorded" if cfg == recorded else "driver"


def _segments_complete(device: DeviceData) -> bool:
    """The segment history is whole: replayed from zero, reserved memory never goes
    negative and ends at the final segments' total (cheap; see ``trace_is_complete``)."""
    t = device.trace
    final_total = sum(seg.total_size for seg in device.segments)
    if len(t) == 0:
        return final_total == 0
    last, least = reserved_ends(device)
    return last == final_total and least >= 0


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
    if reserved_ends(device)[0] != final_total:
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


def recorded_segment_events(device: DeviceData) -> list[tuple[str, int]]:
    """The recorded segment_alloc/free/map/unmap events, as (action, size), in order."""
    act = device.trace.action
    sel = segment_events(act)
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
