"""The spare analysis child (warmchild.py, issue 34): the cold child's outcome, limits and refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES
from webapp.snapshots.worker import runner, warmchild

SMALL = FIXTURES / "gpt_varlen_oom.pickle.gz"
BIG = FIXTURES / "big_all_stacks.pickle.gz"


@pytest.fixture
def warm() -> Iterator[None]:
    warmchild.enable()
    yield
    warmchild.disable()


def _limits(path: Path) -> runner.Limits:
    return runner.limits_for(path, per_byte=6, minimum=1 << 30, maximum=4 << 30, cpu=120, wall=120)


def _stores(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(folder.glob("*.npz"))}


def test_a_spare_child_gives_the_cold_childs_report_charts_and_stores(warm: None, tmp_path: Path) -> None:
    (tmp_path / "warm").mkdir()
    (tmp_path / "cold").mkdir()
    first: list[dict[str, Any]] = []
    spare = warmchild._spare
    assert spare is not None
    hot = runner.run_child(SMALL, _limits(SMALL), charts=True, explore_dir=tmp_path / "warm", on_report=first.append)
    assert spare.proc.returncode == 0  # the spare ran this job and ended
    warmchild.disable()
    cold = runner.run_child(SMALL, _limits(SMALL), charts=True, explore_dir=tmp_path / "cold")
    assert json.dumps(hot.report, sort_keys=True) == json.dumps(cold.report, sort_keys=True)
    assert hot.report["devices"][0]["oom"]["verdict"] == "fragmentation"
    # The first answer is the final report, handed over once.
    assert len(first) == 1 and json.dumps(first[0], sort_keys=True) == json.dumps(hot.report, sort_keys=True)
    assert hot.charts is not None and cold.charts is not None and sorted(hot.charts) == sorted(cold.charts)
    assert "timeline-0" in hot.charts
    assert _stores(tmp_path / "warm") == _stores(tmp_path / "cold") != {}


def test_the_next_spare_starts_when_a_job_ends(warm: None) -> None:
    before = warmchild._spare
    assert before is not None
    runner.run_child(SMALL, _limits(SMALL))
    after = warmchild._spare
    assert after is not None and after.proc.pid != before.proc.pid and after.proc.poll() is None
    warmchild.disable()
    assert after.proc.poll() is not None and warmchild._spare is None


def _proc_limit(pid: int, name: str) -> tuple[str, str] | None:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith(name):
            soft, hard = line[len(name) :].split()[:2]
            return soft, hard
    return None


def test_a_spare_reports_the_limits_it_runs_under(warm: None, tmp_path: Path) -> None:
    # Read while the job runs: the memory cap is the job's, the CPU cap counts from the job's start.
    seen: list[tuple[Any, Any]] = []
    spare = warmchild._spare
    assert spare is not None
    pid = spare.proc.pid
    assert _proc_limit(pid, "Max address space") == ("unlimited", "unlimited")  # none before its job
    limits = runner.Limits(memory_bytes=3 << 30, cpu_seconds=77, wall_seconds=120)

    def on_progress(stage: str | None, _pct: int | None) -> None:
        if stage and not seen:
            seen.append((_proc_limit(pid, "Max address space"), _proc_limit(pid, "Max cpu time")))

    runner.run_child(SMALL, limits, on_progress=on_progress)
    assert seen, "no progress line came"
    memory, cpu = seen[0]
    assert memory == (str(3 << 30), str(3 << 30))
    assert cpu is not None and 77 <= int(cpu[0]) <= 77 + 5 and int(cpu[1]) == int(cpu[0]) + 5


def test_a_spare_refuses_a_file_past_the_memory_cap(warm: None) -> None:
    limits = runner.Limits(memory_bytes=150 * 1024**2, cpu_seconds=60, wall_seconds=60)
    with pytest.raises(runner.ChildRefused) as refused:
        runner.run_child(BIG, limits)
    assert refused.value.code == "snapshot:limit:memory"


def test_a_spare_is_stopped_at_the_wall_clock_limit(warm: None) -> None:
    limits = runner.Limits(memory_bytes=4 << 30, cpu_seconds=60, wall_seconds=0.3)
    with pytest.raises(runner.ChildRefused) as refused:
        runner.run_child(BIG, limits)
    assert refused.value.code == "snapshot:limit:time"


def test_a_spare_refuses_a_nested_key_crash_with_the_depth_code(warm: None, tmp_path: Path) -> None:
    from tests.analysis.hostile_schema import build

    data, want = build()["dict_key_nested_tuple"]
    path = tmp_path / "key.pickle"
    path.write_bytes(data)
    with pytest.raises(runner.ChildRefused) as refused:
        runner.run_child(path, runner.Limits(memory_bytes=2 << 30, cpu_seconds=60, wall_seconds=60))
    assert refused.value.code == want == "snapshot:limit:too-deep"


def test_a_spare_killed_from_outside_is_not_called_a_cpu_limit(warm: None) -> None:
    from tests.webapp.test_hardening2 import _kill_the_child_when_it_reports

    seen: list[str] = []
    limits = runner.Limits(memory_bytes=4 << 30, cpu_seconds=600, wall_seconds=600)
    with pytest.raises(runner.ChildKilled):
        runner.run_child(BIG, limits, on_progress=_kill_the_child_when_it_reports(seen))
    assert seen


def test_a_dead_spare_leaves_the_job_to_a_cold_child(warm: None) -> None:
    spare = warmchild._spare
    assert spare is not None
    spare.proc.kill()
    spare.proc.wait()
    report = runner.run_child(SMALL, _limits(SMALL)).report
    assert report["devices"][0]["oom"]["verdict"] == "fragmentation"


def test_only_a_worker_that_runs_analyses_keeps_spares(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    from types import SimpleNamespace

    from webapp.celery import app
    from webapp.snapshots.worker import tasks

    def worker(consume_from: dict[str, Any] | None) -> Any:
        return SimpleNamespace(
            app=SimpleNamespace(amqp=SimpleNamespace(queues=SimpleNamespace(consume_from=consume_from)))
        )

    monkeypatch.setattr(tasks, "_ANALYSES_HERE", True)
    settings.ANALYSIS_WARM_CHILD = True
    tasks._note_the_queues(instance=worker({f"{app.conf.task_default_queue}-webhooks": None}))
    tasks._start_spare_child()
    assert not warmchild.enabled() and warmchild._spare is None  # the webhooks' worker
    tasks._note_the_queues(instance=worker({str(app.conf.task_default_queue): None}))
    tasks._start_spare_child()
    try:
        assert warmchild.enabled() and warmchild.wait_ready()
    finally:
        tasks._stop_spare_child()
    assert not warmchild.enabled() and warmchild._spare is None
    tasks._note_the_queues(instance=worker(None))  # no -Q: every queue, the analyses' too
    assert tasks._ANALYSES_HERE
    settings.ANALYSIS_WARM_CHILD = False
    tasks._start_spare_child()
    assert not warmchild.enabled()
