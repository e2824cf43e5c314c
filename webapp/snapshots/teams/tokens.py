"""API tokens: made once and shown once (only a hash is stored), looked up by the API's
authentication (``api_token_user``), listed and revoked by their owner."""

from __future__ import annotations

import hashlib
import logging
import secrets
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import OperationalError
from django.db.models import Q
from django.utils import timezone

from webapp.snapshots.models import ApiToken, Project

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

    AnyUser = User | AnonymousUser

log = logging.getLogger(__name__)

# The read paths' bookkeeping (share-link use count, token last use) is a single UPDATE by primary
# key: atomic with F(), no row read or lock first, and in WAL mode it blocks no reader. It is
# best effort: a write that cannot get the lock in time is logged and skipped, never a failed page.
USAGE_WRITE_INTERVAL = timedelta(minutes=1)

API_TOKEN_PREFIX = "oom_"  # noqa: S105 - a public marker, not a secret


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def api_token_create(
    user: User,
    default_project: Project | None = None,
    *,
    project: Project | None = None,
    name: str = "",
    expires_at: datetime | None = None,
    scope: str = "full",
) -> str:
    """A new token for ``user`` (shown once: only its hash is kept). With ``project`` it reaches
    that project only, and uploads go there by default; with ``expires_at`` it stops working then;
    ``scope`` "gate": it only reads (a CI job asking the regression gate)."""
    if scope not in ("full", "gate"):
        raise ValueError(f"token scope {scope!r}: full or gate")
    token = API_TOKEN_PREFIX + secrets.token_urlsafe(32)
    ApiToken.objects.create(
        user=user,
        token_hash=token_hash(token),
        prefix=token[:10],
        default_project=project or default_project,
        project=project,
        name=name.strip()[:100],
        expires_at=expires_at,
        scope=scope,
    )
    return token


def api_token_user(raw: str) -> tuple[User, ApiToken] | None:
    """The live token's user: None for an unknown, revoked or expired token or an inactive user."""
    token = (
        ApiToken.objects.filter(token_hash=token_hash(raw), revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))
        .select_related("user", "default_project", "project")
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    # At most one write a minute per token: every API call would otherwise write the database.
    if token.last_used_at is None or now - token.last_used_at > USAGE_WRITE_INTERVAL:
        try:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        except OperationalError as exc:
            log.warning("api token %s: last use not recorded: %s", token.prefix, exc)
    return token.user, token


def api_tokens_of(user: User) -> list[dict[str, Any]]:
    rows = ApiToken.objects.filter(user=user).select_related("project").order_by("-created_at", "-id")
    return [
        {
            "prefix": t.prefix,
            "name": t.name,
            "project": t.project.slug if t.project else None,
            "scope": t.scope,
            "created_at": t.created_at.isoformat(),
            "last_used_at": t.last_used_at.isoformat() if t.last_used_at else None,
            "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
            "active": t.revoked_at is None,
        }
        for t in rows
    ]


def api_token_revoke(user: User, prefix: str) -> int:
    return ApiToken.objects.filter(user=user, prefix=prefix, revoked_at__isnull=True).update(revoked_at=timezone.now())
