"""Runs: the uploads of one training job (one per rank) read as one, compared with a baseline.

Only this module and ``services.py`` write ``Run``, ``RunPolicy`` and ``WebhookDelivery`` rows;
views, the API and the tasks call these functions. Access goes through ``services``: a run is
visible when its project is (``run_for_user``).

The life of a run:
1. each upload that names a ``run`` joins the project's Run of that name (``run_attach``, inside
   the upload's transaction). Its metadata (commit, branch, host, torch version, world size, rank,
   job id) comes from the API's or the form's fields, which the client fills from the launcher's
   environment and ``git``. A rank of a run of several ranks is not published alone;
2. once the run holds as many ranks as its world size, its analysis is published as one Celery
   chord (``publish.run_chord``): one ``analyse_rank`` per rank, which runs the ordinary
   per-upload analysis, then ``summarise_run``. A one-process run (world size 1 or none given) is
   published as any upload and summarised when its analysis ends (``upload_settled``, called by
   ``jobs.upload_finish``/``upload_fail``). A run that never fills (a rank that never
   uploaded) is analysed with the ranks it has ``RUN_COLLECT_SECONDS`` after it began
   (``runs_close_stale``, beat), or at once when asked (``POST /api/v1/runs/<id>/analyse``); its
   ranks are analysed alone before that by the sweep, as any queued upload;
3. ``run_summarise`` stores ``analysis.runs``' summary, then compares the run with the project's
   baseline (``analysis.regression``) and, past the threshold, queues the webhook.
"""

from __future__ import annotations

import logging
import secrets
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from analysis.noise import learn
from analysis.regression import Regression, compare_runs
from analysis.runs import RankInput, summarise
from analysis.stored import upgrade
from webapp.snapshots import messages, publish
from webapp.snapshots.models import PolicyChange, Project, Report, Run, RunPolicy, Upload, WebhookDelivery
from webapp.snapshots.runs import followups

if TYPE_CHECKING:
    from django.http import HttpRequest

    from webapp.snapshots.teams.access import AnyUser

log = logging.getLogger(__name__)

# What an upload may say of its job besides ``run``, ``rank`` and ``tags`` (Upload.meta; the
# client reads them from torchrun's and Slurm's environment and from git).
RUN_META_KEYS = ("commit", "branch", "host", "torch_version", "job_id", "world_size", "local_rank", "error")
# Meta keys copied onto the Run (the first upload that gives one sets it).
RUN_COLUMNS = ("commit", "branch", "host", "torch_version", "job_id")


def new_run_code() -> str:
    return secrets.token_urlsafe(12)


# --- joining a run -------------------------------------------------------------------------


def run_attach(upload: Upload, meta: dict[str, Any]) -> bool:
    """Put ``upload`` into the Run its ``run`` name names; True when the run owns its publishing.

    Called inside the upload's transaction. The Run row is locked while its ranks are counted, so
    two ranks committing at once cannot both see an incomplete run (PostgreSQL's row lock; SQLite
    runs one write transaction at a time anyway). An upload without a run name stays alone.
    """
    if not upload.run:
        return False
    world_size = meta.get("world_size")
    defaults: dict[str, Any] = {
        "code": new_run_code(),
        "world_size": world_size,
        "tags": list(upload.tags or []),
        **{key: str(meta.get(key) or "")[:200] for key in RUN_COLUMNS},
    }
    run, created = Run.objects.select_for_update().get_or_create(
        project=upload.project, name=upload.run, defaults=defaults
    )
    if not created:
        changed = [key for key in RUN_COLUMNS if not getattr(run, key) and meta.get(key)]
        for key in changed:
            setattr(run, key, str(meta[key])[:200])
        if run.world_size is None and world_size:
            run.world_size = world_size
            changed.append("world_size")
        if changed:
            run.save(update_fields=changed)
    ranks = run.world_size or 1
    rank = meta.get("rank")
    if rank is None:
        # One process: rank 0 (a later upload replaces it); a rank-less upload into a bigger run
        # takes the next number.
        rank = 0 if ranks == 1 else run.uploads.exclude(pk=upload.pk).count()
    Upload.objects.filter(pk=upload.pk).update(run_ref=run, rank=rank, meta=_meta_only(meta))
    upload.run_ref, upload.rank = run, rank
    if ranks == 1:
        # Published alone, as any upload; its summary is made when its analysis ends (upload_settled).
        Run.objects.filter(pk=run.pk).update(status=Run.Status.ANALYSING)
        return False
    if _ranks_present(run) >= ranks:
        Run.objects.filter(pk=run.pk).update(status=Run.Status.ANALYSING)
        run_id = run.pk
        transaction.on_commit(lambda: publish_run(run_id))
    return True


