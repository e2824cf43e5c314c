"""The two charts drawn empty for ``static/js/explore.js`` to fill: active memory, and segments over time.

The page fills them from the digging endpoints: ``active.json`` and ``segments.json``.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from bokeh.embed import json_item
from bokeh.models import ColumnDataSource, HoverTool, NumeralTickFormatter, Range1d

from webapp.snapshots.pages.charts.common import bytes_ticks, new_figure


@functools.lru_cache(maxsize=16)
def _active_chart_json(device: int) -> str:
    source = ColumnDataSource(
        {k: [] for k in ("xs", "ys", "size", "size_text", "label", "alloc_event", "free_event", "colour")},
        name="active-source",
    )
    p = new_figure(
        "Active memory: each live allocation a band, stacked in the order they were made (click the timeline)",
        height=300,
        tools="pan,xwheel_zoom,box_zoom,reset,save",
    )
    p.name = "active-figure"
    # Fixed ranges, set by static/js/explore.js from each answer: an automatic range over the empty
    # source would make BokehJS warn "could not set initial ranges" on every page.
    p.x_range = Range1d(start=0, end=1)
    p.y_range = Range1d(start=0, end=1)
    bytes_ticks(p.yaxis)
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
    p = new_figure(
        "Segments over time: each cached segment a band while it exists, stacked in the order they were made",
        height=260,
        tools="pan,xwheel_zoom,box_zoom,reset,save",
    )
    p.name = "segtime-figure"
    p.x_range = Range1d(start=0, end=1)  # set by explore.js from each answer (see _active_chart_json)
    p.y_range = Range1d(start=0, end=1)
    bytes_ticks(p.yaxis)
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
