"""OOM explained: verdicts, the limit, and the figures in PyTorch's own OOM message."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from analysis.allocator import LimitEstimate
from analysis.allocator.config import AllocatorConfig
from analysis.limits import choose_limit
from analysis.oom import flush_before, verdict
from analysis.reader import read_snapshot
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GiB = 2**30
MiB = 2**20


@cache
def oom_of(case: str) -> dict[str, Any]:
    oom = build_report(FIXTURES / f"{case}.pickle.gz")["devices"][0]["oom"]
    assert oom is not None
    return oom


def message(case: str) -> str:
    text = json.loads((FIXTURES / f"{case}.truth.json").read_text())["oom_message"]
    assert text
    return str(text)


def figure(text: str, pattern: str) -> float:
    m = re.search(pattern, text)
    assert m, pattern
    value, unit = float(m.group(1)), m.group(2)
    return value * {"GiB": GiB, "MiB": MiB}[unit]


@pytest.mark.parametrize(
    ("case", "expected"),
    [("frag_oom", "fragmentation"), ("gpt_varlen_oom", "fragmentation"), ("gpt_varlen_expandable", "capacity")],
)
def test_request_verdicts_on_real_ooms(case: str, expected: str) -> None:
    # Without the OOM message the limit is the inferred lower bound (the peak reserved).
    oom = oom_of(case)
    assert oom["request_verdict"] == expected
    fits = oom["allocated_bytes"] + oom["requested_bytes"] <= oom["limit_bytes"]
    assert fits == (expected == "fragmentation")


def test_no_capacity_conclusion_from_a_lower_bound() -> None:
    # gpt_varlen_expandable: 6.72 GiB reserved, torch said "7.00 GiB allowed". Issue 9: the report
    # concluded "no allocator setting can make that fit" from the 6.72 GiB lower bound.
    oom = oom_of("gpt_varlen_expandable")
    assert oom["limit_is_lower_bound"] is True
    assert "no allocator setting can make" not in oom["explanation"]
    assert "no allocator setting saves" not in oom["explanation"]
    assert oom["verdict"] == "capacity" and oom["verdict_certain"] is False
    assert "at least" in oom["explanation"] or "may be higher" in oom["explanation"]


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "gpt_varlen_expandable"])
def test_figures_match_pytorchs_oom_message(case: str) -> None:
    oom, text = oom_of(case), message(case)
    # "Tried to allocate X" is the segment-sized rounding of the request the trace records.
    tried = figure(text, r"Tried to allocate ([\d.]+) (GiB|MiB)")
    assert AllocatorConfig().allocation_size(oom["requested_bytes"]) == pytest.approx(tried, abs=0.005 * MiB)
    allocated = figure(text, r"([\d.]+) (GiB|MiB) is allocated by PyTorch")
    assert oom["allocated_bytes"] == pytest.approx(allocated, abs=0.005 * GiB)
    unallocated = figure(text, r"([\d.]+) (GiB|MiB) is reserved by PyTorch but unallocated")
    assert oom["reserved_bytes"] - oom["allocated_bytes"] == pytest.approx(unallocated, abs=0.005 * GiB)


@pytest.mark.parametrize("case", ["frag_oom", "gpt_varlen_oom", "gpt_varlen_expandable"])
def test_per_process_cap_gives_a_lower_bound(case: str) -> None:
    oom = oom_of(case)
    # Each run had a per-process cap: the device had far more free memory than the request.
    assert oom["device_free_bytes"] > oom["requested_bytes"]
    assert oom["limit_source"] == "inferred" and oom["limit_inference"] == "cap-lower-bound"
    assert oom["limit_is_lower_bound"] is True
    rep_peak = build_report(FIXTURES / f"{case}.pickle.gz")["devices"][0]["summary"]["peak_reserved_bytes"]
    if case == "gpt_varlen_expandable":
        # Expandable segments map whole 20 MiB pages after the check of reserved + allocation size:
        # the most a check let through is within one page of the peak (7,230,980,096 B here, the
        # peak 7,220,494,336 B: the largest check came where a free tail was reused).
        assert rep_peak - 20 * MiB < oom["limit_bytes"]
    else:
        # cudaMalloc'd segments: reserved memory grows only by what a check let through.
        assert oom["limit_bytes"] == rep_peak
    cap = figure(message(case), r"([\d.]+) (GiB) allowed") if "allowed" in message(case) else None
    if cap is not None:
        assert oom["limit_bytes"] <= cap


def test_frag_oom_holds_free_memory_in_holes_smaller_than_the_request() -> None:
    oom = oom_of("frag_oom")
    assert oom["requested_bytes"] == AllocatorConfig().round_size(int(1.2 * GiB) // 4 * 4)
    assert oom["cached_free_bytes"] > 0
    assert oom["largest_free_block_bytes"] < oom["requested_bytes"]
    # frag_oom fills the cap, then the first OOM ends the fill loop; the report explains the last one.
    assert oom["ooms_in_trace"] == 2
    # The flush-and-retry before it released the unsplit cached segments.
    flush = oom["flush"]
    assert flush["segments_released"] > 0
    # Against the process's own counters: that flush made frag_oom's only cudaFree calls, so
    # memory_stats' run totals are its figures (81 segments, 1,119,879,168 B).
    stats = json.loads((FIXTURES / "frag_oom.truth.json").read_text())["memory_stats"]
    assert flush["segments_released"] == stats["num_device_free"]
    assert flush["released_bytes"] == stats["reserved_bytes.all.freed"]
    assert flush["first_event"] + flush["events"] == oom["event_index"]
    trace = read_snapshot(FIXTURES / "frag_oom.pickle.gz").devices[0].trace
    assert flush == flush_before(trace, oom["event_index"])  # the report's flush is flush_before's


def test_top_stacks_and_whatifs_at_the_oom() -> None:
    oom = oom_of("gpt_varlen_oom")
    assert 1 <= len(oom["top_stacks"]) <= 3
    assert all(row["when"] == "oom" for row in oom["top_stacks"])
    outcomes = {w["config"]: w["oom_avoided"] for w in oom["whatif"]}
    # Ground truth: the same workload ran further with expandable segments (gpt_varlen_expandable).
    assert outcomes["expandable_segments:True"] is True


def test_limit_rules() -> None:
    # Given limit wins over what the trace shows.
    given = choose_limit(given=150, sidecar=None, message=None, inferred=(200, "cap-lower-bound"))
    assert given is not None and (given.bytes, given.source, given.is_lower_bound) == (150, "given", False)
    # Device itself full at an OOM: reserved 100 + free 5 = 105 (never below what the trace let through).
    assert LimitEstimate(lower=100, upper=None, device_full=105, evidence=1).stated() == (105, "device-full")
    # A cap was binding: the most the trace let through (200) is a lower bound of it.
    inferred = choose_limit(given=None, sidecar=None, message=None, inferred=LimitEstimate(200, 300, None, 1).stated())
    assert inferred is not None and (inferred.bytes, inferred.is_lower_bound) == (200, True)
    assert verdict(90, 10, 100) == "fragmentation"
    assert verdict(91, 10, 100) == "capacity"
