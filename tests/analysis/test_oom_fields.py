"""Every field of the report's ``oom`` object, each against a source that does not come from oom.py.

Sources: the process's own ``torch.cuda.memory_stats()`` at the dump (``.truth.json``), the text
of PyTorch's OOM message (figures with two decimals, so +-0.005 of their unit), the trace's own
columns, and hand-computed cases whose arithmetic is in the comments.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.allocator import LimitEstimate, whatif
from analysis.allocator.config import AllocatorConfig
from analysis.allocator.states import AllocatorState, BlockState, SegmentState
from analysis.limits import Limit, choose_limit, parse_oom_message, sidecar_limit
from analysis.model import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    Trace,
)
from analysis.oom import UsableFree, explain_oom, flush_before, oom_indices, verdict
from analysis.reader import read_snapshot
from analysis.readout import size
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10
UNITS = {"GiB": GiB, "MiB": MiB, "KiB": KiB}
OOM_CASES = [
    "frag_oom",
    "gpt_varlen_expandable",
    "gpt_varlen_maxsplit256",
    "gpt_varlen_oom",
    "gpu_client_oom",
    "gpu_expandable_oom",
    "gpu_grow_oom",
    "gpu_maxsplit_oom",
    "grow_gpt2_default",
    "grow_resnet_default",
]


@cache
def truth(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{case}.truth.json").read_text())
    return data


@cache
def oom_of(case: str, limit: int | None = None) -> dict[str, Any]:
    oom: dict[str, Any] | None = build_report(FIXTURES / f"{case}.pickle.gz", limit=limit, jobs=1)["devices"][0]["oom"]
    assert oom is not None
    return oom


@cache
def trace_of(case: str) -> Trace:
    return read_snapshot(FIXTURES / f"{case}.pickle.gz").devices[0].trace


def figure(case: str, pattern: str) -> tuple[float, float]:
    """A figure of the OOM message in bytes, and its rounding (half a unit of the last decimal)."""
    m = re.search(pattern.replace("SIZE", r"([\d.]+) (GiB|MiB|KiB)"), truth(case)["oom_message"])
    assert m, pattern
    unit = UNITS[m.group(2)]
    return float(m.group(1)) * unit, 0.005 * unit


def stats(case: str) -> dict[str, Any]:
    s: dict[str, Any] = truth(case)["memory_stats"]
    return s


def test_every_oom_fixture_is_listed() -> None:
    assert (
        sorted(
            c
            for c in (p.name.removesuffix(".truth.json") for p in FIXTURES.glob("*.truth.json"))
            if truth(c).get("oom_message")
        )
        == OOM_CASES
    )


# Recorded under expandable segments: the allocator checks reserved + the request's allocation
# size, then maps whole pages (20 MiB in the large pool), so reserved memory can end above what any
# check let through, and above the cap: gpu_expandable_oom peaked at 3,231,711,232 B against its
# 3,221,225,472 B (3 GiB) cap.
EXPANDABLE = {"gpt_varlen_expandable", "gpu_expandable_oom"}
EXPANDABLE_OVER_CAP = {"gpu_expandable_oom"}
PAGE = 20 * MiB


def test_inferred_limit_is_a_lower_bound_of_the_cap_with_expandable_segments() -> None:
    # docs/contract.md: an inferred per-process cap is labelled a lower bound, so it must be one.
    # gpu_expandable_oom: the peak reserved 3,231,711,232 B is 10 MiB above the message's "3.00 GiB
    # allowed" (3,221,225,472); the limit is the most a check let through (3,214,934,016 B), below it.
    oom = oom_of("gpu_expandable_oom")
    cap, _ = figure("gpu_expandable_oom", r"SIZE allowed")
    assert oom["limit_is_lower_bound"] is True
    assert stats("gpu_expandable_oom")["reserved_bytes.all.peak"] > cap
    assert oom["limit_bytes"] <= cap


@pytest.mark.parametrize("case", sorted(EXPANDABLE))
def test_what_uses_the_inferred_limit_still_reproduces_the_recorded_oom(case: str) -> None:
    # The what-ifs run under the report's limit: under the recorded settings the replay must fail at
    # the request where the real run failed (the trace's last OOM event), and nowhere before it.
    # Every check the run passed let through at most the limit (so none is refused earlier), and the
    # failing one needed more than the real cap, itself at least the limit.
    oom = oom_of(case)
    result = whatif(read_snapshot(FIXTURES / f"{case}.pickle.gz"), 0, "", oom["limit_bytes"])
    assert result["oom_event_index"] == oom["event_index"] == int(np.flatnonzero(trace_of(case).action == OOM)[-1])


def no_segment_event_after(case: str, index: int) -> bool:
    """Reserved memory at the dump is reserved memory at the OOM when no segment changed after it."""
    after = trace_of(case).action[index + 1 :]
    return not np.isin(after, [SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP]).any()


# --------------------------------------------------------------------------- the real OOMs


@pytest.mark.parametrize("case", OOM_CASES)
def test_where_and_what_was_requested(case: str) -> None:
    oom, t = oom_of(case), trace_of(case)
    # The report explains the last OOM of the trace; memory_stats counts every one (frag_oom: 2).
    assert oom["event_index"] == int(np.flatnonzero(t.action == OOM)[-1])
    assert oom["ooms_in_trace"] == stats(case)["num_ooms"]
    assert oom["time_us"] == int(t.time_us[oom["event_index"]])
    # "Tried to allocate X" is the segment the allocator wanted for the (rounded) request.
    tried, tol = figure(case, r"Tried to allocate SIZE")
    assert AllocatorConfig().allocation_size(oom["requested_bytes"]) == pytest.approx(tried, abs=tol)
    assert oom["requested_bytes"] % 512 == 0  # a rounded block size


@pytest.mark.parametrize("case", OOM_CASES)
def test_memory_at_the_oom_against_the_message_and_memory_stats(case: str) -> None:
    oom = oom_of(case)
    free, tol = figure(case, r"of which SIZE is free")
    assert oom["device_free_bytes"] == pytest.approx(free, abs=tol)
    allocated, tol_a = figure(case, r"SIZE is allocated by PyTorch")
    assert oom["allocated_bytes"] == pytest.approx(allocated, abs=tol_a)
    unallocated, tol_u = figure(case, r"SIZE is reserved by PyTorch but unallocated")
    # The cache's free bytes are what torch calls "reserved but unallocated".
    assert oom["cached_free_bytes"] == pytest.approx(unallocated, abs=tol_u)
    assert oom["reserved_bytes"] == pytest.approx(allocated + unallocated, abs=tol_a + tol_u)
    # Exact: no segment was made or released after the OOM, so memory_stats' current reserved
    # memory at the dump is the reserved memory at the OOM, to the byte.
    assert no_segment_event_after(case, oom["event_index"])
    assert oom["reserved_bytes"] == stats(case)["reserved_bytes.all.current"]
    assert oom["largest_free_block_bytes"] <= oom["cached_free_bytes"]


@pytest.mark.parametrize("case", OOM_CASES)
def test_inferred_limit_headroom_shortfall_and_verdict(case: str) -> None:
    oom = oom_of(case)
    peak, current = stats(case)["reserved_bytes.all.peak"], stats(case)["reserved_bytes.all.current"]
    free, _ = figure(case, r"of which SIZE is free")
    # The device had far more free memory than the request: a per-process cap refused it, and the
    # peak reserved memory (memory_stats' own peak) is the lower bound the report uses.
    assert free > oom["requested_bytes"]
    assert (oom["limit_source"], oom["limit_inference"]) == ("inferred", "cap-lower-bound")
    assert oom["limit_is_lower_bound"] is True
    limit = oom["limit_bytes"]
    cap, _ = figure(case, r"SIZE allowed")
    assert limit <= cap  # a lower bound of the real cap, with or without expandable segments
    assert (peak > cap) == (case in EXPANDABLE_OVER_CAP)
    if case in EXPANDABLE:
        # The most a check let through (reserved + allocation size) is the peak less at most one
        # page's rounding: peak = before + mapped, mapped <= allocation size + PAGE - 1.
        assert peak - PAGE < limit
    else:
        # cudaMalloc'd segments: reserved memory only grows by what a check let through, so the
        # peak (memory_stats' own) is the limit.
        assert limit == peak
    # headroom = max(0, limit - reserved), reserved = memory_stats' current (it did not move after the OOM).
    assert oom["headroom_bytes"] == max(0, limit - current)
    # shortfall = allocated + requested - limit, with allocated from the message (+-rounding).
    allocated, tol = figure(case, r"SIZE is allocated by PyTorch")
    over = allocated + oom["requested_bytes"] - limit
    assert oom["shortfall_bytes"] == pytest.approx(max(0.0, over), abs=tol)
    if abs(over) > tol:  # the message's rounding cannot flip the side: the request-level verdict follows
        assert oom["request_verdict"] == ("capacity" if over > 0 else "fragmentation")
        assert (oom["shortfall_bytes"] == 0) == (over < 0)


@pytest.mark.parametrize("case", OOM_CASES)
def test_with_the_real_cap_given(case: str) -> None:
    # The message names the real cap ("4.00 GiB allowed"): given as --limit, it is the limit.
    cap_f, _ = figure(case, r"SIZE allowed")
    cap = round(cap_f)
    oom = oom_of(case, cap)
    assert (oom["limit_bytes"], oom["limit_source"]) == (cap, "given")
    current = stats(case)["reserved_bytes.all.current"]
    # headroom = cap - reserved, hand-computed: e.g. frag_oom 4,294,967,296 - 3,156,213,760
    # = 1,138,753,536 B (1.06 GiB).
    # gpu_expandable_oom reserved 3,231,711,232 B, 10 MiB over its 3 GiB cap: headroom 0, not negative.
    assert oom["headroom_bytes"] == max(0, cap - current)
    if case == "frag_oom":
        assert oom["headroom_bytes"] == 1_138_753_536
    # That headroom is why the allocator refused: less than the segment it needed.
    tried, tol = figure(case, r"Tried to allocate SIZE")
    assert oom["headroom_bytes"] < tried + tol
    allocated, tol_a = figure(case, r"SIZE is allocated by PyTorch")
    over = allocated + oom["requested_bytes"] - cap
    assert oom["shortfall_bytes"] == pytest.approx(max(0.0, over), abs=tol_a)
    if abs(over) > tol_a:
        assert oom["request_verdict"] == ("capacity" if over > 0 else "fragmentation")
    # gpt_varlen_expandable: 6.18 GiB allocated + 824 MiB fit in 7.00 GiB (6.985 GiB, 0.015 GiB
    # clear of the message's rounding): under the real cap the memory existed, not in one piece.
    if case == "gpt_varlen_expandable":
        assert oom["request_verdict"] == "fragmentation"
        assert oom["shortfall_bytes"] == 0


def test_frag_oom_flush_against_memory_stats() -> None:
    # frag_oom's only cudaFree calls were the flush before its last OOM, so memory_stats' totals
    # over the whole run are that flush: num_device_free = 81 segments, reserved_bytes.all.freed
    # = 1,119,879,168 B, which is also peak - current = 4,276,092,928 - 3,156,213,760.
    flush = oom_of("frag_oom")["flush"]
    s = stats("frag_oom")
    assert flush["segments_released"] == s["num_device_free"] == 81
    assert flush["released_bytes"] == s["reserved_bytes.all.freed"] == 1_119_879_168
    assert flush["released_bytes"] == s["reserved_bytes.all.peak"] - s["reserved_bytes.all.current"]
    # The burst is contiguous and ends right before the OOM: 81 segment_free + the frees it completed.
    assert flush["first_event"] + flush["events"] == oom_of("frag_oom")["event_index"]
    assert flush["events"] == flush["segments_released"] + flush["frees_completed"]
    t = trace_of("frag_oom")
    window = t.action[flush["first_event"] : oom_of("frag_oom")["event_index"]]
    assert int((window == FREE_COMPLETED).sum()) == flush["frees_completed"] >= 1
    assert int(t.action[flush["first_event"] - 1]) not in (FREE_COMPLETED, SEGMENT_FREE, SEGMENT_UNMAP)


@pytest.mark.parametrize("case", OOM_CASES)
def test_explanation_names_the_figures_of_the_message(case: str) -> None:
    oom = oom_of(case)
    text = oom["explanation"]
    tried, _ = figure(case, r"Tried to allocate SIZE")
    allocated, _ = figure(case, r"SIZE is allocated by PyTorch")
    # The explanation rounds the exact figures to 0.01 GiB; the message's are within 0.005 GiB.
    named = [float(x) for x in re.findall(r"([\d.]+) GiB", text)]
    assert any(abs(x * GiB - oom["requested_bytes"]) <= 0.005 * GiB for x in named)
    assert any(abs(x * GiB - allocated) <= 0.01 * GiB for x in named)
    assert abs(tried - oom["requested_bytes"]) <= 2 * MiB + 0.005 * GiB
    # The explanation's first sentence is the request-level rule (the step-level verdict follows it).
    if oom["request_verdict"] == "fragmentation":
        assert "would have fit" in text
    else:
        assert "exceeds" in text


# --------------------------------------------------------------------------- hand-computed


def _trace(events: list[tuple[int, int, int]]) -> Trace:
    """A trace from (action, addr, size) rows; time_us = 1000 + index."""
    n = len(events)
    return Trace(
        action=np.asarray([e[0] for e in events], np.int8),
        addr=np.asarray([e[1] for e in events], np.int64),
        size=np.asarray([e[2] for e in events], np.int64),
        stream=np.zeros(n, np.int32),
        time_us=np.arange(1000, 1000 + n, dtype=np.int64),
        stack=np.full(n, -1, np.int32),
        pool=np.zeros(n, np.int32),
    )


# An alloc, its free_requested (not part of a flush), then the flush: a completed pending free,
# a 20 MiB segment_free, a 2 MiB segment_unmap, another completed free, and the OOM asking for
# 1.5 GiB with 8 GiB free on the device (an oom event stores device_free in addr).
FLUSHED = _trace(
    [
        (ALLOC, 0x1000, GiB),
        (FREE_REQUESTED, 0x1000, GiB),
        (FREE_COMPLETED, 0x1000, GiB),
        (SEGMENT_FREE, 0x9000, 20 * MiB),
        (SEGMENT_UNMAP, 0xA000, 2 * MiB),
        (FREE_COMPLETED, 0x2000, MiB),
        (OOM, 8 * GiB, 3 * GiB // 2),
    ]
)


def test_oom_indices_are_the_oom_events_as_int64() -> None:
    assert oom_indices(FLUSHED).tolist() == [6]
    assert oom_indices(FLUSHED).dtype == np.int64
    t = trace_of("frag_oom")
    # frag_oom: memory_stats counted 2 OOMs; both are in the trace, the last one is explained.
    assert len(oom_indices(t)) == stats("frag_oom")["num_ooms"] == 2
    assert int(oom_indices(t)[-1]) == oom_of("frag_oom")["event_index"]


def test_flush_before_hand_computed() -> None:
    # Events 2..5 are the burst (event 1, a free_requested, is not a flush action): 4 events,
    # 2 segments released, 20 MiB + 2 MiB = 23,068,672 B, 2 frees completed.
    assert flush_before(FLUSHED, 6) == {
        "first_event": 2,
        "events": 4,
        "segments_released": 2,
        "released_bytes": 22 * MiB,
        "frees_completed": 2,
    }
    # No burst: the event before the OOM is an alloc.
    assert flush_before(FLUSHED, 1) == {
        "first_event": 1,
        "events": 0,
        "segments_released": 0,
        "released_bytes": 0,
        "frees_completed": 0,
    }


def test_flush_before_stops_at_the_first_event() -> None:
    # The burst starts at event 0; the walk must stop there and not wrap around to the trailing
    # segment_free at the end (index -1).
    t = _trace([(SEGMENT_FREE, 0x9000, 2 * MiB), (OOM, GiB, MiB), (SEGMENT_FREE, 0xA000, 4 * MiB)])
    assert flush_before(t, 1) == {
        "first_event": 0,
        "events": 1,
        "segments_released": 1,
        "released_bytes": 2 * MiB,
        "frees_completed": 0,
    }


def _given(limit: int) -> Limit:
    chosen = choose_limit(given=limit, sidecar=None, message=None, inferred=None)
    assert chosen is not None
    return chosen


def _inferred(estimate: LimitEstimate) -> Limit:
    chosen = choose_limit(given=None, sidecar=None, message=None, inferred=estimate.stated())
    assert chosen is not None
    return chosen


def test_explain_oom_fragmentation_hand_computed() -> None:
    oom = explain_oom(
        FLUSHED,
        6,
        allocated=2 * GiB,
        reserved=7 * GiB // 2,
        cached_free=3 * GiB // 2,
        largest_free=256 * MiB,
        chosen=_given(4 * GiB),
        all_ooms=3,
    )
    # allocated 2 GiB + requested 1.5 GiB = 3.5 GiB <= 4 GiB given: fragmentation, no shortfall;
    # headroom = 4 GiB - 3.5 GiB reserved = 0.5 GiB = 536,870,912 B.
    assert oom["event_index"] == 6
    assert oom["time_us"] == 1006
    assert oom["requested_bytes"] == 1_610_612_736
    assert oom["device_free_bytes"] == 8 * GiB
    assert (oom["reserved_bytes"], oom["allocated_bytes"]) == (3_758_096_384, 2_147_483_648)
    assert (oom["cached_free_bytes"], oom["largest_free_block_bytes"]) == (1_610_612_736, 268_435_456)
    assert (oom["limit_bytes"], oom["limit_source"], oom["verdict"]) == (4 * GiB, "given", "fragmentation")
    assert oom["shortfall_bytes"] == 0
    assert oom["headroom_bytes"] == 536_870_912
    assert oom["ooms_in_trace"] == 3
    assert oom["flush"]["released_bytes"] == 22 * MiB
    assert oom["flush"]["frees_completed"] == 2
    assert oom["explanation"] == (
        "The request for 1.50 GiB would have fit: 2.00 GiB allocated plus the request is within the given "
        "limit of 4.00 GiB, and the cache held 1.50 GiB free, but its largest free block was 0.25 GiB and "
        "0.50 GiB was left to reserve. The memory existed, not in one piece."
    )


def test_explain_oom_capacity_on_a_full_device_hand_computed() -> None:
    # 3 GiB requested with 1 GiB free on the device: the device itself was full, the limit is
    # reserved + device_free = 3.5 + 1 = 4.5 GiB (LimitEstimate.device_full; its own rule is tested
    # in test_allocator). allocated 2 + 3 = 5 GiB > 4.5: capacity, shortfall 0.5 GiB = 536,870,912 B;
    # headroom 4.5 - 3.5 = 1 GiB.
    t = _trace([(ALLOC, 0x1000, GiB), (OOM, GiB, 3 * GiB)])
    oom = explain_oom(
        t,
        1,
        allocated=2 * GiB,
        reserved=7 * GiB // 2,
        cached_free=3 * GiB // 2,
        largest_free=GiB,
        chosen=_inferred(LimitEstimate(lower=4 * GiB, upper=None, device_full=9 * GiB // 2, evidence=1)),
    )
    assert (oom["limit_bytes"], oom["limit_source"], oom["limit_inference"]) == (
        9 * GiB // 2,
        "inferred",
        "device-full",
    )
    assert oom["verdict"] == "capacity"
    assert oom["shortfall_bytes"] == 536_870_912
    assert oom["headroom_bytes"] == GiB
    assert oom["ooms_in_trace"] == 1
    assert oom["flush"]["events"] == 0
    assert oom["explanation"] == (
        "The request for 3.00 GiB on top of 2.00 GiB allocated exceeds the device's memory of 4.50 GiB: "
        "no allocator setting can make it fit; the workload needs less memory."
    )


def test_explain_oom_cap_lower_bound_wording() -> None:
    t = _trace([(OOM, 64 * GiB, GiB)])
    # The device had 64 GiB free (no device_full): a cap refused it, at least the 3 GiB the trace let through.
    est = LimitEstimate(lower=3 * GiB, upper=4 * GiB, device_full=None, evidence=1)
    oom = explain_oom(t, 0, allocated=GiB, reserved=GiB, cached_free=0, largest_free=0, chosen=_inferred(est))
    # 1 + 1 = 2 GiB <= 3 GiB: fragmentation under the cap's lower bound; 2 GiB left to reserve.
    assert (oom["limit_bytes"], oom["limit_inference"], oom["verdict"]) == (3 * GiB, "cap-lower-bound", "fragmentation")
    assert oom["limit_is_lower_bound"] is True
    assert oom["headroom_bytes"] == 2 * GiB
    assert "within the per-process cap (at least what the trace shows it allowed) of 3.00 GiB" in oom["explanation"]
    assert "2.00 GiB was left to reserve" in oom["explanation"]


def test_boundaries_hand_computed() -> None:
    # LimitEstimate.stated: no full device, the cap's lower bound (200); a full device
    # (reserved 100 + free 9 = 109 at the OOM) is the limit, but never below what the trace
    # proves was allowed (max(109, 200) = 200; with lower 100, 109).
    assert LimitEstimate(200, 300, None, 1).stated() == (200, "cap-lower-bound")
    assert LimitEstimate(200, 300, 109, 1).stated() == (200, "device-full")
    assert LimitEstimate(100, 300, 109, 1).stated() == (109, "device-full")
    assert _given(0).bytes == 0  # a given limit of 0 is still given
    # verdict: allocated + requested exactly at the limit still fits.
    assert verdict(90, 10, 100) == "fragmentation"
    assert verdict(90, 11, 100) == "capacity"
    t = _trace([(OOM, 64 * GiB, 512)])

    def fields(allocated: int, reserved: int, limit: int) -> tuple[int, int, str]:
        o = explain_oom(
            t,
            0,
            allocated=allocated,
            reserved=reserved,
            cached_free=0,
            largest_free=0,
            chosen=_given(limit),
        )
        return o["shortfall_bytes"], o["headroom_bytes"], o["verdict"]

    # shortfall = max(0, allocated + 512 - limit): 0 at exactly the limit, 512 past it by 512.
    assert fields(1024, 1024, 1536) == (0, 512, "fragmentation")
    assert fields(1536, 1536, 1536) == (512, 0, "capacity")
    # headroom = max(0, limit - reserved): expandable pages may end above the limit, never negative.
    assert fields(1024, 2048, 1536) == (0, 0, "fragmentation")
    assert fields(1024, 1535, 1536) == (0, 1, "fragmentation")


# --------------------------------------------------------------------------- limit_kind, verdict_level,
# verdict_certain and the limit's wording (docs/contract.md, docs/report.md: "oom.limit_kind"
# per-process-cap | device-full | "" when unknown; "oom.verdict_level" request unless the report projected
# the step; "oom.verdict_certain" false only for "capacity" from a lower-bound limit).


def _explained(case: str, chosen: Limit) -> dict[str, Any]:
    """explain_oom for the case's last OOM, with the report's memory figures (checked against the message
    above) and ``chosen`` as the limit."""
    oom = oom_of(case)
    return explain_oom(
        trace_of(case),
        oom["event_index"],
        allocated=oom["allocated_bytes"],
        reserved=oom["reserved_bytes"],
        cached_free=oom["cached_free_bytes"],
        largest_free=oom["largest_free_block_bytes"],
        chosen=chosen,
    )


@pytest.mark.parametrize("case", OOM_CASES)
def test_limit_of_the_oom_message_is_the_per_process_cap_and_certain(case: str) -> None:
    # Every one of these messages names its cap ("4.00 GiB allowed"): the limit is that cap, a
    # per-process one, read from the message (not a lower bound), so whatever the verdict it is certain.
    text = truth(case)["oom_message"]
    cap, tol = figure(case, r"SIZE allowed")
    chosen = choose_limit(given=None, sidecar=None, message=parse_oom_message(text), inferred=None)
    assert chosen is not None
    oom = _explained(case, chosen)
    assert oom["limit_bytes"] == pytest.approx(cap, abs=tol)
    assert (oom["limit_source"], oom["limit_kind"], oom["limit_is_lower_bound"]) == (
        "oom_message",
        "per-process-cap",
        False,
    )
    assert oom["verdict_level"] == "request"
    assert oom["verdict_certain"] is True
    # The wording names that cap and where it came from, with the cap as the message prints it
    # ("4.00 GiB allowed" -> "of 4.00 GiB").
    printed = re.search(r"([\d.]+ GiB) allowed", text)
    assert printed is not None
    named = f"the per-process cap of the OOM message of {printed.group(1)}"
    if oom["verdict"] == "fragmentation":
        assert f"within {named}, and the cache held" in oom["explanation"]
    else:
        assert f"exceeds {named}: no allocator setting can make it fit" in oom["explanation"]


def test_limit_the_client_read_from_its_sidecar() -> None:
    # gpu_client_oom's client observer read torch's allowed_bytes: 3 GiB (3,221,225,472 B), the
    # message's "3.00 GiB allowed". 2.87 GiB allocated + the 84 MiB request (0.08 GiB) = 2.95 GiB
    # <= 3.00 GiB: the request-level rule says fragmentation, with an exact limit, so certain.
    t = truth("gpu_client_oom")
    read = sidecar_limit(t["client"]["sidecar"], 0)
    chosen = choose_limit(given=None, sidecar=read, message=None, inferred=None)
    assert chosen is not None
    oom = _explained("gpu_client_oom", chosen)
    assert (oom["limit_bytes"], oom["limit_source"], oom["limit_kind"]) == (3 * GiB, "sidecar", "per-process-cap")
    assert oom["verdict"] == "fragmentation"
    assert (oom["verdict_level"], oom["verdict_certain"]) == ("request", True)
    assert "within the limit the client read of 3.00 GiB, and the cache held" in oom["explanation"]


# torch's message on a full device without a cap (test_limits' "other layouts" case): 42 MiB asked,
# 9.38 MiB free, 2.92 GiB allocated and 34.62 MiB reserved but unallocated.
DEVICE_FULL_MESSAGE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 42.00 MiB. GPU 0 has a total capacity of "
    "47.27 GiB of which 9.38 MiB is free. Including non-PyTorch memory, this process has 3.14 GiB memory in use. "
    "Of the allocated memory 2.92 GiB is allocated by PyTorch, and 34.62 MiB is reserved by PyTorch but unallocated."
)


def test_limit_of_a_device_full_message_is_the_device_memory() -> None:
    # No "allowed": the limit is reserved + free = 2.92 GiB + 34.62 MiB + 9.38 MiB
    # = 2.92 + 44/1024 = 2.96297 GiB ("2.96 GiB"), of kind device-full, from the message, not a bound.
    msg = parse_oom_message(DEVICE_FULL_MESSAGE)
    chosen = choose_limit(given=None, sidecar=None, message=msg, inferred=None)
    assert chosen is not None
    allocated = round(2.92 * GiB)
    cached = round(34.62 * MiB)
    # A 512 MiB request on top: 2.92 GiB + 0.50 GiB = 3.42 GiB > 2.96 GiB, capacity.
    t = _trace([(OOM, round(9.38 * MiB), 512 * MiB)])
    oom = explain_oom(
        t, 0, allocated=allocated, reserved=allocated + cached, cached_free=cached, largest_free=cached, chosen=chosen
    )
    assert oom["limit_bytes"] == pytest.approx(2.92 * GiB + 44 * MiB, abs=0.005 * GiB + 0.01 * MiB)
    assert (oom["limit_source"], oom["limit_kind"], oom["limit_is_lower_bound"]) == (
        "oom_message",
        "device-full",
        False,
    )
    assert (oom["verdict"], oom["verdict_level"], oom["verdict_certain"]) == ("capacity", "request", True)
    assert oom["explanation"] == (
        "The request for 0.50 GiB on top of 2.92 GiB allocated exceeds the device's memory of the OOM message "
        "of 2.96 GiB: no allocator setting can make it fit; the workload needs less memory."
    )


def test_verdict_certain_is_false_only_for_capacity_from_a_lower_bound() -> None:
    # The four corners of the rule, each hand-computed: allocated 1 GiB, reserved 1 GiB.
    t = _trace([(OOM, 64 * GiB, 2 * GiB)])  # 2 GiB asked, 64 GiB free on the device (a cap refused it)
    lower = _inferred(LimitEstimate(lower=2 * GiB, upper=None, device_full=None, evidence=1))
    full = _inferred(LimitEstimate(lower=2 * GiB, upper=None, device_full=4 * GiB, evidence=1))

    def fields(chosen: Limit) -> tuple[str, bool, str, str]:
        o = explain_oom(t, 0, allocated=GiB, reserved=GiB, cached_free=0, largest_free=0, chosen=chosen)
        return o["verdict"], o["verdict_certain"], o["verdict_level"], o["limit_kind"]

    # 1 + 2 = 3 GiB > 2 GiB, the most the trace shows the cap allowed: capacity, but the real cap may be
    # higher, so not certain. An inferred cap is a per-process cap.
    assert fields(lower) == ("capacity", False, "request", "per-process-cap")
    # ...and the explanation says so instead of "no allocator setting can make it fit".
    uncertain = explain_oom(t, 0, allocated=GiB, reserved=GiB, cached_free=0, largest_free=0, chosen=lower)
    assert uncertain["explanation"] == (
        "The request for 2.00 GiB on top of 1.00 GiB allocated exceeds 2.00 GiB, the most the trace shows the cap "
        "allowed; the real per-process cap is not in the snapshot and may be higher, so whether an allocator "
        "setting can make it fit is unknown: paste the OOM message or give the memory cap."
    )
    # 3 GiB > 2 GiB given: capacity, certain (a given limit is exact); a given limit names no kind.
    assert fields(_given(2 * GiB)) == ("capacity", True, "request", "")
    # 3 GiB <= 4 GiB, the full device (reserved + free): fragmentation, certain.
    assert fields(full) == ("fragmentation", True, "request", "device-full")
    # 3 GiB <= 3 GiB under the cap's lower bound: fragmentation; a larger real cap only makes it fit
    # more, so it is certain even from a lower bound.
    lower3 = _inferred(LimitEstimate(lower=3 * GiB, upper=None, device_full=None, evidence=1))
    assert fields(lower3) == ("fragmentation", True, "request", "per-process-cap")


@pytest.mark.parametrize("case", OOM_CASES)
def test_report_limit_kind_and_verdict_certain_of_the_real_ooms(case: str) -> None:
    # Inferred from the trace, the limit is the cap's lower bound: a per-process cap (the message
    # names one: "... allowed"), and a capacity verdict from it is not certain.
    oom = oom_of(case)
    assert re.search(r"[\d.]+ (GiB|MiB) allowed", truth(case)["oom_message"])
    assert oom["limit_kind"] == "per-process-cap"
    assert oom["verdict_certain"] is (oom["verdict"] != "capacity")
    # The level is "step" exactly where the report projected the failing step.
    assert oom["verdict_level"] == ("step" if oom["projection"]["available"] else "request")


# --------------------------------------------------------------------------- the block the request could use


def _capture_ooms(name: str) -> list[dict[str, Any]]:
    ooms: list[dict[str, Any]] = build_report(FIXTURES / "captures" / f"{name}.pickle.gz", jobs=1)["devices"][0]["ooms"]
    return ooms


def test_usable_free_block_when_the_oom_flush_freed_the_big_one() -> None:
    # rand_s24_c40_roundup4, event 1835 (test_captures: the model's side of it). Before the malloc's own flush
    # (it starts at event 1832), the side stream's 768 MiB segment held 20 MiB allocated, 95,420,416 B free,
    # two pending frees (234,881,024 and 335,544,320 B) and 118,489,088 B free at its end: the largest block
    # the 384 MiB request could use. The flush completed the pending frees, which merged into one 784,334,848 B
    # free block: free when it failed, but too late for its search.
    [oom] = _capture_ooms("rand_s24_c40_roundup4")
    assert oom["event_index"] == 1835 and oom["flush"]["first_event"] == 1832
    assert (oom["largest_usable_free_block_bytes"], oom["largest_free_block_bytes"]) == (118_489_088, 784_334_848)
    assert oom["explanation"].endswith(
        "the largest free block the request could use was 0.11 GiB and 0.05 GiB was left to reserve. The memory "
        "existed, not in one piece. A free block of 0.73 GiB was there when it failed, but it became free only in "
        "the allocator's own flush, after its search, and torch does not search the cache again after flushing."
    )


def test_usable_free_block_is_on_the_requests_stream() -> None:
    # rand_s24_c40_default, event 2464: 386,839,040 B asked on the side stream (stream 1) while the main
    # stream's cache held a 732,509,184 B free block: a request only takes blocks of its own stream.
    ooms = _capture_ooms("rand_s24_c40_default")
    oom = next(o for o in ooms if o["event_index"] == 2464)
    snap = read_snapshot(FIXTURES / "captures" / "rand_s24_c40_default.pickle.gz")
    assert int(snap.devices[0].trace.stream[2464]) == 1
    assert oom["largest_free_block_bytes"] == 732_509_184 > oom["requested_bytes"] == 386_839_040
    assert oom["largest_usable_free_block_bytes"] < oom["requested_bytes"]
    assert "it belonged to another stream's blocks, which a request never takes." in oom["explanation"]
    assert "the largest free block the request could use was" in oom["explanation"]


@pytest.mark.parametrize("case", OOM_CASES)
def test_usable_free_block_is_below_the_request_and_named_in_the_explanation(case: str) -> None:
    # By construction of the rule (get_free_block found nothing), on every OOM fixture.
    for oom in build_report(FIXTURES / f"{case}.pickle.gz", jobs=1)["devices"][0]["ooms"]:
        usable = oom["largest_usable_free_block_bytes"]
        assert usable is not None and 0 <= usable < oom["requested_bytes"]
        if oom["verdict"] == "fragmentation":
            # A few MiB are worded in MiB, never "0.00 GiB" (issue 35).
            shown = size(usable) if 0 < usable < GiB // 200 else f"{usable / GiB:.2f} GiB"
            assert f"could use was {shown}" in oom["explanation"] and "0.00 GiB" not in oom["explanation"]
        if oom["largest_free_block_bytes"] < oom["requested_bytes"]:
            assert " was there when it failed" not in oom["explanation"]


def _seg(free: int, *, stream: int = 0, pool: int = 0, kind: str = "large", addr: int = 0) -> SegmentState:
    """A segment of one used 2 MiB block and one free block of ``free`` bytes."""
    blocks = (BlockState(addr, 2 * MiB, 2 * MiB, "active_allocated"), BlockState(addr + 2 * MiB, free, 0, "inactive"))
    return SegmentState(addr, 2 * MiB + free, stream, pool, kind, False, blocks)


def _usable(
    size: int, before: list[SegmentState], at_oom: list[SegmentState], conf: str = "", stream: int = 0
) -> UsableFree:
    t = _trace([(OOM, GiB, size)])
    t.stream[0] = stream
    cfg = AllocatorConfig.parse(conf)
    return UsableFree(t, 0, AllocatorState(-1, tuple(before)), AllocatorState(0, tuple(at_oom)), cfg)


def test_usable_free_block_rules_by_hand() -> None:
    # Nothing free before the flush: 0; a block of exactly the request's size at the failure counts as big.
    u = _usable(100 * MiB, [], [_seg(100 * MiB)])
    assert u.largest == 0 and u.why_not is not None and "own flush" in u.why_not
    # Only the request's stream, pool and kind count before the flush; the largest of those is taken.
    before = [
        _seg(90 * MiB, stream=1),
        _seg(80 * MiB, pool=1),
        _seg(70 * MiB),
        _seg(60 * MiB, addr=1 << 40),
        _seg(1 * MiB, kind="small"),
    ]
    assert _usable(100 * MiB, before, []).largest == 70 * MiB
    assert _usable(512 * KiB, before, []).largest == 1 * MiB  # a small request: the small pool only
    # Why a free block as big as the request did not serve, by its largest one.
    assert "another stream" in str(_usable(100 * MiB, [], [_seg(300 * MiB, stream=1), _seg(200 * MiB)]).why_not)
    assert _usable(100 * MiB, [], [_seg(300 * MiB, pool=1)]).why_not == (
        "it was in another memory pool (a CUDA graph's or a MemPool's)"
    )
    # A 1.5 MiB request is a large-pool one; a whole free 2 MiB small segment does not serve it.
    small_free = SegmentState(0, 2 * MiB, 0, 0, "small", False, (BlockState(0, 2 * MiB, 0, "inactive"),))
    assert _usable(3 * MiB // 2, [small_free], [small_free]).largest == 0
    assert _usable(3 * MiB // 2, [], [small_free]).why_not == (
        "it was in the small-block pool, and this request is served from the other"
    )
    assert _usable(512 * KiB, [], [_seg(300 * MiB)]).why_not == (
        "it was in the large-block pool, and this request is served from the other"
    )
    assert "own flush" in str(_usable(100 * MiB, [], [_seg(300 * MiB, stream=1)], stream=1).why_not)
    # Under max_split_size_mb:128 a 100 MiB request never takes a block of 128 MiB or more.
    cap = "max_split_size_mb:128"
    u = _usable(100 * MiB, [_seg(128 * MiB), _seg(127 * MiB, addr=1 << 40)], [_seg(128 * MiB)], cap)
    assert u.largest == 127 * MiB
    assert u.why_not == "max_split_size_mb keeps blocks that big whole, for requests of their own size"
    # Two free blocks of the same size: the first of them names the reason (no order among segments needed).
    assert "another stream" in str(_usable(100 * MiB, [], [_seg(300 * MiB, stream=1), _seg(300 * MiB)]).why_not)
    # Smaller than the request at the failure: nothing to explain.
    assert _usable(100 * MiB, [], [_seg(99 * MiB)]).why_not is None


def test_a_gc_threshold_on_a_full_device_is_said_to_do_nothing_and_left_out_of_the_replays() -> None:
    # rand_s0_c25_gc07 ran with garbage_collection_threshold:0.7 under a 2.5 GiB fraction, and its GC never ran.
    # Its real message with the fraction taken out (no "allowed"; the device had 150 MiB free) is what torch
    # prints when the device itself fills up: set_fraction is false, and torch never runs that GC.
    real = json.loads((FIXTURES / "captures" / "rand_s0_c25_gc07.truth.json").read_text())["oom_message"]
    full = real.replace("2.50 GiB allowed; ", "").replace("of which 133.79 GiB is free", "of which 150.00 MiB is free")
    assert "allowed" not in full and parse_oom_message(full).limit_kind == "device-full"
    path = FIXTURES / "captures" / "rand_s0_c25_gc07.pickle.gz"
    report = build_report(path, oom_message=full, whatif=("max_split_size_mb:128",), jobs=1)
    dev = report["devices"][0]
    assert dev["limit"]["kind"] == "device-full"
    assert [w["code"] for w in report["capture"]["warnings"]].count("gc-without-cap") == 1
    item = next(w for w in dev["whatif"] if w["config"] == "max_split_size_mb:128")
    direct = whatif(read_snapshot(path), 0, "max_split_size_mb:128", dev["limit"]["bytes"], capped=False)
    assert item["peak_reserved_bytes"] == direct["peak_reserved_bytes"]
    # Under the fraction (the real message) the GC acts and nothing is said.
    capped = build_report(path, oom_message=real, jobs=1)
    assert "gc-without-cap" not in [w["code"] for w in capped["capture"]["warnings"]]


def test_recorded_gc_runs_prove_a_cap_that_a_message_without_allowed_cannot_take_away() -> None:
    # rand_s11_c40_gc07's GC ran (under its 4 GiB fraction): torch runs it only under a cap, so the
    # same doctored message (no "allowed") leaves the GC in the replays, and no warning says otherwise.
    real = json.loads((FIXTURES / "captures" / "rand_s11_c40_gc07.truth.json").read_text())["oom_message"]
    full = real.replace("4.00 GiB allowed; ", "").replace("of which 127.76 GiB is free", "of which 235.52 MiB is free")
    path = FIXTURES / "captures" / "rand_s11_c40_gc07.pickle.gz"
    report = build_report(path, oom_message=full, whatif=("max_split_size_mb:128",), jobs=1)
    dev = report["devices"][0]
    assert dev["limit"]["kind"] == "device-full"
    assert "gc-without-cap" not in [w["code"] for w in report["capture"]["warnings"]]
    item = next(w for w in dev["whatif"] if w["config"] == "max_split_size_mb:128")
    direct = whatif(read_snapshot(path), 0, "max_split_size_mb:128", dev["limit"]["bytes"], capped=True)
    assert item["peak_reserved_bytes"] == direct["peak_reserved_bytes"]
