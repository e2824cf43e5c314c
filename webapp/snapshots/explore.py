"""The report's interactive endpoints: zoom detail, the allocator's state at an event, one block's story.

Zooming reads stored columns: the first request for a device replays its snapshot once
(``analysis.explore.Explorer``) and stores ``event_columns`` as one ``.npz`` beside the upload's
blob (``columns/<sha256>/<device>.npz``, uncompressed so a window reads fast); every later zoom
slices those arrays. The state at an event needs the replay itself (``blocks_at``): the replayed
snapshot of the last few uploads asked for stays in this process (``EXPLORERS``), so clicks after
the first answer in milliseconds on small traces; ``blocks_at`` replays up to the event, so on the
2.4M-event benchmark a click costs about one replay (docs/report.md gives the figures).
"""

from __future__ import annotations

import io
import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage

from analysis.explore import Explorer, active_bands, window
from analysis.reader import read_snapshot
from webapp.snapshots.formatting import event_text, format_bytes
from webapp.snapshots.models import Upload

EXPLORERS_KEPT = 2
COLUMNS_KEPT = 4
_lock = threading.Lock()
_explorers: OrderedDict[tuple[str, int], Explorer] = OrderedDict()
_columns: OrderedDict[tuple[str, int], tuple[dict[str, np.ndarray], dict[str, str]]] = OrderedDict()


class ExploreError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _remember(cache: OrderedDict[Any, Any], key: Any, value: Any, kept: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > kept:
        cache.popitem(last=False)


def explorer_for(upload: Upload, device: int) -> Explorer:
    key = (upload.sha256, device)
    with _lock:
        found = _explorers.get(key)
        if found is not None:
            _explorers.move_to_end(key)
            return found
    with default_storage.open(upload.blob_name, "rb") as fh:
        data = fh.read()
    snapshot = read_snapshot(data)
    try:
        made = Explorer(snapshot, device)
    except KeyError as err:
        raise ExploreError(404, "explore:no-device", f"the snapshot has no device {device}") from err
    with _lock:
        _remember(_explorers, key, made, EXPLORERS_KEPT)
    return made


def _columns_name(upload: Upload, device: int) -> str:
    return f"columns/{upload.sha256}/{device}.npz"


def columns_for(upload: Upload, device: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    key = (upload.sha256, device)
    with _lock:
        found = _columns.get(key)
        if found is not None:
            return found
    name = _columns_name(upload, device)
    if default_storage.exists(name):
        with default_storage.open(name, "rb") as fh:
            stored = np.load(io.BytesIO(fh.read()), allow_pickle=False)
            cols = {k: stored[k] for k in stored.files if k != "labels"}
            labels = json.loads(bytes(stored["labels"]).decode())
    else:
        explorer = explorer_for(upload, device)
        cols, labels = explorer.columns(), explorer.labels()
        buf = io.BytesIO()
        arrays = {"labels": np.frombuffer(json.dumps(labels).encode(), np.uint8), **cols}
        np.savez(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub types the first keyword
        if not default_storage.exists(name):
            default_storage.save(name, ContentFile(buf.getvalue()))
    with _lock:
        _remember(_columns, key, (cols, labels), COLUMNS_KEPT)
    return cols, labels


def timeline_payload(upload: Upload, device: int, t0: float, t1: float, px: int) -> dict[str, Any]:
    cols, labels = columns_for(upload, device)
    out = window(cols, labels, t0, t1, px)
    out["what"] = [
        event_text(a, s, out["labels"].get(str(g), "") if g >= 0 else "")
        for a, s, g in zip(out["event_action"], out["event_size"], out["event_group"], strict=True)
    ]
    return out


BAND_COLOURS = (
    "#4c72b0",
    "#dd8452",
    "#55a868",
    "#c44e52",
    "#8172b3",
    "#937860",
    "#da8bc3",
    "#8c8c8c",
    "#ccb974",
    "#64b5cd",
)


def active_payload(upload: Upload, device: int, t0: float, t1: float, px: int) -> dict[str, Any]:
    """The active-memory bands of events ``[t0, t1]``, ready for the chart's source."""
    cols, labels = columns_for(upload, device)
    if "alloc_start" not in cols:  # columns stored before the bands existed: store them again
        default_storage.delete(_columns_name(upload, device))
        with _lock:
            _columns.pop((upload.sha256, device), None)
        cols, labels = columns_for(upload, device)
    out = active_bands(cols, int(t0), int(t1) + 1, samples=max(16, min(600, px // 2)))
    bands = out.pop("bands")
    out["data"] = {
        "xs": [b["xs"] for b in bands],
        "ys": [b["ys"] for b in bands],
        "size": [b["size"] for b in bands],
        "size_text": [format_bytes(b["size"]) for b in bands],
        "label": [labels.get(str(b["group"]), "") for b in bands],
        "alloc_event": [b["alloc_event"] for b in bands],
        "free_event": ["never" if b["free_event"] is None else f"{b['free_event']:,}" for b in bands],
        "colour": [BAND_COLOURS[b["group"] % len(BAND_COLOURS)] if b["group"] >= 0 else "#999999" for b in bands],
    }
    out["bands"] = len(bands)
    return out


def state_payload(upload: Upload, device: int, index: int) -> dict[str, Any]:
    explorer = explorer_for(upload, device)
    if not -1 <= index < explorer.replay.events:
        raise ExploreError(400, "explore:bad-event", f"event {index} is outside 0..{explorer.replay.events - 1}")
    out = explorer.state_at(index)
    for key in (
        "allocated_bytes",
        "requested_bytes",
        "reserved_bytes",
        "active_bytes",
        "cached_free_bytes",
        "largest_free_bytes",
    ):
        out[key.replace("_bytes", "_text")] = format_bytes(out[key])
    for seg in out["segments"]:
        seg["size_text"] = format_bytes(seg["size"])
        for b in seg["blocks"]:
            b["size_text"] = format_bytes(b["size"])
    if out["event"]:
        out["event"]["text"] = event_text(out["event"]["action"], out["event"]["size"], "")
    return out


def block_payload(upload: Upload, device: int, alloc_event: int) -> dict[str, Any]:
    explorer = explorer_for(upload, device)
    try:
        out = explorer.block(alloc_event)
    except KeyError as err:
        raise ExploreError(400, "explore:not-an-allocation", str(err).strip("'\"")) from err
    out["size_text"] = format_bytes(out["size"])
    return out
