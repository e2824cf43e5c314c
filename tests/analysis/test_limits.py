"""The real limit: torch's OOM message parsed into byte ranges, and the order of the sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.limits import OomMessageError, choose_limit, figure, parse_oom_message, sidecar_limit
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GiB, MiB = 2**30, 2**20
OOM_CASES = [
    "frag_oom",
    "gpt_varlen_oom",
    "gpt_varlen_expandable",
    "gpt_varlen_maxsplit256",
    "gpu_grow_oom",
    "gpu_expandable_oom",
    "gpu_maxsplit_oom",
    "gpu_client_oom",
]


def truth(case: str) -> dict:
    return json.loads((FIXTURES / f"{case}.truth.json").read_text())


def test_figure_ranges_follow_format_size() -> None:
    # "7.00 GiB" stands for [6.995, 7.005) GiB: 7.005 * 2**30 = 7521561477.12.
    f = figure("7.00", "GiB")
    assert (f.value, f.low, f.high) == (7 * GiB, 7510824059, 7521561477)
    # Exact below 1 KiB; KiB starts above 1024 bytes (format_size prints 1024 as "1024 bytes").
    assert figure("0", "bytes").exact and figure("1024", "bytes").value == 1024
    assert figure("1.00", "KiB").low == 1025
    assert figure("839.00", "KiB").value == 839 * 1024


@pytest.mark.parametrize("case", OOM_CASES)
def test_every_real_message_parses_and_holds_the_real_cap(case: str) -> None:
    t = truth(case)
    msg = parse_oom_message(t["oom_message"])
    assert msg.device == 0
    assert msg.total_capacity is not None
    assert msg.total_capacity.low <= t["total_memory"] <= msg.total_capacity.high
    assert msg.allowed is not None  # every capped fixture printed "... allowed"
    cap = t["kwargs"].get("cap_gib")
    if cap is not None:  # the gpu_* captures record the cap they set
        assert msg.allowed.low <= int(cap * GiB) <= msg.allowed.high
    assert msg.limit is msg.allowed and msg.limit_kind == "per-process-cap"
    # Non-PyTorch memory of this process (CUDA context, cuBLAS workspaces): 0.7-0.8 GiB on the H200.
    assert msg.non_pytorch is not None and 0.5 * GiB < msg.non_pytorch.value < GiB


def test_message_figures_at_the_oom_match_the_client_dump() -> None:
    # gpu_client_oom was dumped inside the failing allocation: memory_stats are those of the message.
    t = truth("gpu_client_oom")
    msg = parse_oom_message(t["oom_message"])
    stats = t["memory_stats"]
    assert msg.allocated.low <= stats["allocated_bytes.all.current"] <= msg.allocated.high
    assert msg.reserved.low <= stats["reserved_bytes.all.current"] <= msg.reserved.high
    assert msg.tried.value == 84 * MiB
    # The sidecar's observer read the cap exactly: 3 GiB.
    assert sidecar_limit(t["client"]["sidecar"], 0) == (3 * GiB, "per-process-cap")


def test_other_layouts() -> None:
    # A message without a cap, other processes listed, wrapped over lines, in a traceback.
    text = (
        "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 42.00 MiB. GPU 0 has a total\n"
        "capacity of 47.27 GiB of which 9.38 MiB is free. Process 644963 has 5.59 MiB memory in use. Process 3053273 "
        "has 29.04 GiB memory in use. Including non-PyTorch memory, this process has 3.14 GiB memory in use. Of the "
        "allocated memory 2.92 GiB is allocated by PyTorch, and 34.62 MiB is reserved by PyTorch but unallocated."
    )
    msg = parse_oom_message(text)
    assert msg.allowed is None and msg.limit_kind == "device-full"
    assert [pid for pid, _ in msg.other_processes] == [644963, 3053273]
    # device full: reserved (2.92 GiB + 34.62 MiB) plus the 9.38 MiB free.
    assert msg.limit is not None
    assert msg.limit.value == figure("2.92", "GiB").value + figure("34.62", "MiB").value + figure("9.38", "MiB").value
    old = parse_oom_message(
        "CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; 130.35 MiB already "
        "allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch)"
    )
    assert old.reserved is not None and old.reserved.value == 188 * MiB
    assert old.limit is not None and old.limit.value == 188 * MiB + figure("47.06", "MiB").value


@pytest.mark.parametrize("text", ["", "   ", "RuntimeError: something else", "Tried to allocate nothing"])
def test_not_a_message_is_refused_with_a_code(text: str) -> None:
    with pytest.raises(OomMessageError) as err:
        parse_oom_message(text)
    assert err.value.code.startswith("oom_message:")


def test_source_priority_and_the_floor() -> None:
    msg = parse_oom_message(truth("gpt_varlen_oom")["oom_message"])
    assert (
        choose_limit(given=123, sidecar=(5, "per-process-cap"), message=msg, inferred=(1, "cap-lower-bound")).source
        == "given"
    )
    assert choose_limit(given=None, sidecar=(5, "per-process-cap"), message=msg, inferred=None).source == "sidecar"
    lim = choose_limit(given=None, sidecar=None, message=msg, inferred=None, floor=7515000000)
    assert lim is not None and lim.source == "oom_message" and not lim.is_lower_bound
    assert (lim.low, lim.high) == (7515000000, 7521561477) and lim.bytes == 7 * GiB
    low = choose_limit(given=None, sidecar=None, message=None, inferred=(6 * GiB, "cap-lower-bound"))
    assert low is not None and low.is_lower_bound and low.high is None


def test_report_uses_the_message_and_says_where_the_limit_came_from() -> None:
    t = truth("gpt_varlen_expandable")
    rep = build_report(FIXTURES / "gpt_varlen_expandable.pickle.gz", oom_message=t["oom_message"])
    dev = rep["devices"][0]
    oom = dev["oom"]
    assert oom["limit_source"] == "oom_message" and oom["limit_is_lower_bound"] is False
    assert oom["limit_bytes"] == 7 * GiB  # "7.00 GiB allowed"
    assert dev["limit"]["source"] == "oom_message" and "two decimals" in dev["limit"]["note"]
    assert not any(w["code"] == "oom-message-mismatch" for w in rep["capture"]["warnings"])
    # Another run's message is used but flagged.
    other = build_report(FIXTURES / "gpt_varlen_expandable.pickle.gz", oom_message=truth("gpu_grow_oom")["oom_message"])
    assert any(w["code"] == "oom-message-mismatch" for w in other["capture"]["warnings"])


def test_sidecar_gives_the_exact_cap() -> None:
    t = truth("gpu_client_oom")
    rep = build_report(FIXTURES / "gpu_client_oom.pickle.gz", sidecar=t["client"]["sidecar"])
    oom = rep["devices"][0]["oom"]
    assert oom["limit_source"] == "sidecar" and oom["limit_bytes"] == 3 * GiB