def upload_settled(upload_id: int) -> None:
    """After an upload's analysis ended (done or failed): a one-process run is summarised now.
    A run of several ranks is summarised by its chord's last task, not here."""
    run = Run.objects.filter(uploads__pk=upload_id).first()
    if run is None or (run.world_size or 1) > 1:
        return
    try:
        run_summarise(run.pk)
    except Exception:
        # The upload's own outcome is stored already; a summary bug must not turn it into a failure.
        log.exception("run %s: summary failed", run.pk)


def _meta_only(meta: dict[str, Any]) -> dict[str, Any]:
    return {key: meta[key] for key in RUN_META_KEYS if meta.get(key) not in (None, "")}


def _ranks_present(run: Run) -> int:
    return run.uploads.exclude(rank__isnull=True).values("rank").distinct().count()


def publish_run(run_id: int) -> bool:
    """Send the run's chord; on a broker outage the ranks stay queued for the sweep (logged)."""
    ids = list(Upload.objects.filter(run_ref_id=run_id).order_by("rank", "-created_at").values_list("id", flat=True))
    try:
        publish.publish_run(run_id, ids)
    except Exception as exc:
        log.warning("run %s: publishing its chord failed (%s); the sweep analyses its ranks alone", run_id, exc)
        return False
    return True


def run_analyse_now(run: Run) -> None:
    """Analyse the ranks the run has, however many its world size said (a rank never came)."""
    Run.objects.filter(pk=run.pk).update(status=Run.Status.ANALYSING)
    run_id = run.pk
    transaction.on_commit(lambda: publish_run(run_id))


def runs_close_stale() -> list[int]:
    """Runs still waiting for ranks ``RUN_COLLECT_SECONDS`` after they began: analysed with the
    ranks they have (a rank that never uploads must not keep the run from its summary)."""
    cutoff = timezone.now() - timedelta(seconds=int(getattr(settings, "RUN_COLLECT_SECONDS", 600)))
    closed = []
    for run in Run.objects.filter(status=Run.Status.COLLECTING, created_at__lt=cutoff):
        if Run.objects.filter(pk=run.pk, status=Run.Status.COLLECTING).update(status=Run.Status.ANALYSING) == 1:
            closed.append(run.pk)
    return closed


# --- the summary, the baseline, the regression -------------------------------------------------


def _latest_per_rank(run: Run) -> list[Upload]:
    newest: dict[int, Upload] = {}
    for upload in run.uploads.exclude(rank__isnull=True).order_by("-created_at", "-id"):
        newest.setdefault(int(upload.rank or 0), upload)
    return [newest[rank] for rank in sorted(newest)]


def run_summarise(run_id: int) -> str:
    """Summarise the run once every rank is analysed: ``pending`` (some rank still queued or
    running: the task retries), ``gone`` (deleted meanwhile) or ``done``."""
    run = Run.objects.select_related("project").filter(pk=run_id).first()
    if run is None:
        return "gone"
    uploads = _latest_per_rank(run)
    if any(u.status in (Upload.Status.QUEUED, Upload.Status.RUNNING) for u in uploads):
        return "pending"
    reports = dict(Report.objects.filter(upload__in=uploads).values_list("upload_id", "data"))
    items = []
    for upload in uploads:
        report = upgrade(reports.get(upload.pk) or {"source": {"filename": upload.filename}, "devices": []})
        error = (upload.meta or {}).get("error") or (
            upload.error_message if upload.status == Upload.Status.FAILED else None
        )
        items.append(RankInput(rank=int(upload.rank or 0), report=report, error=error))
    summary = summarise(items, world_size=run.world_size or len(items)).to_dict()
    with transaction.atomic():
        if (
            Run.objects.filter(pk=run.pk).update(summary=summary, status=Run.Status.DONE, finished_at=timezone.now())
            != 1
        ):
            return "gone"
        run.summary = summary
        regression = run_compare(run)
        Run.objects.filter(pk=run.pk).update(regression=regression.to_dict() if regression else None)
        if regression is not None and regression.regressed:
            _queue_webhook(run, regression)
    if (run.world_size or 1) > 1:
        followups.settle_run(run)  # issue 33: a run of several ranks that follows an incident, scored as one
    return "done"


