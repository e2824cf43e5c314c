"""Did this run make memory worse than the baseline? Two run summaries (``oomscope.run/1``,
``analysis/runs.py``) in, one verdict out.

What counts as a regression, in order of weight:
- a new OOM: the run has an OOM rank and the baseline had none;
- with a noise model of the baseline branch (``analysis/noise.py``, learned from its last runs):
  the peak reserved memory, a stack's or a category's bytes at the peak grown beyond what the
  baseline's runs move by (each figure named: ``beyond_noise``);
- without one (too few baseline runs), or when the caller fixes a threshold (the gate's
  ``--max-regression``, an override): the run's peak reserved memory (the largest over its ranks)
  grew by more than the threshold (a share of the baseline's: ``max_regression_pct``);
What is reported beside it, without failing the gate on its own (a stack that moved up may be a
refactor, a new suggestion may follow a new setting): a new top stack at the peak (the site
holding the most on the run's largest rank differs from the baseline's), new causes (advisor
rules that fired now and not on the baseline), and the per-rank peak deltas.

A pure function of two dicts; the verdict is a frozen dataclass with one ``to_dict`` and a
one-paragraph ``reason`` that a CI log or a chat message can carry as it is. Its JSON never holds
NaN or Infinity (issue 36: ``?max_regression=nan`` came back as a bare ``NaN``, which strict JSON
parsers refuse): a threshold must be a finite percentage from 0 to ``MAX_THRESHOLD_PCT``
(``threshold_error`` says why not), and a share that is not finite is ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analysis.noise import Excess, NoiseModel, beyond_noise

SCHEMA = "oomscope.regression/1"
MAX_THRESHOLD_PCT = 1000.0  # the settings form's bound too (webapp RunPolicyForm)
NAMED_EXCESSES = 5  # figures beyond the noise named in the reason (all of them in ``beyond_noise``)


def threshold_error(pct: float) -> str | None:
    """Why ``pct`` cannot be a regression threshold (None: it can)."""
    if not math.isfinite(pct):
        return f"{pct!r} is not a finite percentage"
    if not 0 <= pct <= MAX_THRESHOLD_PCT:
        return f"{pct:g}% is outside 0-{MAX_THRESHOLD_PCT:g}%"
    return None


@dataclass(frozen=True)
class PeakDelta:
    name: str
    baseline_bytes: int
    run_bytes: int

    @property
    def delta_bytes(self) -> int:
        return self.run_bytes - self.baseline_bytes

    @property
    def share(self) -> float | None:
        if not self.baseline_bytes:
            return None
        share = round(self.delta_bytes / self.baseline_bytes, 4)
        return share if math.isfinite(share) else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "baseline_bytes": self.baseline_bytes,
            "run_bytes": self.run_bytes,
            "delta_bytes": self.delta_bytes,
            "share": self.share,
        }


@dataclass(frozen=True)
class Regression:
    regressed: bool
    max_regression_pct: float
    peak: tuple[PeakDelta, ...]  # run-level: peak reserved, peak allocated
    ranks: tuple[PeakDelta, ...]  # peak reserved of each rank present in both
    new_oom: bool
    new_top_stack: dict[str, str | None] | None  # {baseline, run} when the top site changed
    new_causes: tuple[str, ...]
    reason: str
    noise: NoiseModel | None = None  # the tolerance learned from the baseline branch (None: the fixed threshold)
    beyond_noise: tuple[Excess, ...] = ()

    @property
    def tolerance(self) -> str:
        """``noise`` (learned from the baseline branch's runs) or ``fixed`` (``max_regression_pct``)."""
        return "noise" if self.noise is not None else "fixed"

    @property
    def headline(self) -> str:
        """A few words for a table cell: the peak's change and what is new."""
        share = self.peak[0].share if self.peak else None
        parts = [f"peak {share * 100:+.2f}%" if share is not None else "peak not comparable"]
        if self.new_oom:
            parts.append("new OOM")
        if self.beyond_noise:
            n = len(self.beyond_noise)
            parts.append(f"{n} figure{'s' if n > 1 else ''} beyond noise")
        if self.new_top_stack:
            parts.append("new top stack")
        if self.new_causes:
            parts.append(f"{len(self.new_causes)} new finding{'s' if len(self.new_causes) > 1 else ''}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "regressed": self.regressed,
            "max_regression_pct": self.max_regression_pct,
            "peak": [d.to_dict() for d in self.peak],
            "ranks": [d.to_dict() for d in self.ranks],
            "new_oom": self.new_oom,
            "new_top_stack": self.new_top_stack,
            "new_causes": list(self.new_causes),
            "reason": self.reason,
            "headline": self.headline,
            "tolerance": self.tolerance,
            "noise": self.noise.to_dict() if self.noise is not None else None,
            "beyond_noise": [e.to_dict() for e in self.beyond_noise],
        }


def _largest_rank(summary: Mapping[str, Any]) -> Mapping[str, Any] | None:
    ranks = list(summary.get("ranks") or [])
    return max(ranks, key=lambda r: (int(r.get("peak_reserved_bytes") or 0), -int(r["rank"]))) if ranks else None


def _causes(summary: Mapping[str, Any]) -> list[str]:
    seen: list[str] = []
    for row in summary.get("ranks") or []:
        for cause in row.get("causes") or []:
            if cause not in seen:
                seen.append(cause)
    return seen


def _size(n: int) -> str:
    """Sizes as torch's ``format_size`` words them (MiB below a GiB, else GiB, two decimals)."""
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.2f} MiB"


