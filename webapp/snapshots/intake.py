"""The checks every upload passes, for the page form and the API alike.

Order matters: the size cap is checked before the body is parsed (a declared
Content-Length over the cap is refused unread), then after parsing (a file the
handler dropped mid-stream answers 413, never 200), then the head is sniffed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from webapp.snapshots import messages
from webapp.snapshots.uploads import Refusal, content_length_over_cap, is_too_large, sniff


@dataclass
class IntakeError(Exception):
    status: int
    code: str
    message: str

    def as_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


def too_large() -> IntakeError:
    return IntakeError(
        413,
        "upload:too-large",
        messages.UPLOAD_TOO_LARGE.format(limit=messages.human_bytes(settings.UPLOAD_MAX_BYTES)),
    )


def check_declared_size(request: Any) -> None:
    if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower() and not request.META.get("CONTENT_LENGTH"):
        # WSGI gives Django no body without a length; say so instead of "no file".
        raise IntakeError(411, "upload:length-required", messages.UPLOAD_LENGTH_REQUIRED)
    if content_length_over_cap(request):
        raise too_large()


def received_file(request: Any) -> tuple[Any, str, str]:
    """(uploaded file, sha256, format) from a parsed request, or ``IntakeError``."""
    files = request.FILES  # parses the body if nothing has yet
    if is_too_large(request):
        raise too_large()
    uploaded = files.get("file")
    if uploaded is None:
        raise IntakeError(400, "upload:no-file", messages.UPLOAD_MISSING_FILE)
    if uploaded.size is not None and uploaded.size > settings.UPLOAD_MAX_BYTES:
        raise too_large()
    head = getattr(uploaded, "head", None)
    if head is None:  # a handler other than ours (tests may swap handlers)
        uploaded.seek(0)
        head = uploaded.read(4096)
        uploaded.seek(0)
    sha256 = getattr(uploaded, "sha256", None)
    if sha256 is None:
        import hashlib

        digest = hashlib.sha256()
        for chunk in uploaded.chunks():
            digest.update(chunk)
        sha256 = digest.hexdigest()
    try:
        fmt = sniff(head)
    except Refusal as refusal:
        raise IntakeError(422, refusal.code, messages.error_message(refusal.code, refusal.detail)) from refusal
    return uploaded, sha256, fmt