def policy_for(project: Project) -> RunPolicy:
    policy, _ = RunPolicy.objects.get_or_create(project=project, defaults={"webhook_secret": secrets.token_hex(32)})
    return policy


def baseline_for(run: Run, policy: RunPolicy | None = None) -> Run | None:
    """The run this one is compared with: the pinned baseline, or the newest finished run on the
    project's main branch that was created before it (never the run itself)."""
    policy = policy or policy_for(run.project)
    if policy.baseline == RunPolicy.Baseline.PINNED:
        base = policy.baseline_run
        return base if base is not None and base.pk != run.pk and base.summary else None
    earlier = Q(created_at__lt=run.created_at) | Q(created_at=run.created_at, pk__lt=run.pk)
    return (
        Run.objects.filter(earlier, project=run.project, branch=policy.main_branch, status=Run.Status.DONE)
        .exclude(pk=run.pk)
        .order_by("-created_at", "-id")
        .first()
    )


# Runs of the baseline branch the gate learns its noise from (analysis.noise): the newest this many,
# up to and including the baseline. Ten keeps a leak fixed in the past from weighing on today's gate.
NOISE_RUNS = 10


def noise_window(run: Run, base: Run, policy: RunPolicy) -> list[Run]:
    """The baseline branch's finished runs up to the baseline (itself last), oldest first; ``run``
    itself is never one of them."""
    upto = Q(created_at__lt=base.created_at) | Q(created_at=base.created_at, pk__lt=base.pk)
    earlier = (
        Run.objects.filter(upto, project=run.project, branch=policy.main_branch, status=Run.Status.DONE)
        .exclude(pk__in=(run.pk, base.pk))
        .exclude(summary__isnull=True)
        .order_by("-created_at", "-id")[: NOISE_RUNS - 1]
    )
    return [*reversed(list(earlier)), base]


def run_compare(run: Run, *, max_regression_pct: float | None = None) -> Regression | None:
    """``run`` against its baseline (None without a baseline or before its summary): each figure
    against the noise of the baseline branch's runs (``analysis.noise``) where there are enough of
    them, else the peak against the project's threshold; a ``max_regression_pct`` given (the
    gate's ``--max-regression``) overrides both with that fixed threshold."""
    policy = policy_for(run.project)
    base = baseline_for(run, policy)
    if base is None or not base.summary or not run.summary:
        return None
    noise = None
    if max_regression_pct is None:
        noise = learn([(r.commit or None, r.summary or {}) for r in noise_window(run, base, policy)])
    return compare_runs(
        base.summary,
        run.summary,
        max_regression_pct=policy.max_regression_pct if max_regression_pct is None else max_regression_pct,
        baseline_name=f"baseline {base.name}",
        run_name=f"run {run.name}",
        noise=noise,
    )


def baseline_pin(project: Project, run: Run | None, *, by: Any = None, token: Any = None) -> RunPolicy:
    """Pin ``run`` as the project's baseline; None goes back to "the latest run on main". Recorded
    (``PolicyChange``) with ``by`` (the user) and ``token`` (the API token used, if any)."""
    policy = policy_for(project)
    before = policy.baseline_run.name if policy.baseline_run else "the latest run on main"
    policy.baseline_run = run
    policy.baseline = RunPolicy.Baseline.PINNED if run is not None else RunPolicy.Baseline.LATEST_MAIN
    with transaction.atomic():
        policy.save(update_fields=["baseline_run", "baseline"])
        after = run.name if run is not None else "the latest run on main"
        _record(project, by, token, [f"baseline: {before} -> {after}"])
    return policy


def policy_update(project: Project, *, by: Any = None, token: Any = None, **fields: Any) -> RunPolicy:
    """Set the threshold, main branch, webhook URL or retention (the keys given, already validated);
    each change recorded (``PolicyChange``: who, when, what; the webhook's URL, never its secret)."""
    policy = policy_for(project)
    allowed = {"max_regression_pct", "main_branch", "webhook_url", "retention_days"}
    changed = []
    for key, value in fields.items():
        if key in allowed and getattr(policy, key) != value:
            changed.append(f"{key}: {getattr(policy, key)!r} -> {value!r}")
            setattr(policy, key, value)
    with transaction.atomic():
        policy.save()
        _record(project, by, token, changed)
    return policy


