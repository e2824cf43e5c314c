"""The what-if charts: the peak reserved per allocator setting, and reserved at each step's end per setting."""

from __future__ import annotations

from typing import Any

from bokeh.models import ColumnDataSource, HoverTool
from bokeh.models.annotations import Span  # typed here; bokeh.models re-exports it untyped

from analysis.contract import Device
from webapp.snapshots.pages.charts.common import (
    LIMIT_COLOUR,
    RESERVED,
    WHATIF_COLOURS,
    bytes_ticks,
    float_array,
    new_figure,
    place_legend,
)
from webapp.snapshots.pages.formatting import format_bytes


def whatif_chart(dev: Device) -> Any:
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
    source = ColumnDataSource({"config": names, "peak": float_array(peaks), "verdict": verdicts, "colour": colours})
    p = new_figure(
        "Peak reserved per setting",
        height=max(320, 60 + 36 * len(names)),
        y_range=list(reversed(names)),
        tools="save,reset",
    )
    p.hbar(y="config", right="peak", height=0.6, source=source, fill_color="colour", line_color=None)
    bytes_ticks(p.xaxis)
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


def whatif_steps_chart(dev: Device) -> Any:
    steps = dev.steps
    whatif = [w for w in dev.whatif if w.steps]
    if not steps or not whatif:
        return None
    p = new_figure("Reserved at each step's end", height=320)
    bytes_ticks(p.yaxis)
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
                "step": float_array(k for k, _ in pairs),
                "reserved": float_array(v for _, v in pairs),
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
    place_legend(p, outside=True)
    return p
