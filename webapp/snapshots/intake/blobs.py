"""The stored bytes: content-addressed blobs (``sha256/..``), the worker's explore stores of them
(``explore/<sha256>/<device>.npz``), and their removal: when the last row naming them goes, after a
failed upload's retention, or as orphans no row names (the sweep)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from webapp.snapshots.models import Upload

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User
    from django.core.files.uploadedfile import UploadedFile

    AnyUser = User | AnonymousUser


def blob_name_for(sha256: str) -> str:
    return f"sha256/{sha256[:2]}/{sha256}"


def store_blob(uploaded: UploadedFile[Any], sha256: str) -> str:
    """Content-addressed storage: identical bytes are stored once.

    On a local disk the bytes are written under a temporary name beside the blob and renamed once
    whole, so a write that fails (a full disk) leaves no partial blob under the blob's name (issue
    36: 360 MB of them stayed); a blob reused by this upload has its time renewed, so the orphan
    sweep (``blobs_sweep_orphans``) never takes it between here and the row. Remote storage (S3)
    writes an object whole or not at all."""
    name = blob_name_for(sha256)
    try:
        final = Path(default_storage.path(name))
    except NotImplementedError:  # remote storage
        final = None
    if default_storage.exists(name):
        if final is not None:
            with contextlib.suppress(OSError):
                os.utime(final)
        return name
    uploaded.seek(0)
    if final is None:
        saved = default_storage.save(name, uploaded)
        if saved != name:  # a racing upload of the same bytes won; keep one copy
            default_storage.delete(saved)
        return name
    partial = f"{name}{PARTIAL_SUFFIX}{secrets.token_hex(6)}"
    try:
        saved = default_storage.save(partial, uploaded)
        os.replace(default_storage.path(saved), final)  # a racing upload of the same bytes wrote the same
    except BaseException:
        with contextlib.suppress(OSError):
            default_storage.delete(partial)
        raise
    return name


PARTIAL_SUFFIX = ".partial-"
# A blob no row names is removed once this old (the longest upload request, its archive's ranks
# included, is over by then: gunicorn's timeout is 300 s).
ORPHAN_GRACE_SECONDS = 3 * 3600


def blobs_drop_unnamed(names: list[str]) -> None:
    """Remove the blobs among ``names`` that no upload row names (an archive's ranks stored by a
    transaction that was rolled back)."""
    named = set(Upload.objects.filter(blob_name__in=names).values_list("blob_name", flat=True))
    for name in set(names) - named:
        with contextlib.suppress(OSError):
            default_storage.delete(name)


def blobs_sweep_orphans(older_than_seconds: float = ORPHAN_GRACE_SECONDS) -> list[str]:
    """Remove the files under ``sha256/`` that no upload row names (a write or a transaction that
    failed after the blob was stored, a partial write of a killed process) and the explore stores of
    bytes no row holds, once older than ``older_than_seconds``: never a blob a row names, nor one
    younger (an upload in flight stores its blob before its row). Through the storage API, so S3's
    bucket is swept as the local disk is. Returns the names removed."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    candidates: list[str] = []
    for prefix in _listdir("sha256")[0]:
        candidates += [f"sha256/{prefix}/{f}" for f in _listdir(f"sha256/{prefix}")[1]]
    named = set(Upload.objects.filter(blob_name__in=candidates).values_list("blob_name", flat=True))
    orphans = [(name, Q(blob_name=name)) for name in candidates if name not in named and _older(name, cutoff)]
    stores = {d for d in _listdir("explore")[0] if re.fullmatch(r"[0-9a-f]{64}", d)}
    held = set(Upload.objects.filter(sha256__in=stores).values_list("sha256", flat=True))
    for sha in sorted(stores - held):
        files = [f"explore/{sha}/{f}" for f in _listdir(f"explore/{sha}")[1]]
        if files and all(_older(f, cutoff) for f in files):
            orphans += [(f, Q(sha256=sha)) for f in files]
    removed = []
    for name, naming_row in orphans:
        if Upload.objects.filter(naming_row).exists():  # named since the listing
            continue
        with contextlib.suppress(OSError):
            default_storage.delete(name)
            removed.append(name)
    return removed


