"""The gate's tolerance learned from the baseline branch's repeat runs (issue 33, item 3).

A fixed threshold on the total ("peak reserved grew by more than 5%") is wrong both ways: a
workload whose batches vary in length moves by more than 5% from run to run and fails green
commits, while a leak that adds a few percent to one stack a commit hides under the total's
threshold for many commits. This module learns, from the last runs of the baseline branch, how
much each figure moves between runs of the same code, and names the figures that moved beyond it.

The figures (``measures``): the run's peak reserved memory, the bytes at the peak of each listed
stack (its label), and of each category (parameters, activations, ...), each the largest over the
run's ranks (``analysis/runs.py``'s ``peak_stacks`` / ``peak_categories``).

Robust on purpose (a few runs, one of which may be odd): for each figure, the centre is the
median over the baseline's own commit (its repeat runs; all the runs where that commit has fewer
than ``MIN_RUNS``), and the spread is the median absolute deviation of each run from the median
of its own commit, pooled over the commits (so a change between commits is not taken for noise).
The tolerance is ``K`` robust standard deviations (1.4826 x MAD), never below ``FLOOR_SHARE`` of
the centre nor ``FLOOR_BYTES``: too few repeats or a figure that never moved would otherwise
give a zero tolerance that any byte crosses.

A stack is judged only where every baseline run listed it (which stacks make the top list at the
peak shifts between runs; a stack new to the list is reported by ``analysis/regression.py`` as a
new top stack, not as a regression). A pure function of ``oomscope.run/1`` dicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

SCHEMA = "oomscope.noise/1"
MIN_RUNS = 3  # fewer baseline runs than this: no noise model, the fixed threshold decides
K = 4.0  # robust standard deviations; 4 keeps a false alarm rare over tens of repeats of 5-10 runs
MAD_TO_SD = 1.4826  # the MAD of a normal distribution times this is its standard deviation
FLOOR_SHARE = 0.01  # never a tighter tolerance than 1% of the figure
FLOOR_BYTES = 2 * 2**20  # nor than 2 MiB (a stack's few small tensors: no finding worth a red build)

PEAK = "peak reserved"


@dataclass(frozen=True)
class Spread:
    """One figure over the baseline runs: its centre, its spread and the tolerance drawn from them."""

    kind: str  # "peak", "stack" or "category"
    name: str
    centre_bytes: int
    mad_bytes: int
    tolerance_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "centre_bytes": self.centre_bytes,
            "mad_bytes": self.mad_bytes,
            "tolerance_bytes": self.tolerance_bytes,
        }


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
    spreads: tuple[Spread, ...]  # the peak first, then stacks and categories by name
    k: float = K

    def spread(self, kind: str, name: str) -> Spread | None:
        return next((s for s in self.spreads if s.kind == kind and s.name == name), None)

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
        }


def measures(summary: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    """A run's figures: ``(kind, name) -> bytes``, each the largest over its ranks."""
    ranks = list(summary.get("ranks") or [])
    out: dict[tuple[str, str], int] = {("peak", PEAK): int((summary.get("run") or {}).get("peak_reserved_bytes") or 0)}
    for rank in ranks:
        for kind, key in (("stack", "peak_stacks"), ("category", "peak_categories")):
            for name, value in (rank.get(key) or {}).items():
                out[(kind, str(name))] = max(out.get((kind, str(name)), 0), int(value or 0))
    return out


def _tolerance(centre: float, mad: float, k: float) -> int:
    return round(max(k * MAD_TO_SD * mad, FLOOR_SHARE * abs(centre), FLOOR_BYTES))


def learn(runs: Sequence[tuple[str | None, Mapping[str, Any]]], *, k: float = K) -> NoiseModel | None:
    """The noise of the baseline branch from its runs, oldest first, each ``(commit, summary)``;
    the last run is the baseline (its commit's runs give the centre). None below ``MIN_RUNS`` runs."""
    if len(runs) < MIN_RUNS:
        return None
    figures = [(commit or "", measures(summary)) for commit, summary in runs]
    newest = figures[-1][0]
    centre_group = [m for c, m in figures if c == newest]
    if len(centre_group) < MIN_RUNS:
        centre_group = [m for _, m in figures]
    shared = set.intersection(*(set(m) for _, m in figures))
    by_commit: dict[str, list[dict[tuple[str, str], int]]] = {}
    for commit, m in figures:
        by_commit.setdefault(commit, []).append(m)
    repeated = [group for group in by_commit.values() if len(group) >= 2]
    spreads = []
    order = {"peak": 0, "stack": 1, "category": 2}
    for key in sorted(shared, key=lambda kn: (order[kn[0]], kn[1])):
        deviations = [m[key] - median(g[key] for g in group) for group in repeated for m in group]
        mad = median(abs(d) for d in deviations) if deviations else 0.0
        centre = median(m[key] for m in centre_group)
        spreads.append(Spread(key[0], key[1], round(centre), round(mad), _tolerance(centre, mad, k)))
    return NoiseModel(
        runs=len(runs), commits=len(by_commit), centre_runs=len(centre_group), spreads=tuple(spreads), k=k
    )


def beyond_noise(model: NoiseModel, summary: Mapping[str, Any]) -> tuple[Excess, ...]:
    """The run's figures that grew past their tolerance, the largest growth first (a figure that
    shrank is never one: the gate is about memory getting worse)."""
    found = measures(summary)
    out = [
        Excess(spread, found[(spread.kind, spread.name)])
        for spread in model.spreads
        if (spread.kind, spread.name) in found
        and found[(spread.kind, spread.name)] - spread.centre_bytes > spread.tolerance_bytes
    ]
    out.sort(key=lambda e: (-e.delta_bytes, e.spread.kind, e.spread.name))
    return tuple(out)
