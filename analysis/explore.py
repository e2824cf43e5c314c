"""Digging into one device's trace: what the report's interactive views ask for.

- ``event_columns`` is what a site stores once per device so zooming never
  replays again: the recorded replay's per-event series plus, per event, its
  action, size and stack group.
- ``window`` answers a zoom: the events ``[t0, t1)`` at screen resolution
  (``analysis.timeline``'s min/max selection, so every extreme is exact), down to
  single events when the range is narrow, each point with what happened there.
- ``StoredExplorer.state_at`` is the allocator's state after one event from the
  recorded replay (``RecordedReplay.blocks_at``): every segment and block, with
  the block's allocation and free events and their full stacks (C++ frames too
  when recorded).
- ``finish_timeline`` gives the report's own timeline (its fused frees settled:
  ``timeline.fused_free_settler``) the same per-point event info.
- ``segment_lifetimes`` is each segment's life (memory_viz's segment timeline), made once per
  device into the store: the site's zooms read it (issue 36: it ran per request in the web tier).
- ``explore_store`` is everything the site's digging endpoints read, made by the worker at
  analysis time from the report's own recorded replay: the columns above, the trace columns
  the replay needs, the stack table, and *checkpoints* (the replay's full state every
  ``CHECKPOINT_EVERY`` events). ``StoredExplorer`` answers from it without the snapshot: the
  state at an event is the checkpoint before it moved on by at most ``CHECKPOINT_EVERY - 1``
  events (``allocator.recorded.resume_state``, the replay's own lenient pass).
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator.config import AllocatorConfig
from analysis.allocator.recorded import RecordedReplay, recorded_config, recorded_replay, resume_state
from analysis.allocator.states import AllocatorState, BlockState, SegmentState
from analysis.eventgroups import event_groups
from analysis.model import (
    ACTIONS,
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    ALLOC,
    INACTIVE,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    DeviceData,
    Segment,
    Snapshot,
    Trace,
    sorted_unique,
)
from analysis.stacks import BEFORE_TRACE, Lifetimes, StackCatalog, alloc_lifetimes
from analysis.timeline import SERIES, series_at, settled_points, timeline_window

I64 = npt.NDArray[np.int64]
# build_report(explore=...): called with (device, explore_store(...)) once per device.
ExploreSink = Callable[[int, dict[str, np.ndarray]], None]
# build_report(explore_later=...): called with (device, make) once per device, ``make()`` giving that
# store, for a caller that makes it after the report (the worker's child: the user's first answer waits
# for none of it; 0.58 s of the 460 MB benchmark's report, issue 34).
ExploreLater = Callable[[int, Callable[[], dict[str, np.ndarray]]], None]
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
    return {str(int(g)): _short(catalog.groups[int(g)].label) for g in sorted_unique(groups) if int(g) >= 0}


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
    timeline: dict[str, Any] | None,
    dev: DeviceData,
    catalog: StackCatalog,
    lifetimes: Lifetimes | None = None,
) -> dict[str, Any] | None:
    """The report's timeline (``build_timeline``'s, its fused frees settled: ``timeline.fused_free_settler``)
    with, per point, the event's action, size and stack group (given ``lifetimes``, as the event list names
    them: ``event_groups``)."""
    if not timeline:
        return timeline
    points = np.asarray(timeline["index"], np.int64)
    trace = dev.trace
    if lifetimes is not None:
        groups = event_groups(trace, catalog, lifetimes, at=points)
    else:
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
    xs = sorted_unique(np.linspace(lo, hi - 1, min(samples, hi - lo)).astype(np.int64))
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


class _OpenRanges:
    """The segments (or mapped page ranges) alive at one point of the trace: disjoint address
    ranges sorted by address, each with the event that made it. Finding what an unmap overlaps is
    a bisection, not a scan of every open range (issue 36: 20k maps and 100k unmaps took 341 s)."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.sizes: list[int] = []
        self.made: list[int] = []

    def end(self, a: int, b: int, at: int, rows: list[tuple[int, int, int, int]]) -> None:
        """End every open range that overlaps ``[a, b)`` at event ``at`` (a row each); the parts of
        them outside ``[a, b)`` live on from ``at``."""
        k = bisect_right(self.starts, a) - 1
        if k < 0 or self.starts[k] + self.sizes[k] <= a:
            k += 1
        j = k
        while j < len(self.starts) and self.starts[j] < b:
            j += 1
        if j == k:
            return
        starts, sizes, made = [], [], []
        for ra, rz, rm in zip(self.starts[k:j], self.sizes[k:j], self.made[k:j], strict=True):
            rows.append((rm, at, rz, ra))
            if ra < a:
                starts.append(ra)
                sizes.append(a - ra)
                made.append(at)
            if b < ra + rz:
                starts.append(b)
                sizes.append(ra + rz - b)
                made.append(at)
        self.starts[k:j], self.sizes[k:j], self.made[k:j] = starts, sizes, made

    def open(self, a: int, z: int, at: int, rows: list[tuple[int, int, int, int]]) -> None:
        """A new range made at ``at``; a valid trace never maps over a live range, and one that does
        ends what it overlaps there (the ranges stay disjoint)."""
        if z <= 0:
            return
        self.end(a, a + z, at, rows)
        k = bisect_left(self.starts, a)
        self.starts.insert(k, a)
        self.sizes.insert(k, z)
        self.made.insert(k, at)

    def pop_exact(self, a: int, z: int) -> int | None:
        """The event that made the open range ``[a, a + z)``, removed; None when none is open there."""
        k = bisect_left(self.starts, a)
        if k < len(self.starts) and self.starts[k] == a and self.sizes[k] == z:
            del self.starts[k], self.sizes[k]
            return self.made.pop(k)
        return None


