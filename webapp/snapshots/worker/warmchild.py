"""A spare analysis child per worker pool process, started before its job comes (issue 34).

A cold child costs about 0.5 s of imports (the analysis, numpy) and 0.6 s of bokeh before it reads
a byte: most of a small file's wait. A spare (``python -m webapp.snapshots.worker.child --warm``) has them
done when its job comes; ``runner.run_child`` sends it the job file and its rlimits on stdin and the
child sets them on itself (``child._limit_self``) before it reads the job, so every limit, refusal
and timeout is the cold child's. A spare runs one job and exits, as a cold child does: the next
spare starts when the job is over (``replace``), while the worker stores its result.

Spares exist only where ``enable`` was called: the Celery pool processes (``tasks.py``, on
``worker_process_init``, unless ``ANALYSIS_WARM_CHILD`` is off). Elsewhere (tests, the management
commands) every analysis starts a cold child as before. Like a cold child, a spare leads its own
session and dies with its pool process (``PR_SET_PDEATHSIG``); it is started from the pool process's
main thread, since that signal follows the thread that forked it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from webapp.snapshots.worker import childproc

log = logging.getLogger(__name__)

READY_WAIT_SECONDS = 30.0  # a spare still importing is waited for this long (a cold start costs the same)


@dataclass
class Spare:
    proc: subprocess.Popen[bytes]
    stderr_path: Path  # its stderr, chosen at its start; the runner reads the tail after the job
    warmup_cpu: float = 0.0  # CPU seconds of its imports (the "ready" line): not the job's
    ready: bool = False  # its "ready" line read


_enabled = False
_spare: Spare | None = None


def enable() -> None:
    """Keep a spare from now on in this process, and start the first one."""
    global _enabled
    _enabled = True
    replace()


def disable() -> None:
    """No spare any more: the one waiting is stopped."""
    global _enabled, _spare
    _enabled = False
    spare, _spare = _spare, None
    if spare is not None:
        discard(spare)


def enabled() -> bool:
    return _enabled


def _detach() -> None:  # runs in the spare between fork and exec
    childproc.detach()
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def replace() -> None:
    """Start a spare when this process keeps one and none is waiting (or the last one died)."""
    global _spare
    if not _enabled or (_spare is not None and _spare.proc.poll() is None):
        return
    fd, name = tempfile.mkstemp(prefix="oomscope-spare-", suffix=".stderr")
    with os.fdopen(fd, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "webapp.snapshots.worker.child", "--warm"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=childproc.REPO_ROOT,
            env=childproc.child_env(),
            preexec_fn=_detach,
        )
    _spare = Spare(proc, Path(name))


def take() -> Spare | None:
    """The waiting spare, ready for a job, or None (none kept, or it died or hung in its imports:
    the caller starts a cold child)."""
    global _spare
    spare, _spare = _spare, None
    if spare is None:
        return None
    if not _await_ready(spare, READY_WAIT_SECONDS):
        log.warning("spare analysis child not ready (rc=%s); a cold one runs", spare.proc.poll())
        discard(spare)
        return None
    return spare


def wait_ready(wait: float = READY_WAIT_SECONDS) -> bool:
    """Whether the waiting spare is ready for a job, waiting for its imports up to ``wait`` seconds
    (for the benches: a job sent then measures the analysis only)."""
    return _spare is not None and _await_ready(_spare, wait)


def _await_ready(spare: Spare, wait: float) -> bool:
    if not spare.ready and spare.proc.poll() is None:
        ready = _read_ready(spare.proc.stdout, wait)
        if ready is not None:
            spare.warmup_cpu = float(ready.get("cpu") or 0.0)
            spare.ready = True
    return spare.ready and spare.proc.poll() is None


def send(spare: Spare, job_path: Path, memory_bytes: int, cpu_seconds: int) -> None:
    """Give the spare its one job: the job file and the rlimits it sets on itself first."""
    assert spare.proc.stdin is not None
    order = {"job": str(job_path), "memory_bytes": int(memory_bytes), "cpu_seconds": int(cpu_seconds)}
    spare.proc.stdin.write((json.dumps(order) + "\n").encode())
    spare.proc.stdin.close()


def discard(spare: Spare) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(spare.proc.pid, signal.SIGKILL)
    spare.proc.wait()
    for stream in (spare.proc.stdin, spare.proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    spare.stderr_path.unlink(missing_ok=True)


def _read_ready(stdout: IO[bytes] | None, wait: float) -> dict[str, float] | None:
    """The spare's ``ready`` line, read byte by byte (nothing past it: the job's events follow)."""
    assert stdout is not None
    line = b""
    deadline = time.monotonic() + wait
    with selectors.DefaultSelector() as sel:
        sel.register(stdout, selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(timeout=left):
                return None
            byte = os.read(stdout.fileno(), 1)
            if not byte:
                return None
            line += byte
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and event.get("event") == "ready" else None
