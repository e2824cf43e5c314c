"""The checks every upload passes, in one pass, for the page form and the API alike.

``admit(request, fields)`` runs them in this order, each once (docs/architecture.md, "The
upload's walk"); the first that fails raises, and nothing is stored before all have passed:

1. the declared size: a ``Content-Length`` over the cap is refused before a byte is read
   (``check_head``, which the page and a session's API call run before the CSRF check reads the body);
2. the disk guard: the declared length must leave the disk's reserve free (``disk.py``);
3. an ``Idempotency-Key`` already used (the API): a repeat is counted by the repeats' own rate,
   and only its bytes are received and compared (``Admission.earlier``);
4. the upload rates, per user and per token, before the body is read (``ratelimits.py``);
5. the body: parsed, then the size again (a file the handler dropped mid-stream answers 413,
   never 200), one file;
6. the head: a tar or zip of a run's ranks (``runarchive.py``), else sniffed (``uploads.sniff``);
7. the text fields (the form given: the page's or the API's);
8. the analysis cost, estimated once from the bytes (``cost.py``): ``Admission.cost_bytes``.

What needs the project (which one, the token's scope, the write right, the team's queued cost
and quota) is the service's, which creates the upload: ``accept.upload_admit``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import BadRequest, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import UnreadablePostError
from django.http.multipartparser import MultiPartParserError

from webapp.snapshots import messages
from webapp.snapshots.errors import FieldsInvalid, IntakeError, LimitExceeded, Refusal
from webapp.snapshots.intake import disk, ratelimits, runarchive
from webapp.snapshots.intake.cost import estimate_cost
from webapp.snapshots.intake.forms import UploadFieldsForm
from webapp.snapshots.intake.uploads import MULTIPART_OVERHEAD, sniff
from webapp.snapshots.models import Upload


@dataclass(frozen=True)
class Admission:
    """An upload that passed every check of the intake: what the service needs to store it.

    ``earlier``: the upload an ``Idempotency-Key`` already made (a repeat: the fields were not
    read, and ``fields``, ``run_meta`` and ``cost_bytes`` are empty)."""

    uploaded: Any
    sha256: str
    fmt: str  # ``runarchive.ARCHIVE`` for a run's ranks in one tar or zip
    cost_bytes: int = 0
    fields: dict[str, Any] = field(default_factory=dict)
    run_meta: dict[str, Any] = field(default_factory=dict)
    project_slug: str = ""
    idempotency_key: str = ""
    earlier: Upload | None = None
    listing: runarchive.Listing | None = None  # a run's archive: what its listing declares


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


def disk_full() -> IntakeError:
    return from_limit(disk.full_error())


def from_limit(err: LimitExceeded) -> IntakeError:
    return IntakeError(err.status, err.code, err.message, retry_after=err.retry_after)


def content_length_over_cap(request: Any) -> bool:
    """A declared body larger than the cap is refused before a byte is read."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False
    return length > settings.UPLOAD_MAX_BYTES + MULTIPART_OVERHEAD


def is_too_large(request: Any) -> bool:
    """Whether the upload handler stopped at the cap (``uploads.mark_too_large``)."""
    return bool(getattr(request, "upload_too_large", False))


# Set on the request once a step has run: the page and a session's API call run steps 1 and 2
# before the CSRF check (which reads the body), and ``admit`` then does not run them again.
_SIZE_CHECKED = "oomscope_size_checked"
_HEAD_CHECKED = "oomscope_head_checked"


def check_declared_size(request: Any) -> None:
    """Step 1, once per request."""
    if getattr(request, _SIZE_CHECKED, False):
        return
    setattr(request, _SIZE_CHECKED, True)
    if "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower() and not request.META.get("CONTENT_LENGTH"):
        # WSGI gives Django no body without a length; say so instead of "no file".
        raise IntakeError(411, "upload:length-required", messages.UPLOAD_LENGTH_REQUIRED)
    if content_length_over_cap(request):
        raise too_large()


def check_head(request: Any) -> None:
    """Steps 1 and 2, before a byte of the body is read; once per request."""
    if getattr(request, _HEAD_CHECKED, False):
        return
    setattr(request, _HEAD_CHECKED, True)
    check_declared_size(request)
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    try:
        disk.check_room(declared)
    except LimitExceeded as err:
        raise from_limit(err) from err


IDEMPOTENCY_KEY_MAX = 100  # Upload.idempotency_key's max_length


def idempotency_key(request: Any) -> str:
    key = str(request.headers.get("Idempotency-Key", "")).strip()
    if len(key) > IDEMPOTENCY_KEY_MAX or not all(33 <= ord(c) <= 126 for c in key):
        raise IntakeError(
            400, "upload:bad-idempotency-key", messages.IDEMPOTENCY_BAD_KEY.format(limit=IDEMPOTENCY_KEY_MAX)
        )
    return key


