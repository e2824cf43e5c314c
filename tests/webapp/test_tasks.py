"""The analysis task, called directly: claim, stages, refusals, limits, bugs, attempts, sweep."""

from __future__ import annotations

import gzip
import os
import pickle
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from tests.webapp.helpers import FIXTURES, GPT_OOM, make_upload
from webapp.snapshots.intake import store
from webapp.snapshots.models import Report, Upload
from webapp.snapshots.worker import jobs, liveness, tasks

pytestmark = pytest.mark.django_db


class Canary:
    """Unpickling this runs ``touch <path>``: what a hostile upload would do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def hostile_pickle(tmp_path: Path, protocol: int, gz: bool) -> tuple[Path, Path]:
    canary = tmp_path / f"canary-{protocol}-{gz}"
    payload = pickle.dumps({"segments": [], "device_traces": [[Canary(canary)]]}, protocol=protocol)
    assert b"system" in payload  # a GLOBAL/STACK_GLOBAL + REDUCE pickle
    path = tmp_path / f"hostile-{protocol}.pickle{'.gz' if gz else ''}"
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path, canary


@pytest.mark.parametrize(("protocol", "gz"), [(2, False), (4, False), (4, True)])
def test_hostile_pickle_fails_with_its_code_and_runs_nothing(
    alice: Any, alpha: Any, tmp_path: Path, protocol: int, gz: bool
) -> None:
    path, canary = hostile_pickle(tmp_path, protocol, gz)
    upload = make_upload(alpha, alice, path)
    tasks.analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == "failed"
    assert upload.error_code.startswith("snapshot:unsafe:"), upload.error_code
    assert "run code" in upload.error_message
    assert not canary.exists()
    # The same worker process goes on to the next upload.
    good = make_upload(alpha, alice, FIXTURES / "frag_oom.pickle.gz")
    tasks.analyse_upload(good.id)
    good.refresh_from_db()
    assert good.status == "done"
    assert not canary.exists()


def test_done_upload_records_stages_and_stores_report_and_charts(
    alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    original = jobs.upload_set_progress

    def record(upload_id: int, stage: str | None, progress: int | None) -> None:
        if stage and (not seen or seen[-1] != stage):
            seen.append(stage)
        original(upload_id, stage, progress)

    monkeypatch.setattr(jobs, "upload_set_progress", record)
    upload = make_upload(alpha, alice)
    tasks.analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == "done" and upload.progress == 100 and upload.attempts == 1
    assert seen[0] == "reading" and "replaying" in seen and "analysing" in seen and seen[-1] == "charting"
    report = Report.objects.get(upload=upload)
    assert report.data["source"]["sha256"] == upload.sha256
    assert report.charts, "charts are computed by the worker and stored beside the report"
    assert all("doc" in item or "target_id" in item for item in report.charts.values())


def test_claim_is_exclusive(alice: Any, alpha: Any) -> None:
    upload = make_upload(alpha, alice)
    assert jobs.upload_claim(upload.id) is not None
    assert jobs.upload_claim(upload.id) is None  # a duplicate delivery does nothing
    tasks.analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == "running" and upload.attempts == 1  # untouched by the second task
    tasks.analyse_upload(999_999)  # a row that is gone: returns quietly


def test_upload_killed_repeatedly_fails_instead_of_looping(alice: Any, alpha: Any, settings: Any) -> None:
    upload = make_upload(alpha, alice, attempts=settings.ANALYSIS_MAX_ATTEMPTS)
    tasks.analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == "failed"
    assert upload.error_code == "worker:killed-repeatedly"
    assert "killed worker repeatedly" in upload.error_message


def test_bug_is_internal_error_with_traceback_in_log(
    alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(tasks.runner, "run_child", broken)
    upload = make_upload(alpha, alice)
    tasks.analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == "failed" and upload.error_code == "worker:internal"
    assert "a bug" not in upload.error_message  # users get the generic sentence
    assert any(r.exc_info and "a bug" in str(r.exc_info[1]) for r in caplog.records)


def test_wall_timeout_fails_with_limit_code(alice: Any, alpha: Any, settings: Any) -> None:
    settings.ANALYSIS_WALL_SECONDS = 0.3
    upload = make_upload(alpha, alice, FIXTURES / "big_all_stacks.pickle.gz")
    tasks.analyse_upload(upload.id)
    upload.refresh_from_db()
    assert (upload.status, upload.error_code) == ("failed", "snapshot:limit:time")


def test_memory_cap_fails_with_limit_code(alice: Any, alpha: Any, settings: Any) -> None:
    # Enough to start Python and numpy (~120 MB of address space), too little for this file (30 MB unpacked:
    # the report needs ~175 MB since the reader's columns and the replays' C state, ~300 MB before).
    settings.ANALYSIS_MEMORY_MIN_BYTES = 150 * 1024**2
    settings.ANALYSIS_MEMORY_PER_BYTE = 0
    settings.ANALYSIS_MEMORY_MAX_BYTES = 150 * 1024**2
    upload = make_upload(alpha, alice, FIXTURES / "big_all_stacks.pickle.gz")
    tasks.analyse_upload(upload.id)
    upload.refresh_from_db()
    assert (upload.status, upload.error_code) == ("failed", "snapshot:limit:memory"), upload.error_message


def test_limits_scale_with_unpacked_size(tmp_path: Path) -> None:
    from webapp.snapshots.worker.runner import limits_for, unpacked_size

    unpacked = len(gzip.decompress(GPT_OOM.read_bytes()))
    assert unpacked_size(GPT_OOM) == unpacked
    limits = limits_for(GPT_OOM, per_byte=6, minimum=1 << 30, maximum=16 << 30, cpu=60, wall=90)
    assert limits.memory_bytes == (1 << 30) + 6 * unpacked
    capped = limits_for(GPT_OOM, per_byte=6, minimum=1 << 30, maximum=1 << 30, cpu=60, wall=90)
    assert capped.memory_bytes == 1 << 30


def test_sweep_requeues_stale_rows(alice: Any, alpha: Any, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    published: list[int] = []
    monkeypatch.setattr(tasks.analyse_upload_task, "delay", lambda upload_id: published.append(upload_id))
    old = timezone.now() - timedelta(hours=1)
    stale_running = make_upload(alpha, alice, status="running", attempts=1, heartbeat_at=old)
    dead_running = make_upload(
        alpha, alice, status="running", attempts=settings.ANALYSIS_MAX_ATTEMPTS, heartbeat_at=old
    )
    lost_queued = make_upload(alpha, alice, queued_at=old)
    fresh_running = make_upload(alpha, alice, status="running", attempts=1, heartbeat_at=timezone.now())
    fresh_queued = make_upload(alpha, alice, queued_at=timezone.now())

    assert tasks.sweep_uploads() == 2
    assert sorted(published) == sorted([stale_running.id, lost_queued.id])
    states = {u.id: (u.status, u.error_code) for u in Upload.objects.all()}
    assert states[stale_running.id] == ("queued", "")
    assert states[dead_running.id] == ("failed", "worker:killed-repeatedly")
    assert states[fresh_running.id][0] == "running" and states[fresh_queued.id][0] == "queued"

    # The re-queued row is then analysed normally, as attempt 2.
    tasks.analyse_upload(stale_running.id)
    stale_running.refresh_from_db()
    assert (stale_running.status, stale_running.attempts) == ("done", 2)


def _dead_process_claim() -> str:
    """The claim string of a real process that has exited and been reaped."""
    import subprocess

    proc = subprocess.Popen(["sleep", "30"])
    claim = liveness.identity(proc.pid)
    proc.kill()
    proc.wait()
    assert claim and liveness.alive(claim) is False
    return claim


def _foreign_claim() -> str:
    """A claim made on another machine (another boot id): nothing can be told about it here."""
    _host, _boot, namespace, pid, start = liveness.identity().split("|")
    return "|".join(("other-host", "00000000-0000-0000-0000-000000000000", namespace, pid, start))


def test_claim_strings_tell_live_dead_and_unknown_processes() -> None:
    me = liveness.identity()
    assert me.split("|")[3] == str(os.getpid())
    assert liveness.alive(me) is True
    assert liveness.alive(_dead_process_claim()) is False
    assert liveness.alive(_foreign_claim()) is None
    assert liveness.alive("") is None and liveness.alive("a|b|c|x|y") is None
    # A reused pid is another process: the same pid with another start time is not the claimant.
    host, boot, namespace, pid, start = me.split("|")
    assert liveness.alive("|".join((host, boot, namespace, pid, str(int(start) + 1)))) is False


def test_redelivered_message_does_not_take_a_row_its_live_first_run_holds(alice: Any, alpha: Any) -> None:
    # kombu restores unacked messages on a broker connection loss while the analysis goes on in
    # its pool process: the same message comes back, but that process (here: this one) is alive.
    live = make_upload(
        alpha,
        alice,
        status="running",
        attempts=1,
        task_id="msg-1",
        started_at=timezone.now(),
        claimed_by=liveness.identity(),
    )
    assert jobs.upload_claim(live.id, task_id="msg-1", claimant="new") is None
    live.refresh_from_db()
    assert (live.status, live.attempts, live.claimed_by) == ("running", 1, liveness.identity())

    # Its pool process was killed (reject_on_worker_lost): the same message claims it again.
    dead = make_upload(alpha, alice, status="running", attempts=1, task_id="msg-2", claimed_by=_dead_process_claim())
    again = jobs.upload_claim(dead.id, task_id="msg-2", claimant="new")
    assert again is not None and (again.attempts, again.claimed_by) == (2, "new")

    # Claimed on another host: not judged from here, the same message may claim it (as before).
    foreign = make_upload(alpha, alice, status="running", attempts=1, task_id="msg-3", claimed_by=_foreign_claim())
    assert jobs.upload_claim(foreign.id, task_id="msg-3", claimant="new") is not None
    # Another message never takes a RUNNING row, whoever claimed it.
    other = make_upload(alpha, alice, status="running", attempts=1, task_id="msg-4", claimed_by=_dead_process_claim())
    assert jobs.upload_claim(other.id, task_id="msg-5", claimant="new") is None


def test_worker_start_requeues_only_claims_of_dead_processes(alice: Any, alpha: Any, settings: Any) -> None:
    fresh = timezone.now()  # every heartbeat is fresh: the sweep would take none of these
    dead = make_upload(alpha, alice, status="running", attempts=1, heartbeat_at=fresh, claimed_by=_dead_process_claim())
    limit = make_upload(
        alpha,
        alice,
        status="running",
        attempts=settings.ANALYSIS_MAX_ATTEMPTS,
        heartbeat_at=fresh,
        claimed_by=_dead_process_claim(),
    )
    live = make_upload(alpha, alice, status="running", attempts=1, heartbeat_at=fresh, claimed_by=liveness.identity())
    foreign = make_upload(alpha, alice, status="running", attempts=1, heartbeat_at=fresh, claimed_by=_foreign_claim())
    unclaimed = make_upload(alpha, alice, status="running", attempts=1, heartbeat_at=fresh)

    assert jobs.uploads_requeue_dead_claims() == [dead.id]
    states = {u.id: (u.status, u.error_code) for u in Upload.objects.all()}
    assert states[dead.id] == ("queued", "")
    assert states[limit.id] == ("failed", "worker:killed-repeatedly")
    assert states[live.id] == states[foreign.id] == states[unclaimed.id] == ("running", "")
    # The re-queued row is analysed as the next attempt, claimed by the process that runs it.
    tasks.analyse_upload(dead.id)
    dead.refresh_from_db()
    assert (dead.status, dead.attempts, dead.claimed_by) == ("done", 2, liveness.identity())


def test_sweep_never_takes_a_row_whose_claimant_runs(
    alice: Any, alpha: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    published: list[int] = []
    monkeypatch.setattr(tasks.analyse_upload_task, "delay", lambda upload_id: published.append(upload_id))
    old = timezone.now() - timedelta(hours=1)
    quiet = make_upload(
        alpha,
        alice,
        status="running",
        attempts=1,
        heartbeat_at=old,
        started_at=timezone.now() - timedelta(minutes=5),
        claimed_by=liveness.identity(),
    )
    gone = make_upload(alpha, alice, status="running", attempts=1, heartbeat_at=old, claimed_by=_dead_process_claim())
    # The same live process, but the row was claimed past the task's hard time limit: that
    # process has surely left this upload (it was killed there, or the row's last write failed).
    past_limit = timezone.now() - timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT + 60)
    left = make_upload(
        alpha,
        alice,
        status="running",
        attempts=1,
        heartbeat_at=old,
        started_at=past_limit,
        claimed_by=liveness.identity(),
    )
    assert tasks.sweep_uploads() == 2
    assert sorted(published) == sorted([gone.id, left.id])
    quiet.refresh_from_db()
    assert quiet.status == "running"


def test_task_options_match_the_reliability_plan() -> None:
    from django.conf import settings

    from webapp.celery import app

    task = app.tasks["snapshots.analyse_upload"]
    assert task.acks_late and task.reject_on_worker_lost
    assert app.conf.task_serializer == "json" and app.conf.accept_content == ["json"]
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.task_soft_time_limit < app.conf.task_time_limit
    assert app.conf.task_time_limit * 2 <= app.conf.broker_transport_options["visibility_timeout"]
    assert app.conf.task_soft_time_limit > settings.ANALYSIS_WALL_SECONDS
    assert "snapshots.sweep_uploads" in {e["task"] for e in app.conf.beat_schedule.values()}
    assert hasattr(task, "delay_on_commit")


def test_worker_reaps_dead_pool_processes_twice_a_second() -> None:
    """Celery's prefork pool can miss a killed pool process's sentinel and see the death only at
    its 5 s maintain_pool timer; the worker step adds the same call every 0.5 s."""
    from types import SimpleNamespace

    from webapp.celery import POOL_REAP_SECONDS, PoolReaper, app

    assert PoolReaper in app.steps["worker"]
    assert POOL_REAP_SECONDS < 5.0  # Celery's own interval (AsynPool.timers)
    scheduled: list[tuple[float, Any]] = []
    hub = SimpleNamespace(call_repeatedly=lambda interval, fun: scheduled.append((interval, fun)))
    pool = SimpleNamespace(maintain_pool=lambda: None)
    step = PoolReaper(SimpleNamespace())
    step.start(SimpleNamespace(hub=hub, pool=pool))
    assert scheduled == [(POOL_REAP_SECONDS, pool.maintain_pool)]
    step.start(SimpleNamespace(hub=None, pool=pool))  # solo / threads pools: no event loop, nothing
    assert len(scheduled) == 1


def test_rolled_back_upload_publishes_nothing(
    alice: Any, alpha: Any, django_capture_on_commit_callbacks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.db import transaction

    sent: list[Any] = []
    monkeypatch.setattr(tasks.analyse_upload_task, "apply_async", lambda *a, **k: sent.append(a))
    data = GPT_OOM.read_bytes()

    def request_that_fails_after_writing() -> None:
        with transaction.atomic():
            store.upload_create(
                user=alice, project=alpha, uploaded=SimpleUploadedFile("a.gz", data), sha256="0" * 64, fmt="pickle.gz"
            )
            raise RuntimeError("the request failed after the row was written")

    with django_capture_on_commit_callbacks() as published, pytest.raises(RuntimeError):
        request_that_fails_after_writing()
    assert published == [] and sent == []
    assert not Upload.objects.exists()
    # Committed, the same call publishes exactly once, and only at commit.
    with django_capture_on_commit_callbacks(execute=True):
        upload = store.upload_create(
            user=alice, project=alpha, uploaded=SimpleUploadedFile("a.gz", data), sha256="0" * 64, fmt="pickle.gz"
        )
        assert sent == []
    assert [call[0] for call in sent] == [(upload.id,)]


def test_messages_from_a_newer_sender_are_accepted(alice: Any, alpha: Any) -> None:
    """Rolling deploys: a message carrying a keyword this version does not know still runs."""
    upload = make_upload(alpha, alice, FIXTURES / "frag_oom.pickle.gz")
    tasks.analyse_upload(upload.id, priority_hint="high")
    upload.refresh_from_db()
    assert upload.status == "done"
