"""Celery tasks: analyse one upload; sweep uploads that a crash or a lost message left behind.

Tasks take ids only (JSON serializer). The Upload row is the source of truth: a task
claims it with one conditional UPDATE, and every outcome ends in DONE or FAILED.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_process_init, worker_ready
from django.conf import settings
from django.core.files import File
from django.core.files.storage import default_storage

from analysis.errors import SnapshotError
from webapp.celery import app
from webapp.snapshots import liveness, runner, services

log = logging.getLogger(__name__)


@contextmanager
def _local_path(blob_name: str) -> Any:
    """A filesystem path for the blob: the file itself on local storage, a temp copy otherwise."""
    try:
        local = Path(default_storage.path(blob_name))
    except NotImplementedError:  # remote storage (S3): copy to a temp file for the child
        local = None
    if local is not None:
        yield local
        return
    with tempfile.TemporaryDirectory(prefix="oomscope-blob-") as tmp:
        target = Path(tmp) / "snapshot"
        with default_storage.open(blob_name, "rb") as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1024 * 1024)
        yield target


def _keep_stores(sha256: str, folder: Path) -> None:
    """Move the child's explore stores into the upload's storage (``webapp/snapshots/explore.py``
    reads them); a store already there (the same file uploaded before) is kept."""
    from webapp.snapshots.explore import store_name

    for path in sorted(folder.glob("*.npz")):
        name = store_name(sha256, int(path.stem))
        if default_storage.exists(name):
            continue
        with path.open("rb") as fh:
            default_storage.save(name, File(fh))


def _build_charts(report: dict[str, Any]) -> dict[str, Any]:
    """Chart JSON for the report pages; an empty dict when charts are unavailable."""
    try:
        from webapp.snapshots.charts import build_charts
    except ImportError:
        log.warning("webapp.snapshots.charts.build_charts is not available; storing no charts")
        return {}
    try:
        charts: dict[str, Any] = build_charts(report)
    except Exception:
        # A chart bug must not throw away a finished report; the pages show the tables.
        log.exception("building charts failed")
        return {}
    return charts


@app.task(
    bind=True,
    name="snapshots.analyse_upload",
    acks_late=True,
    reject_on_worker_lost=True,
    throws=(SnapshotError,),
    ignore_result=True,
)
def analyse_upload(self: Any, upload_id: int, **_future_kwargs: Any) -> None:
    """Analyse upload ``upload_id`` in a resource-limited child process and store the report.

    The message id and this pool process go with the claim: when the pool process running this
    is killed, Celery requeues the same message (``reject_on_worker_lost``) and its redelivery
    re-runs the upload at once, as the next attempt, instead of waiting for the sweep; when the
    whole worker is killed, the next worker start re-queues it (``_requeue_dead_claims``).
    """
    task_id = getattr(self.request, "id", None)
    upload = services.upload_claim(upload_id, task_id=task_id, claimant=liveness.identity())
    if upload is None:
        log.info("upload %s: not queued (gone, done or owned by another worker)", upload_id)
        return
    if upload.attempts > 1:
        log.warning("upload %s: attempt %d (message %s)", upload_id, upload.attempts, task_id)
    if upload.attempts > settings.ANALYSIS_MAX_ATTEMPTS:
        services.upload_fail(upload_id, "worker:killed-repeatedly")
        log.error("upload %s: failed after %d attempts", upload_id, upload.attempts - 1)
        return

    started = time.monotonic()

    def on_progress(stage: str | None, percent: int | None) -> None:
        services.upload_set_progress(upload_id, stage, percent)

    try:
        with _local_path(upload.blob_name) as path, tempfile.TemporaryDirectory(prefix="oomscope-explore-") as stores:
            limits = runner.limits_for(
                path,
                per_byte=settings.ANALYSIS_MEMORY_PER_BYTE,
                minimum=settings.ANALYSIS_MEMORY_MIN_BYTES,
                maximum=settings.ANALYSIS_MEMORY_MAX_BYTES,
                cpu=settings.ANALYSIS_CPU_SECONDS,
                wall=settings.ANALYSIS_WALL_SECONDS,
                jobs=settings.ANALYSIS_JOBS,
            )
            report = runner.run_analysis(
                path,
                limits,
                filename=upload.filename,
                on_progress=on_progress,
                oom_message=upload.oom_message,
                batch_size=upload.batch_size,
                explore_dir=Path(stores),
            )
            _keep_stores(upload.sha256, Path(stores))
        analysed = time.monotonic()
        services.upload_set_progress(upload_id, "charting", 90)
        charts = _build_charts(report)
        services.upload_finish(upload_id, report=report, charts=charts)
        log.info(
            "upload %s: done (analysis %.1fs, charts %.1fs)",
            upload_id,
            analysed - started,
            time.monotonic() - analysed,
        )
    except SnapshotError as exc:
        services.upload_fail(upload_id, exc.code, str(getattr(exc, "message", exc)))
        log.info("upload %s: refused: %s", upload_id, exc)
        # The row holds the outcome; nothing to retry (throws= also marks it as expected).
    except SoftTimeLimitExceeded:
        services.upload_fail(upload_id, "snapshot:limit:time", "the task's time limit was reached")
        log.warning("upload %s: soft time limit", upload_id)
    except Exception:
        services.upload_fail(upload_id, "worker:internal")
        log.exception("upload %s: internal error", upload_id)


analyse_upload_task = analyse_upload


@worker_ready.connect
def _check_broker(sender: Any = None, **_kwargs: Any) -> None:
    from webapp.snapshots.broker import warn_unless_noeviction

    warn_unless_noeviction(str(app.conf.broker_url))


@worker_ready.connect
def _requeue_dead_claims(sender: Any = None, **_kwargs: Any) -> None:
    """Re-run at once the uploads whose worker died with them (its main process SIGKILLed).

    Their message stays unacked in Redis until the visibility timeout (hours) and their heartbeat
    looks fresh to the sweep for ``SWEEP_STALE_RUNNING_SECONDS``. A claim whose pool process is
    provably gone (``liveness``: same machine and pid namespace) goes back to QUEUED and is
    published again; a claim of a live process, or of another host, is never touched. When the
    old message comes back after the visibility timeout, its claim finds the row done (or
    claimed by the new message) and does nothing.
    """
    from django.db import connections

    try:
        ids = services.uploads_requeue_dead_claims()
        for upload_id in ids:
            analyse_upload_task.delay(upload_id)
        if ids:
            log.warning("worker start: re-queued %d uploads whose worker process is gone: %s", len(ids), ids)
    except Exception:
        log.exception("worker start: re-queueing the uploads of a dead worker failed; the sweep will")
    finally:
        connections.close_all()  # the main process keeps no connection for the pool to inherit


@worker_process_init.connect
def _preload_charts(**_kwargs: Any) -> None:
    """Import bokeh once per pool process at start, not inside the first upload's time."""
    try:
        import webapp.snapshots.charts  # noqa: F401
    except ImportError:
        log.warning("charts module unavailable")


@app.task(name="snapshots.sweep_uploads", ignore_result=True)
def sweep_uploads(**_future_kwargs: Any) -> int:
    """Re-publish uploads that are stuck (run by beat every ``SWEEP_INTERVAL_SECONDS``)."""
    ids = services.uploads_requeue_stale()
    for upload_id in ids:
        analyse_upload_task.delay(upload_id)
    if ids:
        log.warning("sweep: re-queued %d stale uploads: %s", len(ids), ids)
    return len(ids)


@app.task(name="snapshots.purge_failed_uploads", ignore_result=True)
def purge_failed_uploads(**_future_kwargs: Any) -> int:
    """Remove the files of failed uploads past their retention (beat, every ``PURGE_INTERVAL_SECONDS``)."""
    purged = services.uploads_purge_failed()
    if purged:
        log.info("purge: removed the files of %d failed uploads", purged)
    return purged


# The run tasks (a run's chord, its webhook, retention) live apart; importing them here registers
# them with the worker, which autodiscovers this module only.
from webapp.snapshots import runtasks  # noqa: E402, F401
