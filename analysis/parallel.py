"""Independent passes side by side, in forked child processes.

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
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Pending", "Pool", "available_cpus", "default_jobs"]


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


class Pending:
    """The result of one submitted task, computed in a child or here."""

    def __init__(self, pool: Pool, fn: Callable[[], Any]) -> None:
        self._pool = pool
        self._fn = fn
        self._pid = 0
        self._fd = -1
        self._done = False
        self._value: Any = None
        self.forked = False  # the value came from a child

    def result(self) -> Any:
        while not self._done:
            self._pool._advance(self)
        return self._value

    def _run_here(self) -> None:
        self._value = self._fn()
        self._done = True


class Pool:
    """At most ``jobs`` children at once; tasks start in the order submitted."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs if jobs > 1 and hasattr(os, "fork") else 0
        self._queued: deque[Pending] = deque()
        self._running: deque[Pending] = deque()
        self.reruns = 0  # tasks a child failed, run again here

    def submit(self, fn: Callable[[], Any]) -> Pending:
        task = Pending(self, fn)
        if self.jobs:
            self._queued.append(task)
            self._fill()
        return task

    def close(self) -> None:
        """Wait for every child (a report that failed half-way leaves none behind)."""
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
