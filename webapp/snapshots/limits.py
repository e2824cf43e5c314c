"""Rate limits and the team storage quota: each limit is defined once, in settings, and applied here.

Counting is django-ratelimit's (fixed windows in the Django cache, ``CACHES`` in settings).
Every refusal is a ``LimitExceeded`` with a stable code, the HTTP status and, for rates,
the seconds until the window ends (sent as ``Retry-After``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Sum
from django_ratelimit.core import _split_rate, get_usage  # type: ignore[import-untyped]  # ships no types

from webapp.snapshots import messages

log = logging.getLogger(__name__)


@dataclass
class LimitExceeded(Exception):
    status: int
    code: str
    message: str
    retry_after: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}

    def headers(self) -> dict[str, str]:
        headers = {"X-Error-Code": self.code}
        if self.retry_after:
            headers["Retry-After"] = str(self.retry_after)
        return headers


def _hit(request: Any, group: str, key: str, rate: str) -> int | None:
    """Count one use of ``group`` for ``key``; seconds to wait when over ``rate``, else None.

    A cache that cannot be reached lets the request through (logged): the limits protect
    the disk and the CPU, and an outage of the counter store must not stop the site.
    """
    try:
        usage = get_usage(request, group=group, key=lambda _group, _request: key, rate=rate, increment=True)
    except Exception as exc:
        log.warning("rate limit %s not checked: %s", group, exc)
        return None
    if usage is None or not usage["should_limit"]:
        return None
    return max(1, int(usage["time_left"]))


def check_upload_rate(request: Any, user: Any, token: Any) -> None:
    """Per-token (API) and per-user (API and page) upload rates."""
    # Keys name one token / one account even where database ids are reused (SQLite reuses the
    # highest id after a rollback): the token's hash, the account's id with its creation time.
    checks = []
    if token is not None:
        key = f"token:{token.token_hash[:32]}"
        checks.append(("upload-token", key, settings.UPLOAD_RATE_PER_TOKEN, "upload:rate-limited:token"))
    account = f"user:{user.pk}:{user.date_joined.timestamp():.6f}"
    checks.append(("upload-user", account, settings.UPLOAD_RATE_PER_USER, "upload:rate-limited:user"))
    for group, key, rate, code in checks:
        wait = _hit(request, group, key, rate)
        if wait is not None:
            count, seconds = _split_rate(rate)
            raise LimitExceeded(
                429,
                code,
                messages.RATE_LIMITED.format(what="uploads", count=count, seconds=seconds, wait=wait),
                retry_after=wait,
            )


def check_replay_rate(request: Any, user: Any) -> None:
    """Idempotency-Key replays per user, in their own bucket.

    A replay answers with the upload it repeats, so it is not held to the upload rates (a client
    retrying after a timeout must get its answer); but each one still streams a body to disk, so
    replays are counted and limited too (issue 22: replays were not counted at all).
    """
    account = f"user:{user.pk}:{user.date_joined.timestamp():.6f}"
    wait = _hit(request, "upload-replay", account, settings.UPLOAD_REPLAY_RATE_PER_USER)
    if wait is not None:
        count, seconds = _split_rate(settings.UPLOAD_REPLAY_RATE_PER_USER)
        raise LimitExceeded(
            429,
            "upload:rate-limited:replay",
            messages.RATE_LIMITED.format(what="repeated uploads", count=count, seconds=seconds, wait=wait),
            retry_after=wait,
        )


def check_login_rate(request: Any) -> None:
    """Login attempts (POST) per client address and per username tried."""
    ip = request.META.get("REMOTE_ADDR", "")
    username = (request.POST.get("username") or "").strip().lower()[:150]
    for group, key, rate in (
        ("login-ip", f"ip:{ip}", settings.LOGIN_RATE_PER_IP),
        ("login-user", f"user:{username}", settings.LOGIN_RATE_PER_USERNAME),
    ):
        if group == "login-user" and not username:
            continue
        wait = _hit(request, group, key, rate)
        if wait is not None:
            count, seconds = _split_rate(rate)
            raise LimitExceeded(
                429,
                "login:rate-limited",
                messages.RATE_LIMITED.format(what="sign-in attempts", count=count, seconds=seconds, wait=wait),
                retry_after=wait,
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
