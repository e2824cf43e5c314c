"""The decision's reading of one device's contract entry: its figures, typed, read once (``DecisionInput.of``).

The report's own entry and a stored one (after ``stored.upgrade``) are read alike; what a stored report of an
older shape may lack reads as nothing (0, None, an empty list). ``analysis.decision`` decides from these
figures alone; the sentences that read the entry's nested sections (the phases at the OOM, the private pools)
are made here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from analysis import readout

# Suggestions that are not a change to the workload or its settings.
_NOT_A_CHANGE = frozenset({"capture_settings"})


@dataclass(frozen=True)
class OomFacts:
    """The device's last OOM as the decision reads it (``devices[].oom``; a missing size reads as 0)."""

    raw: Mapping[str, Any]  # the entry's ``oom`` (with torch's "tried to allocate" size), for oom.py and readout
    event_index: int
    tried: int  # the size torch's message names (``tried_to_allocate_bytes``), else the request
    allocated: int
    limit: int
    limit_is_lower_bound: bool  # a stored report comes through analysis.stored.upgrade
    limit_kind: str | None
    limit_source: str | None
    verdict: str | None
    verdict_certain: bool | None
    verdict_level: str | None
    request_verdict: str | None
    cached_free: int
    device_free: int
    reserved: int
    step_need: int  # the projected step's need; 0 where the step was not projected
    ooms_in_trace: int
    projected: bool  # the failing step was projected (``oom.projection.available``)

    @property
    def device_full_unexplained(self) -> bool:
        """The device itself ran out (no per-process cap) and no OOM message says what held the rest."""
        return self.limit_kind == "device-full" and self.limit_source == "inferred"


@dataclass(frozen=True)
class CauseFacts:
    """The primary cause as the decision reads it (``devices[].diagnosis.causes[]``)."""

    id: str
    headline: str
    fix_line: str
    fix_title: str
    settings: str  # what allocator settings can do about it
    saving: int | None
    fits_after_fix: bool | None
    died_in_step: int | None  # a growing workload's figures
    growth_per_step: int
    postpone_packed_steps: int


@dataclass(frozen=True)
class DecisionInput:
    """What the decision reads of one device, typed: ``DecisionInput.of(entry)`` reads the contract entry once
    (the report's own, or a stored one after ``stored.upgrade``)."""

    oom: OomFacts | None
    suggestions: tuple[Mapping[str, Any], ...]  # the advisor's changes (the capture's own advice left out)
    whatifs: tuple[Mapping[str, Any], ...]  # the what-if replays' items
    ranked_ids: tuple[str, ...]  # ``devices[].ranked``'s order (analysis.sizing)
    ooms_listed: int  # entries of ``devices[].ooms``
    events: int | None
    peak_reserved: int
    final_reserved: int
    final_allocated: int
    plateau: Mapping[str, Any] | None  # ``devices[].plateau``
    idle_at_peak: tuple[int, int, int] | None  # ``idle_at_reserved_peak``, for a stored report without a plateau
    cause: CauseFacts | None  # the primary cause
    phase_sentence: str  # where the OOM came, by phase ("" without frames to tell)
    pools_sentence: str  # private pools worth naming ("" where they hold little)
    replay_shown: bool  # the report has a replay check
    replay_exact: bool | None  # None: no check, or no segment events to check the model against
    segment_events_recorded: int
    segment_events_reproduced: int

    @classmethod
    def of(cls, dev: Mapping[str, Any]) -> DecisionInput:
        """Read one device's contract entry; what a stored report of an older shape may lack reads as
        nothing (0, None, an empty list)."""
        summary = dev.get("summary") or {}
        replay = dev.get("replay") or {}
        exact = replay.get("exact")
        if replay.get("segment_events_recorded") == 0:
            exact = None  # "0 of 0 segment events": nothing to check the model against
        return cls(
            oom=oom_facts(dev),
            suggestions=tuple(s for s in dev.get("suggestions") or [] if s.get("id") not in _NOT_A_CHANGE),
            whatifs=tuple(dev.get("whatif") or []),
            ranked_ids=tuple(str(r["id"]) for r in dev.get("ranked") or []),
            ooms_listed=len(dev.get("ooms") or []),
            events=dev.get("events"),
            peak_reserved=int(summary.get("peak_reserved_bytes") or 0),
            final_reserved=int(summary.get("final_reserved_bytes") or 0),
            final_allocated=int(summary.get("final_allocated_bytes") or 0),
            plateau=dev.get("plateau") or None,
            idle_at_peak=idle_at_reserved_peak(dev),
            cause=_cause_facts(primary_cause(dev)),
            phase_sentence=phase_sentence(dev),
            pools_sentence=pools_sentence(dev),
            replay_shown=bool(replay),
            replay_exact=None if exact is None else bool(exact),
            segment_events_recorded=int(replay.get("segment_events_recorded", 0)),
            segment_events_reproduced=int(replay.get("segment_events_reproduced", 0)),
        )


