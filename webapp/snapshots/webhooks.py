"""The regression alert: a Slack-compatible JSON POST, signed with the project's secret.

Slack's incoming webhooks (and Mattermost's, Discord's ``/slack`` endpoint) take
``{"text": ...}``; the rest of the body (``oomscope``) carries the figures for a receiver of
one's own. Each POST is signed as GitHub and Stripe sign theirs: ``X-Oomscope-Timestamp`` (Unix
seconds) and ``X-Oomscope-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`` under
the project's ``webhook_secret``, so a receiver can check the sender and refuse a replay.
stdlib only (urllib); retries are the task's (``runtasks.deliver_webhook``), not this module's.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from webapp.snapshots.models import Run

SIGNATURE_HEADER = "X-Oomscope-Signature"
TIMESTAMP_HEADER = "X-Oomscope-Timestamp"
TIMEOUT_SECONDS = 10.0
# Answers worth another try: the receiver is busy or down, or asked to be called again later.
RETRY_STATUSES = frozenset({408, 429})


class WebhookError(Exception):
    """A delivery that did not go through; ``retry`` says whether trying again may help."""

    def __init__(self, message: str, *, status: int | None = None, retry: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.retry = retry


def signature(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def payload(run: Run, regression: dict[str, Any], url: str) -> dict[str, Any]:
    """The alert: Slack's ``text`` (the regression's one paragraph and the run's link) and the figures."""
    reason = regression.get("reason") or "Memory regression."
    return {
        "text": f"oomscope: {run.project.slug} / {run.name}: {reason} <{url}|Open the run>",
        "oomscope": {
            "project": run.project.slug,
            "run": run.code,
            "name": run.name,
            "commit": run.commit,
            "branch": run.branch,
            "url": url,
            "regression": regression,
        },
    }


def check_destination(url: str, *, allow_private: bool) -> None:
    """Refuse a URL whose host resolves to a loopback, private, link-local or reserved address.

    A project admin chooses the URL and the worker sends to it: without this check, a webhook could
    be pointed at the site's own Redis, database or a cloud metadata endpoint (server-side request
    forgery). ``WEBHOOK_ALLOW_PRIVATE_HOSTS`` turns it off for receivers inside the network (and tests).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookError(f"not an http(s) URL: {url!r}", retry=False)
    if allow_private:
        return
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    except OSError as err:
        raise WebhookError(f"cannot resolve {parts.hostname}: {err}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if address.is_private or address.is_loopback or address.is_link_local or address.is_reserved:
            raise WebhookError(
                f"{parts.hostname} is {address}, inside the network; set WEBHOOK_ALLOW_PRIVATE_HOSTS to send there",
                retry=False,
            )


def post(
    url: str, secret: str, body: dict[str, Any], *, timeout: float = TIMEOUT_SECONDS, allow_private: bool = False
) -> int:
    """POST ``body`` as signed JSON; the status on 2xx, else ``WebhookError``."""
    check_destination(url, allow_private=allow_private)
    raw = json.dumps(body, separators=(",", ":")).encode()
    stamp = str(int(time.time()))
    request = urllib.request.Request(  # noqa: S310 (the scheme is checked above)
        url,
        data=raw,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "oomscope-webhook/1",
            TIMESTAMP_HEADER: stamp,
            SIGNATURE_HEADER: signature(secret, stamp, raw),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as err:
        retry = err.code >= 500 or err.code in RETRY_STATUSES
        raise WebhookError(f"HTTP {err.code} from the receiver", status=err.code, retry=retry) from None
    except (urllib.error.URLError, OSError) as err:
        raise WebhookError(f"cannot reach the receiver: {getattr(err, 'reason', err)}") from None
