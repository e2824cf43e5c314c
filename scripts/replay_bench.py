"""The replay loops alone, Python against compiled, in one process (docs/performance.md).

    python3 scripts/replay_bench.py [FILE] [--rounds N]

Reads FILE once (default: the 460 MB ``huge_all_stacks``; a ``.gz`` is read as it is), then times
``recorded_replay`` and ``simulate`` under the recorded settings and the bench's two what-ifs on its first
device, with ``OOMSCOPE_REPLAY=python`` and without, alternating, for N rounds (default 3); prints the
median CPU seconds (``time.process_time``) of each and the speed-up. The cyclic GC is off, as in
``build_report``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FILE = ROOT.parent / "shared" / "snapshots" / "huge_all_stacks.pickle.gz"
CONFIGS = ("", "expandable_segments:True", "max_split_size_mb:256")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", type=Path, default=DEFAULT_FILE)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from analysis.allocator import compiled, simulate
    from analysis.allocator.config import AllocatorConfig
    from analysis.allocator.recorded import recorded_replay
    from analysis.reader import read_snapshot

    if not compiled.available():
        print("the compiled replay loops are not built (make install)")
        return 1
    gc.disable()
    snap = read_snapshot(args.file)
    dev = snap.devices[0]
    base = AllocatorConfig.from_settings(snap.settings.raw, snap.settings.conf)
    passes = {"recorded replay": lambda: recorded_replay(snap, dev)}
    for conf in CONFIGS:
        cfg = AllocatorConfig.parse(conf, base=base)
        passes[f"policy replay, {conf or 'recorded settings'}"] = lambda cfg=cfg: simulate(snap, dev, cfg)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(max(1, args.rounds)):
        for loops in ("python", "compiled"):
            os.environ[compiled.ENV_VAR] = "python" if loops == "python" else ""
            for name, work in passes.items():
                c0 = time.process_time()
                work()
                times.setdefault((name, loops), []).append(time.process_time() - c0)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{dev.trace.action.size:,} events; load average {load}")
    print(f"{'pass':45s} {'python s':>9s} {'compiled s':>10s} {'speed-up':>8s}")
    for name in passes:
        py, cc = statistics.median(times[(name, "python")]), statistics.median(times[(name, "compiled")])
        print(f"{name:45s} {py:9.2f} {cc:10.2f} {(py / cc if cc else float('nan')):7.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
