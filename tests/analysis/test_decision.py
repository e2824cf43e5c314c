"""The decision (analysis/decision.py) and the OOM list (analysis/ooms.py) on the real fixtures.

Figures come from the truth files (torch's own OOM message and memory_stats) or from the
recorded replay computed here independently of the report.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.allocator.recorded import recorded_replay
from analysis.decision import decide, format_size
from analysis.reader import read_snapshot
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@cache
def report(case: str) -> dict[str, Any]:
    return build_report(FIXTURES / f"{case}.pickle.gz")


def truth(case: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{case}.truth.json").read_text())


def tried_in_message(case: str) -> str:
    """'710.00 MiB' out of torch's 'Tried to allocate 710.00 MiB.'"""
    found = re.search(r"Tried to allocate ([0-9.]+ [KMG]iB)", truth(case)["oom_message"])
    assert found
    return found.group(1)


def test_format_size_is_torchs() -> None:
    # torch's format_size: "bytes" up to and including 1024, KiB up to 1 MiB, MiB up to 1 GiB, then GiB.
    assert format_size(1024) == "1024 bytes"
    assert format_size(1025) == "1.00 KiB"
    assert format_size(1 << 20) == "1024.00 KiB"
    assert format_size((1 << 20) + 1) == "1.00 MiB"
    assert format_size(1 << 30) == "1024.00 MiB"
    assert format_size(743040000) == "708.62 MiB"  # 743040000 / 2**20 = 708.618...
    assert format_size(1288490496) == "1.20 GiB"


def test_gpt_varlen_oom_decision() -> None:
    dev = report("gpt_varlen_oom")["devices"][0]
    decision = dev["decision"]
    # The size named is the one torch's message named (the request rounded to its 2 MiB allocation).
    assert dev["ooms"][-1]["tried_to_allocate_bytes"] == 744488960  # ceil(743040000 / 2 MiB) * 2 MiB
    # The allocator's view: fragmentation at the failing request, kept beside the run-level answer.
    assert f"the {tried_in_message('gpt_varlen_oom')} request" in decision["allocator_headline"]
    assert decision["allocator_headline"].startswith("Out of memory from fragmentation")
    # The run's sequence lengths grow: expandable_segments got past step 23 for real and died in step 27
    # (gpt_varlen_expandable), as did max_split_size_mb:256; so the answer is the growth, not a setting.
    for rerun in ("gpt_varlen_expandable", "gpt_varlen_maxsplit256"):
        assert truth(rerun)["oom_message"] is not None
        assert len(truth(rerun)["workload_log"]) == 27
    assert decision["cause"] == "growing_workload"
    assert decision["change"]["kind"] == "code"
    assert decision["headline"].startswith("The steps need more and more")
    assert "no setting saves the run" in decision["buys"]
    cause = next(c for c in dev["diagnosis"]["causes"] if c["id"] == "growing_workload")
    assert cause["figures"]["died_in_step"] == len(truth("gpt_varlen_oom")["workload_log"])
    assert cause["figures"]["postpone_packed_steps"] >= 27 - 23  # an upper estimate: the reruns gained 4
    # The ranked table's first is the runner-up (the batch fit), and no setting's row says it finishes the run.
    assert decision["runner_up"] is not None and decision["runner_up"]["id"] == dev["ranked"][0]["id"]
    assert all(r["run_completes"] is False for r in dev["ranked"] if r["cost"] == "none")
    assert decision["confidence"]["replay_exact"] is True


def test_frag_oom_lists_both_ooms_and_changes_code() -> None:
    dev = report("frag_oom")["devices"][0]
    ooms = dev["ooms"]
    assert [o["ordinal"] for o in ooms] == [1, 2]
    # The last one is the report's own oom, and is what torch's message described.
    assert ooms[-1]["event_index"] == dev["oom"]["event_index"]
    assert format_size(ooms[-1]["tried_to_allocate_bytes"]) == tried_in_message("frag_oom")
    assert ooms[0]["event_index"] < ooms[1]["event_index"]
    decision = dev["decision"]
    assert decision["headline"].startswith("The last of 2 OOMs in the trace.")
    # No allocator setting avoids this OOM in any replay: the change is a code change.
    assert not any(w["oom_avoided"] for w in dev["whatif"])
    assert decision["change"]["kind"] == "code" and decision["change"]["id"] == "allocation_order"
    assert decision["buys"].startswith("An estimate, not a replay")


