"""Celery tasks: analyse one upload; sweep uploads that a crash or a lost message left behind.

Tasks take ids only (JSON serializer). The Upload row is the source of truth: a task
claims it with one conditional UPDATE, and every outcome ends in DONE or FAILED.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import celeryd_after_setup, worker_process_init, worker_process_shutdown, worker_ready
from django.conf import settings
from django.core.files import File
from django.core.files.storage import default_storage

from analysis.errors import SnapshotError
from webapp.celery import app
from webapp.snapshots.intake import blobs
from webapp.snapshots.pages import firstanswer
from webapp.snapshots.worker import jobs, liveness, runner, warmchild

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


def _keep_stores(upload: Any, folder: Path, json_bytes: int) -> int:
    """Move the child's explore stores into the upload's storage (``webapp/snapshots/pages/digging.py``
    reads them); a store already there (the same file uploaded before) is kept. Returns the bytes
    the upload now holds in stores, which its team's quota counts.

    Stores are optional (the report stands without them; the page says the digging data is not
    there), so they are kept only when they fit in what is left of the team's quota and above the
    disk guard's reserve: a 10 KB trace wrote a 206 MB store, and such uploads filled a disk that
    the quota was meant to protect (issue 22).
    """
    from webapp.snapshots.intake import disk
    from webapp.snapshots.intake.blobs import store_name
    from webapp.snapshots.intake.quota import team_usage_bytes

    paths = sorted(folder.glob("*.npz"))
    size = sum(p.stat().st_size for p in paths)
    if not paths:
        return 0
    room = settings.TEAM_STORAGE_QUOTA_BYTES - team_usage_bytes(upload.project.team_id) - json_bytes
    if size > room:
        log.warning(
            "upload %s: explore stores of %d bytes not kept: the team's quota has %d left", upload.id, size, room
        )
        return 0
    if disk.free_bytes() - size < settings.DISK_MIN_FREE_BYTES:
        log.warning("upload %s: explore stores of %d bytes not kept: the disk is below its reserve", upload.id, size)
        return 0
    saved: list[str] = []
    try:
        for path in paths:
            name = store_name(upload.sha256, int(path.stem))
            if default_storage.exists(name):
                continue
            with path.open("rb") as fh:
                saved.append(default_storage.save(name, File(fh)))
    except OSError as exc:
        if not disk.is_full(exc):
            raise
        # The disk filled meanwhile: no stores rather than some (the report is still stored).
        log.warning("upload %s: explore stores not kept: %s", upload.id, exc)
        for name in saved:
            default_storage.delete(name)
        return 0
    return size


@app.task(
    bind=True,
    name="snapshots.analyse_upload",
    acks_late=True,
    reject_on_worker_lost=True,
    throws=(SnapshotError,),
    ignore_result=True,
)
def analyse_upload(self: Any, upload_id: int, deferred: int = 0, **_future_kwargs: Any) -> None:
    """Analyse upload ``upload_id`` in a resource-limited child process and store the report.

    The message id and this pool process go with the claim: when the pool process running this
    is killed, Celery requeues the same message (``reject_on_worker_lost``) and its redelivery
    re-runs the upload at once, as the next attempt, instead of waiting for the sweep; when the
    whole worker is killed, the next worker start re-queues it (``_requeue_dead_claims``).
    """
    if deferred < settings.ANALYSIS_MAX_DEFERRALS and jobs.upload_should_yield(upload_id):
        # Fairness between teams: this team already runs its share while another team's upload
        # waits, so this slot claims that upload and runs it now, and this message goes to the back
        # of the queue (first come, first served let one team's slow uploads hold every slot: issue
        # 22; sleeping before each put-back made the other team wait 0.5 s per message: issue 36).
        other = jobs.upload_claim_for_another_team(upload_id, claimant=liveness.identity())
        if other is not None:
            analyse_upload_task.apply_async((upload_id,), {"deferred": deferred + 1})
            log.info(
                "upload %s: deferred (%d); this slot runs upload %s of another team", upload_id, deferred + 1, other.id
            )
            _run_claimed(other, None)
            return
    task_id = getattr(self.request, "id", None)
    upload = jobs.upload_claim(upload_id, task_id=task_id, claimant=liveness.identity())
    if upload is None:
        log.info("upload %s: not queued (gone, done or owned by another worker)", upload_id)
        return
    _run_claimed(upload, task_id)


def _run_claimed(upload: Any, task_id: str | None) -> None:
    """The analysis of an upload this process claimed, its outcome stored (or its claim released)."""
    upload_id = upload.id
    if upload.attempts > 1:
        log.warning("upload %s: attempt %d (message %s)", upload_id, upload.attempts, task_id)
    if upload.attempts > settings.ANALYSIS_MAX_ATTEMPTS:
        jobs.upload_fail(upload_id, "worker:killed-repeatedly")
        log.error("upload %s: failed after %d attempts", upload_id, upload.attempts - 1)
        return

    try:
        _analyse(upload)
    except Exception:
        # Even the outcome could not be written (the database's disk full, the database gone): the
        # row still says RUNNING under this process's claim, which the sweep would leave alone for
        # the task's whole time limit (30 min) while this process lives on. The release note tells
        # it that this run is over, so it re-queues the upload once its writes work again (issue 22).
        jobs.claim_release(upload_id, task_id or "")
        log.exception("upload %s: its outcome could not be stored; released for the sweep", upload_id)


def _analyse(upload: Any) -> None:
    """Run the analysis child on the claimed ``upload`` and store the outcome, done or failed."""
    upload_id = upload.id
    started = time.monotonic()

    def on_progress(stage: str | None, percent: int | None) -> None:
        jobs.upload_set_progress(upload_id, stage, percent)

    try:
        with _local_path(upload.blob_name) as path, tempfile.TemporaryDirectory(prefix="oomscope-explore-") as stores:
            limits = _child_limits(path)
            analysis = _run_child_retrying_once(
                upload_id,
                path,
                limits,
                filename=upload.filename,
                on_progress=on_progress,
                # The user's first answer, stored while the child writes the stores and the charts.
                on_report=lambda report: _store_first_answer(upload_id, report),
                oom_message=upload.oom_message,
                batch_size=upload.batch_size,
                cap_bytes=upload.cap_bytes,
                explore_dir=Path(stores),
                charts=True,
            )
            kept = _keep_stores(upload, Path(stores), analysis.json_bytes)
        finished = _finish_or_park(upload_id, analysis.report, analysis.charts or {}, analysis.json_bytes + kept)
        if not finished:  # deleted meanwhile: the stores just written must not outlive it
            blobs.explore_stores_drop_if_unused(upload.sha256)
        log.info("upload %s: done (analysis and charts %.1fs)", upload_id, time.monotonic() - started)
    except ResultParked:
        # The disk was full at the final write: the result waits in the pending folder and the
        # sweep stores it once writes work again; the row must not say "failed" (issue 36).
        jobs.claim_release(upload_id, str(upload.task_id or ""))
        log.warning("upload %s: analysed, its result parked until the disk has room", upload_id)
    except SnapshotError as exc:
        jobs.upload_fail(upload_id, exc.code, str(getattr(exc, "message", exc)))
        log.info("upload %s: refused: %s", upload_id, exc)
        # The row holds the outcome; nothing to retry (throws= also marks it as expected).
    except runner.ChildKilled as exc:
        jobs.upload_fail(upload_id, "worker:analysis-killed", str(exc))
        log.error("upload %s: analysis killed from outside twice: %s", upload_id, exc)
    except SoftTimeLimitExceeded:
        jobs.upload_fail(upload_id, "snapshot:limit:time", "the task's time limit was reached")
        log.warning("upload %s: soft time limit", upload_id)
    except Exception:
        jobs.upload_fail(upload_id, "worker:internal")
        log.exception("upload %s: internal error", upload_id)


analyse_upload_task = analyse_upload


def _store_first_answer(upload_id: int, report: dict[str, Any]) -> None:
    """The report stored as the upload's first answer while the child goes on (``firstanswer``).
    Optional: a failed write (the database's disk full, a lost connection) leaves the final write,
    with its parking on a full disk, to store the outcome, instead of failing an analysis that worked."""
    try:
        firstanswer.store(upload_id, report)
    except Exception:
        log.exception("upload %s: its first answer could not be stored; the whole report follows", upload_id)


# --- the final write on a full disk (issue 36: the analysis was lost for good) ------------------


class ResultParked(Exception):
    """The final write failed for lack of space; the result was parked (``park_result``)."""


def pending_dir() -> Path:
    """Where results wait whose final write found the disk full: beside the uploads, so parking
    needs room on the uploads' disk only, never the database's."""
    return Path(settings.MEDIA_ROOT) / "pending-results"


def _disk_full(exc: BaseException) -> bool:
    from webapp.snapshots.intake import disk

    return disk.is_full(exc) or disk.database_full(exc)


def _finish_or_park(upload_id: int, report: dict[str, Any], charts: dict[str, Any], stored_bytes: int) -> bool:
    """``jobs.upload_finish``; on a full disk (the database's or the files') the result is
    parked instead and ``ResultParked`` raised. Parking that fails too raises the first error: the
    row stays running under a released claim and the sweep analyses the upload again."""
    try:
        return jobs.upload_finish(upload_id, report=report, charts=charts, stored_bytes=stored_bytes)
    except Exception as exc:
        if not _disk_full(exc):
            raise
        try:
            park_result(upload_id, {"report": report, "charts": charts, "stored_bytes": stored_bytes})
        except OSError as parked_exc:
            log.error("upload %s: the result could not be parked either: %s", upload_id, parked_exc)
            raise exc from None
        raise ResultParked(str(exc)) from exc


def park_result(upload_id: int, result: dict[str, Any]) -> Path:
    """Write ``result`` to the pending folder (a temporary name, then a rename: never half a file)."""
    folder = pending_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{int(upload_id)}.json"
    partial = folder / f".{int(upload_id)}.json.partial"
    try:
        partial.write_text(json.dumps(result, separators=(",", ":"), allow_nan=False))
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def store_parked_results() -> tuple[int, set[int]]:
    """Store each parked result (the sweep's first step); returns (stored, upload ids still parked)."""
    stored, waiting = 0, set()
    folder = pending_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        upload_id = int(path.stem)
        try:
            result = json.loads(path.read_text())
            jobs.upload_finish(
                upload_id, report=result["report"], charts=result["charts"], stored_bytes=result["stored_bytes"]
            )
        except Exception as exc:
            if not _disk_full(exc):
                raise
            waiting.add(upload_id)
            log.warning("upload %s: parked result still not stored: %s", upload_id, exc)
            continue
        path.unlink(missing_ok=True)  # stored, or its upload was deleted meanwhile
        stored += 1
    return stored, waiting


def _child_limits(path: Path) -> runner.Limits:
    return runner.limits_for(
        path,
        per_byte=settings.ANALYSIS_MEMORY_PER_BYTE,
        minimum=settings.ANALYSIS_MEMORY_MIN_BYTES,
        maximum=settings.ANALYSIS_MEMORY_MAX_BYTES,
        cpu=settings.ANALYSIS_CPU_SECONDS,
        wall=settings.ANALYSIS_WALL_SECONDS,
        jobs=settings.ANALYSIS_JOBS,
    )


@app.task(name="snapshots.backfill_explore", acks_late=True, ignore_result=True)
def backfill_explore(upload_id: int, **_future_kwargs: Any) -> None:
    """Make the explore stores of done upload ``upload_id``, analysed without them (before stores
    existed, or not kept then), in the analysis child under the analysis's rlimits: the web process
    never reads an upload (``digging.py``). The stored report stands whatever happens here: the
    child's new report is dropped, and a file refused now leaves the upload without stores.
    Queued by ``manage.py backfill_explore``."""
    upload = jobs.upload_for_stores(upload_id)
    if upload is None:
        log.info("upload %s: explore stores not made (not done, gone, or it has them)", upload_id)
        return
    try:
        with _local_path(upload.blob_name) as path, tempfile.TemporaryDirectory(prefix="oomscope-explore-") as stores:
            runner.run_child(
                path,
                _child_limits(path),
                filename=upload.filename,
                oom_message=upload.oom_message,
                batch_size=upload.batch_size,
                cap_bytes=upload.cap_bytes,
                explore_dir=Path(stores),
            )
            kept = _keep_stores(upload, Path(stores), 0)
    except (SnapshotError, runner.ChildKilled, runner.ChildCrashed) as exc:
        log.warning("upload %s: explore stores not made: %s", upload_id, exc)
        return
    jobs.upload_add_stored_bytes(upload_id, kept)
    log.info("upload %s: explore stores made, %d bytes kept", upload_id, kept)


def _run_child_retrying_once(upload_id: int, path: Path, limits: runner.Limits, **kwargs: Any) -> runner.Analysis:
    """The analysis child's run; once more when something outside killed it (the kernel's OOM
    killer under pressure from elsewhere, an operator): that is neither the file's fault nor a
    limit of ours, and was reported as a CPU-time limit before (issue 22). Killed twice, it fails."""
    try:
        return runner.run_child(path, limits, **kwargs)
    except runner.ChildKilled as exc:
        log.warning("upload %s: %s; running it once more", upload_id, exc)
        jobs.upload_set_progress(upload_id, "reading", 0)
        return runner.run_child(path, limits, **kwargs)


_ANALYSES_HERE = True  # whether this worker consumes the analyses' queue (not the webhooks' worker alone)


@celeryd_after_setup.connect
def _note_the_queues(sender: Any = None, instance: Any = None, **_kwargs: Any) -> None:
    """Before the pool forks: a worker started with ``-Q`` for other queues only runs no analysis."""
    global _ANALYSES_HERE
    consumed = instance.app.amqp.queues.consume_from if instance is not None else None
    _ANALYSES_HERE = not consumed or str(app.conf.task_default_queue) in consumed


@worker_process_init.connect
def _start_spare_child(**_kwargs: Any) -> None:
    """Each pool process of a worker that runs analyses keeps one analysis child started ahead of
    its job (``warmchild``), from its main thread (the child's death signal follows the thread that
    started it)."""
    if settings.ANALYSIS_WARM_CHILD and _ANALYSES_HERE:
        warmchild.enable()


@worker_process_shutdown.connect
def _stop_spare_child(**_kwargs: Any) -> None:
    warmchild.disable()


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
        ids = jobs.uploads_requeue_dead_claims()
        for upload_id in ids:
            analyse_upload_task.delay(upload_id)
        if ids:
            log.warning("worker start: re-queued %d uploads whose worker process is gone: %s", len(ids), ids)
    except Exception:
        log.exception("worker start: re-queueing the uploads of a dead worker failed; the sweep will")
    finally:
        connections.close_all()  # the main process keeps no connection for the pool to inherit


@app.task(name="snapshots.sweep_uploads", ignore_result=True)
def sweep_uploads(**_future_kwargs: Any) -> int:
    """Store the results parked on a full disk, then re-publish uploads that are stuck (run by beat
    every ``SWEEP_INTERVAL_SECONDS``); an upload whose result is still parked is not run again."""
    stored, parked = store_parked_results()
    if stored:
        log.warning("sweep: stored %d results parked while the disk was full", stored)
    ids = jobs.uploads_requeue_stale(exclude=parked)
    for upload_id in ids:
        analyse_upload_task.delay(upload_id)
    if ids:
        log.warning("sweep: re-queued %d stale uploads: %s", len(ids), ids)
    return len(ids)


@app.task(name="snapshots.purge_failed_uploads", ignore_result=True)
def purge_failed_uploads(**_future_kwargs: Any) -> int:
    """Remove the files of failed uploads past their retention (beat, every ``PURGE_INTERVAL_SECONDS``)."""
    from webapp.snapshots.intake import disk

    purged = blobs.uploads_purge_failed()
    if purged:
        log.info("purge: removed the files of %d failed uploads", purged)
    # Past the task's hard time limit and gunicorn's timeout no live request or analysis uses them.
    stale = disk.purge_stale_temp_files(older_than_seconds=float(settings.CELERY_TASK_TIME_LIMIT) + 3600)
    if stale:
        log.info("purge: removed %d temp files and folders left by killed processes", stale)
    return purged


@app.task(name="snapshots.sweep_orphan_blobs", ignore_result=True)
def sweep_orphan_blobs(**_future_kwargs: Any) -> int:
    """Remove stored files no upload row names (beat, every ``PURGE_INTERVAL_SECONDS``;
    ``manage.py sweep_orphan_blobs`` by hand): ``blobs.blobs_sweep_orphans``."""
    removed = blobs.blobs_sweep_orphans()
    if removed:
        log.warning("orphan sweep: removed %d files no upload names: %s", len(removed), removed[:20])
    return len(removed)
