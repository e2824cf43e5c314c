"""The gate's tolerance learned from the baseline branch's repeat runs (issue 33, item 3).

A fixed threshold on the total ("peak reserved grew by more than 5%") is wrong both ways: a
workload whose batches vary in length moves by more than 5% from run to run and fails green
commits, while a leak that adds a few percent to one stack a commit hides under the total's
threshold for many commits. This module learns, from the last runs of the baseline branch, how
much each figure moves between runs of the same code, and names the figures that moved beyond it.

The figures (``measures``): the run's peak reserved and peak allocated memory, the bytes at the
peak of each listed stack (its label), and of each category (parameters, activations, ...), each
the largest over the run's ranks (``analysis/runs.py``'s ``peak_stacks`` / ``peak_categories``).

Robust on purpose (a few runs, one of which may be odd): for each figure, the centre is the
median over the baseline's own commit (its repeat runs; all the runs where that commit has fewer
than ``MIN_RUNS``), and the spread is the median absolute deviation of each run from the median
of its own commit, pooled over the commits (so a change between commits is not taken for noise);
where fewer than ``MIN_RUNS`` runs have a repeat of their commit (CI runs each commit once), it is the
median difference of consecutive runs over sqrt(2) (one change within the window is one outlier among
the differences, not the spread; with no spread at all every figure got the floor, and the real
series' repeats were flagged as often as the fixed 5% flags them).
The tolerance is ``K`` robust standard deviations (1.4826 x MAD), never below ``FLOOR_SHARE`` of
the centre nor ``FLOOR_BYTES``: too few repeats or a figure that never moved would otherwise
give a zero tolerance that any byte crosses.

What real repeat runs taught (``tests/fixtures/followups`` ``fseries_*`` / ``fnoise_*``,
``tests/analysis/test_noise_real.py``):

- Stacks are matched without their line numbers (``stack_key``): a commit that adds a line above
  a call moves its label, not its memory; two sites of one function that differ only in the line
  are summed as one figure.
- A report lists the ten largest stacks at the peak, so which stacks make the list shifts with
  the moment of the peak (a run whose peak falls before the optimizer's first step lists no
  optimizer state). A stack a baseline run did not list held at most that run's smallest listed
  stack (its ``cutoff``): that bound stands in for its bytes there, and a stack no baseline run
  listed (a new buffer) is judged against the cutoffs' own centre and spread (``unlisted``).
- Categories are a partition of the bytes at the peak, and which category a block lands in can
  depend on when the peak falls (a forward block of the last step outlives every optimizer step:
  ``unknown``, where the same block in an earlier step is ``activations``). So where some
  category shrank past its own tolerance (bytes moved, or the peak fell at another moment), no
  category's growth counts unless the peak allocated (all categories together) grew past its
  tolerance too.

A pure function of ``oomscope.run/1`` dicts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import median
from typing import Any

SCHEMA = "oomscope.noise/1"
MIN_RUNS = 3  # fewer baseline runs than this: no noise model, the fixed threshold decides
K = 4.0  # robust standard deviations; 4 keeps a false alarm rare over tens of repeats of 5-10 runs
MAD_TO_SD = 1.4826  # the MAD of a normal distribution times this is its standard deviation
FLOOR_SHARE = 0.01  # never a tighter tolerance than 1% of the figure
# the median |difference| of two draws of a normal distribution is sqrt(2) times its MAD
STEP_TO_MAD = 2**0.5
FLOOR_BYTES = 2 * 2**20  # nor than 2 MiB (a stack's few small tensors: no finding worth a red build)

PEAK = "peak reserved"
PEAK_ALLOCATED = "peak allocated"
UNLISTED = "a stack no baseline run listed at the peak"

Key = tuple[str, str]
_LINE = re.compile(r"(?<=\S):\d+\b")  # "functional.py:2846 batch_norm": the ":2846"


def stack_key(label: str) -> str:
    """A stack's label without its line numbers: what matches one stack across commits."""
    return _LINE.sub("", label)


def _key(kind: str, name: str) -> Key:
    return (kind, stack_key(name) if kind == "stack" else name)


@dataclass(frozen=True)
class Spread:
    """One figure over the baseline runs: its centre, its spread and the tolerance drawn from them."""

    kind: str  # "peak", "stack" or "category"
    name: str
    centre_bytes: int
    mad_bytes: int
    tolerance_bytes: int
    listed_runs: int | None = None  # stacks: baseline runs that listed it (the others count their cutoff)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "name": self.name,
            "centre_bytes": self.centre_bytes,
            "mad_bytes": self.mad_bytes,
            "tolerance_bytes": self.tolerance_bytes,
        }
        if self.listed_runs is not None:
            out["listed_runs"] = self.listed_runs
        return out