def segment_lifetimes(
    action: np.ndarray, addr: np.ndarray, size: np.ndarray, before: list[tuple[int, int]] | None = None
) -> dict[str, I64]:
    """Each segment's life in the trace: made at a ``segment_alloc``, gone at the ``segment_free`` of the
    same address; one without its making in the trace (made before the recording) lives from event 0,
    one never freed to the end. Expandable segments map and unmap page ranges that need not pair up: an
    unmap ends every mapped range it overlaps and what is left of them lives on as new ranges from
    there, so the ranges alive after any event add up to the mapped bytes. In order of making, as
    ``active_bands`` reads allocations. ``before``: the (address, size) of the segments the allocator
    held before the first event (a trace that starts late, or a wrapped ring buffer), alive from 0.

    O(k log k) comparisons for k segment events (plus the list shifts of an insertion)."""
    n = int(action.shape[0])
    events = np.flatnonzero(np.isin(action, (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP)))
    alive = _OpenRanges()
    rows: list[tuple[int, int, int, int]] = []  # start, end, size, address
    for a, z in before or []:
        alive.open(int(a), int(z), 0, rows)
    for i, what, a, z in zip(
        events.tolist(), action[events].tolist(), addr[events].tolist(), size[events].tolist(), strict=True
    ):
        if what in (SEGMENT_ALLOC, SEGMENT_MAP):
            alive.open(a, z, i, rows)
        elif what == SEGMENT_FREE:
            made = alive.pop_exact(a, z)
            rows.append((0 if made is None else made, i, z, a))
        else:  # an unmap: end the ranges it overlaps, keep their parts outside it
            alive.end(a, a + z, i, rows)
    rows.extend(zip(alive.made, [n] * len(alive.made), alive.sizes, alive.starts, strict=True))
    rows = [r for r in rows if r[0] < r[1] or r[0] == 0]
    rows.sort()
    table = np.array(rows, np.int64).reshape(-1, 4)
    return {"start": table[:, 0], "end": table[:, 1], "size": table[:, 2], "address": table[:, 3]}


