# ruff: noqa: S603, S607 - fixed argv (our scripts, our venv, bash), never user input
"""`make reliability`: the site as `make run` starts it, under load and faults, measured.

For each database (SQLite in a fresh VAR_DIR, and PostgreSQL when DATABASE_URL_POSTGRES or
--postgres is given) this starts scripts/run.sh (supervisord: Redis, a Celery worker with
beat, gunicorn gthread) on a free loopback port, then runs the scenarios below through the
HTTP API with real snapshots from tests/fixtures, and prints one JSON line per scenario plus
a summary (also written to var/reliability/results.json). Exit status 1 when a pass criterion
fails. Nothing here is part of `make test`: it takes minutes and starts real services.

Scenarios (docs/reliability.md has the table of figures):
  concurrent    N parallel uploads (default 50) of the fixtures; all must end done; API p50/p99
                of status and list calls while the workers are busy.
  kill-pool     SIGKILL of the pool process mid-analysis: the redelivered message re-runs the
                upload at once; total time vs an undisturbed run of the same file.
  kill-main     SIGKILL of the Celery main process: supervisord restarts it alone; the site keeps
                answering; the upload in flight is re-run as soon as the worker is back (its
                start re-queues the claims of dead processes), not by the sweep.
  kill-redis    SIGKILL of redis-server: restarted alone (the worker keeps its pid); uploads during
                the outage and after it all end done.
  broker-down   Redis stopped: an upload answers 202 queued with publish pending; a retry with the
                same Idempotency-Key returns the same upload; Redis back: it ends done.
  slow-clients  S sockets trickling half a request: /healthz latency meanwhile.

Issue 22's attacks (one user must not stall, starve or fill the service), each on the live site:
  oom-message, idempotency-replay, share-link-junk, gzip-members, many-devices, hostile-values,
  fair-queue, disk-stores, delete-mid-analysis, child-killed, admin-login, sign-ups, bad-params,
  bidi-names, half-open, supervisord-kill9 (the test_run_supervisor cycle on a site of its own);
  attack-tests: the attacks a live site cannot stage (a full disk, a failed final write, a trusted
  proxy, a lock-out, team limits, invitations, temp files of killed processes), run as their tests;
  attack-figures: scripts/attack_figures.py in process, after and before (8c2d8f6).
Issue 36's four HIGH findings, on a site of their own with make run's upload rates and a disk reserve
400 MB under the free space (`--issue36` runs only these): quiet (the baseline: nothing but the
pollers), segments-dos (70 anonymous segments.json of a 20k map / 100k unmap upload), webhook-slow
(4 deliveries to a receiver that never answers, then another team's upload), archive-ranks (50 ranks
in one archive, then another team's upload; 1,000 ranks in a small tar.xz), archive-bomb (a tar.bz2
of a few hundred bytes declaring 300 MB).
Every scenario on the site also reports, measured while it runs: its seconds, another team's API
latency (p50 / p99 / max / failed calls of a client polling that team's run list every 0.2 s),
/healthz (p99 and failed calls, polled every 0.2 s), the
site's memory (RSS of supervisord's whole tree, at start and at its peak) and the disk it added
(bytes under the site's var dir). `--attacks` runs only issue 22's attacks (about 3-4 minutes here).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "client"), str(ROOT)]
from oomscope_client.upload import UploadError, new_idempotency_key, upload  # noqa: E402

PY = str(ROOT / ".venv" / "bin" / "python")
FIXTURES = sorted((ROOT / "tests" / "fixtures").glob("*.pickle.gz"))
FIXTURES_BY_NAME = {p.name: p for p in FIXTURES}
BIG = ROOT / "tests" / "fixtures" / "big_all_stacks.pickle.gz"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


class Site:
    """One `scripts/run.sh` under its own VAR_DIR and port."""

    def __init__(self, name: str, database_url: str | None, sweep_running: int) -> None:
        self.name = name
        self.var = ROOT / "var" / "reliability" / name
        shutil.rmtree(self.var, ignore_errors=True)
        self.var.mkdir(parents=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
        self.env.update(
            {
                "VAR_DIR": str(self.var),
                "PORT": str(self.port),
                "DATABASE_URL": database_url or f"sqlite:///{self.var}/db.sqlite3",
                "STATIC_ROOT": str(ROOT / "var" / "staticfiles"),
                # Short sweep periods so the scenarios that rely on it end in minutes, not the
                # production defaults' (60 s interval, 180 s stale heartbeat).
                "SWEEP_INTERVAL_SECONDS": "5",
                "SWEEP_STALE_RUNNING_SECONDS": str(sweep_running),
                "SWEEP_STALE_QUEUED_SECONDS": "30",
                # One token sends every scenario's uploads (some 200 in 10 minutes): the per-token and
                # per-user upload rates (60/10m, 120/h) would refuse most of them after `concurrent`.
                # The replay rate, which idempotency-replay measures, keeps its default.
                "UPLOAD_RATE_PER_TOKEN": "10000/10m",
                "UPLOAD_RATE_PER_USER": "10000/h",
            }
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def manage(self, *args: str) -> str:
        out = subprocess.run(
            [PY, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True, check=True
        )
        return out.stdout.strip()

    def start(self) -> None:
        self.manage("migrate", "--noinput", "-v0")
        log = (self.var / "run.out").open("ab")
        self.proc = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "run.sh")],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_healthy(120)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)  # run.sh passes it to supervisord, then stops what is left
        try:
            self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def ctl(self, *args: str) -> str:
        conf = self.var / "run" / "supervisord.conf"
        out = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "supervisorctl"), "-c", str(conf), *args],
            capture_output=True,
            text=True,
            check=False,
        )
        return out.stdout.strip()

    def pid(self, program: str) -> int:
        return int(self.ctl("pid", program) or 0)

    def health(self, timeout: float = 5.0) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=timeout) as r:  # noqa: S310
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")
        except (OSError, ValueError):
            return 0, {}

    def wait_healthy(self, timeout: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            status, body = self.health()
            if status == 200 and body.get("worker") == "ok":
                return time.monotonic() - started
            time.sleep(0.2)
        raise RuntimeError(f"{self.name}: site not healthy after {timeout} s; see {self.var}/log")

    def get(self, token: str, path: str) -> tuple[int, Any, float]:
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {token}"})  # noqa: S310
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=30) as r:  # noqa: S310
                body = json.loads(r.read())
                status = r.status
        except urllib.error.HTTPError as e:
            status, body = e.code, json.loads(e.read() or b"{}")
        return status, body, time.monotonic() - started

    def wait_done(self, token: str, code: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status, body, _ = self.get(token, f"/api/v1/snapshots/{code}")
            if status == 200 and body["status"] in ("done", "failed"):
                return dict(body)
            if time.monotonic() > deadline:
                return dict(body) if status == 200 else {"status": f"http {status}"}
            time.sleep(0.25)

    def analysis_children(self) -> list[Any]:
        import psutil

        main = self.pid("worker")
        children = psutil.Process(main).children(recursive=True)
        return [c for c in children if "webapp.snapshots.worker.child" in " ".join(c.cmdline())]


def post(site: Site, token: str, path: Path, project: str = "rel", **kw: Any) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    body = upload(path, site.url, token, project=project, timeout=120, **kw)
    return body, time.monotonic() - started


# --- scenarios ----------------------------------------------------------------------------


def concurrent(site: Site, token: str, n: int) -> dict[str, Any]:
    files = [FIXTURES[i % len(FIXTURES)] for i in range(n)]
    api_times: list[float] = []
    api_errors = 0
    stop = threading.Event()
    codes: list[str] = []

    def sample() -> None:
        nonlocal api_errors
        while not stop.is_set():
            for path in ([f"/api/v1/snapshots/{codes[-1]}"] if codes else []) + ["/api/v1/projects/rel/runs"]:
                status, _, took = site.get(token, path)
                if status == 200:
                    api_times.append(took)
                else:
                    api_errors += 1
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.monotonic()
    sampler.start()
    ack_times: list[float] = []
    refused: list[str] = []
    with ThreadPoolExecutor(max_workers=n) as pool:
        for fut in [pool.submit(post, site, token, f) for f in files]:
            try:
                body, took = fut.result()
                codes.append(body["id"])
                ack_times.append(took)
            except UploadError as exc:
                refused.append(str(exc)[:200])
    outcomes = [site.wait_done(token, code, timeout=900) for code in codes]
    wall = time.monotonic() - started
    stop.set()
    sampler.join(timeout=30)
    done = sum(1 for o in outcomes if o["status"] == "done")
    failed = [(o.get("error") or {}).get("code") or o["status"] for o in outcomes if o["status"] != "done"]
    return {
        "uploads": n,
        "accepted": len(codes),
        "done": done,
        "not_done": failed + refused,
        "wall_s": round(wall, 1),
        "upload_ack_p50_ms": round(percentile(ack_times, 50) * 1000),
        "upload_ack_p99_ms": round(percentile(ack_times, 99) * 1000),
        "api_calls": len(api_times),
        "api_errors": api_errors,
        "api_p50_ms": round(percentile(api_times, 50) * 1000, 1),
        "api_p99_ms": round(percentile(api_times, 99) * 1000, 1),
        "pass": done == n and api_errors == 0,
    }


def kill_pool(site: Site, token: str) -> dict[str, Any]:
    body, _ = post(site, token, BIG)
    started = time.monotonic()
    normal = site.wait_done(token, body["id"], 300)
    normal_s = time.monotonic() - started
    body, _ = post(site, token, BIG)
    started = time.monotonic()
    deadline = started + 60
    children: list[Any] = []
    while not children and time.monotonic() < deadline:
        children = site.analysis_children()
        time.sleep(0.05)
    time.sleep(normal_s / 3)
    before = site.get(token, f"/api/v1/snapshots/{body['id']}")[1]
    pool = children[0].parent()
    pool.kill()
    killed = time.monotonic()
    killed_at = killed - started
    # The redelivered message's claim resets the row to stage "reading", progress 0.
    reclaimed = None
    while time.monotonic() - killed < 120:
        now = site.get(token, f"/api/v1/snapshots/{body['id']}")[1]
        if now["status"] == "done" or (now["stage"] == "reading" and now["progress"] == 0):
            reclaimed = time.monotonic() - killed
            break
        time.sleep(0.05)
    final = site.wait_done(token, body["id"], 300)
    total = time.monotonic() - started
    return {
        "normal_s": round(normal_s, 1),
        "killed_after_s": round(killed_at, 1),
        "stage_when_killed": f"{before['stage']} {before['progress']}%",
        "rerun_started_after_kill_s": round(reclaimed, 2) if reclaimed is not None else None,
        "total_with_kill_s": round(total, 1),
        "ratio": round(total / normal_s, 2),
        "status": final["status"],
        "pass": normal["status"] == "done" and final["status"] == "done" and total <= 2 * normal_s + 3,
    }


def watch_site(site: Site, stop: threading.Event, samples: list[tuple[float, int, str]]) -> None:
    while not stop.is_set():
        status, body = site.health(timeout=2)
        samples.append((time.monotonic(), status, str(body.get("worker"))))
        time.sleep(0.1)


def kill_program(site: Site, token: str, program: str, sweep_running: int) -> dict[str, Any]:
    """SIGKILL one supervised program while an upload is in flight; the rest must stay up."""
    others = {p: site.pid(p) for p in ("redis", "worker", "web") if p != program}
    body, _ = post(site, token, BIG)
    code = body["id"]
    deadline = time.monotonic() + 60
    while not site.analysis_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    # Mid-analysis, past the claim's "reading 0%", so that a reset to it shows a re-run.
    while time.monotonic() < deadline:
        now = site.get(token, f"/api/v1/snapshots/{code}")[1]
        if now["status"] != "running" or (now["stage"], now["progress"]) != ("reading", 0):
            break
        time.sleep(0.05)
    samples: list[tuple[float, int, str]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=watch_site, args=(site, stop, samples), daemon=True)
    watcher.start()
    before = site.get(token, f"/api/v1/snapshots/{code}")[1]
    # When the in-flight upload is taken up again: back to queued, or its claim reset to
    # "reading 0%" (a re-run), or done (its first run finished: nothing had to be re-run).
    rerun: dict[str, Any] = {}

    def watch_upload() -> None:
        while not stop.is_set() and not rerun:
            now = site.get(token, f"/api/v1/snapshots/{code}")[1]
            if now["status"] == "queued" or (now["stage"] == "reading" and now["progress"] == 0):
                rerun.update(after_s=time.monotonic() - killed, how="re-run")
            elif now["status"] in ("done", "failed"):
                rerun.update(after_s=time.monotonic() - killed, how=f"first run {now['status']}")
            time.sleep(0.1)

    log_size = (site.var / "log" / "worker.log").stat().st_size
    victim = site.pid(program)
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    upload_watcher = threading.Thread(target=watch_upload, daemon=True)
    upload_watcher.start()
    # Uploads while it is down (for Redis: published after its restart or by the sweep).
    during: list[str] = []
    for f in FIXTURES[:3]:
        try:
            during.append(post(site, token, f)[0]["id"])
        except UploadError as exc:
            during.append(f"refused: {exc}"[:120])
    restarted = None
    while time.monotonic() - killed < 60:
        new = site.pid(program)
        if new and new != victim:
            restarted = time.monotonic() - killed
            break
        time.sleep(0.1)
    site.wait_healthy(120)
    healthy_again = time.monotonic() - killed
    outcomes = [site.wait_done(token, code, sweep_running + 300)]
    in_flight_done = time.monotonic() - killed
    outcomes += [site.wait_done(token, c, sweep_running + 300) for c in during if " " not in c]
    finished = time.monotonic() - killed
    stop.set()
    watcher.join(timeout=10)
    upload_watcher.join(timeout=10)
    unanswered = sum(1 for _, status, _ in samples if status == 0)
    kept = {p: site.pid(p) == pid for p, pid in others.items()}
    with (site.var / "log" / "worker.log").open("rb") as fh:
        fh.seek(log_size)
        log = fh.read().decode(errors="replace")
    recovered_by = [
        what
        for what, marker in (("worker start", "worker start: re-queued"), ("sweep", "sweep: re-queued"))
        if marker in log
    ]
    return {
        "stage_when_killed": f"{before['stage']} {before['progress']}%",
        "restarted_after_s": round(restarted, 1) if restarted is not None else None,
        "in_flight_taken_up_after_s": round(rerun["after_s"], 2) if rerun else None,
        "in_flight_how": rerun.get("how"),
        "in_flight_done_after_s": round(in_flight_done, 1),
        "requeued_by": recovered_by,
        "worker_tracebacks": log.count("Traceback"),
        "couldnt_ack": log.count("Couldn't ack"),
        "healthy_again_s": round(healthy_again, 1),
        "healthz_polls": len(samples),
        "healthz_unanswered": unanswered,
        "others_kept_pid": kept,
        "uploads_during": len(during),
        "all_done": [o["status"] for o in outcomes],
        "all_done_after_s": round(finished, 1),
        # Only the killed program restarts: the web and (for Redis) the worker keep their pid.
        # A killed worker's upload is re-run by its restart, long before the sweep's stale limit.
        "pass": restarted is not None
        and all(kept.values())
        and all(o["status"] == "done" for o in outcomes)
        and (program != "worker" or "sweep" not in recovered_by)
        and (program == "web" or unanswered == 0),
    }


def broker_down(site: Site, token: str) -> dict[str, Any]:
    site.ctl("stop", "redis")
    time.sleep(1)
    key = new_idempotency_key()
    small = ROOT / "tests" / "fixtures" / "frag_oom.pickle.gz"
    first, first_s = post(site, token, small, idempotency_key=key)
    again, _ = post(site, token, small, idempotency_key=key)
    health, _ = site.health()
    site.ctl("start", "redis")
    back = time.monotonic()
    final = site.wait_done(token, first["id"], 300)
    return {
        "answer": {k: first.get(k) for k in ("status", "publish")},
        "answer_s": round(first_s, 2),
        "retry_same_id": again["id"] == first["id"],
        "healthz_during": health,
        "status_after": final["status"],
        "done_after_broker_back_s": round(time.monotonic() - back, 1),
        "pass": first.get("status") == "queued"
        and first.get("publish") == "pending"
        and again["id"] == first["id"]
        and final["status"] == "done",
    }


def slow_clients(site: Site, n: int) -> dict[str, Any]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", site.port))
        # Headers promise a 1 MB body; half the headers and no body ever come.
        s.sendall(b"POST /api/v1/snapshots HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000\r\n")
        socks.append(s)
    times = []
    failures = 0
    for _ in range(20):
        started = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=10)
        try:
            conn.request("GET", "/healthz")
            ok = conn.getresponse().status == 200
        except OSError:
            ok = False
        finally:
            conn.close()
        times.append(time.monotonic() - started)
        failures += 0 if ok else 1
        time.sleep(0.1)
    for s in socks:
        s.close()
    return {
        "slow_clients": n,
        "healthz_failures": failures,
        "healthz_p50_ms": round(percentile(times, 50) * 1000, 1),
        "healthz_max_ms": round(max(times) * 1000, 1),
        "pass": failures == 0 and max(times) < 2.0,
    }


class PrivatePostgres:
    """A throw-away PostgreSQL cluster of our own (the shared server is never restarted)."""

    def __init__(self) -> None:
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
        if not bins or os.geteuid() != 0:
            raise RuntimeError("needs Debian's PostgreSQL binaries and root (to run them as user postgres)")
        self.bin = bins[-1].parent
        self.dir = Path(f"/tmp/oomscope-rel-pg-{os.getpid()}")  # noqa: S108 - owned by postgres, removed after
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/rel"

    def _as_postgres(self, *argv: str) -> None:
        # No pipes: pg_ctl start leaves the server running with our stdout, and a pipe would
        # keep subprocess.run waiting for an EOF that never comes.
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *argv],
            check=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )

    def start(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir()
        shutil.chown(self.dir, "postgres", "postgres")
        data = str(self.dir / "data")
        self._as_postgres(str(self.bin / "initdb"), "-D", data, "-A", "trust", "-U", "postgres")
        self._as_postgres(
            str(self.bin / "pg_ctl"),
            "-D",
            data,
            "-l",
            str(self.dir / "log"),
            "-w",
            "start",
            "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1",
        )
        self._as_postgres(str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "rel")

    def restart(self) -> float:
        started = time.monotonic()
        self._as_postgres(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.dir / "data"),
            "-m",
            "fast",
            "-w",
            "restart",
            "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1",
        )
        return time.monotonic() - started

    def stop(self) -> None:
        try:
            self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def pg_restart(site: Site, token: str, pg: PrivatePostgres, n: int) -> dict[str, Any]:
    """n uploads in flight, PostgreSQL restarted (fast mode) meanwhile: every upload must end done.
    A client whose POST fails retries it with the same Idempotency-Key, as the client library allows."""
    files = [FIXTURES[i % len(FIXTURES)] for i in range(n)]
    retried = 0
    statuses: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            statuses.append(site.get(token, "/api/v1/projects/rel/runs")[0])
            time.sleep(0.1)

    def send(path: Path) -> str:
        nonlocal retried
        key = new_idempotency_key()
        for attempt in range(20):
            try:
                return str(post(site, token, path, idempotency_key=key)[0]["id"])
            except UploadError:
                retried += 1 if attempt == 0 else 0
                time.sleep(1)
        raise RuntimeError("upload never accepted")

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(send, f) for f in files]
        time.sleep(3)  # uploads arriving and analyses running
        restart_s = pg.restart()
        codes = [f.result() for f in futures]
    outcomes = [site.wait_done(token, c, 600) for c in codes]
    stop.set()
    sampler.join(timeout=30)
    from collections import Counter

    done = sum(1 for o in outcomes if o["status"] == "done")
    return {
        "uploads": n,
        "restart_s": round(restart_s, 1),
        "done": done,
        "not_done": [(o.get("error") or {}).get("code") or o["status"] for o in outcomes if o["status"] != "done"],
        "uploads_retried_by_client": retried,
        "distinct_uploads": len(set(codes)),
        "api_statuses_during": dict(Counter(statuses)),
        "pass": done == n and len(set(codes)) == n,
    }


# --- issue 22: one user must not be able to stall, starve or fill the service ----------------------

OOM_PREFIX = (
    "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 7.00 GiB of which 1.00 GiB is free. "
)


def oom_message_stall(site: Site, token: str) -> dict[str, Any]:
    """Two uploads whose OOM message is a valid prefix and then digits up to the 64 K cap (the
    quadratic "... allowed;" pattern: 68 s of web CPU each before), while /healthz is polled."""
    message = (OOM_PREFIX + "1" * 65536)[:65536]
    samples: list[tuple[float, int]] = []  # (seconds the call took, status)
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            started = time.monotonic()
            status, _body = site.health(timeout=10)
            samples.append((time.monotonic() - started, status))
            time.sleep(0.1)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    time.sleep(0.5)
    small = FIXTURES_BY_NAME["frag_oom.pickle.gz"]
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _i: post(site, token, small, oom_message=message), range(2)))
    time.sleep(1)
    stop.set()
    watcher.join()
    health = [dt for dt, status in samples if status == 200]
    answer_s = [round(dt, 2) for _body, dt in answers]
    return {
        "upload_answer_s": answer_s,
        "healthz_polls": len(samples),
        "healthz_failed": sum(1 for _dt, status in samples if status != 200),
        "healthz_max_s": round(max(health), 3) if health else None,
        "pass": max(answer_s) < 10 and bool(health) and max(health) < 2.0,
    }


def fair_queue(site: Site, token: str, other_token: str, heavy: int) -> dict[str, Any]:
    """One team queues ``heavy`` big uploads, then another team one small upload: how long the
    small one waits. First come, first served made it wait for the heavy ones (issue: 152 s)."""
    big = FIXTURES_BY_NAME["big_all_stacks.pickle.gz"]
    small = FIXTURES_BY_NAME["frag_oom.pickle.gz"]
    alone_body, _ = post(site, other_token, small, project="rel2")
    started = time.monotonic()
    site.wait_done(other_token, alone_body["id"], 300)
    alone_s = time.monotonic() - started
    heavy_codes = [post(site, token, big)[0]["id"] for _ in range(heavy)]
    time.sleep(1)  # the heavy team holds the slots
    started = time.monotonic()
    body, _ = post(site, other_token, small, project="rel2")
    done = site.wait_done(other_token, body["id"], 600)
    waited = time.monotonic() - started
    heavy_done = [site.wait_done(token, code, 900)["status"] for code in heavy_codes]
    all_done = time.monotonic() - started
    return {
        "other_team_alone_s": round(alone_s, 1),
        "other_team_behind_heavy_s": round(waited, 1),
        "heavy_uploads": heavy,
        "heavy_all_done_s": round(all_done, 1),
        "statuses": [done["status"], *heavy_done],
        "pass": done["status"] == "done" and waited < all_done / 2,
    }


def share_link_junk(site: Site, token: str) -> dict[str, Any]:
    """A done report without an explore store (no devices, 270 MB of strings, 4.4 MB gzipped),
    its share link's timeline.json asked 4 times at once: gunicorn's memory before and after."""
    import gzip
    import pickle
    import tempfile

    import psutil

    junk = {"segments": [], "device_traces": [], "junk": [f"{i:09d}" * 100 for i in range(300_000)]}
    path = Path(tempfile.mkdtemp()) / "junk.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(junk, protocol=4), 1))
    del junk
    body, _ = post(site, token, path)
    done = site.wait_done(token, body["id"], 300)
    request = urllib.request.Request(  # noqa: S310
        f"{site.url}/api/v1/snapshots/{body['id']}/share", method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:  # noqa: S310
        share = json.loads(r.read())["share_url"]

    def web_rss() -> int:
        main = psutil.Process(site.pid("web"))
        return sum(p.memory_info().rss for p in [main, *main.children(recursive=True)])

    def zoom(_i: int) -> tuple[int, str, float]:
        started = time.monotonic()
        url = share.rstrip("/") + "/timeline.json?t0=0&t1=100&px=100"
        try:
            with urllib.request.urlopen(url, timeout=120) as r:  # noqa: S310
                return r.status, "", time.monotonic() - started
        except urllib.error.HTTPError as e:
            code = json.loads(e.read() or b"{}").get("error", {}).get("code", "")
            return e.code, code, time.monotonic() - started

    before = web_rss()
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(zoom, range(4)))
    after = web_rss()
    return {
        "upload_bytes": path.stat().st_size,
        "status": done["status"],
        "answers": [f"{status} {code} {dt:.2f}s" for status, code, dt in answers],
        "web_rss_before_mb": before >> 20,
        "web_rss_after_mb": after >> 20,
        "pass": all(status == 404 and code == "explore:no-store" for status, code, _ in answers)
        and after - before < 100 << 20,
    }


def slow_clients_each(site: Site, counts: list[int]) -> dict[str, Any]:
    runs = {f"with_{n}": slow_clients(site, n) for n in counts}
    return {**runs, "pass": all(r["pass"] for r in runs.values())}


# --- what every scenario reports: time, memory, disk, the other team's latency --------------------


def _du(path: Path) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


class Watch:
    """While a scenario runs: another team's API latency, the site's memory and disk."""

    def __init__(self, site: Site, other_token: str) -> None:
        self.site, self.other_token = site, other_token
        self.latencies: list[float] = []
        self.failed = 0
        self.health_latencies: list[float] = []
        self.health_failed = 0
        self.rss_start = self.rss_peak = 0
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def tree_rss(self) -> int:
        import psutil

        if self.site.proc is None:
            return 0
        try:
            root = psutil.Process(self.site.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def _other_team(self) -> None:
        while not self.stop.is_set():
            try:
                status, _, took = self.site.get(self.other_token, "/api/v1/projects/rel2/runs")
            except (OSError, ValueError):
                status, took = 0, 0.0
            if status == 200:
                self.latencies.append(took)
            else:
                self.failed += 1
            self.stop.wait(0.2)

    def _memory(self) -> None:
        while not self.stop.is_set():
            self.rss_peak = max(self.rss_peak, self.tree_rss())
            self.stop.wait(0.25)

    def _healthz(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            status, _ = self.site.health(timeout=10)
            if status in (200, 503):  # answered (503: the site says what is down)
                self.health_latencies.append(time.monotonic() - started)
            else:
                self.health_failed += 1
            self.stop.wait(0.2)

    def __enter__(self) -> Watch:
        self.started = time.monotonic()
        self.disk_before = _du(self.site.var)
        self.rss_start = self.rss_peak = self.tree_rss()
        pollers = (self._other_team, self._memory, self._healthz)
        self.threads = [threading.Thread(target=f, daemon=True) for f in pollers]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        self.seconds = time.monotonic() - self.started

    def figures(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 1),
            "other_team_calls": len(self.latencies) + self.failed,
            "other_team_failed": self.failed,
            "other_team_p50_ms": round(percentile(self.latencies, 50) * 1000) if self.latencies else None,
            "other_team_p99_ms": round(percentile(self.latencies, 99) * 1000) if self.latencies else None,
            "other_team_max_ms": round(max(self.latencies) * 1000) if self.latencies else None,
            "healthz_calls": len(self.health_latencies) + self.health_failed,
            "healthz_failed": self.health_failed,
            "healthz_p99_ms": round(percentile(self.health_latencies, 99) * 1000) if self.health_latencies else None,
            "site_rss_start_mb": self.rss_start >> 20,
            "site_rss_peak_mb": self.rss_peak >> 20,
            "disk_added_mb": round((_du(self.site.var) - self.disk_before) / 2**20, 1),
        }


# --- issue 22: the attacks that need more than one request -------------------------------------------


def _file(name: str, data: bytes) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="oomscope-attack-")) / name
    path.write_bytes(data)
    return path


def _fresh_copy(fixture: str) -> Path:
    """A fixture re-gzipped (other bytes, other sha256): its stores are its own, not shared."""
    import gzip

    raw = gzip.decompress(FIXTURES_BY_NAME[fixture].read_bytes())
    return _file(f"fresh-{time.monotonic_ns()}-{fixture}", gzip.compress(raw, 1, mtime=time.time_ns() % 2**31))


def _post_outcome(site: Site, token: str, path: Path, timeout: float = 300) -> dict[str, Any]:
    """Refused at intake (the HTTP status and code) or the analysis' end (status and code)."""
    started = time.monotonic()
    try:
        body, _ = post(site, token, path)
    except UploadError as exc:
        return {"at": "intake", "status": exc.status, "code": exc.code, "s": round(time.monotonic() - started, 2)}
    done = site.wait_done(token, body["id"], timeout)
    return {
        "at": "analysis",
        "id": body["id"],
        "status": done["status"],
        "code": (done.get("error") or {}).get("code"),
        "s": round(time.monotonic() - started, 2),
    }


