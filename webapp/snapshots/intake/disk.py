"""The global disk guard: uploads are refused before the disk that holds them fills.

Quotas bound each team, not the disk: many teams (or one that fills its quota with explore
stores) could still fill it, and a full disk turned every upload into an HTML 500 and left rows
"running" (issue 22). So: a body is refused unread when storing it would leave less than
``DISK_MIN_FREE_BYTES`` free on the storage's disk or the upload temp directory's; the worker
keeps an analysis's explore stores only above the same reserve; ``/healthz`` reports
``"disk": "low"`` once below it; and a write that still fails for lack of space answers a JSON
507 ``upload:disk-full``. Remote storage (S3) has no disk here: only the temp directory is checked.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import tempfile
from pathlib import Path

from django.conf import settings
from django.core.files.storage import default_storage

from webapp.snapshots import messages
from webapp.snapshots.errors import LimitExceeded

log = logging.getLogger(__name__)

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def _folders() -> list[Path]:
    folders = [Path(settings.FILE_UPLOAD_TEMP_DIR or tempfile.gettempdir())]
    with contextlib.suppress(NotImplementedError):  # remote storage has no local disk
        folders.append(Path(default_storage.path("")))
    return folders


def free_bytes() -> int:
    """The least free space among the disks an upload is written to."""
    free = []
    for folder in _folders():
        folder.mkdir(parents=True, exist_ok=True)
        free.append(shutil.disk_usage(folder).free)
    return min(free)


def low() -> bool:
    return free_bytes() < settings.DISK_MIN_FREE_BYTES


def full_error() -> LimitExceeded:
    return LimitExceeded(507, "upload:disk-full", messages.DISK_FULL, retry_after=300)


def check_room(incoming: int) -> None:
    """``LimitExceeded`` (507) when ``incoming`` bytes would leave less than the reserve free."""
    free = free_bytes()
    if free - max(0, incoming) < settings.DISK_MIN_FREE_BYTES:
        log.warning("disk guard: %d bytes free, %d incoming: upload refused", free, incoming)
        raise full_error()


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that failed for lack of space (ENOSPC, a quota)."""
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


def database_full(exc: BaseException) -> bool:
    """SQLite's answer when its disk is full ("database or disk is full", SQLITE_FULL)."""
    return "disk is full" in str(exc) or "No space left" in str(exc)


# What a killed process leaves in the temp directory: Django's upload temp files (a gunicorn worker
# killed mid-upload never closes them) and the worker's and analysis child's folders (a pool
# process killed mid-analysis never leaves its ``with``). Removed once older than any live use.
STALE_TEMP_PATTERNS = ("tmp*.upload*", "oomscope-*")


def purge_stale_temp_files(older_than_seconds: float) -> int:
    """Remove the temp files and folders above last changed more than ``older_than_seconds`` ago."""
    import time

    folder = Path(settings.FILE_UPLOAD_TEMP_DIR or tempfile.gettempdir())
    cutoff = time.time() - older_than_seconds
    removed = 0
    for pattern in STALE_TEMP_PATTERNS:
        for path in folder.glob(pattern):
            try:
                if path.is_symlink() or path.lstat().st_mtime > cutoff or path.stat().st_uid != os.getuid():
                    continue
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("stale temp %s not removed: %s", path, exc)
                continue
            removed += 1
    return removed
