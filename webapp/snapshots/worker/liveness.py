"""Which process claimed an upload, and whether that process is provably gone.

An upload's claim records the pool process that runs it (``Upload.claimed_by``) as
``host|boot id|pid namespace|pid|start time``. On the same machine (same kernel boot id) and in
the same pid namespace, ``/proc/<pid>/stat`` tells exactly whether that process still lives: a
reused pid has another start time, a zombie is dead. Anywhere else (another host, another
container, a non-Linux box) nothing can be told, and the caller must not act on the claim
(the sweep's stale heartbeat stays the fallback there).

Pool processes die with their worker's main process (Celery's prefork pool sets
``PR_SET_PDEATHSIG``), and the analysis child dies with its pool process (``runner``), so a dead
claimant means no one is still working on the upload.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

_PROC = Path("/proc")


def _boot_id() -> str:
    try:
        return (_PROC / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink(_PROC / "self" / "ns" / "pid")
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (clock ticks since boot); None when gone or a zombie."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def identity(pid: int | None = None) -> str:
    """The claim string of process ``pid`` (default: this one); "" where it cannot be made."""
    pid = os.getpid() if pid is None else pid
    boot, namespace, start = _boot_id(), _pid_namespace(), _start_time(pid)
    if not boot or not namespace or start is None:
        return ""
    return "|".join((socket.gethostname()[:64], boot, namespace, str(pid), start))


def alive(claim: str) -> bool | None:
    """True: the claiming process runs; False: it is gone; None: it cannot be told from here."""
    parts = claim.split("|")
    if len(parts) != 5 or not parts[3].isdigit():
        return None
    _host, boot, namespace, pid, start = parts
    if not boot or boot != _boot_id() or not namespace or namespace != _pid_namespace():
        return None
    return _start_time(int(pid)) == start
