"""The regression alert: a Slack-compatible JSON POST, signed with the project's secret.

Slack's incoming webhooks (and Mattermost's, Discord's ``/slack`` endpoint) take
``{"text": ...}``; the rest of the body (``oomscope``) carries the figures for a receiver of
one's own. Each POST is signed as GitHub and Stripe sign theirs: ``X-Oomscope-Timestamp`` (Unix
seconds) and ``X-Oomscope-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`` under
the project's ``webhook_secret``, so a receiver can check the sender and refuse a replay.
stdlib only (http.client, to the one address checked); retries are the task's
(``runtasks.deliver_webhook``), not this module's.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import socket
import ssl
import time
import urllib.parse
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


def check_destination(url: str, *, allow_private: bool) -> tuple[str, int, str]:
    """Resolve the URL's host once and refuse it unless every address it has is global; return
    (host, port, the address to connect to).

    A project admin chooses the URL and the worker sends to it: without this check, a webhook could
    be pointed at the site's own Redis, database or a cloud metadata endpoint (server-side request
    forgery). Issue 36: the check resolved the name, then urllib resolved it again to connect (a
    name that answers a public address, then 127.0.0.1: DNS rebinding), redirects were followed
    unchecked, and 100.64.0.0/10 (carrier-grade NAT) passed. Now the one resolution's address is
    the one connected to, nothing but ``ipaddress``'s ``is_global`` passes, and ``post`` follows no
    redirect. ``WEBHOOK_ALLOW_PRIVATE_HOSTS`` turns the address check off for receivers inside the
    network (and tests).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookError(f"not an http(s) URL: {url!r}", retry=False)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise WebhookError(f"not a port: {url!r}", retry=False) from None
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:
        raise WebhookError(f"cannot resolve {parts.hostname}: {err}") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    if not addresses:
        raise WebhookError(f"cannot resolve {parts.hostname}: no address")
    inside = [a for a in addresses if not a.is_global]
    if inside and not allow_private:
        raise WebhookError(
            f"{parts.hostname} is {inside[0]}, inside the network (not a public address: private, loopback, "
            "link-local, shared or reserved); the site sends alerts only to public addresses. An operator can set "
            "WEBHOOK_ALLOW_PRIVATE_HOSTS=1 for receivers inside the network",
            retry=False,
        )
    return parts.hostname, port, str(addresses[0])


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to one address already checked, whatever the name resolves to now
    (``Host`` stays the name)."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """``_PinnedHTTP`` over TLS: the certificate is checked against the name (SNI the name too)."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self.address = address

    def connect(self) -> None:
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]


def post(
    url: str, secret: str, body: dict[str, Any], *, timeout: float = TIMEOUT_SECONDS, allow_private: bool = False
) -> int:
    """POST ``body`` as signed JSON to the address ``check_destination`` resolved; the status on 2xx,
    else ``WebhookError`` (a redirect too: it is never followed, so it cannot lead inside)."""
    host, port, address = check_destination(url, allow_private=allow_private)
    parts = urllib.parse.urlsplit(url)
    raw = json.dumps(body, separators=(",", ":")).encode()
    stamp = str(int(time.time()))
    kind = _PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP
    connection = kind(host, port, address, timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "oomscope-webhook/1",
        TIMESTAMP_HEADER: stamp,
        SIGNATURE_HEADER: signature(secret, stamp, raw),
    }
    try:
        connection.request("POST", target, body=raw, headers=headers)
        status = int(connection.getresponse().status)
    except (OSError, http.client.HTTPException) as err:
        raise WebhookError(f"cannot reach the receiver: {err}") from None
    finally:
        connection.close()
    if 200 <= status < 300:
        return status
    if 300 <= status < 400:
        raise WebhookError(
            f"HTTP {status} from the receiver: redirects are not followed (give the URL it redirects to)",
            status=status,
            retry=False,
        )
    retry = status >= 500 or status in RETRY_STATUSES
    raise WebhookError(f"HTTP {status} from the receiver", status=status, retry=retry)
