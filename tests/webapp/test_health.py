"""/healthz: 200 naming each part ok; 503 naming a failing database or broker; a silent worker is named."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.django_db


@pytest.mark.worker
def test_healthz_ok_with_real_database_redis_and_worker(client: Any, celery_worker_process: Any) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200, response.content
    assert response.json() == {"database": "ok", "broker": "ok", "worker": "ok", "disk": "ok"}
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]


def test_healthz_names_a_silent_worker_without_failing(client: Any, settings: Any) -> None:
    """No worker is running in this test: the site still serves (200) but says the worker is silent."""
    import time

    settings.HEALTHZ_WORKER_TIMEOUT = 0.3
    started = time.monotonic()
    response = client.get("/healthz")
    took = time.monotonic() - started
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["database"], body["broker"], body["degraded"]) == ("ok", "ok", "worker")
    assert body["worker"] == "error: no worker answered within 0.3 s"
    assert "failing" not in body
    assert took < 0.3 + 1.0  # the ping waits its timeout, not more


def test_healthz_503_when_broker_is_down(client: Any, tmp_path: Any) -> None:
    from webapp.celery import app

    working = app.conf.broker_url
    app.conf.broker_url = f"redis+socket://{tmp_path}/nobody-listens.sock"
    try:
        response = client.get("/healthz")
    finally:
        app.conf.broker_url = working
    assert response.status_code == 503
    body = response.json()
    assert body["database"] == "ok"
    assert body["broker"].startswith("error")
    assert body["failing"] == "broker"
    assert body["worker"] == "error: broker unreachable"  # not pinged through a dead broker


def test_healthz_503_when_database_is_down(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import OperationalError, connection

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("connection refused")

    monkeypatch.setattr(connection, "cursor", refuse)
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["failing"] == "database"


def test_eviction_policy_is_read_and_warned_about(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    from webapp.snapshots import broker

    assert broker.eviction_policy(redis_url) == "noeviction"  # the test Redis is started that way
    client = broker.redis_client(redis_url)
    try:
        client.config_set("maxmemory-policy", "allkeys-lru")
        broker.warn_unless_noeviction(redis_url)
    finally:
        client.config_set("maxmemory-policy", "noeviction")
        client.close()
    assert any("noeviction" in r.getMessage() for r in caplog.records)
