"""A larger snapshot from a real one: its trace played again after itself (issue 34's ~1 GB file).

The copy's addresses are moved past every address of the original (by ``--shift``, a multiple of
2 MiB so the allocator's alignment holds) and its times past the original's last event; the copy's
segments and blocks are added to the final state, so the trace stays complete: at its end both the
original's and the copy's memory are live, as if a second, identical workload had started beside the
first one. Every event is a new dict with a new list of frames (the frame dicts themselves shared,
as pickle's memo shares them in the original).

    .venv/bin/python scripts/concat_trace.py ../shared/snapshots/huge_all_stacks.pickle.gz \\
        var/giant/huge_x2.pickle --copies 2
"""

from __future__ import annotations

import argparse
import gc
import gzip
import pickle
from pathlib import Path
from typing import Any


def _shift_segment(seg: dict[str, Any], by: int) -> dict[str, Any]:
    out = dict(seg)
    out["address"] = seg["address"] + by
    out["blocks"] = [dict(b, address=b["address"] + by) if "address" in b else dict(b) for b in seg.get("blocks", [])]
    return out


def _copy_event(event: dict[str, Any], by: int, later: int) -> dict[str, Any]:
    """A new event: its address and time moved, its frames a new list of the same frame dicts."""
    out = dict(event, time_us=event["time_us"] + later)
    if "addr" in event:
        out["addr"] = event["addr"] + by
    if isinstance(event.get("frames"), list):
        out["frames"] = list(event["frames"])
    return out


def concatenated(snapshot: dict[str, Any], copies: int, shift: int) -> dict[str, Any]:
    traces = snapshot["device_traces"]
    out_traces: list[list[dict[str, Any]]] = []
    for trace in traces:
        if not trace:
            out_traces.append(trace)
            continue
        span = trace[-1]["time_us"] - trace[0]["time_us"] + 1
        events = list(trace)
        for k in range(1, copies):
            events.extend(_copy_event(e, k * shift, k * span) for e in trace)
        out_traces.append(events)
    segments = list(snapshot["segments"])
    for k in range(1, copies):
        segments.extend(_shift_segment(s, k * shift) for s in snapshot["segments"])
    return dict(snapshot, device_traces=out_traces, segments=segments)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--shift", type=int, default=1 << 44, help="bytes between the copies' addresses")
    args = parser.parse_args()
    assert args.shift % (2 << 20) == 0
    gc.disable()
    opener = gzip.open if args.source.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(args.source, "rb") as fh:
        snapshot = pickle.load(fh)  # noqa: S301 - our own benchmark file
    out = concatenated(snapshot, args.copies, args.shift)
    with args.target.open("wb") as fh:
        pickle.dump(out, fh, protocol=pickle.HIGHEST_PROTOCOL)
    events = sum(len(t) for t in out["device_traces"])
    print(f"{args.target}: {args.target.stat().st_size / 1e6:.1f} MB, {events:,} events")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
