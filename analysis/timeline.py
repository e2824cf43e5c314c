"""Memory over time: the series behind the plots, and downsampling that keeps peaks exact.

The recorded replay gives, after every event, the allocator's totals. Plots
cannot take millions of points, and averaging would shave the peaks that the
report is about, so downsampling keeps, for every bucket of consecutive
events, the events where the primary series reach their minimum and maximum
(in event order). Any event the caller names (the peaks, the OOM, step ends)
is always kept. A window of events can be fetched at full detail (or
downsampled the same way when it is still too long).

Derived series at every kept point:
- ``stranded``: (reserved - allocated) / reserved, the share of reserved memory
  that holds no live block;
- ``external_fragmentation``: 1 - largest free block / cached free, how much of
  the cache's free memory is not in its largest piece (0 when nothing is free).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.model import sorted_unique

I64 = npt.NDArray[np.int64]

# Column name in the replay -> key in the report.
SERIES: tuple[tuple[str, str], ...] = (
    ("reserved", "reserved_bytes"),
    ("allocated", "allocated_bytes"),
    ("requested", "requested_bytes"),
    ("cached_free", "cached_free_bytes"),
    ("inactive_split", "inactive_split_bytes"),
    ("largest_free", "largest_free_bytes"),
)
# Series whose extremes choose the kept events; the others are read at those
# events (the requested peak is kept exactly as a forced point).
PRIMARY: tuple[str, ...] = ("reserved", "allocated")
DEFAULT_BUCKETS = 1000


_NAMES = tuple(name for name, _ in SERIES)


class Columns(Mapping[str, I64]):
    """A replay's series by name (``columns_of``): ``columns[name]`` every event's values; ``values_at`` and
    ``first_max`` below read a replay that makes some series only when read whole (``RecordedReplay``:
    ``values_at``, ``first_max``) at some events only, so that a report makes none of those whole."""

    def __init__(self, replay: Any) -> None:
        self.replay = replay

    def __getitem__(self, name: str) -> I64:
        if name not in _NAMES:
            raise KeyError(name)
        return np.asarray(getattr(self.replay, name), np.int64)

    def __iter__(self) -> Iterator[str]:
        return iter(_NAMES)

    def __len__(self) -> int:
        return len(_NAMES)


def columns_of(replay: Any) -> Columns:
    """The replay's per-event columns by name (anything with those attributes)."""
    return Columns(replay)


def values_at(columns: Mapping[str, I64], points: I64) -> dict[str, I64]:
    """Every series at the events ``points``, by name: a replay's (``columns_of``) evaluated there where the
    replay can (``values_at``), without making whole a series it makes only when read."""
    if isinstance(columns, Columns) and hasattr(columns.replay, "values_at"):
        got: dict[str, I64] = columns.replay.values_at(points)
        return got
    return {name: np.asarray(columns[name])[points] for name in _NAMES}


def first_max(columns: Mapping[str, I64], name: str) -> int:
    """The first event where series ``name`` is at its maximum (``argmax``; -1: no events), found by a replay's
    own pass where it can (``first_max``)."""
    if isinstance(columns, Columns) and hasattr(columns.replay, "first_max"):
        return int(columns.replay.first_max(name))
    values = np.asarray(columns[name])
    return int(values.argmax()) if values.size else -1