def _earlier(request: Any, key: str) -> Upload | None:
    """The upload this user made under ``key`` (``store.upload_by_idempotency_key``'s query, read
    here so that the intake hands off to the service once, at the end)."""
    if not key or not getattr(request.user, "is_authenticated", False):
        return None
    return Upload.objects.filter(uploaded_by=request.user, idempotency_key=key).select_related("project").first()


def admit(request: Any, fields: type[UploadFieldsForm], *, keyed: bool = False, **form_kwargs: Any) -> Admission:
    """Every check of the intake, in order, each once; ``IntakeError`` (or ``FieldsInvalid``) for
    the first that fails. ``fields``: the form of the text fields (the page's ``UploadForm``, with
    its ``project_choices`` in ``form_kwargs``; the API's ``ApiUploadFieldsForm``), bound once the
    body is parsed; ``keyed``: the API's ``Idempotency-Key`` applies."""
    check_head(request)
    key = idempotency_key(request) if keyed else ""
    earlier = _earlier(request, key)
    if earlier is not None:
        try:
            ratelimits.check_replay_rate(request, request.user)
        except LimitExceeded as err:
            raise from_limit(err) from err
        uploaded, sha256, fmt = _received(request)
        return Admission(uploaded, sha256, fmt, idempotency_key=key, earlier=earlier)
    if getattr(request.user, "is_authenticated", False):
        try:
            ratelimits.check_upload_rate(request, request.user, getattr(request, "api_token", None))
        except LimitExceeded as err:
            raise from_limit(err) from err
    uploaded, sha256, fmt = _received(request)
    listing = _archive_ranks_counted(request, uploaded) if fmt == runarchive.ARCHIVE else None
    form = fields(request.POST, request.FILES, **form_kwargs)
    if not form.is_valid():
        raise FieldsInvalid(form)
    upload_fields, run_meta = form.upload_fields(), form.run_meta()
    return Admission(
        uploaded,
        sha256,
        fmt,
        cost_bytes=estimate_cost(uploaded).check().cost_bytes,
        fields=upload_fields,
        run_meta=run_meta,
        project_slug=str(form.cleaned_data.get("project") or "").strip(),
        idempotency_key=key,
        listing=listing,
    )


def _archive_ranks_counted(request: Any, uploaded: Any) -> runarchive.Listing:
    """A run's archive, from its listing: refused as ``runarchive.check_listing`` says, and each rank
    it holds counted against the upload rates (the archive itself was counted as one already); issue
    36: one POST made up to 1,024 analyses as one upload."""
    path = runarchive.file_path(uploaded)
    try:
        if path is None:
            raise runarchive.refusal("upload:archive-unreadable")
        listing = runarchive.check_listing(path)
        if getattr(request.user, "is_authenticated", False) and listing.ranks > 1:
            token = getattr(request, "api_token", None)
            ratelimits.check_upload_rate(request, request.user, token, count=listing.ranks - 1)
    except LimitExceeded as err:
        raise from_limit(err) from err
    return listing


def parsed_files(request: Any) -> Any:
    """``request.FILES``, with Django's parse failures as ``IntakeError`` (JSON-able, with a code)."""
    try:
        return request.FILES  # parses the body if nothing has yet
    except PARSE_ERRORS as exc:
        raise parse_error(exc) from exc
    except OSError as exc:  # the temp file could not be written
        if disk.is_full(exc):
            raise disk_full() from exc
        raise


def _received(request: Any) -> tuple[Any, str, str]:
    """Steps 5 and 6: (uploaded file, sha256, format) from the parsed request. The format is
    ``runarchive.ARCHIVE`` for a tar or zip of a run's ranks (checked member by member later)."""
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
    head = getattr(uploaded, "head", None)
    if head is None:  # a handler other than ours (tests may swap handlers)
        uploaded.seek(0)
        head = uploaded.read(4096)
        uploaded.seek(0)
    sha256 = getattr(uploaded, "sha256", None)
    if sha256 is None:
        digest = hashlib.sha256()
        for chunk in uploaded.chunks():
            digest.update(chunk)
        sha256 = digest.hexdigest()
    if runarchive.is_archive(uploaded):  # a run's ranks in one tar or zip (runarchive.create_run)
        return uploaded, sha256, runarchive.ARCHIVE
    try:
        fmt = sniff(head)
    except Refusal as refusal:
        raise IntakeError(422, refusal.code, messages.error_message(refusal.code, refusal.detail)) from refusal
    return uploaded, sha256, fmt