def _listdir(path: str) -> tuple[list[str], list[str]]:
    try:
        return default_storage.listdir(path)
    except (FileNotFoundError, NotImplementedError):
        return [], []


def _older(name: str, cutoff: datetime) -> bool:
    try:
        return default_storage.get_modified_time(name) < cutoff
    except (OSError, NotImplementedError):
        return False


def store_name(sha256: str, device: int) -> str:
    return f"explore/{sha256}/{int(device)}.npz"


def stored_devices(sha256: str) -> set[int] | None:
    """The devices with a store for these bytes; None when there is none (analysed before stores)."""
    try:
        _dirs, files = default_storage.listdir(f"explore/{sha256}")
    except (FileNotFoundError, NotImplementedError):
        return None
    devices = {int(f[: -len(".npz")]) for f in files if f.endswith(".npz") and f[: -len(".npz")].isdigit()}
    return devices or None


def has_stores(sha256: str) -> bool:
    """Whether the worker kept explore stores for these bytes (``tasks.backfill_explore`` makes them
    for an upload analysed without)."""
    return stored_devices(sha256) is not None


def upload_delete_blob_if_unused(upload: Upload) -> bool:
    """Remove the stored file unless another upload row still holds the same bytes."""
    if not upload.blob_name:
        return False
    if Upload.objects.filter(blob_name=upload.blob_name).exclude(pk=upload.pk).exists():
        return False
    default_storage.delete(upload.blob_name)
    if upload.sha256 and not Upload.objects.filter(sha256=upload.sha256).exclude(pk=upload.pk).exists():
        _delete_explore_stores(upload.sha256)
    return True


def explore_stores_drop_if_unused(sha256: str) -> None:
    """The explore stores of these bytes, unless an upload row still holds them (a delete that came
    while the worker was writing them: the row's receiver found nothing to remove then)."""
    if not Upload.objects.filter(sha256=sha256).exists():
        _delete_explore_stores(sha256)


def _delete_explore_stores(sha256: str) -> None:
    """The worker's explore stores of these bytes (``explore/<sha256>/<device>.npz``)."""
    folder = f"explore/{sha256}"
    try:
        _dirs, files = default_storage.listdir(folder)
    except (FileNotFoundError, NotImplementedError):
        return
    for name in files:
        default_storage.delete(f"{folder}/{name}")


def upload_delete(upload: Upload) -> None:
    """Delete the upload, its report and share links (cascade) and, after commit, its file.

    The file goes through the ``post_delete`` receiver in ``models.py``, so the admin and a
    project's cascade remove files the same way.
    """
    upload.delete()


def uploads_purge_failed() -> int:
    """Remove the files of uploads that failed more than ``FAILED_UPLOAD_RETENTION_SECONDS`` ago.

    The rows stay (history shows the failure and its reason); ``blob_name`` becomes empty so
    the quota no longer counts them. Returns the number of rows whose file was let go.
    """
    cutoff = timezone.now() - timedelta(seconds=settings.FAILED_UPLOAD_RETENTION_SECONDS)
    purged = 0
    for upload in Upload.objects.filter(status=Upload.Status.FAILED, finished_at__lt=cutoff).exclude(blob_name=""):
        with transaction.atomic():
            if Upload.objects.filter(pk=upload.pk, blob_name=upload.blob_name).update(blob_name="") != 1:
                continue
            holder = Upload(pk=upload.pk, blob_name=upload.blob_name)
            transaction.on_commit(lambda holder=holder: upload_delete_blob_if_unused(holder))  # type: ignore[misc]
        purged += 1
    return purged
