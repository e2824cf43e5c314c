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


def _empty_bands_json(
    name: str, title: str, height: int, fields: tuple[str, ...], band: tuple[float, float], tooltips: list[Any]
) -> str:
    """A chart of bands (``patches`` over xs/ys, coloured per band) with no data: explore.js sets its source's
    data and its ranges from each answer. ``band``: the bands' outline width and fill alpha."""
    source = ColumnDataSource({k: [] for k in ("xs", "ys", *fields, "colour")}, name=f"{name}-source")
    p = new_figure(title, height=height, tools="pan,xwheel_zoom,box_zoom,reset,save")
    p.name = f"{name}-figure"
    # Fixed ranges, set by static/js/explore.js from each answer: an automatic range over the empty
    # source would make BokehJS warn "could not set initial ranges" on every page.
    p.x_range = Range1d(start=0, end=1)
    p.y_range = Range1d(start=0, end=1)
    bytes_ticks(p.yaxis)
    p.xaxis.axis_label = "trace event (follows the timeline's range)"
    p.xaxis.formatter = NumeralTickFormatter(format="0,0")
    line_width, alpha = band
    r = p.patches(
        "xs", "ys", source=source, fill_color="colour", line_color="white", line_width=line_width, fill_alpha=alpha
    )
    p.add_tools(HoverTool(renderers=[r], tooltips=tooltips))
    return json.dumps(json_item(p))


@functools.lru_cache(maxsize=16)
def _active_chart_json(device: int) -> str:
    return _empty_bands_json(
        "active",
        "Active memory: each live allocation a band, stacked in the order they were made (click the timeline)",
        300,
        ("size", "size_text", "label", "alloc_event", "free_event"),
        (0.3, 0.85),
        [
            ("size", "@size_text (@size{0,0} B)"),
            ("stack", "@label"),
            ("allocated at event", "@alloc_event{0,0}"),
            ("freed at event", "@free_event"),
        ],
    )


def active_chart_item(device: int) -> dict[str, Any]:
    """The active-memory chart of a device, empty: static/js/explore.js fills it from active.json."""
    item: dict[str, Any] = json.loads(_active_chart_json(device))
    return item


@functools.lru_cache(maxsize=16)
def _segment_time_chart_json(device: int) -> str:
    return _empty_bands_json(
        "segtime",
        "Segments over time: each cached segment a band while it exists, stacked in the order they were made",
        260,
        ("size", "size_text", "address", "alloc_event", "free_event"),
        (0.5, 0.8),
        [
            ("segment", "@address, @size_text (@size{0,0} B)"),
            ("made at event", "@alloc_event{0,0}"),
            ("released at event", "@free_event"),
        ],
    )


def segment_time_chart_item(device: int) -> dict[str, Any]:
    """The segment timeline of a device, empty: static/js/explore.js fills it from segments.json."""
    item: dict[str, Any] = json.loads(_segment_time_chart_json(device))
    return item
