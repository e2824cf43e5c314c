"""The snapshot and the contract ``source`` section, and the user's inputs checked before any heavy work.

``read(source, filename) -> Source``: the ``Snapshot`` (``reader.py``), its stack catalog, the devices
analysed and the contract ``source`` section (the sha256 taken on a thread beside the read, from the same
mapping of the file as the compiled reader's: ``fastread.mapped_file``). ``checked_inputs(...) -> Inputs``
refuses a bad ``--whatif`` or OOM message first.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis import fastread
from analysis.allocator.config import AllocatorConfig
from analysis.limits import OomMessage, parse_oom_message
from analysis.model import OOM as OOM_ACTION
from analysis.model import DeviceData, Snapshot
from analysis.reader import ReadLimits, read_snapshot
from analysis.stacks import StackCatalog


@dataclass(frozen=True)
class Inputs:
    """What the user gave beside the snapshot, checked before any heavy work (``checked_inputs``)."""

    whatifs: tuple[str, ...]  # the user's own what-if configs (--whatif)
    limit: int | None  # the memory cap the user gave (bytes)
    message: OomMessage | None  # torch's OOM message, parsed (given, else the sidecar's)
    sidecar: dict[str, Any] | None  # the client's sidecar JSON
    batch_size: int | None  # the failing step's batch, where the user knows it


def checked_inputs(
    whatifs: tuple[str, ...],
    oom_message: str | None,
    sidecar: dict[str, Any] | None,
    *,
    limit: int | None = None,
    batch_size: int | None = None,
) -> Inputs:
    """The user's inputs, refused before any heavy work: ``ConfigError`` for a config that does not parse,
    ``OomMessageError`` for a text that is no OOM message. Without a message of its own, the sidecar's."""
    for conf in whatifs:
        AllocatorConfig.parse(conf)
    if not oom_message and isinstance(sidecar, dict) and isinstance(sidecar.get("oom_message"), str):
        oom_message = sidecar["oom_message"]
    message = parse_oom_message(oom_message) if oom_message else None
    return Inputs(whatifs, limit, message, sidecar, batch_size)


@dataclass(frozen=True)
class Source:
    """The snapshot read, and what every device's stages share of it."""

    snapshot: Snapshot
    catalog: StackCatalog
    section: dict[str, Any]  # the contract ``source`` section
    devices: tuple[DeviceData, ...]  # the devices analysed: those with a trace or segments
    oom_devices: tuple[int, ...]  # the devices whose trace holds an OOM

    def message_for(self, message: OomMessage | None, device: int) -> OomMessage | None:
        """The OOM message where it is this device's: it names the device, or names none and this is
        the one device that ran out of memory."""
        if message is None or not message_applies(message, device, list(self.oom_devices)):
            return None
        return message


def read(source: str | Path | bytes, filename: str | None) -> Source:
    """The snapshot, and the contract ``source`` section.

    The file's sha256 is taken on a thread beside the read: hashlib releases the GIL, so on a
    second CPU it costs little time. The compiled reader and the hash read one mapping of the file
    (``fastread.mapped_file``): no copy of its bytes for the hash, so the second CPU is free for
    the parse's own helper too (the pages it will write, made present ahead of it). A file the
    compiled reader leaves is read again by the Python reader, which gives any refusal. The hash is
    joined before anything forks."""
    with contextlib.ExitStack() as held:
        mapped = None
        if not isinstance(source, bytes) and fastread.wanted(None):
            mapped = held.enter_context(fastread.mapped_file(Path(source), ReadLimits()))
        data = mapped.data if mapped is not None else None
        hashed: list[dict[str, Any] | BaseException] = []
        hasher = threading.Thread(target=_source_info_into, args=(hashed, source, filename, data), daemon=True)
        hasher.start()
        try:
            snapshot = read_snapshot(mapped or (source if isinstance(source, bytes) else Path(source)))
        finally:
            hasher.join()
    if isinstance(hashed[0], BaseException):
        raise hashed[0]
    src = hashed[0]
    src["format"] = snapshot.format
    devices = tuple(d for d in snapshot.devices if len(d.trace) or d.segments)
    return Source(snapshot, StackCatalog(snapshot.stacks), src, devices, oom_devices(snapshot.devices))


def oom_devices(devices: Iterable[DeviceData]) -> tuple[int, ...]:
    """The devices whose trace holds an OOM (an OOM message without a GPU number is the one of them)."""
    return tuple(d.device for d in devices if (d.trace.action == OOM_ACTION).any())


def message_applies(message: OomMessage, device: int, oom_devices: list[int]) -> bool:
    """Whether the OOM message is ``device``'s (``Source.message_for``)."""
    if device not in oom_devices:
        return False
    return message.device == device or (message.device is None and len(oom_devices) == 1)


def _source_info_into(
    out: list[dict[str, Any] | BaseException],
    source: str | Path | bytes,
    filename: str | None,
    mapped: mmap.mmap | None = None,
) -> None:
    try:
        out.append(source_info(source, filename, mapped))
    except BaseException as exc:  # handed to the reading thread, which raises it
        out.append(exc)


def source_info(source: str | Path | bytes, filename: str | None, mapped: mmap.mmap | None = None) -> dict[str, Any]:
    """The contract ``source`` section (its ``format`` left to the reader); ``mapped``: the file's
    bytes, mapped by the reader (``fastread.mapped_file``), hashed from there."""
    digest = hashlib.sha256()
    if isinstance(source, bytes):
        digest.update(source)
        size = len(source)
        name = filename or "snapshot"
    else:
        path = Path(source)
        size = _hash_file(path, digest) if mapped is None else _hash_mapped(mapped, digest)
        name = filename or path.name
    return {"filename": name, "bytes": size, "sha256": digest.hexdigest(), "format": None}


def _hash_mapped(mapped: mmap.mmap, digest: Any) -> int:
    """Feed the mapped file to ``digest`` in slices of it (no copy); its size."""
    with memoryview(mapped) as view:
        for at in range(0, len(view), _HASH_SLICE):
            with view[at : at + _HASH_SLICE] as part:
                digest.update(part)
        return len(view)


def _hash_file(path: Path, digest: Any) -> int:
    """Feed the file to ``digest``; its size (where the reader maps no file: the Python reader's).
    Read into one buffer used again and again, small enough to stay in the CPU's cache, rather than
    into a new bytes object per chunk (0.02 s less CPU on the 460 MB benchmark)."""
    buf = bytearray(_HASH_SLICE)
    size = 0
    with path.open("rb", buffering=0) as fh, memoryview(buf) as view:
        while got := fh.readinto(buf):
            digest.update(view[:got])
            size += got
    return size


_HASH_SLICE = 1 << 20  # hashlib releases the GIL for each slice
