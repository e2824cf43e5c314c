"""Segment maps: the segments and their blocks at one moment of the recorded replay, bounded for a page.

``segment_map(state, catalog) -> dict`` is a device's contract ``segment_maps`` entry (the peak, the OOM
and the reserved peak); runs of small blocks are merged so that a map stays a page's size.
"""

from __future__ import annotations

from typing import Any

from analysis.allocator.states import AllocatorState
from analysis.model import INACTIVE
from analysis.stacks import StackCatalog

SEGMENT_MAP_MAX_SEGMENTS = 200


SEGMENT_MAP_MAX_BLOCKS = 48


def segment_map(state: AllocatorState, catalog: StackCatalog) -> dict[str, Any]:
    """Segments and their blocks at one moment, bounded for a page.

    The largest ``SEGMENT_MAP_MAX_SEGMENTS`` segments are listed; within each,
    runs of blocks smaller than 1/64 of the segment are merged into one entry
    (state ``mixed`` when the run mixes states) and at most
    ``SEGMENT_MAP_MAX_BLOCKS`` entries are kept, the rest merged the same way.
    """
    segs = sorted(state.segments, key=lambda s: -s.total_size)
    shown = segs[:SEGMENT_MAP_MAX_SEGMENTS]
    hidden = segs[SEGMENT_MAP_MAX_SEGMENTS:]
    labels: dict[int, str] = {}
    rows = []
    for seg in sorted(shown, key=lambda s: s.address):
        blocks = _merge_blocks(seg, catalog, labels)
        rows.append(
            {
                "address": hex(seg.address),
                "size": int(seg.total_size),
                "stream": int(seg.stream),
                "pool": int(seg.pool),
                "type": seg.segment_type,
                "expandable": bool(seg.is_expandable),
                "allocated_bytes": int(sum(b.size for b in seg.blocks if b.state == "active_allocated")),
                "free_bytes": int(sum(b.size for b in seg.blocks if b.state == INACTIVE)),
                "largest_free_bytes": int(max((b.size for b in seg.blocks if b.state == INACTIVE), default=0)),
                "blocks": blocks,
            }
        )
    return {
        "event_index": int(state.index),
        "segments_total": len(segs),
        "segments_shown": len(shown),
        "hidden_bytes": int(sum(s.total_size for s in hidden)),
        "segments": rows,
        "labels": {str(k): v for k, v in labels.items()},
    }


def _merge_blocks(seg: Any, catalog: StackCatalog, labels: dict[int, str]) -> list[dict[str, Any]]:
    tiny = max(seg.total_size // 64, 1)
    blocks = list(seg.blocks)
    while True:
        out: list[dict[str, Any]] = []
        run: list[Any] = []
        for b in blocks:
            if b.size < tiny:
                run.append(b)
                continue
            if run:
                out.append(_merged_entry(seg, run))
                run = []
            group = int(catalog.group_of[b.stack + 1]) if b.state != INACTIVE else -1
            if group >= 0:
                labels.setdefault(group, catalog.groups[group].label)
            out.append(
                {
                    "offset": int(b.address - seg.address),
                    "size": int(b.size),
                    "state": b.state,
                    "requested": int(b.requested_size),
                    "count": 1,
                    "stack": group,
                }
            )
        if run:
            out.append(_merged_entry(seg, run))
        if len(out) <= SEGMENT_MAP_MAX_BLOCKS:
            return out
        tiny *= 4


def _merged_entry(seg: Any, run: list[Any]) -> dict[str, Any]:
    """One entry standing for a run of small neighbouring blocks."""
    states = {b.state for b in run}
    return {
        "offset": int(run[0].address - seg.address),
        "size": int(sum(b.size for b in run)),
        "state": states.pop() if len(states) == 1 else "mixed",
        "requested": int(sum(b.requested_size for b in run)),
        "count": len(run),
        "stack": -1,
    }