def test_infer_varbatch_headline_is_the_idle_cache() -> None:
    dev = report("infer_varbatch")["devices"][0]
    decision = dev["decision"]
    stats = truth("infer_varbatch")["memory_stats"]
    # Idle at the reserved peak, from a replay run here (not from the report).
    snap = read_snapshot(FIXTURES / "infer_varbatch.pickle.gz")
    rep = recorded_replay(snap, snap.devices[0])
    at = int(np.argmax(rep.reserved))
    assert int(rep.reserved[at]) == stats["reserved_bytes.all.peak"]
    # Idle over the whole plateau (every event at the reserved peak): its least, and where.
    plateau = np.flatnonzero(rep.reserved == rep.reserved[at])
    idle = rep.reserved[plateau] - rep.allocated[plateau]
    least, where = int(idle.min()), int(plateau[np.argmin(idle)])
    assert (least, where) == (22226419712, 2111)  # 20.70 GiB at event 2,111; 25.68 GiB at the first, event 2,103
    peak = format_size(stats["reserved_bytes.all.peak"])
    assert f"held its peak of {peak} (from event {at:,} to event {int(plateau[-1]):,})" in decision["headline"]
    assert f"at least {format_size(least)} of it held no live block" in decision["headline"]
    assert f"even at its fullest, event {where:,})" in decision["headline"]
    final_idle = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
    assert f"at the end {format_size(final_idle)} is idle" in decision["headline"]
    assert decision["change"]["line"] == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    replayed = next(w for w in dev["whatif"] if w["config"] == "expandable_segments:True")
    saved = stats["reserved_bytes.all.peak"] - replayed["peak_reserved_bytes"]
    assert f"({format_size(saved)} less)" in decision["buys"]
    assert dev["ooms"] == []


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "frag_oom", "infer_varbatch"])
def test_timeline_never_shows_requested_above_allocated_at_a_fused_free(case: str) -> None:
    dev = report(case)["devices"][0]
    tl = dev["timeline"]
    # These three traces have no stream uses: every free completes at once, so at each plotted
    # point the requested bytes of live blocks cannot exceed their (rounded) block bytes.
    assert all(r <= a for r, a in zip(tl["requested_bytes"], tl["allocated_bytes"], strict=True))
    # Moving those points kept the extremes exact.
    assert max(tl["reserved_bytes"]) == dev["summary"]["peak_reserved_bytes"]
    assert max(tl["allocated_bytes"]) == dev["summary"]["peak_allocated_bytes"]


def test_segment_map_at_the_reserved_peak() -> None:
    dev = report("gpt_varlen_oom")["devices"][0]
    smap = dev["segment_maps"]["reserved_peak"]
    assert smap["event_index"] == dev["summary"]["peak_reserved_event_index"]
    assert smap["segments_shown"] == smap["segments_total"]
    peak = truth("gpt_varlen_oom")["memory_stats"]["reserved_bytes.all.peak"]
    assert sum(s["size"] for s in smap["segments"]) == peak