@dataclass(frozen=True)
class Excess:
    """A figure of the run beyond its tolerance: grown by more than the baseline's runs ever move."""

    spread: Spread
    run_bytes: int

    @property
    def delta_bytes(self) -> int:
        return self.run_bytes - self.spread.centre_bytes

    def to_dict(self) -> dict[str, Any]:
        return self.spread.to_dict() | {"run_bytes": self.run_bytes, "delta_bytes": self.delta_bytes}


@dataclass(frozen=True)
class NoiseModel:
    runs: int  # baseline runs it was learned from
    commits: int  # distinct commits among them (runs without one count as one commit)
    centre_runs: int  # runs the centre is the median of
    spreads: tuple[Spread, ...]  # the peaks first, then stacks and categories by name
    k: float = K
    unlisted: Spread | None = None  # the cutoffs: what a stack new to the list is judged against

    def spread(self, kind: str, name: str) -> Spread | None:
        key = _key(kind, name)
        return next((s for s in self.spreads if _key(s.kind, s.name) == key), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "runs": self.runs,
            "commits": self.commits,
            "centre_runs": self.centre_runs,
            "k": self.k,
            "floor_share": FLOOR_SHARE,
            "floor_bytes": FLOOR_BYTES,
            "spreads": [s.to_dict() for s in self.spreads],
            "unlisted": self.unlisted.to_dict() if self.unlisted is not None else None,
        }