# The state at an event is the nearest earlier checkpoint moved on by the replay: at most this
# many events are replayed per click (about 0.1 s on the 2-core box; docs/report.md).
CHECKPOINT_EVERY = 16_384
STORE_VERSION = 1
_STATE_CODES = {INACTIVE: 0, ACTIVE_ALLOCATED: 1, ACTIVE_PENDING_FREE: 2}
_STATE_NAMES = {v: k for k, v in _STATE_CODES.items()}
_SEGMENT_TYPES = ("small", "large")


def checkpoint_events(n: int, every: int = CHECKPOINT_EVERY) -> list[int]:
    """The events after which the store keeps the replay's full state (besides -1 and the last)."""
    return list(range(every - 1, n - 1, every))


def _json_bytes(value: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(value, separators=(",", ":")).encode(), np.uint8)


def _json_of(array: np.ndarray) -> Any:
    return json.loads(bytes(np.asarray(array, np.uint8)).decode())


def _csr(lists: list[list[int]], dtype: type) -> tuple[np.ndarray, np.ndarray]:
    off = np.zeros(len(lists) + 1, np.int64)
    off[1:] = np.cumsum([len(x) for x in lists])
    flat: np.ndarray = np.fromiter((v for x in lists for v in x), dtype, int(off[-1]))
    return off, flat


def _states_arrays(states: list[AllocatorState]) -> dict[str, np.ndarray]:
    seg_rows: list[tuple[int, int, int, int, int, int, int]] = []
    blk_rows: list[tuple[int, int, int, int, int, int]] = []
    seg_off, blk_off = [0], [0]
    for st in states:
        for seg in st.segments:
            seg_rows.append(
                (
                    seg.address,
                    seg.total_size,
                    seg.stream,
                    seg.pool,
                    _SEGMENT_TYPES.index(seg.segment_type),
                    int(seg.is_expandable),
                    seg.stack,
                )
            )
            blk_rows.extend(
                (b.address, b.size, b.requested_size, _STATE_CODES[b.state], b.stack, b.alloc_index) for b in seg.blocks
            )
            blk_off.append(len(blk_rows))
        seg_off.append(len(seg_rows))
    sg = np.array(seg_rows, np.int64).reshape(-1, 7)
    bk = np.array(blk_rows, np.int64).reshape(-1, 6)
    out = {"ck_index": np.array([st.index for st in states], np.int64), "ck_seg_off": np.array(seg_off, np.int64)}
    for j, name in enumerate(("address", "size", "stream", "pool", "type", "expandable", "stack")):
        out[f"sg_{name}"] = sg[:, j].copy()
    out["sg_blk_off"] = np.array(blk_off, np.int64)
    for j, name in enumerate(("address", "size", "requested", "state", "stack", "alloc")):
        out[f"bk_{name}"] = bk[:, j].copy()
    return out


