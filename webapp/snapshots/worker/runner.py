"""Runs ``child.py`` in a subprocess under rlimits and a wall-clock deadline.

The child is given one job description, a JSON file (``child.Job``: the snapshot, where the report,
the charts and the explore stores go, the upload's OOM message, batch size and cap, the processes
it may use), and nothing else: no job in argv or the environment.

The worker process never parses an upload itself: the child gets an address-space cap
(``RLIMIT_AS``, from the file's size), a CPU cap (``RLIMIT_CPU``) and a wall timeout,
so a hostile or giant file ends in a ``ChildRefused`` with a stable code while the
worker goes on to the next upload.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.errors import SnapshotError
from webapp.snapshots.worker.child import Job
from webapp.snapshots.worker.childproc import REPO_ROOT, child_env, detach

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0


class ChildRefused(SnapshotError):
    """A refusal reported by the child (or imposed on it), carrying the child's code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code.rsplit(":", 1)[-1], message)
        self._code = code

    @property
    def code(self) -> str:
        return self._code


class ChildCrashed(RuntimeError):
    """The child failed in a way that is a bug (traceback in the log), not the file's fault."""


class ChildKilled(RuntimeError):
    """The child was killed from outside (SIGKILL before its CPU limit: the kernel's OOM killer, an
    operator): neither the file's fault nor a limit of ours, so the task runs it once more."""


@dataclass(frozen=True)
class Analysis:
    """What one child run produced: the report, and its charts when they were asked for (None when
    the child was stopped while charting: the report stands without them)."""

    report: dict[str, Any]
    charts: dict[str, Any] | None
    json_bytes: int = 0  # the report's and the charts' JSON as the child wrote them (what the database keeps)


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    cpu_seconds: int
    wall_seconds: float
    # Processes for the policy replays (analysis.parallel); each gets the same rlimits.
    jobs: int = 1


