"""A run of two ranks analysed by the real chord on two ``celery worker`` processes.

The ranks are uploaded through the HTTP API; the last one publishes the chord on commit. Each
worker (prefork, one child, prefetch 1, late ack) takes one ``analyse_rank`` while the other is
busy, the chord counts its parts in the test Redis (the result backend), and whichever worker
is free runs ``summarise_run``. Files are on the local disk here; ``test_runs_s3.py`` runs the
same on an S3-compatible server.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES, bearer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

CAPTURES = FIXTURES / "captures"
DIED = CAPTURES / "gpt_autocast_c75_default.pickle.gz"
LIVED = CAPTURES / "gpt_autocast_c75_expandable.pickle.gz"
GLOO_PEER_GONE = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500"
)


def peak(path: Path) -> int:
    truth = json.loads(path.with_name(path.name.replace(".pickle.gz", ".truth.json")).read_text())
    value: int = truth["memory_stats"]["reserved_bytes.all.peak"]
    return value


@pytest.fixture
def chord_backend(redis_url: str) -> Iterator[None]:
    """This process publishes the chord: it needs the result backend the workers use."""
    from webapp.celery import app

    def forget() -> None:  # the app builds its backend again from the setting on first use
        app._backend_cache = None
        app._local.__dict__.pop("backend", None)

    before = app.conf.result_backend
    app.conf.result_backend = redis_url
    forget()
    yield
    # Publishing a group subscribes this process to its parts' result channels until their result
    # objects are collected, which may be after the session's Redis stopped (then 20 s of
    # reconnect attempts at exit): drop the subscriptions and close the channel now.
    consumer = getattr(app.backend, "result_consumer", None)
    if consumer is not None:
        consumer.subscribed_to.clear()
        consumer.stop()
    app.conf.result_backend = before
    forget()


def post_rank(client: Any, token: str, path: Path, rank: int, **fields: Any) -> str:
    with path.open("rb") as fh:
        response = client.post(
            "/api/v1/snapshots",
            {"file": fh, "run": "ddp-chord", "rank": rank, "world_size": 2, "branch": "main", **fields},
            **bearer(token),
        )
    assert response.status_code == 202, response.content
    code: str = response.json()["id"]
    return code


def wait_for_run(client: Any, token: str, code: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(f"/api/v1/runs/{code}", **bearer(token)).json()
        if body["status"] == "done" or time.monotonic() > deadline:
            return body
        time.sleep(0.3)


def run_the_chord(client: Any, token: str, workers: list[Any]) -> dict[str, Any]:
    from webapp.snapshots.models import Run

    post_rank(client, token, DIED, 0)
    post_rank(client, token, LIVED, 1, error=GLOO_PEER_GONE)
    run = Run.objects.get(name="ddp-chord")
    body = wait_for_run(client, token, run.code)
    logs = [w.log_path.read_text() for w in workers]
    assert body["status"] == "done", (body, [log[-2000:] for log in logs])
    # Each worker analysed one rank; one of them summarised the run.
    for log in logs:
        assert log.count("Task snapshots.analyse_rank[") >= 1, log[-3000:]
    assert sum(log.count("Task snapshots.summarise_run[") for log in logs) >= 1
    assert all(w.poll() is None for w in workers)
    return body


def test_two_ranks_run_as_one_chord_on_two_workers(
    client: Any, alice_token: str, start_worker: Any, chord_backend: None
) -> None:
    workers = [start_worker(), start_worker()]
    body = run_the_chord(client, alice_token, workers)
    head = body["summary"]["run"]
    assert head["first_oom_rank"] == 0 and head["peer_failed_ranks"] == [1]
    assert [r["peak_reserved_bytes"] for r in body["summary"]["ranks"]] == [peak(DIED), peak(LIVED)]
    assert all(u["status"] == "done" for u in body["uploads"])
