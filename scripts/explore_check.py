"""The explore store's states against the recorded replay's own, on any snapshots (docs/report.md).

    .venv/bin/python scripts/explore_check.py tests/fixtures/*.pickle.gz tests/fixtures/captures/*.pickle.gz

For each device: a store with about 9 checkpoints (so most probes are replayed on from one), then
``StoredExplorer.blocks_at(i) == recorded_replay(...).blocks_at(i)`` (every segment and block) at the
events around the first checkpoint, the middle, the ends and 8 seeded random events. Prints one line
per device; exits 1 on any mismatch.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.allocator.recorded import recorded_replay
from analysis.explore import StoredExplorer, store_of_snapshot
from analysis.reader import read_snapshot


def main(paths: list[str]) -> int:
    bad_total = 0
    for path in paths:
        snap = read_snapshot(Path(path))
        for dev in snap.devices:
            n = len(dev.trace)
            if n < 2:
                continue
            every = max(7, n // 9)
            started = time.perf_counter()
            explorer = StoredExplorer(store_of_snapshot(snap, dev.device, every=every))
            made = time.perf_counter() - started
            rep = recorded_replay(snap, dev)
            probes = {-1, 0, n - 1, every - 1, every, every + 1, n // 2, n // 3, n - 2}
            probes |= {int(i) for i in np.random.default_rng(0).integers(0, n, 8)}
            bad = [
                i for i in sorted(probes) if -1 <= i < n and explorer.blocks_at(i).segments != rep.blocks_at(i).segments
            ]
            bad_total += len(bad)
            verdict = "ok" if not bad else f"MISMATCH at {bad}"
            print(f"{Path(path).name} device {dev.device}: {n:,} events, {verdict} (store {made:.2f} s)", flush=True)
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
