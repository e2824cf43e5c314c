"""The rows the worker works on: an upload claimed (one conditional UPDATE), its progress and
heartbeat, its outcome stored (``upload_finish``) or failed, a team's fair share of the slots
(``upload_should_yield``), and the sweep's requeues of stale or dead claims."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import OperationalError, transaction
from django.db.models import F, Q
from django.utils import timezone
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from analysis import readout
from analysis.stored import load
from webapp.snapshots import messages
from webapp.snapshots.models import Report, Upload
from webapp.snapshots.runs import followups, runs
from webapp.snapshots.worker import liveness

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

    AnyUser = User | AnonymousUser

log = logging.getLogger(__name__)


def _release_key(upload_id: int, task_id: str) -> str:
    return f"oomscope:claim-released:{upload_id}:{task_id}"


def claim_release(upload_id: int, task_id: str) -> None:
    """Note that this run of the upload is over although its row could not say so (its final
    write failed): ``_runs_it_still`` then no longer protects the claim. Best effort, in the cache
    (Redis: every process sees it); without it the claim is protected for the task's time limit."""
    from django.core.cache import cache

    try:
        cache.set(_release_key(upload_id, task_id), 1, timeout=int(settings.CELERY_TASK_TIME_LIMIT) + 60)
    except Exception as exc:
        log.warning("upload %s: claim release not noted: %s", upload_id, exc)


def _released(upload_id: int, task_id: str) -> bool:
    from django.core.cache import cache

    try:
        return bool(cache.get(_release_key(upload_id, task_id)))
    except Exception:
        return False


def _runs_it_still(claimed_by: str, started_at: datetime | None, upload_id: int = 0, task_id: str = "") -> bool:
    """The claiming process provably lives and may still be on this upload.

    A pool process outlives its task and takes the next one, so a live claimant alone does not
    prove it: past the task's hard time limit (Celery kills the process there) it is surely
    done with this upload, whatever the row says (e.g. its final write failed); and a run that
    noted its release (``claim_release``: its final write failed) is over at once.
    """
    if liveness.alive(claimed_by) is not True:
        return False
    if upload_id and _released(upload_id, task_id):
        return False
    limit = timedelta(seconds=float(settings.CELERY_TASK_TIME_LIMIT))
    return started_at is not None and started_at > timezone.now() - limit


def upload_should_yield(upload_id: int) -> bool:
    """Whether this queued upload should let another team's go first.

    True when its team already runs ``ANALYSIS_TEAM_CONCURRENCY`` analyses and an upload of
    another team is queued (and published): a team's uploads then never hold every worker slot
    while another team waits. Alone in the queue, a team uses every slot.
    """
    team_id = (
        Upload.objects.filter(pk=upload_id, status=Upload.Status.QUEUED)
        .values_list("project__team_id", flat=True)
        .first()
    )
    if team_id is None:
        return False  # gone, done or running: the claim says so
    running = Upload.objects.filter(status=Upload.Status.RUNNING, project__team_id=team_id).count()
    if running < settings.ANALYSIS_TEAM_CONCURRENCY:
        return False
    waiting = Upload.objects.filter(status=Upload.Status.QUEUED, queued_at__isnull=False).exclude(
        project__team_id=team_id
    )
    if not waiting.exists():
        return False
    # Re-published now: the sweep's stale-queued clock starts again.
    Upload.objects.filter(pk=upload_id, status=Upload.Status.QUEUED).update(queued_at=timezone.now())
    return True


def upload_claim_for_another_team(upload_id: int, claimant: str = "") -> Upload | None:
    """Claim, for the slot that defers ``upload_id``, the queued upload that should go before it: of
    another team, the least busy first (fewest running analyses), then the oldest; None when none
    could be claimed (another slot took them). The deferral then costs the deferred team a place in
    the queue, not the waiting team a wait behind every message the busy team queued (issue 36: an
    archive's 1,000 ranks each slept 0.5 s before another team's upload was reached)."""
    team_id = Upload.objects.filter(pk=upload_id).values_list("project__team_id", flat=True).first()
    if team_id is None:
        return None
    running: dict[int, int] = {}
    for team in Upload.objects.filter(status=Upload.Status.RUNNING).values_list("project__team_id", flat=True):
        running[team] = running.get(team, 0) + 1
    waiting = list(
        Upload.objects.filter(status=Upload.Status.QUEUED, queued_at__isnull=False)
        .exclude(project__team_id=team_id)
        .order_by("created_at", "pk")
        .values_list("pk", "project__team_id")[:SCHEDULER_LOOKS_AT]
    )
    waiting.sort(key=lambda row: running.get(row[1], 0))  # stable: the oldest first within a load
    for other_id, _team in waiting:
        claimed = upload_claim(other_id, task_id=None, claimant=claimant)
        if claimed is not None:
            return claimed
    return None


# The queued uploads of other teams the scheduler compares (the oldest ones).
SCHEDULER_LOOKS_AT = 50


