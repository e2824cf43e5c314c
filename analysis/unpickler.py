"""The one place a snapshot's bytes become Python objects: its caps, its container, the restricted unpickler.

``ReadLimits`` caps what reading one file may cost (passed by the caller, never read from
settings). The container is named from its first bytes (``sniff_format``); gzip is streamed
through ``zlib.decompressobj`` with ``max_length`` and zip members are read in chunks, under
the decompressed size, ratio and member-count caps. The pickle inside is loaded by the C
unpickler with ``find_class`` and ``persistent_load`` refusing everything, so no opcode can
reach a callable (REDUCE, BUILD, NEWOBJ, ... then fail on plain data); the errors it raises
are mapped here, once, to coded refusals (``_MESSAGE_CODES``). JSON is parsed with its
non-finite constants refused. Nothing else in the package unpickles (docs/reader.md,
``../shared/docs/reliability.md``); ``reader.read_snapshot`` is the entry point.
"""

from __future__ import annotations

import io
import json
import pickle
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any

from analysis.errors import FormatError, LimitError, SchemaError, SnapshotError, UnsafeError


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """Caps on what reading one file may cost. Defaults suit a 24 GiB worker."""

    max_input_bytes: int = 4 << 30  # the file as given (compressed or not)
    max_decompressed_bytes: int = 8 << 30  # the pickle/JSON after gunzip or unzip
    max_ratio: int = 100  # decompressed/compressed, enforced past ratio_grace_bytes
    ratio_grace_bytes: int = 8 << 20  # tiny highly-compressible files are fine
    max_depth: int = 32  # real snapshots are 7 deep
    nodes_per_byte: int = 8  # real files expand to 0.1-0.9 nodes per pickle byte
    min_nodes: int = 1 << 20  # floor of the expansion budget for tiny files
    # Distinct streams of one device and memory pools of the file: real runs use a few streams and
    # one pool per CUDA graph. The allocator models keep free lists per (pool, stream), so a stream
    # per event made them index past their lists (issue 22).
    max_streams: int = 1024
    max_pools: int = 4096
    max_stream_pools: int = 1 << 16  # streams of a device x pools: the models' free lists
    max_gzip_members: int = 4096  # torch writes one; concatenated files a few
    # Devices of one snapshot: a process sees its node's GPUs (8 on most, 72 on the largest NVLink
    # domains). Every device is replayed and charted: 3,000 of them in a 22 KB file took 221 s.
    max_devices: int = 128


def node_budget(size: int, limits: ReadLimits) -> int:
    """The expansion budget of a pickle (or JSON) of ``size`` bytes: the nodes its object graph may expand to."""
    return max(limits.min_nodes, limits.nodes_per_byte * size)


# ---------------------------------------------------------------------------
# Containers: sniff, gunzip, unzip
# ---------------------------------------------------------------------------

_GZIP = b"\x1f\x8b"
_ZIP = (b"PK\x03\x04", b"PK\x05\x06")
_PICKLE_PROTOCOLS = frozenset({2, 3, 4, 5})
_CHUNK = 16 << 20
_GZIP_PIECE = 1 << 20  # the most compressed input handed to zlib at once (see gunzip)
# Read buffer. The C unpickler asks peek() for 128 KiB and gets at most this
# much: each answer is a fresh bytes object, and one of 128 KiB or more is
# mmap'd and unmapped again by malloc (page faults: on the 460 MB file 125K more
# of them and ~0.5 s more CPU than with 64 KiB, which stays on the heap).
PEEK = 64 << 10


def sniff_format(head: bytes) -> str:
    """Name the container from the first bytes: ``pickle | gzip | zip | json``.

    Raises ``FormatError`` for anything else (HTML, text, protocol 0/1 pickles,
    which no snapshot writer produces). At least 8 bytes should be given.
    """
    if not head:
        raise FormatError("empty", "the file is empty")
    if head[:1] == b"\x80":
        if len(head) < 2:
            raise FormatError("truncated", "the file ends inside the pickle header")
        if head[1] in _PICKLE_PROTOCOLS:
            return "pickle"
        raise FormatError("unsupported-protocol", f"pickle protocol {head[1]} (snapshots use 2-5)")
    if head[:2] == _GZIP:
        return "gzip"
    if head[:4] in _ZIP:
        return "zip"
    stripped = head.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")
    if stripped[:1] in (b"{", b"["):
        return "json"
    if not stripped and len(head) < 8:
        raise FormatError("empty", "the file holds only whitespace")
    if stripped[:1] == b"<":
        raise FormatError("not-a-snapshot", "this looks like HTML or XML, not a memory snapshot")
    raise FormatError("not-a-snapshot", "not a pickle, gzip, zip or JSON memory snapshot")


