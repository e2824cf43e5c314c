"""Celery tasks of runs: a run's ranks as one chord, the webhook, retention.

``run_chord`` is the run's analysis: one ``analyse_rank`` per rank (each is the ordinary
per-upload analysis, with its claim, limits and outcome in the Upload row) in parallel on
whatever workers take them, then ``summarise_run`` once all have returned. A chord needs a
result backend (``CELERY_RESULT_BACKEND``: the broker's Redis) to count its finished parts.
The parts store no result of their own (``ignore_result``): the Redis backend counts a part
when it returns, in the chord's own join key, whether or not its result is stored, and a part
that stores none spares the publisher (a web process) a subscription to each part's result
channel. The outcome of each part is in its Upload row anyway. Imported by ``tasks.py`` so the
worker registers them.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from webapp.celery import app
from webapp.snapshots.runs import runs
from webapp.snapshots.runs.webhooks import WebhookError

log = logging.getLogger(__name__)

# The summary waits for ranks that another message is still analysing (the sweep's, or a
# redelivery): every SUMMARY_RETRY_SECONDS, up to the analysis's own hard limit and a margin.
SUMMARY_RETRY_SECONDS = 5


def _summary_retries() -> int:
    from django.conf import settings

    return int(settings.CELERY_TASK_TIME_LIMIT) // SUMMARY_RETRY_SECONDS + 12


@app.task(bind=True, name="snapshots.analyse_rank", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def analyse_rank(self: Any, upload_id: int, **_future_kwargs: Any) -> int:
    """One rank of a run: the per-upload analysis (a no-op when another message claimed it).

    It never fails the chord: a part that raised would keep the summary from ever running, while
    the rank's outcome is in its Upload row anyway (an error there is the row's FAILED state, or,
    for a failure before the claim, a row still QUEUED that the sweep publishes again and the
    summary waits for).
    """
    from webapp.snapshots.worker.tasks import analyse_upload

    try:
        analyse_upload(upload_id)
    except Exception:
        log.exception("run rank %s: analysis raised; the summary waits for its row", upload_id)
    return upload_id


@app.task(bind=True, name="snapshots.summarise_run", acks_late=True, ignore_result=True, max_retries=None)
def summarise_run(self: Any, run_id: int, **_future_kwargs: Any) -> str:
    """The run's summary, baseline comparison and alert, once every rank is analysed."""
    state = runs.run_summarise(run_id)
    if state == "pending":
        if self.request.retries >= _summary_retries():
            log.error("run %s: ranks still unfinished after %d tries; not summarised", run_id, self.request.retries)
            return state
        raise self.retry(countdown=SUMMARY_RETRY_SECONDS)
    log.info("run %s: summary %s", run_id, state)
    return state


# Retries of a webhook: 2, 4, 8, ... seconds (capped at 10 minutes), 8 tries in all, none starting past
# WEBHOOK_DEADLINE_SECONDS after the alert; a receiver that answers 4xx other than 408/429 is not
# retried (the URL or its secret is wrong: webhooks.post). On its own queue (settings.CELERY_TASK_ROUTES)
# and worker; an attempt past WEBHOOK_ATTEMPT_SECONDS (a receiver that accepts and never answers, or
# answers a byte at a time) is stopped by the soft time limit, and the pool process killed 5 s later.
WEBHOOK_RETRIES = 7
WEBHOOK_BACKOFF_MAX = 600


@app.task(
    bind=True,
    name="snapshots.deliver_webhook",
    max_retries=WEBHOOK_RETRIES,
    ignore_result=True,
    soft_time_limit=settings.WEBHOOK_ATTEMPT_SECONDS,
    time_limit=settings.WEBHOOK_ATTEMPT_SECONDS + 5,
)
def deliver_webhook(self: Any, delivery_id: int, **_future_kwargs: Any) -> bool:
    left = runs.webhook_seconds_left(delivery_id)
    if left is None:
        return False  # gone, or delivered already
    if left <= 0:
        runs.webhook_record_error(delivery_id, "not delivered within WEBHOOK_DEADLINE_SECONDS; given up")
        log.warning("webhook %s: past its deadline; given up", delivery_id)
        return False
    try:
        return runs.webhook_attempt(delivery_id)
    except SoftTimeLimitExceeded:
        err = WebhookError(f"no answer within {settings.WEBHOOK_ATTEMPT_SECONDS} s")
        runs.webhook_record_error(delivery_id, str(err))
    except WebhookError as exc:
        err = exc
        if not err.retry:
            log.warning("webhook %s: refused for good: %s", delivery_id, err)
            return False
    countdown = min(WEBHOOK_BACKOFF_MAX, 2 * 2**self.request.retries)
    if self.request.retries >= WEBHOOK_RETRIES or countdown >= left:
        runs.webhook_record_error(delivery_id, f"{err}; no more tries (deadline or {WEBHOOK_RETRIES + 1} tries)")
        log.warning("webhook %s: attempt %d failed: %s; given up", delivery_id, self.request.retries + 1, err)
        return False
    log.warning("webhook %s: attempt %d failed: %s", delivery_id, self.request.retries + 1, err)
    raise self.retry(exc=err, countdown=countdown)


@app.task(name="snapshots.close_stale_runs", ignore_result=True)
def close_stale_runs(**_future_kwargs: Any) -> int:
    """Publish the chord of runs whose missing ranks never came (beat, with the sweep)."""
    from webapp.snapshots.runs.runs import publish_run, runs_close_stale

    closed = runs_close_stale()
    for run_id in closed:
        publish_run(run_id)
    if closed:
        log.warning("runs %s: ranks missing after RUN_COLLECT_SECONDS; analysed with those present", closed)
    return len(closed)


@app.task(name="snapshots.purge_old_runs", ignore_result=True)
def purge_old_runs(**_future_kwargs: Any) -> int:
    """Delete runs past their project's retention (beat, with the failed-upload purge)."""
    deleted = runs.runs_purge_expired()
    if deleted:
        log.info("retention: deleted %d runs", deleted)
    return deleted
