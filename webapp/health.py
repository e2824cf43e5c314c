"""``GET /healthz``: the database, the broker and the workers, each reported on its own.

The status is 503 when the database or the broker fails: this process cannot take an upload
then, and a load balancer should stop sending it traffic. A silent worker does not make it
503 (pages and uploads still work; analyses wait in the queue), so the body says
``"worker": "error: ..."`` and ``"degraded": "worker"`` and the status stays 200. Likewise a
disk below the upload guard's reserve (``DISK_MIN_FREE_BYTES``, webapp/snapshots/intake/disk.py):
``"disk": "low: ..."`` and ``"degraded"`` names it; reads still work, uploads answer 507.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from webapp.snapshots.broker import broker_ping

log = logging.getLogger(__name__)


def _database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        log.warning("healthz: database: %s", exc)
        return f"error: {type(exc).__name__}"
    return "ok"


def _broker(url: str) -> str:
    try:
        broker_ping(url)
    except Exception as exc:
        log.warning("healthz: broker: %s", exc)
        return f"error: {type(exc).__name__}"
    return "ok"


def _disk() -> str:
    from webapp.snapshots.intake import disk

    try:
        free = disk.free_bytes()
    except OSError as exc:
        return f"error: {type(exc).__name__}"
    if free < settings.DISK_MIN_FREE_BYTES:
        return f"low: {free} bytes free, uploads refused below {settings.DISK_MIN_FREE_BYTES}"
    return "ok"


def _worker(app: object, timeout: float) -> str:
    """A Celery ``ping`` broadcast; the first reply ends the wait (limit=1)."""
    try:
        replies = app.control.ping(timeout=timeout, limit=1)  # type: ignore[attr-defined]
    except Exception as exc:
        log.warning("healthz: worker ping: %s", exc)
        return f"error: {type(exc).__name__}"
    if not replies:
        return f"error: no worker answered within {timeout:g} s"
    return "ok"


@never_cache
@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    from webapp.celery import app

    broker_url = str(app.conf.broker_url)
    result: dict[str, str] = {"database": _database(), "broker": _broker(broker_url)}
    # No ping through a broker that is down: it would only wait for the connect timeout.
    result["worker"] = (
        _worker(app, settings.HEALTHZ_WORKER_TIMEOUT) if result["broker"] == "ok" else "error: broker unreachable"
    )
    result["disk"] = _disk()
    failing = [name for name in ("database", "broker") if result[name] != "ok"]
    if failing:
        result["failing"] = ", ".join(failing)
    degraded = [name for name in ("worker", "disk") if result[name] != "ok"]
    if degraded:
        result["degraded"] = ", ".join(degraded)
    return JsonResponse(result, status=503 if failing else 200)