def upload_rows(site: Site, codes: list[str]) -> dict[str, dict[str, Any]]:
    """What the API does not show: attempts, estimated cost and bytes stored, from the database."""
    script = (
        "import json; from webapp.snapshots.models import Upload; "
        f"print(json.dumps({{u.code: dict(attempts=u.attempts, bytes=u.bytes, stored_bytes=u.stored_bytes, "
        "estimated_cost=u.estimated_cost, run=u.run, note=u.note) "
        f"for u in Upload.objects.filter(code__in={codes!r})}}))"
    )
    return dict(json.loads(site.manage("shell", "-c", script).splitlines()[-1]))


def idempotency_replay(site: Site, token: str, replays: int = 40) -> dict[str, Any]:
    """The same POST (a 64 K hostile OOM message) again and again under one Idempotency-Key: the
    replays are answered without parsing, and counted by their own rate (30/m)."""
    message = (OOM_PREFIX + "1" * 65536)[:65536]
    key = new_idempotency_key()
    small = FIXTURES_BY_NAME["frag_oom.pickle.gz"]
    statuses: list[str] = []
    took: list[float] = []
    for _ in range(replays + 1):
        started = time.monotonic()
        try:
            body, _ = post(site, token, small, oom_message=message, idempotency_key=key)
            statuses.append(body.get("status", "?"))
        except UploadError as exc:
            statuses.append(f"{exc.status} {exc.code}")
        took.append(time.monotonic() - started)
    from collections import Counter

    counts = dict(Counter(statuses))
    return {
        "posts": replays + 1,
        "answers": counts,
        "answer_p50_ms": round(percentile(took, 50) * 1000),
        "answer_max_ms": round(max(took) * 1000),
        "pass": counts.get("429 upload:rate-limited:replay", 0) >= 1 and max(took) < 5,
    }