def _figure(e: Excess) -> str:
    """``peak reserved``, ``stack <label>``, ``category activations``."""
    return e.spread.name if e.spread.kind == "peak" else f"{e.spread.kind} {e.spread.name}"


def _was(e: Excess) -> str:
    """The figure's centre; for a stack no baseline run listed, the most it can have held there (the
    smallest listed stack's bytes: ``analysis.noise``'s cutoff), so its growth is at least the delta."""
    if e.spread.kind == "stack" and e.spread.listed_runs == 0:
        return f"(listed in no baseline run: at most {_size(e.spread.centre_bytes)})"
    return _size(e.spread.centre_bytes)


def _noise_sentence(model: NoiseModel, found: Sequence[Excess]) -> str:
    """What grew beyond the baseline's noise, named, with the tolerance each figure had."""
    learned = f"{model.runs} runs of the baseline branch ({model.commits} commit{'s' if model.commits > 1 else ''})"
    if not found:
        return f"Every figure within the noise learned from {learned}."
    named = [
        f"{_figure(e)} {_was(e)} -> {_size(e.run_bytes)} "
        f"(+{_size(e.delta_bytes)}, tolerance {_size(e.spread.tolerance_bytes)})"
        for e in found[:NAMED_EXCESSES]
    ]
    more = len(found) - len(named)
    return f"Beyond the noise of {learned}: " + "; ".join(named) + (f"; and {more} more" if more > 0 else "") + "."


def compare_runs(
    baseline: Mapping[str, Any],
    run: Mapping[str, Any],
    *,
    max_regression_pct: float,
    baseline_name: str = "the baseline",
    run_name: str = "this run",
    noise: NoiseModel | None = None,
) -> Regression:
    """``run`` against ``baseline`` (both ``oomscope.run/1`` dicts): with ``noise`` (the baseline
    branch's model, ``analysis.noise.learn``) each figure against its own tolerance, else the peak
    under a threshold in percent (``ValueError`` where ``threshold_error`` refuses it)."""
    refused = threshold_error(max_regression_pct)
    if refused is not None:
        raise ValueError(f"max_regression_pct: {refused}")
    head_b, head_r = baseline.get("run") or {}, run.get("run") or {}
    peak = tuple(
        PeakDelta(name, int(head_b.get(key) or 0), int(head_r.get(key) or 0))
        for name, key in (("peak reserved", "peak_reserved_bytes"), ("peak allocated", "peak_allocated_bytes"))
    )
    base_ranks = {int(r["rank"]): r for r in baseline.get("ranks") or []}
    ranks = tuple(
        PeakDelta(
            f"rank {r['rank']}",
            int(base_ranks[int(r["rank"])]["peak_reserved_bytes"] or 0),
            int(r["peak_reserved_bytes"] or 0),
        )
        for r in run.get("ranks") or []
        if int(r["rank"]) in base_ranks
    )
    new_oom = bool(head_r.get("oom_ranks")) and not head_b.get("oom_ranks")
    top_b, top_r = _largest_rank(baseline), _largest_rank(run)
    site_b = top_b.get("top_site") if top_b else None
    site_r = top_r.get("top_site") if top_r else None
    new_top = {"baseline": site_b, "run": site_r} if site_r and site_r != site_b else None
    new_causes = tuple(c for c in _causes(run) if c not in _causes(baseline))

    reserved = peak[0]
    found = beyond_noise(noise, run) if noise is not None else ()
    if noise is not None:
        regressed = bool(found) or new_oom
    else:
        regressed = (reserved.share is not None and reserved.share * 100 > max_regression_pct) or new_oom
    sentences: list[str] = []
    if reserved.share is not None:
        verb = "grew" if reserved.delta_bytes > 0 else ("shrank" if reserved.delta_bytes < 0 else "did not change")
        learned = "tolerance learned from the baseline branch"
        limit = learned if noise is not None else f"threshold {max_regression_pct:g}%"
        sentences.append(
            f"Peak reserved memory {verb} from {_size(reserved.baseline_bytes)} in {baseline_name} to "
            f"{_size(reserved.run_bytes)} in {run_name} ({reserved.share * 100:+.2f}%, {limit})."
        )
    if noise is not None:
        sentences.append(_noise_sentence(noise, found))
    if new_oom:
        first = head_r.get("first_oom_rank")
        sentences.append(
            f"{run_name[:1].upper() + run_name[1:]} ran out of memory (first on rank {first}: "
            f"{head_r.get('first_oom_reason') or 'no reason recorded'}) where {baseline_name} did not."
        )
    if new_top:
        sentences.append(f"The largest stack at the peak is now {site_r} (was {site_b or 'none'}).")
    if new_causes:
        sentences.append("New findings: " + ", ".join(new_causes) + ".")
    sentences.insert(0, "Memory regression." if regressed else "No memory regression.")
    return Regression(
        regressed=regressed,
        max_regression_pct=max_regression_pct,
        peak=peak,
        ranks=ranks,
        new_oom=new_oom,
        new_top_stack=new_top,
        new_causes=new_causes,
        reason=" ".join(sentences),
        noise=noise,
        beyond_noise=found,
    )
