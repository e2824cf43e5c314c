"""analysis.parallel: tasks in forked children, with the parent as the fallback."""

from __future__ import annotations

import os
import signal

import pytest

from analysis.parallel import Pool, available_cpus


def test_each_task_runs_in_a_child_and_its_result_comes_back() -> None:
    pool = Pool(2)
    tasks = [pool.submit(lambda k=k: {"k": k, "pid": os.getpid(), "big": list(range(50_000))}) for k in range(5)]
    results = [t.result() for t in tasks]
    pool.close()
    assert [r["k"] for r in results] == list(range(5))
    assert all(r["pid"] != os.getpid() for r in results)
    assert all(t.forked for t in tasks)
    assert results[0]["big"] == list(range(50_000))  # more than a pipe buffer holds
    assert pool.reruns == 0


def test_one_job_runs_each_task_here_when_its_result_is_asked_for() -> None:
    calls: list[int] = []
    pool = Pool(1)
    task = pool.submit(lambda: calls.append(1) or os.getpid())
    assert calls == []
    assert task.result() == os.getpid() and calls == [1]
    assert not task.forked


def _boom() -> int:
    raise KeyError("from the task")


def test_a_task_that_raises_raises_here_as_in_a_serial_run() -> None:
    pool = Pool(2)
    task = pool.submit(_boom)
    with pytest.raises(KeyError, match="from the task"):
        task.result()
    assert pool.reruns == 1


def test_a_child_killed_mid_task_is_replaced_by_a_run_here() -> None:
    parent = os.getpid()
    pool = Pool(2)
    task = pool.submit(lambda: os.kill(os.getpid(), signal.SIGKILL) if os.getpid() != parent else "here")
    assert task.result() == "here"
    assert pool.reruns == 1 and not task.forked


def test_a_result_json_cannot_carry_is_computed_here() -> None:
    pool = Pool(2)
    task = pool.submit(lambda: {1, 2})  # a set: not JSON
    assert task.result() == {1, 2}
    assert pool.reruns == 1


def test_close_reaps_every_child() -> None:
    pool = Pool(3)
    tasks = [pool.submit(lambda: 1) for _ in range(5)]
    started = [t._pid for t in tasks if t._pid]  # three ran; two were still queued
    pool.close()
    assert len(started) == 3
    for pid in started:  # each one waited for: not even a zombie is left
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_available_cpus_is_at_least_one() -> None:
    assert available_cpus() >= 1
