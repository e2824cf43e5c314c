"""Receiving upload bytes: stream to disk, hash while streaming, stop at the cap; sniff the head.

Django drops a file whose handler raised ``StopUpload`` and the view would then see an
empty ``request.FILES`` (reliability.md §2.1). The handler therefore marks the request
(``request.upload_too_large``) and the intake answers 413 whenever the mark is set
(``intake.is_too_large``; the declared length is checked there too, ``intake.content_length_over_cap``).
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

from django.conf import settings
from django.core.files.uploadhandler import StopUpload, TemporaryFileUploadHandler

from analysis.errors import SnapshotError
from analysis.reader import sniff_format
from webapp.snapshots.errors import Refusal
from webapp.snapshots.intake.jsonsniff import foreign_json

# Multipart framing and the small text fields around the file.
MULTIPART_OVERHEAD = 64 * 1024
SNIFF_BYTES = 4096


def mark_too_large(request: Any) -> None:
    request.upload_too_large = True


class CappedHashingUploadHandler(TemporaryFileUploadHandler):
    """Temp-file upload handler that hashes as it writes and stops at ``UPLOAD_MAX_BYTES``."""

    def handle_raw_input(
        self, input_data: Any, META: Any, content_length: int, boundary: Any, encoding: Any = None
    ) -> Any:
        if content_length > settings.UPLOAD_MAX_BYTES + MULTIPART_OVERHEAD:
            mark_too_large(self.request)
            from django.http import QueryDict
            from django.utils.datastructures import MultiValueDict

            # Returning a result here ends parsing before the body is read.
            return QueryDict(mutable=True), MultiValueDict()
        return None

    def new_file(self, *args: Any, **kwargs: Any) -> None:
        super().new_file(*args, **kwargs)
        self._sha256 = hashlib.sha256()
        self._received = 0
        self._head = b""

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self._received += len(raw_data)
        if self._received > settings.UPLOAD_MAX_BYTES:
            mark_too_large(self.request)
            self.file.close()  # deletes the temp file
            raise StopUpload(connection_reset=True)
        self._sha256.update(raw_data)
        if len(self._head) < SNIFF_BYTES:
            self._head += raw_data[: SNIFF_BYTES - len(self._head)]
        self.file.write(raw_data)
        return None

    def file_complete(self, file_size: int) -> Any:
        uploaded = super().file_complete(file_size)
        if uploaded is not None:
            # Read back by intake.admit: the digest and the first bytes for sniffing.
            uploaded.sha256 = self._sha256.hexdigest()  # type: ignore[attr-defined]
            uploaded.head = self._head  # type: ignore[attr-defined]
        return uploaded


def _own_sniff(head: bytes) -> str:
    stripped = head.lstrip()
    if not head:
        raise Refusal("snapshot:format:empty")
    if stripped[:1] == b"<":
        raise Refusal("snapshot:format:html", "the file starts with '<'")
    if head[:2] == b"\x1f\x8b":
        try:
            inner = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 64)
        except zlib.error as exc:
            raise Refusal("snapshot:format:not-a-snapshot", "corrupt gzip stream") from exc
        if inner[:1] not in (b"\x80", b"") and inner.lstrip()[:1] not in (b"{", b"["):
            raise Refusal("snapshot:format:not-a-snapshot", "the gzip holds neither a pickle nor JSON")
        if inner[:1] != b"\x80":
            _refuse_foreign_json(_gunzipped_head(head))
        return "pickle.gz"
    if head[:1] == b"\x80":
        return "pickle"
    if head[:4] == b"PK\x03\x04":
        return "torch-zip"
    if stripped[:1] in (b"{", b"["):
        _refuse_foreign_json(head)
        return "json"
    raise Refusal("snapshot:format:not-a-snapshot")


def _gunzipped_head(head: bytes) -> bytes:
    """As much of a gzip's inside as its first bytes give (a truncated stream is expected here)."""
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 4 * SNIFF_BYTES)
    except zlib.error:
        return b""


def _refuse_foreign_json(head: bytes) -> None:
    """JSON that cannot be a memory snapshot is refused here, not stored, queued and failed later."""
    reason = foreign_json(head)
    if reason is not None:
        raise Refusal("upload:not-a-snapshot-json", reason)


READER_FORMATS = {"pickle": "pickle", "gzip": "pickle.gz", "zip": "torch-zip", "json": "json"}


def sniff(head: bytes) -> str:
    """Format name of an upload from its first bytes, or ``Refusal``. Never unpickles.

    Obvious non-snapshots (empty, HTML) are refused by this module's own checks; the
    rest is delegated to the reader's ``sniff_format``.
    """
    fmt = _own_sniff(head)
    try:
        found = sniff_format(head)
    except SnapshotError as exc:
        raise Refusal(exc.code, str(getattr(exc, "message", exc))) from exc
    except Exception:  # the reader's sniff may want a whole file; keep our answer
        return fmt
    # The reader names containers (gzip, zip); the contract names formats (pickle.gz, torch-zip).
    return READER_FORMATS.get(found, fmt) if isinstance(found, str) else fmt
