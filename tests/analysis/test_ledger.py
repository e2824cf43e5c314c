"""The whole-device ledger (analysis/ledger.py) on real H200 runs, against torch's own figures.

The held-out "another process" runs (tests/fixtures/diagnosis/otherproc_default: a second process took
132.79 GiB; outside_default: this process took the GPU with CuPy, outside PyTorch's cache) died with
torch's OOM message and a ``memory_stats()`` in their truth files: every row is checked against them.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from analysis.allocator.recorded import recorded_replay
from analysis.ledger import ROW_IDS, _reconcile
from analysis.limits import GiB, MiB, figure, parse_oom_message
from analysis.reader import read_snapshot
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ANOTHER_PROCESS = ["diagnosis/otherproc_default", "diagnosis/outside_default"]


def truth(case: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{case}.truth.json").read_text())


@cache
def report(case: str, with_message: bool) -> dict[str, Any]:
    message = truth(case)["oom_message"] if with_message else None
    return build_report(FIXTURES / f"{case}.pickle.gz", oom_message=message)


def rows(ledger: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in ledger["rows"]}


def within(ours: int, theirs: int, share: float = 0.01) -> bool:
    return abs(ours - theirs) <= share * theirs


def test_rows_add_up_and_parts_add_up_to_their_rows() -> None:
    for case in ANOTHER_PROCESS:
        ledger = report(case, True)["devices"][0]["ledger"]
        assert [r["id"] for r in ledger["rows"]] == list(ROW_IDS)
        assert sum(r["bytes"] for r in ledger["rows"]) == ledger["total_bytes"]
        for row in ledger["rows"]:
            assert row["bytes"] >= 0
            if row["parts"]:
                assert sum(p["bytes"] for p in row["parts"]) == row["bytes"], row["id"]


@pytest.mark.parametrize("case", ANOTHER_PROCESS)
def test_the_ledger_meets_torchs_message_and_memory_stats(case: str) -> None:
    t = truth(case)
    msg = parse_oom_message(t["oom_message"])
    assert msg.total_capacity is not None and msg.process_in_use is not None and msg.device_free is not None
    assert msg.allocated is not None and msg.reserved is not None
    ledger = report(case, True)["devices"][0]["ledger"]
    r = rows(ledger)
    assert ledger["moment"] == "oom"
    # The device's total: within 1% of what torch reports for the H200 (150,109,880,320 B).
    assert within(ledger["total_bytes"], t["total_memory"])
    assert abs(ledger["total_bytes"] - t["total_memory"]) < 1 * MiB
    # PyTorch's own rows: the message's "allocated by PyTorch" and "reserved but unallocated".
    assert within(r["allocated"]["bytes"], msg.allocated.value)
    assert within(r["cached_free"]["bytes"], (msg.reserved - msg.allocated).value)
    reserved = r["allocated"]["bytes"] + r["cached_free"]["bytes"] + r["private_pools"]["bytes"]
    # The OOM came at the run's reserved peak: memory_stats' peak is the trace's figure at the OOM, exactly.
    assert reserved == t["memory_stats"]["reserved_bytes.all.peak"]
    assert r["allocated"]["bytes"] == report(case, True)["devices"][0]["oom"]["allocated_bytes"]
    assert r["allocated"]["bytes"] <= t["memory_stats"]["allocated_bytes.all.peak"]
    # This process: "Including non-PyTorch memory, this process has X memory in use".
    assert within(reserved + r["non_pytorch"]["bytes"], msg.process_in_use.value)
    # The free memory is the trace's own OOM entry: cudaMemGetInfo's, exact (the truth's reading at the dump).
    assert r["free"]["source"] == "trace"
    assert r["free"]["bytes"] == t["mem_get_info_at_dump"][0]
    assert msg.device_free.low <= r["free"]["bytes"] <= msg.device_free.high


def test_another_process_is_its_own_row_with_its_pid() -> None:
    r = rows(report("diagnosis/otherproc_default", True)["devices"][0]["ledger"])
    other = r["other_processes"]
    assert other["source"] == "message"
    listed = next(p for p in other["parts"] if p["id"] == "process_5776")
    assert listed["label"] == "process 5776"
    assert within(listed["bytes"], figure("132.79", "GiB").value)
    assert within(other["bytes"], figure("132.79", "GiB").value)
    # What the listed figures leave unexplained past their rounding: a few MiB, said to be inferred.
    unlisted = next(p for p in other["parts"] if p["id"] == "unlisted")
    assert unlisted["source"] == "inferred" and 0 < unlisted["bytes"] < 16 * MiB
    # This process outside PyTorch: its CUDA context and libraries, 0.61 GiB by the message's figures.
    msg = parse_oom_message(truth("diagnosis/otherproc_default")["oom_message"])
    assert msg.non_pytorch is not None
    assert within(r["non_pytorch"]["bytes"], msg.non_pytorch.value)


def test_memory_held_outside_the_cache_by_this_process_is_non_pytorch() -> None:
    t = truth("diagnosis/outside_default")
    r = rows(report("diagnosis/outside_default", True)["devices"][0]["ledger"])
    # CuPy's 132.29 GiB (hog_bytes) plus the CUDA context: this process, outside PyTorch's cache.
    assert r["non_pytorch"]["bytes"] > t["outside"]["hog_bytes"]
    assert r["non_pytorch"]["bytes"] - t["outside"]["hog_bytes"] < 1 * GiB
    # No other process is listed; the rounding of the printed figures is all that is left.
    assert r["other_processes"]["bytes"] < 16 * MiB


def test_the_cache_is_split_by_why_it_could_not_serve_the_request() -> None:
    r = rows(report("diagnosis/otherproc_default", True)["devices"][0]["ledger"])
    parts = {p["id"]: p["bytes"] for p in r["cached_free"]["parts"]}
    # The 74.00 MiB request (77,594,624 B) found only smaller free blocks in the large pool.
    assert parts["too_small"] == 77135872
    assert parts["other_size_pool"] == 555520
    allocated = {p["id"]: p["bytes"] for p in r["allocated"]["parts"]}
    assert allocated["requested"] + allocated["rounding"] == r["allocated"]["bytes"]


def test_without_the_message_only_what_the_trace_knows() -> None:
    t = truth("diagnosis/otherproc_default")
    ledger = report("diagnosis/otherproc_default", False)["devices"][0]["ledger"]
    assert ledger["total_bytes"] is None
    r = rows(ledger)
    assert set(r) == {"allocated", "cached_free", "private_pools", "free"}
    assert r["free"]["bytes"] == t["mem_get_info_at_dump"][0]
    assert "give it with the snapshot" in ledger["note"]
    with_msg = rows(report("diagnosis/otherproc_default", True)["devices"][0]["ledger"])
    for key in ("allocated", "cached_free", "private_pools", "free"):
        assert r[key] == with_msg[key]


OOM_FIXTURES = sorted(
    str(p.relative_to(FIXTURES)).removesuffix(".truth.json")
    for p in [*FIXTURES.glob("*.truth.json"), *FIXTURES.glob("diagnosis/*.truth.json")]
    if json.loads(p.read_text()).get("oom_message")
    and p.with_name(p.name.replace(".truth.json", ".pickle.gz")).exists()
)


@pytest.mark.parametrize("case", OOM_FIXTURES)
def test_every_fixture_with_a_message_adds_up_to_the_device(case: str) -> None:
    """Every OOM fixture with torch's message: the rows add up to the printed total, which is the
    device's within 1%, and PyTorch's rows are the message's within 1%."""
    t = truth(case)
    msg = parse_oom_message(t["oom_message"])
    ledger = build_report(FIXTURES / f"{case}.pickle.gz", oom_message=t["oom_message"])["devices"][0]["ledger"]
    r = rows(ledger)
    assert ledger["total_bytes"] is not None
    assert sum(x["bytes"] for x in ledger["rows"]) == ledger["total_bytes"]
    assert within(ledger["total_bytes"], t["total_memory"])
    assert msg.allocated is not None and msg.reserved is not None and msg.process_in_use is not None
    pooled = pools_allocated(case, ledger["event_index"]) if r["private_pools"]["bytes"] else 0
    if msg.private_pools is not None:
        # torch 2.11 counts a pool's free bytes as allocated: "X is allocated by PyTorch, with Y allocated
        # in private pools (e.g., CUDA Graphs)", Y being those free bytes (1008.00 MiB on graphs_manual).
        assert within(r["private_pools"]["bytes"] - pooled, msg.private_pools.value)
        allocated = r["allocated"]["bytes"] + r["private_pools"]["bytes"]
    else:
        allocated = r["allocated"]["bytes"] + pooled
    assert within(allocated, msg.allocated.value)
    reserved = r["allocated"]["bytes"] + r["cached_free"]["bytes"] + r["private_pools"]["bytes"]
    assert abs(reserved - msg.reserved.value) <= max(0.01 * msg.reserved.value, msg.reserved.high - msg.reserved.low)
    assert within(reserved + r["non_pytorch"]["bytes"], msg.process_in_use.value)