def extreme_indices(values: I64, lo: int, hi: int, buckets: int) -> I64:
    """Indices in [lo, hi) of the min and max of ``values`` in each of ``buckets`` equal runs."""
    n = hi - lo
    if n <= 0:
        return np.zeros(0, np.int64)
    if n <= 2 * buckets:
        return np.arange(lo, hi, dtype=np.int64)
    width = -(-n // buckets)
    rows = -(-n // width)
    part = values[lo:hi]
    # Whole buckets as a view of the column (no copy); the last, shorter one apart.
    full = n // width
    grid = part[: full * width].reshape(full, width)
    lows, highs = grid.argmin(axis=1), grid.argmax(axis=1)
    if full < rows:
        tail = part[full * width :]
        lows, highs = np.r_[lows, tail.argmin()], np.r_[highs, tail.argmax()]
    base = np.arange(rows, dtype=np.int64) * width
    out: I64 = (np.concatenate((base + lows, base + highs)) + lo).astype(np.int64)
    return out


def select_points(
    columns: Mapping[str, I64],
    lo: int,
    hi: int,
    buckets: int,
    keep: Iterable[int] = (),
    extremes: Mapping[str, I64] | None = None,
) -> I64:
    """Event indices to plot for [lo, hi): per-bucket extremes of the primary series plus ``keep``
    (``extremes``: each primary series' ``extreme_indices`` over [lo, hi), where the caller has them)."""
    if extremes is None:
        extremes = primary_extremes(columns, lo, hi, buckets)
    parts = list(extremes.values())
    forced = np.fromiter((k for k in keep if lo <= k < hi), np.int64)
    ends = np.array([lo, hi - 1], np.int64) if hi > lo else np.zeros(0, np.int64)
    return sorted_unique(np.concatenate([*parts, forced, ends]))


def primary_extremes(columns: Mapping[str, I64], lo: int, hi: int, buckets: int) -> dict[str, I64]:
    """``extreme_indices`` of each primary series over [lo, hi), by name."""
    return {name: extreme_indices(columns[name], lo, hi, buckets) for name in PRIMARY if name in columns}


def series_at(
    columns: Mapping[str, I64], time_us: I64, points: I64, at: Mapping[str, I64] | None = None
) -> dict[str, Any]:
    """The report's series at the chosen events (plain lists, JSON-ready); ``at``: every series' values there
    (``values_at``), where the caller has them."""
    out: dict[str, Any] = {
        "index": points.tolist(),
        "time_us": time_us[points].tolist() if time_us.size else [0] * int(points.size),
    }
    if at is None:
        at = values_at(columns, points)
    for name, key in SERIES:
        out[key] = at[name].tolist()
    reserved, allocated, cached, largest = at["reserved"], at["allocated"], at["cached_free"], at["largest_free"]
    with np.errstate(divide="ignore", invalid="ignore"):
        stranded = np.where(reserved > 0, (reserved - allocated) / np.maximum(reserved, 1), 0.0)
        external = np.where(cached > 0, 1.0 - largest / np.maximum(cached, 1), 0.0)
    out["stranded"] = np.round(stranded, 4).tolist()
    out["external_fragmentation"] = np.round(np.clip(external, 0.0, 1.0), 4).tolist()
    return out


def peak_of(values: I64, among: I64 | None = None) -> dict[str, int]:
    """The first event where ``values`` peak, and the peak. ``among``: events known to hold that first one
    (a column's ``extreme_indices`` over all its events: each bucket's first maximum is there, the first
    bucket's to reach the peak among them), so that the column is not read again."""
    if values.size == 0:
        return {"event_index": -1, "bytes": 0}
    if among is None or among.size == 0:
        i = int(values.argmax())
    else:
        at = values[among]
        i = int(among[at == at.max()].min())  # the earliest of those at the peak (lows and highs come apart)
    return {"event_index": i, "bytes": int(values[i])}


def build_timeline(
    columns: Mapping[str, I64],
    time_us: I64,
    *,
    keep: Iterable[int] = (),
    buckets: int = DEFAULT_BUCKETS,
    oom_index: int | None = None,
    step_ends: Iterable[int] = (),
    settle: Callable[[I64], I64] | None = None,
) -> dict[str, Any]:
    """The report's ``timeline``: downsampled series with every peak and the OOM exact. ``settle``: the kept
    points moved before the series are read there (the report's: ``fused_free_settler``)."""
    n = int(columns["reserved"].shape[0])
    extremes = primary_extremes(columns, 0, n, buckets)
    peaks = {name: peak_of(columns[name], extremes.get(name)) for name in ("reserved", "allocated")}
    # requested read at its peak only: the report makes no series whole but the primary ones (``Columns``)
    top = first_max(columns, "requested")
    at_top = int(values_at(columns, np.array([top]))["requested"][0]) if top >= 0 else 0
    peaks["requested"] = {"event_index": top, "bytes": at_top}
    step_list = [int(i) for i in step_ends]
    forced = [p["event_index"] for p in peaks.values() if p["event_index"] >= 0]
    forced += [i for i in (oom_index,) if i is not None] + list(keep)
    points = select_points(columns, 0, n, buckets, forced, extremes)
    if settle is not None:
        points = settle(points)
    out = {
        "events": n,
        "points": int(points.size),
        "buckets": buckets,
        "downsampled": bool(points.size < n),
        **series_at(columns, time_us, points),
        "peaks": peaks,
        "oom_index": oom_index,
        "step_ends": step_list,
    }
    return out


def with_initial_state(timeline: dict[str, Any], initial: Mapping[str, int]) -> dict[str, Any]:
    """The timeline with the state before its first event as a point at index -1, where that state
    holds a series' maximum: a trace that starts mid-run (a wrapped ring buffer, a late
    ``_record_memory_history``) can begin at its peak, and the chart's maxima must equal the
    summary's peaks (which count the initial state)."""
    if not timeline.get("index"):
        return timeline
    above = any(int(initial[name]) > max(timeline[key]) for name, key in SERIES if name in PRIMARY)
    above |= int(initial["requested"]) > max(timeline["requested_bytes"])
    if not above:
        return timeline
    out = dict(timeline)
    out["index"] = [-1, *timeline["index"]]
    out["time_us"] = [timeline["time_us"][0], *timeline["time_us"]]
    for name, key in SERIES:
        out[key] = [int(initial[name]), *timeline[key]]
    reserved, allocated = int(initial["reserved"]), int(initial["allocated"])
    cached, largest = int(initial["cached_free"]), int(initial["largest_free"])
    out["stranded"] = [round((reserved - allocated) / reserved, 4) if reserved else 0.0, *timeline["stranded"]]
    external = min(1.0, max(0.0, 1.0 - largest / cached)) if cached else 0.0
    out["external_fragmentation"] = [round(external, 4), *timeline["external_fragmentation"]]
    out["points"] = int(timeline["points"]) + 1
    for name in ("reserved", "allocated", "requested"):
        if int(initial[name]) >= int(out["peaks"][name]["bytes"]):
            out["peaks"] = {**out["peaks"], name: {"event_index": -1, "bytes": int(initial[name])}}
    return out


def timeline_window(
    replay: Any, start: int, end: int, max_points: int = 4000, *, time_us: I64 | None = None
) -> dict[str, Any]:
    """Events [start, end) of a replay at full detail, or downsampled to about ``max_points``.

    ``replay`` is a RecordedReplay (or anything with its columns); ``time_us``
    defaults to the replay's own ``time_us`` attribute when it has one.
    """
    columns = columns_of(replay)
    n = int(columns["reserved"].shape[0])
    lo, hi = max(0, int(start)), min(n, int(end))
    times = time_us if time_us is not None else np.asarray(getattr(replay, "time_us", np.zeros(0)), np.int64)
    if hi <= lo:
        points = np.zeros(0, np.int64)
    elif hi - lo <= max_points:
        points = np.arange(lo, hi, dtype=np.int64)
    else:
        # Each bucket yields up to two points per primary series.
        buckets = max(1, max_points // (2 * len(PRIMARY)))
        points = select_points(columns, lo, hi, buckets)
    return {
        "start": lo,
        "end": hi,
        "points": int(points.size),
        "full_detail": bool(points.size == hi - lo),
        **series_at(columns, times, points),
    }


def settled_points(points: I64, action: npt.NDArray[np.int8], addr: I64 | None = None) -> I64:
    """``points`` with each ``free_requested`` that a ``free_completed`` follows at once (of the same
    address, when ``addr`` is given) moved onto that next event; sorted, unique.

    Lossless for reserved and allocated: a completed free changes neither.
    """
    from analysis.model import FREE_COMPLETED, FREE_REQUESTED

    n = int(action.shape[0])
    if points.size == 0 or n < 2:
        return points
    nxt = np.minimum(points + 1, n - 1)
    fused = (action[points] == FREE_REQUESTED) & (points + 1 < n) & (action[nxt] == FREE_COMPLETED)
    if addr is not None:
        fused &= addr[nxt] == addr[points]
    if not fused.any():
        return points
    return sorted_unique(np.where(fused, nxt, points))


def fused_free_settler(trace: Any) -> Callable[[I64], I64]:
    """``build_timeline``'s ``settle`` for a trace: each plotted ``free_requested`` point that its
    ``free_completed`` follows at once moved onto that next event (``settled_points``).

    Between the two, torch's own counters disagree for one event: ``allocated``
    has dropped (in ``free()``) while ``requested`` (and ``active``) drop only when
    the block is really freed. A plot that lands on that instant shows requested
    above allocated; the next event has the same allocated and reserved bytes (a
    completed free changes neither), so the extremes stay exact. Genuinely
    pending frees (``record_stream``: the completion comes later) are kept.
    The points are settled before the series are read there: a finished timeline settled afterwards had
    its series made twice (2 ms of the 460 MB report).
    """
    action, addr = np.asarray(trace.action), np.asarray(trace.addr)
    return lambda points: settled_points(points, action, addr)


@dataclass(frozen=True, slots=True)
class Plateau:
    """Reserved memory at its peak, over every event that holds it: how idle the cache stayed.

    ``least_idle_bytes`` is the least reserved - allocated at any such event, the first at which it
    is reached ``least_idle_event_index``; ``idle_at_first_bytes`` is the idle cache at the first event
    that reached the peak (what the headline read before). Index -1: the state before the first event.
    """

    reserved_bytes: int
    first_event_index: int
    last_event_index: int
    events: int  # events at the peak (not necessarily one run)
    least_idle_bytes: int
    least_idle_event_index: int
    idle_at_first_bytes: int

    def to_json(self) -> dict[str, int]:
        return {
            "reserved_bytes": self.reserved_bytes,
            "first_event_index": self.first_event_index,
            "last_event_index": self.last_event_index,
            "events": self.events,
            "least_idle_bytes": self.least_idle_bytes,
            "least_idle_event_index": self.least_idle_event_index,
            "idle_at_first_bytes": self.idle_at_first_bytes,
        }


def reserved_plateau(
    reserved: I64, allocated: I64, initial_reserved: int, initial_allocated: int, first_max: int = -1
) -> Plateau | None:
    """The reserved peak's plateau over the replay's columns and the state before them (None: no state).
    Positions count the state before as 0 (event ``i`` is ``i + 1``); the columns are not copied to
    put it first (two copies of every event's figures were 0.01 s of the 460 MB report). ``first_max``:
    reserved's first maximum where the caller has it (the replay's ``peak_reserved_index``; -1: found here)."""
    reserved, allocated = np.asarray(reserved, np.int64), np.asarray(allocated, np.int64)
    # The columns' peak and the first event at it (argmax: the first maximum, where not given); no event
    # before that one holds the peak, so the masks below read the columns from there on (the 460 MB trace's
    # plateau starts at its 1.5M-th of 2.4M events).
    top = first_max if first_max >= 0 else int(reserved.argmax()) if reserved.size else 0
    peak = max(int(initial_reserved), int(reserved[top]) if reserved.size else int(initial_reserved))
    if peak <= 0:
        return None
    # Reserved is the peak at these, so the least idle is where most is allocated: a masked maximum and
    # the first event holding it, not the events' indices and idle bytes gathered (most of the 460 MB
    # trace's 2.4M events hold its peak: 0.009 s).
    at_peak = reserved[top:] == peak
    count = int(np.count_nonzero(at_peak))
    before = int(initial_reserved) == peak  # the state before the first event holds it (index -1)
    first = last = least_at = -1
    least = idle_first = peak - int(initial_allocated)
    if count:
        tail = allocated[top:]
        most = int(tail.max(where=at_peak, initial=np.iinfo(np.int64).min))
        if not before or peak - most < least:  # the state before wins a tie: it comes first
            least, least_at = peak - most, top + int(np.argmax((tail == most) & at_peak))
        first = top
        last = reserved.shape[0] - 1 - int(at_peak[::-1].argmax())
        if not before:
            idle_first = peak - int(allocated[first])
    return Plateau(
        reserved_bytes=peak,
        first_event_index=-1 if before else first,
        last_event_index=last,
        events=count + before,
        least_idle_bytes=least,
        least_idle_event_index=least_at,
        idle_at_first_bytes=idle_first,
    )
