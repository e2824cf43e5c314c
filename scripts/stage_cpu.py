"""The report's stages one by one: each stage's CPU on the main thread, the report's serial path.

    python3 scripts/stage_cpu.py FILE [--jobs 3] [--runs 5] [--whatif CONF ...] [--base DIR] [--also MOD:FUNC ...]
                                 [--timeline]

Each run is one ``build_report`` in a fresh process (``analysis.heap.keep_freed_memory()`` first, as the
worker's child does), every function of ``analysis.stages`` that ``report.py`` calls wrapped to add up its
wall and main-thread CPU (``time.thread_time``: with ``jobs`` > 1 the policy replays run in threads beside
it, and what they take is not counted); ``--also`` wraps more functions by their module and name
(``analysis.stacks:alloc_lifetimes``, a method as ``analysis.convert:Converter.convert_annotations``).
Printed: the medians over the runs of the report's wall, its CPU over all threads, the main thread's CPU,
and of each function's main-thread CPU. ``--base DIR`` (another checkout, its extensions built) runs there
too, alternated with this tree run for run, and prints its medians beside (issue 34: what the main
thread spends is the report's serial path once the replays run beside it). ``--timeline`` prints when
each stage, each pool task and the file's hash started and ended in this tree's last run: where a CPU
waited idle, and what the report's end waited for.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STAGES = {
    "source": ("read",),
    "outline": ("trace_outline", "trace_facts"),
    "replays": ("start", "record", "explore_into"),
    "explain": ("explain",),
    "whatifs": ("submit_whatifs", "collect_whatifs", "add_grown_horizons"),
    "serialise": ("timeline_json", "device_json", "oom_json", "with_replays"),
    "attribution": ("attribute",),
    "diagnosis": ("device_phases", "diagnose_device", "ledger_of", "signature_of", "growth_per_step"),
    "workload": ("advice_context",),
    "finish": ("capture_section", "finish_device", "doctor_into"),
}


def _one_run(path: str, jobs: int, whatif: list[str], also: list[str]) -> dict[str, object]:
    """In the child: one report, its stages timed (see the module docstring), and its timeline: each
    stage's start and end on the main thread, each pool task's on its thread, the file's hash."""
    import functools
    import importlib
    import threading
    import time

    import analysis.heap

    analysis.heap.keep_freed_memory()
    import analysis.report as report

    main = threading.main_thread()
    spent: dict[str, list[float]] = {}
    stamps: list[tuple[str, str, float, float]] = []  # (thread, what, start, end): the timeline

    def wrap(owner: object, name: str, key: str) -> None:
        f = getattr(owner, name)

        @functools.wraps(f)
        def timed(*a: object, **k: object) -> object:
            if threading.current_thread() is not main:
                return f(*a, **k)
            w, c = time.perf_counter(), time.thread_time()
            try:
                return f(*a, **k)
            finally:
                row = spent.setdefault(key, [0.0, 0.0])
                row[0] += time.perf_counter() - w
                row[1] += time.thread_time() - c
                stamps.append(("main", key, w, time.perf_counter()))

        setattr(owner, name, timed)
        # Modules that imported it by name call their own reference.
        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("analysis") and getattr(mod, name, None) is f:
                setattr(mod, name, timed)

    for stage, names in STAGES.items():
        mod = importlib.import_module(f"analysis.stages.{stage}")
        for name in names:
            wrap(mod, name, f"{stage}.{name}")
    for spec in also:
        modname, _, dotted = spec.partition(":")
        owner: object = importlib.import_module(modname)
        *outer, name = dotted.split(".")
        for part in outer:
            owner = getattr(owner, part)
        wrap(owner, name, f"{modname.rsplit('.', 1)[-1]}.{dotted}")
    _stamp_threads(stamps)
    w, c, t = time.perf_counter(), time.process_time(), time.thread_time()
    report.build_report(path, whatif=tuple(whatif), jobs=jobs)
    return {
        "wall": time.perf_counter() - w,
        "cpu": time.process_time() - c,
        "main": time.thread_time() - t,
        "stages": {k: v[1] for k, v in spent.items()},
        "timeline": sorted((th, what, s - w, e - w) for th, what, s, e in stamps),
    }


def _stamp_threads(stamps: list[tuple[str, str, float, float]]) -> None:
    """Each pool task (``parallel.Pool.submit``) and the file's hash (``stages.source.source_info``)
    stamped into the timeline with the thread that ran it."""
    import functools
    import threading
    import time

    import analysis.parallel as parallel
    import analysis.stages.source as source

    def stamped(fn: Any, what: str) -> Any:
        @functools.wraps(fn)
        def run(*a: Any, **k: Any) -> Any:
            s = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                stamps.append((threading.current_thread().name, what, s, time.perf_counter()))

        return run

    submit = parallel.Pool.submit

    def submit_stamped(pool: Any, fn: Any) -> Any:
        return submit(pool, stamped(fn, f"task {getattr(fn, '__qualname__', type(fn).__name__)}"))

    parallel.Pool.submit = submit_stamped  # type: ignore[method-assign]
    source.source_info = stamped(source.source_info, "sha256 of the file")


def _run_in(tree: Path, args: argparse.Namespace) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(tree), OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", args.file, "--jobs", str(args.jobs)]
    cmd += [x for w in args.whatif for x in ("--whatif", w)] + [x for a in args.also for x in ("--also", a)]
    out = subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True, text=True).stdout  # noqa: S603 (this interpreter, this script)
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file")
    p.add_argument("--jobs", type=int, default=3)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--whatif", action="append", default=[])
    p.add_argument("--also", action="append", default=[], metavar="MOD:FUNC")
    p.add_argument("--base", type=Path, help="another checkout, run alternately with this one")
    p.add_argument("--timeline", action="store_true", help="print this tree's last run's timeline")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_one_run(args.file, args.jobs, args.whatif, args.also)))
        return
    trees = {"this": ROOT} | ({"base": args.base.resolve()} if args.base else {})
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, tree in trees.items():
            runs[name].append(_run_in(tree, args))

    def median(name: str, pick: object) -> str:
        return f"{statistics.median(pick(r) for r in runs[name]):>10.3f}"  # type: ignore[operator]

    print(f"{'median of ' + str(args.runs) + ' runs, s':34s}" + "".join(f"{n:>10s}" for n in trees))
    for key in ("wall", "cpu", "main"):
        print(f"{key:34s}" + "".join(median(n, lambda r, k=key: r[k]) for n in trees))
    keys = list(dict.fromkeys(k for rs in runs.values() for r in rs for k in r["stages"]))  # type: ignore[attr-defined]
    for key in keys:
        print(f"  {key:32s}" + "".join(median(n, lambda r, k=key: r["stages"].get(k, 0.0)) for n in trees))
    if args.timeline:
        print("timeline of this tree's last run, s from build_report's call: thread, what, start, end")
        for thread, what, start, end in sorted(runs["this"][-1]["timeline"], key=lambda x: x[2]):  # type: ignore[index]
            print(f"  {thread[-16:]:16s} {what[:52]:52s} {start:6.3f} {end:6.3f}")


if __name__ == "__main__":
    main()
