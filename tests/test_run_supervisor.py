"""`make run`'s supervisor (``scripts/run.sh``) under ``kill -9`` (issue 22, item 7).

Before: ``kill -9`` of supervisord left redis, the worker and gunicorn serving as orphans, and a
second ``make run`` crash-looped on the busy port. Now run.sh outlives supervisord and stops its
whole tree when supervisord exits, however it exits, and a start beside an earlier run's
processes refuses with the command that stops them.

The real script runs here, on a free port and a temporary var dir (SQLite, its own redis), with
one gunicorn process and one pool process to start quickly: ``supervisord_kill9_cycle`` starts it,
kills supervisord with SIGKILL, waits for the tree to go, starts it again on the same port and
var dir, then kills run.sh and supervisord together (SIGKILL to their process group: what a
closed terminal or an OOM kill of both leaves), so the programs are real orphans, and starts a
third time beside them. ``scripts/reliability.py`` (scenario ``supervisord-kill9``) runs the same
function and prints its figures.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
SUPERVISORCTL = Path(PY).parent / "supervisorctl"
PROGRAMS = ("redis", "worker", "webhooks", "web")

pytestmark = pytest.mark.worker  # starts real redis, celery and gunicorn processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie serves nothing; its parent reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            text = fh.read().replace(b"\0", b" ").decode(errors="replace")
        return f"{pid} {text[:100]}"
    except OSError:
        return f"{pid} (gone)"


def _tree(pid: int) -> set[int]:
    """``pid``'s descendants (from /proc: ppid links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


