"""The report JSON (docs/contract.md, ``oomscope.report/1``) as typed, read-only values.

A stored report is read once: ``analysis.stored.load(data)`` brings it to the current shape
(``stored.upgrade``) and builds a ``Report`` from it here. The readers (``analysis.readout``,
``analysis.compare``, the site's charts and pages) then read attributes, not ``.get("key")`` on the
dict, so a key's name and its fallback for an older report are written in one place, this module.

Why tolerant: a report of any age must still read. A key the dict lacks is ``None`` (or its class's
the first of the older keys its class's ``FALLBACK`` names), a section that is not a JSON object is
``None``, a list item that is not one is skipped, as the readers' ``.get(...) or {}`` did before.
Values are kept as stored (no ``int(...)``), so a reader words exactly what it worded from the dict.
Free-form objects (``allocator_settings``, a segment map's blocks, whose keys changed over the versions)
are read-only mappings; ``data`` keeps the whole JSON for what serves it as it is (the API's body, the
templates' remaining keys).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

T = TypeVar("T", bound="Section")
EMPTY: Mapping[str, Any] = MappingProxyType({})


class Section:
    """A JSON object of the report read into a frozen dataclass: each field its same-named key."""

    # Field -> how to read its value (a nested section, a list of them, a read-only mapping).
    NESTED: ClassVar[dict[str, Callable[[Any], Any]]] = {}
    # Field -> the keys older reports wrote it under, read (the first present) when its own key is missing.
    FALLBACK: ClassVar[dict[str, tuple[str, ...]]] = {}

    @classmethod
    def from_json(cls: type[T], data: Mapping[str, Any]) -> T:
        values: dict[str, Any] = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name == "data":
                values["data"] = MappingProxyType(data) if isinstance(data, dict) else data
                continue
            key = next((k for k in (f.name, *cls.FALLBACK.get(f.name, ())) if k in data), f.name)
            value = data.get(key)
            read = cls.NESTED.get(f.name)
            values[f.name] = read(value) if read is not None else value
        return cls(**values)


def one(cls: type[T]) -> Callable[[Any], T | None]:
    """A nested section: None where the report has none (null, missing, empty, not an object)."""
    return lambda value: cls.from_json(value) if isinstance(value, Mapping) and value else None


def many(cls: type[T]) -> Callable[[Any], tuple[T, ...]]:
    """A list of sections, its items that are objects."""
    return lambda value: tuple(cls.from_json(v) for v in value or () if isinstance(v, Mapping))


def frozen_map(value: Any) -> Mapping[str, Any]:
    """A free-form object, read-only (empty where missing)."""
    return MappingProxyType(value) if isinstance(value, dict) else (value if isinstance(value, Mapping) else EMPTY)


def frozen_map_or_none(value: Any) -> Mapping[str, Any] | None:
    return frozen_map(value) if isinstance(value, Mapping) and value else None


# --- the report's head -------------------------------------------------------------------------


@dataclass(frozen=True)
class Source(Section):
    filename: str | None
    bytes: int | None
    sha256: str | None
    format: str | None


@dataclass(frozen=True)
class CaptureWarning(Section):
    code: str | None
    message: str | None


@dataclass(frozen=True)
class DoctorFinding(Section):
    code: str | None
    problem: str | None
    fix: str | None


@dataclass(frozen=True)
class Capture(Section):
    has_trace: bool | None
    trace_complete: bool | None
    has_frames: bool | None
    stacks: str | None
    allocator_settings: Mapping[str, Any]
    warnings: tuple[CaptureWarning, ...]
    doctor: tuple[DoctorFinding, ...]
    NESTED = {"allocator_settings": frozen_map, "warnings": many(CaptureWarning), "doctor": many(DoctorFinding)}


# --- one device --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Summary(Section):
    peak_reserved_bytes: int | None
    peak_allocated_bytes: int | None
    peak_requested_bytes: int | None
    final_reserved_bytes: int | None
    final_allocated_bytes: int | None
    peak_is_lower_bound: bool | None


@dataclass(frozen=True)
class Limit(Section):
    bytes: int | None
    source: str | None
    is_lower_bound: bool | None
    low_bytes: int | None
    high_bytes: int | None
    inference: str | None
    kind: str | None
    note: str | None


@dataclass(frozen=True)
class Projection(Section):
    available: bool | None
    reason: str | None
    step: int | None
    template_step: int | None


@dataclass(frozen=True)
class Oom(Section):
    """``devices[].oom``, and each item of ``devices[].ooms`` (which adds step, ordinal, tried_to_allocate)."""

    event_index: int | None
    time_us: int | None
    requested_bytes: int | None
    tried_to_allocate_bytes: int | None
    device_free_bytes: int | None
    reserved_bytes: int | None
    allocated_bytes: int | None
    cached_free_bytes: int | None
    largest_free_block_bytes: int | None
    largest_usable_free_block_bytes: int | None
    limit_bytes: int | None
    limit_source: str | None
    limit_is_lower_bound: bool | None
    limit_inference: str | None
    verdict: str | None
    verdict_level: str | None
    verdict_certain: bool | None
    request_verdict: str | None
    run_verdict: str | None
    run_verdict_basis: str | None
    step_need_bytes: int | None
    step_shortfall_bytes: int | None
    step: int | None
    ordinal: int | None
    projection: Projection | None
    NESTED = {"projection": one(Projection)}
    # Reports from before issue 32 named only the request's verdict.
    FALLBACK = {"run_verdict": ("verdict",), "request_verdict": ("verdict",)}


@dataclass(frozen=True)
class Step(Section):
    """``devices[].steps`` and a what-if's ``steps`` (index and reserved_end_bytes only)."""

    index: int | None
    start_us: int | None
    end_us: int | None
    first_event: int | None
    last_event: int | None
    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    reserved_end_bytes: int | None


