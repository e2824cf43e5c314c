"""Which stack group each event of a trace names: the event list's and the timeline's stack column.

An event's own stack's group, but a free without frames names the allocation it frees, and the backward
pass's frame-less allocations are named as the report's stacks name them (``event_groups``). The report's
timeline asks it for a few thousand points of millions of events (``at=``), the site's store for all of
them (``analysis.explore``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from analysis.categories import frameless_backward
from analysis.model import ALLOC, FREE_COMPLETED, FREE_REQUESTED, Trace
from analysis.stacks import BACKWARD_NO_FRAMES, Lifetimes, StackCatalog

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]


def event_groups(
    trace: Trace, catalog: StackCatalog, lifetimes: Lifetimes, at: I64 | None = None
) -> npt.NDArray[np.int32]:
    """Per event (or per event of ``at``: ``event_groups(...)[at]``), the stack group its line in the
    event list (and its hover text) names.

    An event's own stack's group, but where that says "unknown / no frames" and more is known
    (issue 35): the backward pass's frame-less allocations (``categories.frameless_backward``,
    stacks="python" records no frames on the autograd thread) are named so, as the report's stacks
    are; a free without frames of its own names the allocation it frees (its request, and the
    completion that follows at the same address); a segment or OOM event without frames names none (-1).

    With ``at`` only its events are looked at (``_event_groups_at``): the report's timeline asks for a
    few thousand points of millions of events (issue 34)."""
    action = np.asarray(trace.action)
    frameless = frameless_backward(lifetimes, catalog)
    if at is not None:
        return _event_groups_at(trace, catalog, lifetimes, frameless, np.asarray(at, np.int64))
    n = action.shape[0]
    out = catalog.groups_of(np.asarray(trace.stack)).astype(np.int32)
    alloc_group = catalog.groups_of(np.asarray(lifetimes.stack)).astype(np.int32)
    if frameless.any():
        alloc_group[frameless] = catalog.pseudo_group(BACKWARD_NO_FRAMES)
        out[np.asarray(lifetimes.start, np.int64)[frameless]] = alloc_group[frameless]
    ends = np.asarray(lifetimes.end, np.int64)
    freed = ends < n
    freed[freed] = action[ends[freed]] == FREE_REQUESTED
    of_free = np.full(n, -1, np.int32)
    of_free[ends[freed]] = alloc_group[freed]
    # A completion follows its request at the same address: in (address, index) order they are neighbours.
    frees = np.flatnonzero((action == FREE_REQUESTED) | (action == FREE_COMPLETED))
    addresses = np.asarray(trace.addr, np.int64)[frees]
    by_address = np.lexsort((frees, addresses))
    order, addr = frees[by_address], addresses[by_address]
    pair = (addr[1:] == addr[:-1]) & (action[order[:-1]] == FREE_REQUESTED) & (action[order[1:]] == FREE_COMPLETED)
    of_free[order[1:][pair]] = of_free[order[:-1][pair]]
    return _named_frees(out, of_free, action)


def _named_frees(out: npt.NDArray[np.int32], of_free: npt.NDArray[np.int32], action: np.ndarray) -> I32:
    """``event_groups``' last step: a frame-less free names what it frees; other frame-less events
    but allocations name none (-1)."""
    blank = (out == 0) & (of_free >= 0)
    out[blank] = of_free[blank]
    out[(out == 0) & (action != ALLOC) & (action != FREE_REQUESTED) & (action != FREE_COMPLETED)] = -1
    return out


def _event_groups_at(
    trace: Trace, catalog: StackCatalog, lifetimes: Lifetimes, frameless: npt.NDArray[np.bool_], at: I64
) -> npt.NDArray[np.int32]:
    """``event_groups(...)[at]`` from the events of ``at`` and those they pair with only.

    A free request's allocation is the lifetime that ends there (one pass over the lifetimes' ends,
    against a mark per event); a completion's request is the free event before it at its address
    (``_free_before``: searched backwards from it, nearest first). Before this the frees were paired
    over the whole trace's (address, index) order, 0.12 s of the 460 MB benchmark's report."""
    action_all = np.asarray(trace.action)
    n = action_all.shape[0]
    action = action_all[at]
    out = catalog.groups_of(np.asarray(trace.stack)[at]).astype(np.int32)
    starts = np.asarray(lifetimes.start, np.int64)
    pseudo = catalog.pseudo_group(BACKWARD_NO_FRAMES) if frameless.any() else 0
    if pseudo:  # an allocation of ``at`` that is a frame-less one of the backward pass
        k = np.minimum(np.searchsorted(starts, at), max(starts.size - 1, 0))
        hit = (action == ALLOC) & (starts[k] == at) if starts.size else np.zeros(at.size, bool)
        hit[hit] = frameless[k[hit]]
        out[hit] = pseudo
    of_free = np.full(at.size, -1, np.int32)
    requests = at[action == FREE_REQUESTED]
    completions = np.flatnonzero(action == FREE_COMPLETED)
    paired = _free_before(action_all, np.asarray(trace.addr, np.int64), at[completions])
    paired[paired >= 0] = np.where(action_all[paired[paired >= 0]] == FREE_REQUESTED, paired[paired >= 0], -1)
    asked = np.concatenate((requests, paired[paired >= 0]))
    if asked.size:
        # The lifetime that ends at each request asked about (ends are unique below n).
        mark = np.zeros(n + 1, bool)
        mark[asked] = True
        ends = np.asarray(lifetimes.end, np.int64)
        ended = np.flatnonzero(mark[ends])
        group = catalog.groups_of(np.asarray(lifetimes.stack)[ended]).astype(np.int32)
        if pseudo:
            group[frameless[ended]] = pseudo
        order = np.argsort(ends[ended], kind="stable")
        end_sorted, group_sorted = ends[ended][order], group[order]

        def of(events: I64) -> npt.NDArray[np.int32]:
            if not end_sorted.size:
                return np.full(events.size, -1, np.int32)
            j = np.minimum(np.searchsorted(end_sorted, events), end_sorted.size - 1)
            return np.where(end_sorted[j] == events, group_sorted[j], -1).astype(np.int32)

        of_free[action == FREE_REQUESTED] = of(requests)
        got = paired >= 0
        of_free[completions[got]] = of(paired[got])
    return _named_frees(out, of_free, action)


# _free_before's first window (events before each completion), multiplied by 8 each round; past this many
# elements a round, the remaining completions are paired over the trace's frees at their addresses.
_FIRST_WINDOW = 32
_MAX_ROUND = 1 << 20


def _free_before(action: np.ndarray, addr: I64, completions: I64) -> I64:
    """Per completion (an event index), the index of the last ``free_requested`` or ``free_completed``
    event before it at its address, or -1: what it pairs with in the frees' (address, index) order.

    Searched backwards in windows that grow 8 times a round (a completion mostly follows its request
    within a few events); completions still unpaired once a round would look at more than
    ``_MAX_ROUND`` events are paired over the whole trace's frees at their addresses."""
    found = np.full(completions.size, -1, np.int64)
    todo = np.arange(completions.size)
    hi = completions.copy()  # each completion's events below this index are still to search
    width = _FIRST_WINDOW
    while todo.size and todo.size * width <= _MAX_ROUND:
        top = hi[todo]
        idx = top[:, None] - np.arange(1, width + 1)  # nearest first
        inside = idx >= 0
        idx = np.maximum(idx, 0)
        act = action[idx]
        match = inside & (addr[idx] == addr[completions[todo]][:, None])
        match &= (act == FREE_REQUESTED) | (act == FREE_COMPLETED)
        hit = match.any(axis=1)
        found[todo[hit]] = idx[hit, match[hit].argmax(axis=1)]
        hi[todo] = top - width
        todo = todo[~hit & (top - width > 0)]
        width *= 8
    if todo.size:
        wanted = np.unique(addr[completions[todo]])
        frees = np.flatnonzero((action == FREE_REQUESTED) | (action == FREE_COMPLETED))
        addresses = addr[frees]
        kept = wanted[np.searchsorted(wanted, addresses).clip(0, wanted.size - 1)] == addresses
        frees, addresses = frees[kept], addresses[kept]
        by_address = np.lexsort((frees, addresses))
        rank = np.empty(frees.size, np.int64)
        rank[by_address] = np.arange(frees.size)
        # Each completion's place in its address's frees by index (it is one of them): the one before is its pair.
        c = completions[todo]
        prev = rank[np.searchsorted(frees, c)] - 1
        before = by_address[np.maximum(prev, 0)]
        ok = (prev >= 0) & (addresses[before] == addr[c])
        found[todo[ok]] = frees[before[ok]]
    return found
