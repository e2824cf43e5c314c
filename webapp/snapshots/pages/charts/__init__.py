"""Bokeh charts of a report: the only package of the project that imports bokeh.

``build_charts(report)`` turns the report dict (contract ``oomscope.report/1``)
into ``{name: json_item}``; the worker stores the result beside the report, so
page views never run Bokeh. Pages embed each item with ``Bokeh.embed.embed_item``
from our static ``charts.js`` (see ``templates/snapshots/_chart.html``).

Rules that shape this package:
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
``whatif-steps-<d>`` (reserved at each step's end per config); ``active-<d>`` and ``segtime-<d>``
beside a timeline, drawn empty.

Its rooms, by chart family (only ``common`` is shared; no room imports another's):
``timeline`` (timeline, fragmentation index, OOM and limit marks, step bands), ``segments`` (the
segment maps), ``stacks`` (the icicle), ``whatifs``, ``explore`` (the two charts ``explore.js``
fills), ``compare`` (two runs side by side, and a project's history); ``common`` holds the caps, the
palette, the figure's style, the byte axes, the legend and the number helpers. This module holds the
entry points.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from analysis.contract import Report, report_of
from webapp.snapshots.pages.charts.common import chart_item
from webapp.snapshots.pages.charts.compare import build_compare_charts, build_history_chart
from webapp.snapshots.pages.charts.explore import active_chart_item, segment_time_chart_item
from webapp.snapshots.pages.charts.segments import peak_map_key, segment_map_chart
from webapp.snapshots.pages.charts.stacks import icicle_chart
from webapp.snapshots.pages.charts.timeline import timeline_chart, timeline_columns
from webapp.snapshots.pages.charts.whatifs import whatif_chart, whatif_steps_chart
from webapp.snapshots.pages.formatting import format_bytes

__all__ = [
    "build_charts",
    "build_compare_charts",
    "build_history_chart",
    "format_bytes",
    "inline_bokehjs",
    "timeline_columns",
]


def build_charts(report: Report | Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """All charts of a report (typed: ``analysis.contract``; the worker passes the dict it just built),
    name -> ``json_item`` dict; charts without data are left out."""
    charts: dict[str, dict[str, Any]] = {}
    for dev in report_of(report).devices:
        d = dev.device if dev.device is not None else 0
        builders = (
            ("timeline", timeline_chart),
            # The reserved peak's map where the report has one: the moment the cache was largest.
            ("segments-peak", lambda dv: segment_map_chart(dv, peak_map_key(dv))),
            ("segments-oom", lambda dv: segment_map_chart(dv, "oom")),
            ("stacks", icicle_chart),
            ("whatif", whatif_chart),
            ("whatif-steps", whatif_steps_chart),
        )
        for kind, build in builders:
            model = build(dev)
            if model is not None:
                charts[f"{kind}-{d}"] = chart_item(model)
        if f"timeline-{d}" in charts:
            # Empty here; static/js/explore.js fills it from active.json (site pages only).
            charts[f"active-{d}"] = active_chart_item(int(d))
            # memory_viz's segment timeline, empty too: explore.js fills it from segments.json.
            charts[f"segtime-{d}"] = segment_time_chart_item(int(d))
    return charts


def inline_bokehjs() -> str:
    """BokehJS's source for a standalone page, from the installed package (only the core bundle:
    the charts use no widgets, tables, WebGL or MathJax)."""
    from bokeh.resources import Resources

    return "\n".join(Resources(mode="inline", components=["bokeh"]).js_raw)
