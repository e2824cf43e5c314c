"""Independent passes side by side, on threads or in forked child processes.

A report's policy replays (the check under the recorded settings and each
what-if) are full passes over the trace in the interpreter, each about half a
``pickle.load`` of the file, and none needs another's result. With more than
one CPU they can run at the same time as each other and as the rest of the
report. Children are forked, so they share the loaded snapshot copy-on-write
instead of receiving a copy, and send their result back as JSON (the results
are plain dicts, lists and numbers, and JSON can carry nothing else).

A child that fails in any way (an exception, a signal, a memory limit, a
result JSON cannot carry) is not trusted: its task runs again here, in the
parent, which then returns or raises exactly what a serial run would.
``jobs <= 1`` (or no ``os.fork``) runs every task here, when its result is
first asked for.

Memory: each child's own allocations (its replay's lists and blocks: about
0.2 GB private for the 460 MB benchmark, whose columnar snapshot takes 0.23 GB
in the parent and whose read peaks at 1.8 GB) come on top of the parent's; the
snapshot itself is shared. An rlimit such as ``RLIMIT_AS`` applies to each
process separately.

Threads instead (``Pool(jobs, threads=True)``): when the tasks spend their time in C code that
releases the GIL (the compiled policy engine, ``analysis/allocator/_policycore.c``), threads run
them side by side at none of a fork's costs: no copied page tables, no copy-on-write faults in the
parent as it writes its own columns after the fork nor in the children as their allocations reuse
the parent's freed heap (on the 2-core VM: ~20k faults per child and ~18k in the parent's recorded
replay, 0.3-0.4 s of CPU per report on the 460 MB benchmark), no JSON on the way back. A task that
raises raises here, as in a serial run; one that cannot start (no thread left) runs here when its
result is asked for. Only the GIL-free parts overlap: Python-heavy tasks gain nothing from threads.
Pool threads run at a lower priority than the thread that submits (``yield_to_the_caller``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["Pending", "Pool", "available_cpus", "default_jobs"]

T = TypeVar("T")


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_jobs() -> int:
    """Children for a command-line report: one per CPU, plus one since the parent
    works beside them (the recorded replay) rather than only waiting."""
    return available_cpus() + 1


# How much a pool thread yields to the thread that submits: nice +5 gives it a third of the weight of
# a thread at 0 when both want one CPU.
POOL_THREAD_NICENESS = 5


def yield_to_the_caller() -> None:
    """A pool thread runs below the thread that submits its tasks (on Linux a thread's nice value
    is its own). The submitter (a report's own stages) is the one path that must not wait; the
    replays take what CPU it leaves, and all of them once it waits for their results. On the
    2-core VM, with the report's three replays running beside it at the same priority, its
    recorded replay took twice as long (0.28 s, not 0.14 s), and the replays' results then waited
    for the GIL it held: the report took 1.05 s; with this, 0.87 s."""
    if sys.platform.startswith("linux"):
        me = threading.get_native_id()
        with contextlib.suppress(OSError):  # a new thread starts at its creator's nice value
            os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + POOL_THREAD_NICENESS))


class Pending:
    """The result of one submitted task, computed in a child or here."""

    def __init__(self, pool: Pool, fn: Callable[[], Any]) -> None:
        self._pool = pool
        self._fn = fn
        self._pid = 0
        self._fd = -1
        self._done = False
        self._value: Any = None
        self._future: Future[Any] | None = None  # thread mode
        self.forked = False  # the value came from a child

    def result(self) -> Any:
        if self._future is not None and not self._done:  # one thread asks for a task's result
            if not self._future.cancel():
                return self._future.result()  # the task's own exception, if it raised
            self._run_here()  # no thread had taken it up yet: the one asking runs it
        while not self._done:
            self._pool._advance(self)
        return self._value

    @property
    def threaded(self) -> bool:
        """Whether a thread of the pool ran it (thread mode; not one the asking thread ran itself)."""
        return self._future is not None and not self._future.cancelled()

    def _run_here(self) -> None:
        self._value = self._fn()
        self._done = True


class Pool:
    """At most ``jobs`` children (or threads) at once; tasks start in the order submitted."""

    def __init__(self, jobs: int, *, threads: bool = False) -> None:
        self._threads = (
            ThreadPoolExecutor(max_workers=jobs, initializer=yield_to_the_caller) if threads and jobs > 1 else None
        )
        self.jobs = jobs if jobs > 1 and hasattr(os, "fork") and self._threads is None else 0
        self._queued: deque[Pending] = deque()
        self._running: deque[Pending] = deque()
        self.reruns = 0  # tasks a child failed, run again here

    @property
    def forks(self) -> bool:
        """Whether tasks run in forked children (no other thread may be running when one forks)."""
        return self.jobs > 0

    def submit(self, fn: Callable[[], Any]) -> Pending:
        task = Pending(self, fn)
        if self._threads is not None:
            # No thread could start (e.g. an address-space limit): the task runs here when asked for.
            with contextlib.suppress(RuntimeError):
                task._future = self._threads.submit(fn)
        elif self.jobs:
            self._queued.append(task)
            self._fill()
        return task

    def beside(self, fn: Callable[[], T]) -> Callable[[], T]:
        """``fn`` for a task that needs its result later: started now on a thread of this pool
        (thread mode), else run when asked for. Asking runs it in the asking thread if no thread
        has taken it up yet, so a task that waits on another never waits on one not started."""
        if self._threads is None:
            return fn
        return self.submit(fn).result

    def close(self) -> None:
        """Wait for every child or thread (a report that failed half-way leaves none behind)."""
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)
        while self._running:
            self._finish(self._running.popleft(), keep=False)
        self._queued.clear()

    def _fill(self) -> None:
        while self._queued and len(self._running) < self.jobs:
            task = self._queued.popleft()
            self._fork(task)
            self._running.append(task)

    def _advance(self, task: Pending) -> None:
        """Move towards ``task`` being done: finish the oldest child, or run it here."""
        if self._running:
            self._finish(self._running.popleft(), keep=True)
            self._fill()
        else:
            if task in self._queued:
                self._queued.remove(task)
            task._run_here()

    def _fork(self, task: Pending) -> None:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: compute, write, and leave without any cleanup of the parent's
            status = 1
            try:
                os.close(read_end)
                data = memoryview(json.dumps([True, task._fn()], allow_nan=False).encode())
                while data:
                    data = data[os.write(write_end, data) :]
                status = 0
            finally:
                os._exit(status)
        os.close(write_end)  # else later children inherit it and the read never ends
        task._pid, task._fd = pid, read_end

    def _finish(self, task: Pending, *, keep: bool) -> None:
        chunks = []
        while chunk := os.read(task._fd, 1 << 16):  # read before waiting: a full pipe blocks the child
            chunks.append(chunk)
        os.close(task._fd)
        _, status = os.waitpid(task._pid, 0)
        if not keep:
            return
        try:
            ok, value = json.loads(b"".join(chunks)) if status == 0 else (False, None)
        except ValueError:
            ok, value = False, None
        if ok is True:
            task._value, task._done, task.forked = value, True, True
        else:
            self.reruns += 1
            task._run_here()
