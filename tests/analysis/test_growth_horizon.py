"""A growing run's horizon under a setting (issue 32, item 7): "no setting saves it" only where the setting's
horizon is near; else the free setting first, with its horizon, and capping what grows as the runner-up. Judged
against the real reruns of the random-stream captures (tests/fixtures/captures/rand_*: 10 steps planned, each
rerun under the setting, its truth saying where it died, if it did) and gpt_varlen's."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from analysis.horizon import horizon_is_near, setting_horizon
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CAPTURES = FIXTURES / "captures"


def _truth(path: Path) -> dict[str, Any]:
    return json.loads(path.with_name(path.name.replace(".pickle.gz", ".truth.json")).read_text())  # type: ignore[no-any-return]


@functools.cache
def _oom_device(path: Path, message: str | None = None) -> dict[str, Any]:
    return next(d for d in build_report(path, oom_message=message)["devices"] if d.get("oom"))  # type: ignore[no-any-return]


@pytest.mark.parametrize("family", ["rand_s17_c40", "rand_s26_c40"])
def test_a_setting_whose_horizon_is_far_comes_first(family: str) -> None:
    """The steps grow with noise; a perfectly packed cache gains 3 or more steps: expandable_segments first. Its
    real rerun ran all the steps the run had."""
    rerun = _truth(CAPTURES / f"{family}_expandable.pickle.gz")
    assert rerun["died_step"] is None and rerun["steps_completed"] == 10  # every step the run had
    dev = _oom_device(CAPTURES / f"{family}_default.pickle.gz")
    cause = next(c for c in dev["diagnosis"]["causes"] if c["id"] == "growing_workload")
    decision = dev["decision"]
    assert decision.get("cause") is None
    assert decision["change"]["id"] == "expandable_segments"
    assert decision["runner_up"]["id"] == "growing_workload"  # capping what grows, second
    step = cause["figures"]["died_in_step"]
    assert decision["horizon"] == {
        "setting": "expandable_segments",
        "dies_in_step": step + cause["figures"]["postpone_packed_steps"],
        "source": "packed",
    }
    assert not horizon_is_near(step, decision["horizon"]["dies_in_step"])
    assert f"to about step {decision['horizon']['dies_in_step']}" in decision["headline"]
    assert dev["oom"]["run_verdict_basis"] != "cause"  # the run is not said to be beyond every setting


def test_where_the_horizon_is_near_no_setting_saves_the_run() -> None:
    """rand_s1_c40: a perfectly packed cache gains nothing; every setting's real rerun died in the same step."""
    for conf in ("expandable", "maxsplit128"):
        rerun = _truth(CAPTURES / f"rand_s1_c40_{conf}.pickle.gz")
        assert rerun["died_step"] == 8
    dev = _oom_device(CAPTURES / "rand_s1_c40_default.pickle.gz")
    assert dev["decision"]["cause"] == "growing_workload"
    assert "horizon" not in dev["decision"]
    assert dev["oom"]["run_verdict"] == "capacity"


@pytest.mark.parametrize(("with_message", "expected"), [(False, 25), (True, 26)])
def test_the_replayed_horizon_is_the_settings_own_packing(with_message: bool, expected: int) -> None:
    """gpt_varlen_oom: expandable_segments' replay runs step 23 to its end; carried forward with its own packing
    the run dies in step 25 (the inferred limit) or 26 (the message's 7 GiB): near for a run of 23 steps, so the
    cause stands, and its real rerun died in step 27. The perfectly packed estimate (step 30) would have said far."""
    path = FIXTURES / "gpt_varlen_oom.pickle.gz"
    dev = _oom_device(path, _truth(path)["oom_message"] if with_message else None)
    oom = dev["oom"]
    cause = next(c for c in dev["diagnosis"]["causes"] if c["id"] == "growing_workload")
    expandable = next(w for w in dev["whatif"] if w["config"] == "expandable_segments:True")
    assert expandable["step_completes"] is True
    dies_at = setting_horizon(
        23, oom["step_need_bytes"], oom["limit_bytes"], cause["figures"]["growth_per_step_bytes"],
        expandable["step_peak_reserved_bytes"],
    )  # fmt: skip
    assert dies_at == expected < len(_truth(FIXTURES / "gpt_varlen_expandable.pickle.gz")["workload_log"]) == 27
    assert horizon_is_near(23, dies_at) and not horizon_is_near(23, 30)
    assert 23 + cause["figures"]["postpone_packed_steps"] == 30
    assert dev["decision"]["cause"] == "growing_workload"
