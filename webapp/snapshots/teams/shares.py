"""Share links: a read-only link to one upload's report, its token an HMAC of a stored nonce
(``share_token``), counted on use, revocable; and the lines a list or an issue shows of one."""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Any

from django.db import OperationalError, transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from analysis import readout
from webapp.snapshots.models import ShareLink, Upload
from webapp.snapshots.teams.tokens import token_hash

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User
    from django.http import HttpRequest

    AnyUser = User | AnonymousUser

log = logging.getLogger(__name__)


def upload_for_share_token(token: str, *, count_use: bool = True) -> Upload | None:
    """The upload behind a live share link (counting the use); None for unknown or revoked links."""
    link = (
        ShareLink.objects.filter(token_hash=token_hash(token), revoked_at__isnull=True)
        .select_related("upload", "upload__project", "upload__project__team")
        .first()
    )
    if link is None:
        return None
    if count_use:
        _count_share_use(link.pk)
    return link.upload


# The read paths' bookkeeping (share-link use count, token last use; tokens.USAGE_WRITE_INTERVAL) is
# best effort: a write that cannot get the lock in time is logged and skipped, never a failed page.
def _count_share_use(link_id: int) -> None:
    try:
        ShareLink.objects.filter(pk=link_id).update(use_count=F("use_count") + 1, last_used_at=timezone.now())
    except OperationalError as exc:
        log.warning("share link %s: use not counted: %s", link_id, exc)


SHARE_TOKEN_SALT = "oomscope.share-link"  # noqa: S105 - an HMAC salt name, not a secret


def share_token(nonce: str) -> str:
    """A link's token: HMAC(SECRET_KEY, nonce), URL-safe. Stored nowhere; recomputed to show the URL."""
    import base64

    from django.utils.crypto import salted_hmac

    digest = salted_hmac(SHARE_TOKEN_SALT, nonce, algorithm="sha256").digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@transaction.atomic
def share_create(upload: Upload, user: User | None, name: str = "") -> str:
    """A new read-only link (the upload's other links stay live); returns the token."""
    nonce = secrets.token_urlsafe(24)
    token = share_token(nonce)
    ShareLink.objects.create(
        upload=upload,
        token_hash=token_hash(token),
        prefix=token[:6],
        key=secrets.token_urlsafe(9)[:12],
        name=(name or "").strip()[:100],
        nonce=nonce,
        created_by=user,
    )
    return token


def share_revoke(upload: Upload, key: str | None = None) -> int:
    """Revoke one live link (by ``key``) or, without a key, every live link of the upload."""
    links = ShareLink.objects.filter(upload=upload, revoked_at__isnull=True)
    if key is not None:
        links = links.filter(key=key)
    return links.update(revoked_at=timezone.now())


def share_active(upload: Upload) -> ShareLink | None:
    """The newest live link, if any."""
    return ShareLink.objects.filter(upload=upload, revoked_at__isnull=True).order_by("-created_at", "-id").first()


def share_link_url(request: HttpRequest | None, link: ShareLink) -> str | None:
    """The link's URL, recomputed from its nonce; None for a link made before nonces existed."""
    if not link.nonce:
        return None
    path = reverse("snapshots:share_view", args=[share_token(link.nonce)])
    return request.build_absolute_uri(path) if request is not None else path


def share_links(upload: Upload, request: HttpRequest | None, *, revoked: bool = True) -> list[dict[str, Any]]:
    """The upload's links, newest first: what the page lists and ``GET .../share`` returns."""
    links = ShareLink.objects.filter(upload=upload).select_related("created_by").order_by("-created_at", "-id")
    if not revoked:
        links = links.filter(revoked_at__isnull=True)
    return [
        {
            "key": link.key,
            "name": link.name,
            "url": share_link_url(request, link) if link.revoked_at is None else None,
            "active": link.revoked_at is None,
            "created_at": link.created_at.isoformat(),
            "created_by": link.created_by.get_username() if link.created_by else None,
            "use_count": link.use_count,
            "last_used_at": link.last_used_at.isoformat() if link.last_used_at else None,
            "revoked_at": link.revoked_at.isoformat() if link.revoked_at else None,
        }
        for link in links
    ]


def share_url_of(upload: Upload, request: HttpRequest | None) -> str | None:
    """The newest live link's URL that can be shown (None when nothing is shared)."""
    for link in ShareLink.objects.filter(upload=upload, revoked_at__isnull=True).order_by("-created_at", "-id"):
        url = share_link_url(request, link)
        if url:
            return url
    return None


def share_url(request: HttpRequest, token: str) -> str:
    return request.build_absolute_uri(reverse("snapshots:share_view", args=[token]))


def markdown_snippet(upload: Upload, link: str | None) -> str:
    """One Markdown line to paste in an issue: the headline figures and the link."""
    s = upload.summary or {}
    parts = [f"**{upload.filename}**"]
    if upload.run:
        parts.append(f"run `{upload.run}`")
    if "peak_reserved_bytes" in s:
        parts.append(f"peak reserved {readout.size(int(s['peak_reserved_bytes']))}")
    if "peak_allocated_bytes" in s:
        parts.append(f"peak allocated {readout.size(int(s['peak_allocated_bytes']))}")
    if s.get("oom"):
        limit = f", limit {s['limit_text']} ({s['limit_source_short']})" if s.get("limit_text") else ""
        parts.append(f"OOM ({s.get('verdict') or 'unknown'}{limit})")
    line = " · ".join(parts)
    return f"{line} — [memory report]({link})" if link else line


def shared_upload_ids(uploads: list[Upload]) -> set[int]:
    """Ids among ``uploads`` with a live share link, in one query (for lists)."""
    return set(
        ShareLink.objects.filter(upload__in=uploads, revoked_at__isnull=True).values_list("upload_id", flat=True)
    )
