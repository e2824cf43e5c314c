"""What changed between an incident and its follow-up, read from the files (analysis/followup.py, issue 33):
the batch and micro-batches from the forward pass's allocation sizes, a 16-bit model from its parameters,
autocast from its frames, an evaluation that stopped keeping activations from its passes; on the real H100
reruns of tests/fixtures/followups (README.md there), each the rerun of one change under the incident's cap.
The change expected is the truth file's (its workload kwargs and allocator setting against the incident's),
never the member's fate; the outcome expected is the one the rules give for what the report predicted and
what the rerun did (its truth), whatever decision the incident's report takes."""

from __future__ import annotations

import itertools
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from analysis.followup import Change, FollowUp, compare
from analysis.report import build_report

FOLLOWUPS = Path(__file__).resolve().parents[1] / "fixtures" / "followups"
NAMES = sorted(p.name[: -len(".pickle.gz")] for p in FOLLOWUPS.glob("*.pickle.gz"))
# (incident, member): every member of a family whose incident ran out of memory.
PAIRS = [
    (f"{m.rsplit('_', 1)[0]}_default", m)
    for m in NAMES
    if re.match(r"^f(gpt|eval|res)_c\d+_", m) and not m.endswith("_default")
]
SERIES = {s: [n for n in NAMES if n.startswith(s)] for s in ("fseries_main_", "fnoise_main_")}
SETTING_IDS = ("expandable_segments", "max_split_size_mb", "garbage_collection_threshold")


@cache
def _report_text(name: str) -> str:
    truth_of = truth(name)
    return json.dumps(build_report(FOLLOWUPS / f"{name}.pickle.gz", oom_message=truth_of.get("oom_message") or None))


def report(name: str) -> dict[str, Any]:
    return json.loads(_report_text(name))  # type: ignore[no-any-return]  # a fresh copy for each test


@cache
def truth(name: str) -> dict[str, Any]:
    return json.loads((FOLLOWUPS / f"{name}.truth.json").read_text())  # type: ignore[no-any-return]


def expected_change(incident: str, member: str) -> str:
    """The one change the rerun made, from the two truth files (kwargs and the allocator setting)."""
    was, now = truth(incident), truth(member)
    if now["alloc_conf"] != was["alloc_conf"]:
        return next(k for k in SETTING_IDS if now["alloc_conf"].startswith(k))
    kw_was, kw_now = was["kwargs"], now["kwargs"]
    if kw_now.get("accum", 1) != kw_was.get("accum", 1) or kw_now["batch"] != kw_was["batch"]:
        return "smaller_batch"
    if kw_now.get("amp") or kw_now.get("dtype") not in (None, "float32"):
        return "amp"
    if kw_now.get("ckpt"):
        return "activation_checkpointing"
    if kw_now.get("eval_mode") != kw_was.get("eval_mode"):
        return "eval_no_grad"
    raise AssertionError(f"{member}: no change in its truth")


def training_passes(name: str) -> int:
    return len(report(name)["devices"][0]["signature"]["training_passes"])


def batch_shown(incident: str, member: str) -> bool:
    """Where the files can show a batch: a run whose passes can be seen to hold steady step after step (two
    training passes at least in one of the two runs). A run that died in its first step shows one pass at
    most, and a seed's sequence lengths change a lone pass as much as a batch does: then nothing is said."""
    return max(training_passes(incident), training_passes(member)) >= 2


@pytest.mark.parametrize(("incident", "member"), PAIRS)
def test_the_change_seen_is_the_one_the_rerun_made(incident: str, member: str) -> None:
    expected = expected_change(incident, member)
    seen = compare(report(incident), report(member)).applied
    assert all(c.source == "file" for c in seen)
    if expected == "smaller_batch" and not batch_shown(incident, member):
        assert seen == (), f"{member}: a lone pass in each run, yet {seen}"
        return
    assert [c.id for c in seen] == [expected], f"{member}: {seen}"
    kw_was, kw_now = truth(incident)["kwargs"], truth(member)["kwargs"]
    if expected == "smaller_batch":
        _check_batch_words(seen[0], kw_now["batch"] / kw_was["batch"], kw_now.get("accum", 1))
    if expected == "amp":
        assert ("autocast" in seen[0].label) == bool(kw_now.get("amp")), seen[0].label
        assert ("16-bit dtype" in seen[0].label) == (kw_now.get("dtype") == "bfloat16"), seen[0].label


