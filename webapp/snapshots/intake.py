"""The checks every upload passes, for the page form and the API alike.

Order matters: the size cap is checked before the body is parsed (a declared
Content-Length over the cap is refused unread), then after parsing (a file the
handler dropped mid-stream answers 413, never 200), then the head is sniffed.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import BadRequest, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import UnreadablePostError
from django.http.multipartparser import MultiPartParserError

from webapp.snapshots import limits, messages
from webapp.snapshots.uploads import Refusal, content_length_over_cap, is_too_large, sniff


class IntakeError(limits.LimitExceeded):
    """An upload refused before it is stored: the same status, code, message and headers as a
    limit's refusal (``LimitExceeded``), raised for the body and the file as well."""


def from_limit(err: limits.LimitExceeded) -> IntakeError:
    return IntakeError(err.status, err.code, err.message, retry_after=err.retry_after)


def parse_error(exc: Exception) -> IntakeError:
    """The error for a request body Django could not parse (it would otherwise answer HTML 400)."""
    if isinstance(exc, TooManyFilesSent):
        return IntakeError(400, "upload:too-many-files", messages.UPLOAD_BAD_REQUEST.format(detail="send one file"))
    if isinstance(exc, RequestDataTooBig):
        limit = messages.human_bytes(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        return IntakeError(
            413, "upload:fields-too-large", messages.UPLOAD_BAD_REQUEST.format(detail=f"text fields over {limit}")
        )
    if isinstance(exc, TooManyFieldsSent):
        return IntakeError(400, "upload:too-many-fields", messages.UPLOAD_BAD_REQUEST.format(detail="too many fields"))
    if isinstance(exc, UnreadablePostError):
        return IntakeError(400, "upload:incomplete", messages.UPLOAD_BAD_REQUEST.format(detail="the body ended early"))
    return IntakeError(400, "upload:bad-multipart", messages.UPLOAD_BAD_REQUEST.format(detail=str(exc)[:200]))


# What parsing a request body can raise on bad input; each becomes a parse_error.
PARSE_ERRORS = (
    MultiPartParserError,
    TooManyFilesSent,
    RequestDataTooBig,
    TooManyFieldsSent,
    UnreadablePostError,
    BadRequest,
)


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


def check_disk(request: Any) -> None:
    """The disk guard, before a byte of the body is read: the declared length must leave the reserve."""
    from webapp.snapshots import disk

    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    try:
        disk.check_room(declared)
    except limits.LimitExceeded as err:
        raise from_limit(err) from err


def disk_full() -> IntakeError:
    from webapp.snapshots import disk

    return from_limit(disk.full_error())


def check_rate(request: Any) -> None:
    """Per-user and per-token upload rates, before the body is read."""
    if not getattr(request.user, "is_authenticated", False):
        return
    try:
        limits.check_upload_rate(request, request.user, getattr(request, "api_token", None))
    except limits.LimitExceeded as err:
        raise from_limit(err) from err


def check_replay_rate(request: Any) -> None:
    """The Idempotency-Key replays' own rate, before the body is read."""
    try:
        limits.check_replay_rate(request, request.user)
    except limits.LimitExceeded as err:
        raise from_limit(err) from err


def check_quota(project: Any, size: int) -> None:
    try:
        limits.check_team_quota(project.team_id, size)
    except limits.LimitExceeded as err:
        raise from_limit(err) from err


def check_queued_cost(project: Any, uploaded: Any) -> None:
    """The upload's estimated analysis cost fits what its team may have queued, or ``IntakeError``."""
    from webapp.snapshots.cost import estimate_cost

    try:
        limits.check_team_queued_cost(project.team_id, estimate_cost(uploaded).check().cost_bytes)
    except limits.LimitExceeded as err:
        raise from_limit(err) from err


def parsed_files(request: Any) -> Any:
    """``request.FILES``, with Django's parse failures as ``IntakeError`` (JSON-able, with a code)."""
    from webapp.snapshots import disk

    try:
        return request.FILES  # parses the body if nothing has yet
    except PARSE_ERRORS as exc:
        raise parse_error(exc) from exc
    except OSError as exc:  # the temp file could not be written
        if disk.is_full(exc):
            raise disk_full() from exc
        raise


def received_file(request: Any, *, enforce_limits: bool = True) -> tuple[Any, str, str]:
    """(uploaded file, sha256, format) from a parsed request, or ``IntakeError``. The format is
    ``runarchive.ARCHIVE`` for a tar or zip of a run's ranks (checked member by member later).

    With ``enforce_limits`` the upload rates are counted before the body is read, and the
    team quota is checked when the form names its project (the API checks the project it
    picked itself, see ``api.snapshots``).
    """
    if enforce_limits:
        check_rate(request)
    files = parsed_files(request)
    if is_too_large(request):
        raise too_large()
    if len(files.getlist("file")) > 1 or len(files) > 1:
        raise IntakeError(400, "upload:too-many-files", messages.UPLOAD_BAD_REQUEST.format(detail="send one file"))
    uploaded = files.get("file")
    if uploaded is None:
        raise IntakeError(400, "upload:no-file", messages.UPLOAD_MISSING_FILE)
    if uploaded.size is not None and uploaded.size > settings.UPLOAD_MAX_BYTES:
        raise too_large()
    slug = request.POST.get("project")
    if enforce_limits and slug:
        from webapp.snapshots.services import project_for_user

        project = project_for_user(request.user, str(slug))
        if project is not None:
            check_quota(project, uploaded.size or 0)
            check_queued_cost(project, uploaded)
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
    from webapp.snapshots import runarchive

    if runarchive.is_archive(uploaded):  # a run's ranks in one tar or zip (runarchive.create_run)
        return uploaded, sha256, runarchive.ARCHIVE
    try:
        fmt = sniff(head)
    except Refusal as refusal:
        raise IntakeError(422, refusal.code, messages.error_message(refusal.code, refusal.detail)) from refusal
    return uploaded, sha256, fmt
