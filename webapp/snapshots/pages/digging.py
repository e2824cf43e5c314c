"""Digging (the report's interactive endpoints): zoom detail, the allocator's state at an event, one block's story.

Everything here reads data the worker computed at analysis time: the analysis child writes one
store per device (``analysis.explore.explore_store``: the recorded replay's columns, the trace
columns, the stack table and the replay's full state every ``CHECKPOINT_EVERY`` events) and the
task keeps it as ``explore/<sha256>/<device>.npz`` beside the upload's blob (uncompressed, so a
window reads fast). A zoom slices the columns; the state at an event is the checkpoint before it
moved on by at most ``CHECKPOINT_EVERY - 1`` events of the same replay; a block's stacks are read
from the stack table. Nothing here reads, unpickles or replays the snapshot: an upload without a
store (analysed before stores existed, a store of an older version, or a snapshot with nothing to
replay) is answered 404 ``explore:no-store`` at once. The web process once made such stores from
the blob itself, and a share link to a 13 MB upload of 300 MB of strings then cost 0.9 GB of
gunicorn's memory per request (issue 22); the analysis child, under its rlimits, is the only
place an upload is read: an operator backfills the stores of older uploads with
``manage.py backfill_explore``, a task that runs that child (``tasks.backfill_explore``). A device
without a store where other devices have one is answered 404
``explore:no-device``. One thread per process reads a given store; the last few read stay in this
process (``STORES_KEPT``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
from django.conf import settings
from django.core.files.storage import default_storage

from analysis.explore import StoredExplorer, active_bands, window
from analysis.model import ACTIONS
from webapp.snapshots import messages
from webapp.snapshots.errors import ExploreError
from webapp.snapshots.intake.blobs import store_name, stored_devices
from webapp.snapshots.models import Upload
from webapp.snapshots.pages.formatting import event_text, format_bytes

log = logging.getLogger(__name__)

STORES_KEPT = 3
# A band chart costs about (rows alive in the window) x (samples): a request may spend this many;
# past it the samples are fewer (issue 36: 100k segment rows x 600 samples per anonymous request).
BAND_WORK = 20_000_000
# What one web process may hold for the digging endpoints (issue 36: share links are anonymous):
# a store larger than EXPLORE_MAX_STORE_BYTES is not loaded (404 ``explore:store-too-large``), at
# most STORE_LOADS_AT_ONCE are read at a time (others wait up to LOAD_WAIT_SECONDS, then 503
# ``explore:busy``), and a state answer lists at most STATE_MAX_ENTRIES segments and blocks; the
# last STATES_KEPT answers are kept.
STORE_LOADS_AT_ONCE = 2
LOAD_WAIT_SECONDS = 20.0
STATE_MAX_ENTRIES = 5_000
STATES_KEPT = 16
# The most events one events.json answer lists (the event list asks for a page as it scrolls).
EVENTS_PAGE_MAX = 500
_load_slots = threading.BoundedSemaphore(STORE_LOADS_AT_ONCE)
_states: OrderedDict[tuple[str, int, int], dict[str, Any]] = OrderedDict()
_lock = threading.Lock()
_stores: OrderedDict[tuple[str, int], StoredExplorer] = OrderedDict()
_loading: dict[tuple[str, int], threading.Lock] = {}


def _max_store_bytes() -> int:
    return int(getattr(settings, "EXPLORE_MAX_STORE_BYTES", 256 * 1024**2))


def _read(name: str) -> StoredExplorer | None:
    """The stored explorer at ``name``; None when it is missing or of another store version;
    ``ExploreError`` when it is larger than a web process may hold or too many are being read."""
    if not default_storage.exists(name):
        return None
    size = default_storage.size(name)
    if size > _max_store_bytes():
        log.warning("explore store %s: %d bytes, over EXPLORE_MAX_STORE_BYTES; not loaded", name, size)
        raise ExploreError(404, "explore:store-too-large", messages.EXPLORE_STORE_TOO_LARGE)
    if not _load_slots.acquire(timeout=LOAD_WAIT_SECONDS):
        raise ExploreError(503, "explore:busy", messages.EXPLORE_BUSY)
    try:
        return _load(name)
    finally:
        _load_slots.release()


def _load(name: str) -> StoredExplorer | None:
    # Each array straight from the open file: no copy of the whole store in memory first.
    with default_storage.open(name, "rb") as fh, np.load(fh, allow_pickle=False) as arrays:
        store = {k: arrays[k] for k in arrays.files}
    try:
        return StoredExplorer(store)
    except ValueError:  # another version: the page says the data is not there
        log.info("explore store %s is of another version", name)
        return None


def _no_store() -> ExploreError:
    return ExploreError(404, "explore:no-store", messages.EXPLORE_NO_STORE)


def explorer_for(upload: Upload, device: int) -> StoredExplorer:
    key = (upload.sha256, device)
    with _lock:
        found = _stores.get(key)
        if found is not None:
            _stores.move_to_end(key)
            return found
    devices = stored_devices(upload.sha256)
    if devices is None:
        raise _no_store()
    if device not in devices:  # the worker stored every device it analysed
        raise ExploreError(404, "explore:no-device", f"the snapshot has no device {device}")
    name = store_name(upload.sha256, device)
    # One reader per store in this process: a page's first requests (zoom detail and active bands
    # at once) wait for one read.
    with _lock:
        key_lock = _loading.setdefault(key, threading.Lock())
    with key_lock:
        with _lock:
            found = _stores.get(key)
        if found is not None:
            return found
        try:
            made = _read(name)
        except ExploreError:
            with _lock:
                _loading.pop(key, None)
            raise
        if made is None:
            with _lock:
                _loading.pop(key, None)
            raise _no_store()
        with _lock:
            _stores[key] = made
            _stores.move_to_end(key)
            while len(_stores) > STORES_KEPT:
                _stores.popitem(last=False)
            _loading.pop(key, None)
    return made


def columns_for(upload: Upload, device: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    explorer = explorer_for(upload, device)
    return explorer.columns(), explorer.labels()


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
    samples = _band_samples(cols["alloc_start"], cols["alloc_end"], int(t0), int(t1) + 1, px)
    out = active_bands(cols, int(t0), int(t1) + 1, samples=samples)
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


def _band_samples(start: np.ndarray, end: np.ndarray, lo: int, hi: int, px: int) -> int:
    """Samples for a band chart of ``[lo, hi)``: one per two pixels (16-600), fewer when the rows
    alive in the window times the samples would pass ``BAND_WORK``."""
    rows = int(np.count_nonzero((start < hi) & (end > lo)))
    return max(16, min(600, px // 2, BAND_WORK // max(1, rows)))


def segments_payload(upload: Upload, device: int, t0: float, t1: float, px: int) -> dict[str, Any]:
    """memory_viz's "active cached segment timeline": each segment a band over the events it lived,
    stacked in the order they were made (``active_bands`` over segments instead of blocks)."""
    explorer = explorer_for(upload, device)
    cols = explorer.columns()
    # Made by the analysis child into the store (``analysis.explore.segment_lifetimes``), not here.
    life = explorer.segment_rows()
    as_blocks = {
        "alloc_start": life["start"],
        "alloc_end": life["end"],
        "alloc_size": life["size"],
        "alloc_group": np.full(life["start"].shape, -1, np.int64),
        "reserved": cols["reserved"],
    }
    samples = _band_samples(life["start"], life["end"], int(t0), int(t1) + 1, px)
    out = active_bands(as_blocks, int(t0), int(t1) + 1, samples=samples)
    bands = out.pop("bands")
    address_of = dict(zip(life["start"].tolist(), life["address"].tolist(), strict=True))
    out["data"] = {
        "xs": [b["xs"] for b in bands],
        "ys": [b["ys"] for b in bands],
        "size": [b["size"] for b in bands],
        "size_text": [format_bytes(b["size"]) for b in bands],
        "address": [hex(address_of.get(b["alloc_event"], 0)) for b in bands],
        "alloc_event": [b["alloc_event"] for b in bands],
        "free_event": ["never" if b["free_event"] is None else f"{b['free_event']:,}" for b in bands],
        "colour": [BAND_COLOURS[k % len(BAND_COLOURS)] for k in range(len(bands))],
    }
    out["bands"] = len(bands)
    out["segments"] = int(life["start"].shape[0])
    return out


def state_payload(upload: Upload, device: int, index: int) -> dict[str, Any]:
    """The allocator's state after event ``index``: at most ``STATE_MAX_ENTRIES`` segments and
    blocks listed (a replay of at most ``CHECKPOINT_EVERY`` events), the last few answers kept."""
    key = (upload.sha256, device, index)
    with _lock:
        kept = _states.get(key)
        if kept is not None:
            _states.move_to_end(key)
            return kept
    explorer = explorer_for(upload, device)
    if not -1 <= index < explorer.events:
        raise ExploreError(400, "explore:bad-event", f"event {index} is outside 0..{explorer.events - 1}")
    out = _state_text(explorer.state_at(index, max_blocks=STATE_MAX_ENTRIES))
    with _lock:
        _states[key] = out
        while len(_states) > STATES_KEPT:
            _states.popitem(last=False)
    return out


def events_payload(upload: Upload, device: int, start: int, count: int) -> dict[str, Any]:
    """Events ``[start, start + count)``, every one (``free_requested`` halves too), as the event
    list shows them: the page's list holds the whole trace and fetches a page as it scrolls into view."""
    explorer = explorer_for(upload, device)
    cols, labels = explorer.columns(), explorer.labels()
    n = explorer.events
    lo = max(0, min(int(start), n))
    hi = min(n, lo + max(1, min(int(count), EVENTS_PAGE_MAX)))
    actions = [ACTIONS[int(a)] for a in cols["action"][lo:hi].tolist()]
    sizes = cols["size"][lo:hi].tolist()
    groups = cols["group"][lo:hi].tolist()
    return {
        "events": n,
        "start": lo,
        "end": hi,
        "action": actions,
        "what": [
            event_text(a, s, labels.get(str(g), "") if g >= 0 else "")
            for a, s, g in zip(actions, sizes, groups, strict=True)
        ],
    }


def _state_text(out: dict[str, Any]) -> dict[str, Any]:
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
        out["event"]["text"] = event_text(out["event"]["action"], out["event"]["size"], out["event"].get("label", ""))
    return out


def block_payload(upload: Upload, device: int, alloc_event: int) -> dict[str, Any]:
    explorer = explorer_for(upload, device)
    try:
        out = explorer.block(alloc_event)
    except KeyError as err:
        raise ExploreError(400, "explore:not-an-allocation", str(err).strip("'\"")) from err
    out["size_text"] = format_bytes(out["size"])
    return out
