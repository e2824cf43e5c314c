"""/healthz: 200 naming each part ok; 503 naming the part that fails."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.django_db


def test_healthz_ok_with_real_database_and_redis(client: Any) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200, response.content
    assert response.json() == {"database": "ok", "broker": "ok"}
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]


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
