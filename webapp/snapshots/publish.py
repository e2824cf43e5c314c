"""The one place that publishes to the queue: an upload's analysis, a run's chord, a webhook, a backfill.

By task name (the tasks' explicit ``name=``, in ``worker/tasks.py`` and ``worker/runtasks.py``), so
nothing below the worker imports a task module (docs/architecture.md, "webapp/ in layers"). A
signature by name runs the registered task's ``apply_async`` where the process has it (the worker,
a test that imported it), else Celery's ``send_task``; the routes (``CELERY_TASK_ROUTES``) and the
beat read the same names. Each function raises when the broker cannot be reached: the caller
decides what waits for the sweep.
"""

from __future__ import annotations

from typing import Any

from celery import chord
from django.conf import settings

from webapp.celery import app

ANALYSE_UPLOAD = "snapshots.analyse_upload"
ANALYSE_RANK = "snapshots.analyse_rank"
SUMMARISE_RUN = "snapshots.summarise_run"
DELIVER_WEBHOOK = "snapshots.deliver_webhook"
BACKFILL_EXPLORE = "snapshots.backfill_explore"


def publish_upload(upload_id: int) -> None:
    """An upload's analysis, retried under ``CELERY_TASK_PUBLISH_RETRY_POLICY`` before it raises."""
    app.signature(ANALYSE_UPLOAD, args=(upload_id,)).apply_async(retry_policy=settings.CELERY_TASK_PUBLISH_RETRY_POLICY)


def run_chord(run_id: int, upload_ids: list[int]) -> Any:
    """The run's chord: its ranks in parallel, then its summary (immutable signatures: ids only)."""
    ranks = [app.signature(ANALYSE_RANK, args=(upload_id,), immutable=True) for upload_id in upload_ids]
    return chord(ranks, app.signature(SUMMARISE_RUN, args=(run_id,), immutable=True))


def publish_run(run_id: int, upload_ids: list[int]) -> None:
    run_chord(run_id, upload_ids).apply_async()


def publish_webhook(delivery_id: int) -> None:
    app.signature(DELIVER_WEBHOOK, args=(delivery_id,)).apply_async()


def publish_backfill(upload_id: int) -> None:
    """The explore stores of an upload analysed without them (``manage.py backfill_explore``)."""
    app.signature(BACKFILL_EXPLORE, args=(upload_id,)).apply_async()