def explore_store(
    snapshot: Snapshot,
    dev: DeviceData,
    catalog: StackCatalog,
    replay: RecordedReplay,
    lifetimes: Lifetimes | None = None,
    *,
    every: int = CHECKPOINT_EVERY,
) -> dict[str, np.ndarray]:
    """Every array the site's digging endpoints read for one device (``StoredExplorer``).

    ``replay`` should have been run with ``keep_at=checkpoint_events(n, every)`` (the report does
    when asked for a store): its kept states are the checkpoints; any other is replayed here.
    """
    trace = dev.trace
    n = len(trace)
    lt = lifetimes if lifetimes is not None else alloc_lifetimes(trace.action, trace.addr, trace.size, trace.stack)
    out = event_columns(replay, dev, catalog)
    out["alloc_start"], out["alloc_end"], out["alloc_size"] = lt.start, lt.end, lt.size
    out["group"] = event_groups(trace, catalog, lt)
    # An allocation's group is its alloc event's (the backward pass's frame-less ones named so).
    out["alloc_group"] = out["group"][np.asarray(lt.start, np.int64)] if lt.start.size else np.zeros(0, np.int32)
    out["addr"] = np.asarray(trace.addr, np.int64)
    out["stream"] = np.asarray(trace.stream, np.int32)
    out["pool"] = np.asarray(trace.pool, np.int32)
    out["stack"] = np.asarray(trace.stack, np.int32)
    out["group_of"] = np.asarray(catalog.group_of, np.int32)
    segs = dev.segments
    out["fs_address"] = np.array([s.address for s in segs], np.int64)
    out["fs_size"] = np.array([s.total_size for s in segs], np.int64)
    out["fs_pool"] = np.array([s.pool for s in segs], np.int64)
    out["fs_type"] = np.array([_SEGMENT_TYPES.index(s.segment_type) for s in segs], np.int8)
    marks = [-1, *checkpoint_events(n, every), *([n - 1] if n else [])]
    states = [replay.blocks_at(k) for k in sorted(set(marks))]
    out.update(_states_arrays(states))
    # The segment timeline's rows, made here once (the site answers zooms from them).
    before = [(seg.address, seg.total_size) for seg in states[0].segments]
    life = segment_lifetimes(trace.action, np.asarray(trace.addr, np.int64), np.asarray(trace.size, np.int64), before)
    out.update({f"seg_{k}": v for k, v in life.items()})
    table = snapshot.stacks
    out["frame_off"], out["frame_ids"] = _csr([list(st) for st in table.stacks], np.int32)
    out["frames"] = _json_bytes([[f.filename, f.line, f.name] for f in table.frames])
    out["labels"] = _json_bytes({str(g): _short(grp.label) for g, grp in enumerate(catalog.groups)})
    freed = lt.end < lt.n_events
    # Does a free record its own stack (context="all")? Then the free event's stack is the free site.
    free_stacks = bool(freed.any() and (trace.stack[lt.end[freed]] != lt.stack[freed]).mean() > 0.5)
    cfg = asdict(recorded_config(snapshot))
    out["meta"] = _json_bytes(
        {"version": STORE_VERSION, "device": dev.device, "events": n, "free_stacks": free_stacks, "config": cfg}
    )
    return out


def _config_from(d: Mapping[str, Any]) -> AllocatorConfig:
    fields = dict(d)
    fields["roundup_power2_divisions"] = tuple(fields["roundup_power2_divisions"])
    fields["other"] = tuple(tuple(kv) for kv in fields["other"])
    return AllocatorConfig(**fields)