def _record(project: Project, by: Any, token: Any, changes: list[str]) -> None:
    user = by if getattr(by, "is_authenticated", False) else None
    for what in changes:
        PolicyChange.objects.create(
            project=project, user=user, token_prefix=getattr(token, "prefix", "") or "", what=what[:600]
        )


def policy_changes(project: Project, limit: int = 20) -> list[dict[str, Any]]:
    """The newest recorded changes of the project's gate."""
    rows = PolicyChange.objects.filter(project=project).select_related("user")[:limit]
    return [
        {
            "at": c.at.isoformat(),
            "user": c.user.get_username() if c.user else None,
            "token": c.token_prefix or None,
            "what": c.what,
        }
        for c in rows
    ]


# --- the webhook -----------------------------------------------------------------------------


def _queue_webhook(run: Run, regression: Regression) -> None:
    policy = policy_for(run.project)
    if not policy.webhook_url:
        return
    delivery = WebhookDelivery.objects.create(run=run, url=policy.webhook_url)
    delivery_id = delivery.pk

    def send() -> None:
        try:
            publish.publish_webhook(delivery_id)
        except Exception as exc:
            log.warning("webhook %s: publish failed: %s", delivery_id, exc)

    transaction.on_commit(send)


def webhook_attempt(delivery_id: int) -> bool:
    """One POST of the delivery's alert; True when the receiver took it (2xx). Raises
    ``webhooks.WebhookError`` for an answer worth retrying (the task retries with backoff)."""
    from webapp.snapshots.runs import webhooks

    delivery = WebhookDelivery.objects.select_related("run", "run__project").filter(pk=delivery_id).first()
    if delivery is None or delivery.delivered_at is not None:
        return False
    policy = policy_for(delivery.run.project)
    WebhookDelivery.objects.filter(pk=delivery_id).update(attempts=delivery.attempts + 1)
    body = webhooks.payload(delivery.run, delivery.run.regression or {}, run_url(delivery.run))
    try:
        allow_private = bool(getattr(settings, "WEBHOOK_ALLOW_PRIVATE_HOSTS", False))
        status = webhooks.post(delivery.url, policy.webhook_secret, body, allow_private=allow_private)
    except webhooks.WebhookError as err:
        WebhookDelivery.objects.filter(pk=delivery_id).update(status_code=err.status, error=str(err)[:300])
        raise
    WebhookDelivery.objects.filter(pk=delivery_id).update(status_code=status, error="", delivered_at=timezone.now())
    return True


def webhook_deliveries(project: Project, limit: int = 10) -> list[dict[str, Any]]:
    """The project's newest alert deliveries: each one's status and last error (issue 35: a refused
    delivery was visible only in the worker's log)."""
    rows = WebhookDelivery.objects.filter(run__project=project).select_related("run").order_by("-created_at", "-id")
    return [
        {
            "run": d.run.name,
            "run_code": d.run.code,
            "url": d.url,
            "attempts": d.attempts,
            "status_code": d.status_code,
            "error": d.error,
            "created_at": d.created_at.isoformat(),
            "delivered_at": d.delivered_at.isoformat() if d.delivered_at else None,
            "state": "delivered" if d.delivered_at else ("failed" if d.error else "pending"),
        }
        for d in rows[:limit]
    ]


WEBHOOK_TEST_TIMEOUT = 5.0  # a page waits for it: shorter than a delivery's


def webhook_test(project: Project) -> dict[str, Any]:
    """Send a test alert to the project's webhook now, as a delivery is sent (signed, to the one
    address checked, no redirect): ``{"delivered", "status", "error"}``."""
    from webapp.snapshots.runs import webhooks

    policy = policy_for(project)
    if not policy.webhook_url:
        return {"delivered": False, "status": None, "error": messages.WEBHOOK_NONE}
    body = {
        "text": f"oomscope: a test alert from project {project.slug}; regression alerts will look like this.",
        "oomscope": {
            "project": project.slug,
            "test": True,
            "url": site_path(reverse("snapshots:project_runs", args=[project.slug])),
        },
    }
    allow_private = bool(getattr(settings, "WEBHOOK_ALLOW_PRIVATE_HOSTS", False))
    try:
        status = webhooks.post(
            policy.webhook_url, policy.webhook_secret, body, timeout=WEBHOOK_TEST_TIMEOUT, allow_private=allow_private
        )
    except webhooks.WebhookError as err:
        return {"delivered": False, "status": err.status, "error": str(err)[:300]}
    return {"delivered": True, "status": status, "error": ""}