def pools_allocated(case: str, index: int) -> int:
    """Bytes allocated in private pools after event ``index``, by a recorded replay run here (the
    message counts them as allocated; the ledger keeps the pools apart)."""
    snap = read_snapshot(FIXTURES / f"{case}.pickle.gz")
    state = recorded_replay(snap, snap.devices[0]).blocks_at(index)
    return sum(b.size for s in state.segments if s.pool != 0 for b in s.blocks if b.state == "active_allocated")


def test_reconcile_moves_figures_inside_their_ranges_only() -> None:
    a, b = figure("6.98", "GiB"), figure("132.79", "GiB")
    values, left = _reconcile([a, b], a.value + b.value + 3 * MiB)
    assert left == 0 and sum(values) == a.value + b.value + 3 * MiB
    assert all(f.low <= v <= f.high for f, v in zip([a, b], values, strict=True))
    values, left = _reconcile([a, b], a.value + b.value + 64 * MiB)
    assert values == [a.high, b.high] and left == a.value + b.value + 64 * MiB - a.high - b.high
    values, left = _reconcile([a], a.value - 64 * MiB)
    assert values == [a.low] and left < 0


@pytest.mark.parametrize("case", ["triage_device_full", "triage_other_process", "triage_other_process_cap"])
def test_the_message_alone_gives_the_same_rows(case: str) -> None:
    """The triage page's ledger (no snapshot): the message's figures, reconciled to its total, against the
    same process's memory_stats() taken at the OOM (the uncapped H200 runs of tests/fixtures/triage)."""
    from analysis.ledger import message_ledger
    from analysis.triage import triage

    t = truth(f"triage/{case}")
    result = triage(t["oom_message"], t["memory_summary"])
    assert result.summary_timing == "at-oom"
    ledger = message_ledger(result.message, result.summary, summary_at_oom=True)
    assert ledger is not None and ledger.event_index is None
    assert sum(r.bytes for r in ledger.rows) == ledger.total_bytes
    assert within(int(ledger.total_bytes or 0), t["total_memory"])
    stats = t["memory_stats"]
    r = {row.id: row.bytes for row in ledger.rows}
    assert within(r["allocated"], stats["allocated_bytes.all.current"])
    reserved = stats["reserved_bytes.all.current"]
    assert abs(r["allocated"] + r["cached_free"] - reserved) <= 0.01 * reserved
    assert within(r["free"], parse_oom_message(t["oom_message"]).device_free.value)  # type: ignore[union-attr]
