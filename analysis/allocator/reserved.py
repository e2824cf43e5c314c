"""The reserved bytes a trace recorded: after every event, at single events, at its ends, from its segment events.

Reserved memory changes only at the segment events (``segment_alloc``/``segment_map`` add a segment's
bytes, ``segment_free``/``segment_unmap`` take them away), so everything here is read off those events
(``segment_levels``). ``recorded_reserved`` is the whole column, one value an event: the reference, and what
a caller that reads it whole (the what-ifs' recorded peak) takes. ``recorded_levels`` reads the same at single
events without making the column: the limit's bounds (``allocator.limits``) and the policy replays'
completeness checks (``policy``) read a few hundred events of it. Both keep their last answer while the trace's
action and size columns live, matched by identity through weak references.
"""

from __future__ import annotations

import operator
import weakref
from bisect import bisect_right
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from analysis.model import SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, DeviceData, Trace

I64 = npt.NDArray[np.int64]
T = TypeVar("T")

SEGMENT_ACTIONS = (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP)


def recorded_reserved(device: DeviceData) -> I64:
    """Reserved bytes after every event, from the recorded segment events (read-only: the answer is kept,
    ``_LastAnswer``, and shared between threads)."""
    t = device.trace
    kept = _RESERVED.get(t)
    if kept is not None:
        return kept
    at, level = segment_levels(device)
    # Each level repeated up to the next segment event (a column of deltas summed over every event,
    # with masked stores of the segment events' sizes, took four times as long on the 460 MB trace).
    reserved: I64 = np.repeat(np.concatenate(([0], level)), np.diff(np.concatenate(([0], at, [len(t)]))))
    reserved.flags.writeable = False
    return _RESERVED.keep(t, reserved)


class ReservedLevels:
    """``recorded_reserved``'s column read at single events (``levels[i]``, an int), from the segment events
    alone: each level holds from its segment event to the next, and 0 before the first. The limit's bounds
    and the policy replays' completeness checks read it at a few hundred events; the column (a fresh int64
    per event, ~15 ms of the 460 MB trace, most of it its pages) is made only where a caller reads it whole."""

    __slots__ = ("_at", "_level", "_n")

    def __init__(self, at: I64, level: I64, n: int) -> None:
        self._at: list[int] = at.tolist()
        self._level: list[int] = level.tolist()
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> int:
        i = operator.index(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("reserved: event index out of range")
        k = bisect_right(self._at, i) - 1
        return self._level[k] if k >= 0 else 0

    def ends(self) -> tuple[int, int]:
        """The column's last and least values ((0, 0) for an empty trace)."""
        if not self._level:
            return 0, 0
        least = min(self._level)
        return self._level[-1], min(least, 0) if self._at[0] > 0 else least


def recorded_levels(device: DeviceData) -> ReservedLevels:
    """The device's ``ReservedLevels``, kept as ``recorded_reserved`` keeps its column (``_LastAnswer``): a
    report reads them in the limit, the bursts and every policy replay's completeness check, from several
    threads."""
    t = device.trace
    kept = _LEVELS.get(t)
    if kept is not None:
        return kept
    return _LEVELS.keep(t, ReservedLevels(*segment_levels(device), len(t)))


def reserved_ends(device: DeviceData) -> tuple[int, int]:
    """The last and the least of ``recorded_reserved``'s column (``ReservedLevels.ends``): the policy
    replays' completeness checks read no more of it."""
    return recorded_levels(device).ends()


def segment_events(act: npt.NDArray[np.int8]) -> I64:
    """The indices of a trace's segment events (``SEGMENT_ACTIONS``, the codes SEGMENT_ALLOC..SEGMENT_UNMAP,
    asserted below): two comparisons, where ``np.isin`` of the four took four times as long."""
    at: I64 = np.flatnonzero((act >= SEGMENT_ALLOC) & (act <= SEGMENT_UNMAP))
    return at


def segment_levels(device: DeviceData) -> tuple[I64, I64]:
    """The recorded segment events (ascending event indices) and the reserved bytes right after each:
    reserved memory changes only there (``recorded_reserved`` is each level held to the next event)."""
    t = device.trace
    at = segment_events(t.action)
    kind, size = t.action[at], t.size[at].astype(np.int64, copy=False)
    level = np.cumsum(np.where((kind == SEGMENT_ALLOC) | (kind == SEGMENT_MAP), size, -size))
    return at, level


assert sorted(SEGMENT_ACTIONS) == list(range(SEGMENT_ALLOC, SEGMENT_UNMAP + 1))


class _LastAnswer(Generic[T]):
    """One function's last answer for a trace, kept while the action and size columns it was read from live,
    matched by their identity (weak references: an answer dies with its trace). Read and replaced in one
    step each (a tuple), so threads asking at once get an answer that fits their trace."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: tuple[weakref.ref[npt.NDArray[Any]], weakref.ref[npt.NDArray[Any]], T] | None = None

    def get(self, trace: Trace) -> T | None:
        kept = self._kept
        if kept is not None and kept[0]() is trace.action and kept[1]() is trace.size:
            return kept[2]
        return None

    def keep(self, trace: Trace, answer: T) -> T:
        self._kept = (weakref.ref(trace.action), weakref.ref(trace.size), answer)
        return answer


_RESERVED: _LastAnswer[I64] = _LastAnswer()
_LEVELS: _LastAnswer[ReservedLevels] = _LastAnswer()
