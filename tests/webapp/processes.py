"""Real processes for end-to-end tests: a Celery worker and the gunicorn site of ``make run``.

Used by ``tests/webapp/conftest.py`` (the worker tests) and ``tests/client/conftest.py`` (the
client uploads to a running site). Both run on the test database and the test Redis.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.webapp.helpers import ROOT, database_url_of_test_db


def process_env(*, redis_url: str, media_root: Path, queue: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url_of_test_db(),
            "REDIS_URL": redis_url,
            "MEDIA_ROOT": str(media_root),
            "DJANGO_SETTINGS_MODULE": "webapp.settings",
            "PYTHONPATH": str(ROOT),
            "CELERY_QUEUE": queue,
            **(extra or {}),
        }
    )
    return env


def celery_worker_argv(queue: str, beat_schedule: Path | None = None, concurrency: int = 1) -> list[str]:
    """The worker of ``make run`` (prefork), ``concurrency`` children, on ``queue`` only."""
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "webapp.celery:app",
        "worker",
        "--pool",
        "prefork",
        "--concurrency",
        str(concurrency),
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-Q",
        queue,
    ]
    if beat_schedule is not None:
        argv += ["-B", "--schedule", str(beat_schedule)]
    return argv


def start_logged(argv: list[str], env: dict[str, str], log_path: Path, **popen: object) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, **popen)  # type: ignore[call-overload]
    proc.log_path = log_path  # type: ignore[attr-defined]
    return proc  # type: ignore[no-any-return]


def wait_for_log(proc: subprocess.Popen[bytes], marker: bytes, what: str, timeout: float = 30.0) -> None:
    log_path: Path = proc.log_path  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while marker not in log_path.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{what} did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def make_run_web_options() -> dict[str, str]:
    """The gunicorn options ``make run`` gives the web (``scripts/run.sh``), with each
    ``${VAR:-default}`` at its default: the tests serve the way the site does."""
    line = next(x for x in (ROOT / "scripts" / "run.sh").read_text().splitlines() if "-m gunicorn" in x)
    found = re.findall(r"--(worker-class|workers|threads|timeout|keep-alive) (?:\$\{\w+:-)?([\w.]+)\}?", line)
    return dict(found)


def start_gunicorn(
    env: dict[str, str], log_path: Path, workers: int = 2, threads: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """gunicorn on a loopback port of its own, as ``make run`` starts it (its worker class,
    threads and keep-alive; ``threads`` overrides the count); returns (process, base URL).

    The listening socket is made here and handed over by file descriptor, so no other process
    can take the port between choosing and binding it.
    """
    options = make_run_web_options()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    fd = sock.fileno()
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "webapp.wsgi:application",
        "--bind",
        f"fd://{fd}",
        "--workers",
        str(workers),
        "--worker-class",
        options["worker-class"],
        "--threads",
        str(threads if threads is not None else options["threads"]),
        "--timeout",
        "120",
        "--access-logfile",
        "-",
    ]
    if "keep-alive" in options:
        argv += ["--keep-alive", options["keep-alive"]]
    proc = start_logged(argv, env, log_path, pass_fds=(fd,))
    sock.close()  # gunicorn holds its own copy
    wait_for_log(proc, b"Booting worker", "gunicorn")
    return proc, f"http://127.0.0.1:{port}"


def start_redis_server(
    binary: str, directory: Path, *, appendonly: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    """redis-server on a unix socket in ``directory`` (no TCP port); returns (process, broker URL).

    With ``appendonly`` its data survives a SIGKILL and a restart on the same directory, as
    ``make run``'s Redis does."""
    sock = directory / "redis.sock"
    sock.unlink(missing_ok=True)  # left by a killed server: wait for the new one's
    argv = [binary, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700", "--dir", str(directory)]
    argv += ["--save", "", "--appendonly", "yes" if appendonly else "no", "--maxmemory-policy", "noeviction"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("redis-server did not start")
        time.sleep(0.05)
    return proc, f"redis+socket://{sock}"
