# ruff: noqa: S603, S607 - fixed argv (this interpreter, git, tar), never user input
"""Issue 22's attacks, measured in process: each one on the code as it is, and where asked on the
code as it was (``--before REV``: that revision's ``analysis/`` and ``webapp/`` (for its charts),
extracted with ``git archive``). Short and bounded (each case a few seconds at most, but the
"before" charts of many devices: 300 took 105 s; ``--devices`` and ``--quick`` shrink them); one
JSON line per case. ``scripts/reliability.py`` (``make reliability``) runs this script twice (after,
and before on 8c2d8f6) beside its live-site attacks; ``docs/reliability.md`` has the figures.

    .venv/bin/python scripts/attack_figures.py                 # after
    .venv/bin/python scripts/attack_figures.py --before 8c2d8f6  # before, where the old code still runs
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# --before re-runs this script with the old analysis/ first on the path (ANALYSIS_FROM).
ANALYSIS_FROM = os.environ.get("ANALYSIS_FROM", str(ROOT))
sys.path[:0] = [ANALYSIS_FROM, str(ROOT)] if str(ROOT) != ANALYSIS_FROM else [str(ROOT)]

PREFIX = (
    "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 7.00 GiB of which 1.00 GiB is free. "
)


def _old_tree(rev: str) -> Path:
    """``analysis/`` and ``webapp/`` as they were at ``rev``, extracted to a temp folder (nothing
    else is touched): the old charts need the old report's helpers."""
    target = Path(tempfile.mkdtemp(prefix="oomscope-before-"))
    archive = subprocess.run(
        ["git", "archive", rev, "analysis", "webapp"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def emit(case: str, **figures: Any) -> None:
    print(json.dumps({"case": case, **figures}), flush=True)


def oom_message(limits: ModuleType, sizes: list[int]) -> None:
    for size in sizes:
        text = (PREFIX + "1" * size)[:size]
        started = time.process_time()
        try:
            limits.parse_oom_message(text)
            outcome = "parsed"
        except Exception as exc:
            outcome = getattr(exc, "code", type(exc).__name__)
        emit("oom-message-digits", chars=size, cpu_s=round(time.process_time() - started, 3), outcome=outcome)


def gzip_members(reader: ModuleType, counts: list[int]) -> None:
    from tests.analysis.hostile_cases import snapshot_dict

    body = gzip.compress(pickle.dumps(snapshot_dict(10), protocol=4))
    for n in counts:
        data = gzip.compress(b"", 1) * n + body
        kwargs = {"max_gzip_members": 10**7} if "max_gzip_members" in reader.ReadLimits.__dataclass_fields__ else {}
        started = time.process_time()
        reader.read_snapshot(data, limits=reader.ReadLimits(**kwargs))
        emit("gzip-members-read", members=n, bytes=len(data), cpu_s=round(time.process_time() - started, 3))


# The peak RSS in KiB of the running interpreter. Not ru_maxrss: Linux keeps a forked parent's peak
# across exec, and this script's own junk list would count.
_HWM = "[int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')][0]"


def _peak_rss_of(code: str) -> tuple[int, str]:
    """Peak RSS (bytes) of a fresh interpreter running ``code``, and its last output line."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    lines = done.stdout.strip().splitlines()
    return (int(lines[-2]) * 1024 if len(lines) > 1 else -1), (lines[-1] if lines else done.stderr[-300:])


def share_link_backfill(strings: int) -> None:
    """What one timeline.json of a report without a store cost gunicorn before (the upload read and
    unpickled in the web process), against what the web process does now (nothing of the upload)."""
    junk = {"segments": [], "device_traces": [], "junk": [f"{i:09d}" * 100 for i in range(strings)]}
    path = Path(tempfile.mkdtemp()) / "junk.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(junk, protocol=4), 1))
    del junk
    before = (
        "import sys, time; sys.path.insert(0, '.');"
        "from analysis.reader import read_snapshot; t = time.perf_counter();"
        f"read_snapshot(open({str(path)!r}, 'rb').read());"
        f"print({_HWM}); print(round(time.perf_counter() - t, 2))"
    )
    baseline = f"import sys; sys.path.insert(0, '.'); import analysis.reader;print({_HWM}); print(0)"
    rss, seconds = _peak_rss_of(before)
    base, _ = _peak_rss_of(baseline)
    emit(
        "share-link-backfill-before",
        upload_bytes=path.stat().st_size,
        unpickled_strings_mb=round(strings * 900 / 1e6),
        added_rss_mb=round((rss - base) / 2**20),
        seconds=float(seconds),
    )


def many_devices(reader: ModuleType, n: int, *, charts: bool) -> None:
    from tests.analysis.hostile_schema import _many_devices

    data = _many_devices(n)
    path = Path(tempfile.mkdtemp()) / "devices.pickle"
    path.write_bytes(data)
    started = time.perf_counter()
    charts_s = None
    try:
        snap = reader.read_snapshot(data)
        outcome = f"read {len(snap.devices)} devices"
        if charts:
            from analysis.report import build_report
            from webapp.snapshots.pages.charts import build_charts

            report = build_report(path)
            t = time.perf_counter()
            built = build_charts(report)
            charts_s = round(time.perf_counter() - t, 1)
            outcome += f"; report + charts ({len(json.dumps(built)) >> 20} MB of chart JSON)"
    except Exception as exc:
        outcome = getattr(exc, "code", None) or f"{type(exc).__name__}: {exc}"[:200]
    emit(
        "many-devices",
        devices=n,
        bytes=len(data),
        seconds=round(time.perf_counter() - started, 2),
        charts_s=charts_s,
        outcome=outcome,
    )


def hostile_values() -> None:
    from tests.analysis import hostile_schema

    child = (
        "import json, sys, time; sys.path[:0] = sys.argv[2:4];"
        "from analysis.errors import SnapshotError; from analysis.report import build_report; t = time.perf_counter()\n"
        "try:\n build_report(sys.argv[1]); r = 'accepted'\n"
        "except SnapshotError as e:\n r = e.code\n"
        "except Exception as e:\n r = 'worker:internal (' + type(e).__name__ + ')'\n"
        "print(json.dumps([r, round(time.perf_counter() - t, 2)]))"
    )
    for name, (data, _want) in hostile_schema.build().items():
        if name in ("many_devices", "many_gzip_members"):
            continue
        path = Path(tempfile.mkdtemp()) / name
        path.write_bytes(data)
        done = subprocess.run(
            [sys.executable, "-c", child, str(path), ANALYSIS_FROM, str(ROOT)],
            cwd=tempfile.gettempdir(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode < 0:
            outcome, seconds = f"crash (signal {-done.returncode})", None
        elif not done.stdout.strip():
            outcome, seconds = f"error: {done.stderr.strip().splitlines()[-1:]}", None
        else:
            outcome, seconds = json.loads(done.stdout.strip().splitlines()[-1])
        emit("hostile-value", name=name, outcome=outcome, seconds=seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="REV", help="measure that revision's reader and message parser")
    parser.add_argument("--quick", action="store_true", help="smaller cases")
    parser.add_argument("--devices", type=int, help="many-devices: this many (default: before 300, after 3000)")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if args.before and str(ROOT) == ANALYSIS_FROM:
        env = {**os.environ, "ANALYSIS_FROM": str(_old_tree(args.before))}
        sys.exit(subprocess.run([sys.executable, *sys.argv], env=env, check=False).returncode)
    import analysis.limits
    import analysis.reader

    if args.before:
        oom_message(analysis.limits, [8192, 16384] if not args.quick else [4096])
        gzip_members(analysis.reader, [10_000, 40_000, 80_000] if not args.quick else [10_000])
        many_devices(analysis.reader, args.devices or (300 if not args.quick else 100), charts=True)
        share_link_backfill(30_000 if args.quick else 300_000)
    else:
        oom_message(analysis.limits, [8192, 16384, 32768, 65536])
        gzip_members(analysis.reader, [40_000, 400_000])
        many_devices(analysis.reader, args.devices or 3000, charts=False)
    hostile_values()


if __name__ == "__main__":
    main()
