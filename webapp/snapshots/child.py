"""The analysis child process: ``python -m webapp.snapshots.child SNAPSHOT OUT.json``.

Runs under the rlimits set by ``runner.py`` and imports only ``analysis`` (stdlib +
numpy) and, for the charts, ``webapp.snapshots.charts`` (bokeh): no Django, no Celery, no
database connection, so a hostile or giant file can take down only this process. The charts
are built here, under the same rlimits and wall-clock limit, not in the Celery pool process
(issue 22: 3,000 devices took 210 s of charting there, outside every limit). Progress goes to
stdout as one JSON object per line:

    {"event": "progress", "stage": "replaying", "progress": 40}
    {"event": "report"}                                 report written to OUT.json (and, with
                                                        OOMSCOPE_EXPLORE_DIR, one explore store per device)
    {"event": "done"}                                   with OOMSCOPE_CHARTS_FILE, the report's charts
                                                        written there too (else at once after "report")
    {"event": "error", "code": "snapshot:...", "message": "..."}   exit status 2

Anything else (a bug) prints a traceback to stderr and exits 1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

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


def analyse(path: Path, filename: str | None) -> dict[str, Any]:
    progress = _Progress()
    progress("reading")
    from analysis.report import build_report

    # The path, not its bytes: the reader unpickles a raw file straight from disk.
    jobs = int(os.environ.get("OOMSCOPE_ANALYSIS_JOBS", "1"))  # set by runner.py from ANALYSIS_JOBS
    message_file = os.environ.get("OOMSCOPE_OOM_MESSAGE_FILE")  # set by runner.py from Upload.oom_message
    oom_message = Path(message_file).read_text(encoding="utf-8") if message_file else None
    batch_size = int(os.environ.get("OOMSCOPE_BATCH_SIZE") or 0) or None  # set by runner.py from Upload.batch_size
    cap_bytes = int(os.environ.get("OOMSCOPE_CAP_BYTES") or 0) or None  # set by runner.py from Upload.cap_bytes
    explore_dir = os.environ.get("OOMSCOPE_EXPLORE_DIR")  # set by runner.py: the digging endpoints' stores go there
    report: dict[str, Any] = build_report(
        path,
        progress=progress,
        filename=filename or path.name,
        jobs=jobs,
        oom_message=oom_message,
        batch_size=batch_size,
        limit=cap_bytes,
        explore=_store_writer(Path(explore_dir)) if explore_dir else None,
    )
    return report


def _store_writer(folder: Path) -> Any:
    """``build_report``'s explore sink: one uncompressed ``<device>.npz`` per device (a zoom reads a
    window of it fast; the worker moves the files into the upload's storage)."""
    import numpy as np

    def write(device: int, store: dict[str, Any]) -> None:
        target = folder / f"{int(device)}.npz"
        partial = target.with_suffix(".part")
        with partial.open("wb") as fh:
            np.savez(fh, **store)
        partial.rename(target)

    return write


def main(argv: list[str]) -> int:
    import faulthandler

    from analysis.errors import SnapshotError
    from analysis.limits import OomMessageError

    # A crash of the interpreter itself leaves its Python stack on stderr: the runner reads there
    # whether the reader was unpickling (a tuple nested a million deep as a dict key overflows the
    # C stack when the unpickler hashes it; no Python check runs before that hash).
    faulthandler.enable()

    source, out = Path(argv[0]), Path(argv[1])
    filename = argv[2] if len(argv) > 2 else None
    try:
        report = analyse(source, filename)
    except SnapshotError as exc:
        _emit({"event": "error", "code": exc.code, "message": str(getattr(exc, "message", exc))})
        return 2
    except OomMessageError as exc:  # the form and the API check it first; an old row may not have been
        _emit({"event": "error", "code": exc.code, "message": exc.message})
        return 2
    except MemoryError:
        _emit({"event": "error", "code": "snapshot:limit:memory", "message": "memory limit reached"})
        return 2
    with out.open("w") as fh:
        json.dump(report, fh, separators=(",", ":"), allow_nan=False)
    _emit({"event": "report"})
    charts_file = os.environ.get("OOMSCOPE_CHARTS_FILE")  # set by runner.py when the task wants charts
    if charts_file:
        _emit({"event": "progress", "stage": "charting", "progress": STAGES["charting"]})
        charts = _charts(report)
        with Path(charts_file).open("w") as fh:
            json.dump(charts, fh, separators=(",", ":"))
    _emit({"event": "done"})
    return 0


def _charts(report: dict[str, Any]) -> dict[str, Any]:
    """The report's charts; none when building them fails (a chart bug, or this process's memory
    cap reached while charting), so a finished report is never thrown away for its charts."""
    try:
        from webapp.snapshots.charts import build_charts

        charts: dict[str, Any] = build_charts(report)
    except MemoryError:
        sys.stderr.write("charts: memory limit reached; the report is stored without charts\n")
        return {}
    except Exception:
        import traceback

        traceback.print_exc()
        return {}
    return charts


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