def _check_batch_words(change: Change, batch_ratio: float, accum: int) -> None:
    """The ratio said is the batch's (one micro-batch's, over the incident's whole batch), within 8%:
    cuDNN's workspaces and the pass's fixed allocations do not scale with the batch."""
    per_pass = batch_ratio / accum
    said = float(re.search(r"(\d\.\d\d)x", change.label).group(1))  # type: ignore[union-attr]
    assert abs(said - per_pass) <= 0.08 * per_pass, (change.label, per_pass)
    assert ("micro-batches" in change.label) == (accum > 1), change.label
    assert change.config == (f"accumulation:{accum}" if accum > 1 else None)


def test_the_pairs_cover_each_kind_of_change() -> None:
    kinds = {expected_change(i, m) for i, m in PAIRS}
    assert kinds == {"smaller_batch", "amp", "activation_checkpointing", "eval_no_grad", *SETTING_IDS}
    shown = [m for i, m in PAIRS if expected_change(i, m) == "smaller_batch" and batch_shown(i, m)]
    silent = [m for i, m in PAIRS if expected_change(i, m) == "smaller_batch" and not batch_shown(i, m)]
    # Today's fixtures: two reruns that died in their first step after an incident that died in its first.
    assert sorted(silent) == ["fgpt_c60_batch12", "fres_c50_batch64"]
    assert len(shown) == 10


@pytest.mark.parametrize("series", sorted(SERIES))
def test_no_change_between_repeat_runs_of_one_program(series: str) -> None:
    """Seeds draw each step's sequence lengths: the passes' sizes move between runs as a batch would."""
    members = SERIES[series]
    assert len(members) == 10
    seen = {(a, b): compare(report(a), report(b)).applied for a, b in itertools.permutations(members, 2)}
    assert {pair: s for pair, s in seen.items() if s} == {}


def test_the_first_passes_of_two_seeds_differ_as_a_batch_would() -> None:
    """Why the batch needs steady passes: fseries' seeds' first passes ask for 0.40x-2.5x of each other."""
    firsts = [sum(report(n)["devices"][0]["signature"]["first_pass"]["sizes"]) for n in SERIES["fseries_main_"]]
    assert max(firsts) / min(firsts) > 2


def expected_outcome(incident: str, member: str, result: FollowUp) -> str:
    """The outcome the rules give (analysis/followup.py's docstring) for the report's prediction and what the
    rerun did, by its truth file; the prediction and whether it was the advised change are the report's."""
    died_before, died_now = truth(incident)["died_step"], truth(member)["died_step"]
    if died_before is None or not result.applied:
        return "unknown"
    if result.scored_change is None:  # nothing predicted for what was done: what it did is said beside
        return "unknown" if result.followed else "not_applied"
    if died_now is not None and died_now > died_before:
        return "postponed"
    answer = result.predicted.answer if result.predicted else "unknown"
    if answer == "unknown" or (result.horizon is not None and result.horizon.verdict == "ended_before"):
        return "unknown"
    if died_now is None:
        return "borne_out" if answer == "fixes" else "refuted"
    return "borne_out" if answer == "runs_out" else "refuted"


@pytest.mark.parametrize(("incident", "member"), PAIRS)
def test_each_outcome_is_the_one_the_rules_and_the_truth_give(incident: str, member: str) -> None:
    result = compare(report(incident), report(member))
    died_now = truth(member)["died_step"]
    assert result.actual.oom == (died_now is not None)
    # A run that died in step 0 records no step; the step is known where the other run of the job marks its
    # steps (Optimizer.step), unknown where neither does.
    marked = any(report(n)["devices"][0]["step_source"] for n in (incident, member))
    assert result.actual.oom_step == (died_now if marked else None)
    if truth(incident)["died_step"] is not None:
        assert result.incident_oom_step == (truth(incident)["died_step"] if marked else None)
    assert result.outcome == expected_outcome(incident, member, result), result.text


def test_a_report_stored_without_its_signature_shows_no_size_change() -> None:
    """Reports stored before ``devices[].signature``: the batch is not guessed from the other keys."""
    incident, rerun = report("fgpt_c80_default"), report("fgpt_c80_batch8")
    assert [c.id for c in compare(incident, rerun).applied] == ["smaller_batch"]
    del incident["devices"][0]["signature"]
    assert compare(incident, rerun).applied == ()


def test_the_step_zero_of_an_oom_needs_a_complete_trace() -> None:
    """fgpt_c60_default died in its first step (its truth), before any Optimizer.step ended: step 0 from the
    rerun's marks; a trace that dropped its first events could have died in any step."""
    incident, rerun = report("fgpt_c60_default"), report("fgpt_c60_bf16")
    assert truth("fgpt_c60_default")["died_step"] == 0 and incident["devices"][0]["steps"] == []
    assert compare(incident, rerun).incident_oom_step == 0
    incident["capture"]["trace_complete"] = False
    assert compare(incident, rerun).incident_oom_step is None
