"""What an upload's analysis will cost, estimated at intake from its bytes alone (issue 22).

The reader's work grows with the bytes it parses: the pickle (or JSON) after gunzip or unzip.
That size is known before anything is decompressed: a gzip file's last 4 bytes (ISIZE) declare
its uncompressed size mod 2**32, and a zip's central directory lists each member's size. The
estimate is the larger of the file's size and that declared size, in bytes to parse; a lie in
the declaration only lowers the estimate, and the reader's own decompression cap
(``ReadLimits.max_decompressed_bytes``) still bounds what is read. Shapes whose cost is not in
their size (many devices, many gzip members) are refused or bounded by the reader, not here.
"""

from __future__ import annotations

import struct
import zipfile
from dataclasses import dataclass
from typing import Any

_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True)
class AnalysisCost:
    """An upload's estimated analysis cost: ``cost_bytes`` = max(file, declared uncompressed)."""

    file_bytes: int
    declared_bytes: int | None  # gzip ISIZE or the zip members' sum; None for a plain file
    cost_bytes: int


def estimate_cost(uploaded: Any) -> AnalysisCost:
    """The cost of analysing ``uploaded`` (a Django UploadedFile or any seekable binary file with
    ``size``), read from its head and trailer only; the file's position is put back to 0."""
    size = int(getattr(uploaded, "size", 0) or 0)
    uploaded.seek(0)
    head = uploaded.read(4)
    declared: int | None = None
    if head[:2] == _GZIP_MAGIC and size >= 18:  # 10-byte header + 8-byte trailer at least
        uploaded.seek(size - 4)
        declared = struct.unpack("<I", uploaded.read(4))[0]
    elif head == _ZIP_MAGIC:
        declared = _zip_declared_bytes(uploaded)
    uploaded.seek(0)
    return AnalysisCost(file_bytes=size, declared_bytes=declared, cost_bytes=max(size, declared or 0))


def _zip_declared_bytes(uploaded: Any) -> int | None:
    """The sum of the members' uncompressed sizes from the central directory (not decompressed)."""
    try:
        uploaded.seek(0)
        with zipfile.ZipFile(uploaded) as archive:
            return sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None  # the reader refuses a broken zip with its own code
