"""The timeline: memory over the trace's events, the steps as bands, the OOM and the limit marked.

Reserved, allocated, requested and the largest free block as lines; the fragmentation index under them, on
the same x axis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from bokeh.layouts import column
from bokeh.models import ColumnDataSource, HoverTool, NumeralTickFormatter, Range1d, WheelZoomTool
from bokeh.models.annotations import Label, Span  # typed here; bokeh.models re-exports them untyped

from analysis.contract import Device, Oom, Step, Timeline
from webapp.snapshots.pages.charts.common import (
    ALLOCATED,
    CURSOR_COLOUR,
    FRAGMENTATION,
    LARGEST_FREE,
    LIMIT_COLOUR,
    MAX_STEP_BANDS,
    MAX_TIMELINE_POINTS,
    OOM_COLOUR,
    REQUESTED,
    RESERVED,
    STEP_BAND,
    TIMELINE_X_LABEL,
    bytes_ticks,
    minmax_indices,
    new_figure,
    place_legend,
)
from webapp.snapshots.pages.formatting import event_text, format_bytes


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


def timeline_chart(dev: Device) -> Any:
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
    p = new_figure("Memory over time", height=330, tools="pan,xwheel_zoom,box_zoom,reset,save")
    p.toolbar.active_scroll = p.select_one({"type": WheelZoomTool})
    # A fixed range, not a DataRange1d: when explore.js swaps in a zoomed window's data, an automatic
    # range would spring back to the step bands' full extent.
    p.x_range = Range1d(start=float(x[0]), end=float(x[-1]), bounds=(float(x[0]), float(x[-1])))
    p.y_range = Range1d(start=0, end=top * 1.08 if top > 0 else 1)
    bytes_ticks(p.yaxis)
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
    place_legend(p, outside=True)
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
    idx = minmax_indices(cols["reserved"], keep, MAX_TIMELINE_POINTS)
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
    q = new_figure(
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
