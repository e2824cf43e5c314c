"""The analysis child's steps, each timed in wall and CPU seconds, in one process (issue 34).

What a warm child does for one upload (``webapp/snapshots/worker/child.py``), step by step: its imports
done first (as a spare's are), then ``build_report`` of the file with the explore stores' sink (the
report's own progress marks: reading, replaying, analysing), the report's JSON (the user's first
answer: the worker stores it then), the explore stores, the charts and their JSON. One line per step:

    wall_s  cpu_s  step

both from the start of ``build_report``. CPU time is the figure to compare on a loaded box: alternate
two trees' runs, e.g. a base from ``git archive`` beside this one (the script imports the tree it sits
in; a tree before ``build_report(explore_later=...)`` is given ``explore=``):

    .venv/bin/python scripts/child_steps.py ../shared/snapshots/huge_all_stacks.pickle.gz [--jobs 2]
"""

from __future__ import annotations

import argparse
import inspect
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--jobs", type=int, default=1, help="policy replays at once (the worker's ANALYSIS_JOBS)")
    args = parser.parse_args()
    from analysis.heap import keep_freed_memory

    keep_freed_memory()  # as the child does
    import analysis.report
    import webapp.snapshots.pages.charts  # noqa: F401 - a spare child's imports, done before its job
    from webapp.snapshots.worker import child

    marks: list[tuple[float, float, str]] = []
    t0, c0 = time.monotonic(), _cpu()

    def mark(step: str) -> None:
        marks.append((time.monotonic() - t0, _cpu() - c0, step))

    seen: set[tuple[str, float]] = set()

    def progress(stage: str, fraction: float = 0.0) -> None:
        if (stage, round(fraction, 1)) not in seen:
            seen.add((stage, round(fraction, 1)))
            mark(f"{stage} {fraction:.2f}")

    folder = Path(tempfile.mkdtemp(prefix="child-steps-"))
    stores = child._DeferredStores(folder)
    params = inspect.signature(analysis.report.build_report).parameters
    sink: dict[str, Any] = {"explore_later" if "explore_later" in params else "explore": stores.keep}
    report = analysis.report.build_report(
        args.snapshot, progress=progress, filename=args.snapshot.name, jobs=args.jobs, **sink
    )
    mark("build_report returned")
    with (folder / "report.json").open("w") as fh:
        json.dump(report, fh, separators=(",", ":"), allow_nan=False)
    mark("report JSON written (the first answer)")
    stores.write_all()
    mark("explore stores written")
    charts = child._charts(report)
    with (folder / "charts.json").open("w") as fh:
        json.dump(charts, fh, separators=(",", ":"))
    mark("charts written (the whole)")
    for wall, cpu, step in marks:
        print(f"{wall:7.3f} {cpu:7.3f}  {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