def upload_claim(upload_id: int, task_id: str | None = None, claimant: str = "") -> Upload | None:
    """QUEUED -> RUNNING with one conditional UPDATE; None when another worker owns the row.

    The attempt is counted and committed before any work, so a file that kills its
    worker is stopped after ``ANALYSIS_MAX_ATTEMPTS`` tries instead of looping.
    ``claimant`` is the claiming process (``liveness.identity()``), kept in ``claimed_by``.
    A RUNNING row is claimed again only by the message that claimed it (same ``task_id``),
    and only when the process that claimed it is not provably alive: that message comes back
    when its pool process died (``reject_on_worker_lost``), after the visibility timeout, or
    when kombu restored it on a broker connection loss while the first run still goes on (that
    run is left to finish; a second one would only repeat it).
    """
    now = timezone.now()
    claimable = Q(status=Upload.Status.QUEUED)
    if task_id:
        previous = (
            Upload.objects.filter(pk=upload_id, status=Upload.Status.RUNNING, task_id=task_id)
            .values_list("claimed_by", "started_at")
            .first()
        )
        if previous is not None:
            if _runs_it_still(*previous, upload_id=upload_id, task_id=task_id):
                log.warning(
                    "upload %s: message %s redelivered while its first run is alive; left to it", upload_id, task_id
                )
            else:
                claimable |= Q(status=Upload.Status.RUNNING, task_id=task_id, claimed_by=previous[0])
    with transaction.atomic():
        claimed = Upload.objects.filter(claimable, pk=upload_id).update(
            task_id=task_id or "",
            claimed_by=claimant[:200],
            status=Upload.Status.RUNNING,
            attempts=F("attempts") + 1,
            started_at=now,
            heartbeat_at=now,
            stage="reading",
            progress=0,
        )
    if claimed != 1:
        return None
    return Upload.objects.select_related("project").get(pk=upload_id)


def upload_set_progress(upload_id: int, stage: str | None, progress: int | None) -> None:
    """Record the stage reached (and the heartbeat the sweep watches)."""
    fields: dict[str, Any] = {"heartbeat_at": timezone.now()}
    if stage:
        fields["stage"] = stage[:20]
    if progress is not None:
        fields["progress"] = max(0, min(100, int(progress)))
    Upload.objects.filter(pk=upload_id, status=Upload.Status.RUNNING).update(**fields)


def summary_from_report(report: dict[str, Any]) -> dict[str, Any]:
    """The few figures kept on the row for lists, history and the API (``analysis.readout.row_summary``), of
    ``report`` in the current shape and read once, typed (``analysis.stored.load``; upgraded in place)."""
    return readout.row_summary(load(report))


# The finish step writes megabytes of report JSON once per upload; losing the analysis to a
# transient lock (SQLite's "database is locked", PostgreSQL's deadlock/serialization or a
# dropped connection, all OperationalError) would throw minutes of work away. Bounded: 5 tries over about 15 s, then the
# error propagates (worker:internal). The transaction is whole or absent, so retrying is safe.
db_write_retry = retry(
    retry=retry_if_exception_type(OperationalError),
    stop=stop_after_attempt(5),
    wait=wait_random_exponential(multiplier=0.5, max=8),
    reraise=True,
    before_sleep=lambda state: log.warning(
        "database write retried (attempt %d): %s",
        state.attempt_number,
        state.outcome.exception() if state.outcome else "",
    ),
)


@db_write_retry
def upload_finish(upload_id: int, *, report: dict[str, Any], charts: dict[str, Any], stored_bytes: int = 0) -> bool:
    """Store the outcome; False when the upload was deleted during its analysis (nothing stored).

    ``stored_bytes``: what the analysis added to the disk (report, charts, explore stores), which
    the team's quota counts from now on.
    """
    with transaction.atomic():
        # Locked (PostgreSQL) / under the IMMEDIATE write lock (SQLite), so a DELETE cannot slip
        # in between: an upload deleted while it was analysed keeps no orphan report.
        if not Upload.objects.select_for_update().filter(pk=upload_id).exists():
            log.info("upload %s: deleted during its analysis; report dropped", upload_id)
            return False
        Report.objects.update_or_create(upload_id=upload_id, defaults={"data": report, "charts": charts})
        source = report.get("source") or {}
        Upload.objects.filter(pk=upload_id).update(
            status=Upload.Status.DONE,
            stage="done",
            progress=100,
            summary=summary_from_report(report),
            format=str(source.get("format") or "")[:20] or F("format"),
            error_code="",
            error_message="",
            finished_at=timezone.now(),
            stored_bytes=max(0, int(stored_bytes)),
        )
    runs.upload_settled(upload_id)
    followups.settle(upload_id)
    return True


