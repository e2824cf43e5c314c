"""Many ranks as one run: the per-rank reports of a distributed job read side by side.

A job of N ranks leaves N snapshots, one per process, and N reports that know nothing of
each other. This module reads those reports (plus what each rank said when it died, from
the client's sidecar or the upload's fields) and answers the run's questions:

- each rank's peaks, side by side, and the imbalance (max / mean of the peak reserved memory:
  1.0 is perfectly even);
- which rank ran out of memory first (the earliest fatal OOM on the snapshots' clock, which
  torch writes as wall-clock microseconds, so ranks of one host compare directly) and why (the
  report's own decision headline);
- which ranks failed because a peer died: their error is a collective's (gloo's "Connection
  closed by peer", an NCCL abort, the c10d watchdog), not an out-of-memory error;
- the stacks that differ between ranks: a site of user code listed at one rank's peak and not
  at another's, or with bytes that differ by more than ``STACK_SPREAD_SHARE``.

A pure function of report dicts (``summarise``); the result is a frozen dataclass with one
``to_dict`` (contract ``oomscope.run/1``, docs/contract.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from analysis.compare import OTHER, main_device, site_key

SCHEMA = "oomscope.run/1"

# A site's bytes at the peak that differ between ranks by more than this share of the largest
# are listed as a difference; below it, ranks of a data-parallel job differ by batch contents.
STACK_SPREAD_SHARE = 0.10

# What a collective says when its peer is gone. Order does not matter; each is matched
# case-insensitively anywhere in the rank's error text. Sources: gloo's tcp pair
# ("Connection closed by peer", "Connection reset by peer"), NCCL ("NCCL error",
# "NCCL communicator was aborted", "ncclRemoteError"), c10d ("DistBackendError", the
# watchdog's "Watchdog caught collective operation timeout", a store's "Broken pipe"),
# and the elastic agent's "SignalException" when it stops the survivors.
PEER_FAILURE_PATTERNS = (
    r"connection closed by peer",
    r"connection reset by peer",
    r"nccl error",
    r"ncclremoteerror",
    r"nccl communicator was aborted",
    r"distbackenderror",
    r"watchdog caught collective operation timeout",
    r"processgroup(gloo|nccl)",
    r"gloo/transport",
    r"broken pipe",
    r"signalexception",
)
_PEER = re.compile("|".join(PEER_FAILURE_PATTERNS), re.IGNORECASE)
_OOM_TEXT = re.compile(r"out of memory", re.IGNORECASE)
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


class RunInputError(ValueError):
    """Rank files that cannot make one run (a rank given twice, a sidecar with several); ``code``
    is ``run:<reason>``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    @property
    def code(self) -> str:
        return f"run:{self.reason}"


def rank_from_name(name: str) -> int | None:
    """``rank3`` / ``rank-3`` / ``rank_3`` in a file name, as launch scripts name per-rank dumps."""
    found = _RANK_IN_NAME.search(name)
    return int(found.group(1)) if found else None


def failure_kind(*, oom: bool, error: str | None) -> str:
    """``oom`` (the rank's own trace, or its error text, is an out-of-memory error), ``peer`` (a
    collective's error: a peer is gone), ``error`` (another error), or ``none`` (no OOM, no error sent)."""
    if oom:
        return "oom"
    if not error:
        return "none"
    if _OOM_TEXT.search(error):
        return "oom"
    if _PEER.search(error):
        return "peer"
    return "error"


@dataclass(frozen=True)
class RankInput:
    """One rank's report and what the rank said when it died (None: nothing was sent)."""

    rank: int
    report: Mapping[str, Any]
    error: str | None = None


@dataclass(frozen=True)
class RankFigures:
    rank: int
    filename: str
    device: int | None
    events: int
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    peak_is_lower_bound: bool
    oom: bool
    oom_time_us: int | None
    verdict: str | None
    headline: str | None
    failure: str  # failure_kind
    error: str | None
    first_time_us: int | None
    last_time_us: int | None
    top_site: str | None = None  # the user-code site holding the most at the peak
    causes: tuple[str, ...] = ()  # the advisor's suggestion ids (its rules that fired), in its order
    # What the gate's noise model reads (analysis/noise.py): bytes at the peak per listed stack (its
    # label: the frames that allocated, not only the user site) and per category (parameters, ...).
    peak_stacks: dict[str, int] = field(default_factory=dict)
    peak_categories: dict[str, int] = field(default_factory=dict)
    # The rank's first-screen change ({id, line, kind, title}); the run page shows the first OOM rank's.
    change: Mapping[str, Any] | None = None
    request_verdict: str | None = None  # the failing request's own verdict, where ``verdict`` is the run's

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "filename": self.filename,
            "device": self.device,
            "events": self.events,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_is_lower_bound": self.peak_is_lower_bound,
            "oom": self.oom,
            "oom_time_us": self.oom_time_us,
            "verdict": self.verdict,
            "headline": self.headline,
            "failure": self.failure,
            "error": self.error,
            "first_time_us": self.first_time_us,
            "last_time_us": self.last_time_us,
            "top_site": self.top_site,
            "causes": list(self.causes),
            "peak_stacks": dict(self.peak_stacks),
            "peak_categories": dict(self.peak_categories),
            "change": dict(self.change) if self.change else None,
            "request_verdict": self.request_verdict,
        }