def oom_facts(dev: Mapping[str, Any]) -> OomFacts | None:
    oom = dev.get("oom") or None
    if not oom:
        return None
    if "tried_to_allocate_bytes" not in oom:
        # The size torch's message names lives on the OOM's entry of ``ooms``.
        same = [o for o in dev.get("ooms") or [] if o.get("event_index") == oom.get("event_index")]
        if same and same[0].get("tried_to_allocate_bytes"):
            oom = {**oom, "tried_to_allocate_bytes": same[0]["tried_to_allocate_bytes"]}
    return OomFacts(
        raw=oom,
        event_index=int(oom.get("event_index") or 0),
        tried=int(oom.get("tried_to_allocate_bytes") or oom.get("requested_bytes") or 0),
        allocated=int(oom.get("allocated_bytes") or 0),
        limit=int(oom.get("limit_bytes") or 0),
        limit_is_lower_bound=bool(oom.get("limit_is_lower_bound")),
        limit_kind=oom.get("limit_kind"),
        limit_source=oom.get("limit_source"),
        verdict=oom.get("verdict"),
        verdict_certain=oom.get("verdict_certain"),
        verdict_level=oom.get("verdict_level"),
        request_verdict=oom.get("request_verdict"),
        cached_free=int(oom.get("cached_free_bytes") or 0),
        device_free=int(oom.get("device_free_bytes") or 0),
        reserved=int(oom.get("reserved_bytes") or 0),
        step_need=int(oom.get("step_need_bytes") or 0),
        ooms_in_trace=int(oom.get("ooms_in_trace") or 1),
        projected=bool((oom.get("projection") or {}).get("available")),
    )


def _cause_facts(cause: Mapping[str, Any] | None) -> CauseFacts | None:
    if cause is None:
        return None
    figures, fix = cause.get("figures") or {}, cause["fix"]
    return CauseFacts(
        id=str(cause["id"]),
        headline=str(cause["headline"]),
        fix_line=str(fix["line"]),
        fix_title=str(fix["title"]),
        settings=str(cause.get("settings")),
        saving=cause.get("saving_bytes"),
        fits_after_fix=cause.get("fits_after_fix"),
        died_in_step=figures.get("died_in_step"),
        growth_per_step=int(figures.get("growth_per_step_bytes") or 0),
        postpone_packed_steps=int(figures.get("postpone_packed_steps") or 0),
    )


@dataclass(frozen=True)
class GrownFacts:
    """A setting's replay of the grown steps (``whatif[].grown_horizon``, ``analysis.horizon``), as the decision
    reads it; absent from reports made before it (then the decision falls back on ``horizon.setting_horizon``)."""

    failing_step: int
    steps_replayed: int
    dies_in_step: int | None  # None: every replayed step completed

    @property
    def reaches(self) -> int:
        """The step the run is known to get into under the setting: where it dies, else the one past the replay."""
        return self.dies_in_step if self.dies_in_step is not None else self.failing_step + self.steps_replayed + 1

    @classmethod
    def of(cls, whatif: Mapping[str, Any] | None) -> GrownFacts | None:
        grown = (whatif or {}).get("grown_horizon") or None
        if not grown:
            return None
        dies = grown.get("dies_in_step")
        return cls(int(grown["failing_step"]), int(grown["steps_replayed"]), None if dies is None else int(dies))


