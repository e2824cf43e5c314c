"""A longer snapshot made of a real one: its trace run twice, the second run at other addresses.

    python3 scripts/stretch_snapshot.py SOURCE OUT [--times K]

For benchmarks at a size no capture on hand has (issue 34 asks for the report's ratios on "a 1 GB
snapshot of your own"; ``huge_all_stacks`` run twice is 0.92 GB raw). The transformation keeps the
snapshot one a real process could have written, for a trace recorded from the process start (a
complete one, as ``huge_all_stacks``):

- run k (k = 1..K-1) is the source's trace again with every address (events, segments, blocks)
  moved up by k times a stride past the source's whole address span, rounded to 2 MiB, and every
  time moved past the previous run's last one: the same program allocating the same way again, in
  fresh segments, while the earlier runs' memory stays as the source left it;
- the final ``segments`` are the source's and each run's moved copy: the state the trace ends in;
- each event keeps its frames (a fresh list of the same frame dicts, as torch's pickle shares them),
  the annotations are repeated with the runs' times, the allocator settings are the source's.

The output is a raw (not gzipped) pickle; keep it out of git (``/tmp``).
"""

from __future__ import annotations

import argparse
import gzip
import pickle
from pathlib import Path
from typing import Any

ALIGN = 2 << 20


def _open(path: Path) -> Any:
    with path.open("rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else path.open("rb")


def _addresses(data: dict[str, Any]) -> tuple[int, int]:
    addrs = [e["addr"] for t in data["device_traces"] for e in t if "addr" in e]
    for s in data["segments"]:
        addrs += [s["address"], s["address"] + s["total_size"]]
    return min(addrs), max(addrs)


def _moved_event(event: dict[str, Any], shift: int, later: int) -> dict[str, Any]:
    """An event of a later run: its address (where it has one: an OOM's has none) and time moved."""
    moved = {**event, "time_us": event["time_us"] + later, "frames": list(event.get("frames", []))}
    if "addr" in event:
        moved["addr"] = event["addr"] + shift
    return moved


def _moved_segment(seg: dict[str, Any], shift: int) -> dict[str, Any]:
    blocks = [{**b, "address": b["address"] + shift, "frames": list(b.get("frames", []))} for b in seg["blocks"]]
    return {**seg, "address": seg["address"] + shift, "blocks": blocks, "frames": list(seg.get("frames", []))}


def stretch(data: dict[str, Any], times: int) -> dict[str, Any]:
    """``data`` with its traces run ``times`` times (the module's docstring says how)."""
    lo, hi = _addresses(data)
    stride = -(-(hi - lo + ALIGN) // ALIGN) * ALIGN
    times_us = [e["time_us"] for t in data["device_traces"] for e in t]
    period = max(times_us) - min(times_us) + 1 if times_us else 1
    traces = [list(t) for t in data["device_traces"]]
    segments = list(data["segments"])
    annotations = list(data.get("external_annotations", []))
    for k in range(1, times):
        shift, later = k * stride, k * period
        for run, trace in zip(traces, data["device_traces"], strict=True):
            run += [_moved_event(e, shift, later) for e in trace]
        segments += [_moved_segment(s, shift) for s in data["segments"]]
        annotations += [{**a, "time_us": a["time_us"] + later} for a in data.get("external_annotations", [])]
    out = {**data, "segments": segments, "device_traces": traces}
    if "external_annotations" in data:
        out["external_annotations"] = annotations
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--times", type=int, default=2, help="how many runs of the trace (default 2)")
    args = parser.parse_args(argv)
    with _open(args.source) as f:
        data = pickle.load(f)  # noqa: S301 (our own benchmark snapshot)
    stretched = stretch(data, max(1, args.times))
    with args.out.open("wb") as f:
        pickle.dump(stretched, f, protocol=4)
    events = sum(len(t) for t in stretched["device_traces"])
    print(f"{args.out}: {args.out.stat().st_size / 1e6:.1f} MB, {events:,} events")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
