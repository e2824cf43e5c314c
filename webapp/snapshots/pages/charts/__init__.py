"""Bokeh charts of a report: the only module of the project that imports bokeh.

``build_charts(report)`` turns the report dict (contract ``oomscope.report/1``)
into ``{name: json_item}``; the worker stores the result beside the report, so
page views never run Bokeh. Pages embed each item with ``Bokeh.embed.embed_item``
from our static ``charts.js`` (see ``templates/snapshots/_chart.html``).

Rules that shape this module:
- No ``CustomJS``: the site's CSP has no ``unsafe-eval`` and BokehJS compiles
  CustomJS code with ``new Function``. Everything interactive here is built in
  (hover templates, legend hiding, linked ranges).
- Hover text formats bytes in the browser with BokehJS's numbro formats
  (``{0.00 b}`` gives binary units, ``{0,0}`` the exact count), so the data
  carries plain numbers once rather than strings per point.
- Data is bounded whatever the snapshot's size: the report's timeline is
  already downsampled; here every series, map and tree is capped again so a
  page stays well under a few MB.
- Items are stored in a JSON column: on PostgreSQL (jsonb) object keys come
  back reordered, so a model's bare reference ``{"id": ...}`` may precede its
  definition. ``static/js/charts.js`` restores definition-first order before
  ``embed_item``; tests render jsonb-ordered items in a browser.

Chart names (the page template places them by name; ``<d>`` is the device):
``timeline-<d>`` (timeline + fragmentation index, linked x), ``segments-peak-<d>``,
``segments-oom-<d>``, ``stacks-<d>`` (icicle), ``whatif-<d>`` (peak per config),
``whatif-steps-<d>`` (reserved at each step's end per config).
"""

from __future__ import annotations

import functools
import json
import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np
from bokeh.embed import json_item
from bokeh.layouts import column
from bokeh.models import (
    AdaptiveTicker,
    CDSView,
    ColumnDataSource,
    GroupFilter,
    HoverTool,
    NumeralTickFormatter,
    Range1d,
    WheelZoomTool,
)
from bokeh.models.annotations import Label, Legend, Span, Title  # typed here; bokeh.models re-exports them untyped
from bokeh.plotting import figure
from bokeh.transform import dodge

from analysis.contract import Device, Oom, Report, Segment, SegmentMap, StackRow, Step, Timeline, report_of
from webapp.snapshots.pages.formatting import event_text, format_bytes, frame_label

__all__ = [
    "build_charts",
    "build_compare_charts",
    "build_history_chart",
    "format_bytes",
]

# Caps that keep a page light (a json_item costs about 11 bytes per float).
MAX_TIMELINE_POINTS = 6500  # the report keeps up to 6 points per 1000 buckets
TIMELINE_X_LABEL = "trace event (allocator calls, in order)"  # x is the event index, not time
MAX_SEGMENT_ROWS = 200
MAX_SEGMENT_BLOCKS = 4000
# A segment map is no taller than a laptop's screen (issue 35: two 1,290 px charts one under the other);
# the page sets the two side by side where it is wide enough; rows thinner than a label are hovered.
SEGMENT_MAP_MAX_PX = 560
MAX_LABEL = 72
MAX_ICICLE_DEPTH = 14
MAX_ICICLE_NODES = 800
MAX_STEP_BANDS = 2000

