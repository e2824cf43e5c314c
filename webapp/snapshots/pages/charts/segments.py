"""The segment maps: the allocator's segments at one moment as rows, their blocks as boxes coloured by state.

The moments: the reserved peak (the allocated peak where a report has no reserved one) and the OOM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from bokeh.models import CDSView, ColumnDataSource, GroupFilter, HoverTool, Range1d

from analysis.contract import Device, Segment, SegmentMap
from webapp.snapshots.pages.charts.common import (
    MAX_LABEL,
    MAX_SEGMENT_BLOCKS,
    MAX_SEGMENT_ROWS,
    SEGMENT_MAP_MAX_PX,
    STATE_COLOURS,
    STATE_LABELS,
    new_figure,
    number_or_none,
    numeric,
    place_legend,
)
from webapp.snapshots.pages.formatting import format_bytes, frame_label


def peak_map_key(dev: Device) -> str:
    return "reserved_peak" if "reserved_peak" in dev.segment_maps else "peak"


def segment_map_chart(dev: Device, moment: str) -> Any:
    """Segments as rows (largest on top), blocks as boxes along each row, coloured by state.

    The report's map (``segment_maps.peak`` / ``.oom``) gives per segment its size
    and blocks as ``{offset, size, requested, state, count, stack}`` where ``stack``
    is a group id named in the map's ``labels``; unmapped parts of expandable
    segments are the gaps between blocks.
    """
    snap = dev.segment_maps.get(moment)
    if snap is None or not snap.segments:
        return None
    segments = sorted(snap.segments, key=lambda sg: -numeric(sg.size))
    total = int(snap.segments_total or len(segments))
    segments = segments[:MAX_SEGMENT_ROWS]
    hidden = max(0, total - len(segments))
    cols, row_labels = _segment_map_columns(segments, snap.labels)

    rows = len(segments)
    widest = max(numeric(sg.size) for sg in segments) / 2**20
    dense = rows > 60  # rows too thin for a label each: hover names the segment instead
    p = new_figure(
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
    place_legend(p, location="bottom_right")
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
        seg_size = numeric(seg.size)
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
    seg_addr = numeric(seg.address)
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


def _int(d: Mapping[str, Any], *keys: str) -> int:
    """The first of ``keys`` holding a number (addresses may come as "0x..." strings); else 0."""
    for key in keys:
        value = number_or_none(d.get(key))
        if value is not None:
            return value
    return 0