# --- retention and deletion --------------------------------------------------------------------


def run_delete(run: Run) -> None:
    """Delete the run and its uploads; their reports go by cascade and their files after commit
    (the upload's ``post_delete`` receiver). A pinned baseline that goes is unpinned (SET_NULL)."""
    with transaction.atomic():
        for upload in run.uploads.all():
            upload.delete()  # one by one: each row's receiver takes its file
        run.delete()


def runs_purge_expired() -> int:
    """Delete the runs older than their project's ``retention_days`` (never a pinned baseline)."""
    deleted = 0
    for policy in RunPolicy.objects.filter(retention_days__isnull=False).select_related("project"):
        cutoff = timezone.now() - timedelta(days=int(policy.retention_days or 0))
        old = Run.objects.filter(project=policy.project, created_at__lt=cutoff)
        if policy.baseline_run_id:
            old = old.exclude(pk=policy.baseline_run_id)
        for run in old:
            run_delete(run)
            deleted += 1
    return deleted


# --- reading, for a user --------------------------------------------------------------------------


def run_for_user(user: AnyUser, code: str) -> Run | None:
    from webapp.snapshots.teams.access import visible_projects

    return (
        Run.objects.filter(code=code, project__in=visible_projects(user))
        .select_related("project", "project__team")
        .first()
    )


def runs_of(project: Project, *, branch: str = "", tag: str = "") -> QuerySet[Run]:
    runs = Run.objects.filter(project=project)
    if branch:
        runs = runs.filter(branch=branch)
    if tag:
        # JSON containment is not on SQLite; the tag list is short, so filter here by id.
        ids = [r.pk for r in runs.only("id", "tags") if tag in (r.tags or [])]
        runs = runs.filter(pk__in=ids)
    return runs


def run_url(run: Run, request: HttpRequest | None = None) -> str:
    path = reverse("snapshots:run", args=[run.code])
    if request is not None:
        return request.build_absolute_uri(path)
    return site_path(path)


def site_path(path: str) -> str:
    """``path`` under ``SITE_URL`` (relative while it is unset: the settings page says so)."""
    return (getattr(settings, "SITE_URL", "") or "").rstrip("/") + path


def run_dict(run: Run, request: HttpRequest | None = None, *, ranks: bool = True) -> dict[str, Any]:
    summary = run.summary or {}
    head = summary.get("run") or {}
    out: dict[str, Any] = {
        "id": run.code,
        "project": run.project.slug,
        "name": run.name,
        "status": run.status,
        "commit": run.commit,
        "branch": run.branch,
        "host": run.host,
        "torch_version": run.torch_version,
        "job_id": run.job_id,
        "world_size": run.world_size,
        "tags": list(run.tags or []),
        "created_at": run.created_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "url": run_url(run, request),
        "api_url": request.build_absolute_uri(reverse("api:run", args=[run.code])) if request is not None else None,
        "peak_reserved_bytes": head.get("peak_reserved_bytes"),
        "first_oom_rank": head.get("first_oom_rank"),
        "oom": bool(head.get("oom_ranks")),
        "imbalance": (head.get("imbalance") or {}).get("peak_reserved"),
        "summary": summary or None,
        "regression": run.regression,
        "regressed": bool((run.regression or {}).get("regressed")),
    }
    if ranks:
        out["uploads"] = [
            {
                "rank": u.rank,
                "id": u.code,
                "status": u.status,
                "filename": u.filename,
                "url": request.build_absolute_uri(reverse("snapshots:detail", args=[u.code]))
                if request is not None
                else reverse("snapshots:detail", args=[u.code]),
                "api_url": request.build_absolute_uri(reverse("api:snapshot", args=[u.code]))
                if request is not None
                else None,
                "error": {"code": u.error_code, "message": u.error_message} if u.error_code else None,
            }
            for u in run.uploads.order_by("rank", "-created_at")
        ]
    return out


def policy_dict(policy: RunPolicy, *, show_secret: bool) -> dict[str, Any]:
    return {
        "baseline": policy.baseline,
        "baseline_run": policy.baseline_run.code if policy.baseline_run else None,
        "baseline_run_name": policy.baseline_run.name if policy.baseline_run else None,
        "main_branch": policy.main_branch,
        "max_regression_pct": policy.max_regression_pct,
        "webhook_url": policy.webhook_url,
        "webhook_secret": policy.webhook_secret if show_secret else None,
        "retention_days": policy.retention_days,
    }


