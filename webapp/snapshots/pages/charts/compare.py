"""Charts across runs: two runs side by side (the compare page) and a project's runs in order (its history)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, HoverTool
from bokeh.transform import dodge

from analysis.contract import Device, Report, report_of
from webapp.snapshots.pages.charts.common import (
    ALLOCATED,
    MAX_TIMELINE_POINTS,
    RESERVED,
    bytes_ticks,
    chart_item,
    float_array,
    minmax_indices,
    new_figure,
    place_legend,
)


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
        charts["compare-peaks"] = chart_item(peaks)
    overlay = _compare_timeline(dev_a, dev_b, labels)
    if overlay is not None:
        charts["compare-timeline"] = chart_item(overlay)
    steps = _compare_steps(dev_a, dev_b, labels)
    if steps is not None:
        charts["compare-steps"] = chart_item(steps)
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
            "a": float_array(a for _, a, _ in rows),
            "b": float_array(b for _, _, b in rows),
        }
    )
    p = new_figure("Peaks: " + " vs ".join(labels), height=260, y_range=list(reversed(y)), tools="save,reset")
    bytes_ticks(p.xaxis)
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
    place_legend(p, outside=True)
    return p


def _compare_steps(dev_a: Device, dev_b: Device, labels: tuple[str, str]) -> Any:
    """Reserved memory at each step's end, one line per run that has steps."""
    steps_a, steps_b = dev_a.steps, dev_b.steps
    if not (steps_a or steps_b):
        return None
    p = new_figure("Reserved at each step's end", height=300)
    bytes_ticks(p.yaxis)
    p.xaxis.axis_label = "step"
    hover_renderers = []
    for label, steps, colour in ((labels[0], steps_a, RESERVED), (labels[1], steps_b, ALLOCATED)):
        if not steps:
            continue
        src = ColumnDataSource(
            {
                "step": float_array(i if s.index is None else s.index for i, s in enumerate(steps)),
                "reserved": float_array(s.reserved_end_bytes for s in steps),
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
    place_legend(p)
    return p


def _compare_timeline(dev_a: Device, dev_b: Device, labels: tuple[str, str]) -> Any:
    """Both runs' reserved and allocated memory, aligned by step (analysis.compare.aligned_timeline)."""
    from analysis.compare import aligned_timeline

    series = [(labels[0], aligned_timeline(dev_a), RESERVED), (labels[1], aligned_timeline(dev_b), ALLOCATED)]
    if not any(s for _, s, _ in series):
        return None
    p = new_figure("Memory by step, both runs (x: step number + how far into the step, by events)", height=320)
    bytes_ticks(p.yaxis)
    p.xaxis.axis_label = "step"
    hover = []
    for label, data, colour in series:
        if not data or not data["x"]:
            continue
        idx = minmax_indices(np.asarray(data["reserved"]), [], MAX_TIMELINE_POINTS // 2)
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
    place_legend(p, outside=True)
    return p


def _first_device(report: Report) -> Device | None:
    return report.devices[0] if report.devices else None


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
            "reserved": float_array(r["summary"].get("peak_reserved_bytes") for r in points),
            "allocated": float_array(r["summary"].get("peak_allocated_bytes") for r in points),
        }
    )
    p = new_figure("Peak memory per run", height=300, x_range=(-0.5, len(points) - 0.5))
    p.xaxis.ticker = list(range(len(points)))
    p.xaxis.major_label_overrides = dict(enumerate(labels))
    p.xaxis.major_label_orientation = 0.6 if len(points) > 6 else 0
    bytes_ticks(p.yaxis)
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
    place_legend(p)
    return chart_item(p)


def _run_label(row: Mapping[str, Any], i: int) -> str:
    return str(row.get("run") or row.get("filename") or f"#{i + 1}")
