"""A series of runs of one workload, built from one real capture by a seeded transformation.

Why built and not captured: the captures hold no repeat runs of one workload (the ``rand_*``
seeds draw different op streams, and the device machines are not ours to use from the tests), so
the gate's noise model (``analysis/noise.py``) is shown on runs made from
``tests/fixtures/resnet_nocap_default.pickle.gz`` (a ResNet trained on an H200, no cap, no OOM; the
same checks run on ``vit_nocap_default``, ``SECOND``):

- **a repeat run** (seed ``s``): at the moment of the real peak (the event where allocated memory
  is highest), each of the ``JITTERED`` largest stacks held there gets one more block allocated
  by the very same frames, of ``uniform(0, JITTER)`` (``random.Random(s)``) times the bytes that
  stack holds: the extra activations of a longer batch, as variable-length inputs give. Each
  block has its own new segment and is freed, with its segment, right after the later of the two
  peaks (allocated, reserved), so both peaks carry it and the final state is the capture's own;
- **commit c of a leak**: the same, plus one more block in the stack ``LEAKING`` (the largest at
  the peak) of ``c x LEAK_SHARE`` (3%) of that stack's bytes: a leak that adds 3% of the stack
  a commit.

Every figure the tests assert comes from the ordinary pipeline (``build_report`` then
``analysis.runs.summarise``) on these files; nothing is computed on the side.
"""

from __future__ import annotations

import copy
import gzip
import io
import pickle
import random
from pathlib import Path
from typing import Any

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "resnet_nocap_default.pickle.gz"
# A second workload for the same checks: a ViT trained on an H200, no cap, no OOM.
SECOND = CAPTURE.with_name("vit_nocap_default.pickle.gz")
JITTERED = 4
JITTER = 0.04
LEAKING = 0
LEAK_SHARE = 0.03
_SEGMENT = 2 * 2**20  # torch rounds a large block's segment up to 2 MiB


def _load(capture: Path) -> dict[str, Any]:
    with gzip.open(capture, "rb") as fh:
        return pickle.load(fh)


def _peak_and_stacks(trace: list[dict[str, Any]]) -> tuple[int, list[tuple[tuple, int]]]:
    """The index of the event after which allocated memory is highest, and the stacks (frame
    tuples) live there with their bytes, the largest first."""
    live: dict[int, dict[str, Any]] = {}
    allocated = best = 0
    best_index = -1
    best_live: dict[int, dict[str, Any]] = {}
    for index, event in enumerate(trace):
        if event["action"] == "alloc":
            live[event["addr"]] = event
            allocated += event["size"]
        elif event["action"] == "free_completed" and event["addr"] in live:
            allocated -= live.pop(event["addr"])["size"]
        if allocated > best:
            best, best_index, best_live = allocated, index, dict(live)
    stacks: dict[tuple, int] = {}
    for event in best_live.values():
        key = tuple((f["filename"], f["line"], f["name"]) for f in event["frames"])
        if key:
            stacks[key] = stacks.get(key, 0) + event["size"]
    return best_index, sorted(stacks.items(), key=lambda kv: -kv[1])


def _reserved_peak(trace: list[dict[str, Any]]) -> int:
    """The index of the event after which reserved memory (the trace's segments) is highest."""
    reserved = best = 0
    best_index = -1
    for index, event in enumerate(trace):
        if event["action"] == "segment_alloc":
            reserved += event["size"]
        elif event["action"] == "segment_free":
            reserved -= event["size"]
        if reserved > best:
            best, best_index = reserved, index
    return best_index


def _frames_of(trace: list[dict[str, Any]], key: tuple) -> list[dict[str, Any]]:
    for event in trace:
        if event["action"] == "alloc" and tuple((f["filename"], f["line"], f["name"]) for f in event["frames"]) == key:
            return copy.deepcopy(event["frames"])
    raise LookupError(key)


def variant(seed: int, commit: int = 0, capture: Path = CAPTURE) -> bytes:
    """The gzipped snapshot of repeat ``seed`` at leak commit ``commit`` (0: no leak) of ``capture``."""
    snap = _load(capture)
    trace = next(t for t in snap["device_traces"] if t)
    peak, stacks = _peak_and_stacks(trace)
    rng = random.Random(seed)  # noqa: S311 - a seeded test series, not a secret
    sizes = [(key, int(held * rng.uniform(0, JITTER))) for key, held in stacks[:JITTERED]]
    if commit:
        key, held = stacks[LEAKING]
        sizes.append((key, int(held * LEAK_SHARE * commit)))
    base = trace[peak]
    addr = max(e.get("addr", 0) for e in trace) + 2**30
    allocs, frees = [], []
    for key, size in sizes:
        size = max(512, -(-size // 512) * 512)
        segment = -(-size // _SEGMENT) * _SEGMENT
        frames = _frames_of(trace, key)
        common = {"stream": base["stream"], "time_us": base["time_us"], "compile_context": "N/A", "user_metadata": ""}
        allocs += [
            common | {"action": "segment_alloc", "addr": addr, "size": segment, "frames": frames},
            common | {"action": "alloc", "addr": addr, "size": size, "frames": frames},
        ]
        frees += [
            common | {"action": "free_requested", "addr": addr, "size": size, "frames": frames},
            common | {"action": "free_completed", "addr": addr, "size": size, "frames": frames},
            common | {"action": "segment_free", "addr": addr, "size": segment, "frames": frames},
        ]
        addr += segment + 2**30
    last = max(peak, _reserved_peak(trace))
    trace[last + 1 : last + 1] = frees
    trace[peak + 1 : peak + 1] = allocs
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as fh:
        pickle.dump(snap, fh)
    return buffer.getvalue()


def summary(seed: int, commit: int = 0, capture: Path = CAPTURE) -> dict[str, Any]:
    """The run summary (``oomscope.run/1``) of ``variant(seed, commit, capture)`` through the ordinary pipeline."""
    from analysis.report import build_report
    from analysis.runs import RankInput, summarise

    name = f"{capture.name.split('.')[0]}_seed{seed}_commit{commit}.pickle.gz"
    report = build_report(variant(seed, commit, capture), filename=name)
    return summarise([RankInput(rank=0, report=report)]).to_dict()