def shape_attack(site: Site, token: str, name: str, want: str) -> dict[str, Any]:
    """One of the issue's pathological shapes (tests/analysis/hostile_schema.py), uploaded."""
    from tests.analysis import hostile_schema

    data = hostile_schema.build()[name][0]
    outcome = _post_outcome(site, token, _file(f"{name}.pickle" + (".gz" if data[:2] == b"\x1f\x8b" else ""), data))
    return {"bytes": len(data), **outcome, "pass": outcome["code"] == want}


def hostile_values(site: Site, token: str) -> dict[str, Any]:
    """Every hostile value of tests/analysis/hostile_schema.py uploaded at once; each must end with
    its snapshot:* code (before: segfaults, RecursionError, IndexError as worker:internal)."""
    from tests.analysis import hostile_schema

    cases = {k: v for k, v in hostile_schema.build().items() if k not in ("many_devices", "many_gzip_members")}
    codes = {name: post(site, token, _file(f"{name}.pickle", data))[0]["id"] for name, (data, _want) in cases.items()}
    ends = {name: site.wait_done(token, code, 300) for name, code in codes.items()}
    got = {name: (end.get("error") or {}).get("code") or end["status"] for name, end in ends.items()}
    got = {name: "accepted" if code == "done" else code for name, code in got.items()}
    wrong = {name: got[name] for name, (_data, want) in cases.items() if got[name] != want}
    return {"cases": len(cases), "codes": dict(sorted(got.items())), "not_as_expected": wrong, "pass": not wrong}


