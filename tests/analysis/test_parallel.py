"""analysis.parallel: tasks in forked children (or threads), with the parent as the fallback."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pytest

from analysis.parallel import POOL_THREAD_NICENESS, Pool, available_cpus


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


# ------------------------------------------------------------------ thread mode


def test_threads_run_tasks_beside_the_caller_and_hand_back_the_objects_themselves() -> None:
    pool = Pool(2, threads=True)
    gate = threading.Event()
    first = pool.submit(lambda: gate.wait(10) and threading.get_ident())
    value = {1, 2}  # a set: no JSON needed on threads
    second = pool.submit(lambda: value)
    gate.set()
    assert first.result() != threading.get_ident()
    assert second.result() is value
    assert first.threaded and not first.forked
    pool.close()


def test_a_task_no_thread_has_taken_up_runs_in_the_thread_asking_for_it() -> None:
    pool = Pool(2, threads=True)
    gate = threading.Event()
    busy = [pool.submit(lambda: gate.wait(10)) for _ in range(2)]  # both threads taken
    queued = pool.submit(threading.get_ident)
    assert queued.result() == threading.get_ident() and not queued.threaded
    gate.set()
    assert all(t.result() for t in busy)
    pool.close()


def test_beside_hands_back_a_getter_that_never_waits_on_a_task_not_started() -> None:
    pool = Pool(2, threads=True)
    gate = threading.Event()
    outer = pool.submit(lambda: (gate.wait(10), pool.beside(threading.get_ident)())[1])
    pool.submit(lambda: gate.wait(10))  # the second thread is busy until the outer task is done
    gate.set()
    assert outer.result() != threading.get_ident()  # ran on a pool thread, by the task that waited for it
    pool.close()
    serial = Pool(1, threads=True)
    getter = serial.beside(threading.get_ident)
    assert getter() == threading.get_ident()  # one job: runs when asked for


def test_a_task_that_raises_on_a_thread_raises_its_own_exception_here() -> None:
    pool = Pool(2, threads=True)
    task = pool.submit(_boom)
    with pytest.raises(KeyError, match="from the task"):
        task.result()
    assert pool.reruns == 0
    pool.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value")
def test_pool_threads_run_below_the_thread_that_submits() -> None:
    pool = Pool(2, threads=True)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    theirs = pool.submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result()
    pool.close()
    assert theirs == min(19, mine + POOL_THREAD_NICENESS)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # the submitter's is its own