# One palette for the whole site; static/css/oomscope.css uses the same hues.
RESERVED = "#4c72b0"
ALLOCATED = "#dd8452"
REQUESTED = "#55a868"
LARGEST_FREE = "#8172b3"
FRAGMENTATION = "#c44e52"
OOM_COLOUR = "#c0392b"
LIMIT_COLOUR = "#333333"
STEP_BAND = "#e8edf5"
STATE_COLOURS = {
    "active_allocated": "#dd8452",
    "active_pending_free": "#e6b422",
    "inactive": "#b8d8b8",
    "mixed": "#c9b08f",
    "unmapped": "#ffffff",
}
STATE_LABELS = {
    "active_allocated": "allocated",
    "active_pending_free": "pending free",
    "inactive": "free (cached)",
    "mixed": "small blocks, merged",
    "unmapped": "unmapped",
}
WHATIF_COLOURS = ("#55a868", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd")

TOOLS = "pan,wheel_zoom,box_zoom,reset,save"
CURSOR_COLOUR = "#1f2328"  # the event list's selected event on the timeline

# ---------------------------------------------------------------- entry points


def build_charts(report: Report | Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """All charts of a report (typed: ``analysis.contract``; the worker passes the dict it just built),
    name -> ``json_item`` dict; charts without data are left out."""
    charts: dict[str, dict[str, Any]] = {}
    for dev in report_of(report).devices:
        d = dev.device if dev.device is not None else 0
        builders = (
            ("timeline", _timeline_chart),
            # The reserved peak's map where the report has one: the moment the cache was largest.
            ("segments-peak", lambda dv: _segment_map_chart(dv, _peak_map_key(dv))),
            ("segments-oom", lambda dv: _segment_map_chart(dv, "oom")),
            ("stacks", _icicle_chart),
            ("whatif", _whatif_chart),
            ("whatif-steps", _whatif_steps_chart),
        )
        for kind, build in builders:
            model = build(dev)
            if model is not None:
                charts[f"{kind}-{d}"] = _item(model)
        if f"timeline-{d}" in charts:
            # Empty here; static/js/explore.js fills it from active.json (site pages only).
            charts[f"active-{d}"] = active_chart_item(int(d))
            # memory_viz's segment timeline, empty too: explore.js fills it from segments.json.
            charts[f"segtime-{d}"] = segment_time_chart_item(int(d))
    return charts


def build_history_chart(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Peak reserved and allocated per run of a project, oldest first (rows come newest first)."""
    points = [r for r in reversed(list(rows)) if r.get("summary")]
    if not points:
        return None
    labels = [_run_label(r, i) for i, r in enumerate(points)]
    source = ColumnDataSource(
        {
            "x": np.arange(len(points), dtype=np.float64),
            "label": labels,
            "created": [str(r.get("created_at") or "")[:16].replace("T", " ") for r in points],
            "reserved": _floats(r["summary"].get("peak_reserved_bytes") for r in points),
            "allocated": _floats(r["summary"].get("peak_allocated_bytes") for r in points),
        }
    )
    p = _figure("Peak memory per run", height=300, x_range=(-0.5, len(points) - 0.5))
    p.xaxis.ticker = list(range(len(points)))
    p.xaxis.major_label_overrides = dict(enumerate(labels))
    p.xaxis.major_label_orientation = 0.6 if len(points) > 6 else 0
    _bytes_ticks(p.yaxis)
    p.y_range.start = 0  # a trend from zero: small changes must not look like doubling
    r1 = p.line("x", "reserved", source=source, color=RESERVED, line_width=2, legend_label="peak reserved")
    p.scatter("x", "reserved", source=source, color=RESERVED, size=7, legend_label="peak reserved")
    p.line("x", "allocated", source=source, color=ALLOCATED, line_width=2, legend_label="peak allocated")
    p.scatter("x", "allocated", source=source, color=ALLOCATED, size=7, legend_label="peak allocated")
    p.add_tools(
        HoverTool(
            renderers=[r1],
            mode="vline",
            tooltips=[
                ("run", "@label"),
                ("uploaded", "@created"),
                ("peak reserved", "@reserved{0.00 b} (@reserved{0,0} B)"),
                ("peak allocated", "@allocated{0.00 b} (@allocated{0,0} B)"),
            ],
        )
    )
    _legend(p)
    return _item(p)


def build_compare_charts(
    report_a: Report | Mapping[str, Any], report_b: Report | Mapping[str, Any], labels: tuple[str, str] = ("A", "B")
) -> dict[str, dict[str, Any]]:
    """Two runs side by side: peak figures per kind, and reserved memory at each step's end."""
    dev_a, dev_b = _first_device(report_of(report_a)), _first_device(report_of(report_b))
    if dev_a is None or dev_b is None:
        return {}
    charts: dict[str, dict[str, Any]] = {}
    peaks = _compare_peaks(dev_a, dev_b, labels)
    if peaks is not None:
        charts["compare-peaks"] = _item(peaks)
    overlay = _compare_timeline(dev_a, dev_b, labels)
    if overlay is not None:
        charts["compare-timeline"] = _item(overlay)
    steps = _compare_steps(dev_a, dev_b, labels)
    if steps is not None:
        charts["compare-steps"] = _item(steps)
    return charts


def _compare_peaks(dev_a: Device, dev_b: Device, labels: tuple[str, str]) -> Any:
    """The two runs' peak figures as paired bars, one pair per kind either run has."""
    kinds = [
        ("peak reserved", "peak_reserved_bytes"),
        ("peak allocated", "peak_allocated_bytes"),
        ("peak requested", "peak_requested_bytes"),
        ("final reserved", "final_reserved_bytes"),
    ]
    pairs = [(name, getattr(dev_a.summary, key), getattr(dev_b.summary, key)) for name, key in kinds]
    rows = [(name, a, b) for name, a, b in pairs if a is not None or b is not None]
    if not rows:
        return None
    y = [name for name, _, _ in rows]
    source = ColumnDataSource(
        {
            "kind": y,
            "a": _floats(a for _, a, _ in rows),
            "b": _floats(b for _, _, b in rows),
        }
    )
    p = _figure("Peaks: " + " vs ".join(labels), height=260, y_range=list(reversed(y)), tools="save,reset")
    _bytes_ticks(p.xaxis)
    p.hbar(
        y=dodge("kind", 0.18, range=p.y_range),
        right="a",
        height=0.34,
        source=source,
        color=RESERVED,
        legend_label=labels[0],
    )
    p.hbar(
        y=dodge("kind", -0.18, range=p.y_range),
        right="b",
        height=0.34,
        source=source,
        color=ALLOCATED,
        legend_label=labels[1],
    )
    p.add_tools(
        HoverTool(
            tooltips=[("", "@kind"), (labels[0], "@a{0.00 b} (@a{0,0} B)"), (labels[1], "@b{0.00 b} (@b{0,0} B)")]
        )
    )
    p.x_range.start = 0
    _legend(p, outside=True)
    return p


def _compare_steps(dev_a: Device, dev_b: Device, labels: tuple[str, str]) -> Any:
    """Reserved memory at each step's end, one line per run that has steps."""
    steps_a, steps_b = dev_a.steps, dev_b.steps
    if not (steps_a or steps_b):
        return None
    p = _figure("Reserved at each step's end", height=300)
    _bytes_ticks(p.yaxis)
    p.xaxis.axis_label = "step"
    hover_renderers = []
    for label, steps, colour in ((labels[0], steps_a, RESERVED), (labels[1], steps_b, ALLOCATED)):
        if not steps:
            continue
        src = ColumnDataSource(
            {
                "step": _floats(i if s.index is None else s.index for i, s in enumerate(steps)),
                "reserved": _floats(s.reserved_end_bytes for s in steps),
                "run": [label] * len(steps),
            }
        )
        hover_renderers.append(p.line("step", "reserved", source=src, color=colour, line_width=2, legend_label=label))
        p.scatter("step", "reserved", source=src, color=colour, size=5, legend_label=label)
    p.add_tools(
        HoverTool(
            renderers=hover_renderers,
            tooltips=[("run", "@run"), ("step", "@step{0}"), ("reserved", "@reserved{0.00 b} (@reserved{0,0} B)")],
        )
    )
    _legend(p)
    return p


def _compare_timeline(dev_a: Device, dev_b: Device, labels: tuple[str, str]) -> Any:
    """Both runs' reserved and allocated memory, aligned by step (analysis.compare.aligned_timeline)."""
    from analysis.compare import aligned_timeline

    series = [(labels[0], aligned_timeline(dev_a), RESERVED), (labels[1], aligned_timeline(dev_b), ALLOCATED)]
    if not any(s for _, s, _ in series):
        return None
    p = _figure("Memory by step, both runs (x: step number + how far into the step, by events)", height=320)
    _bytes_ticks(p.yaxis)
    p.xaxis.axis_label = "step"
    hover = []
    for label, data, colour in series:
        if not data or not data["x"]:
            continue
        idx = _minmax_indices(np.asarray(data["reserved"]), [], MAX_TIMELINE_POINTS // 2)
        src = ColumnDataSource(
            {
                "x": np.asarray(data["x"])[idx],
                "reserved": np.asarray(data["reserved"])[idx],
                "allocated": np.asarray(data["allocated"])[idx],
                "run": [label] * int(idx.size),
            }
        )
        hover.append(p.line("x", "reserved", source=src, color=colour, line_width=2, legend_label=f"{label} reserved"))
        p.line(
            "x",
            "allocated",
            source=src,
            color=colour,
            line_width=1.2,
            line_dash="dashed",
            legend_label=f"{label} allocated",
        )
    p.add_tools(
        HoverTool(
            renderers=hover,
            tooltips=[
                ("run", "@run"),
                ("step", "@x{0.00}"),
                ("reserved", "@reserved{0.00 b} (@reserved{0,0} B)"),
                ("allocated", "@allocated{0.00 b}"),
            ],
        )
    )
    _legend(p, outside=True)
    return p


# ---------------------------------------------------------------- timeline


def timeline_columns(timeline: Timeline | None) -> dict[str, np.ndarray] | None:
    """The timeline's series as float arrays: x (seconds or event index), reserved, allocated, ...

    A column is drawn where it is a non-empty list as long as the reserved one (``contract.Timeline`` reads
    the older names); without its own event index a point's is its position. Returns None when the report
    has no series.
    """
    reserved = _column(timeline.reserved_bytes) if timeline is not None else None
    if timeline is None or reserved is None:
        return None
    out: dict[str, np.ndarray] = {"reserved": reserved}
    for key, value in (
        ("allocated", timeline.allocated_bytes),
        ("requested", timeline.requested_bytes),
        ("largest_free", timeline.largest_free_bytes),
        ("cached_free", timeline.cached_free_bytes),
        ("fragmentation", timeline.external_fragmentation),
        ("event_index", timeline.index),
        ("time_us", timeline.time_us),
    ):
        col = _column(value)
        if col is not None and col.shape == reserved.shape:
            out[key] = col
    if "event_index" not in out:
        out["event_index"] = np.arange(reserved.shape[0], dtype=np.float64)
    return out


def _column(value: Any) -> np.ndarray | None:
    """A stored column as floats; None for one that is not a non-empty list."""
    if isinstance(value, (list, tuple, np.ndarray)) and len(value) > 0:
        return np.asarray(value, dtype=np.float64)
    return None


def _seconds(cols: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """Seconds since the trace's first event, for hover; None when the trace has no usable clock."""
    t = cols.get("time_us")
    if t is None or t.shape[0] < 2 or t[-1] <= t[0]:
        return None
    seconds: np.ndarray = ((t - t[0]) / 1e6).astype(np.float32)
    return seconds


def _fragmentation(cols: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """Share of the cached free memory that lies outside the largest free block (0 = one piece)."""
    if "fragmentation" in cols:
        return cols["fragmentation"]
    largest = cols.get("largest_free")
    if largest is None or "allocated" not in cols:
        return None
    cached = cols.get("cached_free")
    if cached is None:
        cached = cols["reserved"] - cols["allocated"]
    with np.errstate(divide="ignore", invalid="ignore"):
        frag = np.where(cached > 0, 1.0 - np.minimum(largest, cached) / cached, 0.0)
    return np.clip(frag, 0.0, 1.0)


def _minmax_indices(key: np.ndarray, keep: Iterable[int], budget: int) -> np.ndarray:
    """Indices keeping each bucket's first point, min and max of ``key``, and ``keep``: peaks survive."""
    n = key.shape[0]
    if n <= budget:
        return np.arange(n)
    starts = np.unique(np.linspace(0, n, max(1, budget // 3) + 1).astype(np.int64)[:-1])
    bucket = np.searchsorted(starts, np.arange(n), side="right") - 1
    picks = [starts, np.array([n - 1], dtype=np.int64), np.asarray(list(keep), dtype=np.int64)]
    for extreme in (np.minimum.reduceat(key, starts), np.maximum.reduceat(key, starts)):
        hits = np.nonzero(key == extreme[bucket])[0]
        first = np.full(starts.shape[0], n, dtype=np.int64)
        np.minimum.at(first, bucket[hits], hits)
        picks.append(first[first < n])
    return np.unique(np.concatenate(picks))


def _timeline_chart(dev: Device) -> Any:
    cols = timeline_columns(dev.timeline)
    if cols is None or cols["reserved"].shape[0] < 2:
        return None  # no history (enabled="state"): one point is not a timeline
    oom = dev.oom
    # x is the event index, not time: a run spends seconds loading before its first step and
    # milliseconds per allocation burst after; by events, the steps get the width.
    x = cols["event_index"]
    t0 = math.nan
    data = _timeline_data(dev, cols)
    # Named so static/js/explore.js finds them (zoom detail replaces the data; a tap asks for the state).
    source = ColumnDataSource(data, name="timeline-source")

    limit = oom.limit_bytes if oom else None
    top = max(float(np.max(data["reserved"])), float(limit or 0))
    # The wheel zooms the time axis (as in memory_viz); the y axis stays from zero to the limit.
    p = _figure("Memory over time", height=330, tools="pan,xwheel_zoom,box_zoom,reset,save")
    p.toolbar.active_scroll = p.select_one({"type": WheelZoomTool})
    # A fixed range, not a DataRange1d: when explore.js swaps in a zoomed window's data, an automatic
    # range would spring back to the step bands' full extent.
    p.x_range = Range1d(start=float(x[0]), end=float(x[-1]), bounds=(float(x[0]), float(x[-1])))
    p.y_range = Range1d(start=0, end=top * 1.08 if top > 0 else 1)
    _bytes_ticks(p.yaxis)
    p.yaxis.axis_label = "bytes"

    _step_bands(p, dev.steps, t0, x, cols, top * 1.08)

    lines = []
    for key, colour, label, width in (
        ("reserved", RESERVED, "reserved", 2.2),
        ("allocated", ALLOCATED, "allocated", 1.6),
        ("requested", REQUESTED, "requested", 1.2),
        ("largest_free", LARGEST_FREE, "largest free block", 1.2),
    ):
        if key in data:
            lines.append(p.line("x", key, source=source, color=colour, line_width=width, legend_label=label))

    if oom:
        _mark_oom(p, oom, t0, x, cols)
    if limit:
        _mark_limit(p, limit)
    p.add_tools(HoverTool(renderers=lines[:1], mode="vline", tooltips=_timeline_tooltips(data)))
    p.name = "timeline-figure"
    # The event selected in the page's event list (static/js/explore.js moves it and shows it).
    p.add_layout(
        Span(
            location=float(x[0]),
            dimension="height",
            line_color=CURSOR_COLOUR,
            line_width=1.5,
            visible=False,
            name="timeline-cursor",
        )
    )
    _legend(p, outside=True)
    if dev.summary.peak_is_lower_bound:
        p.title.text += " (trace incomplete: peaks are lower bounds)"

    if "fragmentation" not in data:
        p.xaxis.axis_label = TIMELINE_X_LABEL
        p.xaxis.formatter = NumeralTickFormatter(format="0,0")
        return p
    q = _fragmentation_chart(p, source, oom, t0, x, cols)
    p.xaxis.visible = False
    return column(p, q, sizing_mode="stretch_width")


def _timeline_data(dev: Device, cols: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The timeline's columns, at most ``MAX_TIMELINE_POINTS`` rows: both peaks kept, and each
    bucket's first point, min and max (a spike survives the thinning)."""
    keep: list[int] = [int(np.argmax(cols["reserved"]))]
    if "allocated" in cols:
        keep.append(int(np.argmax(cols["allocated"])))
    idx = _minmax_indices(cols["reserved"], keep, MAX_TIMELINE_POINTS)
    # Event numbers fit int32: half the bytes of float64.
    data: dict[str, Any] = {"x": cols["event_index"][idx].astype(np.int32)}
    seconds = _seconds(cols)
    if seconds is not None:
        data["t"] = seconds[idx]
    for key in ("reserved", "allocated", "requested", "largest_free"):
        if key in cols:
            data[key] = cols[key][idx]
    frag = _fragmentation(cols)
    if frag is not None:
        data["fragmentation"] = frag[idx].astype(np.float32)
    what = _event_texts(dev.timeline, idx) if dev.timeline is not None else None
    if what is not None:
        data["what"] = what
    return data


def _mark_limit(p: Any, limit: int) -> None:
    """The device's limit (the OOM's total capacity) as a dashed line, labelled at the left."""
    p.add_layout(
        Span(location=float(limit), dimension="width", line_color=LIMIT_COLOUR, line_dash="dashed", line_width=1.2)
    )
    p.add_layout(
        Label(
            x=5,
            y=float(limit),
            x_units="screen",
            text=f"limit {format_bytes(limit)}",
            text_font_size="11px",
            text_color=LIMIT_COLOUR,
            y_offset=3,
        )
    )


def _timeline_tooltips(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The timeline's hover lines, one per column it has (bytes formatted in the browser)."""
    tooltips = [("event", "@x{0,0}")]
    if "what" in data:
        tooltips.append(("what", "@what"))
    if "t" in data:
        tooltips.append(("time", "@t{0,0.000} s after the first event"))
    for key, label in (
        ("reserved", "reserved"),
        ("allocated", "allocated"),
        ("requested", "requested"),
        ("largest_free", "largest free block"),
    ):
        if key in data:
            tooltips.append((label, f"@{key}{{0.00 b}} (@{key}{{0,0}} B)"))
    if "fragmentation" in data:
        tooltips.append(("fragmentation", "@fragmentation{0.0%}"))
    return tooltips


def _fragmentation_chart(
    p: Any, source: ColumnDataSource, oom: Oom | None, t0: float, x: np.ndarray, cols: Mapping[str, np.ndarray]
) -> Any:
    """The fragmentation index under the timeline ``p``, sharing its x range (and its OOM mark)."""
    q = _figure(
        "Fragmentation index: share of cached free memory outside the largest free block", height=170, x_range=p.x_range
    )
    q.y_range = Range1d(start=0, end=1.02)
    q.yaxis.formatter = NumeralTickFormatter(format="0%")
    q.xaxis.axis_label = TIMELINE_X_LABEL
    q.xaxis.formatter = NumeralTickFormatter(format="0,0")  # 2,500,000 rather than 2.500e+6
    fr = q.line("x", "fragmentation", source=source, color=FRAGMENTATION, line_width=1.4)
    q.varea(x="x", y1=0, y2="fragmentation", source=source, color=FRAGMENTATION, alpha=0.15)
    if oom:
        _mark_oom(q, oom, t0, x, cols, label=False)
    q.add_tools(
        HoverTool(
            renderers=[fr], mode="vline", tooltips=[("event", "@x{0,0}"), ("fragmentation", "@fragmentation{0.0%}")]
        )
    )
    return q


@functools.lru_cache(maxsize=16)
def _active_chart_json(device: int) -> str:
    source = ColumnDataSource(
        {k: [] for k in ("xs", "ys", "size", "size_text", "label", "alloc_event", "free_event", "colour")},
        name="active-source",
    )
    p = _figure(
        "Active memory: each live allocation a band, stacked in the order they were made (click the timeline)",
        height=300,
        tools="pan,xwheel_zoom,box_zoom,reset,save",
    )
    p.name = "active-figure"
    # Fixed ranges, set by static/js/explore.js from each answer: an automatic range over the empty
    # source would make BokehJS warn "could not set initial ranges" on every page.
    p.x_range = Range1d(start=0, end=1)
    p.y_range = Range1d(start=0, end=1)
    _bytes_ticks(p.yaxis)
    p.xaxis.axis_label = "trace event (follows the timeline's range)"
    p.xaxis.formatter = NumeralTickFormatter(format="0,0")
    r = p.patches("xs", "ys", source=source, fill_color="colour", line_color="white", line_width=0.3, fill_alpha=0.85)
    p.add_tools(
        HoverTool(
            renderers=[r],
            tooltips=[
                ("size", "@size_text (@size{0,0} B)"),
                ("stack", "@label"),
                ("allocated at event", "@alloc_event{0,0}"),
                ("freed at event", "@free_event"),
            ],
        )
    )
    return json.dumps(json_item(p))


def active_chart_item(device: int) -> dict[str, Any]:
    """The active-memory chart of a device, empty: static/js/explore.js fills it from active.json."""
    item: dict[str, Any] = json.loads(_active_chart_json(device))
    return item


@functools.lru_cache(maxsize=16)
def _segment_time_chart_json(device: int) -> str:
    source = ColumnDataSource(
        {k: [] for k in ("xs", "ys", "size", "size_text", "address", "alloc_event", "free_event", "colour")},
        name="segtime-source",
    )
    p = _figure(
        "Segments over time: each cached segment a band while it exists, stacked in the order they were made",
        height=260,
        tools="pan,xwheel_zoom,box_zoom,reset,save",
    )
    p.name = "segtime-figure"
    p.x_range = Range1d(start=0, end=1)  # set by explore.js from each answer (see _active_chart_json)
    p.y_range = Range1d(start=0, end=1)
    _bytes_ticks(p.yaxis)
    p.xaxis.axis_label = "trace event (follows the timeline's range)"
    p.xaxis.formatter = NumeralTickFormatter(format="0,0")
    r = p.patches("xs", "ys", source=source, fill_color="colour", line_color="white", line_width=0.5, fill_alpha=0.8)
    p.add_tools(
        HoverTool(
            renderers=[r],
            tooltips=[
                ("segment", "@address, @size_text (@size{0,0} B)"),
                ("made at event", "@alloc_event{0,0}"),
                ("released at event", "@free_event"),
            ],
        )
    )
    return json.dumps(json_item(p))


def segment_time_chart_item(device: int) -> dict[str, Any]:
    """The segment timeline of a device, empty: static/js/explore.js fills it from segments.json."""
    item: dict[str, Any] = json.loads(_segment_time_chart_json(device))
    return item


def _event_texts(timeline: Timeline, idx: np.ndarray) -> list[str] | None:
    """Per plotted point, what the event was and where (the report's ``event_*`` series)."""
    actions, sizes, groups = timeline.event_action, timeline.event_size, timeline.event_group
    if not (isinstance(actions, list) and isinstance(sizes, list) and isinstance(groups, list)):
        return None
    if not len(actions) == len(sizes) == len(groups) or (len(actions) and int(idx.max()) >= len(actions)):
        return None
    labels = timeline.stack_labels
    return [
        event_text(str(actions[i]), int(sizes[i]), str(labels.get(str(groups[i]), "")) if groups[i] >= 0 else "")
        for i in idx.tolist()
    ]


def _x_of(time_us: Any, event_index: Any, t0: float, x: np.ndarray, cols: Mapping[str, np.ndarray]) -> float | None:
    """Where a moment lies on the chart's x axis."""
    if not math.isnan(t0):
        if time_us is None:
            return None
        return (float(time_us) - t0) / 1e6
    if event_index is not None:
        return float(event_index)
    if time_us is not None and "time_us" in cols:
        pos = int(np.searchsorted(cols["time_us"], float(time_us)))
        return float(x[min(pos, x.shape[0] - 1)])
    return None


def _mark_oom(p: Any, oom: Oom, t0: float, x: np.ndarray, cols: Mapping[str, np.ndarray], label: bool = True) -> None:
    at = _x_of(oom.time_us, oom.event_index, t0, x, cols)
    if at is None:
        return
    p.add_layout(Span(location=at, dimension="height", line_color=OOM_COLOUR, line_width=2, line_dash="dotted"))
    if not label:
        return
    src = ColumnDataSource(
        {
            "x": [at],
            "y": [float(oom.reserved_bytes or 0)],
            "requested": [float(oom.requested_bytes or 0)],
            "reserved": [float(oom.reserved_bytes or 0)],
            "allocated": [float(oom.allocated_bytes or 0)],
            "largest": [float(oom.largest_free_block_bytes or 0)],
        }
    )
    r = p.scatter("x", "y", source=src, marker="x", size=14, line_width=3, color=OOM_COLOUR)
    p.add_tools(
        HoverTool(
            renderers=[r],
            tooltips=[
                ("OOM", "asked @requested{0.00 b} (@requested{0,0} B)"),
                ("reserved", "@reserved{0.00 b}"),
                ("allocated", "@allocated{0.00 b}"),
                ("largest free block", "@largest{0.00 b}"),
            ],
        )
    )
    p.add_layout(
        Label(
            x=at,
            y=float(oom.reserved_bytes or 0),
            text=f"OOM: asked {format_bytes(oom.requested_bytes)}",
            text_color=OOM_COLOUR,
            text_font_size="12px",
            text_font_style="bold",
            x_offset=-10,
            y_offset=-6,
            text_align="right",
            text_baseline="top",
        )
    )


def _step_bands(
    p: Any, steps: Sequence[Step], t0: float, x: np.ndarray, cols: Mapping[str, np.ndarray], top: float
) -> None:
    """Every other step shaded, so steps read as bands behind the lines."""
    if not steps:
        return
    left, right, index = [], [], []
    for i, step in enumerate(steps[:MAX_STEP_BANDS]):
        a = _x_of(step.start_us, step.first_event, t0, x, cols)
        b = _x_of(step.end_us, step.last_event, t0, x, cols)
        if a is None or b is None or i % 2:
            continue
        left.append(a)
        right.append(b)
        index.append(float(i if step.index is None else step.index))
    if not left:
        return
    src = ColumnDataSource({"left": left, "right": right, "step": index})
    p.quad(
        left="left",
        right="right",
        bottom=0,
        top=top,
        source=src,
        color=STEP_BAND,
        alpha=0.8,
        line_alpha=0,
        legend_label="steps (every other shaded)",
    )


# ---------------------------------------------------------------- segment maps


def _peak_map_key(dev: Device) -> str:
    return "reserved_peak" if "reserved_peak" in dev.segment_maps else "peak"


def _segment_map_chart(dev: Device, moment: str) -> Any:
    """Segments as rows (largest on top), blocks as boxes along each row, coloured by state.

    The report's map (``segment_maps.peak`` / ``.oom``) gives per segment its size
    and blocks as ``{offset, size, requested, state, count, stack}`` where ``stack``
    is a group id named in the map's ``labels``; unmapped parts of expandable
    segments are the gaps between blocks.
    """
    snap = dev.segment_maps.get(moment)
    if snap is None or not snap.segments:
        return None
    segments = sorted(snap.segments, key=lambda sg: -_numeric(sg.size))
    total = int(snap.segments_total or len(segments))
    segments = segments[:MAX_SEGMENT_ROWS]
    hidden = max(0, total - len(segments))
    cols, row_labels = _segment_map_columns(segments, snap.labels)

    rows = len(segments)
    widest = max(_numeric(sg.size) for sg in segments) / 2**20
    dense = rows > 60  # rows too thin for a label each: hover names the segment instead
    p = _figure(
        _segment_map_title(snap, moment, hidden),
        height=min(SEGMENT_MAP_MAX_PX, 90 + (5 if dense else 15) * rows),
        y_range=Range1d(start=rows - 0.5, end=-0.5),
        x_range=Range1d(start=0, end=widest * 1.01, bounds=(0, widest * 1.01)),
    )
    if dense:
        p.yaxis.axis_label = f"{rows} segments, largest on top"
        p.yaxis.major_label_text_font_size = "0px"
        p.yaxis.major_tick_line_color = None
        p.yaxis.minor_tick_line_color = None
    else:
        p.yaxis.ticker = list(range(rows))
        p.yaxis.major_label_overrides = row_labels
        p.yaxis.major_label_text_font_size = "11px"
    p.xaxis.axis_label = "offset in segment (MiB)"
    p.ygrid.visible = False
    _draw_segment_blocks(p, cols)
    _legend(p, location="bottom_right")
    return p


def _segment_map_columns(
    segments: Sequence[Segment], labels: Mapping[str, str]
) -> tuple[dict[str, list[Any]], dict[int, str]]:
    """(one column list per block field, each row's label) of the drawn segments, row = index."""
    # Too many blocks to draw: merge neighbours of one state, smallest first, per segment.
    per_segment_budget = max(8, MAX_SEGMENT_BLOCKS // len(segments))
    merge = sum(len(sg.blocks) for sg in segments) > MAX_SEGMENT_BLOCKS
    cols: dict[str, list[Any]] = {
        k: [] for k in ("x", "y", "w", "state", "size", "requested", "stack", "count", "segment")
    }
    row_labels: dict[int, str] = {}
    for row, seg in enumerate(segments):
        seg_size = _numeric(seg.size)
        kind = seg.type or ""
        row_labels[row] = f"{format_bytes(seg_size)} {kind}{' exp.' if seg.expandable else ''}".strip()
        blocks = _block_rows(seg, seg_size, labels)
        if merge and len(blocks) > per_segment_budget:
            blocks = _merge_blocks(blocks, per_segment_budget)
        for blk in blocks:
            cols["x"].append((blk["offset"] + blk["size"] / 2) / 2**20)
            cols["w"].append(blk["size"] / 2**20)
            cols["y"].append(row)
            cols["state"].append(STATE_LABELS.get(blk["state"], blk["state"]))
            cols["size"].append(blk["size"])
            cols["requested"].append(blk["requested"])
            # Labels repeat per block and JSON has no string sharing: keep them short.
            label = blk["stack"]
            cols["stack"].append(label if len(label) <= MAX_LABEL else label[: MAX_LABEL - 1] + "…")
            cols["count"].append(blk["count"])
            cols["segment"].append(seg_size)
    return cols, row_labels


def _segment_map_title(snap: SegmentMap, moment: str, hidden: int) -> str:
    """The map's title: its moment and event, and what was left out."""
    when = {"peak": "allocated peak", "reserved_peak": "reserved peak"}.get(moment, "OOM")
    at = snap.event_index
    title = f"Segments at the {when}" + (f" (event {at:,})" if isinstance(at, int) else "")
    if hidden:
        hidden_bytes = snap.hidden_bytes
        title += f"; {hidden} smaller segments not drawn" + (f" ({format_bytes(hidden_bytes)})" if hidden_bytes else "")
    return title


def _draw_segment_blocks(p: Any, cols: Mapping[str, list[Any]]) -> None:
    """The blocks as boxes, one renderer per state, and their hover."""
    # Sizes stay float64 (exact bytes in hover); positions only draw, float32 is plenty.
    src = ColumnDataSource(
        {
            "x": np.asarray(cols["x"], np.float32),
            "w": np.asarray(cols["w"], np.float32),
            "y": np.asarray(cols["y"], np.int32),
            "size": np.asarray(cols["size"], np.float64),
            "requested": np.asarray(cols["requested"], np.float64),
            "count": np.asarray(cols["count"], np.int32),
            "segment": np.asarray(cols["segment"], np.float64),
            "state": cols["state"],
            "stack": cols["stack"],
        }
    )
    # One renderer per state (a filtered view of the one source): the legend can hide a state.
    renderers = []
    for state in ("active_allocated", "active_pending_free", "inactive", "mixed", "unmapped"):
        label = STATE_LABELS[state]
        if label not in cols["state"]:
            continue
        view = CDSView(filter=GroupFilter(column_name="state", group=label))
        renderers.append(
            p.rect(
                x="x",
                y="y",
                width="w",
                height=0.8,
                source=src,
                view=view,
                fill_color=STATE_COLOURS[state],
                line_color="#555555",
                line_width=0.4,
                legend_label=label,
            )
        )
    p.add_tools(
        HoverTool(
            renderers=renderers,
            tooltips=[
                ("segment", "@segment{0.00 b} (row @y)"),
                ("state", "@state"),
                ("size", "@size{0.00 b} (@size{0,0} B)"),
                ("requested", "@requested{0.00 b} (@requested{0,0} B)"),
                ("blocks", "@count{0,0}"),
                ("stack", "@stack"),
            ],
        )
    )


def _block_rows(seg: Segment, seg_size: int, labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """Blocks of one segment by offset, with the unmapped gaps (expandable segments) filled in."""
    rows: list[dict[str, Any]] = []
    cursor = 0
    seg_addr = _numeric(seg.address)
    for blk in sorted(seg.blocks, key=lambda b: _int(b, "offset")):
        size = _int(blk, "size")
        offset = _int(blk, "offset") if "offset" in blk else (_int(blk, "address") - seg_addr if seg_addr else cursor)
        if offset > cursor:
            rows.append(_gap(cursor, offset - cursor))
        rows.append(
            {
                "offset": offset,
                "size": size,
                "requested": _int(blk, "requested", "requested_size"),
                "state": str(blk.get("state") or "inactive"),
                "stack": _stack_label(blk, labels),
                "count": max(1, _int(blk, "count")),
            }
        )
        cursor = max(cursor, offset + size)
    if seg_size > cursor and rows:
        rows.append(_gap(cursor, seg_size - cursor))
    return rows


def _gap(offset: int, size: int) -> dict[str, Any]:
    return {"offset": offset, "size": size, "requested": 0, "state": "unmapped", "stack": "", "count": 1}


def _merge_blocks(blocks: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """Merge neighbouring blocks of one state, smallest first, until about ``budget`` remain."""
    threshold = sorted(b["size"] for b in blocks)[max(0, len(blocks) - budget)]
    merged: list[dict[str, Any]] = []
    for blk in blocks:
        last = merged[-1] if merged else None
        if (
            last is not None
            and last["state"] == blk["state"]
            and blk["size"] <= threshold
            and last["offset"] + last["size"] == blk["offset"]
        ):
            last["size"] += blk["size"]
            last["requested"] += blk["requested"]
            last["count"] += blk["count"]
            if last["stack"] != blk["stack"]:
                last["stack"] = "several stacks"
        else:
            merged.append(dict(blk))
    return merged


def _stack_label(block: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    stack = block.get("stack")
    if isinstance(stack, int) and not isinstance(stack, bool):
        return str(labels.get(str(stack), "")) if stack >= 0 else ""
    for key in ("stack_label", "label", "site", "stack"):
        value = block.get(key)
        if isinstance(value, str):
            return value
    frames = block.get("frames")
    if isinstance(frames, list) and frames:
        return frame_label(frames[0])
    return ""


# ---------------------------------------------------------------- top stacks (icicle)


def _icicle_chart(dev: Device) -> Any:
    """The top stacks of the OOM (or the allocated peak) as an icicle: outermost frame on top,
    each frame's box as wide as its share of the bytes."""
    stacks = dev.top_stacks
    moment = "oom" if any(s.when == "oom" for s in stacks) else "peak"
    chosen = [s for s in stacks if s.when == moment and _numeric(s.bytes) > 0]
    if not chosen:
        return None
    nodes, order = _stack_tree(chosen)
    total = float(sum(_numeric(s.bytes) for s in chosen))
    cols = _icicle_columns(nodes, order, total)
    levels = int(max(len(k) for k in nodes))
    when = "the OOM" if moment == "oom" else "the allocated peak"
    p = _figure(
        f"Who holds memory at {when}: top stacks by bytes (outermost frame on top)",
        height=min(700, 60 + 30 * min(levels, MAX_ICICLE_DEPTH)),
        tools="pan,wheel_zoom,box_zoom,reset,save",
        x_range=Range1d(start=0, end=1, bounds=(0, 1)),
        y_range=Range1d(start=-float(levels), end=0.05),
    )
    p.axis.visible = False
    p.grid.visible = False
    src = ColumnDataSource(
        {k: np.asarray(v, dtype=np.float64) if k not in ("label", "text", "colour") else v for k, v in cols.items()}
    )
    r = p.quad(
        left="left",
        right="right",
        bottom="bottom",
        top="top",
        source=src,
        fill_color="colour",
        line_color="white",
        line_width=1,
    )
    p.text(
        x="tx",
        y="top",
        text="text",
        source=src,
        text_font_size="10px",
        text_baseline="top",
        y_offset=3,
        text_color="#222222",
    )
    p.add_tools(
        HoverTool(
            renderers=[r],
            tooltips=[
                ("frame", "@label"),
                ("bytes", "@bytes{0.00 b} (@bytes{0,0} B)"),
                ("share of top stacks", "@share{0.0%}"),
                ("allocations", "@count{0,0}"),
            ],
        )
    )
    return p


_StackPath = tuple[str, ...]


def _stack_tree(chosen: Sequence[StackRow]) -> tuple[dict[_StackPath, list[float]], list[_StackPath]]:
    """(path -> [bytes, allocations], the paths in first-seen order): the stacks merged into one tree
    keyed by the path from the outermost frame (the report's frames are innermost first)."""
    nodes: dict[_StackPath, list[float]] = {}
    order: list[_StackPath] = []
    for s in chosen:
        path = [frame_label(f) for f in reversed(s.frames)] or [str(s.label or "(no frames)")]
        if len(path) > MAX_ICICLE_DEPTH:
            path = [*path[: MAX_ICICLE_DEPTH - 1], f"... {len(path) - MAX_ICICLE_DEPTH + 1} more frames"]
        for depth in range(1, len(path) + 1):
            key = tuple(path[:depth])
            if key not in nodes:
                nodes[key] = [0.0, 0.0]
                order.append(key)
            nodes[key][0] += _numeric(s.bytes)
            nodes[key][1] += _numeric(s.count)
    return nodes, order


def _icicle_columns(
    nodes: Mapping[_StackPath, list[float]], order: Sequence[_StackPath], total: float
) -> dict[str, list[Any]]:
    """The icicle's boxes, breadth first (at most ``MAX_ICICLE_NODES``): children of a node sit
    under it, biggest first, each as wide as its share of ``total``."""
    children: dict[_StackPath, list[_StackPath]] = {}
    for key in order:
        children.setdefault(key[:-1], []).append(key)
    cols: dict[str, list[Any]] = {
        k: [] for k in ("left", "right", "bottom", "top", "label", "text", "bytes", "count", "share", "colour", "tx")
    }
    palette = ("#f2c18d", "#f5a65b", "#e8894a", "#f3d28e", "#e9b872", "#d9a05b")
    queue: list[tuple[_StackPath, float]] = [((), 0.0)]
    drawn = 0
    while queue and drawn < MAX_ICICLE_NODES:
        parent, x0 = queue.pop(0)
        for key in sorted(children.get(parent, []), key=lambda k: -nodes[k][0]):
            size, count = nodes[key]
            depth = len(key) - 1
            width = size / total
            cols["left"].append(x0)
            cols["right"].append(x0 + width)
            cols["top"].append(-float(depth))
            cols["bottom"].append(-float(depth) - 0.92)
            cols["label"].append(key[-1])
            cols["tx"].append(x0 + 0.004)
            # Text only where the box is wide enough to hold some of it; hover has the rest.
            room = int(width * 150)
            cols["text"].append(key[-1] if room >= len(key[-1]) else (key[-1][: room - 1] + "…" if room > 6 else ""))
            cols["bytes"].append(size)
            cols["count"].append(count)
            cols["share"].append(width)
            # The same function (its name before " (file:line)") keeps its colour wherever it appears.
            cols["colour"].append(
                palette[zlib.crc32(key[-1].split(" (")[0].encode()) % len(palette)] if depth else "#c9d6ea"
            )
            queue.append((key, x0))
            x0 += width
            drawn += 1
    return cols


# ---------------------------------------------------------------- what-if


def _whatif_chart(dev: Device) -> Any:
    whatif = dev.whatif
    if not whatif:
        return None
    names = ["recorded run"] + [str(w.config or "(defaults)") for w in whatif]
    peaks = [dev.summary.peak_reserved_bytes] + [w.peak_reserved_bytes for w in whatif]
    # Step level where the report projected the failing step: a request that fits helps
    # nobody if the step dies a few allocations later (analysis/projection.py).
    avoided = [w.step_completes if w.step_completes is not None else w.oom_avoided for w in whatif]
    verdicts = ["recorded"] + [
        "OOM avoided" if a is True else "still OOM" if a is False else "no OOM to avoid" for a in avoided
    ]
    colours = [RESERVED] + [
        "#55a868" if v == "OOM avoided" else "#c44e52" if v == "still OOM" else "#8c8c8c" for v in verdicts[1:]
    ]
    source = ColumnDataSource({"config": names, "peak": _floats(peaks), "verdict": verdicts, "colour": colours})
    p = _figure(
        "Peak reserved per setting",
        height=max(320, 60 + 36 * len(names)),
        y_range=list(reversed(names)),
        tools="save,reset",
    )
    p.hbar(y="config", right="peak", height=0.6, source=source, fill_color="colour", line_color=None)
    _bytes_ticks(p.xaxis)
    p.x_range.start = 0
    limit = dev.oom.limit_bytes if dev.oom else None
    if limit:
        p.add_layout(
            Span(location=float(limit), dimension="height", line_color=LIMIT_COLOUR, line_dash="dashed", line_width=1.5)
        )
        p.title.text += f" (dashed: the limit, {format_bytes(limit)})"
    p.add_tools(
        HoverTool(tooltips=[("config", "@config"), ("peak reserved", "@peak{0.00 b} (@peak{0,0} B)"), ("", "@verdict")])
    )
    return p


def _whatif_steps_chart(dev: Device) -> Any:
    steps = dev.steps
    whatif = [w for w in dev.whatif if w.steps]
    if not steps or not whatif:
        return None
    p = _figure("Reserved at each step's end", height=320)
    _bytes_ticks(p.yaxis)
    p.xaxis.axis_label = "step"
    series = [("recorded run", [(s.index, s.reserved_end_bytes) for s in steps], RESERVED, "solid")]
    for i, w in enumerate(whatif):
        pairs = [(s.index, s.reserved_end_bytes) for s in w.steps]
        series.append((str(w.config or "(defaults)"), pairs, WHATIF_COLOURS[i % len(WHATIF_COLOURS)], "dashed"))
    hover = []
    for name, pairs, colour, dash in series:
        pairs = [(k, v) for k, v in pairs if k is not None and v is not None]
        if not pairs:
            continue
        src = ColumnDataSource(
            {
                "step": _floats(k for k, _ in pairs),
                "reserved": _floats(v for _, v in pairs),
                "config": [name] * len(pairs),
            }
        )
        hover.append(
            p.line("step", "reserved", source=src, color=colour, line_width=2, line_dash=dash, legend_label=name)
        )
        p.scatter("step", "reserved", source=src, color=colour, size=4, legend_label=name)
    limit = dev.oom.limit_bytes if dev.oom else None
    if limit:
        p.add_layout(Span(location=float(limit), dimension="width", line_color=LIMIT_COLOUR, line_dash="dashed"))
    p.add_tools(
        HoverTool(
            renderers=hover,
            tooltips=[
                ("config", "@config"),
                ("step", "@step{0}"),
                ("reserved", "@reserved{0.00 b} (@reserved{0,0} B)"),
            ],
        )
    )
    _legend(p, outside=True)
    return p


# ---------------------------------------------------------------- helpers


def _figure(title: str, *, height: int, tools: str = TOOLS, **kwargs: Any) -> Any:
    p = figure(title=title, height=height, sizing_mode="stretch_width", tools=tools, toolbar_location="above", **kwargs)
    cast(Title, p.title).text_font_size = "13px"
    p.toolbar.logo = None
    p.outline_line_color = None
    p.min_border_left = 60
    return p


def _bytes_axis() -> NumeralTickFormatter:
    # A new model each time: a Bokeh model belongs to one document only.
    return NumeralTickFormatter(format="0.[0] b")


def _bytes_ticks(axis: Any) -> None:
    """Ticks at binary steps (256 MiB, 1 GiB, 1.5 GiB ...) labelled in binary units."""
    axis.ticker = AdaptiveTicker(base=2, mantissas=[1, 1.5], min_interval=1, num_minor_ticks=2)
    axis.formatter = _bytes_axis()


def _legend(p: Any, location: str = "top_left", outside: bool = False) -> None:
    """Clickable legend (hides a series); ``outside`` puts it right of the plot, off the data."""
    if not p.legend:
        return
    if outside:
        legend = p.legend[0]
        p.center.remove(legend)  # figure() put it inside; move it to the right panel
        p.add_layout(legend, "right")
    else:
        p.legend.location = location
    p.legend.click_policy = "hide"
    p.legend.label_text_font_size = "11px"
    p.legend.background_fill_alpha = 0.75
    p.legend.spacing = 0
    p.legend.padding = 4
    if isinstance(p.legend, Legend):
        p.legend.orientation = "vertical"


def _floats(values: Iterable[Any]) -> np.ndarray:
    return np.asarray([math.nan if v is None else float(v) for v in values], dtype=np.float64)


def _int(d: Mapping[str, Any], *keys: str) -> int:
    """The first of ``keys`` holding a number (addresses may come as "0x..." strings); else 0."""
    for key in keys:
        value = _number_or_none(d.get(key))
        if value is not None:
            return value
    return 0


def _number_or_none(value: Any) -> int | None:
    """A number, or an address written as a "0x..." string, as an int; None for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str) and value.startswith("0x"):
        try:
            return int(value, 16)
        except ValueError:
            return None
    return None


def _numeric(value: Any) -> int:
    """A typed section's number (a size, a count, an address that may be a "0x..." string); 0 for none."""
    number = _number_or_none(value)
    return 0 if number is None else number


def _first_device(report: Report) -> Device | None:
    return report.devices[0] if report.devices else None


def _run_label(row: Mapping[str, Any], i: int) -> str:
    return str(row.get("run") or row.get("filename") or f"#{i + 1}")


def inline_bokehjs() -> str:
    """BokehJS's source for a standalone page, from the installed package (only the core bundle:
    the charts use no widgets, tables, WebGL or MathJax)."""
    from bokeh.resources import Resources

    return "\n".join(Resources(mode="inline", components=["bokeh"]).js_raw)


def _item(model: Any) -> dict[str, Any]:
    """``json_item`` as the plain dict the pages and the database store (bokeh types it as a TypedDict)."""
    return cast(dict[str, Any], json_item(model))
