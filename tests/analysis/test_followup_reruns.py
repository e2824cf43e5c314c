"""The advice scored against real reruns (issue 33, items 2 and 5): ``tests/fixtures/diagnosis`` holds, per
family, the H200 capture of an OOM (``<family>_default``) and in ``<family>.reruns.json`` the recorded fate
of each rerun of the same job: the fix of its cause, a smaller batch, allocator settings. No rerun's
snapshot is kept, so the follow-up is its fate (``Actual``: died, the step, the steps run, the peak) with
the change its launcher made: the setting (what the follow-up's file would record), else the user's answer
("what did you change?"): the cause's fix, a smaller batch, or something else.

Steps: the report counts an evaluation pass as a step where the capture script did not (eval_bert's OOM
is the report's step 3, the script's step 2), so a rerun's step is moved by the same offset as its
default's: both count the same job."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from analysis.followup import ADVICE_ALIASES, DECLARABLE, Actual, Change, FollowUp, _failing_device, _oom_step, score
from analysis.readout import ENV_PREFIX
from analysis.report import build_report

DIAGNOSIS = Path(__file__).resolve().parents[1] / "fixtures" / "diagnosis"
# The user's answer for what each issue-37 framework rerun changed (scripts/capture_frameworks.py): the Trainer
# evaluation's other two fixes are the cause's fix too; the capacity families' reruns are a declarable change each.
FIX_MEMBERS = ("fix", "preprocess", "loss_only")
MEMBER_ANSWERS = {
    "halfbatch": "smaller_batch",
    "accum": "smaller_batch",
    "ckpt": "activation_checkpointing",
    "bf16": "amp",
}

# (family, rerun, outcome): what each rerun's recorded fate means for the advice.
EXPECTED = [
    # The cause's fix, made as advised, and the run lived: every family's advice borne out.
    *(
        (family, "fix", "borne_out")
        for family in (
            "eval_bert",
            "eval_resnet",
            "graphs_manual",
            "graphs_resnet",
            "kv_gqa",
            "kv_manual",
            "leak_conv2",
            "leak_metric",
            "optim_mlp",
            "optim_wide",
            "otherproc",
            "outside",
        )
    ),
    # A leak: settings only postpone it (died 2 to 10 steps later); the horizon is scored below.
    ("leak_conv2", "expandable", "postponed"),
    ("leak_conv2", "maxsplit128", "postponed"),
    ("leak_metric", "expandable", "postponed"),
    ("leak_metric", "maxsplit128", "postponed"),
    # A smaller batch where the advice was another change: not applied (whatever it did).
    *(
        (family, "halfbatch", "not_applied")
        for family in (
            "eval_bert",
            "eval_resnet",
            "kv_gqa",
            "kv_manual",
            "optim_mlp",
            "optim_wide",
        )
    ),
    # optim: the for-loop step instead of the advised fused one: another change.
    ("optim_mlp", "loop", "not_applied"),
    ("optim_wide", "loop", "not_applied"),
    # A setting the incident ranked but could not tell about, and the run died in the same step: unknown.
    ("eval_bert", "expandable", "unknown"),
    ("eval_bert", "maxsplit128", "unknown"),
    ("eval_resnet", "expandable", "unknown"),
    ("eval_resnet", "maxsplit128", "unknown"),
    ("graphs_manual", "expandable", "unknown"),
    ("kv_gqa", "maxsplit128", "unknown"),
    ("kv_manual", "maxsplit128", "unknown"),
    ("otherproc", "expandable", "unknown"),
    ("outside", "expandable", "unknown"),
    # A setting the incident did not rank (no prediction for it), and the run died again: not applied.
    ("graphs_manual", "maxsplit128", "not_applied"),
    ("graphs_resnet", "expandable", "not_applied"),
    ("graphs_resnet", "maxsplit128", "not_applied"),
    ("kv_gqa", "expandable", "not_applied"),
    ("kv_manual", "expandable", "not_applied"),
    ("optim_mlp", "expandable", "not_applied"),
    ("optim_mlp", "maxsplit128", "not_applied"),
    ("optim_wide", "expandable", "not_applied"),
    ("optim_wide", "maxsplit128", "not_applied"),
    # Issue 37's Trainer evaluation (fw_hf_eval): its three fixes ran through; a half evaluation batch (the same
    # logits in all) and the settings died in the same evaluation, none of them advised.
    *(("fw_hf_eval", member, "borne_out") for member in FIX_MEMBERS),
    *(("fw_hf_eval", member, "not_applied") for member in ("halfbatch", "expandable", "maxsplit128")),
]
# Issue 37's families with no mistake (expected_cause null): scored by the rule below, as the bench judges them,
# whichever change their decision comes to name.
CAPACITY_RERUNS = [
    (family, member)
    for p in sorted(DIAGNOSIS.glob("*.reruns.json"))
    if json.loads(p.read_text())["expected_cause"] is None
    for family in [p.name.split(".")[0]]
    for member in json.loads(p.read_text())["members"]
    if member != "default"
]


@cache
def _incident(family: str) -> str:
    truth = json.loads((DIAGNOSIS / f"{family}_default.truth.json").read_text())
    return json.dumps(
        build_report(DIAGNOSIS / f"{family}_default.pickle.gz", oom_message=truth.get("oom_message") or None)
    )


def _reruns(family: str) -> dict[str, Any]:
    return json.loads((DIAGNOSIS / f"{family}.reruns.json").read_text())["members"]  # type: ignore[no-any-return]


def scored(family: str, member: str) -> FollowUp:
    incident = json.loads(_incident(family))
    dev = _failing_device(incident)
    fate, default = _reruns(family)[member], _reruns(family)["default"]
    conf = fate["alloc_conf"]
    if conf:
        change = Change(conf.split(":")[0], ENV_PREFIX + conf, "file", conf)
    else:
        advised = str(((dev.get("decision") or {}).get("change") or {}).get("id"))
        fix = ADVICE_ALIASES.get(advised, advised)
        answer = fix if member in FIX_MEMBERS else MEMBER_ANSWERS.get(member, "other")
        change = Change(answer, DECLARABLE[answer], "user")
    step, offset = fate["died_step"], (_oom_step(dev) or 0) - int(default["died_step"] or 0)
    actual = Actual(
        bool(fate["died"]),
        None if step is None else step + offset,
        fate["steps_completed"],
        fate["peak_reserved_bytes"],
    )
    return score(incident, [change], actual)


def test_every_rerun_of_every_family_is_listed() -> None:
    listed = {(f, m) for f, m, _ in EXPECTED} | set(CAPACITY_RERUNS)
    on_disk = {
        (p.name.split(".")[0], m) for p in DIAGNOSIS.glob("*.reruns.json") for m in _reruns(p.name.split(".")[0])
    }
    assert listed == on_disk - {(f, "default") for f, _ in on_disk}


@pytest.mark.parametrize(("family", "member", "outcome"), EXPECTED)
def test_each_rerun_scores_the_advice_as_its_fate_says(family: str, member: str, outcome: str) -> None:
    result = scored(family, member)
    assert result.outcome == outcome, result.text
    if member == "fix":
        assert result.followed and result.predicted is not None and result.predicted.answer == "fixes"
        assert result.predicted.basis in ("decision", "replay", "ranked")


@pytest.mark.parametrize(("family", "member"), CAPACITY_RERUNS)
def test_a_capacity_familys_reruns_score_the_advice_as_the_bench_judges_it(family: str, member: str) -> None:
    """No mistake in the program: the advised change's rerun is borne out where it ran through (the bench's right)
    and never where it died (the bench's wrong); where the incident could not tell (a first step that died in
    its forward: the rest of the step is not in the trace, so "at most 88% of the batch fits" bounds the split
    from one side only) it is ``unknown``, and the text still says the run finished. Any other rerun is a change
    the incident did not advise, or one it ranked and could not tell about."""
    result = scored(family, member)
    fate = _reruns(family)[member]
    if result.followed and result.predicted is not None and result.predicted.answer == "unknown":
        assert result.outcome == "unknown", result.text
        assert ("no OOM over" in result.text) is (not fate["died"]), result.text
    elif result.followed:
        assert (result.outcome == "borne_out") is (not fate["died"]), result.text
    else:
        assert result.outcome in ("not_applied", "unknown"), result.text


@pytest.mark.parametrize("family", ["leak_conv2", "leak_metric"])
def test_the_leaks_fix_is_steady_and_settings_postpone_to_a_step(family: str) -> None:
    fix = scored(family, "fix")
    assert fix.predicted is not None and fix.predicted.horizon is not None
    assert fix.predicted.horizon.kind == "steady"
    for member in ("expandable", "maxsplit128"):
        result = scored(family, member)
        horizon = result.predicted.horizon if result.predicted else None
        assert horizon is not None and horizon.kind == "postpones" and horizon.step is not None
        assert horizon.step > result.incident_oom_step  # type: ignore[operator]
        assert result.horizon is not None and result.horizon.actual_step == result.actual.oom_step
        assert result.horizon.off_by_steps == result.actual.oom_step - horizon.step  # type: ignore[operator]


def test_horizons_scored_on_time() -> None:
    """leak_metric: expandable_segments predicted step 30 (a perfectly packed cache gains 2 steps),
    max_split_size_mb:128's own replay 29; both reruns died in step 30. leak_conv2: expandable_segments
    predicted 47, died in 48; max_split_size_mb:128's replay 39, died in 41. (The 128 value is a ``tried``
    entry of the max_split_size_mb what-if: before its ``step_peak_reserved_bytes`` was kept there the
    horizon fell back on the packed-cache bound, 57 for leak_conv2, a miss of 16 steps.)"""
    verdicts = {
        (family, member): (r.horizon.predicted_step, r.horizon.actual_step, r.horizon.verdict)
        for family in ("leak_conv2", "leak_metric")
        for member in ("expandable", "maxsplit128")
        for r in [scored(family, member)]
        if r.horizon is not None
    }
    assert verdicts == {
        ("leak_metric", "expandable"): (30, 30, "on_time"),
        ("leak_metric", "maxsplit128"): (29, 30, "on_time"),
        ("leak_conv2", "expandable"): (47, 48, "on_time"),
        ("leak_conv2", "maxsplit128"): (39, 41, "on_time"),
    }
