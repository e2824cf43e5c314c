"""The gate's noise model (``analysis/noise.py``) on real repeat runs of one workload (issue 33).

``tests/fixtures/followups`` (README there; H100, torch 2.11, 2026-12-05), each file through the ordinary
pipeline (``build_report``, ``summarise``, ``learn``, ``compare_runs``):

- ``fseries``: a 2-block GPT, seq drawn 256-768 per step; ten seeds ``fseries_main_s00..s09`` (peak
  reserved 1.20-2.65 GB); commit K (``fseries_cK_s1K``) keeps a buffer of K x 3% of s00's peak from the
  setup on, in a stack no main run has (``_feature_cache``).
- ``fnoise``: seq drawn 480-544, six steps, each step keeping features sized by its length in
  ``_feature_cache`` (the stack is in every main run, with its own noise); commit K adds K x 3% of s00's
  peak to that stack, once at setup and again in each step's features.

What the real runs say (``python scripts/noise_series.py`` prints it):

- the total moves far more than a fixed 5%: its learned tolerance is 1,874 MiB on fseries (centre 1,571
  MiB) and 362 MiB on fnoise (centre 1,660 MiB); the fixed 5% against the newest of the other nine flags
  7 of the ten fseries main runs and 2 of the fnoise ones (s03, s09), the noise model none;
- fseries: the gate catches commit 1 (the new stack, 38.22 MiB, against the 24 MiB the smallest listed
  stack of the main runs holds; the buffer's bytes counted as ``parameters``, +38.22 MiB past a 2 MiB
  tolerance); the total is within its noise at every commit; the fixed 5% flags commits 1, 2 and 5 and
  not 3, 4 and 6: it follows the sequence lengths, not the leak;
- fnoise: the gate catches commit 1 (the stack +102.26 MiB past its 4.45 MiB tolerance; ``parameters``
  +52.26 MiB, the buffer kept from the setup); the total is beyond its noise (and the fixed 5%) at commits
  1, 3, 5 and 6, and not at 2 and 4, where the leak is larger.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from analysis.noise import (
    FLOOR_BYTES,
    FLOOR_SHARE,
    PEAK,
    UNLISTED,
    NoiseModel,
    Spread,
    beyond_noise,
    learn,
    measures,
    stack_key,
)
from analysis.regression import compare_runs
from analysis.report import build_report
from analysis.runs import RankInput, summarise

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "followups"
FAMILIES = ("fseries", "fnoise")
SEEDS = range(10)
COMMITS = range(1, 7)
LEAK_SITE = "_feature_cache"  # the function the regression allocates in (scripts/capture_followups.py)
FIXED_PCT = 5.0  # the gate's --max-regression default


def _name(family: str, commit: int, seed: int) -> str:
    return f"{family}_main_s{seed:02d}" if commit == 0 else f"{family}_c{commit}_s1{commit}"


@functools.cache
def _summary(name: str) -> dict[str, Any]:
    path = FIXTURES / f"{name}.pickle.gz"
    report = build_report(path.read_bytes(), filename=path.name)
    return summarise([RankInput(rank=0, report=report)]).to_dict()


def _main(family: str, seed: int) -> dict[str, Any]:
    return _summary(_name(family, 0, seed))


def _commit(family: str, commit: int) -> dict[str, Any]:
    return _summary(_name(family, commit, 0))


def _leak_bytes(family: str, commit: int) -> int:
    truth = json.loads((FIXTURES / f"{_name(family, commit, 0)}.truth.json").read_text())
    return int(truth["kwargs"]["leak_bytes"])


@functools.cache
def _model(family: str, without: int | None = None) -> NoiseModel:
    model = learn([("main", _main(family, s)) for s in SEEDS if s != without])
    assert model is not None
    return model


def _baseline(family: str, without: int | None = None) -> dict[str, Any]:
    """The gate's baseline: the newest main run (of the ones the model learned from)."""
    return _main(family, max(s for s in SEEDS if s != without))


def _leak_stack(family: str, commit: int) -> tuple[str, int]:
    """The leaking stack's label and bytes at the peak in the commit's run."""
    found = [(name, v) for (kind, name), v in measures(_commit(family, commit)).items() if kind == "stack"]
    return next((name, v) for name, v in found if name.endswith(LEAK_SITE))


def _leak_spread(model: NoiseModel, label: str) -> Spread:
    """The stack's own spread where the main runs listed it, else the bound a new stack is judged by."""
    spread = model.spread("stack", label) or model.unlisted
    assert spread is not None
    return spread


