"""The analysis child process: ``python -m webapp.snapshots.worker.child JOB.json``.

Runs under the rlimits set by ``runner.py`` and imports only ``analysis`` (stdlib +
numpy) and, for the charts, ``webapp.snapshots.pages.charts`` (bokeh): no Django, no Celery, no
database connection, so a hostile or giant file can take down only this process. The charts
are built here, under the same rlimits and wall-clock limit, not in the Celery pool process
(issue 22: 3,000 devices took 210 s of charting there, outside every limit). Its one input is
the job description (``Job``, a JSON file the runner writes). Progress goes to stdout as one
JSON object per line:

    {"event": "progress", "stage": "replaying", "progress": 40}
    {"event": "report"}                                 report written to the job's ``report``: the
                                                        first answer, which the worker stores at once
    {"event": "stores"}                                 with ``explore_dir``, one explore store per
                                                        device written there (after the report: issue 34)
    {"event": "done"}                                   with ``charts``, the report's charts written
                                                        there too (else at once after "stores")
    {"event": "error", "code": "snapshot:...", "message": "..."}   exit status 2

Anything else (a bug) prints a traceback to stderr and exits 1.

``python -m webapp.snapshots.worker.child --warm`` is a spare child (``warmchild.py``): it imports the analysis,
numpy and the charts' module, prints ``{"event": "ready", "cpu": SECONDS}`` and waits for one line on stdin,
``{"job": PATH, "memory_bytes": N, "cpu_seconds": N}``; it sets those rlimits on itself and then runs
that job exactly as above. One job per process, warm or cold: a job's rlimits can only be lowered, and
its heap is its own.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Job:
    """One analysis, as the runner describes it to the child (``job.json``): paths are the
    worker's; a text the user wrote (the OOM message) travels here, not in argv or the environment."""

    snapshot: str  # the upload's bytes (read from disk by the reader, never loaded whole)
    report: str  # where the report JSON goes
    filename: str | None = None  # the name the report shows (else the snapshot's)
    jobs: int = 1  # policy replays at once (threads or processes: ``analysis.parallel``), from ANALYSIS_JOBS
    oom_message: str | None = None  # Upload.oom_message
    batch_size: int | None = None  # Upload.batch_size
    cap_bytes: int | None = None  # Upload.cap_bytes: the memory limit the run had
    explore_dir: str | None = None  # where one ``<device>.npz`` per device goes (the digging endpoints' stores)
    charts: str | None = None  # where the report's charts go; none built without it

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> Job:
        data = json.loads(path.read_text(encoding="utf-8"))
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:  # a runner newer than this child: refuse rather than ignore a setting
            raise ValueError(f"job file {path}: unknown keys {sorted(unknown)}")
        return cls(**data)


# Stage names and the percentage reached when each starts.
STAGES = {"reading": 5, "replaying": 35, "analysing": 60, "charting": 90}


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class _Progress:
    """Tolerant progress callable for ``build_report``: stage names and optional fractions."""

    def __init__(self) -> None:
        self.last = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        stage = kwargs.get("stage")
        fraction = kwargs.get("fraction")
        for arg in args:
            if isinstance(arg, str) and stage is None:
                stage = arg
            elif isinstance(arg, int | float) and not isinstance(arg, bool) and fraction is None:
                fraction = float(arg)
        now = time.monotonic()
        if stage is None and now - self.last < 0.5:
            return
        self.last = now
        base = STAGES.get(str(stage))
        percent = base if base is not None else None
        if fraction is not None and 0 <= fraction <= 1:
            if base is not None:
                nxt = min((v for v in STAGES.values() if v > base), default=90)
                percent = int(base + (nxt - base) * fraction)
            else:
                percent = int(5 + 85 * fraction)
        _emit({"event": "progress", "stage": str(stage or ""), "progress": percent})


def analyse(job: Job, stores: _DeferredStores | None = None) -> dict[str, Any]:
    progress = _Progress()
    progress("reading")
    from analysis.report import build_report

    path = Path(job.snapshot)
    # The path, not its bytes: the reader unpickles a raw file straight from disk.
    report: dict[str, Any] = build_report(
        path,
        progress=progress,
        filename=job.filename or path.name,
        jobs=job.jobs,
        oom_message=job.oom_message,
        batch_size=job.batch_size,
        limit=job.cap_bytes,
        explore_later=stores.keep if stores is not None else None,
    )
    return report


