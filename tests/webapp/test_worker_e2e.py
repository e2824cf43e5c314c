"""End to end through a real ``celery worker`` process, real Redis and the test database.

A hostile upload and the real gpt_varlen_oom fixture go through the HTTP API; the
worker refuses the first with its code (no canary file appears), stays up, and
analyses the second; then the report is shared, read anonymously, and revoked.
"""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.webapp.helpers import FIXTURES, GPT_OOM, bearer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TRUTH = json.loads((FIXTURES / "gpt_varlen_oom.truth.json").read_text())


class Canary:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return (os.system, (f"touch {self.path}",))


def wait_for(client: Any, token: str, code: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(f"/api/v1/snapshots/{code}", **bearer(token)).json()
        if body["status"] in ("done", "failed") or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def test_worker_process_round_trip(client: Any, alice_token: str, celery_worker_process: Any, tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    hostile = pickle.dumps({"segments": [], "device_traces": [[Canary(canary)]]}, protocol=4)
    bad = client.post("/api/v1/snapshots", {"file": SimpleUploadedFile("evil.pickle", hostile)}, **bearer(alice_token))
    assert bad.status_code == 202, bad.content
    started = time.monotonic()
    with open(GPT_OOM, "rb") as fh:
        good = client.post("/api/v1/snapshots", {"file": fh, "run": "e2e"}, **bearer(alice_token))
    assert good.status_code == 202, good.content

    bad_status = wait_for(client, alice_token, bad.json()["id"])
    good_status = wait_for(client, alice_token, good.json()["id"])
    elapsed = time.monotonic() - started
    log = celery_worker_process.log_path.read_text()
    assert bad_status["status"] == "failed", log[-3000:]
    assert bad_status["error"]["code"].startswith("snapshot:unsafe:")
    assert not canary.exists()
    assert celery_worker_process.poll() is None, "the worker stays up"
    assert good_status["status"] == "done", (good_status, log[-3000:])
    assert elapsed < 30, f"report took {elapsed:.1f} s"

    stats = TRUTH["memory_stats"]
    report = client.get(f"/api/v1/snapshots/{good.json()['id']}/report", **bearer(alice_token)).json()
    summary = report["devices"][0]["summary"]
    assert summary["peak_reserved_bytes"] == stats["reserved_bytes.all.peak"]
    assert summary["peak_allocated_bytes"] == stats["allocated_bytes.all.peak"]
    assert summary["peak_requested_bytes"] == stats["requested_bytes.all.peak"]
    assert "snapshots.analyse_upload" in log

    share_url = client.post(f"/api/v1/snapshots/{good.json()['id']}/share", **bearer(alice_token)).json()["share_url"]
    assert client.get(share_url).status_code == 200
    client.delete(f"/api/v1/snapshots/{good.json()['id']}/share", **bearer(alice_token))
    assert client.get(share_url).status_code == 404


def test_killed_pool_process_is_rerun_at_once_by_redelivery(client: Any, alice_token: str, start_worker: Any) -> None:
    """SIGKILL of the pool process mid-analysis: its child dies with it, Celery requeues the same
    message (reject_on_worker_lost) and its redelivery claims the RUNNING row again at once.
    No beat runs here, so the sweep cannot be what recovers it. The second attempt must start
    well before the sweep's stale limit would even consider the row; how long the whole upload
    takes against an undisturbed run is a figure `make reliability` measures (kill-pool), not a
    wall-clock ratio asserted here, where a loaded CI host makes it noise."""
    import psutil

    worker = start_worker()
    big = FIXTURES / "big_all_stacks.pickle.gz"

    def post() -> str:
        with open(big, "rb") as fh:
            code: str = client.post("/api/v1/snapshots", {"file": fh}, **bearer(alice_token)).json()["id"]
        return code

    started = time.monotonic()
    normal = wait_for(client, alice_token, post(), timeout=90)
    normal_seconds = time.monotonic() - started
    assert normal["status"] == "done", normal

    code = post()
    deadline = time.monotonic() + 30
    # The pool process running the task is the analysis child's parent; kill it once the
    # analysis has gone on for a third of its normal time (mid-analysis, not at its start).
    analysis: list[Any] = []
    while not analysis:
        assert time.monotonic() < deadline, "no analysis child"
        analysis = [c for c in psutil.Process(worker.pid).children(recursive=True) if _runs_a_job(c)]
    time.sleep(normal_seconds / 3)
    pool = analysis[0].parent()
    assert pool is not None and pool.pid != worker.pid
    pool.kill()
    killed = time.monotonic()

    from django.conf import settings

    from webapp.snapshots.models import Upload

    # The redelivered message claims the row again (attempt 2) without waiting for anything.
    reclaimed = None
    while reclaimed is None and time.monotonic() - killed < settings.SWEEP_STALE_RUNNING_SECONDS / 4:
        if Upload.objects.get(code=code).attempts == 2:
            reclaimed = time.monotonic() - killed
        time.sleep(0.05)
    assert reclaimed is not None, "the redelivered message did not claim the upload again"

    final = wait_for(client, alice_token, code, timeout=90)
    log = worker.log_path.read_text()
    assert final["status"] == "done", (final, log[-3000:])
    assert Upload.objects.get(code=code).attempts == 2
    assert "attempt 2 (message" in log  # the same message, claimed again
    assert "re-queued" not in log  # no sweep ran
    psutil.wait_procs(analysis, timeout=10)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in analysis), "orphaned analysis"
    assert worker.poll() is None


def _runs_a_job(proc: Any) -> bool:
    """An analysis child with its job: a cold one, or a spare (``warmchild``) once it has set the job's
    memory cap on itself; a spare still waiting for a job has none."""
    import psutil

    try:
        if "webapp.snapshots.worker.child" not in " ".join(proc.cmdline()):
            return False
        return bool(proc.rlimit(psutil.RLIMIT_AS)[0] != psutil.RLIM_INFINITY)
    except psutil.Error:  # it ended meanwhile
        return False


def _analysis_children(worker_pid: int, timeout: float = 30.0) -> list[Any]:
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        found = [c for c in psutil.Process(worker_pid).children(recursive=True) if _runs_a_job(c)]
        if found:
            return found
        assert time.monotonic() < deadline, "no analysis child"
        time.sleep(0.05)


def _wait_in_log(proc: Any, marker: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        log: str = proc.log_path.read_text()
        if marker in log or time.monotonic() > deadline:
            return log
        time.sleep(0.2)


def test_killed_worker_main_process_reruns_its_upload_when_the_worker_restarts(
    client: Any, alice_token: str, start_worker: Any, redis_url: str
) -> None:
    """SIGKILL of the Celery main process mid-analysis (supervisord then starts a new one): the
    pool process and its analysis die with it (PDEATHSIG), the message stays unacked in Redis, and
    the new worker's start re-queues the upload because its claimant is provably gone. No beat runs
    here, so the sweep cannot be what re-runs it. Then the old message comes back, as kombu's
    visibility timeout would bring it: it finds the upload done and runs nothing."""
    import psutil

    from webapp.celery import app
    from webapp.snapshots.broker import redis_client
    from webapp.snapshots.models import Upload
    from webapp.snapshots.worker import liveness

    worker = start_worker()
    with open(FIXTURES / "big_all_stacks.pickle.gz", "rb") as fh:
        code = client.post("/api/v1/snapshots", {"file": fh}, **bearer(alice_token)).json()["id"]
    analysis = _analysis_children(worker.pid)
    row = Upload.objects.get(code=code)
    first_message = row.task_id
    assert row.status == "running" and liveness.alive(row.claimed_by) is True
    pool = psutil.Process(int(row.claimed_by.split("|")[3]))
    assert pool.ppid() == worker.pid  # the claim names the pool process that runs the analysis

    worker.kill()
    worker.wait()
    _gone, alive = psutil.wait_procs([pool, *analysis], timeout=15)
    assert not alive, "the pool process and its analysis die with the main process"
    assert liveness.alive(row.claimed_by) is False

    broker = redis_client(redis_url)
    try:
        unacked = {tag: json.loads(raw) for tag, raw in broker.hgetall("unacked").items()}
        mine = [tag for tag, (payload, _exchange, _key) in unacked.items() if payload["headers"]["id"] == first_message]
        assert len(mine) == 1, "the killed worker's message waits unacked in Redis"

        restarted = start_worker()
        final = wait_for(client, alice_token, code, timeout=120)
        log = restarted.log_path.read_text()
        assert final["status"] == "done", (final, log[-3000:])
        assert f"re-queued 1 uploads whose worker process is gone: [{row.id}]" in log
        row.refresh_from_db()
        assert row.attempts == 2 and row.task_id not in ("", first_message)
        assert "re-queued" not in log.replace("worker start: re-queued", "")  # no sweep ran

        # The visibility timeout's restore, done by hand: the old message goes back to its queue.
        payload = unacked[mine[0]][0]
        broker.hdel("unacked", mine[0])
        broker.zrem("unacked_index", mine[0])
        broker.rpush(app.conf.task_default_queue, json.dumps(payload))
        log = _wait_in_log(restarted, f"snapshots.analyse_upload[{first_message}] succeeded", 60)
        assert f"snapshots.analyse_upload[{first_message}] succeeded" in log, log[-3000:]
        assert f"upload {row.id}: not queued" in log
        row.refresh_from_db()
        assert (row.status, row.attempts) == ("done", 2), "no second run of a finished upload"
    finally:
        broker.close()
    assert restarted.poll() is None


def test_redis_killed_mid_analysis_the_worker_stays_and_every_upload_ends_done(
    alice: Any, alpha: Any, start_worker: Any, tmp_path: Path
) -> None:
    """SIGKILL of redis-server while an upload is analysed, then a restart on the same AOF
    directory (what supervisord does): the worker must not exit (kombu's close of the dead
    channel raised AttributeError and the worker exited 1 before broker.patch_kombu_redis_closed_transport),
    the analysis in flight finishes once (attempt 1), and an upload sent after the restart is
    consumed by the same worker process. Two pool processes, as in ``make run``: one stays free,
    so the consumer has a BRPOP in flight when Redis dies."""
    import kombu
    from django.utils import timezone

    from tests.webapp.conftest import redis_server_binary
    from tests.webapp.helpers import make_upload
    from tests.webapp.processes import start_redis_server
    from webapp.snapshots.models import Upload
    from webapp.snapshots.worker.tasks import analyse_upload_task

    directory = tmp_path / "own-redis"
    directory.mkdir()
    redis_proc, url = start_redis_server(redis_server_binary(), directory, appendonly=True)

    def publish(path: Path) -> Any:
        upload = make_upload(alpha, alice, path, queued_at=timezone.now())
        with kombu.Connection(url) as connection:
            analyse_upload_task.apply_async((upload.id,), connection=connection)
        return upload

    def wait_done(upload: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            upload.refresh_from_db()
            if upload.status in (Upload.Status.DONE, Upload.Status.FAILED) or time.monotonic() > deadline:
                return upload
            time.sleep(0.2)

    try:
        worker = start_worker({"REDIS_URL": url}, concurrency=2)
        in_flight = publish(FIXTURES / "big_all_stacks.pickle.gz")
        _analysis_children(worker.pid)
        redis_proc.kill()
        redis_proc.wait()
        redis_proc, _ = start_redis_server(redis_server_binary(), directory, appendonly=True)

        in_flight = wait_done(in_flight, 120)
        log = worker.log_path.read_text()
        assert in_flight.status == "done", (in_flight.status, log[-3000:])
        assert in_flight.attempts == 1, "the analysis in flight finished; nothing ran it twice"
        assert "Connection to broker lost" in log
        deadline = time.monotonic() + 30
        while worker.log_path.read_text().count("Connected to redis") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the consumer's reconnect (the first line is its start)
        after = wait_done(publish(GPT_OOM), 120)
        log = worker.log_path.read_text()
        assert after.status == "done", (after.status, log[-3000:])
        assert worker.poll() is None, "the worker survived the broker's restart: " + log[-3000:]
        assert "AttributeError" not in log
    finally:
        redis_proc.kill()
        redis_proc.wait()


def test_messages_go_to_this_runs_own_queue(redis_url: str) -> None:
    import os

    from webapp.celery import app
    from webapp.snapshots.broker import redis_client
    from webapp.snapshots.worker.tasks import analyse_upload_task

    queue = f"oomscope-test-{os.getpid()}"
    assert app.conf.task_default_queue == queue
    client = redis_client(redis_url)
    try:
        before = client.llen(queue)
        analyse_upload_task.delay(987_654_321)
        assert client.llen(queue) == before + 1
        client.lpop(queue)  # kombu pushes on the left: drop the message just sent
    finally:
        client.close()