@pytest.mark.parametrize("family", FAMILIES)
def test_the_total_moves_more_than_the_fixed_threshold(family: str) -> None:
    peaks = [_main(family, s)["run"]["peak_reserved_bytes"] for s in SEEDS]
    model = _model(family)
    peak = model.spread("peak", PEAK)
    assert peak is not None and min(peaks) <= peak.centre_bytes <= max(peaks)
    # the noise the total shows between seeds of one program is larger than the fixed 5%
    assert peak.tolerance_bytes > FIXED_PCT / 100 * peak.centre_bytes
    assert (max(peaks) - min(peaks)) / min(peaks) > 2 * FIXED_PCT / 100
    assert (model.runs, model.commits, model.centre_runs) == (10, 1, 10)
    for spread in model.spreads:  # a figure that never moved (parameters) still gets the floor
        assert spread.tolerance_bytes >= max(FLOOR_BYTES, int(FLOOR_SHARE * spread.centre_bytes))
    assert {s.name for s in model.spreads if s.kind == "category"} >= {"parameters", "activations", "optimizer_state"}


@pytest.mark.parametrize("family", FAMILIES)
def test_no_false_alarm_each_main_run_against_the_other_nine(family: str) -> None:
    fixed_alarms = []
    for seed in SEEDS:
        model, baseline = _model(family, seed), _baseline(family, seed)
        verdict = compare_runs(baseline, _main(family, seed), max_regression_pct=FIXED_PCT, noise=model)
        assert not verdict.regressed, (seed, verdict.reason)
        assert verdict.tolerance == "noise" and verdict.beyond_noise == ()
        if compare_runs(baseline, _main(family, seed), max_regression_pct=FIXED_PCT).regressed:
            fixed_alarms.append(seed)
    # the fixed 5% on the total, the same runs: fseries 7 of 10 flagged, fnoise 2 (the docstring)
    assert len(fixed_alarms) == {"fseries": 7, "fnoise": 2}[family], fixed_alarms


@pytest.mark.parametrize("family", FAMILIES)
def test_the_leak_is_caught_at_the_commit_that_crosses_its_stacks_noise(family: str) -> None:
    model, baseline = _model(family), _baseline(family)
    peak = model.spread("peak", PEAK)
    assert peak is not None
    crossings, caught, total_noise, total_fixed = [], [], [], []
    for commit in COMMITS:
        run = _commit(family, commit)
        label, held = _leak_stack(family, commit)
        spread = _leak_spread(model, label)
        verdict = compare_runs(baseline, run, max_regression_pct=FIXED_PCT, noise=model)
        named = {
            (e.spread.kind, stack_key(e.spread.name) if e.spread.kind == "stack" else e.spread.name): e
            for e in verdict.beyond_noise
        }
        if held - spread.centre_bytes > spread.tolerance_bytes:
            crossings.append(commit)
            assert ("stack", stack_key(label)) in named and label in verdict.reason
        if verdict.regressed:
            caught.append(commit)
            # nothing but what the leak grows: its stack, the totals, the categories its bytes are counted in
            assert all(kind != "stack" or name == stack_key(label) for kind, name in named), named
        if measures(run)[("peak", PEAK)] - peak.centre_bytes > peak.tolerance_bytes:
            total_noise.append(commit)
        if compare_runs(baseline, run, max_regression_pct=FIXED_PCT).regressed:
            total_fixed.append(commit)
    assert caught == crossings == list(COMMITS)  # caught at commit 1, the first to cross, and at every later one
    assert {"fseries": [], "fnoise": [1, 3, 5, 6]}[family] == total_noise
    assert {"fseries": [1, 2, 5], "fnoise": [1, 3, 5, 6]}[family] == total_fixed
    # the total misses a commit where the leak is larger than at one it flags: it follows the noise
    assert any(later not in total_fixed and later > min(total_fixed) for later in COMMITS)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_regression_names_the_stack_and_its_category(family: str) -> None:
    """Commit 1: the stack named with what it grew by; the buffer kept from the setup is counted as
    parameters (allocated before the first optimizer step and alive after the last), which grow by
    exactly the truth file's ``leak_bytes`` (rounded to the allocator's 512 B)."""
    model, run = _model(family), _commit(family, 1)
    found = {(e.spread.kind, e.spread.name): e for e in beyond_noise(model, run)}
    label, held = _leak_stack(family, 1)
    stack = found[("stack", label)]
    leak = _leak_bytes(family, 1)
    params = found[("category", "parameters")]
    assert 0 <= params.delta_bytes - leak < 512
    if family == "fseries":  # no main run lists the stack: judged against the most it could have held there
        assert model.spread("stack", label) is None and stack.spread.listed_runs == 0
        assert model.unlisted is not None and model.unlisted.name == UNLISTED
        assert stack.spread.centre_bytes == model.unlisted.centre_bytes
        assert stack.run_bytes == held and 0 <= held - leak < 512
        assert (
            "listed in no baseline run: at most"
            in compare_runs(_baseline(family), run, max_regression_pct=FIXED_PCT, noise=model).reason
        )
    else:  # every main run lists it: its own spread; the leak is in it twice (the kept buffer, each step's)
        assert stack.spread.listed_runs == 10
        assert stack.delta_bytes > stack.spread.tolerance_bytes > 0
        assert leak < stack.delta_bytes < 2 * leak + stack.spread.tolerance_bytes