def gunzip(data: bytes | memoryview, limits: ReadLimits) -> bytes:
    """Decompress every gzip member with output, size, ratio and member-count caps.

    Linear in the input however many members it has: zlib copies the input left after a member
    into ``unused_data``, so the input is handed over in pieces that start small after each member
    and double up to ``_GZIP_PIECE``; a member's end copies at most its last piece (issue 22: the
    whole rest per member made 400,000 empty members take ~150 s).
    """
    out: list[bytes] = []
    total = 0
    view = memoryview(data)
    size = len(view)
    pos = members = 0
    while True:
        members += 1
        if members > limits.max_gzip_members:
            raise LimitError(
                "gzip-members", f"the gzip file has more than {limits.max_gzip_members:,} members (torch writes one)"
            )
        dec = zlib.decompressobj(wbits=31)
        piece_size = 64
        try:
            while True:
                piece = view[pos : pos + piece_size]
                piece_size = min(2 * piece_size, _GZIP_PIECE)
                chunk = dec.decompress(piece, _CHUNK)
                pos += len(piece) - len(dec.unconsumed_tail) - len(dec.unused_data)
                total += len(chunk)
                _check_expansion(total, size, limits)
                out.append(chunk)
                if dec.eof:
                    break
                if pos >= size:
                    # Input exhausted: flush what zlib still holds, then it must be the end.
                    chunk = dec.flush()
                    total += len(chunk)
                    _check_expansion(total, size, limits)
                    out.append(chunk)
                    if not dec.eof:
                        raise FormatError("truncated", "the gzip stream ends early")
                    break
        except zlib.error as exc:
            raise FormatError("corrupt-gzip", f"the gzip stream is damaged ({exc})") from None
        if pos >= size:
            break
        if view[pos : pos + 2] != _GZIP:
            raise FormatError("trailing-bytes", f"{size - pos} bytes follow the gzip stream")
        # concatenated gzip members are one stream
    return b"".join(out)


def _check_expansion(total: int, compressed: int, limits: ReadLimits) -> None:
    if total > limits.max_decompressed_bytes:
        raise LimitError(
            "decompressed-size", f"the content exceeds {limits.max_decompressed_bytes} bytes once decompressed"
        )
    if total > limits.ratio_grace_bytes and total > limits.max_ratio * max(compressed, 1):
        raise LimitError(
            "compression-ratio",
            f"the content expands more than {limits.max_ratio}:1 (a decompression bomb, not a snapshot)",
        )