def disk_stores(site: Site, token: str) -> dict[str, Any]:
    """What an upload puts on disk besides its file (report, charts, explore stores) is counted."""
    files = {
        name: _fresh_copy(name)
        for name in ("frag_oom.pickle.gz", "gpt_varlen_oom.pickle.gz", "big_all_stacks.pickle.gz")
    }
    codes = {name: post(site, token, path)[0]["id"] for name, path in files.items()}
    ends = {name: site.wait_done(token, code, 300)["status"] for name, code in codes.items()}
    rows = upload_rows(site, list(codes.values()))
    per_file = {
        name: {
            "status": ends[name],
            "file_kb": rows[code]["bytes"] >> 10,
            "stored_kb": rows[code]["stored_bytes"] >> 10,
            "x": round(rows[code]["stored_bytes"] / max(rows[code]["bytes"], 1), 1),
        }
        for name, code in codes.items()
    }
    return {
        "uploads": per_file,
        "pass": all(v["status"] == "done" and v["stored_kb"] > v["file_kb"] for v in per_file.values()),
    }


def _media(site: Site) -> Path:
    return site.var / "media"


def delete_mid_analysis(site: Site, token: str) -> dict[str, Any]:
    """DELETE of an upload while its analysis writes its stores: nothing of it stays on disk."""
    import hashlib

    path = _fresh_copy("big_all_stacks.pickle.gz")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    body, _ = post(site, token, path)
    deadline = time.monotonic() + 120
    stage = ""
    while time.monotonic() < deadline:
        now = site.get(token, f"/api/v1/snapshots/{body['id']}")[1]
        stage = f"{now['stage']} {now['progress']}%"
        if now["status"] == "running" and now["stage"] not in ("", "reading"):
            break
        time.sleep(0.05)
    request = urllib.request.Request(  # noqa: S310
        f"{site.url}/api/v1/snapshots/{body['id']}", method="DELETE", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:  # noqa: S310
        deleted = r.status
    deleted_at = time.monotonic()
    while site.analysis_children() and time.monotonic() - deleted_at < 120:
        time.sleep(0.2)
    time.sleep(2)  # the finishing task's clean-up
    left = [str(p.relative_to(_media(site))) for p in _media(site).rglob("*") if p.is_file() and sha in str(p)]
    return {
        "stage_when_deleted": stage,
        "delete_status": deleted,
        "analysis_ended_after_delete_s": round(time.monotonic() - deleted_at - 2, 1),
        "files_left": left,
        "pass": deleted in (200, 204) and not left,
    }


def child_killed(site: Site, token: str) -> dict[str, Any]:
    """SIGKILL of the analysis child from outside (what the kernel's OOM killer does): the task runs
    it once more (before: reported as a CPU-time limit, never retried)."""
    log_size = (site.var / "log" / "worker.log").stat().st_size
    body, _ = post(site, token, _fresh_copy("big_all_stacks.pickle.gz"))
    deadline = time.monotonic() + 60
    children: list[Any] = []
    while not children and time.monotonic() < deadline:
        children = site.analysis_children()
        time.sleep(0.05)
    time.sleep(0.5)
    killed = time.monotonic()
    if children:
        children[0].kill()
    done = site.wait_done(token, body["id"], 300)
    with (site.var / "log" / "worker.log").open("rb") as fh:
        fh.seek(log_size)
        log = fh.read().decode(errors="replace")
    return {
        "killed": bool(children),
        "status": done["status"],
        "code": (done.get("error") or {}).get("code"),
        "run_once_more": "running it once more" in log,
        "done_after_kill_s": round(time.monotonic() - killed, 1),
        "pass": bool(children) and done["status"] == "done" and "running it once more" in log,
    }


class Browser:
    """A cookie jar and Django's CSRF token: what a form post from a browser sends."""

    def __init__(self, site: Site) -> None:
        import http.cookiejar

        self.site = site
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def csrf(self, path: str) -> str:
        with self.opener.open(self.site.url + path, timeout=30) as r:
            r.read()
        return next(c.value for c in self.jar if c.name == "csrftoken")

    def post(self, path: str, fields: dict[str, str]) -> tuple[int, str]:
        from urllib.parse import urlencode

        data = urlencode({**fields, "csrfmiddlewaretoken": self.csrf(path)}).encode()
        request = urllib.request.Request(self.site.url + path, data=data, headers={"Referer": self.site.url + path})  # noqa: S310
        try:
            with self.opener.open(request, timeout=30) as r:
                r.read()
                return r.status, r.geturl()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("X-Error-Code", "")

    def signed_in(self) -> bool:
        return any(c.name == "sessionid" for c in self.jar)


def admin_login(site: Site) -> dict[str, Any]:
    """30 wrong passwords for the superuser on /admin/login/, then the right one (before: signed in)."""
    env = {**site.env, "DJANGO_SUPERUSER_PASSWORD": "rel-root-pw-1"}
    subprocess.run(
        [PY, "manage.py", "createsuperuser", "--noinput", "--username", "relroot", "--email", "r@example.com"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        check=False,
    )
    browser = Browser(site)
    from collections import Counter

    wrong = Counter(
        browser.post("/admin/login/", {"username": "relroot", "password": "nope", "next": "/admin/"})[0]
        for _ in range(30)
    )
    right = browser.post("/admin/login/", {"username": "relroot", "password": "rel-root-pw-1", "next": "/admin/"})
    return {
        "wrong_answers": dict(wrong),
        "right_password_after": list(right),
        "signed_in": browser.signed_in(),
        "pass": right[0] == 429 and not browser.signed_in(),
    }


def sign_ups(site: Site, n: int = 7) -> dict[str, Any]:
    """Sign-ups from one address (each a user with a team and its own quota): SIGNUP_RATE_PER_IP 5/h."""
    answers = []
    for i in range(n):
        pw = "Xy7-long-pass!"
        status, where = Browser(site).post(
            "/accounts/signup/", {"username": f"spam-{os.getpid()}-{i}", "password1": pw, "password2": pw}
        )
        answers.append(f"{status} {where.removeprefix(site.url)}")
    return {"answers": answers, "pass": sum(1 for a in answers if a.startswith("429")) >= n - 5}


def bad_params(site: Site, token: str) -> dict[str, Any]:
    """?t0=inf / nan on a share link's zoom endpoints, and unknown /api/v1/ paths: JSON 4xx."""
    body, _ = post(site, token, FIXTURES_BY_NAME["frag_oom.pickle.gz"])
    site.wait_done(token, body["id"], 300)
    request = urllib.request.Request(  # noqa: S310
        f"{site.url}/api/v1/snapshots/{body['id']}/share", method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:  # noqa: S310
        share = json.loads(r.read())["share_url"].rstrip("/")
    answers = {}
    for url, auth in [
        (share + "/timeline.json?t0=inf&t1=100&px=100", False),
        (share + "/timeline.json?t0=nan&t1=100&px=100", False),
        (share + "/active.json?t0=0&t1=inf&px=100", False),
        (f"{site.url}/api/v1/nope", True),
        (f"{site.url}/api/v1/snapshots/{body['id']}/nope", True),
    ]:
        headers = {"Authorization": f"Bearer {token}"} if auth else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:  # noqa: S310
                answers[url.removeprefix(site.url)] = f"{r.status} {r.headers.get_content_type()}"
        except urllib.error.HTTPError as e:
            code = (
                json.loads(e.read() or b"{}").get("error", {}).get("code", "")
                if "json" in e.headers.get_content_type()
                else "HTML"
            )
            answers[url.removeprefix(site.url)] = f"{e.code} {code}"
    return {
        "answers": answers,
        "pass": all(a.split()[0] in ("400", "404") and a.split()[1] != "HTML" for a in answers.values()),
    }


def bidi_names(site: Site, token: str) -> dict[str, Any]:
    """A run name with U+202E and a note with CR LF and U+202E: stored without the overrides."""
    body, _ = post(site, token, FIXTURES_BY_NAME["frag_oom.pickle.gz"], run="exe\u202egnp.run", note="a\r\nb\u202ec")
    stored = upload_rows(site, [body["id"]])[body["id"]]
    return {
        "run": stored["run"],
        "note": stored["note"],
        "pass": "\u202e" not in stored["run"] + stored["note"] and "\r" not in stored["note"],
    }


def supervisord_kill9(_site: Site) -> dict[str, Any]:
    """kill -9 of supervisord on a `make run` of its own (tests/test_run_supervisor.py's cycle)."""
    from tests.test_run_supervisor import supervisord_kill9_cycle

    figures = supervisord_kill9_cycle(ROOT / "var" / "reliability" / "kill9")
    figures["pass"] = (
        not figures["left_after_kill"]
        and not figures["sigkilled_outside_the_tree"]
        and figures["second_programs_running"]
        and figures["third_exit"] == 1
        and figures["refusal_names_every_orphan"]
        and figures["orphans_gone_after_kill_command_s"] is not None
    )
    return figures


# The attacks a live site cannot stage without changing its settings or breaking its disk: their tests.
ATTACK_TESTS = [
    "tests/webapp/test_hardening2.py::test_the_disk_guard_refuses_uploads_with_json_507_and_healthz_says_so",
    "tests/webapp/test_hardening2.py::test_a_write_that_finds_no_space_is_json_507",
    "tests/webapp/test_hardening2.py::test_a_run_whose_final_write_failed_is_requeued_by_the_next_sweep",
    "tests/webapp/test_hardening2.py::test_explore_stores_past_the_quota_are_not_kept",
    "tests/webapp/test_hardening2.py::test_wrong_guesses_from_elsewhere_do_not_lock_out_a_browser_that_signed_in_before",
    "tests/webapp/test_hardening2.py::test_the_client_address_behind_a_trusted_proxy_is_its_own_bucket",
    "tests/webapp/test_hardening2.py::test_a_user_owns_a_bounded_number_of_teams",
    "tests/webapp/test_hardening2.py::test_temp_files_left_by_killed_processes_are_purged",
    "tests/webapp/test_ux_teams.py::test_an_invitee_is_no_member_until_they_accept",
    "tests/webapp/test_ux_teams.py::test_a_look_alike_team_shows_its_address_and_inviter",
]


def attack_tests() -> dict[str, Any]:
    import xml.etree.ElementTree as ET

    report = ROOT / "var" / "reliability" / "attack-tests.xml"
    done = subprocess.run(
        [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", *ATTACK_TESTS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    cases = {}
    for case in ET.parse(report).iter("testcase"):  # noqa: S314
        outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else "passed"
        outcome = "skipped" if case.find("skipped") is not None else outcome
        cases[case.get("name", "")] = f"{outcome} {float(case.get('time', 0)):.2f}s"
    return {
        "tests": cases,
        "pass": done.returncode == 0 and len(cases) == len(ATTACK_TESTS),
        **({} if done.returncode == 0 else {"tail": done.stdout[-1500:]}),
    }


def attack_figures(before: str) -> dict[str, Any]:
    """scripts/attack_figures.py on the code as it is and on ``before``: its JSON lines."""
    runs: dict[str, Any] = {}
    for label, argv in (("after", []), (f"before {before}", ["--before", before, "--devices", "100"])):
        done = subprocess.run(
            [PY, str(ROOT / "scripts" / "attack_figures.py"), *argv],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        runs[label] = lines if done.returncode == 0 else [*lines, {"error": done.stderr[-800:]}]
    after = runs["after"]
    # In process, the nested-tuple dict key still crashes CPython's C unpickler (it hashes the key
    # recursively); in the site the runner turns that crash into snapshot:limit:too-deep from the
    # child's faulthandler stack (hostile-values). Any other crash or worker:internal fails.
    bad = [
        c
        for c in after
        if "error" in c
        or str(c.get("outcome", "")).startswith("worker:internal")
        or (str(c.get("outcome", "")).startswith("crash") and c.get("name") != "dict_key_nested_tuple")
    ]
    return {**runs, "pass": bool(after) and not bad}


# --- issue 36: the four HIGH findings, on a site of their own (make run's rates and reserve) ---------

PAGE = 2 << 20
TINY_SNAPSHOT_DICT = {"segments": [], "device_traces": [[]]}


def _multipart(token: str, name: str, data: bytes, fields: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    boundary = f"oomscope{time.monotonic_ns()}"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()
    ]
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
    parts.append(head.encode() + b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": f"multipart/form-data; boundary={boundary}"}
    return body, headers


def post_raw(site: Site, token: str, name: str, data: bytes, **fields: str) -> tuple[int, dict[str, Any], float]:
    """One POST of a file as the API takes it (an archive's answer is a run, not an upload)."""
    body, headers = _multipart(token, name, data, fields)
    request = urllib.request.Request(site.url + "/api/v1/snapshots", data=body, headers=headers, method="POST")  # noqa: S310
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=300) as r:  # noqa: S310
            return r.status, json.loads(r.read()), time.monotonic() - started
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), time.monotonic() - started


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _share_url(site: Site, token: str, code: str) -> str:
    request = urllib.request.Request(  # noqa: S310
        f"{site.url}/api/v1/snapshots/{code}/share", method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:  # noqa: S310
        return str(json.loads(r.read())["share_url"]).rstrip("/")


def quiet(_site: Site, seconds: float = 15) -> dict[str, Any]:
    """The baseline: nothing but the other team's polling and /healthz."""
    time.sleep(seconds)
    return {"pass": True}


def segments_dos(site: Site, token: str, requests: int = 70, parallel: int = 8) -> dict[str, Any]:
    """Issue 36 item 1: a small upload of 20k segment_map and 100k segment_unmap events, its share
    link's segments.json asked ``requests`` times, ``parallel`` at once, anonymously."""
    import gzip
    import pickle

    maps, pieces = 20_000, 5
    events = [
        {
            "action": "segment_map",
            "addr": (1 << 40) + k * pieces * PAGE,
            "size": pieces * PAGE,
            "stream": 0,
            "time_us": k,
            "frames": [],
        }
        for k in range(maps)
    ] + [
        {
            "action": "segment_unmap",
            "addr": (1 << 40) + j * PAGE,
            "size": PAGE,
            "stream": 0,
            "time_us": maps + j,
            "frames": [],
        }
        for j in range(maps * pieces)
    ]
    path = _file("map_unmap.pickle.gz", gzip.compress(pickle.dumps({"segments": [], "device_traces": [events]}), 9))
    body, _ = post(site, token, path)
    done = site.wait_done(token, body["id"], 300)
    share = _share_url(site, token, body["id"])

    def zoom(_i: int) -> tuple[int, float]:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(f"{share}/segments.json?t0=0&t1=120000&px=1200", timeout=60) as r:  # noqa: S310
                r.read()
                return r.status, time.monotonic() - started
        except (OSError, urllib.error.HTTPError) as e:
            return getattr(e, "code", 0), time.monotonic() - started

    with ThreadPoolExecutor(parallel) as pool:
        answers = list(pool.map(zoom, range(requests)))
    took = [dt for _, dt in answers]
    return {
        "upload_bytes": path.stat().st_size,
        "status": done["status"],
        "requests": requests,
        "answered_200": sum(status == 200 for status, _ in answers),
        "answer_p50_s": round(percentile(took, 50), 3),
        "answer_max_s": round(max(took), 3),
        "pass": done["status"] == "done" and all(status == 200 for status, _ in answers) and max(took) < 10,
    }


def webhook_slow(site: Site, other_token: str, deliveries: int = 4) -> dict[str, Any]:
    """Issue 36 item 2: ``deliveries`` webhooks to a receiver that accepts and never answers, then
    another team's small upload: how long it takes, alone and meanwhile."""
    small = FIXTURES_BY_NAME["frag_oom.pickle.gz"]
    started = time.monotonic()
    body, _ = post(site, other_token, small, project="rel2")
    site.wait_done(other_token, body["id"], 300)
    alone = time.monotonic() - started
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
    script = (
        "from webapp.snapshots.models import Project, Run, WebhookDelivery; from webapp.snapshots.runs import runs; "
        "from webapp.snapshots.worker.runtasks import deliver_webhook; import time; "
        f"p = Project.objects.get(slug='rel'); runs.policy_update(p, webhook_url={url!r}); "
        "r = Run.objects.create(code=f'hook{time.time_ns()}', project=p, name='hooked'); "
        f"ids = [WebhookDelivery.objects.create(run=r, url={url!r}).pk for _ in range({deliveries})]; "
        "[deliver_webhook.delay(i) for i in ids]; print(ids)"
    )
    # Published on the site's own Redis (run.sh's socket), not whatever REDIS_URL defaults to.
    broker = {**site.env, "REDIS_URL": f"redis+socket://{site.var}/run/redis.sock"}
    out = subprocess.run(
        [PY, "manage.py", "shell", "-c", script], cwd=ROOT, env=broker, capture_output=True, text=True, check=True
    )
    ids = json.loads(out.stdout.strip().splitlines()[-1])
    time.sleep(2)  # the deliveries hold their slots
    started = time.monotonic()
    body, _ = post(site, other_token, small, project="rel2")
    done = site.wait_done(other_token, body["id"], 600)
    meanwhile = time.monotonic() - started
    rows = site.manage(
        "shell", "-c",
        "from webapp.snapshots.models import WebhookDelivery as W; import json; "
        f"print(json.dumps([[w.attempts, w.error] for w in W.objects.filter(pk__in={ids!r})]))",
    )  # fmt: skip
    silent.close()
    return {
        "deliveries": deliveries,
        "other_team_upload_alone_s": round(alone, 1),
        "other_team_upload_meanwhile_s": round(meanwhile, 1),
        "delivery_attempts_errors": json.loads(rows.splitlines()[-1]),
        "pass": done["status"] == "done"
        and meanwhile < 2 * alone + 10
        and any(a >= 1 for a, _ in json.loads(rows.splitlines()[-1])),
    }


def archive_ranks(site: Site, token: str, other_token: str, ranks: int = 50) -> dict[str, Any]:
    """Issue 36 item 3: one archive of ``ranks`` tiny ranks (within the rates), then another team's
    small upload: how long it waits; then 1,000 ranks in a small tar.xz, refused by the rates."""
    import lzma
    import pickle

    tiny = pickle.dumps(TINY_SNAPSHOT_DICT, protocol=4)
    small = FIXTURES_BY_NAME["frag_oom.pickle.gz"]
    started = time.monotonic()
    body, _ = post(site, other_token, small, project="rel2")
    site.wait_done(other_token, body["id"], 300)
    alone = time.monotonic() - started
    status, answer, _ = post_raw(
        site, token, "job.tar", _tar([(f"rank{r}.pickle", tiny) for r in range(ranks)]), run="many"
    )
    time.sleep(1)
    started = time.monotonic()
    body, _ = post(site, other_token, small, project="rel2")
    done = site.wait_done(other_token, body["id"], 900)
    waited = time.monotonic() - started
    codes = [u["id"] for u in answer.get("run", {}).get("uploads", [])]
    last = [site.wait_done(token, code, 900)["status"] for code in codes]
    heavy_done = time.monotonic() - started
    bomb = lzma.compress(_tar([(f"rank{r}.pickle", tiny) for r in range(1000)]))
    refused, refusal, took = post_raw(site, token, "ranks.tar.xz", bomb, run="thousand")
    return {
        "archive_status": status,
        "ranks": len(codes),
        "other_team_alone_s": round(alone, 1),
        "other_team_behind_archive_s": round(waited, 1),
        "archive_all_done_s": round(heavy_done, 1),
        "archive_statuses": {s: last.count(s) for s in set(last)},
        "thousand_ranks_bytes": len(bomb),
        "thousand_ranks_answer": f"{refused} {refusal.get('error', {}).get('code', '')} in {took:.2f} s",
        "pass": status == 202 and done["status"] == "done" and waited < heavy_done / 2 and refused == 429,
    }


def archive_bomb(site: Site, token: str, declared_mb: int = 300) -> dict[str, Any]:
    """Issue 36 item 4: a tar.bz2 of a few hundred bytes declaring ``declared_mb`` MB, on a disk with
    less room above the reserve than its unpacking needs: refused before a byte is unpacked."""
    import bz2
    import pickle

    tiny = pickle.dumps(TINY_SNAPSHOT_DICT, protocol=4)
    data = bz2.compress(_tar([("rank0.pickle", tiny + bytes(declared_mb * 1_000_000 - len(tiny)))]), 9)
    media = site.var / "media" / "sha256"
    before = _du(media) if media.exists() else 0
    status, answer, took = post_raw(site, token, "bomb.tar.bz2", data, run="bomb")
    after = _du(media) if media.exists() else 0
    return {
        "archive_bytes": len(data),
        "declared_mb": declared_mb,
        "answer": f"{status} {answer.get('error', {}).get('code', '')} in {took:.2f} s",
        "blobs_added_mb": round((after - before) / 2**20, 1),
        "pass": status == 507 and after == before,
    }


ISSUE36 = ["quiet", "segments-dos", "webhook-slow", "archive-ranks", "archive-bomb"]


def run_scenarios(
    site: Any, other_token: str, plan: dict[str, Callable[[], dict[str, Any]]], chosen: list[str], *, database: str
) -> dict[str, dict[str, Any]]:
    """Each chosen scenario in turn, watched by another team's requests and /healthz; one JSON line each."""
    results: dict[str, dict[str, Any]] = {}
    for scenario in chosen:
        started = time.monotonic()
        try:
            with Watch(site, other_token) as watch:
                result = plan[scenario]()
            result.update(watch.figures())
        except Exception as exc:  # a scenario that crashes is a failed scenario, reported
            result = {"pass": False, "error": f"{type(exc).__name__}: {exc}"}
        result["scenario_s"] = round(time.monotonic() - started, 1)
        results[scenario] = result
        print(json.dumps({"database": database, "scenario": scenario, **result}), flush=True)
    return results


def run_site_36(args: argparse.Namespace) -> dict[str, Any]:
    """Issue 36's attacks on a site with make run's upload rates and a disk reserve that leaves 400 MB
    of room above it (so the archive bomb meets the guard), each with another team's p99 and /healthz."""
    site = Site("sqlite36", None, 20)
    for key in ("UPLOAD_RATE_PER_TOKEN", "UPLOAD_RATE_PER_USER"):
        site.env.pop(key)
    free = shutil.disk_usage(site.var).free
    site.env.update({"DISK_MIN_FREE_BYTES": str(free - (400 << 20)), "WEBHOOK_ALLOW_PRIVATE_HOSTS": "1"})
    results: dict[str, Any] = {}
    try:
        site.start()
        tokens = [
            site.manage("create_api_token", t, "--create-user", "--team", t, "--project", t)
            for t in ("rel", "rel2", "rel3")
        ]
        token, other_token, third = tokens
        plan: dict[str, Callable[[], dict[str, Any]]] = {
            "quiet": lambda: quiet(site),
            "segments-dos": lambda: segments_dos(site, token),
            "webhook-slow": lambda: webhook_slow(site, other_token),
            "archive-ranks": lambda: archive_ranks(site, token, other_token),
            "archive-bomb": lambda: archive_bomb(site, third),
        }
        chosen = [s for s in ISSUE36 if not args.only or s in args.only]
        results.update(run_scenarios(site, other_token, plan, chosen, database="sqlite36"))
    finally:
        site.stop()
    return results


ATTACKS = [
    "oom-message",
    "idempotency-replay",
    "share-link-junk",
    "gzip-members",
    "many-devices",
    "hostile-values",
    "fair-queue",
    "disk-stores",
    "delete-mid-analysis",
    "child-killed",
    "admin-login",
    "sign-ups",
    "bad-params",
    "bidi-names",
    "half-open",
    "supervisord-kill9",
]
SCENARIOS = ["concurrent", "kill-pool", "kill-main", "kill-redis", "broker-down", "slow-clients", *ATTACKS]
OFF_SITE = ["attack-tests", "attack-figures"]  # not against the site: no latency, memory or disk figures


def run_site(name: str, database_url: str | None, args: argparse.Namespace) -> dict[str, Any]:
    sweep_running = 20
    site = Site(name, database_url, sweep_running)
    results: dict[str, Any] = {}
    try:
        site.start()
        token = site.manage("create_api_token", "rel", "--create-user", "--team", "rel", "--project", "rel")
        other_token = site.manage("create_api_token", "rel2", "--create-user", "--team", "rel2", "--project", "rel2")
        plan: dict[str, Callable[[], dict[str, Any]]] = {
            "concurrent": lambda: concurrent(site, token, args.uploads),
            "kill-pool": lambda: kill_pool(site, token),
            "kill-main": lambda: kill_program(site, token, "worker", sweep_running),
            "kill-redis": lambda: kill_program(site, token, "redis", sweep_running),
            "broker-down": lambda: broker_down(site, token),
            "slow-clients": lambda: slow_clients_each(site, args.slow_clients),
            "oom-message": lambda: oom_message_stall(site, token),
            "fair-queue": lambda: fair_queue(site, token, other_token, args.heavy_uploads),
            "share-link-junk": lambda: share_link_junk(site, token),
            "idempotency-replay": lambda: idempotency_replay(site, token),
            "gzip-members": lambda: shape_attack(site, token, "many_gzip_members", "snapshot:limit:gzip-members"),
            "many-devices": lambda: shape_attack(site, token, "many_devices", "snapshot:limit:devices"),
            "hostile-values": lambda: hostile_values(site, token),
            "disk-stores": lambda: disk_stores(site, token),
            "delete-mid-analysis": lambda: delete_mid_analysis(site, token),
            "child-killed": lambda: child_killed(site, token),
            "admin-login": lambda: admin_login(site),
            "sign-ups": lambda: sign_ups(site),
            "bad-params": lambda: bad_params(site, token),
            "bidi-names": lambda: bidi_names(site, token),
            "half-open": lambda: slow_clients(site, 24),
            "supervisord-kill9": lambda: supervisord_kill9(site),
        }
        chosen = [s for s in (args.only or (SCENARIOS if name == "sqlite" else ["concurrent"])) if s in plan]
        results.update(run_scenarios(site, other_token, plan, chosen, database=name))
    finally:
        site.stop()
    return results


def run_pg_restart(args: argparse.Namespace) -> dict[str, Any]:
    try:
        pg = PrivatePostgres()
    except RuntimeError as exc:
        print(json.dumps({"database": "postgres-private", "scenario": "pg-restart", "skipped": str(exc)}))
        return {}
    pg.start()
    site = Site("postgres-private", pg.url, 20)
    try:
        site.start()
        token = site.manage("create_api_token", "rel", "--create-user", "--team", "rel", "--project", "rel")
        started = time.monotonic()
        try:
            result = pg_restart(site, token, pg, args.pg_restart_uploads)
        except Exception as exc:
            result = {"pass": False, "error": f"{type(exc).__name__}: {exc}"}
        result["scenario_s"] = round(time.monotonic() - started, 1)
        print(json.dumps({"database": "postgres-private", "scenario": "pg-restart", **result}), flush=True)
        return {"pg-restart": result}
    finally:
        site.stop()
        pg.stop()


def reset_postgres(url: str) -> None:
    from urllib.parse import urlsplit

    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uploads", type=int, default=50)
    parser.add_argument("--heavy-uploads", type=int, default=6, help="fair-queue: the heavy team's uploads")
    parser.add_argument("--slow-clients", type=int, nargs="+", default=[2, 10])
    parser.add_argument("--postgres", default=os.environ.get("DATABASE_URL_POSTGRES"), help="postgres:// URL")
    parser.add_argument("--only", nargs="*", choices=SCENARIOS + OFF_SITE + ISSUE36)
    parser.add_argument("--issue36", action="store_true", help="only issue 36's four attacks and the quiet baseline")
    parser.add_argument("--attacks", action="store_true", help="only issue 22's attacks (SQLite; about 3-4 minutes)")
    parser.add_argument("--before", default="8c2d8f6", help="attack-figures: the revision measured as before")
    parser.add_argument("--skip-sqlite", action="store_true")
    parser.add_argument("--pg-restart-uploads", type=int, default=12, help="0 skips the PostgreSQL restart run")
    args = parser.parse_args()
    # A TERM (timeout, Ctrl-C from make) unwinds through the finally blocks that stop the sites
    # and the private PostgreSQL; they run in their own sessions and would outlive us otherwise.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    if args.attacks:
        args.only = ATTACKS + OFF_SITE + ISSUE36
    if args.issue36:
        args.only = ISSUE36
    all_results: dict[str, Any] = {}
    if not args.skip_sqlite and (not args.only or set(args.only) & set(SCENARIOS)):
        all_results["sqlite"] = run_site("sqlite", None, args)
    if not args.skip_sqlite and (not args.only or set(args.only) & set(ISSUE36)):
        all_results["sqlite36"] = run_site_36(args)
    off_site = {"attack-tests": attack_tests, "attack-figures": lambda: attack_figures(args.before)}
    for scenario in [s for s in OFF_SITE if not args.only or s in args.only]:
        started = time.monotonic()
        try:
            result = off_site[scenario]()
        except Exception as exc:
            result = {"pass": False, "error": f"{type(exc).__name__}: {exc}"}
        result["seconds"] = round(time.monotonic() - started, 1)
        all_results.setdefault("off-site", {})[scenario] = result
        print(json.dumps({"scenario": scenario, **result}), flush=True)
    if args.postgres and not args.attacks:
        try:
            reset_postgres(args.postgres)
        except Exception as exc:  # no server there (CI has one; a laptop often not): say so, go on
            print(json.dumps({"database": "postgres", "skipped": f"cannot connect to {args.postgres}: {exc}"[:300]}))
        else:
            all_results["postgres"] = run_site("postgres", args.postgres, args)
    if args.pg_restart_uploads and not args.only:
        all_results["postgres-private"] = run_pg_restart(args)
    out = ROOT / "var" / "reliability" / "results.json"
    out.write_text(json.dumps(all_results, indent=2))
    failed = [f"{db}:{name}" for db, rs in all_results.items() for name, r in rs.items() if not r.get("pass")]
    print(f"results in {out}; {'FAILED: ' + ', '.join(failed) if failed else 'all passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
