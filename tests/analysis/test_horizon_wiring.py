"""The grown-steps horizon and the private-pool phases wired into the report's stages (issue 32, items 2 and 7).

- ``whatif[].grown_horizon``: each setting whose replay ran the failing step to its end, where the steps grow, is
  replayed over grown copies of the step (``analysis.horizon``); the decision's horizon reads it (source "grown"),
  falling back on the failing step's packing carried forward (``horizon.setting_horizon``) for reports made
  before it. Judged against the real reruns: gpt_varlen_oom (its expandable_segments and max_split_size_mb:256
  reruns died in step 27, four steps after the recorded run: near), gpu_grow_oom and gpt_varlen_c70 (every
  setting's rerun died in the failing step).
- The attribution's private-pool mask (``categories.private_pool_allocations``) is the graph-capture phase: on
  the CUDA-graph families (real H200 captures, torch 2.11, whose trace entries carry no pool id) what a graph
  capture made and still held at the OOM is counted as graph capture, not as a forward pass.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from analysis.categories import private_pool_allocations
from analysis.decision import decide
from analysis.horizon import horizon_is_near
from analysis.reader import read_snapshot
from analysis.readout import size
from analysis.report import build_report
from analysis.stacks import alloc_lifetimes
from analysis.stages.whatifs import grown_steps

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DIAG = FIXTURES / "diagnosis"


def _truth(path: Path) -> dict[str, Any]:
    return json.loads(path.with_name(path.name.replace(".pickle.gz", ".truth.json")).read_text())  # type: ignore[no-any-return]


def _died_in(path: Path) -> int:
    """The step a run died in: its truth logs one row per completed step, and it died of an OOM."""
    truth = _truth(path)
    assert truth["oom_message"]
    return len(truth["workload_log"])


@functools.cache
def _device(path: Path, with_message: bool = True) -> dict[str, Any]:
    message = _truth(path)["oom_message"] if with_message else None
    report = build_report(path, oom_message=message)
    return next(d for d in report["devices"] if d.get("oom"))


def _growth(dev: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in dev["diagnosis"]["causes"] if c["id"] == "growing_workload")


@pytest.mark.parametrize("with_message", [True, False])
def test_gpt_varlen_grown_horizons_are_near_as_its_reruns_were(with_message: bool) -> None:
    """Each setting that gets step 23 through dies a step or two later in its grown replay; its real rerun died in
    step 27: both near for a run of 23 steps, so the decision names the growth, not a setting."""
    path = FIXTURES / "gpt_varlen_oom.pickle.gz"
    dev = _device(path, with_message)
    cause = _growth(dev)
    step = int(cause["figures"]["died_in_step"])
    assert step == _died_in(path) == 23
    real = {"expandable_segments": "gpt_varlen_expandable", "max_split_size_mb": "gpt_varlen_maxsplit256"}
    completing = [w for w in dev["whatif"] if w["step_completes"] is True]
    assert {w["setting"] for w in completing} == set(real)
    for w in completing:
        grown = w["grown_horizon"]
        assert grown["config"] == w["config"] and grown["failing_step"] == step
        assert grown["steps_replayed"] == grown_steps(step)
        assert grown["growth_per_step_bytes"] == cause["figures"]["growth_per_step_bytes"]
        rerun = _died_in(FIXTURES / f"{real[w['setting']]}.pickle.gz")
        assert step < grown["dies_in_step"] <= rerun == 27
        assert horizon_is_near(step, grown["dies_in_step"]) and horizon_is_near(step, rerun)
    for w in dev["whatif"]:
        if w["step_completes"] is not True:
            assert "grown_horizon" not in w  # a setting that dies in the failing step has no horizon to grow
    decision = dev["decision"]
    assert decision["cause"] == "growing_workload" and "horizon" not in decision


@pytest.mark.parametrize(
    ("base", "reruns"),
    [
        ("gpu_grow_oom", ("gpu_expandable_oom", "gpu_maxsplit_oom")),
        ("captures/gpt_varlen_c70_default", ("captures/gpt_varlen_c70_roundup4", "captures/gpt_varlen_c70_roundup2")),
    ],
)
def test_where_every_settings_rerun_died_in_the_failing_step_the_growth_is_the_answer(
    base: str, reruns: tuple[str, ...]
) -> None:
    path = FIXTURES / f"{base}.pickle.gz"
    died = _died_in(path)
    for rerun in reruns:
        assert _died_in(FIXTURES / f"{rerun}.pickle.gz") == died
    dev = _device(path)
    assert _growth(dev)["figures"]["died_in_step"] == died
    for w in dev["whatif"]:
        grown = w.get("grown_horizon")
        assert grown is None or horizon_is_near(died, grown["dies_in_step"] or died + grown["steps_replayed"] + 1)
    decision = dev["decision"]
    assert decision["cause"] == "growing_workload" and "horizon" not in decision
    assert decision["change"]["id"] == "growing_workload"


@functools.cache
def _ddp_rank0() -> dict[str, Any]:
    runs = FIXTURES / "runs"
    side = json.loads((runs / "ddp_gloo_rank0.json").read_text())
    return build_report(runs / "ddp_gloo_rank0.pickle.gz", sidecar=side)


def test_the_decisions_horizon_is_the_grown_replays() -> None:
    """DDP rank 0's batch grows 512 rows a step until step 20 fails (its sidecar gives the 2 GiB cap): the settings
    that get step 20 through are replayed over grown steps, and the one that goes farthest, far for 20 steps, is
    the change, with that horizon; a report without the grown replay (stored before it) still decides by the
    failing step's packing carried forward."""
    report = _ddp_rank0()
    dev = report["devices"][0]
    step = int(_growth(dev)["figures"]["died_in_step"])
    grown = [w for w in dev["whatif"] if "grown_horizon" in w]
    assert [w["step_completes"] for w in grown] == [True] * len(grown) and len(grown) >= 2
    farthest = max(grown, key=lambda w: w["grown_horizon"]["dies_in_step"])
    dies_at = farthest["grown_horizon"]["dies_in_step"]
    assert sorted(w["grown_horizon"]["dies_in_step"] for w in grown)[-2] < dies_at  # one setting goes farthest
    decision = dev["decision"]
    assert decision["change"]["id"] == farthest["setting"] and decision["runner_up"]["id"] == "growing_workload"
    assert decision["horizon"] == {
        "setting": farthest["setting"],
        "dies_in_step": dies_at,
        "source": "grown",
        "steps_replayed": grown_steps(step),
    }
    assert not horizon_is_near(step, dies_at)
    assert f"to about step {dies_at} before" in decision["headline"]
    old = copy.deepcopy(dev)
    for w in old["whatif"]:
        w.pop("grown_horizon", None)
    fallback = decide(old, report["capture"])
    assert fallback["horizon"]["source"] == "replay"
    assert fallback["horizon"]["dies_in_step"] != dies_at