def _device(**extra: Any) -> dict[str, Any]:
    """A hand-made device report: an OOM asking 100 MiB, two settings that both avoid it."""
    base: dict[str, Any] = {
        "summary": {"peak_reserved_bytes": 8 << 30, "final_reserved_bytes": 0, "final_allocated_bytes": 0},
        "oom": {
            "event_index": 10,
            "requested_bytes": 100 << 20,
            "allocated_bytes": 6 << 30,
            "limit_bytes": 8 << 30,
            "limit_source": "oom_message",
            "limit_is_lower_bound": False,
            "verdict": "fragmentation",
            "cached_free_bytes": 1 << 30,
            "largest_free_block_bytes": 50 << 20,
            "step_need_bytes": 9 << 30,
        },
        "whatif": [
            {
                "config": "expandable_segments:True",
                "setting": "expandable_segments",
                "peak_reserved_bytes": 7 << 30,
                "oom_avoided": True,
                "step_completes": False,
            },
            {
                "config": "max_split_size_mb:128",
                "setting": "max_split_size_mb",
                "peak_reserved_bytes": 8 << 30,
                "oom_avoided": True,
                "step_completes": True,
            },
        ],
        "suggestions": [
            {
                "id": "expandable_segments",
                "config": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                "avoids_oom": True,
                "title": "t1",
            },
            {
                "id": "max_split_size_mb",
                "config": "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128",
                "avoids_oom": True,
                "title": "t2",
            },
        ],
        "replay": {"exact": False},
    }
    base.update(extra)
    return base


