# ruff: noqa: S603 - fixed argv (our venv), never user input
"""The worker's wall time from upload to report done, on a real site (issue 21).

Starts the site as `make run` does, through scripts/reliability.py's Site (scripts/run.sh:
Redis, a Celery worker, gunicorn), once per reader mode, uploads each snapshot through the HTTP
API and polls its status every 0.1 s until done. Modes: ``compiled`` (the default environment)
and ``python`` (OOMSCOPE_READER=python and OOMSCOPE_REPLAY=python in the worker's environment,
which webapp/snapshots/worker/runner.py passes on to the analysis child; the script reads the child's
/proc environment to check that it did), and ``python-loops`` (the compiled reader with
OOMSCOPE_REPLAY=python). Prints one JSON line per run:

  upload_s      the POST (client gzip check + transfer + the row and the publish)
  first_answer_s  from the POST's start to the first poll whose ``parts.report`` is true: the report
                stored and served while the charts and digging stores still come (issue 34)
  total_s       from the POST's start to the status ``done`` seen by the poll (the whole report)
  x_load        first_answer_s and total_s over a gc-free ``pickle.load`` of the same file's raw
                pickle, timed by scripts/bench.py in this run (``--no-load`` leaves it out)
  stages_s      seconds spent in each stage the API showed (queued, reading, replaying,
                analysing, charting), from the first poll that showed it to the next stage
  child_s, child_cpu_s, task_s   the worker log's "analysis child exited ... after X s, Y s CPU"
                and "done (analysis and charts X s)" (task_s - child_s: stores kept, report row)
  load          `os.getloadavg()` before and after the run
and, per mode, the `python -m analysis --version` line (which reader, gunzip and loops are in use).

    .venv/bin/python scripts/worker_bench.py ../shared/snapshots/huge_all_stacks.pickle.gz \\
        --modes compiled python --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reliability import PY, ROOT, Site, post

MODES: dict[str, dict[str, str]] = {
    "compiled": {},
    "python": {"OOMSCOPE_READER": "python", "OOMSCOPE_REPLAY": "python"},
    "python-loops": {"OOMSCOPE_REPLAY": "python"},  # the compiled reader with the Python replay loops
}
CHILD_LINE = re.compile(r"analysis child exited rc=(-?\d+) after ([\d.]+)s, ([\d.]+)s CPU")
TASK_LINE = re.compile(r"upload (\d+): done \(analysis and charts ([\d.]+)s\)")


def stage_durations(samples: list[tuple[float, str]], end: float) -> dict[str, float]:
    """Seconds in each stage from ``(time, stage)`` poll samples: a stage lasts from the first sample
    that shows it to the first sample of the next one (the last one to ``end``); repeats add up."""
    out: dict[str, float] = {}
    for i, (t, stage) in enumerate(samples):
        nxt = samples[i + 1][0] if i + 1 < len(samples) else end
        out[stage] = round(out.get(stage, 0.0) + nxt - t, 2)
    return out


def log_figures(text: str) -> dict[str, float]:
    """The last analysis child's wall and CPU seconds and the last task's seconds in a worker log."""
    out: dict[str, float] = {}
    children = CHILD_LINE.findall(text)
    if children:
        out["child_rc"], out["child_s"], out["child_cpu_s"] = float(children[-1][0]), *map(float, children[-1][1:])
    tasks = TASK_LINE.findall(text)
    if tasks:
        out["task_s"] = float(tasks[-1][1])
    return out


def one_run(site: Site, token: str, path: Path, timeout: float) -> dict[str, Any]:
    log = site.var / "log" / "worker.log"
    log_start = log.stat().st_size if log.exists() else 0
    child_env: dict[str, str] = {}
    stop = threading.Event()

    def watch_child() -> None:
        while not stop.is_set() and not child_env:
            try:
                for child in site.analysis_children():
                    env = child.environ()
                    child_env.update({k: v for k, v in env.items() if k in MODES["python"]} or {"-": "-"})
            except Exception:  # noqa: S110 - a child that ended between listing and reading
                pass
            time.sleep(0.2)

    watcher = threading.Thread(target=watch_child, daemon=True)
    watcher.start()
    load_before = os.getloadavg()
    started = time.monotonic()
    body, upload_s = post(site, token, path)
    samples: list[tuple[float, str]] = [(upload_s, "queued")]
    deadline = time.monotonic() + timeout
    status = body.get("status", "")
    first_answer: float | None = None
    while time.monotonic() < deadline:
        code, now_body, _ = site.get(token, f"/api/v1/snapshots/{body['id']}")
        now = time.monotonic() - started
        status = now_body.get("status", f"http {code}")
        if first_answer is None and ((now_body.get("parts") or {}).get("report") or status == "done"):
            first_answer = now
        if status in ("done", "failed"):
            break
        stage = now_body.get("stage") or status
        if stage != samples[-1][1]:
            samples.append((now, stage))
        time.sleep(0.1)
    total = time.monotonic() - started
    stop.set()
    watcher.join(timeout=2)
    time.sleep(0.5)  # the task's log line follows the row's update
    text = log.read_bytes()[log_start:].decode("utf-8", "replace") if log.exists() else ""
    return {
        "file": path.name,
        "status": status,
        "error": now_body.get("error"),
        "upload_s": round(upload_s, 2),
        "first_answer_s": round(first_answer, 2) if first_answer is not None else None,
        "total_s": round(total, 2),
        "stages_s": stage_durations(samples, total),
        **log_figures(text),
        "child_seen": bool(child_env),
        "child_env": {k: v for k, v in child_env.items() if k != "-"},
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def load_seconds(path: Path) -> float:
    """A gc-free ``pickle.load`` of the file's raw pickle, as scripts/bench.py times it (median of 3)."""
    import bench

    result = bench.run_stages(["pickle.load"], bench.raw_pickle(path), 3)["pickle.load"]
    if result is None or "seconds" not in result:
        raise SystemExit(f"pickle.load of {path} failed: {result}")
    print(json.dumps({"file": path.name, "pickle_load_s": round(result["seconds"], 2), "runs": result["runs"]}))
    return float(result["seconds"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshots", nargs="+", type=Path)
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=["compiled", "python"])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--no-load", action="store_true", help="skip the gc-free pickle.load the ratios divide by")
    args = parser.parse_args()
    loads = {} if args.no_load else {path: load_seconds(path) for path in args.snapshots}
    for mode in args.modes:
        site = Site(f"worker-bench-{mode}", None, 600)
        site.env.update(MODES[mode])
        for var in ("OOMSCOPE_READER", "OOMSCOPE_REPLAY"):
            if var not in MODES[mode]:  # the mode decides, not the caller's environment
                site.env.pop(var, None)
        try:
            site.start()
            version = subprocess.run(
                [PY, "-m", "analysis", "--version"], cwd=ROOT, env=site.env, capture_output=True, text=True, check=True
            )
            print(json.dumps({"mode": mode, "version": " ".join(version.stdout.split())}), flush=True)
            token = site.manage("create_api_token", "wb", "--create-user", "--team", "wb", "--project", "rel")
            for path in args.snapshots:
                for i in range(args.repeat):
                    result = one_run(site, token, path, args.timeout)
                    if loads.get(path, 0.0) >= 0.05:  # a ratio to a load of a few ms says nothing
                        result["load_s"] = round(loads[path], 2)
                        result["x_load"] = {
                            key: round(result[key] / loads[path], 2)
                            for key in ("first_answer_s", "total_s")
                            if result.get(key) is not None
                        }
                    print(json.dumps({"mode": mode, "run": i + 1, **result}), flush=True)
        finally:
            site.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
