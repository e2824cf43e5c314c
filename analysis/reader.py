"""Safe snapshot reader (FIRST DRAFT: correct on real files, not yet hardened or fast).

The reader helper replaces this with the hardened version (caps, schema codes,
all formats and versions, speed). The signature of ``read_snapshot`` stays.
"""

from __future__ import annotations

import gc
import gzip
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from analysis.errors import FormatError, UnsafeError
from analysis.model import (
    ACTION_CODE,
    DEFAULT_POOL,
    AllocatorSettings,
    Annotation,
    Block,
    DeviceData,
    Frame,
    Segment,
    Snapshot,
    StackTable,
    Trace,
)


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeError("global", f"the pickle asks for {module}.{name}; snapshots never do")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeError("persistent-id", "the pickle uses a persistent id; snapshots never do")


def read_snapshot(source: str | Path | bytes) -> Snapshot:
    data = Path(source).read_bytes() if not isinstance(source, bytes) else source
    fmt = "pickle"
    if data[:2] == b"\x1f\x8b":
        data, fmt = gzip.decompress(data), "pickle.gz"
    if not data[:1] == b"\x80":
        raise FormatError("not-a-snapshot", "not a pickle")
    gc.disable()
    try:
        obj = _NoGlobals(io.BytesIO(data)).load()
    finally:
        gc.enable()
    return _convert(obj, fmt)


class _Interner:
    def __init__(self) -> None:
        self.table = StackTable()
        self._frame_ids: dict[int, int] = {}
        self._stack_ids: dict[tuple[int, ...], int] = {}
        self._keep: list[Any] = []

    def stack(self, frames: list[dict[str, Any]] | None) -> int:
        if not frames:
            return -1
        ids = []
        for f in frames:
            fid = self._frame_ids.get(id(f))
            if fid is None:
                fid = len(self.table.frames)
                self.table.frames.append(Frame(str(f["filename"]), int(f["line"]), str(f["name"])))
                self._frame_ids[id(f)] = fid
                self._keep.append(f)
            ids.append(fid)
        key = tuple(ids)
        sid = self._stack_ids.get(key)
        if sid is None:
            sid = len(self.table.stacks)
            self.table.stacks.append(key)
            self._stack_ids[key] = sid
        return sid


def _convert(obj: Any, fmt: str) -> Snapshot:
    interner = _Interner()
    pools: list[tuple[int, int]] = [DEFAULT_POOL]
    pool_ids = {DEFAULT_POOL: 0}

    def pool_of(p: Any) -> int:
        key = tuple(p) if p is not None else DEFAULT_POOL
        if key not in pool_ids:
            pool_ids[key] = len(pools)
            pools.append(key)  # type: ignore[arg-type]
        return pool_ids[key]

    segs = obj["segments"]
    traces = obj.get("device_traces", [])
    ordinals = sorted({s["device"] for s in segs} | set(range(len(traces))))
    devices = []
    for dev in ordinals:
        streams: list[int] = []
        stream_ids: dict[int, int] = {}

        def stream_of(s: int) -> int:
            i = stream_ids.get(s)
            if i is None:
                i = stream_ids[s] = len(streams)
                streams.append(s)
            return i

        events = traces[dev] if dev < len(traces) else []
        n = len(events)
        cols = {k: np.zeros(n, np.int64) for k in ("action", "addr", "size", "stream", "time", "stack", "pool")}
        for i, e in enumerate(events):
            cols["action"][i] = ACTION_CODE[e["action"]]
            cols["addr"][i] = e["addr"] if "addr" in e else e.get("device_free", 0)
            cols["size"][i] = e["size"]
            cols["stream"][i] = stream_of(e["stream"])
            cols["time"][i] = e.get("time_us", 0)
            cols["stack"][i] = interner.stack(e.get("frames"))
            cols["pool"][i] = pool_of(e.get("pool_id"))
        trace = Trace(
            action=cols["action"].astype(np.int8),
            addr=cols["addr"],
            size=cols["size"],
            stream=cols["stream"].astype(np.int32),
            time_us=cols["time"],
            stack=cols["stack"].astype(np.int32),
            pool=cols["pool"].astype(np.int32),
        )
        segments = []
        for s in segs:
            if s["device"] != dev:
                continue
            blocks = []
            addr = s["address"]
            for b in s["blocks"]:
                blocks.append(
                    Block(b.get("address", addr), b["size"], b.get("requested_size", 0), b["state"], interner.stack(b.get("frames")))
                )
                addr += b["size"]
            segments.append(
                Segment(
                    device=dev,
                    address=s["address"],
                    total_size=s["total_size"],
                    allocated_size=s["allocated_size"],
                    active_size=s["active_size"],
                    requested_size=s.get("requested_size", 0),
                    stream=stream_of(s["stream"]),
                    segment_type=s["segment_type"],
                    pool=pool_of(s.get("segment_pool_id")),
                    is_expandable=bool(s.get("is_expandable", False)),
                    blocks=tuple(blocks),
                    stack=interner.stack(s.get("frames")),
                )
            )
        devices.append(DeviceData(dev, trace, segments, streams))
    annotations = [
        Annotation(a["name"], a["stage"], a["device"], a.get("time_us", 0)) for a in obj.get("external_annotations", [])
    ]
    raw = obj.get("allocator_settings") or {}
    settings = AllocatorSettings(bool(raw), str(raw.get("PYTORCH_CUDA_ALLOC_CONF", "")), dict(raw))
    return Snapshot(fmt, "modern", devices, pools, interner.table, annotations, settings)
