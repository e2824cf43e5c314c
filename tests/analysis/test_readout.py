"""analysis.readout: what a report's first screen may claim, on real fixtures and their real reruns."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from analysis.readout import basis, headroom, ranked_rows, run_facts, share, size, size_change, size_range
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@cache
def _device(case: str, with_message: bool = False) -> dict[str, Any]:
    message = json.loads((FIXTURES / f"{case}.truth.json").read_text())["oom_message"] if with_message else None
    report = build_report(FIXTURES / f"{case}.pickle.gz", oom_message=message, jobs=1)
    dev: dict[str, Any] = report["devices"][0]
    return dev


def test_sizes_are_worded_as_torch_words_them_and_never_as_zero_gib() -> None:
    assert size(743_040_000) == "708.62 MiB"
    assert size(1 << 30) == "1024.00 MiB"  # torch's format_size: MiB up to 1 GiB inclusive
    assert size(512) == "512 bytes" and size(3 << 20) == "3.00 MiB"
    assert "0.00" not in size(1500) and size(None) == "n/a"
    assert size_change(-16 << 20) == "-16.00 MiB" and size_change(0) == "no change"
    assert share(0.996) == "99.6%" and share(0.97) == "97%" and share(0.004) == "0.4%"
    assert size_range(round(5.995 * 2**30), round(6.005 * 2**30)) == "5.995 GiB to 6.005 GiB"


def test_a_capacity_verdict_from_a_lower_bound_asks_for_the_message_and_the_message_settles_it() -> None:
    dev = _device("grow_gpt2_default")
    b = basis(dev)
    assert b is not None
    assert b["source"] == "cap-lower-bound" and b["is_lower_bound"] and b["verdict"] == "capacity"
    assert b["limit_text"] == f"at least {size(dev['oom']['limit_bytes'])}"
    assert b["message_could_change_verdict"] and not b["message_would_sharpen"]
    assert b["verdict_level"] == "step" and "step 4" in b["level_text"]

    with_message = _device("grow_gpt2_default", with_message=True)
    b = basis(with_message)
    assert b is not None and b["source"] == "oom_message" and not b["is_lower_bound"]
    assert not b["message_could_change_verdict"] and not b["message_would_sharpen"]
    # "6.00 GiB allowed": a range of two decimals, worded with as many as it takes.
    assert "anywhere from 5.995 GiB to 6.005 GiB" in b["sentence"]
    assert run_facts(with_message)["limit_source_short"] == "OOM message"


def test_a_fragmentation_verdict_from_a_lower_bound_stands_but_the_message_would_sharpen_the_replays() -> None:
    b = basis(_device("gpt_varlen_oom"))
    assert b is not None and b["verdict"] == "fragmentation"
    assert not b["message_could_change_verdict"] and b["message_would_sharpen"]


def test_ranked_states_are_what_the_replays_computed_on_gpu_grow_oom() -> None:
    """The reruns with expandable_segments (gpu_expandable_oom) and max_split_size_mb (gpu_maxsplit_oom) died
    in step 13; the ranked list's own step_completes reads avoids_oom, the table must not."""
    dev = _device("gpu_grow_oom")
    rows = {r["id"]: r for r in ranked_rows(dev)}
    for setting in ("expandable_segments", "max_split_size_mb"):
        assert rows[setting]["state"] == "runs-out", rows[setting]
        assert rows[setting]["state_text"] == "runs out later in step 13"
    # expandable_segments raises the replayed peak: said so, not "saving 0 bytes".
    w = next(w for w in dev["whatif"] if w["config"] == "expandable_segments:True")
    rise = w["peak_reserved_bytes"] - dev["summary"]["peak_reserved_bytes"]
    assert rise > 0 and rows["expandable_segments"]["saving_text"] == f"none: the peak rises by {size(rise)} (replayed)"
    for row in dev["ranked"]:
        if not (row["config"] or "").startswith("PYTORCH_CUDA_ALLOC_CONF="):
            assert rows[row["id"]]["state"] in ("estimate", "not-known")


def test_without_a_projection_no_setting_is_said_to_finish() -> None:
    dev = _device("frag_oom")  # no steps: nothing projected, every setting still fails at the request
    for w in dev["whatif"]:
        assert w["step_completes"] is None
    for row in ranked_rows(dev):
        assert row["state"] != "finishes-step"


@pytest.mark.parametrize("case", ["gpt_varlen_oom"])
def test_thin_headroom_is_the_limit_minus_the_projected_step_peak(case: str) -> None:
    dev = _device(case)
    # gpt_varlen_oom's decision is now the growth of its steps (a code change: no headroom to show); the
    # headroom of its replayed setting, had it been the change, is what the page would show for it.
    assert headroom(dev) is None and dev["decision"]["change"]["kind"] == "code"
    dev = {**dev, "decision": {**dev["decision"], "change": {"id": "expandable_segments", "kind": "env"}}}
    h = headroom(dev)
    w = next(w for w in dev["whatif"] if w["config"] == "expandable_segments:True")
    assert h is not None and h["bytes"] == dev["oom"]["limit_bytes"] - w["step_peak_reserved_bytes"]
    assert h["thin"] and "less than the 710.00 MiB request that failed" in h["sentence"]


def test_a_setting_that_gets_past_the_step_of_a_growing_run_postpones_it() -> None:
    """leak_conv2 (main's diagnosis fixtures): memory grows every step; expandable_segments finishes the failing
    step in the replay, and its real rerun died a few steps later all the same."""
    case = FIXTURES / "diagnosis" / "leak_conv2_default.pickle.gz"
    if not case.exists():
        pytest.skip("the diagnosis fixtures come with the diagnosis issue's branch")
    reruns = json.loads((FIXTURES / "diagnosis" / "leak_conv2.reruns.json").read_text())["members"]
    dev = build_report(case, jobs=1)["devices"][0]
    rows = {r["id"]: r for r in ranked_rows(dev)}
    assert reruns["expandable"]["died"] and reruns["expandable"]["died_step"] > reruns["default"]["died_step"]
    assert rows["expandable_segments"]["state"] == "postpones"
    assert rows["expandable_segments"]["state_text"].endswith(", not the run")
    assert "postpones the OOM" in rows["expandable_segments"]["why"]