def measures(summary: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    """A run's figures: ``(kind, name) -> bytes``, each the largest over its ranks (stacks by label)."""
    run = summary.get("run") or {}
    out: dict[tuple[str, str], int] = {("peak", PEAK): int(run.get("peak_reserved_bytes") or 0)}
    if run.get("peak_allocated_bytes"):  # summaries stored before it was read have none
        out[("peak", PEAK_ALLOCATED)] = int(run["peak_allocated_bytes"])
    for rank in summary.get("ranks") or []:
        for kind, key in (("stack", "peak_stacks"), ("category", "peak_categories")):
            for name, value in (rank.get(key) or {}).items():
                out[(kind, str(name))] = max(out.get((kind, str(name)), 0), int(value or 0))
    return out


@dataclass(frozen=True)
class _Figures:
    values: dict[Key, int]  # stacks by ``stack_key``, summed over the labels that share one
    labels: dict[Key, str]  # a stack key's label as the run words it (its largest label)
    cutoff: int | None  # the smallest listed stack's bytes (largest over ranks); None: no stacks listed


def _figures(summary: Mapping[str, Any]) -> _Figures:
    values: dict[Key, int] = {}
    labels: dict[Key, tuple[int, str]] = {}
    cutoff: int | None = None
    for (kind, name), value in measures(summary).items():
        if kind != "stack":
            values[(kind, name)] = value
    for rank in summary.get("ranks") or []:
        listed = {str(k): int(v or 0) for k, v in (rank.get("peak_stacks") or {}).items()}
        summed: dict[Key, int] = {}
        for label, value in listed.items():
            key = _key("stack", label)
            summed[key] = summed.get(key, 0) + value
            labels[key] = max(labels.get(key, (value, label)), (value, label))
        for key, value in summed.items():
            values[key] = max(values.get(key, 0), value)
        if listed:
            cutoff = max(cutoff or 0, min(listed.values()))
    return _Figures(values, {k: label for k, (_, label) in labels.items()}, cutoff)


def _tolerance(centre: float, mad: float, k: float) -> int:
    return round(max(k * MAD_TO_SD * mad, FLOOR_SHARE * abs(centre), FLOOR_BYTES))


def _spread(
    kind: str, name: str, values: Sequence[tuple[str, int]], newest: str, k: float, listed: int | None = None
) -> Spread:
    """One figure from its ``(commit, bytes)`` over the baseline runs, oldest first."""
    centre_values = [v for c, v in values if c == newest]
    if len(centre_values) < MIN_RUNS:
        centre_values = [v for _, v in values]
    by_commit: dict[str, list[int]] = {}
    for commit, value in values:
        by_commit.setdefault(commit, []).append(value)
    deviations = [v - median(group) for group in by_commit.values() if len(group) >= 2 for v in group]
    if len(deviations) >= MIN_RUNS:
        mad = median(abs(d) for d in deviations)
    else:  # (nearly) one run a commit: the spread of consecutive runs, so one change in the window is one outlier
        steps = [abs(b - a) for (_, a), (_, b) in pairwise(values)]
        mad = median(steps) / STEP_TO_MAD if steps else 0.0
    centre = median(centre_values)
    return Spread(kind, name, round(centre), round(mad), _tolerance(centre, mad, k), listed)


def learn(runs: Sequence[tuple[str | None, Mapping[str, Any]]], *, k: float = K) -> NoiseModel | None:
    """The noise of the baseline branch from its runs, oldest first, each ``(commit, summary)``;
    the last run is the baseline (its commit's runs give the centre). None below ``MIN_RUNS`` runs."""
    if len(runs) < MIN_RUNS:
        return None
    figures = [(commit or "", _figures(summary)) for commit, summary in runs]
    newest = figures[-1][0]
    commits = len({c for c, _ in figures})
    others = set.intersection(*({k_ for k_ in f.values if k_[0] != "stack"} for _, f in figures))
    bounded = all(f.cutoff is not None for _, f in figures)
    stack_keys = {k_ for _, f in figures for k_ in f.values if k_[0] == "stack"}
    if not bounded:  # a run listed no stack: no bound for the ones it did not list; judge the shared ones
        stack_keys = {key for key in stack_keys if all(key in f.values for _, f in figures)}
    order = {"peak": 0, "stack": 1, "category": 2}
    spreads = []
    for key in sorted(others | stack_keys, key=lambda kn: (order[kn[0]], kn[1] != PEAK, kn[1])):
        # a stack a run did not list held at most that run's smallest listed stack
        values = [(c, f.values.get(key, f.cutoff or 0)) for c, f in figures]
        if key[0] != "stack":
            spreads.append(_spread(key[0], key[1], values, newest, k))
            continue
        label = next(f.labels[key] for _, f in reversed(figures) if key in f.labels)
        listed = sum(key in f.values for _, f in figures)
        spreads.append(_spread("stack", label, values, newest, k, listed))
    unlisted = _spread("stack", UNLISTED, [(c, f.cutoff or 0) for c, f in figures], newest, k, 0) if bounded else None
    return NoiseModel(
        runs=len(runs),
        commits=commits,
        centre_runs=_centre_runs(figures, newest),
        spreads=tuple(spreads),
        k=k,
        unlisted=unlisted,
    )


def _centre_runs(figures: Sequence[tuple[str, _Figures]], newest: str) -> int:
    same = sum(c == newest for c, _ in figures)
    return same if same >= MIN_RUNS else len(figures)


def _beyond(spread: Spread, value: int) -> bool:
    return value - spread.centre_bytes > spread.tolerance_bytes


def beyond_noise(model: NoiseModel, summary: Mapping[str, Any]) -> tuple[Excess, ...]:
    """The run's figures that grew past their tolerance, the largest growth first (a figure that
    shrank is never one: the gate is about memory getting worse)."""
    found = _figures(summary)
    known = {_key(s.kind, s.name): s for s in model.spreads}
    out = [
        Excess(s, found.values[key])
        for key, s in known.items()
        if key in found.values and _beyond(s, found.values[key])
    ]
    if model.unlisted is not None:  # a stack no baseline run listed, against the most it can have held there
        u = model.unlisted
        for key, value in found.values.items():
            if key[0] == "stack" and key not in known and _beyond(u, value):
                spread = Spread("stack", found.labels[key], u.centre_bytes, u.mad_bytes, u.tolerance_bytes, 0)
                out.append(Excess(spread, value))
    if not _categories_comparable(known, found.values):
        out = [e for e in out if e.spread.kind != "category"]
    out.sort(key=lambda e: (-e.delta_bytes, e.spread.kind, e.spread.name))
    return tuple(out)


def _categories_comparable(known: Mapping[Key, Spread], values: Mapping[Key, int]) -> bool:
    """False where some category shrank past its tolerance while the bytes at the peak, all
    categories together, stayed within theirs: bytes that changed category (or a peak at another
    moment of the step), not memory added."""
    shrank = any(
        key[0] == "category" and key in values and s.centre_bytes - values[key] > s.tolerance_bytes
        for key, s in known.items()
    )
    if not shrank:
        return True
    total = known.get(("peak", PEAK_ALLOCATED))
    return total is not None and ("peak", PEAK_ALLOCATED) in values and _beyond(total, values[("peak", PEAK_ALLOCATED)])
