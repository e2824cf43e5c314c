"""The whole-device ledger against torch's own figures, on every snapshot with an OOM message.

For each ``*.pickle.gz`` under a folder whose ``.truth.json`` has torch's ``oom_message`` (and the
device's ``total_memory``), the device's ledger (``analysis.ledger.device_ledger``, the report's own
call) is made from the recorded replay and the message, and compared:

- the rows add up to ``total_bytes``, which is the device's ``total_memory`` within 1%;
- PyTorch's rows are the message's "allocated by PyTorch" (with the private pools as torch counts
  them) and "reserved but unallocated", this process's rows its "this process has X memory in use",
  the free row the message's "X is free", each within 1% (rows under 1 GiB: within the message's
  rounding, 5 MiB, instead);

and prints the worst relative error of each, and any file that misses.

    python3 scripts/ledger_bench.py [FOLDER ...]      # default: tests/fixtures (recursively)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analysis.allocator.config import AllocatorConfig  # noqa: E402
from analysis.allocator.recorded import recorded_replay  # noqa: E402
from analysis.ledger import Ledger, device_ledger  # noqa: E402
from analysis.limits import MiB, OomMessage, parse_oom_message  # noqa: E402
from analysis.model import OOM  # noqa: E402
from analysis.reader import read_snapshot  # noqa: E402
from analysis.stacks import StackCatalog  # noqa: E402

SHARE = 0.01
ROUNDING = 5 * MiB  # half the step of a figure torch prints in GiB with two decimals


def checks(ledger: Ledger, msg: OomMessage, pools_allocated: int, total_memory: int) -> dict[str, tuple[int, int]]:
    """(ours, theirs) per compared figure."""
    r = {row.id: row.bytes for row in ledger.rows}
    out: dict[str, tuple[int, int]] = {"total": (int(ledger.total_bytes or 0), total_memory)}
    reserved = r["allocated"] + r["cached_free"] + r["private_pools"]
    if msg.allocated is not None:
        # torch 2.11 counts a private pool's free bytes as allocated ("with X allocated in private pools").
        pooled = r["private_pools"] if msg.private_pools is not None else pools_allocated
        out["allocated"] = (r["allocated"] + pooled, msg.allocated.value)
    if msg.reserved is not None and msg.allocated is not None:
        out["cached_free"] = (reserved - out["allocated"][0], (msg.reserved - msg.allocated).value)
    if msg.process_in_use is not None:
        out["this_process"] = (reserved + r["non_pytorch"], msg.process_in_use.value)
    if msg.device_free is not None:
        out["free"] = (r["free"], msg.device_free.value)
    if msg.other_processes:
        # The listed processes (the row's parts the message gives); what they leave unexplained is its
        # "unlisted" part, inferred: NVML's per-process figures and the free memory are read apart.
        listed = next(row for row in ledger.rows if row.id == "other_processes")
        parts = [p.bytes for p in listed.parts if p.source == "message"] if listed.parts else [listed.bytes]
        out["other_processes_listed"] = (sum(parts), sum(f.value for _, f in msg.other_processes))
    return out


def unlisted(ledger: Ledger) -> int:
    row = next(row for row in ledger.rows if row.id == "other_processes")
    return (
        sum(p.bytes for p in row.parts if p.id == "unlisted")
        if row.parts
        else (row.bytes if row.source == "inferred" else 0)
    )


def one(path: Path) -> dict[str, Any] | None:
    truth_path = path.with_name(path.name.replace(".pickle.gz", ".truth.json"))
    if not truth_path.exists():
        return None
    truth = json.loads(truth_path.read_text())
    if not truth.get("oom_message") or not truth.get("total_memory"):
        return None
    msg = parse_oom_message(truth["oom_message"])
    snap = read_snapshot(path)
    devices = [d for d in snap.devices if (d.trace.action == OOM).any()]
    if len(devices) != 1:
        return None
    dev = devices[0]
    oom_index = int((dev.trace.action == OOM).nonzero()[0][-1])
    replay = recorded_replay(snap, dev)
    cfg = AllocatorConfig.from_settings(snap.settings.raw, snap.settings.conf)
    ledger = device_ledger(snap, dev, replay, StackCatalog(snap.stacks), cfg, oom_index, msg)
    state = replay.blocks_at(oom_index)
    pooled = sum(b.size for s in state.segments if s.pool != 0 for b in s.blocks if b.state == "active_allocated")
    figures = checks(ledger, msg, pooled, int(truth["total_memory"]))
    adds_up = ledger.total_bytes is not None and sum(r.bytes for r in ledger.rows) == ledger.total_bytes
    missed = [
        k for k, (ours, theirs) in figures.items() if abs(ours - theirs) > max(SHARE * theirs, ROUNDING) or not adds_up
    ]
    # Where the message's own figures pass the device's size (processes read at another instant than the
    # free memory), other processes are what the rest leaves: said in the note, counted apart.
    overshoot = "pass the device's" in ledger.note
    return {
        "file": str(path),
        "figures": figures,
        "adds_up": adds_up,
        "missed": [] if overshoot and missed == ["other_processes_listed"] else missed,
        "overshoot": overshoot,
        "unlisted": unlisted(ledger),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="*", type=Path, default=[ROOT / "tests" / "fixtures"])
    args = parser.parse_args(argv)
    results = [r for folder in args.folders for p in sorted(folder.rglob("*.pickle.gz")) if (r := one(p)) is not None]
    worst: dict[str, float] = {}
    for r in results:
        for k, (ours, theirs) in r["figures"].items():
            worst[k] = max(worst.get(k, 0.0), abs(ours - theirs) / max(1, theirs))
    missed = [r for r in results if r["missed"]]
    print(f"{len(results)} snapshots with an OOM message: {sum(r['adds_up'] for r in results)} add up to their total")
    for k, v in sorted(worst.items()):
        print(f"  {k}: worst relative error {v:.4%}")
    spread = sorted(r["unlisted"] for r in results)
    if spread:
        print(
            f"  memory of no listed process (inferred): median {spread[len(spread) // 2] / MiB:.1f} MiB, "
            f"largest {spread[-1] / MiB:.1f} MiB"
        )
    for r in missed:
        print(f"MISSED {r['file']}: {', '.join(r['missed'])} {r['figures']}")
    over = [r for r in results if r["overshoot"]]
    if over:
        below = max(
            1 - r["figures"]["other_processes_listed"][0] / r["figures"]["other_processes_listed"][1] for r in over
        )
        print(
            f"{len(over)} messages whose own figures pass the device's size beyond their rounding: other processes "
            f"shown as what the rest leaves, up to {below:.1%} below the listed figures"
        )
    print(f"{len(results) - len(missed)}/{len(results)} within 1% (or the message's rounding) on every figure")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