@db_write_retry
def uploads_without_stores(codes: list[str] | None = None) -> list[int]:
    """Done uploads whose bytes have no explore store (analysed before stores existed, or their
    stores not kept): one upload per distinct file, oldest first; ``codes`` narrows to those."""
    from webapp.snapshots.intake.blobs import has_stores

    rows = Upload.objects.filter(status=Upload.Status.DONE).exclude(blob_name="").order_by("id")
    if codes is not None:
        rows = rows.filter(code__in=codes)
    seen: set[str] = set()
    out: list[int] = []
    for upload_id, sha256 in rows.values_list("id", "sha256"):
        if sha256 in seen:
            continue
        seen.add(sha256)
        if not has_stores(sha256):
            out.append(upload_id)
    return out


def upload_for_stores(upload_id: int) -> Upload | None:
    """The done upload ``upload_id`` while its bytes have no explore store yet, else None."""
    from webapp.snapshots.intake.blobs import has_stores

    upload = (
        Upload.objects.filter(pk=upload_id, status=Upload.Status.DONE)
        .exclude(blob_name="")
        .select_related("project")
        .first()
    )
    if upload is None or has_stores(upload.sha256):
        return None
    return upload


def upload_add_stored_bytes(upload_id: int, size: int) -> None:
    """Count ``size`` more bytes kept for the upload (its explore stores, made after its analysis)."""
    if size > 0:
        Upload.objects.filter(pk=upload_id).update(stored_bytes=F("stored_bytes") + int(size))


def upload_fail(upload_id: int, code: str, detail: str = "") -> None:
    Upload.objects.filter(pk=upload_id).exclude(status=Upload.Status.DONE).update(
        status=Upload.Status.FAILED,
        stage="failed",
        error_code=code[:80],
        error_message=messages.error_message(code, detail),
        finished_at=timezone.now(),
    )
    runs.upload_settled(upload_id)


def uploads_requeue_stale(exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Uploads to publish again: stale RUNNING rows go back to QUEUED; old QUEUED rows are re-sent.

    Covers a worker killed mid-analysis (its heartbeat stops), a message lost between
    commit and publish, and a broker that lost its queue. Rows past the attempt limit are
    failed here instead of looping. A RUNNING row whose claiming process provably still runs
    (``liveness``), within the task's hard time limit, is left to it however old its heartbeat;
    ``exclude``: uploads whose result is parked (``tasks.store_parked_results``), not to run again.
    """
    now = timezone.now()
    stale_running = now - timedelta(seconds=settings.SWEEP_STALE_RUNNING_SECONDS)
    stale_queued = now - timedelta(seconds=settings.SWEEP_STALE_QUEUED_SECONDS)
    ids: list[int] = []
    for upload in (
        Upload.objects.filter(
            Q(status=Upload.Status.RUNNING, heartbeat_at__lt=stale_running)
            | Q(status=Upload.Status.QUEUED, queued_at__lt=stale_queued)
            # publish failed at upload time (broker down): send it at the next sweep
            | Q(status=Upload.Status.QUEUED, queued_at__isnull=True)
        )
        .exclude(pk__in=list(exclude))
        .only("id", "status", "attempts", "claimed_by", "started_at", "task_id")
    ):
        if upload.status == Upload.Status.RUNNING and _runs_it_still(
            upload.claimed_by, upload.started_at, upload.id, upload.task_id
        ):
            continue  # a quiet heartbeat, but its process runs it: never run it twice
        if upload.status == Upload.Status.RUNNING and upload.attempts >= settings.ANALYSIS_MAX_ATTEMPTS:
            upload_fail(upload.id, "worker:killed-repeatedly")
            continue
        moved = Upload.objects.filter(pk=upload.pk, status=upload.status).update(
            status=Upload.Status.QUEUED, queued_at=now, stage="", progress=0
        )
        if moved == 1:
            ids.append(upload.id)
    return ids


def uploads_requeue_dead_claims() -> list[int]:
    """RUNNING uploads whose claiming process is provably gone: back to QUEUED now, to publish.

    Run when a worker starts (``worker_ready``): after its main process was killed, the upload it
    was analysing would otherwise wait for the sweep's stale heartbeat. Only claims judged dead
    by ``liveness.alive`` (this machine, this pid namespace) are taken; a live one, or one made
    elsewhere, is left alone. The next claim counts as an attempt; at the limit the row fails.
    """
    now = timezone.now()
    ids: list[int] = []
    running = Upload.objects.filter(status=Upload.Status.RUNNING).exclude(claimed_by="")
    for upload in running.only("id", "attempts", "claimed_by"):
        if liveness.alive(upload.claimed_by) is not False:
            continue
        if upload.attempts >= settings.ANALYSIS_MAX_ATTEMPTS:
            upload_fail(upload.id, "worker:killed-repeatedly")
            continue
        moved = Upload.objects.filter(pk=upload.pk, status=Upload.Status.RUNNING, claimed_by=upload.claimed_by).update(
            status=Upload.Status.QUEUED, queued_at=now, stage="", progress=0
        )
        if moved == 1:
            ids.append(upload.id)
    return ids