def test_a_setting_whose_step_completes_wins() -> None:
    d = decide(_device(), {"allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "roundup_power2_divisions:[256:1,>:4]"}})
    # max_split_size_mb's step completes, expandable_segments' does not: the advisor's order is overruled.
    assert d["change"]["id"] == "max_split_size_mb"
    # The recorded settings stay in the line (the replay ran with them), the list's commas intact.
    assert d["change"]["line"] == "PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:[256:1,>:4],max_split_size_mb:128"
    assert d["runner_up"] == {
        "id": "expandable_segments",
        "line": "PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:[256:1,>:4],expandable_segments:True",
    }
    assert "and the step completes" in d["buys"]
    assert d["confidence"]["step_projected"] is True
    assert d["confidence"]["limit_source"] == "oom_message"
    assert "read from the OOM message" in d["confidence"]["text"]
    assert "not replay the recorded run exactly" in d["confidence"]["text"]


def test_a_step_that_still_fails_says_what_it_needs() -> None:
    dev = _device()
    dev["suggestions"] = dev["suggestions"][:1]
    d = decide(dev, {})
    assert d["change"]["id"] == "expandable_segments" and d["runner_up"] is None
    assert "but the rest of the step still runs out of memory (it needs 9.00 GiB)" in d["buys"]


def test_without_new_keys_falls_back_to_oom_avoided() -> None:
    dev = _device()
    for w in dev["whatif"]:
        del w["step_completes"]
    for s in dev["suggestions"]:
        del s["avoids_oom"]
    dev["whatif"][0]["oom_avoided"] = False  # expandable_segments no longer avoids it
    d = decide(dev, {})
    assert d["change"]["id"] == "max_split_size_mb"
    assert "whether the rest of the step fits is not known" in d["buys"]
    assert d["confidence"]["step_projected"] is False


NO_OOM = [
    "infer_varbatch",
    "gpu_cuda_graph",
    "gpu_roundup",
    "wrapped_ring",
    "reruns/est_vit_fp32",
    "reruns/est_gpt2_fp32",
]


@pytest.mark.parametrize("case", NO_OOM)
def test_the_idle_cache_is_read_over_the_whole_plateau(case: str) -> None:
    """Issue 32, item 3: the headline's idle cache is the least while reserved memory holds its peak, read
    here from a recorded replay run apart from the report; "wasted" only where that least stays above
    the advisor's floor (64 MiB and 5% of reserved)."""
    dev = report(case)["devices"][0]
    snap = read_snapshot(FIXTURES / f"{case}.pickle.gz")
    rep = recorded_replay(snap, snap.devices[0])
    reserved = np.concatenate(([rep.initial.reserved], rep.reserved))
    allocated = np.concatenate(([rep.initial.allocated], rep.allocated))
    at = np.flatnonzero(reserved == reserved.max())
    idle = reserved[at] - allocated[at]
    plateau = dev["plateau"]
    assert plateau["reserved_bytes"] == int(reserved.max()) == dev["summary"]["peak_reserved_bytes"]
    assert plateau["least_idle_bytes"] == int(idle.min())
    assert plateau["least_idle_event_index"] == int(at[np.argmin(idle)]) - 1
    assert (plateau["first_event_index"], plateau["last_event_index"]) == (int(at[0]) - 1, int(at[-1]) - 1)
    wasted = idle.min() >= (64 << 20) and idle.min() >= 0.05 * reserved.max()
    assert ("memory is wasted" in dev["decision"]["headline"]) == bool(wasted)
    assert f"{format_size(int(idle.min()))} of it" in dev["decision"]["headline"]


def test_a_cache_used_on_its_plateau_is_not_called_wasted() -> None:
    """timm ViT-B/16 in fp32 (no OOM): the first event at the reserved peak (3,316) had 662.16 MiB idle, so
    the headline said "memory is wasted"; at event 5,650 the same 8.54 GiB was 97% allocated."""
    dev = report("reruns/est_vit_fp32")["devices"][0]
    stats = truth("reruns/est_vit_fp32")["memory_stats"]
    plateau = dev["plateau"]
    assert plateau["reserved_bytes"] == stats["reserved_bytes.all.peak"] == 9164554240
    assert (plateau["idle_at_first_bytes"], plateau["least_idle_bytes"]) == (694326784, 280614912)
    assert plateau["least_idle_event_index"] == 5650
    headline = dev["decision"]["headline"]
    assert headline.startswith("No out-of-memory error and little waste: reserved memory peaked at 8.54 GiB")
    assert (
        "(from event 3,316 to event 8,665) and was used: at event 5,650 only 267.62 MiB of it was idle cache (3%)"
        in (headline)
    )


def test_pools_holding_much_of_the_cache_are_named_in_the_headline() -> None:
    """Without the pools' own cause (one pool, or pools the cause rule does not weigh), the headline still
    names private pools that hold a quarter or more of what PyTorch reserved, by what made them. Here
    graphs_manual's real report with its cause set aside: 13 graph pools, 1.11 GiB of 2.00 GiB."""
    dev = build_report(FIXTURES / "diagnosis/graphs_manual_default.pickle.gz")["devices"][0]
    with_cause = dev["decision"]["headline"]
    assert with_cause.startswith("13 CUDA graph pools held 1.11 GiB of the 2.00 GiB reserved")
    assert "private pools held" not in with_cause  # the cause says it once
    without = decide({**dev, "diagnosis": {**dev["diagnosis"], "primary": None}}, {"has_trace": True})
    assert (
        " 13 private pools held 1.11 GiB of the 2.00 GiB PyTorch reserved (the largest 156.00 MiB, pool 13,0: a "
        "CUDA graph capture at activation.py:816 forward"
    ) in without["headline"]


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "frag_oom", "infer_varbatch"])
def test_the_decision_reads_the_entry_once_typed_and_a_stored_entry_alike(case: str) -> None:
    """``DecisionInput.of`` is the decision's one reading of an entry: its figures are the entry's own
    (the OOM's sizes, the replay check's counts, the primary cause), and deciding from it or from the
    entry as a stored report hands it over (a mapping) gives the report's decision."""
    from analysis.decision_input import DecisionInput

    rep = report(case)
    dev = rep["devices"][0]
    inp = DecisionInput.of(dev)
    assert inp.peak_reserved == dev["summary"]["peak_reserved_bytes"]
    assert inp.segment_events_recorded == dev["replay"]["segment_events_recorded"]
    assert inp.ranked_ids == tuple(r["id"] for r in dev["ranked"])
    if dev["oom"] is None:
        assert inp.oom is None
    else:
        assert inp.oom is not None
        assert (inp.oom.allocated, inp.oom.limit) == (dev["oom"]["allocated_bytes"], dev["oom"]["limit_bytes"])
        assert inp.oom.event_index == dev["oom"]["event_index"]
    primary = dev["diagnosis"]["primary"]
    assert (inp.cause.id if inp.cause is not None else None) == primary
    assert decide(inp, rep["capture"]) == dev["decision"]
    assert decide(json.loads(json.dumps(dev)), rep["capture"]) == dev["decision"]