def unpacked_size(path: Path) -> int:
    """Size the parser will see: gzip's trailer records the unpacked size (mod 2**32)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        if fh.read(2) != b"\x1f\x8b" or size < 18:
            return size
        fh.seek(-4, os.SEEK_END)
        isize = int.from_bytes(fh.read(4), "little")
    # ISIZE wraps at 4 GiB; never assume less than the compressed size.
    return max(isize, size)


def limits_for(
    path: Path, *, per_byte: int, minimum: int, maximum: int, cpu: int, wall: float, jobs: int = 1
) -> Limits:
    memory = min(maximum, minimum + per_byte * unpacked_size(path))
    return Limits(memory_bytes=memory, cpu_seconds=cpu, wall_seconds=wall, jobs=jobs)


def _set_limits(limits: Limits) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec
        detach()
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_child(
    path: Path,
    limits: Limits,
    *,
    filename: str | None = None,
    on_progress: Callable[[str | None, int | None], None] = lambda stage, pct: None,
    on_report: Callable[[dict[str, Any]], None] | None = None,
    oom_message: str = "",
    batch_size: int | None = None,
    cap_bytes: int | None = None,
    explore_dir: Path | None = None,
    charts: bool = False,
) -> Analysis:
    """The child's report (and with ``charts`` its charts, built in the child under its limits);
    ``ChildRefused`` for a refused file, ``ChildKilled`` when something outside killed it.

    With ``explore_dir`` the child also writes there one ``<device>.npz`` per device: the stored
    replay data the site's digging endpoints read (``analysis.explore.explore_store``).

    ``on_progress(stage, percent)`` is called for every progress line and at least every
    few seconds with ``(None, None)`` as a heartbeat. ``on_report(report)`` is called once, as soon
    as the report is written and while the child goes on with the stores and the charts: the
    worker stores the user's first answer then (issue 34).

    The child is this process's spare (``warmchild``), its imports done, where one is kept; else
    a cold one. Either runs the job under the same limits.
    """
    with tempfile.TemporaryDirectory(prefix="oomscope-") as tmp:
        job = Job(
            snapshot=str(path),
            report=str(Path(tmp) / "report.json"),
            filename=filename or None,
            jobs=limits.jobs,
            oom_message=oom_message or None,
            batch_size=int(batch_size) if batch_size else None,
            cap_bytes=int(cap_bytes) if cap_bytes else None,
            explore_dir=str(explore_dir) if explore_dir is not None else None,
            charts=str(Path(tmp) / "charts.json") if charts else None,
        )
        job_path = Path(tmp) / "job.json"
        job.write(job_path)
        first = _FirstAnswer(Path(job.report), on_report)
        cpu_before = _children_cpu()
        started = time.monotonic()
        child = _start(job_path, limits, Path(tmp) / "stderr.txt")
        try:
            last_event, reported = _pump(child.proc, limits, started, on_progress, first)
        finally:
            if child.proc.poll() is None:
                _kill(child.proc)
            child.proc.wait()
            from webapp.snapshots.worker import warmchild

            warmchild.replace()  # the next job's spare starts while this one's result is stored
        elapsed = time.monotonic() - started
        # This child and its jobs (the pool process runs one at a time), less a spare's imports.
        cpu_used = _children_cpu() - cpu_before - child.warmup_cpu
        stderr_tail = child.stderr_tail()
        rc = child.proc.returncode
        log.info(
            "analysis child exited rc=%s after %.1fs, %.1fs CPU (memory cap %d bytes%s)",
            rc,
            elapsed,
            cpu_used,
            limits.memory_bytes,
            ", warm" if child.warm else "",
        )
        if last_event.get("event") == "error":
            raise ChildRefused(str(last_event.get("code")), str(last_event.get("message", "")))
        if reported or (rc == 0 and last_event.get("event") == "done"):
            return _analysis(job, first, finished=rc == 0 and last_event.get("event") == "done", rc=rc)
        raise _failure(last_event, limits, stderr_tail, rc, elapsed, cpu_used)


@dataclass
class _Started:
    """A running child: a spare given its job, or a cold one."""

    proc: subprocess.Popen[bytes]
    stderr_path: Path
    warm: bool
    warmup_cpu: float = 0.0

    def stderr_tail(self) -> str:
        try:
            tail = self.stderr_path.read_bytes()[-4000:].decode("utf-8", "replace")
        except OSError:
            return ""
        if self.warm:  # the spare's file, outside the job's temporary folder
            self.stderr_path.unlink(missing_ok=True)
        return tail


def _start(job_path: Path, limits: Limits, stderr_path: Path) -> _Started:
    from webapp.snapshots.worker import warmchild

    spare = warmchild.take()
    if spare is not None:
        warmchild.send(spare, job_path, limits.memory_bytes, limits.cpu_seconds)
        return _Started(spare.proc, spare.stderr_path, True, spare.warmup_cpu)
    cmd = [sys.executable, "-m", "webapp.snapshots.worker.child", str(job_path)]
    with stderr_path.open("wb") as err:
        proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            cmd,
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT,
            env=child_env(),
            preexec_fn=_set_limits(limits),
        )
    return _Started(proc, stderr_path, False)


class _FirstAnswer:
    """The report as soon as the child wrote it: read once, handed to ``on_report`` once."""

    def __init__(self, path: Path, on_report: Callable[[dict[str, Any]], None] | None) -> None:
        self.path = path
        self.on_report = on_report
        self.report: dict[str, Any] | None = None

    def read(self) -> dict[str, Any]:
        if self.report is None:
            with self.path.open() as fh:
                self.report = json.load(fh)
        return self.report

    def arrived(self) -> None:
        if self.on_report is not None:
            self.on_report(self.read())


def _analysis(job: Job, first: _FirstAnswer, *, finished: bool, rc: int) -> Analysis:
    """What a child that wrote its report produced (its charts when it also finished them)."""
    report = first.read()
    if job.charts and not finished:
        log.warning("analysis child stopped while charting (rc=%s); the report is kept without charts", rc)
    chart_data: dict[str, Any] | None = None
    json_bytes = Path(job.report).stat().st_size
    charts_path = Path(job.charts) if job.charts else None
    if charts_path is not None and finished and charts_path.exists():
        json_bytes += charts_path.stat().st_size
        with charts_path.open() as fh:
            chart_data = json.load(fh)
    return Analysis(report, chart_data, json_bytes)


def _failure(
    last_event: dict[str, Any], limits: Limits, stderr_tail: str, rc: int, elapsed: float, cpu_used: float
) -> Exception:
    """The error of a child that wrote no report: a limit, the file's shape, an outside kill or a bug."""
    if last_event.get("event") == "timeout":
        return ChildRefused("snapshot:limit:time", f"analysis stopped after {limits.wall_seconds:.0f} s")
    if _reader_overflowed(stderr_tail, rc):
        return ChildRefused(
            "snapshot:limit:too-deep",
            "the file nests too deeply to be read (a value nested so deep that hashing it overflowed the stack)",
        )
    if rc == -signal.SIGKILL and cpu_used < limits.cpu_seconds - 1:
        # RLIMIT_CPU sends SIGXCPU at the limit and SIGKILL only 5 s past it: a SIGKILL before the
        # limit came from outside (the kernel's OOM killer, an operator), not from this file's CPU.
        return ChildKilled(f"analysis child killed from outside after {elapsed:.1f} s, {cpu_used:.1f} s CPU")
    if rc in (-signal.SIGXCPU, -signal.SIGKILL) and elapsed < limits.wall_seconds and _cpu_bound(stderr_tail, rc):
        return ChildRefused("snapshot:limit:time", f"analysis used more than {limits.cpu_seconds} s of CPU")
    if "MemoryError" in stderr_tail or "Cannot allocate memory" in stderr_tail or "bad_alloc" in stderr_tail:
        return ChildRefused("snapshot:limit:memory", f"analysis needed more than {limits.memory_bytes} bytes")
    return ChildCrashed(f"analysis child exited with status {rc}; stderr tail:\n{stderr_tail}")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _reader_overflowed(stderr_tail: str, rc: int) -> bool:
    """A segfault while the reader unpickled (faulthandler's stack, see child.py: the unpickler,
    ``analysis/unpickler.py``, runs under ``analysis/reader.py``'s ``read_snapshot``, whose frame it shows).

    CPython hashes a tuple recursively in C, with no depth check; the unpickler hashes every dict
    key as it builds the dict, so a key nested a million deep crashes the child before any check
    of ours can run. That is the file's shape, refused with the depth limit's code.
    """
    return rc == -signal.SIGSEGV and "Segmentation fault" in stderr_tail and 'reader.py", line' in stderr_tail


