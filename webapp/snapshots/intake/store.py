"""An admitted upload stored: the blob, the row, its run and follow-up links, and its analysis
published once the row is committed (``broker.publish_upload``). An ``Idempotency-Key`` used before
returns the earlier upload (``IdempotencyConflict`` for other bytes)."""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from webapp.snapshots import publish
from webapp.snapshots.errors import IdempotencyConflict
from webapp.snapshots.intake import blobs
from webapp.snapshots.models import Project, Upload
from webapp.snapshots.runs import followups, runs

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User
    from django.core.files.uploadedfile import UploadedFile

    AnyUser = User | AnonymousUser

log = logging.getLogger(__name__)


def new_upload_code() -> str:
    return secrets.token_urlsafe(16)


def upload_by_idempotency_key(user: User | None, key: str) -> Upload | None:
    if not key or user is None:
        return None
    return Upload.objects.filter(uploaded_by=user, idempotency_key=key).select_related("project").first()


def upload_replay(existing: Upload, sha256: str) -> Upload:
    """The earlier upload of an Idempotency-Key, marked ``replayed``; ``IdempotencyConflict`` for other bytes."""
    return _replay(existing, sha256)


def _replay(existing: Upload, sha256: str) -> Upload:
    if existing.sha256 != sha256:
        raise IdempotencyConflict(existing)
    existing.replayed = True
    return existing


def upload_create(
    *,
    user: User | None,
    project: Project,
    uploaded: UploadedFile[Any],
    sha256: str,
    fmt: str,
    run: str = "",
    tags: list[str] | None = None,
    note: str = "",
    oom_message: str = "",
    idempotency_key: str = "",
    batch_size: int | None = None,
    cap_bytes: int | None = None,
    run_meta: dict[str, Any] | None = None,
    estimated_cost: int | None = None,
    follows: str = "",
    changed: list[str] | None = None,
) -> Upload:
    """Store the bytes, create the row and queue the analysis once the row is committed.

    With an ``idempotency_key``, a second call by the same user with the same key returns the
    first upload (``replayed`` set) instead of a duplicate, or ``IdempotencyConflict`` when the
    bytes differ. The key is queried once: the intake asked already (``intake.Admission.earlier``),
    so here the row's unique constraint answers, and only a repeat (an archive's rank, or a racing
    request) reads the earlier row (the ``IntegrityError`` below). A failed publish leaves the row
    queued with ``queued_at`` empty (the sweep publishes it) and sets ``publish_pending`` on the
    returned object. ``run_meta`` (rank, world size, commit, ...: ``runs.RUN_META_KEYS``) puts the
    upload into its run (``runs.run_attach``); the rank of a run of several ranks is published with
    the others, as one chord.
    """
    if estimated_cost is None:  # the intake estimated it already (intake.Admission.cost_bytes)
        from webapp.snapshots.intake.cost import estimate_cost

        estimated_cost = estimate_cost(uploaded).cost_bytes
    blob = blobs.store_blob(uploaded, sha256)
    try:
        with transaction.atomic():
            upload = Upload.objects.create(
                code=new_upload_code(),
                project=project,
                uploaded_by=user,
                filename=(uploaded.name or "snapshot")[:255],
                bytes=uploaded.size or 0,
                estimated_cost=estimated_cost,
                sha256=sha256,
                blob_name=blob,
                format=fmt,
                run=run[:200],
                tags=[t for t in (tags or []) if t][:20],
                note=note,
                oom_message=oom_message,
                batch_size=batch_size,
                cap_bytes=cap_bytes,
                idempotency_key=idempotency_key if user is not None else "",
                queued_at=timezone.now(),
            )
            several_ranks = int((run_meta or {}).get("world_size") or 1) > 1
            followups.link(upload, follows, changed or [], several_ranks=several_ranks)  # issue 33
            if not runs.run_attach(upload, run_meta or {}):
                transaction.on_commit(lambda: publish_analysis(upload))
    except IntegrityError:
        # The key was used before (a repeat, or two requests with one key raced): that row is the upload.
        existing = upload_by_idempotency_key(user, idempotency_key)
        if existing is None:
            raise
        return _replay(existing, sha256)
    return upload


def publish_analysis(upload: Upload) -> None:
    """Send the analysis message; on a broker outage mark the row for the sweep instead of failing."""
    try:
        publish.publish_upload(upload.id)
    except Exception as exc:
        log.warning("upload %s: publish failed (%s); the sweep will publish it", upload.id, exc)
        upload.publish_pending = True
        Upload.objects.filter(pk=upload.pk, status=Upload.Status.QUEUED).update(queued_at=None)
