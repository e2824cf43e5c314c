"""Which charts a site's report page embeds and which it fetches once its first chart is drawn.

The page's first chart is the timeline: its ``json_item`` goes into the HTML, without the per-point
hover text (``what``, about 70% of its bytes on a large trace), together with the small, empty
active-memory and segment-timeline charts that explore.js fills. Every other chart, and the timeline's hover text, come
from ``<base>charts.json`` (``later``), which static/js/charts.js asks for after drawing the first
chart; a chart in a closed fold is drawn when the fold opens. The standalone file (no server)
embeds every chart whole. docs/report.md, "Page speed", has the figures.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

FIRST = ("timeline-", "active-", "segtime-")
TIMELINE_SOURCE = "timeline-source"  # the ColumnDataSource's name in charts.timeline
HOVER_COLUMN = "what"
# What a later chart's name maps to in the page's charts (templates/snapshots/_chart.html).
LATER: dict[str, Any] = {"later": True}


def _sources(node: Any) -> Iterator[dict[str, Any]]:
    """Every serialized ColumnDataSource in a Bokeh document."""
    if isinstance(node, dict):
        if node.get("name") == "ColumnDataSource" and isinstance(node.get("attributes"), dict):
            yield node
        for value in node.values():
            yield from _sources(value)
    elif isinstance(node, list):
        for value in node:
            yield from _sources(value)


def _hover_entry(item: Mapping[str, Any]) -> list[Any] | None:
    """The timeline source's ``[name, values]`` entry of the hover text, or None."""
    for source in _sources(item.get("doc")):
        attrs = source["attributes"]
        if attrs.get("name") != TIMELINE_SOURCE:
            continue
        data = attrs.get("data")
        entries = data.get("entries") if isinstance(data, dict) else None
        for entry in entries or []:
            if isinstance(entry, list) and len(entry) == 2 and entry[0] == HOVER_COLUMN:
                return entry
    return None


def hover_text(item: Mapping[str, Any]) -> list[Any] | None:
    entry = _hover_entry(item)
    return entry[1] if entry is not None and isinstance(entry[1], list) else None


def without_hover_text(item: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a timeline item whose hover text is blank (same length: Bokeh wants equal columns)."""
    copy: dict[str, Any] = json.loads(json.dumps(item))
    entry = _hover_entry(copy)
    if entry is not None and isinstance(entry[1], list):
        entry[1] = [""] * len(entry[1])
    return copy


def first(charts: Mapping[str, Any]) -> dict[str, Any]:
    """The page's charts: the first ones' items (the timeline's without hover text), ``LATER`` for the rest.

    A report without a timeline (a snapshot without history) embeds its few charts whole.
    """
    if not any(name.startswith("timeline-") for name in charts):
        return dict(charts)
    out: dict[str, Any] = {}
    for name, item in charts.items():
        if name.startswith("timeline-"):
            out[name] = without_hover_text(item)
        elif name.startswith(FIRST):
            out[name] = item
        else:
            out[name] = LATER
    return out


def later(charts: Mapping[str, Any]) -> dict[str, Any]:
    """``charts.json``: the items the page did not embed, and each timeline's hover text."""
    hover = {name: hover_text(item) for name, item in charts.items() if name.startswith("timeline-")}
    return {
        "charts": {name: item for name, item in charts.items() if not name.startswith(FIRST)},
        "hover": {name: text for name, text in hover.items() if text is not None},
    }
