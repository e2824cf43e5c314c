"""What the charts share: the page's caps, the site's palette, the figure's style, byte axes, the legend.

Also the ``json_item`` dict, the thinning of a long series and the number helpers: a helper that two rooms of
the package use lives here, and this module imports none of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, cast

import numpy as np
from bokeh.embed import json_item
from bokeh.models import AdaptiveTicker, NumeralTickFormatter
from bokeh.models.annotations import Legend, Title  # typed here; bokeh.models re-exports them untyped
from bokeh.plotting import figure

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


def new_figure(title: str, *, height: int, tools: str = TOOLS, **kwargs: Any) -> Any:
    """A figure in the site's style: as wide as the page, its toolbar above, no logo, no outline."""
    p = figure(title=title, height=height, sizing_mode="stretch_width", tools=tools, toolbar_location="above", **kwargs)
    cast(Title, p.title).text_font_size = "13px"
    p.toolbar.logo = None
    p.outline_line_color = None
    p.min_border_left = 60
    return p


def _bytes_axis() -> NumeralTickFormatter:
    # A new model each time: a Bokeh model belongs to one document only.
    return NumeralTickFormatter(format="0.[0] b")


def bytes_ticks(axis: Any) -> None:
    """Ticks at binary steps (256 MiB, 1 GiB, 1.5 GiB ...) labelled in binary units."""
    axis.ticker = AdaptiveTicker(base=2, mantissas=[1, 1.5], min_interval=1, num_minor_ticks=2)
    axis.formatter = _bytes_axis()


def place_legend(p: Any, location: str = "top_left", outside: bool = False) -> None:
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


def chart_item(model: Any) -> dict[str, Any]:
    """``json_item`` as the plain dict the pages and the database store (bokeh types it as a TypedDict)."""
    return cast(dict[str, Any], json_item(model))


def minmax_indices(key: np.ndarray, keep: Iterable[int], budget: int) -> np.ndarray:
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


def float_array(values: Iterable[Any]) -> np.ndarray:
    return np.asarray([math.nan if v is None else float(v) for v in values], dtype=np.float64)


def number_or_none(value: Any) -> int | None:
    """A number, or an address written as a "0x..." string, as an int; None for anything else."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str) and value.startswith("0x"):
        try:
            return int(value, 16)
        except ValueError:
            return None
    return None


def numeric(value: Any) -> int:
    """A typed section's number (a size, a count, an address that may be a "0x..." string); 0 for none."""
    number = number_or_none(value)
    return 0 if number is None else number
