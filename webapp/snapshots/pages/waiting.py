"""The status page's wait: an estimate from this site's own measured analysis times, and what the upload waits for.

The estimate fits ``seconds = base + per_mb x gzipped MB`` to the analysis times (``started_at`` to
``finished_at``) of the site's last ``RECENT`` finished uploads; with fewer than ``MIN_SAMPLES`` of them it
falls back to the fixed rates of ``formatting.analysis_estimate_s``. A queued upload waits for a worker, and
the page says how many uploads were queued before it. A rank of a run whose other ranks have not all come
waits for them, not for a worker: the page says which ranks and until when the run waits, and gives no
estimate it cannot keep.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from webapp.snapshots.models import Run, Upload
from webapp.snapshots.pages import formatting

RECENT = 50  # finished uploads the rates are measured on
MIN_SAMPLES = 3
LARGE_GZ_MB = 1.0  # files at least this large (gzipped) give the per-MB rate; smaller ones the base


@dataclass(frozen=True)
class Rates:
    base_s: float  # an analysis of a small file
    per_gz_mb_s: float  # each gzipped MB more
    samples: int  # 0: the fixed rates (no measurement yet)


def gz_mb(upload: Upload) -> float:
    mb = float(upload.bytes or 0) / 1e6
    fmt = upload.format or ""
    return mb if fmt.endswith("gz") or fmt in ("torch-zip", "") else mb / formatting.RAW_PER_GZ


def measured_rates() -> Rates:
    """The rates of this site's last ``RECENT`` analyses (the fixed ones when there are too few)."""
    done = (
        Upload.objects.filter(status=Upload.Status.DONE, started_at__isnull=False, finished_at__isnull=False)
        .order_by("-finished_at")
        .only("bytes", "format", "started_at", "finished_at")[:RECENT]
    )
    points = [(gz_mb(u), (u.finished_at - u.started_at).total_seconds()) for u in done]  # type: ignore[operator]
    points = [(mb, s) for mb, s in points if s >= 0]
    if len(points) < MIN_SAMPLES:
        return Rates(formatting.ESTIMATE_BASE_S, formatting.ESTIMATE_S_PER_GZ_MB, 0)
    small = [s for mb, s in points if mb < LARGE_GZ_MB]
    base = statistics.median(small) if small else formatting.ESTIMATE_BASE_S
    large = [(s - base) / mb for mb, s in points if mb >= LARGE_GZ_MB]
    per_mb = max(0.0, statistics.median(large)) if large else formatting.ESTIMATE_S_PER_GZ_MB
    return Rates(base, per_mb, len(points))


def estimate_s(upload: Upload, rates: Rates) -> int:
    """Seconds the analysis of this file should take at the measured rates (rounded up)."""
    seconds = rates.base_s + rates.per_gz_mb_s * gz_mb(upload)
    return max(1, int(-(-seconds // 1)))


def queued_before(upload: Upload) -> int:
    """Uploads still waiting for (or held by) a worker that came before this one."""
    return Upload.objects.filter(
        status__in=(Upload.Status.QUEUED, Upload.Status.RUNNING), created_at__lt=upload.created_at
    ).count()


def waiting_for_ranks(upload: Upload) -> dict[str, Any] | None:
    """For a rank of a run still collecting its ranks: which are missing, and until when the run waits."""
    run = upload.run_ref if upload.run_ref_id else None
    if run is None or run.status != Run.Status.COLLECTING or not run.world_size:
        return None
    present = set(run.uploads.exclude(rank__isnull=True).values_list("rank", flat=True))
    missing = [r for r in range(run.world_size) if r not in present]
    until = run.created_at + timedelta(seconds=int(getattr(settings, "RUN_COLLECT_SECONDS", 600)))
    return {
        "run": run.name,
        "ranks_in": len(present),
        "world_size": run.world_size,
        "missing_ranks": missing,
        "until_s": max(0, int((until - timezone.now()).total_seconds())),
    }


def wait_text(upload: Upload, ranks: dict[str, Any] | None, ahead: int) -> str:
    """What the upload waits for, in one sentence (empty once it runs or ended)."""
    if ranks is not None:
        shown = ", ".join(str(r) for r in ranks["missing_ranks"][:8]) + ("…" if len(ranks["missing_ranks"]) > 8 else "")
        return (
            f"Waiting for the other ranks of run {ranks['run']}: {ranks['ranks_in']} of {ranks['world_size']} are "
            f"in; missing rank{'s' if len(ranks['missing_ranks']) != 1 else ''} {shown}. The run is analysed as one "
            f"once all have come, or with those present in {formatting.duration(ranks['until_s'])}."
        )
    if upload.status == Upload.Status.QUEUED:
        if ahead:
            return f"Waiting for a worker: {ahead} upload{'s' if ahead != 1 else ''} queued before this one."
        return "Waiting for a worker to take it."
    return ""


def status_figures(upload: Upload) -> dict[str, Any]:
    """``estimate_s`` (None while waiting for ranks), its basis, and ``waiting_for`` for the status page."""
    ranks = waiting_for_ranks(upload) if upload.status == Upload.Status.QUEUED else None
    ahead = queued_before(upload) if upload.status == Upload.Status.QUEUED and ranks is None else 0
    rates = measured_rates()
    estimate = None if ranks is not None else estimate_s(upload, rates)
    return {
        "estimate_s": estimate,
        "estimate_basis": f"measured on this site's last {rates.samples} analyses" if rates.samples else "fixed rates",
        "waiting_for": wait_text(upload, ranks, ahead),
        "ranks": ranks,
    }