@dataclass(frozen=True)
class StackSpread:
    """A site of user code whose bytes at the peak differ between ranks (None: not listed there)."""

    site: str
    bytes_by_rank: dict[int, int | None]

    @property
    def spread_bytes(self) -> int:
        values = [v or 0 for v in self.bytes_by_rank.values()]
        return max(values) - min(values)

    def to_dict(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "bytes_by_rank": {str(k): v for k, v in sorted(self.bytes_by_rank.items())},
            "spread_bytes": self.spread_bytes,
            "absent_on": sorted(k for k, v in self.bytes_by_rank.items() if v is None),
        }


@dataclass(frozen=True)
class RunSummary:
    world_size: int | None
    ranks: tuple[RankFigures, ...]
    first_oom_rank: int | None
    first_oom_reason: str | None
    imbalance: dict[str, float | None]
    peer_failed_ranks: tuple[int, ...]
    differing_stacks: tuple[StackSpread, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def first_oom_change(self) -> dict[str, Any] | None:
        """The first OOM rank's change (its first screen's ``decision.change``): what to do about the run."""
        first = next((r for r in self.ranks if r.rank == self.first_oom_rank), None)
        return dict(first.change) if first is not None and first.change else None

    @property
    def missing_ranks(self) -> list[int]:
        if not self.world_size:
            return []
        have = {r.rank for r in self.ranks}
        return [r for r in range(self.world_size) if r not in have]

    @property
    def peak_reserved_bytes(self) -> int:
        return max((r.peak_reserved_bytes for r in self.ranks), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "run": {
                "world_size": self.world_size,
                "ranks_reported": len(self.ranks),
                "missing_ranks": self.missing_ranks,
                "first_oom_rank": self.first_oom_rank,
                "first_oom_reason": self.first_oom_reason,
                "first_oom_change": self.first_oom_change,
                "oom_ranks": [r.rank for r in self.ranks if r.failure == "oom"],
                "peer_failed_ranks": list(self.peer_failed_ranks),
                "imbalance": self.imbalance,
                "peak_reserved_bytes": self.peak_reserved_bytes,
                "peak_allocated_bytes": max((r.peak_allocated_bytes for r in self.ranks), default=0),
                "differing_stacks": [s.to_dict() for s in self.differing_stacks],
                "notes": list(self.notes),
            },
            "ranks": [r.to_dict() for r in self.ranks],
        }


def _figures(item: RankInput) -> RankFigures:
    dev = main_device(item.report) or {}
    sites = _peak_sites(item.report)
    summary = dev.get("summary") or {}
    oom = dev.get("oom") if isinstance(dev.get("oom"), Mapping) else None
    decision = dev.get("decision") if isinstance(dev.get("decision"), Mapping) else None
    return RankFigures(
        rank=item.rank,
        filename=str((item.report.get("source") or {}).get("filename") or ""),
        device=dev.get("device"),
        events=int(dev.get("events") or 0),
        peak_reserved_bytes=int(summary.get("peak_reserved_bytes") or 0),
        peak_allocated_bytes=int(summary.get("peak_allocated_bytes") or 0),
        peak_is_lower_bound=bool(summary.get("peak_is_lower_bound")),
        oom=oom is not None,
        oom_time_us=int(oom["time_us"]) if oom is not None and oom.get("time_us") is not None else None,
        verdict=_run_verdict(oom, decision),
        request_verdict=str(oom.get("verdict")) if oom is not None and oom.get("verdict") else None,
        headline=str(decision.get("headline")) if decision and decision.get("headline") else None,
        failure=failure_kind(oom=oom is not None, error=item.error),
        error=item.error or None,
        first_time_us=summary.get("first_time_us"),
        last_time_us=summary.get("last_time_us"),
        top_site=max(sites, key=lambda k: (sites[k], k)) if sites else None,
        causes=tuple(str(row.get("id")) for row in dev.get("suggestions") or [] if row.get("id")),
        peak_stacks=_peak_stacks(item.report),
        peak_categories=_peak_categories(item.report),
        change=decision.get("change") if decision and isinstance(decision.get("change"), Mapping) else None,
    )


def _run_verdict(oom: Mapping[str, Any] | None, decision: Mapping[str, Any] | None) -> str | None:
    """The word the rank table says beside the run's headline (issue 35: "out of memory (fragmentation)" stood
    beside a "growing workload" headline): the program cause the first screen names, else the run-level
    verdict (``oom.run_verdict``), else the request's."""
    if oom is None:
        return None
    if decision and decision.get("cause"):
        return str(decision.get("cause_label") or decision["cause"]).replace("_", " ")
    word = oom.get("run_verdict") or oom.get("verdict")
    return str(word) if word else None


def _ratio_to_mean(values: Sequence[int]) -> float | None:
    """max / mean, rounded to 4 places; None without two ranks or without memory."""
    if len(values) < 2 or not any(values):
        return None
    mean = sum(values) / len(values)
    return round(max(values) / mean, 4)


def _first_oom(ranks: Sequence[RankFigures]) -> RankFigures | None:
    """The rank whose fatal OOM came first on the common clock; a rank whose OOM has no time
    (an error text only) sorts after every timed one, then by rank."""
    dead = [r for r in ranks if r.failure == "oom"]
    if not dead:
        return None
    return min(dead, key=lambda r: (r.oom_time_us is None, r.oom_time_us or 0, r.rank))


def _peak_sites(report: Mapping[str, Any]) -> dict[str, int]:
    dev = main_device(report) or {}
    out: dict[str, int] = {}
    for row in dev.get("top_stacks") or []:
        if row.get("when") != "peak":
            continue
        key = site_key(row)
        if key == OTHER:
            continue  # the rest, under the listed rows: no site to compare
        out[key] = out.get(key, 0) + int(row.get("bytes") or 0)
    return out


def _peak_stacks(report: Mapping[str, Any]) -> dict[str, int]:
    """Bytes at the peak per listed stack label (groups of one label summed; the rest row left out:
    which stacks it holds changes from run to run)."""
    dev = main_device(report) or {}
    out: dict[str, int] = {}
    for row in dev.get("top_stacks") or []:
        label = str(row.get("label") or "")
        if row.get("when") != "peak" or not label or (row.get("site") is None and label.startswith("other stacks")):
            continue
        out[label] = out.get(label, 0) + int(row.get("bytes") or 0)
    return out


def _peak_categories(report: Mapping[str, Any]) -> dict[str, int]:
    cats = (main_device(report) or {}).get("categories")
    if not isinstance(cats, Mapping):
        return {}
    return {str(k): int(v or 0) for k, v in (cats.get("bytes") or {}).items()}


def differing_stacks(items: Sequence[RankInput], share: float = STACK_SPREAD_SHARE) -> list[StackSpread]:
    """Sites at the peak listed on some ranks only, or whose bytes differ by more than ``share``
    of the largest; the widest spread first."""
    if len(items) < 2:
        return []
    by_rank = {item.rank: _peak_sites(item.report) for item in items}
    sites = sorted({site for sites in by_rank.values() for site in sites})
    out: list[StackSpread] = []
    for site in sites:
        values = {rank: sites_of.get(site) for rank, sites_of in by_rank.items()}
        present = [v for v in values.values() if v is not None]
        if len(present) == len(values) and max(present) - min(present) <= share * max(present):
            continue
        out.append(StackSpread(site=site, bytes_by_rank=values))
    out.sort(key=lambda s: (-s.spread_bytes, s.site))
    return out


def summarise(items: Sequence[RankInput], *, world_size: int | None = None) -> RunSummary:
    """The run's summary from its ranks' reports (any order; a rank given twice keeps its first)."""
    seen: dict[int, RankInput] = {}
    for item in items:
        seen.setdefault(item.rank, item)
    ordered = [seen[k] for k in sorted(seen)]
    ranks = tuple(_figures(item) for item in ordered)
    first = _first_oom(ranks)
    notes: list[str] = []
    if first is not None and first.oom_time_us is None:
        notes.append(f"rank {first.rank}'s OOM is known from its error text only; its time is not recorded")
    quiet = [r.rank for r in ranks if r.failure == "none"]
    if first is not None and quiet:
        who = ("rank " if len(quiet) == 1 else "ranks ") + ", ".join(str(r) for r in quiet)
        notes.append(f"{who} sent no error: stopped by the launcher after the first failure, or finished")
    return RunSummary(
        world_size=world_size,
        ranks=ranks,
        first_oom_rank=first.rank if first else None,
        first_oom_reason=(first.headline or (f"out of memory ({first.verdict})" if first.verdict else first.error))
        if first
        else None,
        imbalance={
            "peak_reserved": _ratio_to_mean([r.peak_reserved_bytes for r in ranks]),
            "peak_allocated": _ratio_to_mean([r.peak_allocated_bytes for r in ranks]),
        },
        peer_failed_ranks=tuple(r.rank for r in ranks if r.failure == "peer"),
        differing_stacks=tuple(differing_stacks(ordered)),
        notes=tuple(notes),
    )