@dataclass(frozen=True)
class Frame(Section):
    filename: str | None
    line: int | None
    name: str | None


def _site(value: Any) -> Frame | str | None:
    """A stack row's site: a frame (``{filename, line, name}``), or the report's own wording of one."""
    if isinstance(value, Mapping):
        return Frame.from_json(value)
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class StackRow(Section):
    """``devices[].top_stacks`` and ``devices[].churn``."""

    when: str | None
    bytes: int | None
    count: int | None
    label: str | None
    site: Frame | str | None
    frames: tuple[Frame, ...]
    NESTED = {"site": _site, "frames": many(Frame)}


@dataclass(frozen=True)
class Projected(Section):
    request: int | None
    allocation: int | None
    allocations_later: int | None
    allocations_in_step: int | None


@dataclass(frozen=True)
class Certainty(Section):
    """The ``certain`` flag of a what-if's ``caught_ooms`` and ``oom_request_range``."""

    certain: bool | None


@dataclass(frozen=True)
class WhatIf(Section):
    config: str | None
    peak_reserved_bytes: int | None
    step_peak_reserved_bytes: int | None
    limit_bytes: int | None
    oom_avoided: bool | None
    step_completes: bool | None
    step_completes_range: Mapping[str, Any] | None
    step_shortfall_bytes: int | None
    oom_event_index: int | None
    oom_projected: Projected | None
    caught_ooms: Certainty | None
    oom_request_range: Certainty | None
    steps: tuple[Step, ...]
    NESTED = {
        "step_completes_range": frozen_map_or_none,
        "oom_projected": one(Projected),
        "caught_ooms": one(Certainty),
        "oom_request_range": one(Certainty),
        "steps": many(Step),
    }


@dataclass(frozen=True)
class Suggestion(Section):
    id: str | None
    title: str | None
    config: str | None
    evidence: str | None
    estimated_saving_bytes: int | None
    avoids_oom: bool | None


@dataclass(frozen=True)
class Ranked(Section):
    id: str | None
    title: str | None
    config: str | None
    estimated_saving_bytes: int | None
    step_completes: bool | None
    run_completes: bool | None
    run_note: str | None
    cost: Any
    cost_words: str | None


