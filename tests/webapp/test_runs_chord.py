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

# The real two-rank DDP job of tests/fixtures/runs (docs/runs.md): rank 0 died of an OOM, rank 1's
# all-reduce then failed with gloo's "Connection closed by peer".
RUNS = FIXTURES / "runs"
RANK_FILES = [RUNS / "ddp_gloo_rank0.pickle.gz", RUNS / "ddp_gloo_rank1.pickle.gz"]


def sidecar(rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RUNS / f"ddp_gloo_rank{rank}.json").read_text())
    return data


def peaks() -> list[int]:
    return [sidecar(rank)["memory_stats"]["reserved_bytes.all.peak"] for rank in (0, 1)]


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

    post_rank(client, token, RANK_FILES[0], 0, oom_message=sidecar(0)["oom_message"])
    post_rank(client, token, RANK_FILES[1], 1, error=sidecar(1)["error"])
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
    assert [r["peak_reserved_bytes"] for r in body["summary"]["ranks"]] == peaks() == [2_136_997_888, 899_678_208]
    assert all(u["status"] == "done" for u in body["uploads"])
