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
import json
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


def post(url: str, secret: str, body: dict[str, Any], *, timeout: float = TIMEOUT_SECONDS) -> int:
    """POST ``body`` as signed JSON; the status on 2xx, else ``WebhookError``."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise WebhookError(f"not an http(s) URL: {url!r}", retry=False)
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
