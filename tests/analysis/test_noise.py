"""The gate that knows the noise (issue 33, item 3): ``analysis/noise.py`` and ``compare_runs(noise=)``
on a series of runs of one workload (``seeded_series``: the real ResNet capture, seeded repeats and
a leak that adds 3% of its stack a commit; how it is built is in that module's docstring).

The real repeat runs (``test_noise_real.py``) show the model on real noise; these stay for what ten real
runs of one commit cannot show: forty repeats beyond the window, a leak smaller than the noise at its first
commit (caught at the commit that crosses, not before), and a window of two commits (pooled spread).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import seeded_series

from analysis.noise import MIN_RUNS, beyond_noise, learn, measures
from analysis.regression import compare_runs

BASELINE_SEEDS = range(8)  # the baseline branch: eight repeat runs of one commit
REPEAT_SEEDS = range(100, 140)  # forty more repeats of the same code, never seen by the model
COMMITS = range(1, 11)  # ten commits of the leak


WORKLOADS = {"resnet": seeded_series.CAPTURE, "vit": seeded_series.SECOND}


@functools.cache
def _summary(seed: int, commit: int = 0, workload: str = "resnet") -> dict:
    return seeded_series.summary(seed, commit, WORKLOADS[workload])


@functools.cache
def _model(workload: str = "resnet"):
    return learn([("c0", _summary(seed, 0, workload)) for seed in BASELINE_SEEDS])


def _leaking_label(workload: str = "resnet") -> str:
    """The label the leak grows: the one of the stack's frames in the report (the largest growth of
    commit 10 over the model's centre among the stacks)."""
    grown = [e for e in beyond_noise(_model(workload), _summary(210, 10, workload)) if e.spread.kind == "stack"]
    return grown[0].spread.name


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_no_false_alarm_over_forty_repeats(workload: str):
    model = _model(workload)
    baseline = _summary(BASELINE_SEEDS[-1], 0, workload)
    for seed in REPEAT_SEEDS:
        verdict = compare_runs(baseline, _summary(seed, 0, workload), max_regression_pct=5.0, noise=model)
        assert not verdict.regressed, (seed, verdict.reason)
        assert verdict.tolerance == "noise" and verdict.beyond_noise == ()


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_the_leak_is_caught_on_the_commit_that_crosses_its_stacks_noise(workload: str):
    model = _model(workload)
    baseline = _summary(BASELINE_SEEDS[-1], 0, workload)
    label = _leaking_label(workload)
    spread = model.spread("stack", label)
    caught, crossings = [], []
    for commit in COMMITS:
        run = _summary(200 + commit, commit, workload)
        verdict = compare_runs(baseline, run, max_regression_pct=5.0, noise=model)
        crossed = measures(run)[("stack", label)] - spread.centre_bytes > spread.tolerance_bytes
        named = {(e.spread.kind, e.spread.name) for e in verdict.beyond_noise}
        if crossed:
            crossings.append(commit)
            assert verdict.regressed and ("stack", label) in named
            assert label in verdict.reason and "Beyond the noise of 8 runs" in verdict.reason
        if verdict.regressed:
            caught.append(commit)
            # only what the leak grows: its stack, the peak, the category its blocks are counted in
            assert named and all(kind != "stack" or name == label for kind, name in named), named
        # the fixed threshold on the total alone: green on (at least) the first nine commits
        fixed = compare_runs(baseline, run, max_regression_pct=5.0)
        assert fixed.tolerance == "fixed" and (commit == COMMITS[-1] or not fixed.regressed)
    # caught on the commit that crosses the stack's noise (resnet: 2), or before it where the leak's blocks
    # cross their category's first (vit: the temporaries at 2, the stack at 5), never a later one
    assert caught and crossings and caught[0] <= crossings[0] and caught[0] <= 3
    assert caught == list(range(caught[0], COMMITS[-1] + 1))  # once crossed, it stays crossed


def test_too_few_runs_learn_nothing_and_commits_are_pooled():
    runs = [("a", _summary(seed)) for seed in range(MIN_RUNS - 1)]
    assert learn(runs) is None
    # a change between commits is not noise: two commits of four repeats each, the second with the
    # leak of commit 10; the spread is pooled within each commit, the centre is the newest commit's
    pooled = learn([("a", _summary(s)) for s in range(4)] + [("b", _summary(300 + s, 10)) for s in range(4)])
    within = learn([("a", _summary(s)) for s in range(4)])
    label = _leaking_label()
    assert pooled.commits == 2 and pooled.centre_runs == 4
    assert pooled.spread("stack", label).centre_bytes > within.spread("stack", label).centre_bytes
    # the commit-to-commit jump did not widen the tolerance to cover it
    jump = pooled.spread("stack", label).centre_bytes - within.spread("stack", label).centre_bytes
    assert pooled.spread("stack", label).tolerance_bytes < jump


@pytest.mark.parametrize("seed", [0, 5])
def test_the_variant_is_the_capture_plus_its_blocks(seed):
    """The transformation adds what it says and nothing else: the leak of commit 3 adds 3 x 3% of
    the stack's bytes to the repeat of the same seed."""
    a, b = _summary(seed), _summary(seed, 3)
    label = _leaking_label()
    grown = measures(b)[("stack", label)] - measures(a)[("stack", label)]
    assert grown > 0
    assert measures(b)[("category", "parameters")] == measures(a)[("category", "parameters")]