# Private pools worth naming in the headline: this share of what PyTorch reserved (causes' own floor).
POOLS_HEADLINE_SHARE = 0.25


def pools_sentence(dev: Mapping[str, Any]) -> str:
    """ " Private pools held X of the Y PyTorch reserved: ..." where pools hold at least
    ``POOLS_HEADLINE_SHARE`` of reserved memory at the ledger's moment (the OOM, else the reserved peak):
    memory a pool keeps is neither activations nor cache the program can reuse."""
    rows = {r.get("id"): r for r in (dev.get("ledger") or {}).get("rows") or []}
    pools = rows.get("private_pools") or {}
    held = int(pools.get("bytes") or 0)
    reserved = held + sum(int((rows.get(k) or {}).get("bytes") or 0) for k in ("allocated", "cached_free"))
    if not held or held < POOLS_HEADLINE_SHARE * reserved:
        return ""
    parts = sorted(pools.get("parts") or [], key=lambda p: -int(p.get("bytes") or 0))
    largest = parts[0]["label"] if parts else ""
    many = f"{len(parts)} private pools" if len(parts) > 1 else "A private pool"
    biggest = f" (the largest {readout.size(int(parts[0]['bytes']))}, {largest})" if len(parts) > 1 else f" ({largest})"
    return (
        f" {many} held {readout.size(held)} of the {readout.size(reserved)} PyTorch reserved{biggest if parts else ''}:"
        " memory a pool keeps serves only its own graphs or cache, not the program's other tensors."
    )


def phase_sentence(dev: Mapping[str, Any]) -> str:
    """The sentence "The OOM came in the backward pass; live then, ...": where the OOM came and what each phase held
    (``diagnosis``; empty where the trace has no frames to tell phases by)."""
    diagnosis = dev.get("diagnosis") or {}
    words = diagnosis.get("oom_phase_words")
    if not diagnosis.get("phases_known") or not words:
        return ""
    live = sorted((diagnosis.get("live_by_phase_at_oom") or {}).items(), key=lambda kv: -int(kv[1]))
    held = ", ".join(f"{PHASE_NAMES.get(k, k)} {readout.size(int(v))}" for k, v in live[:4] if int(v) > 0)
    return f" The OOM came in {words}" + (f"; live then, by phase: {held}." if held else ".")


# Short names of analysis.phases.PHASES for the headline's list.
PHASE_NAMES = {
    "other": "other code",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "forward_no_backward": "forward without backward",
    "decode": "decoding",
    "graph_capture": "graph capture",
    "data_loading": "data loading",
}


def primary_cause(dev: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The cause the diagnosis names first (``devices[].diagnosis.primary``), or None."""
    diagnosis = dev.get("diagnosis") or {}
    primary = diagnosis.get("primary")
    for c in diagnosis.get("causes") or []:
        if c.get("id") == primary:
            return c  # type: ignore[no-any-return]
    return None


def idle_at_reserved_peak(dev: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(event index, reserved, idle = reserved - allocated) at the reserved peak, from the timeline,
    which keeps the peak events exactly; None without a timeline."""
    timeline = dev.get("timeline") or None
    summary = dev.get("summary") or {}
    if not timeline:
        return None
    index = list(timeline.get("index") or [])
    at = int(summary.get("peak_reserved_event_index", -2))
    if at == -1 and "initial_reserved_bytes" in summary and at not in index:
        # The peak is the state before the first recorded event (stored reports without that point).
        reserved = int(summary["initial_reserved_bytes"])
        return at, reserved, reserved - int(summary.get("initial_allocated_bytes") or 0)
    if at not in index:
        return None
    k = index.index(at)
    reserved = int(timeline["reserved_bytes"][k])
    allocated = int(timeline["allocated_bytes"][k])
    return at, reserved, reserved - allocated