def _cpu_bound(stderr_tail: str, rc: int) -> bool:
    return rc == -signal.SIGXCPU or not stderr_tail.strip()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own session


def _pump(
    proc: subprocess.Popen[bytes],
    limits: Limits,
    started: float,
    on_progress: Callable[[str | None, int | None], None],
    first: _FirstAnswer | None = None,
) -> tuple[dict[str, Any], bool]:
    """Read the child's event lines until it exits or the deadline passes; return the last event
    and whether the report was written (``report``), whatever happened after."""
    assert proc.stdout is not None
    last: dict[str, Any] = {}
    reported = False
    buffer = b""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    last_beat = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            if now - started > limits.wall_seconds:
                _kill(proc)
                return {"event": "timeout"}, reported
            if now - last_beat >= HEARTBEAT_SECONDS:
                on_progress(None, None)
                last_beat = now
            if not sel.select(timeout=1.0):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                return last, reported
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # stray output from a library; not part of the protocol
                if not isinstance(event, dict):
                    continue
                last = event
                if event.get("event") == "report" and not reported:
                    reported = True
                    if first is not None:
                        first.arrived()
                if event.get("event") == "progress":
                    on_progress(event.get("stage") or None, event.get("progress"))
                    last_beat = time.monotonic()
    finally:
        sel.close()
