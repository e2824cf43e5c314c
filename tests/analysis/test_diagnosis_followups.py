"""The first answer on issue 33's held-out captures (tests/fixtures/followups: real H100 runs nobody tuned the
rules to). Each family's ``_default`` died under a memory cap; its other members are the real reruns of one change
each (``FAMILY.reruns.json``, written from the truth files). The decision must name the change whose real rerun
ran through, and no row may claim what a rerun disproved."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from analysis.report import build_report

FOLLOWUPS = Path(__file__).resolve().parents[1] / "fixtures" / "followups"
SETTING_MEMBERS = {
    "expandable_segments": "expandable",
    "max_split_size_mb": "maxsplit128",
    "garbage_collection_threshold": "gc07",
}


def truth(name: str) -> dict[str, Any]:
    return json.loads((FOLLOWUPS / f"{name}.truth.json").read_text())  # type: ignore[no-any-return]


def ran(name: str) -> bool:
    """The real run completed every step (the truth file's own record)."""
    t = truth(name)
    return t["died_step"] is None and t["steps_completed"] == len(t["workload_log"])


@cache
def device(name: str, with_message: bool = True) -> dict[str, Any]:
    message = truth(name)["oom_message"] if with_message else None
    report = build_report(FOLLOWUPS / f"{name}.pickle.gz", oom_message=message)
    return next(d for d in report["devices"] if d.get("oom"))  # type: ignore[no-any-return]


@pytest.mark.parametrize("with_message", [True, False])
def test_feval_names_the_evaluation_without_no_grad_and_its_rerun_ran(with_message: bool) -> None:
    """feval_c80: every 2nd step evaluates and keeps the loss with its graph; it died in step 6's training
    forward with three evaluations' activations live. The fix (no_grad, inference_mode) ran through."""
    dev = device("feval_c80_default", with_message)
    decision = dev["decision"]
    assert decision["cause"] == "forward_without_no_grad"
    assert "torch.no_grad()" in decision["change"]["line"]
    cause = next(c for c in dev["diagnosis"]["causes"] if c["id"] == "forward_without_no_grad")
    live_eval = dev["diagnosis"]["live_by_phase_at_oom"]["forward_no_backward"]
    # The saving is what those evaluations still held, no more; with it the failing request fits.
    assert 0 < cause["saving_bytes"] <= live_eval
    assert cause["figures"]["kept_passes"] == 3  # the evaluations of steps 1, 3 and 5
    assert cause["fits_after_fix"] is True
    oom = dev["oom"]
    assert oom["allocated_bytes"] - cause["saving_bytes"] + oom["requested_bytes"] <= oom["limit_bytes"]
    assert truth("feval_c80_default")["died_step"] == 6
    assert ran("feval_c80_nograd") and ran("feval_c80_inference")


def test_fgpt_c60_first_step_halves_the_batch_and_its_reruns_ran() -> None:
    """fgpt_c60 died in the loss of its first step: the phase is the forward pass, and the answer is 2
    micro-batches from the failing point's share (an upper bound: batch 12 of 16 died, 8 ran)."""
    dev = device("fgpt_c60_default")
    assert dev["diagnosis"]["oom_phase"] == "forward" == truth("fgpt_c60_default")["died_phase"]
    change = dev["decision"]["change"]
    assert change["id"] == "smaller_batch"
    fit = dev["batch_fit"]
    assert fit["first_step"] is True and fit["need_is_lower_bound"] is True
    oom = dev["oom"]
    need = oom["allocated_bytes"] + oom["requested_bytes"]
    assert fit["need_bytes"] == need
    expected = (oom["limit_bytes"] - fit["fixed_bytes"]) / (need - fit["fixed_bytes"])
    assert fit["fraction"] == pytest.approx(expected, abs=1e-4) and fit["fraction"] < 1
    assert fit["accumulation_steps"] == 2 and "batch_size // 2" in change["line"]
    assert f"at most {fit['fraction'] * 100:.0f}%" in change["title"]
    # The share is an upper bound (the rest of the first step is not in the trace): the row claims the
    # failing point, not the step.
    row = next(r for r in dev["ranked"] if r["id"] == "smaller_batch")
    assert row["step_completes"] is None
    assert "Whether the rest of the step then fits is not known" in dev["decision"]["buys"]
    assert ran("fgpt_c60_batch8") and ran("fgpt_c60_accum2")
    assert truth("fgpt_c60_batch8")["kwargs"]["batch"] * 2 == truth("fgpt_c60_default")["kwargs"]["batch"]
    assert not ran("fgpt_c60_batch12") and not ran("fgpt_c60_amp")


def test_fgpt_c80_amp_first_and_every_ranked_row_is_borne_out() -> None:
    dev = device("fgpt_c80_default")
    assert dev["decision"]["change"]["id"] == "amp" and ran("fgpt_c80_amp")
    members = {"amp": "amp", "activation_checkpointing": "ckpt", "smaller_batch": "batch8"}
    for row in dev["ranked"]:
        assert ran(f"fgpt_c80_{members[row['id']]}"), row["id"]
        assert row["step_completes"] is not True  # nothing here is a replayed step
    fit = dev["batch_fit"]
    # 2 micro-batches of 8 (ran); the share is at most that fraction, and batch 12 (inside it) died.
    assert fit["first_step"] is True and fit["accumulation_steps"] == 2 and 12 / 16 <= fit["fraction"] < 1
    assert not ran("fgpt_c80_batch12")


@pytest.mark.parametrize("family", ["fres_c60", "fres_c50"])
def test_fres_first_step_mid_forward_is_the_batch_not_the_allocation_order(family: str) -> None:
    """torchvision ResNet-34 died in its first step's forward, the cache all but full: the failing request fits
    by bytes (fragmentation), but the holes are a sliver of what scales with the batch, every setting's rerun
    died and the half batch ran."""
    dev = device(f"{family}_default")
    oom, fit = dev["oom"], dev["batch_fit"]
    assert oom["verdict"] == "fragmentation"
    room = oom["cached_free_bytes"] + max(0, oom["limit_bytes"] - oom["reserved_bytes"])
    assert fit["first_step"] is True and fit["fraction"] is None
    assert room < 0.1 * (fit["need_bytes"] - fit["fixed_bytes"])
    change = dev["decision"]["change"]
    assert change["id"] == "smaller_batch" and "batch_size // 2" in change["line"]
    assert "allocation_order" not in {s["id"] for s in dev["suggestions"]}
    assert ran(f"{family}_batch48") and truth(f"{family}_batch48")["kwargs"]["batch"] * 2 == 96
    for setting, member in SETTING_MEMBERS.items():
        assert not ran(f"{family}_{member}")
        for s in dev["suggestions"]:
            assert not (s["id"] == setting and s["avoids_oom"] is True)


@pytest.mark.parametrize("family", ["fres_c60", "fres_c50"])
def test_fres_caught_cudnn_ooms_are_not_the_fatal_one(family: str) -> None:
    """cuDNN catches its own OOMs while it tries algorithms: the report's OOM is the last, the one torch's
    message describes, and the headline says the earlier ones were caught."""
    dev = device(f"{family}_default")
    t = truth(f"{family}_default")
    count = t["memory_stats"]["num_ooms"]
    assert len(dev["ooms"]) == count > 1
    assert dev["ooms"][-1]["event_index"] == dev["oom"]["event_index"]
    tried = re.search(r"Tried to allocate ([\d.]+) MiB", t["oom_message"])
    assert tried is not None and dev["ooms"][-1]["tried_to_allocate_bytes"] == float(tried.group(1)) * 2**20
    assert dev["decision"]["headline"].startswith(
        f"The last of {count} OOMs in the trace. The {count - 1} before it were caught and the run went on"
    )