class _DeferredStores:
    """``build_report``'s explore sink (``explore_later``): one uncompressed ``<device>.npz`` per device
    (a zoom reads a window of it fast; the worker moves the files into the upload's storage), made and
    written after the report (``write_all``): the report is the user's first answer, the stores serve
    later zooms. Writing them took 0.9 s of the 460 MB file's analysis, making them 0.58 s more (issue
    34). Each device's recorded replay is held meanwhile by the function that makes its store: the
    report's JSON is all that is made after them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pending: list[tuple[int, Callable[[], dict[str, Any]]]] = []

    def keep(self, device: int, make: Callable[[], dict[str, Any]]) -> None:
        self.pending.append((int(device), make))

    def write_all(self) -> None:
        import gc

        import numpy as np

        # The cyclic GC off, as for the report itself (``replays.running``): making a store builds many
        # short-lived objects and no cycles, and each full pass walks every object the snapshot holds
        # (the 460 MB benchmark's stores: 0.93 s of CPU against 1.05 s with it on, medians of three pairs).
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            while self.pending:
                device, make = self.pending.pop(0)
                target = self.folder / f"{device}.npz"
                partial = target.with_suffix(".part")
                store = make()
                with partial.open("wb") as fh:
                    np.savez(fh, **store)
                del store, make  # this device's replay and store go before the next device's are made
                partial.rename(target)
        finally:
            if was_enabled:
                gc.enable()


def main(argv: list[str]) -> int:
    import faulthandler

    from analysis.errors import SnapshotError
    from analysis.limits import OomMessageError

    # A crash of the interpreter itself leaves its Python stack on stderr: the runner reads there
    # whether the reader was unpickling (a tuple nested a million deep as a dict key overflows the
    # C stack when the unpickler hashes it; no Python check runs before that hash).
    faulthandler.enable()

    job = Job.read(Path(argv[0]))
    if job.charts and "webapp.snapshots.pages.charts" not in sys.modules:  # a warm child has it already
        _import_charts_beside()
    stores = _DeferredStores(Path(job.explore_dir)) if job.explore_dir else None
    try:
        report = analyse(job, stores)
    except SnapshotError as exc:
        _emit({"event": "error", "code": exc.code, "message": str(getattr(exc, "message", exc))})
        return 2
    except OomMessageError as exc:  # the form and the API check it first; an old row may not have been
        _emit({"event": "error", "code": exc.code, "message": exc.message})
        return 2
    except MemoryError:
        _emit({"event": "error", "code": "snapshot:limit:memory", "message": "memory limit reached"})
        return 2
    with Path(job.report).open("w") as fh:
        json.dump(report, fh, separators=(",", ":"), allow_nan=False)
    _emit({"event": "report"})
    if stores is not None:
        try:
            stores.write_all()
        except MemoryError:  # the report stands without them (the page says the digging data is not there)
            sys.stderr.write("explore stores: memory limit reached; the report is stored without them\n")
        _emit({"event": "stores"})
    if job.charts:
        _emit({"event": "progress", "stage": "charting", "progress": STAGES["charting"]})
        charts = _charts(report)
        with Path(job.charts).open("w") as fh:
            json.dump(charts, fh, separators=(",", ":"))
    _emit({"event": "done"})
    return 0


def _import_charts_beside() -> None:
    """Import the charts' module (bokeh: ~0.5 s, as long as building the charts of the 460 MB benchmark)
    on a thread while the analysis runs: the compiled reader and the policy replays let go of the GIL,
    and the worker's second CPU is idle through most of a one-job analysis. Any failure there (the
    memory cap reached) is left to ``_charts``, which imports it again: the memory cap reached again
    keeps the report without charts, a broken import fails the job; so is a thread that cannot start
    (its stack counts against ``RLIMIT_AS``)."""
    import contextlib
    import threading

    def run() -> None:
        # Only the memory cap is let pass (quietly: _charts imports again); a broken import is printed
        # by the thread's excepthook, and _charts then fails the job with it.
        with contextlib.suppress(MemoryError):
            import webapp.snapshots.pages.charts  # noqa: F401

    with contextlib.suppress(RuntimeError):
        threading.Thread(target=run, name="charts-import", daemon=True).start()


def _charts(report: dict[str, Any]) -> dict[str, Any]:
    """The report's charts; none when building them fails (a chart bug, or this process's memory
    cap reached while charting), so a finished report is never thrown away for its charts."""
    try:
        # Ours: a broken import fails the job loudly; only the memory cap is let pass.
        from webapp.snapshots.pages.charts import build_charts
    except MemoryError:
        sys.stderr.write("charts: memory limit reached; the report is stored without charts\n")
        return {}
    try:
        charts: dict[str, Any] = build_charts(report)
    except MemoryError:
        sys.stderr.write("charts: memory limit reached; the report is stored without charts\n")
        return {}
    except Exception:
        import traceback

        traceback.print_exc()
        return {}
    return charts


def warm_main() -> int:
    """A spare child: imports done, then one job from stdin under the limits that come with it."""
    _warm_up()
    _emit({"event": "ready", "cpu": _cpu_seconds()})
    line = sys.stdin.readline()
    if not line.strip():  # the pool process closed the pipe unused (it is shutting down)
        return 0
    order = json.loads(line)
    _limit_self(int(order["memory_bytes"]), int(order["cpu_seconds"]))
    return main([str(order["job"])])


def _warm_up() -> None:
    """What every job imports (about 0.5 s of the analysis, 0.6 s of bokeh on this box). A broken
    import ends the spare (the worker then starts a cold child, which fails loudly, as before)."""
    import contextlib
    import faulthandler  # noqa: F401

    import analysis.errors
    import analysis.limits
    import analysis.report  # noqa: F401

    with contextlib.suppress(MemoryError):  # as _import_charts_beside: the job's _charts says it
        import webapp.snapshots.pages.charts  # noqa: F401


def _cpu_seconds() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return round(usage.ru_utime + usage.ru_stime, 3)


def _limit_self(memory_bytes: int, cpu_seconds: int) -> None:
    """The job's rlimits, as ``runner._set_limits`` gives a cold child before its exec: the address
    space whole (the imports' share of it counted, as in a cold child), and the CPU from now on
    (the warm-up's seconds are not the job's)."""
    import math
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    soft = math.ceil(_cpu_seconds()) + cpu_seconds
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


if __name__ == "__main__":
    # One job per process: its stages reuse each other's freed pages (analysis.heap).
    from analysis.heap import keep_freed_memory

    keep_freed_memory()
    sys.exit(warm_main() if sys.argv[1:] == ["--warm"] else main(sys.argv[1:]))
