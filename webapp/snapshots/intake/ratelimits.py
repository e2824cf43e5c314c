"""Rate limits (uploads, repeated uploads, sign-ins, sign-ups): each rate is defined once, in settings.

Counting is django-ratelimit's (fixed windows in the Django cache, ``CACHES`` in settings).
Every refusal is a ``LimitExceeded`` with a stable code, the HTTP status and, for rates,
the seconds until the window ends (sent as ``Retry-After``); the team quota (``quota.py``), the
disk guard (``disk.py``) and the intake's own checks (``intake.py``) refuse with the same class.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django_ratelimit.core import _split_rate, get_usage  # type: ignore[import-untyped]  # ships no types

from webapp.snapshots import messages
from webapp.snapshots.errors import LimitExceeded

log = logging.getLogger(__name__)


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


def _limit(request: Any, group: str, key: str, rate: str, code: str, what: str) -> None:
    """Count one use (``_hit``); ``LimitExceeded`` 429 with ``code`` and a wait when over ``rate``."""
    wait = _hit(request, group, key, rate)
    if wait is not None:
        count, seconds = _split_rate(rate)
        raise LimitExceeded(
            429,
            code,
            messages.RATE_LIMITED.format(what=what, count=count, seconds=seconds, wait=wait),
            retry_after=wait,
        )


def check_upload_rate(request: Any, user: Any, token: Any, *, count: int = 1) -> None:
    """Per-token (API) and per-user (API and page) upload rates; ``count`` uploads at once (a run's
    archive counts each rank it holds: issue 36), stopping at the first one over a rate."""
    # Keys name one token / one account even where database ids are reused (SQLite reuses the
    # highest id after a rollback): the token's hash, the account's id with its creation time.
    checks = []
    if token is not None:
        key = f"token:{token.token_hash[:32]}"
        checks.append(("upload-token", key, settings.UPLOAD_RATE_PER_TOKEN, "upload:rate-limited:token"))
    account = f"user:{user.pk}:{user.date_joined.timestamp():.6f}"
    checks.append(("upload-user", account, settings.UPLOAD_RATE_PER_USER, "upload:rate-limited:user"))
    for group, key, rate, code in checks:
        for _ in range(max(0, count)):
            _limit(request, group, key, rate, code, "uploads")


def check_replay_rate(request: Any, user: Any) -> None:
    """Idempotency-Key replays per user, in their own bucket.

    A replay answers with the upload it repeats, so it is not held to the upload rates (a client
    retrying after a timeout must get its answer); but each one still streams a body to disk, so
    replays are counted and limited too (issue 22: replays were not counted at all).
    """
    account = f"user:{user.pk}:{user.date_joined.timestamp():.6f}"
    _limit(
        request, "upload-replay", account, settings.UPLOAD_REPLAY_RATE_PER_USER,
        "upload:rate-limited:replay", "repeated uploads",
    )  # fmt: skip


def client_address(request: Any) -> str:
    """The client's address: ``REMOTE_ADDR``, or behind a trusted proxy the address that proxy saw.

    A proxy in ``TRUSTED_PROXIES`` appends the address it received the request from to
    ``X-Forwarded-For``; reading from the right, the first address that is not one of our
    proxies is the client (anything left of it the client wrote itself and is not trusted).
    Without trusted proxies every request behind one shares the proxy's address and so one
    rate-limit bucket (issue 22).
    """
    remote = str(request.META.get("REMOTE_ADDR", ""))
    trusted = settings.TRUSTED_PROXIES
    if not trusted or remote not in trusted:
        return remote
    hops = [h.strip() for h in str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",") if h.strip()]
    for hop in reversed(hops):
        if hop not in trusted:
            return hop[:64]
    return remote


DEVICE_COOKIE = "oomscope_device"
_DEVICE_SALT = "oomscope.login-device"


def device_cookie_value(username: str) -> str:
    """A signed note, kept by the browser after a successful sign-in, that it signed in as ``username``."""
    import secrets

    from django.core import signing

    return signing.dumps({"u": username.strip().lower()[:150], "d": secrets.token_urlsafe(9)}, salt=_DEVICE_SALT)


def _known_device(request: Any, username: str) -> str | None:
    """The id of this browser's device cookie when it signed in as ``username`` before (a year at most)."""
    from django.core import signing

    raw = request.COOKIES.get(DEVICE_COOKIE)
    if not raw or not username:
        return None
    try:
        note = signing.loads(raw, salt=_DEVICE_SALT, max_age=365 * 24 * 3600)
    except signing.BadSignature:
        return None
    if not isinstance(note, dict) or note.get("u") != username:
        return None
    return str(note.get("d") or "")[:20] or None


def check_login_rate(request: Any) -> None:
    """Sign-in attempts (POST) per client address, and per username tried.

    The per-username count is what stops guessing one account's password from many addresses,
    and it is also what let anyone lock a user out with a few wrong passwords (issue 22). So a
    browser that signed in as that user before (it holds the signed device cookie set then,
    ``device_cookie_value``) is counted on its own, at the same rate, and an attacker's wrong
    guesses do not lock it out; a new browser shares the username's count (OWASP's device cookies).
    """
    username = (request.POST.get("username") or "").strip().lower()[:150]
    checks = [("login-ip", f"ip:{client_address(request)}", settings.LOGIN_RATE_PER_IP)]
    if username:
        device = _known_device(request, username)
        if device is not None:
            checks.append(("login-device", f"device:{username}:{device}", settings.LOGIN_RATE_PER_USERNAME))
        else:
            checks.append(("login-user", f"user:{username}", settings.LOGIN_RATE_PER_USERNAME))
    for group, key, rate in checks:
        _limit(request, group, key, rate, "login:rate-limited", "sign-in attempts")


def check_signup_rate(request: Any) -> None:
    """Sign-ups per client address: each account brings a team and its own quota (issue 22)."""
    _limit(
        request, "signup-ip", f"ip:{client_address(request)}", settings.SIGNUP_RATE_PER_IP,
        "signup:rate-limited", "sign-ups from this address",
    )  # fmt: skip
