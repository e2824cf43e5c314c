"""The top stacks as an icicle: who holds memory at the OOM (or the allocated peak), outermost frame on top."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from bokeh.models import ColumnDataSource, HoverTool, Range1d

from analysis.contract import Device, StackRow
from webapp.snapshots.pages.charts.common import MAX_ICICLE_DEPTH, MAX_ICICLE_NODES, new_figure, numeric
from webapp.snapshots.pages.formatting import frame_label


def icicle_chart(dev: Device) -> Any:
    """The top stacks of the OOM (or the allocated peak) as an icicle: outermost frame on top,
    each frame's box as wide as its share of the bytes."""
    stacks = dev.top_stacks
    moment = "oom" if any(s.when == "oom" for s in stacks) else "peak"
    chosen = [s for s in stacks if s.when == moment and numeric(s.bytes) > 0]
    if not chosen:
        return None
    nodes, order = _stack_tree(chosen)
    total = float(sum(numeric(s.bytes) for s in chosen))
    cols = _icicle_columns(nodes, order, total)
    levels = int(max(len(k) for k in nodes))
    when = "the OOM" if moment == "oom" else "the allocated peak"
    p = new_figure(
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
            nodes[key][0] += numeric(s.bytes)
            nodes[key][1] += numeric(s.count)
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
