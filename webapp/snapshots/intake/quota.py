"""The team's storage quota and the analysis cost it may have queued: each defined once, in settings.

A refusal is a ``ratelimits.LimitExceeded`` with a stable code and the HTTP status (and, for a
full queue, ``Retry-After``), like every refusal at intake.
"""

from __future__ import annotations

from django.conf import settings
from django.db.models import Sum

from webapp.snapshots import messages
from webapp.snapshots.errors import LimitExceeded


def team_queued_cost(team_id: int) -> int:
    """The estimated cost (``cost.AnalysisCost.cost_bytes``) of the team's queued and running analyses."""
    from webapp.snapshots.models import Upload

    active = (Upload.Status.QUEUED, Upload.Status.RUNNING)
    total = Upload.objects.filter(project__team_id=team_id, status__in=active).aggregate(cost=Sum("estimated_cost"))
    return int(total["cost"] or 0)


def check_team_queued_cost(team_id: int, incoming_cost: int, *, queued: int | None = None) -> None:
    """Refuse an upload whose estimated analysis cost, with what the team has queued, passes
    ``ANALYSIS_MAX_QUEUED_COST_PER_TEAM`` (issue 22: one team filled the queue for everyone).
    Too costly alone: 413 ``upload:too-costly``; with what is queued: 429 ``upload:queue-full``
    (``Retry-After``: the queue drains as analyses end). ``queued``: the team's queued cost when
    known (0: check the upload alone)."""
    limit = settings.ANALYSIS_MAX_QUEUED_COST_PER_TEAM
    if incoming_cost > limit:
        raise LimitExceeded(
            413,
            "upload:too-costly",
            messages.ANALYSIS_TOO_COSTLY.format(
                cost=messages.human_bytes(incoming_cost), limit=messages.human_bytes(limit)
            ),
        )
    queued = team_queued_cost(team_id) if queued is None else queued
    if queued + incoming_cost > limit:
        raise LimitExceeded(
            429,
            "upload:queue-full",
            messages.ANALYSIS_QUEUE_FULL.format(
                cost=messages.human_bytes(incoming_cost),
                queued=messages.human_bytes(queued),
                limit=messages.human_bytes(limit),
            ),
            retry_after=60,
        )


def team_usage_bytes(team_id: int) -> int:
    """Bytes the team's uploads put on disk: each file and what its analysis stored (report, charts,
    explore stores, ``Upload.stored_bytes``). A purged or deleted upload no longer counts. Issue 22:
    only the files were counted, and a 10 KB trace wrote a 206 MB explore store."""
    from webapp.snapshots.models import Upload

    totals = (
        Upload.objects.filter(project__team_id=team_id)
        .exclude(blob_name="")
        .aggregate(files=Sum("bytes"), stored=Sum("stored_bytes"))
    )
    return int(totals["files"] or 0) + int(totals["stored"] or 0)


def check_team_quota(team_id: int, incoming_bytes: int) -> None:
    quota = settings.TEAM_STORAGE_QUOTA_BYTES
    used = team_usage_bytes(team_id)
    if used + incoming_bytes > quota:
        raise LimitExceeded(
            413,
            "upload:quota-exceeded",
            messages.QUOTA_EXCEEDED.format(
                used=messages.human_bytes(used),
                quota=messages.human_bytes(quota),
                size=messages.human_bytes(incoming_bytes),
            ),
        )