def test_a_grown_replay_that_completes_every_step_offers_the_setting_past_it() -> None:
    """Where the setting's grown replay never fails, the horizon is at least the replay's end, said as such."""
    report = _ddp_rank0()
    dev = copy.deepcopy(report["devices"][0])
    step = int(_growth(dev)["figures"]["died_in_step"])
    for w in dev["whatif"]:
        if "grown_horizon" in w:
            w["grown_horizon"]["dies_in_step"] = None
    decision = decide(dev, report["capture"])
    last = step + grown_steps(step)
    assert decision["horizon"]["dies_in_step"] is None
    assert f"goes on past step {last}, the last replayed" in decision["headline"]
    assert f"up to step {last} at least" in decision["buys"]


@pytest.mark.parametrize("name", ["graphs_manual", "graphs_resnet"])
def test_graph_capture_allocations_live_at_the_oom_are_the_graph_capture_phase(name: str) -> None:
    path = DIAG / f"{name}_default.pickle.gz"
    dev = _device(path)
    snap = read_snapshot(path)
    data = next(d for d in snap.devices if d.trace is not None and d.trace.action.size)
    trace = data.trace
    lifetimes = alloc_lifetimes(trace.action, trace.addr, trace.size, trace.stack)
    private = private_pool_allocations(lifetimes, trace, data.segments)
    live = lifetimes.live_at(int(dev["oom"]["event_index"]))
    in_pools = int(lifetimes.size[live & private].sum())
    by_phase = dev["diagnosis"]["live_by_phase_at_oom"]
    assert in_pools > 0 and by_phase["graph_capture"] == in_pools
    assert sum(by_phase.values()) == int(lifetimes.size[live].sum())
    # The decision still names the pools, whose one-shared-pool fix is the rerun that ran through.
    family = json.loads((DIAG / f"{name}.reruns.json").read_text())
    assert dev["decision"]["cause"] == family["expected_cause"] == "cuda_graph_pools"
    assert family["members"]["fix"]["died"] is False
    assert f"graph capture {size(in_pools)}" in dev["decision"]["headline"]