class StoredExplorer:
    """One device's digging answers from its ``explore_store``: no snapshot, no full replay."""

    def __init__(self, store: Mapping[str, np.ndarray]) -> None:
        self.store = store
        meta = _json_of(store["meta"])
        if meta.get("version") != STORE_VERSION:
            raise ValueError(f"explore store version {meta.get('version')}, expected {STORE_VERSION}")
        self.device = int(meta["device"])
        self.events = int(meta["events"])
        self.free_stacks = bool(meta["free_stacks"])
        self.cfg = _config_from(meta["config"])
        self.label_of: dict[str, str] = _json_of(store["labels"])
        self._frames: list[list[Any]] | None = None
        self._dev: DeviceData | None = None
        self._segments: dict[str, I64] | None = None
        self.ck_index = np.asarray(store["ck_index"], np.int64)

    def columns(self) -> dict[str, np.ndarray]:
        names = [name for name, _ in SERIES]
        names += ["time_us", "action", "size", "group", "alloc_start", "alloc_end", "alloc_size", "alloc_group"]
        return {k: self.store[k] for k in names}

    def labels(self) -> dict[str, str]:
        return self.label_of

    def segment_rows(self) -> dict[str, I64]:
        """``segment_lifetimes`` of the device, as the store keeps them; a store made before it kept
        them has them made once here and kept with it (the same O(k log k) pass)."""
        if self._segments is None:
            st = self.store
            if "seg_start" in st:
                self._segments = {k: np.asarray(st[f"seg_{k}"], np.int64) for k in ("start", "end", "size", "address")}
            else:
                first = self.checkpoint(0)
                before = [(seg.address, seg.total_size) for seg in first.segments] if first.index < 0 else []
                addr, size = np.asarray(st["addr"], np.int64), np.asarray(st["size"], np.int64)
                self._segments = segment_lifetimes(np.asarray(st["action"]), addr, size, before)
        return self._segments

    def _device(self) -> DeviceData:
        """A ``DeviceData`` holding what the replay reads (the trace and the final segments' kinds)."""
        if self._dev is None:
            st = self.store
            trace = Trace(
                action=np.asarray(st["action"], np.int8),
                addr=np.asarray(st["addr"], np.int64),
                size=np.asarray(st["size"], np.int64),
                stream=np.asarray(st["stream"], np.int32),
                time_us=np.asarray(st["time_us"], np.int64),
                stack=np.asarray(st["stack"], np.int32),
                pool=np.asarray(st["pool"], np.int32),
            )
            segments = [
                Segment(self.device, int(a), int(z), 0, 0, 0, 0, _SEGMENT_TYPES[int(t)], int(p), False, ())
                for a, z, p, t in zip(st["fs_address"], st["fs_size"], st["fs_pool"], st["fs_type"], strict=True)
            ]
            self._dev = DeviceData(self.device, trace, segments, [])
        return self._dev

    def checkpoint(self, k: int) -> AllocatorState:
        """The ``k``-th stored state."""
        st = self.store
        so = st["ck_seg_off"]
        segments = []
        for r in range(int(so[k]), int(so[k + 1])):
            b0, b1 = int(st["sg_blk_off"][r]), int(st["sg_blk_off"][r + 1])
            cols = [st[f"bk_{c}"][b0:b1].tolist() for c in ("address", "size", "requested", "state", "stack", "alloc")]
            blocks = tuple(
                BlockState(a, z, q, _STATE_NAMES[c], sk, al) for a, z, q, c, sk, al in zip(*cols, strict=True)
            )
            segments.append(
                SegmentState(
                    int(st["sg_address"][r]),
                    int(st["sg_size"][r]),
                    int(st["sg_stream"][r]),
                    int(st["sg_pool"][r]),
                    _SEGMENT_TYPES[int(st["sg_type"][r])],
                    bool(st["sg_expandable"][r]),
                    blocks,
                    int(st["sg_stack"][r]),
                )
            )
        return AllocatorState(int(self.ck_index[k]), tuple(segments))

    def blocks_at(self, index: int) -> AllocatorState:
        """The replay's state after ``index``: the checkpoint before it, moved on to it."""
        if not -1 <= index < self.events:
            raise IndexError(f"event index {index} outside [-1, {self.events})")
        k = int(np.searchsorted(self.ck_index, index, "right")) - 1
        start = self.checkpoint(k)
        return start if start.index == index else resume_state(self._device(), self.cfg, start, index)

    def _free_of(self, alloc_event: int) -> int | None:
        """The free request of the allocation made at ``alloc_event`` (None: still live at the end)."""
        start, end = self.store["alloc_start"], self.store["alloc_end"]
        k = int(np.searchsorted(start, alloc_event))
        if k < start.size and start[k] == alloc_event and end[k] < self.events:
            return int(end[k])
        return None

    def _label(self, stack: int, event: int = -1) -> str:
        """The label of an event's stack group as the store has it per event (the backward pass's
        frame-less events named so), else of ``stack``'s group."""
        if 0 <= event < self.events:
            group = int(self.store["group"][event])
        else:
            group = int(self.store["group_of"][stack + 1]) if stack >= -1 else 0
            if group == 0:  # a block from before the trace: its stack is not known, only that
                return BEFORE_TRACE
        return self.label_of.get(str(group), "") if group >= 0 else ""

    def _frames_of(self, stack: int) -> list[dict[str, Any]]:
        if stack < 0:
            return []
        if self._frames is None:
            self._frames = _json_of(self.store["frames"])
        off = self.store["frame_off"]
        ids = self.store["frame_ids"][int(off[stack]) : int(off[stack + 1])].tolist()
        return [{"filename": f[0], "line": f[1], "name": f[2]} for f in (self._frames[i] for i in ids)]

    def state_at(self, index: int, *, max_blocks: int | None = None) -> dict[str, Any]:
        """Segments and blocks after event ``index`` (-1: before the first event), with the totals.

        ``max_blocks``: list at most this many entries (segments and blocks together), in address
        order; the rest are counted (``segments_total``, ``blocks_total``, ``truncated``), so an
        answer's size does not grow with the trace (issue 36: 72x the upload per request)."""
        state = self.blocks_at(index)
        figures = state.figures()
        st = self.store
        total_blocks = sum(len(seg.blocks) for seg in state.segments)
        budget = max_blocks if max_blocks is not None else total_blocks + len(state.segments)
        segments: list[dict[str, Any]] = []
        for seg in sorted(state.segments, key=lambda s: s.address):
            if budget <= 0:
                break
            blocks = [self._block_entry(seg, b) for b in seg.blocks[: budget - 1]]
            budget -= 1 + len(blocks)
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
        listed = sum(len(seg["blocks"]) for seg in segments)
        event = None
        if 0 <= index < self.events:
            event = {
                "index": int(index),
                "action": ACTIONS[int(st["action"][index])],
                "size": int(st["size"][index]),
                "time_us": int(st["time_us"][index]),
                # The event's whole stack (memory_viz shows it under the event list) and its group's label.
                "frames": self._frames_of(int(st["stack"][index])),
                "label": self._label(int(st["stack"][index]), index),
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
            "segments_total": len(state.segments),
            "blocks_total": total_blocks,
            "truncated": listed < total_blocks or len(segments) < len(state.segments),
            "free_records_stack": self.free_stacks,
        }

    def _block_entry(self, seg: SegmentState, b: BlockState) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "address": hex(b.address),
            "offset": int(b.address - seg.address),
            "size": int(b.size),
            "requested": int(b.requested_size),
            "state": b.state,
        }
        if b.state != INACTIVE:
            entry["alloc_event"] = int(b.alloc_index) if b.alloc_index >= 0 else None
            entry["label"] = self._label(int(b.stack), int(b.alloc_index))
            entry["stack"] = int(b.stack)
            entry["free_event"] = self._free_of(b.alloc_index) if b.alloc_index >= 0 else None
        return entry

    def block(self, alloc_event: int) -> dict[str, Any]:
        """One allocation's full story: its alloc and free events and both stacks, every frame."""
        st = self.store
        if not (0 <= alloc_event < self.events) or int(st["action"][alloc_event]) != ALLOC:
            raise KeyError(f"event {alloc_event} is not an allocation")
        free_event = self._free_of(alloc_event)
        out: dict[str, Any] = {
            "alloc_event": int(alloc_event),
            "address": hex(int(st["addr"][alloc_event])),
            "size": int(st["size"][alloc_event]),
            "alloc_time_us": int(st["time_us"][alloc_event]),
            "alloc_frames": self._frames_of(int(st["stack"][alloc_event])),
            "free_event": free_event,
            "free_frames": None,
        }
        if free_event is not None:
            out["free_time_us"] = int(st["time_us"][free_event])
            # Without context="all" a free records the allocation's stack again: say so rather than repeat it.
            out["free_frames"] = self._frames_of(int(st["stack"][free_event])) if self.free_stacks else None
        return out


def store_of_snapshot(snapshot: Snapshot, device: int, *, every: int = CHECKPOINT_EVERY) -> dict[str, np.ndarray]:
    """The store of one device made from the snapshot alone (what the worker makes inside the report)."""
    dev = next((d for d in snapshot.devices if d.device == device), None)
    if dev is None:
        raise KeyError(f"no device {device} in the snapshot")
    catalog = StackCatalog(snapshot.stacks)
    replay = recorded_replay(snapshot, dev, keep_at=checkpoint_events(len(dev.trace), every))
    return explore_store(snapshot, dev, catalog, replay, every=every)