@dataclass(frozen=True)
class Change(Section):
    """The decision's ``change`` and ``runner_up``."""

    kind: str | None
    id: str | None
    title: str | None
    line: str | None


@dataclass(frozen=True)
class Decision(Section):
    headline: str | None
    change: Change | None
    runner_up: Change | None
    data: Mapping[str, Any]  # the rest (confidence, alternatives, ...) as the templates render it
    NESTED = {"change": one(Change), "runner_up": one(Change)}


@dataclass(frozen=True)
class LedgerPart(Section):
    id: str | None
    label: str | None
    bytes: int | None
    source: str | None


@dataclass(frozen=True)
class LedgerRow(Section):
    id: str | None
    label: str | None
    bytes: int | None
    source: str | None
    parts: tuple[LedgerPart, ...]
    NESTED = {"parts": many(LedgerPart)}


@dataclass(frozen=True)
class Ledger(Section):
    moment: str | None
    event_index: int | None
    total_bytes: int | None
    rows: tuple[LedgerRow, ...]
    note: str | None
    NESTED = {"rows": many(LedgerRow)}


@dataclass(frozen=True)
class Plateau(Section):
    reserved_bytes: int | None
    first_event_index: int | None
    last_event_index: int | None
    events: int | None
    least_idle_bytes: int | None
    least_idle_event_index: int | None
    idle_at_first_bytes: int | None


@dataclass(frozen=True)
class EdgeOfCap(Section):
    limit_bytes: int | None
    peak_reserved_bytes: int | None
    headroom_bytes: int | None
    share: float | None
    source: str | None
    sentence: str | None


@dataclass(frozen=True)
class Replay(Section):
    recorded_config: str | None
    segment_events_recorded: int | None
    segment_events_reproduced: int | None
    exact: bool | None


@dataclass(frozen=True)
class Timeline(Section):
    """``devices[].timeline``: the plot's columns, one value a point (downsampled, peaks and the OOM kept), and
    each point's event for hover. A column is a list as stored (the charts make arrays of those that are lists)."""

    index: Any  # the event index of each point
    time_us: Any
    reserved_bytes: Any
    allocated_bytes: Any
    requested_bytes: Any
    largest_free_bytes: Any
    cached_free_bytes: Any
    external_fragmentation: Any
    event_action: Any
    event_size: Any
    event_group: Any
    stack_labels: Mapping[str, Any]  # stack group id -> label
    NESTED = {"stack_labels": frozen_map}
    # The names the plot's columns had before (plain, or another spelling).
    FALLBACK = {
        "index": ("event_index", "events"),
        "reserved_bytes": ("reserved",),
        "allocated_bytes": ("allocated",),
        "requested_bytes": ("requested",),
        "largest_free_bytes": ("largest_free", "largest_free_block", "largest_free_block_bytes"),
        "cached_free_bytes": ("cached_free",),
        "external_fragmentation": ("fragmentation", "fragmentation_index"),
    }


def _timeline(value: Any) -> Timeline | None:
    """The timeline, None where there is none; an older one kept its columns under ``series``."""
    if not isinstance(value, Mapping) or not value:
        return None
    series = value.get("series")
    return Timeline.from_json({**value, **series} if isinstance(series, Mapping) else value)


@dataclass(frozen=True)
class Segment(Section):
    """One segment of a segment map. Its blocks stay as stored: their keys changed over the versions
    (``offset`` or ``address``, ``requested`` or ``requested_size``, ``stack`` a group id or a label, ``frames``)."""

    address: int | str | None  # an older map wrote addresses as "0x..." strings
    size: int | None
    type: str | None
    expandable: bool | None
    pool: Any
    stream: int | None
    allocated_bytes: int | None
    free_bytes: int | None
    largest_free_bytes: int | None
    blocks: tuple[Mapping[str, Any], ...]
    NESTED = {"blocks": lambda v: tuple(frozen_map(b) for b in v or () if isinstance(b, Mapping))}
    FALLBACK = {"size": ("total_size",), "type": ("segment_type",)}  # the first maps' names


