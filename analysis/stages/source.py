"""The snapshot and the contract ``source`` section, and the user's inputs checked before any heavy work.

``read(source, filename) -> Source``: the ``Snapshot`` (``reader.py``), its stack catalog, the devices
analysed and the contract ``source`` section (``Source.section()``: the sha256 taken on a thread beside the
read, from the same mapping of the file as the compiled reader's, ``fastread.mapped_file``; with
``hash_later`` it may finish after the read, beside the next stages). ``checked_inputs(...) -> Inputs``
refuses a bad ``--whatif`` or OOM message first.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis import fastread, parallel
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


class _FileHash:
    """The contract ``source`` section, its sha256 taken on a thread (``source_info``). ``hold`` (the
    file's mapping, where the hash reads it) is closed by that thread once the hash is done and the
    reader has done with it (``parsed()``). From then on, the mapped pages are let go (``MADV_DONTNEED``:
    they stay in the page cache), all at once and then each slice once hashed: a hash that outlives the
    read holds no more resident pages than the slice it reads (else the peak rose by the part of the
    file the parse had read and the hash had not: 60 MB on the 460 MB benchmark)."""

    def __init__(
        self,
        source: str | Path | bytes,
        filename: str | None,
        mapped: mmap.mmap | None,
        hold: contextlib.ExitStack,
        lower: bool,
    ) -> None:
        self._out: list[dict[str, Any] | BaseException] = []
        self._mapped = mapped
        self._parsed = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(source, filename, hold, lower), daemon=True)
        try:
            self._thread.start()
        except BaseException:  # no thread (e.g. an address-space limit): the mapping is still this caller's to close
            hold.close()
            raise

    def _run(self, source: str | Path | bytes, filename: str | None, hold: contextlib.ExitStack, lower: bool) -> None:
        if lower:
            parallel.yield_to_the_caller()
        try:
            self._out.append(source_info(source, filename, self._mapped, self._let_go))
        except BaseException as exc:  # handed to the thread that asks for the section, which raises it
            self._out.append(exc)
        finally:
            self._parsed.wait()  # the mapping is the reader's until then
            hold.close()

    def _let_go(self, start: int, end: int) -> None:
        """Bytes ``start:end`` of the mapping are hashed: their pages go where the reader has done."""
        if self._mapped is not None and self._parsed.is_set():
            _let_go_of(self._mapped, start, end)

    def parsed(self) -> None:
        """The reader has done with the mapping. Its pages go before the hash thread is told: until then
        that thread keeps the mapping open."""
        if self._mapped is not None and self._thread.is_alive():
            _let_go_of(self._mapped, 0, len(self._mapped))
        self._parsed.set()

    def section(self) -> dict[str, Any]:
        self._thread.join()
        if isinstance(self._out[0], BaseException):
            raise self._out[0]
        return self._out[0]


def _let_go_of(mapped: mmap.mmap, start: int, end: int) -> None:
    """The pages wholly inside ``start:end`` of a read-only file mapping unmapped (read again from the
    page cache if touched again): only a cost where it fails, so a failure is let be."""
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    last = end - end % mmap.PAGESIZE if end < len(mapped) else end
    if last > first:
        with contextlib.suppress(OSError, ValueError):
            mapped.madvise(mmap.MADV_DONTNEED, first, last - first)


@dataclass(frozen=True)
class Source:
    """The snapshot read, and what every device's stages share of it."""

    snapshot: Snapshot
    catalog: StackCatalog
    size: int  # the file's bytes (the contract's ``source.bytes``)
    devices: tuple[DeviceData, ...]  # the devices analysed: those with a trace or segments
    oom_devices: tuple[int, ...]  # the devices whose trace holds an OOM
    _hash: _FileHash

    def section(self) -> dict[str, Any]:
        """The contract ``source`` section: waits for the file's hash where it is still being taken."""
        return {**self._hash.section(), "format": self.snapshot.format}

    def message_for(self, message: OomMessage | None, device: int) -> OomMessage | None:
        """The OOM message where it is this device's: it names the device, or names none and this is
        the one device that ran out of memory."""
        if message is None or not message_applies(message, device, list(self.oom_devices)):
            return None
        return message


def read(source: str | Path | bytes, filename: str | None, *, hash_later: bool = False) -> Source:
    """The snapshot, and what gives the contract ``source`` section (``Source.section()``).

    The file's sha256 is taken on a thread beside the read: hashlib releases the GIL, so on a
    second CPU it costs little time. The compiled reader and the hash read one mapping of the file
    (``fastread.mapped_file``): no copy of its bytes for the hash, so the second CPU is free for
    the parse's own helper too (the pages it will write, made present ahead of it). A file the
    compiled reader leaves is read again by the Python reader, which gives any refusal.

    Without ``hash_later`` the hash is joined here (a caller that forks must: no thread may be
    running then). With it, the hash goes on beside the next stages at a lower priority (the
    report's own stages are its serial path; issue 34: on the 2-core VM the read waited ~0.1 s for a
    hash slower than the parse, with the second CPU idle once the read was done), and
    ``section()`` waits for it."""
    with contextlib.ExitStack() as held:
        mapped = None
        if not isinstance(source, bytes) and fastread.wanted(None):
            mapped = held.enter_context(fastread.mapped_file(Path(source), ReadLimits()))
        data = mapped.data if mapped is not None else None
        size = len(source) if isinstance(source, bytes) else _size_of(Path(source), data)
        hashing = _FileHash(source, filename, data, held.pop_all(), lower=hash_later)
        try:
            snapshot = read_snapshot(mapped or (source if isinstance(source, bytes) else Path(source)))
        except BaseException:
            hashing.parsed()
            with contextlib.suppress(BaseException):
                hashing.section()
            raise
        hashing.parsed()
    if not hash_later:
        hashing.section()  # raises what the hash met
    devices = tuple(d for d in snapshot.devices if len(d.trace) or d.segments)
    return Source(snapshot, StackCatalog(snapshot.stacks), size, devices, oom_devices(snapshot.devices), hashing)


def _size_of(path: Path, mapped: mmap.mmap | None) -> int:
    """The file's bytes: the mapping's, which the hash reads, where there is one."""
    return len(mapped) if mapped is not None else path.stat().st_size


def oom_devices(devices: Iterable[DeviceData]) -> tuple[int, ...]:
    """The devices whose trace holds an OOM (an OOM message without a GPU number is the one of them)."""
    return tuple(d.device for d in devices if (d.trace.action == OOM_ACTION).any())


def message_applies(message: OomMessage, device: int, oom_devices: list[int]) -> bool:
    """Whether the OOM message is ``device``'s (``Source.message_for``)."""
    if device not in oom_devices:
        return False
    return message.device == device or (message.device is None and len(oom_devices) == 1)


def source_info(
    source: str | Path | bytes,
    filename: str | None,
    mapped: mmap.mmap | None = None,
    hashed: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """The contract ``source`` section (its ``format`` left to the reader); ``mapped``: the file's
    bytes, mapped by the reader (``fastread.mapped_file``), hashed from there, ``hashed(start, end)``
    told after each slice of them."""
    digest = hashlib.sha256()
    if isinstance(source, bytes):
        digest.update(source)
        size = len(source)
        name = filename or "snapshot"
    else:
        path = Path(source)
        size = _hash_file(path, digest) if mapped is None else _hash_mapped(mapped, digest, hashed)
        name = filename or path.name
    return {"filename": name, "bytes": size, "sha256": digest.hexdigest(), "format": None}


def _hash_mapped(mapped: mmap.mmap, digest: Any, hashed: Callable[[int, int], None] | None = None) -> int:
    """Feed the mapped file to ``digest`` in slices of it (no copy); its size."""
    with memoryview(mapped) as view:
        for at in range(0, len(view), _MAPPED_SLICE):
            with view[at : at + _MAPPED_SLICE] as part:
                digest.update(part)
            if hashed is not None:
                hashed(at, min(len(view), at + _MAPPED_SLICE))
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


_HASH_SLICE = 1 << 20  # the read file's buffer: small enough to stay in the CPU's cache
# The mapped file's slices: hashlib releases the GIL for each and the loop takes it again between them,
# and the report's own stages hold it for up to the switch interval (5 ms) at a time, so each slice can
# wait that long to start. With 1 MiB slices the 460 MB benchmark's hash, 0.32 s of CPU alone, went on
# at a fraction of its speed once the read was done and ended last, after the report's stages and
# replays; 128 MiB slices took the report from 0.836 to 0.762 s of wall time at the same CPU (11
# alternated runs, issue 34) and its peak memory stays 604 MB: the pages of a slice are let go once it
# is hashed, and the read's own peak is the higher.
_MAPPED_SLICE = 1 << 27
