"""The same first change without the OOM message (issue 32, item 6): what the trace alone proves gives the answer
the message would; where only the message can tell, the report says so rather than naming a cause it cannot
prove. SYNTHETIC cases over real captures (each says what was changed): an OOM entry whose ``device_free`` says
the device itself was full."""

from __future__ import annotations

import functools
import gzip
import pickle
from pathlib import Path
from typing import Any

from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MIB, GIB = 1 << 20, 1 << 30
# gpu_grow_oom's own message (3 GiB cap) rewritten for a device that another process filled: no cap, 64 MiB free.
TAKEN_MESSAGE = (
    "CUDA out of memory. Tried to allocate 84.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which 64.00 MiB "
    "is free. Including non-PyTorch memory, this process has 3.65 GiB memory in use. Process 4242 has 136.09 GiB "
    "memory in use. Of the allocated memory 2.87 GiB is allocated by PyTorch, and 57.62 MiB is reserved by PyTorch "
    "but unallocated."
)


def _grow_with_full_device() -> bytes:
    """SYNTHETIC: gpu_grow_oom (a growing batch under a 3 GiB cap) with its OOM entry's device_free set to 64 MiB:
    the device itself had no room left for the 84 MiB request, as when another process takes it."""
    snap = pickle.loads(gzip.decompress((FIXTURES / "gpu_grow_oom.pickle.gz").read_bytes()))  # our own fixture
    ooms = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
    assert len(ooms) == 1
    ooms[0]["device_free"] = 64 * MIB
    return pickle.dumps(snap)


def _empty_cache_then_taken() -> bytes:
    """SYNTHETIC: gpu_empty_cache (it reserved 4.46 GiB, gave some back with empty_cache and ended at 3.01 GiB)
    with an OOM entry added at its end: a 1 GiB request refused with 200 MiB free on the device."""
    snap = pickle.loads(gzip.decompress((FIXTURES / "gpu_empty_cache.pickle.gz").read_bytes()))  # our own fixture
    trace = snap["device_traces"][0]
    last = trace[-1]
    trace.append(
        {
            "action": "oom",
            "device_free": 200 * MIB,
            "size": GIB,
            "stream": last["stream"],
            "time_us": int(last["time_us"]) + 1,
            "compile_context": "N/A",
            "user_metadata": "",
            "frames": list(last.get("frames") or []),
        }
    )
    return pickle.dumps(snap)


@functools.cache
def _device(case: str, with_message: bool) -> dict[str, Any]:
    data = _grow_with_full_device() if case == "grow" else _empty_cache_then_taken()
    report = build_report(data, oom_message=TAKEN_MESSAGE if with_message else None)
    return next(d for d in report["devices"] if d.get("oom"))  # type: ignore[no-any-return]


def test_with_the_message_another_process_is_named() -> None:
    dev = _device("grow", with_message=True)
    assert dev["decision"]["cause"] == "outside_memory"
    assert "PID 4242" in dev["decision"]["headline"]


def test_without_it_the_growth_is_not_the_answer_and_the_message_is_asked_for() -> None:
    """Only the message can tell whether the growth or another process filled the device: the decision checks
    the device first (the same first look the message's answer starts with) and says what is missing."""
    dev = _device("grow", with_message=False)
    assert dev["oom"]["limit_kind"] == "device-full" and dev["oom"]["limit_source"] == "inferred"
    growth = next(c for c in dev["diagnosis"]["causes"] if c["id"] == "growing_workload")
    assert growth["explains_oom"] is False
    assert "only the OOM message says" in growth["headline"]
    assert dev["decision"].get("cause") is None
    assert dev["decision"]["change"]["id"] == "check_device"
    assert "GPU itself was full" in dev["decision"]["headline"]


def test_what_the_trace_alone_proves_names_memory_outside_the_cache() -> None:
    """The process once reserved more than it held at the OOM plus the device's free memory then: the difference
    is memory outside this process's cache, named without the message."""
    dev = _device("empty_cache", with_message=False)
    summary, oom = dev["summary"], dev["oom"]
    cause = next(c for c in dev["diagnosis"]["causes"] if c["id"] == "outside_memory")
    taken = summary["peak_reserved_bytes"] - oom["reserved_bytes"] - 200 * MIB
    assert cause["figures"]["outside_bytes"] == taken
    assert cause["figures"]["outside_is_lower_bound"] is True
    assert taken >= GIB  # more than the request: without it, the request would have had room
    assert dev["decision"]["cause"] == "outside_memory"
    assert "nvidia-smi" in dev["decision"]["change"]["line"]
