"""Digging into one device's trace: what the report's interactive views ask for.

- ``event_columns`` is what a site stores once per device so zooming never
  replays again: the recorded replay's per-event series plus, per event, its
  action, size and stack group.
- ``window`` answers a zoom: the events ``[t0, t1)`` at screen resolution
  (``analysis.timeline``'s min/max selection, so every extreme is exact), down to
  single events when the range is narrow, each point with what happened there.
- ``Explorer.state_at`` is the allocator's state after one event from the
  recorded replay (``RecordedReplay.blocks_at``): every segment and block, with
  the block's allocation and free events and their full stacks (C++ frames too
  when recorded).
- ``finish_timeline`` prepares the report's own timeline: fused frees settled
  (``timeline.settle_fused_frees``) and the same per-point event info.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.model import ACTIONS, ALLOC, INACTIVE, DeviceData, Snapshot
from analysis.replay import RecordedReplay, recorded_replay
from analysis.stacks import StackCatalog, alloc_lifetimes
from analysis.timeline import SERIES, series_at, settle_fused_frees, settled_points, timeline_window

I64 = npt.NDArray[np.int64]
MAX_LABEL = 90
# A zoom asks for about this many points per screen pixel (a min and a max of two series).
POINTS_PER_PIXEL = 4
MAX_WINDOW_POINTS = 20_000


def _short(label: str) -> str:
    return label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "…"


def event_columns(replay: RecordedReplay, dev: DeviceData, catalog: StackCatalog) -> dict[str, np.ndarray]:
    """The per-event columns a site stores for zooming (all int64 but ``action`` int8 and ``group`` int32)."""
    trace = dev.trace
    out: dict[str, np.ndarray] = {name: np.asarray(getattr(replay, name), np.int64) for name, _ in SERIES}
    out["time_us"] = np.asarray(trace.time_us, np.int64)
    out["action"] = np.asarray(trace.action, np.int8)
    out["size"] = np.asarray(trace.size, np.int64)
    out["group"] = catalog.groups_of(np.asarray(trace.stack)).astype(np.int32)
    return out


def group_labels(catalog: StackCatalog, groups: np.ndarray) -> dict[str, str]:
    return {str(int(g)): _short(catalog.groups[int(g)].label) for g in np.unique(groups) if int(g) >= 0}


def replay_like_columns(columns: Mapping[str, np.ndarray]) -> dict[str, I64]:
    return {name: np.asarray(columns[name], np.int64) for name, _ in SERIES}


def _event_info(columns: Mapping[str, np.ndarray], points: I64) -> dict[str, Any]:
    actions = columns["action"][points]
    return {
        "event_action": [ACTIONS[int(a)] for a in actions.tolist()],
        "event_size": columns["size"][points].tolist(),
        "event_group": columns["group"][points].tolist(),
    }


def window(
    columns: Mapping[str, np.ndarray], labels: Mapping[str, str], t0: float, t1: float, px: int
) -> dict[str, Any]:
    """The events ``[t0, t1]`` (event indices, clipped) at about ``px`` pixels of width.

    Narrow ranges come back event by event (``full_detail`` true; ``elided`` counts the
    ``free_requested`` instants left out because their ``free_completed`` follows at once, see
    ``timeline.settled_points``); wider ones keep, per pixel, the events where reserved and
    allocated reach their min and max.
    """
    n = int(columns["reserved"].shape[0])
    lo = max(0, int(np.floor(t0)))
    hi = min(n, int(np.ceil(t1)) + 1)
    budget = int(min(MAX_WINDOW_POINTS, max(16, int(px)) * POINTS_PER_PIXEL))
    replay_like = SimpleNamespace(**{name: columns[name] for name, _ in SERIES})
    out = timeline_window(replay_like, lo, hi, max_points=budget, time_us=np.asarray(columns["time_us"]))
    points = np.asarray(out["index"], np.int64)
    # As in the report's timeline: no point at the instant between a free's request and its completion.
    settled = settled_points(points, columns["action"])
    out["elided"] = int(points.size - settled.size)  # free requests whose completion follows at once
    if out["elided"] or not np.array_equal(settled, points):
        points = settled
        out.update(series_at(replay_like_columns(columns), np.asarray(columns["time_us"]), points))
        out["points"] = int(points.size)
    out.update(_event_info(columns, points))
    out["labels"] = {str(g): labels.get(str(g), "") for g in sorted(set(out["event_group"])) if g >= 0}
    out["events"] = n
    return out


def finish_timeline(
    timeline: dict[str, Any] | None, columns: Mapping[str, np.ndarray], dev: DeviceData, catalog: StackCatalog
) -> dict[str, Any] | None:
    """The report's timeline with fused frees settled and, per point, the event's action, size and stack group."""
    timeline = settle_fused_frees(timeline, columns, dev.trace)
    if not timeline:
        return timeline
    points = np.asarray(timeline["index"], np.int64)
    trace = dev.trace
    groups = catalog.groups_of(np.asarray(trace.stack)[points]).astype(np.int32)
    cols: dict[str, np.ndarray] = {
        "action": np.asarray(trace.action)[points],
        "size": np.asarray(trace.size)[points],
        "group": groups,
    }
    info = _event_info(cols, np.arange(points.size))
    timeline.update(info)
    timeline["stack_labels"] = group_labels(catalog, groups)
    return timeline


ACTIVE_SAMPLES = 400
ACTIVE_BANDS = 300


def active_bands(
    columns: Mapping[str, np.ndarray], lo: int, hi: int, *, samples: int = ACTIVE_SAMPLES, bands: int = ACTIVE_BANDS
) -> dict[str, Any]:
    """memory_viz's active-memory view of events ``[lo, hi)``: each live allocation a band.

    Allocations are stacked in the order they were made: at each sampled event an allocation sits
    on top of every older allocation still alive, so a free lets the ones above it drop. The
    ``bands`` largest allocations alive at some sample are drawn as polygons (vertices only where
    their offset changes); the rest stay as the gaps between them. Samples are the events
    themselves when the range holds no more than ``samples`` of them, so a narrow zoom is exact.
    """
    start, end, size = columns["alloc_start"], columns["alloc_end"], columns["alloc_size"]
    n = int(columns["reserved"].shape[0])
    lo, hi = max(0, int(lo)), min(n, int(hi))
    if hi <= lo:
        return {"start": lo, "end": hi, "bands": [], "samples": 0, "allocations": 0}
    xs = np.unique(np.linspace(lo, hi - 1, min(samples, hi - lo)).astype(np.int64))
    # Alive at some sample: a sample lies in [start, end).
    sel = np.flatnonzero(np.searchsorted(xs, start, "left") < np.searchsorted(xs, end, "left"))
    s_start, s_end, s_size = start[sel], end[sel], size[sel]
    keep = np.sort(np.argsort(-s_size, kind="stable")[:bands])
    row_of = np.full(sel.size, -1, np.int64)
    row_of[keep] = np.arange(keep.size)
    offsets = np.full((keep.size, xs.size), -1, np.int64)  # -1: not alive at that sample
    totals = np.zeros(xs.size, np.int64)
    # One pass per sample over the allocations made by then (they are in start order): the
    # memory stays O(allocations), whatever the number of samples.
    made_by = np.searchsorted(s_start, xs, "right")
    for j, s_ev in enumerate(xs.tolist()):
        idx = np.flatnonzero(s_end[: made_by[j]] > s_ev)
        if idx.size == 0:
            continue
        sizes = s_size[idx]
        below = np.cumsum(sizes) - sizes
        totals[j] = int(sizes.sum())
        rows = row_of[idx]
        drawn = rows >= 0
        offsets[rows[drawn], j] = below[drawn]
    out_bands = []
    for r, k in enumerate(keep.tolist()):
        cols = np.flatnonzero(offsets[r] >= 0)
        if cols.size == 0:
            continue
        off = offsets[r, cols]
        # Keep a sample where the offset changes, and its neighbour, so steps stay steps.
        change = np.r_[True, off[1:] != off[:-1]] | np.r_[off[1:] != off[:-1], True]
        xk, ok = xs[cols][change], off[change]
        top = ok + int(s_size[k])
        out_bands.append(
            {
                "xs": np.r_[xk, xk[::-1]].tolist(),
                "ys": np.r_[top, ok[::-1]].tolist(),
                "size": int(s_size[k]),
                "alloc_event": int(s_start[k]),
                "free_event": int(s_end[k]) if s_end[k] < n else None,
                "group": int(columns["alloc_group"][sel[k]]),
            }
        )
    return {
        "start": lo,
        "end": hi,
        "samples": int(xs.size),
        "allocations": int(sel.size),
        "bands": out_bands,
        "peak_bytes": int(totals.max()) if totals.size else 0,
        # The stack's height at each sample: the live allocations' bytes.
        "sample_events": xs.tolist(),
        "sample_bytes": totals.tolist(),
    }


class Explorer:
    """One device of a snapshot, replayed once: the allocator's state at any event."""

    def __init__(self, snapshot: Snapshot, device: int) -> None:
        dev = next((d for d in snapshot.devices if d.device == device), None)
        if dev is None:
            raise KeyError(f"no device {device} in the snapshot")
        self.snapshot, self.dev = snapshot, dev
        self.catalog = StackCatalog(snapshot.stacks)
        self.replay = recorded_replay(snapshot, dev)
        t = dev.trace
        self.lifetimes = alloc_lifetimes(t.action, t.addr, t.size, t.stack)
        # Does a free record its own stack (context="all")? Then the free event's stack is the free site.
        freed = self.lifetimes.end < self.lifetimes.n_events
        self.free_stacks = bool(
            freed.any() and (t.stack[self.lifetimes.end[freed]] != self.lifetimes.stack[freed]).mean() > 0.5
        )

    def columns(self) -> dict[str, np.ndarray]:
        out = event_columns(self.replay, self.dev, self.catalog)
        # One row per allocation, for the active-memory bands (alloc event, free request, size, group).
        lt = self.lifetimes
        out["alloc_start"], out["alloc_end"], out["alloc_size"] = lt.start, lt.end, lt.size
        out["alloc_group"] = self.catalog.groups_of(np.asarray(lt.stack)).astype(np.int32)
        return out

    def labels(self) -> dict[str, str]:
        return group_labels(self.catalog, self.catalog.groups_of(np.asarray(self.dev.trace.stack)))

    def _free_of(self, alloc_event: int) -> int | None:
        """The free request of the allocation made at ``alloc_event`` (None: still live at the end)."""
        lt = self.lifetimes
        k = int(np.searchsorted(lt.start, alloc_event))
        if k < lt.start.size and lt.start[k] == alloc_event and lt.end[k] < lt.n_events:
            return int(lt.end[k])
        return None

    def _frames(self, stack: int) -> list[dict[str, Any]]:
        return [{"filename": f.filename, "line": f.line, "name": f.name} for f in self.snapshot.stacks.frames_of(stack)]

    def state_at(self, index: int) -> dict[str, Any]:
        """Segments and blocks after event ``index`` (-1: before the first event), with the totals."""
        state = self.replay.blocks_at(index)
        figures = state.figures()
        trace = self.dev.trace
        segments = []
        for seg in sorted(state.segments, key=lambda s: s.address):
            blocks = []
            for b in seg.blocks:
                entry: dict[str, Any] = {
                    "address": hex(b.address),
                    "offset": int(b.address - seg.address),
                    "size": int(b.size),
                    "requested": int(b.requested_size),
                    "state": b.state,
                }
                if b.state != INACTIVE:
                    entry["alloc_event"] = int(b.alloc_index) if b.alloc_index >= 0 else None
                    group = int(self.catalog.group_of[b.stack + 1]) if b.stack >= -1 else 0
                    entry["label"] = _short(self.catalog.groups[group].label) if group >= 0 else ""
                    entry["stack"] = int(b.stack)
                    entry["free_event"] = self._free_of(b.alloc_index) if b.alloc_index >= 0 else None
                blocks.append(entry)
            segments.append(
                {
                    "address": hex(seg.address),
                    "size": int(seg.total_size),
                    "stream": int(seg.stream),
                    "pool": int(seg.pool),
                    "type": seg.segment_type,
                    "expandable": bool(seg.is_expandable),
                    "blocks": blocks,
                }
            )
        event = None
        if 0 <= index < len(trace):
            event = {
                "index": int(index),
                "action": ACTIONS[int(trace.action[index])],
                "size": int(trace.size[index]),
                "time_us": int(trace.time_us[index]),
            }
        return {
            "event": event,
            "allocated_bytes": figures.allocated,
            "requested_bytes": figures.requested,
            "reserved_bytes": figures.reserved,
            "active_bytes": figures.active,
            "cached_free_bytes": figures.cached_free,
            "largest_free_bytes": figures.largest_free,
            "segments": segments,
            "free_records_stack": self.free_stacks,
        }

    def block(self, alloc_event: int) -> dict[str, Any]:
        """One allocation's full story: its alloc and free events and both stacks, every frame."""
        trace = self.dev.trace
        if not (0 <= alloc_event < len(trace)) or int(trace.action[alloc_event]) != ALLOC:
            raise KeyError(f"event {alloc_event} is not an allocation")
        free_event = self._free_of(alloc_event)
        out: dict[str, Any] = {
            "alloc_event": int(alloc_event),
            "address": hex(int(trace.addr[alloc_event])),
            "size": int(trace.size[alloc_event]),
            "alloc_time_us": int(trace.time_us[alloc_event]),
            "alloc_frames": self._frames(int(trace.stack[alloc_event])),
            "free_event": free_event,
            "free_frames": None,
        }
        if free_event is not None:
            out["free_time_us"] = int(trace.time_us[free_event])
            # Without context="all" a free records the allocation's stack again: say so rather than repeat it.
            out["free_frames"] = self._frames(int(trace.stack[free_event])) if self.free_stacks else None
        return out
