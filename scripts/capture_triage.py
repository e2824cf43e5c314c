"""Real CUDA OOM messages that the bench's captures lack, for the text-only triage (issue 18, item 5).

Run on a GPU machine:  python3 scripts/capture_triage.py OUTDIR [case ...]

Every capture in tests/fixtures/ ran under a per-process cap ("... allowed;" in its message). Users
mostly run without one, and the device fills: these cases write what such a run prints. Each case runs in
its own process and writes CASE.truth.json with the capture truth keys the triage reads (`oom_message`,
`memory_summary`, `memory_summary_abbreviated` and `memory_stats`, taken in the except block while the
failing frame's tensors are still alive; `cap_bytes`, `total_memory`, `torch`), plus `holder` (the other
process, where one held memory: its pid and what it reserved), `pid` (this process's own), `kept_tensors`
and `large_free_blocks` (count, bytes and largest of the large pool's free blocks, from
`torch.cuda.memory_snapshot()`: what the text cannot give, for the tests' bounds). No snapshot is written:
the triage reads text only.

Cases:
  triage_device_full        no cap, alone on the device; every 1 GiB segment is split by a 600 MiB
                            tensor that stays, so 424 MiB of each segment is reserved but unallocated
                            when the device fills and the next 1 GiB request fails (fragmentation).
  triage_other_process      no cap; another process reserves ~100 GiB first, then this one keeps
                            2 GiB tensors until the device is full (the memory is the other process's).
  triage_other_process_cap  a 60 GiB cap, and another process holding ~100 GiB: the device fills
                            before the cap is reached, so "allowed" is in the message but is not the limit.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20

CASES = ("triage_device_full", "triage_other_process", "triage_other_process_cap")


def _holder(hold_bytes: int, ready: mp.synchronize.Event, done: mp.synchronize.Event, out: mp.Queue) -> None:
    import torch

    held = torch.empty(hold_bytes, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    out.put({"pid": os.getpid(), "hold_bytes": hold_bytes, "reserved_bytes": torch.cuda.memory_reserved()})
    ready.set()
    done.wait(timeout=300)
    del held


def _run_case(case: str, outdir: str) -> None:
    import torch

    ctx = mp.get_context("spawn")
    holder = None
    done = ctx.Event()
    holder_info = None
    if case.startswith("triage_other_process"):
        ready = ctx.Event()
        q: mp.Queue = ctx.Queue()
        holder = ctx.Process(target=_holder, args=(100 * GIB, ready, done, q))
        holder.start()
        if not ready.wait(timeout=120):
            raise SystemExit(f"{case}: the holder process did not start")
        holder_info = q.get(timeout=10)
    total = torch.cuda.get_device_properties(0).total_memory
    cap_bytes = None
    if case == "triage_other_process_cap":
        cap_bytes = 60 * GIB
        torch.cuda.set_per_process_memory_fraction(cap_bytes / total)
    kept: list[torch.Tensor] = []
    truth: dict[str, object] = {}
    try:
        while True:
            if case == "triage_device_full":
                probe = torch.empty(GIB, dtype=torch.uint8, device="cuda")
                del probe  # back to the cache, whole; the next request splits it
                kept.append(torch.empty(600 * MIB, dtype=torch.uint8, device="cuda"))
            else:
                kept.append(torch.empty(2 * GIB, dtype=torch.uint8, device="cuda"))
    except torch.cuda.OutOfMemoryError as e:
        truth["oom_message"] = str(e)
        truth["memory_stats"] = dict(torch.cuda.memory_stats())
        truth["memory_summary"] = torch.cuda.memory_summary()
        truth["memory_summary_abbreviated"] = torch.cuda.memory_summary(abbreviated=True)
        # What the text cannot give, for the tests' bounds: the free blocks themselves.
        free = [
            b["size"]
            for seg in torch.cuda.memory_snapshot()
            if seg["segment_type"] == "large"
            for b in seg["blocks"]
            if b["state"] == "inactive"
        ]
        truth["large_free_blocks"] = {"count": len(free), "bytes": sum(free), "largest": max(free, default=0)}
    truth.update(
        case=case,
        pid=os.getpid(),
        holder=holder_info,
        cap_bytes=cap_bytes,
        total_memory=total,
        kept_tensors=len(kept),
        torch=torch.__version__,
        device=torch.cuda.get_device_name(0),
    )
    del kept
    done.set()
    if holder is not None:
        holder.join(timeout=60)
    Path(outdir, f"{case}.truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
    print(case, "ok:", str(truth.get("oom_message"))[:400])


def main() -> None:
    outdir = sys.argv[1]
    Path(outdir).mkdir(parents=True, exist_ok=True)
    for case in sys.argv[2:] or CASES:
        # One process per case: the cap and the allocator's cache must not carry over.
        p = mp.get_context("spawn").Process(target=_run_case, args=(case, outdir))
        p.start()
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"{case} failed with exit code {p.exitcode}")


if __name__ == "__main__":
    main()
