"""What the explore store costs and what it buys on one snapshot (docs/report.md, "Digging").

    .venv/bin/python scripts/explore_bench.py /work/shared/snapshots/huge_all_stacks.pickle.gz

Prints: the worker's extra time to make the store from the report's replay (checkpoints kept by
the same pass vs that pass alone), the store's size as written by the child, and the web side:
loading the store, a click (the state at an event), a zoom window and a block's stacks.
"""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.allocator.recorded import recorded_replay
from analysis.explore import StoredExplorer, checkpoint_events, explore_store, window
from analysis.reader import read_snapshot
from analysis.stacks import StackCatalog


def main(path: str) -> None:
    print("load", os.getloadavg())
    t = time.perf_counter()
    snap = read_snapshot(Path(path))
    print(f"read {time.perf_counter() - t:.1f} s")
    dev = snap.devices[0]
    n = len(dev.trace)
    t = time.perf_counter()
    recorded_replay(snap, dev)
    plain = time.perf_counter() - t
    t = time.perf_counter()
    rep = recorded_replay(snap, dev, keep_at=checkpoint_events(n))
    kept = time.perf_counter() - t
    t = time.perf_counter()
    store = explore_store(snap, dev, StackCatalog(snap.stacks), rep)
    made = time.perf_counter() - t
    buf = io.BytesIO()
    t = time.perf_counter()
    np.savez(buf, **store)  # type: ignore[arg-type]
    saved = time.perf_counter() - t
    print(
        f"{n:,} events, {len(checkpoint_events(n)) + 2} checkpoints: replay {plain:.1f} s, with checkpoints "
        f"{kept:.1f} s, store {made:.1f} s, npz write {saved:.1f} s, {buf.tell():,} bytes"
    )
    del snap, rep
    t = time.perf_counter()
    arrays = np.load(io.BytesIO(buf.getvalue()), allow_pickle=False)
    explorer = StoredExplorer({k: arrays[k] for k in arrays.files})
    print(f"web: load the store {time.perf_counter() - t:.2f} s")
    for i in (1_500_000, 16_383, 16_383 + 16_383, n - 1):
        t = time.perf_counter()
        state = explorer.state_at(i)
        blocks = sum(len(s["blocks"]) for s in state["segments"])
        print(f"web: state at {i:,} ({blocks:,} blocks) {time.perf_counter() - t:.3f} s")
    cols, labels = explorer.columns(), explorer.labels()
    t = time.perf_counter()
    out = window(cols, labels, 0, n, 1200)
    print(f"web: zoom window, whole trace at 1200 px ({out['points']} points) {time.perf_counter() - t:.3f} s")
    alloc = int(np.flatnonzero(cols["action"] == 0)[n // 4])
    t = time.perf_counter()
    info = explorer.block(alloc)
    print(f"web: block {alloc:,} ({len(info['alloc_frames'])} frames) {time.perf_counter() - t:.3f} s")
    print("load", os.getloadavg())


if __name__ == "__main__":
    main(sys.argv[1])