@dataclass(frozen=True)
class SegmentMap(Section):
    """``devices[].segment_maps.<moment>``: the cache's segments at one moment, the largest ones."""

    event_index: int | None
    segments: tuple[Segment, ...]
    segments_shown: int | None
    segments_total: int | None
    hidden_bytes: int | None
    labels: Mapping[str, Any]  # stack group id -> label
    NESTED = {"segments": many(Segment), "labels": frozen_map}


def _segment_maps(value: Any) -> Mapping[str, SegmentMap]:
    """The maps by moment (``peak``, ``reserved_peak``, ``oom``), those stored; a map stored as the bare list of
    its segments (the first reports) reads as one without labels."""
    maps: dict[str, SegmentMap] = {}
    for moment, snap in value.items() if isinstance(value, Mapping) else ():
        if isinstance(snap, list):
            snap = {"segments": snap}
        if isinstance(snap, Mapping) and snap:
            maps[str(moment)] = SegmentMap.from_json(snap)
    return MappingProxyType(maps)


@dataclass(frozen=True)
class Device(Section):
    device: int | None
    events: int | None
    summary: Summary
    limit: Limit | None
    oom: Oom | None
    ooms: tuple[Oom, ...]
    steps: tuple[Step, ...]
    top_stacks: tuple[StackRow, ...]
    churn: tuple[StackRow, ...]
    whatif: tuple[WhatIf, ...]
    suggestions: tuple[Suggestion, ...]
    ranked: tuple[Ranked, ...]
    decision: Decision | None
    ledger: Ledger | None
    plateau: Plateau | None
    edge_of_cap: EdgeOfCap | None
    replay: Replay | None
    timeline: Timeline | None
    segment_maps: Mapping[str, SegmentMap]  # by moment
    data: Mapping[str, Any]
    NESTED = {
        "summary": lambda v: Summary.from_json(v if isinstance(v, Mapping) else EMPTY),
        "limit": one(Limit),
        "oom": one(Oom),
        "ooms": many(Oom),
        "steps": many(Step),
        "top_stacks": many(StackRow),
        "churn": many(StackRow),
        "whatif": many(WhatIf),
        "suggestions": many(Suggestion),
        "ranked": many(Ranked),
        "decision": one(Decision),
        "ledger": one(Ledger),
        "plateau": one(Plateau),
        "edge_of_cap": one(EdgeOfCap),
        "replay": one(Replay),
        "timeline": _timeline,
        "segment_maps": _segment_maps,
    }


@dataclass(frozen=True)
class Report(Section):
    schema: str | None
    source: Source | None
    capture: Capture
    devices: tuple[Device, ...]
    data: Mapping[str, Any]  # the whole JSON, as the API serves it
    NESTED = {
        "source": one(Source),
        "capture": lambda v: Capture.from_json(v if isinstance(v, Mapping) else EMPTY),
        "devices": many(Device),
    }


def device_of(dev: Device | Mapping[str, Any]) -> Device:
    """A device, typed: for a caller that still holds the dict (the report as it is built, before it is stored)."""
    return dev if isinstance(dev, Device) else Device.from_json(dev)


def report_of(report: Report | Mapping[str, Any]) -> Report:
    """A report, typed, for a caller that still holds the dict (one just built, not stored)."""
    return report if isinstance(report, Report) else Report.from_json(report)


def main_device(report: Report) -> Device | None:
    """The device a one-line summary speaks of: the one that ran out of memory, else the largest peak."""
    if not report.devices:
        return None
    return max(report.devices, key=lambda d: (1 if d.oom else 0, int(d.summary.peak_reserved_bytes or 0)))


def oom_of(oom: Oom | Mapping[str, Any]) -> Oom:
    """An OOM, typed, for a caller that still holds the dict (the decision, as the report is built)."""
    return oom if isinstance(oom, Oom) else Oom.from_json(oom)
