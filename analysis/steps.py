"""Training steps from ``external_annotations``, and per-step memory figures.

A step ends at the END of a ``ProfilerStep#N`` annotation when the file has any
(the profiler's own step marks), otherwise at the END of an optimizer step
(``Optimizer.step#...``). A step's events are those after the previous step's
end, up to and including the last event at or before its own end time
(annotations and events share the snapshot's clock).

Everything here works on event-index arrays; per-step maxima are one
``np.maximum.reduceat`` over the replay's columns.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.model import Annotation

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Steps:
    """Step windows of one device, in event indices (inclusive ranges)."""

    source: str  # "ProfilerStep" | "Optimizer.step" | "" (none)
    start_us: I64
    end_us: I64
    first_event: I64  # first event of the step (may equal last_event + 1 for an empty step)
    last_event: I64  # last event at or before the step's end
    complete: npt.NDArray[np.bool_]  # False where the trace starts inside the step

    def __len__(self) -> int:
        return int(self.end_us.shape[0])


def running_clock(time_us: I64) -> I64:
    """``time_us`` made non-decreasing for ``searchsorted``: clock jitter can make it step back by
    a microsecond. The column itself when it never does (a running maximum is a new column of
    every event; the check is a fraction of its cost). The last answer is kept while its column lives:
    the steps and the optimizer windows ask of the same one (the check is 2.7 ms of the 460 MB trace)."""
    kept = _CLOCK[0] if _CLOCK else None
    if kept is not None and kept[0]() is time_us:
        return time_us if kept[1] is None else kept[1]
    clock = None
    if time_us.shape[0] >= 2 and not bool((time_us[1:] >= time_us[:-1]).all()):
        clock = np.maximum.accumulate(time_us)
        clock.flags.writeable = False
    _CLOCK[:] = [(weakref.ref(time_us), clock)]
    return time_us if clock is None else clock


# running_clock's last answer: (its column, held weakly; the running maximum, None where it is the column).
_CLOCK: list[tuple[weakref.ref[I64], I64 | None]] = []


def step_end_times(annotations: list[Annotation], device: int) -> tuple[str, list[int]]:
    """END times of the step-marking annotations of one device, oldest first.

    Annotations carry the device that was current when they were recorded; in a
    process driving several GPUs the steps are the same for all of them (one
    clock), so a device without step marks of its own uses the others'.
    """
    own = [a for a in annotations if a.device in (device, -1)]
    marks = ("ProfilerStep#", "Optimizer.step#")
    if not any(a.stage == "END" and a.name.startswith(marks) for a in own):
        own = annotations
    profiler, optimizer = [], []
    for a in own:
        if a.stage != "END":
            continue
        if a.name.startswith("ProfilerStep#"):
            profiler.append(a.time_us)
        elif a.name.startswith("Optimizer.step#"):
            optimizer.append(a.time_us)
    if profiler:
        return "ProfilerStep", sorted(profiler)
    if optimizer:
        return "Optimizer.step", sorted(optimizer)
    return "", []


def find_steps(annotations: list[Annotation], device: int, time_us: I64) -> Steps:
    """Map step-end annotations onto a device's trace."""
    source, ends = step_end_times(annotations, device)
    n = int(time_us.shape[0])
    empty = np.zeros(0, np.int64)
    if not ends or n == 0:
        return Steps(source if ends else "", empty, empty, empty, empty, np.zeros(0, bool))
    times = running_clock(time_us)
    end_arr = np.asarray(ends, np.int64)
    # A step that ended before the first recorded event (ring buffer wrapped) has no events.
    keep = end_arr >= times[0]
    end_arr = end_arr[keep]
    dropped = int((~keep).sum())
    last = np.searchsorted(times, end_arr, side="right") - 1
    first = np.r_[0, last[:-1] + 1].astype(np.int64)
    start_us = np.r_[times[0], end_arr[:-1]].astype(np.int64)
    complete = np.ones(end_arr.shape[0], bool)
    if dropped and complete.size:
        complete[0] = False  # began before the trace did
    return Steps(source, start_us, end_arr, first, last.astype(np.int64), complete)


def per_step_figures(
    steps: Steps,
    allocated: I64,
    reserved: I64,
    *,
    first_index: int = 0,
) -> list[dict[str, object]]:
    """Contract ``steps`` rows plus the fragmentation at each step's end.

    ``fragmentation`` is the share of reserved memory not allocated at the
    step's end (stranded cache), 0 when nothing is reserved.
    """
    rows: list[dict[str, object]] = []
    if len(steps) == 0 or allocated.shape[0] == 0:
        return rows
    lo = steps.first_event
    hi = steps.last_event
    nonempty = hi >= lo
    # reduceat needs strictly valid starts; empty steps borrow their end event's values.
    n = allocated.shape[0]
    starts = np.minimum(lo, n - 1)
    # reduceat over [start_k, start_{k+1}) covers to the next start, which is
    # last_k + 1; a sentinel start stops the last step at its own end.
    tail = int(hi[-1]) + 1
    bounds = np.r_[starts, tail] if tail < n else starts
    peak_alloc = np.maximum.reduceat(allocated, bounds)[: len(steps)]
    peak_res = np.maximum.reduceat(reserved, bounds)[: len(steps)]
    end_idx = np.maximum(hi, 0)
    res_ends, alloc_ends = reserved[end_idx], allocated[end_idx]
    # Empty steps take their end event's values.
    peak_alloc = np.where(nonempty, peak_alloc, alloc_ends)
    peak_res = np.where(nonempty, peak_res, res_ends)
    # Columns as Python ints once, not an int() per cell.
    columns = zip(
        end_idx.tolist(),
        peak_alloc.tolist(),
        peak_res.tolist(),
        res_ends.tolist(),
        alloc_ends.tolist(),
        steps.start_us.tolist(),
        steps.end_us.tolist(),
        lo.tolist(),
        steps.complete.tolist(),
        strict=True,
    )
    for k, (e, pa, pr, res_end, alloc_end, start_us, end_us, first, complete) in enumerate(columns):
        rows.append(
            {
                "index": first_index + k,
                "start_us": start_us,
                "end_us": end_us,
                "first_event": first,
                "last_event": e,
                "complete": complete,
                "peak_allocated_bytes": pa,
                "peak_reserved_bytes": pr,
                "reserved_end_bytes": res_end,
                "allocated_end_bytes": alloc_end,
                "fragmentation": round((res_end - alloc_end) / res_end, 4) if res_end else 0.0,
            }
        )
    return rows


def first_growth_step(rows: list[dict[str, Any]]) -> int | None:
    """The first step after the first whose peak reserved memory exceeds every earlier step's.

    Step 0 always "grows" (it warms the cache up and creates optimizer state), so
    it is not counted; later growth is what users look for.
    """
    best = -1
    for k, row in enumerate(rows):
        peak = int(row["peak_reserved_bytes"])
        if k > 0 and peak > best:
            return int(row["index"])
        best = max(best, peak)
    return None