def test_stacks_match_without_their_line_numbers() -> None:
    """A commit that adds a line above a call moves its label, not its memory: the same run with every
    stack label's line numbers shifted is judged as the run itself."""
    model = _model("fnoise")
    run = _main("fnoise", 0)
    shifted = json.loads(json.dumps(run))
    for rank in shifted["ranks"]:
        rank["peak_stacks"] = {_shift(label): v for label, v in rank["peak_stacks"].items()}
    assert shifted["ranks"][0]["peak_stacks"] != run["ranks"][0]["peak_stacks"]
    assert beyond_noise(model, shifted) == beyond_noise(model, run) == ()


def _shift(label: str) -> str:
    import re

    return re.sub(r"(?<=\S):(\d+)\b", lambda m: f":{int(m.group(1)) + 7}", label)


def test_a_category_that_took_anothers_bytes_is_no_regression() -> None:
    """fnoise_main_s03 peaks in its last step: that step's features outlive every optimizer step and
    count as ``unknown`` (134.75 MiB more than the other runs), where the others count them as
    ``activations``; the bytes at the peak, all categories together, stay within their noise."""
    model = _model("fnoise", 3)
    run = _main("fnoise", 3)
    figures = measures(run)
    unknown, activations = model.spread("category", "unknown"), model.spread("category", "activations")
    assert unknown is not None and activations is not None
    assert figures[("category", "unknown")] - unknown.centre_bytes > unknown.tolerance_bytes
    assert activations.centre_bytes - figures[("category", "activations")] > activations.tolerance_bytes
    assert beyond_noise(model, run) == ()


@pytest.mark.parametrize("family", FAMILIES)
def test_one_run_a_commit(family: str) -> None:
    """A main branch where each run is its own commit has no repeats to pool: the spread is then that of
    consecutive runs (``STEP_TO_MAD``). Before, it was none at all, every figure got the floor, and the
    leave-one-out runs flagged 7 of 10 on fseries and 5 of 10 on fnoise."""
    for seed in SEEDS:
        window = [(f"commit{s}", _main(family, s)) for s in SEEDS if s != seed]
        model = learn(window)
        assert model is not None and model.commits == 9 and model.centre_runs == 9
        verdict = compare_runs(window[-1][1], _main(family, seed), max_regression_pct=FIXED_PCT, noise=model)
        assert not verdict.regressed, (seed, verdict.reason)
    model = learn([(f"commit{s}", _main(family, s)) for s in SEEDS])
    assert model is not None
    caught = [c for c in COMMITS if beyond_noise(model, _commit(family, c))]
    assert caught == list(COMMITS)


def test_the_override_and_the_dict() -> None:
    """The verdict's JSON (contract.md, ``oomscope.regression/1``) on fseries commit 1: the model, the stack
    no main run listed with ``listed_runs`` 0 and the cutoffs' centre; the fixed threshold as an override."""
    model, run = _model("fseries"), _commit("fseries", 1)
    verdict = compare_runs(_baseline("fseries"), run, max_regression_pct=FIXED_PCT, noise=model).to_dict()
    assert verdict["tolerance"] == "noise" and verdict["regressed"]
    assert verdict["noise"]["runs"] == 10 and verdict["noise"]["unlisted"] == model.unlisted.to_dict()
    assert {s["name"] for s in verdict["noise"]["spreads"] if s["kind"] == "peak"} == {PEAK, "peak allocated"}
    assert all("listed_runs" in s for s in verdict["noise"]["spreads"] if s["kind"] == "stack")
    new = next(e for e in verdict["beyond_noise"] if e["kind"] == "stack")
    assert new["name"].endswith(LEAK_SITE) and new["listed_runs"] == 0
    assert new["centre_bytes"] == model.unlisted.centre_bytes and new["delta_bytes"] > new["tolerance_bytes"]
    fixed = compare_runs(_baseline("fseries"), run, max_regression_pct=FIXED_PCT).to_dict()
    assert fixed["tolerance"] == "fixed" and fixed["noise"] is None and fixed["beyond_noise"] == []
