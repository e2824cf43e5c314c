"""A trace's events in an order the allocator model can follow, or a coded refusal (issue 36).

The model follows each block from its alloc to its free by address and each segment from its
``segment_alloc`` to its ``segment_free``; events reordered, dropped or repeated would make it free
another block or index past a list. ``check_event_order`` is called at the model's entry
(``requests.build_requests``), so both loops (compiled and Python) are guarded by it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator import compiled
from analysis.allocator.reserved import segment_events
from analysis.errors import SchemaError
from analysis.model import (
    ACTIONS,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    DeviceData,
    address_runs,
)

I64 = npt.NDArray[np.int64]


def _next_kind(t: Any) -> npt.NDArray[np.int8]:
    """For each block action (alloc, free_requested, free_completed), the one that may follow it at
    the same address: torch writes alloc, free_requested, free_completed, alloc, ... and, where
    ``skip_actions`` dropped one kind of free, alloc and the other kind in turn."""
    has_fr = bool((t.action == FREE_REQUESTED).any())
    has_fc = bool((t.action == FREE_COMPLETED).any())
    nxt = np.full(3, -1, np.int8)
    if has_fr and has_fc:
        nxt[[ALLOC, FREE_REQUESTED, FREE_COMPLETED]] = [FREE_REQUESTED, FREE_COMPLETED, ALLOC]
    else:
        free = FREE_REQUESTED if has_fr else FREE_COMPLETED
        nxt[[ALLOC, free]] = [free, ALLOC]
    return nxt


def check_event_order(dev: DeviceData, pools: npt.NDArray[np.int32], seg_events: I64 | None = None) -> None:
    """Refuse a trace whose blocks' or segments' events are out of order (``snapshot:schema:event-order``).

    The allocator model follows each block from its alloc to its free by address and frees it into
    the free list of the free's (pool, stream); it takes a new segment's address from the recorded
    ``segment_alloc`` and gives it back at its ``segment_free``. An alloc written after its own free,
    a free twice, a completion before its request, an alloc that lands outside its segment (so its
    pool, read off the segments for torch 2.11 traces, differs from its free's), a segment allocated
    twice or freed at another size would make it free another block or segment, or index past a
    list (issue 36). torch never writes one: refused here, the model's entry, for both loops.
    Pairwise by address in trace order, so a trace that starts or ends mid-lifetime (a wrapped ring
    buffer) passes. ``seg_events``: the trace's segment events (``reserved.segment_events``), where the
    caller has them (a pass over every event's action, else).
    """
    t = dev.trace
    act = t.action
    lanes = len(dev.streams) > 1 or bool(pools.any())  # one lane: nothing to compare (the 460 MB trace: 0.14 s)
    # The compiled pass pairs each block event with the one before it at its address through a map of
    # the addresses (0.03 s on the 460 MB trace, where the sort by address below took 0.15 s of CPU), and
    # pairs each alloc with its end for the lifetimes, which read it (compiled.alloc_pairing).
    found = compiled.first_block_out_of_order(act, t.addr, t.stream, pools, _next_kind(t), lanes, t.size)
    if found:
        _refuse(dev, *found)
    blocks = np.flatnonzero(act <= FREE_COMPLETED) if found is None else np.zeros(0, np.int64)
    if blocks.size > 1:
        prev, cur, same = _address_neighbours(t.addr, blocks)
        now = act[cur]
        bad_kind = same & (now != _next_kind(t)[act[prev]])
        bad_lane = np.zeros_like(same)
        if lanes:
            bad_lane = same & (now != ALLOC) & ((pools[cur] != pools[prev]) | (t.stream[cur] != t.stream[prev]))
        _refuse_first(dev, prev, cur, bad_kind, bad_lane)
    seg = segment_events(act) if seg_events is None else seg_events
    segments = seg[(act[seg] == SEGMENT_ALLOC) | (act[seg] == SEGMENT_FREE)]
    if segments.size > 1:
        order = segments[np.argsort(t.addr[segments], kind="stable")]
        prev, cur = order[:-1], order[1:]
        same = t.addr[cur] == t.addr[prev]
        bad_kind = same & (act[cur] == act[prev])
        bad_size = same & (act[cur] == SEGMENT_FREE) & (t.size[cur] != t.size[prev])
        _refuse_first(dev, prev, cur, bad_kind, bad_size)


def _address_neighbours(addr: I64, idx: I64) -> tuple[I64, I64, npt.NDArray[np.bool_]]:
    """Each event of ``idx`` (but the first by address) with the one before it at its address in trace
    order, and whether they share the address (``model.address_runs``' radix order)."""
    pos, same = address_runs(addr, idx)
    order = idx[pos]
    return order[:-1], order[1:], same


def _refuse_first(
    dev: DeviceData, prev: I64, cur: I64, bad_kind: npt.NDArray[np.bool_], bad_pair: npt.NDArray[np.bool_]
) -> None:
    """The ``event-order`` refusal of the earliest wrong pair (``cur[k]`` after ``prev[k]``), if any."""
    wrong = np.flatnonzero(bad_kind | bad_pair)
    if not wrong.size:
        return
    k = int(wrong[np.argmin(cur[wrong])])
    _refuse(dev, int(cur[k]), int(prev[k]), bool(bad_kind[k]))


def _refuse(dev: DeviceData, i: int, j: int, kind_wrong: bool) -> None:
    """The ``event-order`` refusal of event ``i`` after event ``j`` at its address: of its kind
    (``kind_wrong``), else of its pool or stream."""
    t = dev.trace
    what = "follows" if kind_wrong else "does not match"
    raise SchemaError(
        "event-order",
        f"device {dev.device}'s trace: event {i} ({ACTIONS[int(t.action[i])]} at {int(t.addr[i]):#x}) {what} "
        f"event {j} ({ACTIONS[int(t.action[j])]}) at that address; torch writes a block's alloc, free_requested "
        "and free_completed in turn, within its segment, and a segment's segment_alloc and segment_free in turn: "
        "the events were reordered, dropped or repeated, so the trace cannot be replayed",
    )