def unzip(data: bytes, limits: ReadLimits) -> bytes:
    """Read ``<dir>/data.pkl`` of a ``torch.save`` archive, with size caps."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            members = [i for i in zf.infolist() if _is_data_pkl(i.filename)]
            if len(members) != 1:
                raise FormatError(
                    "zip-without-pickle",
                    "a zip must be a torch.save archive holding exactly one */data.pkl",
                )
            info = members[0]
            _check_expansion(info.file_size, max(info.compress_size, 1), limits)
            out: list[bytes] = []
            total = 0
            with zf.open(info) as member:
                while chunk := member.read(_CHUNK):
                    total += len(chunk)
                    _check_expansion(total, max(info.compress_size, 1), limits)
                    out.append(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, zlib.error) as exc:
        raise FormatError("corrupt-zip", f"the zip archive is damaged or unsupported ({exc})") from None
    except RuntimeError as exc:  # encrypted members
        raise FormatError("corrupt-zip", f"the zip archive cannot be read ({exc})") from None
    return b"".join(out)


def _is_data_pkl(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and parts[1] == "data.pkl" and bool(parts[0])


# ---------------------------------------------------------------------------
# Unpickling
# ---------------------------------------------------------------------------


class _NoGlobals(pickle.Unpickler):
    """The C unpickler with every way to reach a callable closed."""

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeError("global", f"the pickle asks for {module[:80]}.{name[:80]}; snapshots never do")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeError(
            "persistent-id", "the pickle uses a persistent id (a tensor or object store); snapshots never do"
        )


# Messages of the C unpickler (CPython 3.11) that name what was attempted, so the
# refusal can say so; anything not matched is still refused as corrupt.
_MESSAGE_CODES: tuple[tuple[type[BaseException], str, type[SnapshotError], str], ...] = (
    (pickle.UnpicklingError, "truncated", FormatError, "truncated"),
    (pickle.UnpicklingError, "out-of-band", UnsafeError, "out-of-band-buffer"),
    (pickle.UnpicklingError, "NEWOBJ", UnsafeError, "callable"),
    (TypeError, "not callable", UnsafeError, "callable"),
    (AttributeError, "__dict__", UnsafeError, "build"),
    (AttributeError, "__setstate__", UnsafeError, "build"),
    (ValueError, "extension code", UnsafeError, "extension"),
    (ValueError, "unsupported pickle protocol", FormatError, "unsupported-protocol"),
)


class _BoundedFile:
    """A file for the C unpickler whose reads never ask for more than the file holds.

    A lying length field (BINUNICODE, LONG4, FRAME claiming 2 GiB) then reads
    what is there and fails as truncated instead of preallocating the claim.
    ``peek`` lets the unpickler prefetch (up to the buffer's size) at C speed.
    """

    def __init__(self, f: io.BufferedReader | io.BufferedRandom, size: int) -> None:
        self._f = f
        self._size = size
        self.peek = f.peek
        self.readinto = f.readinto
        self.readline = f.readline  # protocol-0 text opcodes; bounded by the file itself

    def read(self, n: int = -1) -> bytes:
        return self._f.read(self._size if n < 0 or n > self._size else n)


def _load(stream: _BoundedFile) -> Any:
    try:
        return _NoGlobals(stream).load()
    except SnapshotError:
        raise
    except MemoryError:
        raise LimitError("memory", "the pickle asks for more memory than the process may use") from None
    except RecursionError:
        raise LimitError("too-deep", "the pickle nests too deeply") from None
    except EOFError:
        raise FormatError("truncated", "the pickle ends before its STOP opcode") from None
    except Exception as exc:  # the ~13 types a corrupt pickle raises (pickle-fuzz)
        text = str(exc)
        for kind, needle, error, reason in _MESSAGE_CODES:
            if isinstance(exc, kind) and needle in text:
                raise error(reason, f"refused: {text[:200]}") from None
        raise FormatError("corrupt-pickle", f"the pickle is damaged ({type(exc).__name__}: {text[:200]})") from None


def unpickle(data: bytes) -> Any:
    """Load one pickle from memory; refuse trailing bytes after STOP.

    The buffer is read through a BufferedReader like a file, so the unpickler
    consumes only up to STOP (``peek``) and leftovers inside a final frame show.
    """
    return unpickle_file(io.BufferedReader(io.BytesIO(data), PEEK), len(data))


def unpickle_file(f: io.BufferedReader[Any], size: int) -> Any:
    """Load one pickle straight from a file (no copy of its bytes in memory)."""
    obj = _load(_BoundedFile(f, size))
    end = f.tell()
    f.seek(size - 1)
    _check_end(end, size, f.read(1)[0])
    return obj


def _check_end(end: int, size: int, last_byte: int) -> None:
    # Bytes after STOP are never read by us but may be by other tools: refuse them.
    # STOP must also be the very last byte (catches leftovers inside a final frame).
    if end != size or last_byte != 0x2E:
        raise FormatError("trailing-bytes", f"{max(size - end, 1)} bytes follow the pickle's STOP opcode")


def parse_json(data: bytes) -> Any:
    def refuse_constant(name: str) -> Any:
        raise SchemaError("non-finite", f"JSON constant {name} where a number is expected")

    try:
        return json.loads(data, parse_constant=refuse_constant)
    except SnapshotError:
        raise
    except RecursionError:
        raise LimitError("too-deep", "the JSON nests too deeply") from None
    except MemoryError:
        raise LimitError("memory", "the JSON needs more memory than the process may use") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise FormatError("bad-json", f"not valid JSON ({str(exc)[:200]})") from None