# The trend chart is drawn as inline SVG from these points (no script): x and y in the chart's own
# units (0..TREND_W, 0..TREND_H, y down), computed here so the template only places them. The y axis
# starts at zero and ends at a round size (TREND_TICKS steps), so 4.46 against 4.99 GiB looks as near as it is.
TREND_W, TREND_H, TREND_PAD = 720, 220, 24
TREND_LEFT = 84  # room for the y axis's labels ("12.00 GiB")
TREND_BOTTOM = 40  # room for the x axis's labels (the first and the last run)
TREND_TICKS = 4


def _round_top(peak: int) -> int:
    """The y axis's top: the peak rounded up to 1, 2, 2.5 or 5 times a power of two of MiB, per tick."""
    per_tick = max(1, -(-peak // TREND_TICKS))
    unit = 1 << 20
    while unit * 10 < per_tick:
        unit *= 2
    for factor in (1, 2, 2.5, 5, 10):
        if unit * factor >= per_tick:
            return int(unit * factor) * TREND_TICKS
    return per_tick * TREND_TICKS  # not reached: factor 10 covers the rest


def _trend_point(run: Run, peak: int, x: float, y: float) -> dict[str, Any]:
    head = (run.summary or {}).get("run") or {}
    return {
        "x": round(x, 1),
        "y": round(y, 1),
        "name": run.name,
        "branch": run.branch,
        "peak_reserved_bytes": peak,
        "oom": bool(head.get("oom_ranks")),
        "regressed": bool((run.regression or {}).get("regressed")),
        "url": reverse("snapshots:run", args=[run.code]),
    }


def trend(runs: list[Run]) -> dict[str, Any] | None:
    """Peaks per run over time, oldest on the left, on axes from zero; OOM runs and regressions are marked
    (a regressed run that also ran out of memory is drawn as both)."""
    from analysis.readout import size

    done = [r for r in sorted(runs, key=lambda r: (r.created_at, r.pk)) if r.summary]
    if not done:
        return None
    peaks = [int(((r.summary or {}).get("run") or {}).get("peak_reserved_bytes") or 0) for r in done]
    top = _round_top(max(peaks) or 1)
    plot_w, plot_h = TREND_W - TREND_LEFT - TREND_PAD, TREND_H - TREND_PAD - TREND_BOTTOM
    bottom = TREND_PAD + plot_h
    step = plot_w / max(1, len(done) - 1)
    points = []
    for i, (run, peak) in enumerate(zip(done, peaks, strict=True)):
        x = TREND_LEFT + (i * step if len(done) > 1 else plot_w / 2)
        points.append(_trend_point(run, peak, x, bottom - plot_h * peak / top))
    ticks = [
        {"y": round(bottom - plot_h * k / TREND_TICKS, 1), "label": size(top * k // TREND_TICKS) if k else "0"}
        for k in range(TREND_TICKS + 1)
    ]
    return {
        "width": TREND_W,
        "height": TREND_H,
        "points": points,
        "polyline": " ".join(f"{p['x']},{p['y']}" for p in points),
        "max_bytes": top,
        "axis": {"left": TREND_LEFT, "right": TREND_W - TREND_PAD, "top": TREND_PAD, "bottom": bottom},
        "y_ticks": ticks,
        "x_labels": [points[0]] + ([points[-1]] if len(points) > 1 else []),
        "label_x": TREND_LEFT - 8,
        "label_y": bottom + 24,
    }


# --- the webhook's deadline (issue 36: a delivery's attempts and retries are bounded in time) ----


def webhook_seconds_left(delivery_id: int) -> float | None:
    """Seconds until the delivery's ``WEBHOOK_DEADLINE_SECONDS`` (from when the alert was queued)
    runs out; None when the delivery is gone or delivered (nothing to send)."""
    delivery = WebhookDelivery.objects.filter(pk=delivery_id, delivered_at__isnull=True).only("created_at").first()
    if delivery is None:
        return None
    deadline = delivery.created_at + timedelta(seconds=float(settings.WEBHOOK_DEADLINE_SECONDS))
    return (deadline - timezone.now()).total_seconds()


def webhook_record_error(delivery_id: int, reason: str) -> None:
    """Record why an attempt failed or the delivery stopped (its deadline, an attempt past its time)."""
    WebhookDelivery.objects.filter(pk=delivery_id, delivered_at__isnull=True).update(error=reason[:300])