class RunSh:
    """One ``bash scripts/run.sh`` in a session of its own."""

    def __init__(self, var: Path, port: int, env: dict[str, str]) -> None:
        self.var, self.port, self.env = var, port, env
        self.log = var / f"run-{time.monotonic_ns()}.out"
        worker_log = var / "log" / "worker.log"
        self.worker_log_from = worker_log.stat().st_size if worker_log.exists() else 0  # appended across runs
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                ["bash", str(ROOT / "scripts" / "run.sh")],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def program_pids(self) -> dict[str, int]:
        conf = self.var / "run" / "supervisord.conf"
        pids = {}
        for program in PROGRAMS:
            done = subprocess.run(
                [str(SUPERVISORCTL), "-c", str(conf), "pid", program],
                capture_output=True,
                text=True,
                check=False,
                timeout=10,
            )
            pids[program] = int(done.stdout.strip()) if done.stdout.strip().isdigit() else 0
        return pids

    def worker_ready(self) -> bool:
        """The Celery worker of this start logged "ready." (a worker killed while it boots ignores
        SIGTERM until then, and run.sh's reap then waits its 10 s before SIGKILL)."""
        try:
            with (self.var / "log" / "worker.log").open("rb") as fh:
                fh.seek(self.worker_log_from)
                return b" ready." in fh.read()
        except OSError:
            return False

    def wait_serving(self, timeout: float) -> float:
        """Seconds until every program runs, gunicorn answers on the port and the worker is ready."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.proc.poll() is not None:
                raise AssertionError(f"run.sh exited {self.proc.returncode}: {self.output()[-2000:]}")
            if _port_open(self.port) and all(self.program_pids().values()) and self.worker_ready():
                return time.monotonic() - started
            time.sleep(0.2)
        raise AssertionError(f"not serving after {timeout} s: {self.output()[-2000:]}")

    def supervisord_pid(self) -> int:
        return int((self.var / "run" / "supervisord.pid").read_text().strip())

    def stop(self) -> None:
        """Ctrl-C as `make run` gets it; SIGKILL of whatever is left after 60 s."""
        left = _tree(self.proc.pid) | {self.proc.pid}
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)
        for pid in left:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def _wait_gone(pids: set[int], timeout: float) -> tuple[float, set[int]]:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        alive = {p for p in pids if _alive(p)}
        if not alive:
            return time.monotonic() - started, set()
        time.sleep(0.1)
    return time.monotonic() - started, {p for p in pids if _alive(p)}


def _run_env(var: Path, port: int) -> dict[str, str]:
    """run.sh's environment on ``var`` and ``port`` (SQLite, migrated; its own Redis)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "DATABASE_URL", "OOMSCOPE_RUN_VAR", "OOMSCOPE_RUN_ID")
    }
    env.update(
        VAR_DIR=str(var),
        PORT=str(port),
        DATABASE_URL=f"sqlite:///{var}/db.sqlite3",
        WEB_WORKERS="1",
        WORKER_CONCURRENCY="1",
        DJANGO_SETTINGS_MODULE="webapp.settings",
    )
    subprocess.run([PY, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True, timeout=120)
    return env


def supervisord_kill9_cycle(var: Path | None = None, port: int | None = None) -> dict[str, Any]:
    """The three starts of the module's docstring; their figures (seconds, pids, the refusal)."""
    var = var or Path(tempfile.mkdtemp(prefix="oomscope-runsh-"))
    port = port or _free_port()
    env = _run_env(var, port)
    figures: dict[str, Any] = {"port": port}
    runs: list[RunSh] = []
    try:
        first = RunSh(var, port, env)
        runs.append(first)
        figures["first_start_s"] = round(first.wait_serving(90), 1)
        tree = _tree(first.proc.pid)
        figures["first_tree"] = len(tree)
        killed = time.monotonic()
        os.kill(first.supervisord_pid(), signal.SIGKILL)
        first.proc.wait(timeout=60)
        figures["run_sh_exit_after_kill_s"] = round(time.monotonic() - killed, 1)
        _gone_s, left = _wait_gone(tree, 30)
        figures["tree_gone_after_kill_s"] = round(time.monotonic() - killed, 1) if not left else None
        figures["left_after_kill"] = sorted(left)
        figures["port_free_after_kill"] = not _port_open(port)
        figures["reap_message"] = "supervisord is gone; stopping what it left" in first.output()
        figures["reap_needed_sigkill"] = "still running 10 s after SIGTERM" in first.output()
        killed = re.search(r"SIGKILL:([\d ]+)", first.output())
        # What the reap SIGKILLed, if anything, was of the run's tree: never a pid of its own helpers.
        figures["sigkilled_outside_the_tree"] = (
            sorted({int(p) for p in killed.group(1).split()} - tree) if killed else []
        )

        second = RunSh(var, port, env)
        runs.append(second)
        figures["second_start_s"] = round(second.wait_serving(90), 1)
        programs = second.program_pids()
        figures["second_programs_running"] = all(_alive(p) for p in programs.values())
        served = set(programs.values()) | _descendants(programs)
        # run.sh and supervisord killed together: their programs, in process groups of their own, stay.
        os.killpg(second.proc.pid, signal.SIGKILL)
        second.proc.wait(timeout=10)
        time.sleep(1)
        orphans = {p for p in served if _alive(p)}
        figures["orphans"] = len(orphans)
        figures["orphans_still_serving"] = _port_open(port)

        third = RunSh(var, port, env)
        runs.append(third)
        third.proc.wait(timeout=60)
        said = third.output()
        figures["third_exit"] = third.proc.returncode
        listed = re.search(r"are still running: ([\d ]+)", said)
        named = {int(p) for p in listed.group(1).split()} if listed else set()
        command = re.search(r"stop them first[^:]*:\s+(.+)$", said, re.MULTILINE)
        figures["refusal"] = said.strip().splitlines()[-1] if said.strip() else ""
        figures["refusal_names_every_orphan"] = bool(orphans) and orphans <= named
        started = time.monotonic()
        if command:  # the command as printed, run as a user would paste it
            subprocess.run(["bash", "-c", command.group(1)], cwd=ROOT, env=env, check=False, timeout=60)
        figures["stop_command_s"] = round(time.monotonic() - started, 1)
        stop_s, left = _wait_gone(orphans | named, 30)
        figures["orphans_gone_after_kill_command_s"] = round(stop_s, 1) if not left else None
        figures["left_after_kill_command"] = [_cmdline(p) for p in sorted(left)]
    finally:
        for run in runs:
            run.stop()
    return figures


def _descendants(programs: dict[str, int]) -> set[int]:
    found: set[int] = set()
    for pid in programs.values():
        found |= _tree(pid)
    return found


def test_kill9_of_supervisord_takes_the_tree_down_and_orphans_block_the_next_start(tmp_path: Path) -> None:
    started = time.monotonic()
    figures = supervisord_kill9_cycle(tmp_path / "var", _free_port())
    print(figures, f"total {time.monotonic() - started:.1f} s")
    # kill -9 of supervisord: run.sh notices, stops what it left, exits; nothing keeps the port.
    assert figures["first_tree"] >= 4  # supervisord, redis, the worker (and its pool), gunicorn (and its worker)
    assert figures["left_after_kill"] == [] and figures["tree_gone_after_kill_s"] is not None
    assert figures["reap_message"] and figures["port_free_after_kill"]
    # The reap waits for the run's processes only, not its own helpers (before: they carried the
    # run id, were counted as left, so it always waited its 10 s and then SIGKILLed their gone pids).
    # A Celery worker still stopping after 10 s may be SIGKILLed (1 run in 13 here), nothing else.
    assert figures["sigkilled_outside_the_tree"] == []
    assert figures["reap_needed_sigkill"] or figures["run_sh_exit_after_kill_s"] < 10
    # A second start on the same var dir and port works.
    assert figures["second_programs_running"]
    # Orphans of a run whose run.sh died too: a third start refuses, naming every one of them (the
    # Celery pool and beat, gunicorn's workers included), and the command it prints stops them all
    # (before: `kill <pids>` named neither pool nor beat, and a worker killed with its Redis hung).
    assert figures["orphans"] >= 3 and figures["orphans_still_serving"]
    assert figures["third_exit"] == 1
    assert figures["refusal"].endswith(f"VAR_DIR={tmp_path / 'var'} bash scripts/run.sh --stop")
    assert figures["refusal_names_every_orphan"]
    assert figures["orphans_gone_after_kill_command_s"] is not None


def test_kill9_of_the_worker_leaves_no_beat_behind(tmp_path: Path) -> None:
    """SIGKILL of the Celery main process (kill-main; the kernel's OOM killer): its embedded beat
    goes with it (before: it ran on beside the restarted worker's beat, invisible to run.sh)."""
    var, port = tmp_path / "var", _free_port()
    run = RunSh(var.mkdir() or var, port, _run_env(var, port))
    try:
        run.wait_serving(90)
        main = run.program_pids()["worker"]
        beats = [p for p in _tree(main) if "celery beat" in _cmdline(p)]
        assert len(beats) == 1, [_cmdline(p) for p in _tree(main)]
        os.kill(main, signal.SIGKILL)
        gone_s, left = _wait_gone(set(beats), 15)
        assert not left, f"the beat of the killed worker still runs: {_cmdline(beats[0])}"
        # supervisord restarts the worker, with a beat of its own: one beat in the tree again.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = [p for p in _tree(run.proc.pid) if _alive(p) and "celery beat" in _cmdline(p)]
            if now and run.program_pids()["worker"] not in (0, main):
                break
            time.sleep(0.2)
        assert len(now) == 1 and now != beats
        print(f"beat gone {gone_s:.1f} s after kill -9 of its worker")
    finally:
        run.stop()
