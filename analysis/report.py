"""The report: every analysis of a snapshot assembled into the contract JSON.

``build_report(source)`` reads a snapshot, replays each device's trace once
(``analysis.allocator.recording``), runs the what-if replays (``analysis.allocator``)
and the analyses of this package, and returns a plain dict (``schema:
"oomscope.report/1"``, see ../shared/docs/contract.md and docs/report.md for
the keys beyond the contract). Bytes are ints, addresses hex strings, and
nothing in it needs more than ``json.dumps``. Each device goes through stages
that pass frozen results to the next, and its contract entry is written once,
from them (the section "per device: the stages" below; docs/architecture.md).

Work per device is a handful of numpy passes over the replay's columns; the
only per-event Python loops are inside the replays themselves.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import mmap
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis import advice as advice_mod
from analysis import doctor, fastread, readout, sizing
from analysis.allocator import (
    ReplaySource,
    Requests,
    build_requests,
    floor_estimate,
    infer_limit,
    needs_recorded_state,
    replay_check,
    trace_is_complete,
    whatif,
)
from analysis.allocator import compiled as compiled_loops
from analysis.allocator.config import AllocatorConfig, setting_named, setting_of, whatif_candidates
from analysis.allocator.policy import Beside, fitted_limit
from analysis.allocator.recorded import AllocatorState, RecordedReplay
from analysis.allocator.requests import _recorded_reserved, reads_recorded_state
from analysis.categories import (
    ACTIVATIONS,
    CATEGORIES,
    GRADIENTS,
    OPTIMIZER_STATE,
    PRIVATE_POOLS,
    PrivatePool,
    bytes_by_category,
    classify,
    frameless_backward,
    mark_private_pools,
    optimizer_windows,
    private_pool_allocations,
    private_pools,
)
from analysis.causes import CauseInput, Diagnosis, PoolUse, diagnose, pool_origin
from analysis.decision import decide, run_verdict
from analysis.explore import ExploreSink, checkpoint_events, explore_store, finish_timeline
from analysis.ledger import Ledger, device_ledger
from analysis.limits import (
    INFERRED,
    Limit,
    OomMessage,
    choose_limit,
    parse_oom_message,
    run_was_capped,
    sidecar_limit,
)
from analysis.model import (
    ALLOC,
    INACTIVE,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    DeviceData,
    Snapshot,
    sorted_unique,
)
from analysis.model import OOM as OOM_ACTION
from analysis.oom import MAX_OOMS_EXPLAINED, UsableFree, explain_oom, flush_window_start, oom_indices, verdict
from analysis.ooms import list_ooms
from analysis.parallel import Pending, Pool
from analysis.phases import tag_phases
from analysis.projection import Projection, project_failing_step, step_whatif
from analysis.reader import ReadLimits, read_snapshot
from analysis.stacks import (
    BACKWARD_NO_FRAMES,
    BEFORE_TRACE,
    TRAIT_AUTOCAST,
    TRAIT_BACKWARD,
    Lifetimes,
    StackCatalog,
    alloc_lifetimes,
    is_python_frame,
    top_entries,
    totals_by_group,
)
from analysis.steps import Steps, find_steps, first_growth_step, per_step_figures
from analysis.timeline import build_timeline, columns_of, reserved_plateau, with_initial_state

SCHEMA = "oomscope.report/1"
Progress = Callable[[str, float], None]
I64 = npt.NDArray[np.int64]

# The report's own what-if candidates are the settings table's (analysis.allocator.config.SETTINGS).
# The report's own what-if replays cost a full pass each: past this many
# simulated events in total, the cheapest-to-skip candidates are dropped
# (expandable_segments is always tried).
AUTO_WHATIF_EVENT_BUDGET = 4_000_000
TOP_STACKS = 10
SEGMENT_MAP_MAX_SEGMENTS = 200
SEGMENT_MAP_MAX_BLOCKS = 48
LEAK_SERIES_MAX_POINTS = 200


def _noop(stage: str, fraction: float) -> None:
    return None


# ------------------------------------------------------------------ entry points


def build_report(
    source: str | Path | bytes,
    *,
    whatif: Iterable[str] = (),
    limit: int | None = None,
    progress: Progress | None = None,
    filename: str | None = None,
    jobs: int = 1,
    oom_message: str | None = None,
    sidecar: dict[str, Any] | None = None,
    batch_size: int | None = None,
    explore: ExploreSink | None = None,
) -> dict[str, Any]:
    """The contract report for a snapshot file (path or bytes).

    ``explore``, when given, is called once per analysed device with ``(device, store)``:
    ``analysis.explore.explore_store`` made from this report's own recorded replay (its
    checkpoints kept by the same pass), what the site's digging endpoints read.

    ``batch_size`` (the failing step's batch, where the user knows it) turns the batch-fit
    fraction into a number of samples (``analysis.sizing``).

    With ``jobs`` > 1 the policy replays (the check and the what-ifs) run in up
    to that many threads (compiled loops) or forked child processes (Python loops)
    beside the rest (``analysis.parallel``); the report is the same. ``oom_message``
    is torch's OOM message as the user
    has it, ``sidecar`` the client's sidecar JSON (``oomscope_client``): both give
    the real limit (``analysis.limits``); a text that is not an OOM message
    raises ``OomMessageError`` before any heavy work.
    """
    # The replays allocate millions of short-lived objects and create no cycles
    # worth collecting; the cyclic GC's passes over them are pure overhead.
    was_enabled = gc.isenabled()
    gc.disable()
    # The compiled policy engine serves its requests without the GIL: threads then run the replays
    # side by side at none of a fork's costs (analysis.parallel); the Python loops need processes.
    pool = Pool(jobs, threads=compiled_loops.wanted())
    try:
        return _build_report(
            source,
            whatif=whatif,
            limit=limit,
            progress=progress,
            filename=filename,
            pool=pool,
            oom_message=oom_message,
            sidecar=sidecar,
            batch_size=batch_size,
            explore=explore,
        )
    finally:
        pool.close()
        if was_enabled:
            gc.enable()


def _build_report(
    source: str | Path | bytes,
    *,
    whatif: Iterable[str],
    limit: int | None,
    progress: Progress | None,
    filename: str | None,
    pool: Pool,
    oom_message: str | None = None,
    sidecar: dict[str, Any] | None = None,
    batch_size: int | None = None,
    explore: ExploreSink | None = None,
) -> dict[str, Any]:
    report_progress = progress or _noop
    user_whatifs = list(whatif)
    for conf in user_whatifs:
        AllocatorConfig.parse(conf)  # ConfigError before any heavy work
    if not oom_message and isinstance(sidecar, dict) and isinstance(sidecar.get("oom_message"), str):
        oom_message = sidecar["oom_message"]
    message = parse_oom_message(oom_message) if oom_message else None  # OomMessageError before heavy work
    report_progress("reading", 0.0)
    snapshot, src = _read(source, filename)
    report_progress("reading", 1.0)

    catalog = StackCatalog(snapshot.stacks)
    devices = [d for d in snapshot.devices if len(d.trace) or d.segments]
    # The message names its GPU; without a number it is the one device that ran out of memory.
    oom_devices = [d.device for d in devices if (d.trace.action == OOM_ACTION).any()]
    outcomes: list[_DeviceOutcome] = []
    for k, dev in enumerate(devices):

        def dev_progress(stage: str, f: float, k: int = k) -> None:
            report_progress(stage, (k + f) / max(1, len(devices)))

        applies = message is not None and _message_applies(message, dev.device, oom_devices)
        outcomes.append(
            _analyse_device(
                snapshot,
                dev,
                catalog,
                src["bytes"],
                limit,
                user_whatifs,
                dev_progress,
                pool,
                message=message if applies else None,
                sidecar=sidecar,
                explore=explore,
            )
        )
    warnings = _warnings(snapshot, devices, outcomes)
    if message is not None and not any(_message_applies(message, d.device, oom_devices) for d in devices):
        warnings.append(_message_unused(message))
    has_trace = any(len(d.trace) > 1 for d in devices)
    capture = {
        "has_trace": has_trace,
        "trace_complete": bool(all(o.trace_complete for o in outcomes) and has_trace),
        "has_frames": bool(snapshot.stacks.stacks),
        "stacks": _stacks_kind(snapshot),
        "allocator_settings": _jsonable(snapshot.settings.raw),
        "warnings": warnings,
    }
    if not has_trace and not any(w["code"] == "state-only" for w in warnings):
        warnings.append({"code": "no-history", "message": "the snapshot holds no allocation history"})
    for dev, outcome in zip(devices, outcomes, strict=True):
        _finish_device(outcome, capture, batch_size, sizing.batch_from_metadata(dev.user_metadata, outcome.oom_index))
    seconds = doctor.sidecar_dump_seconds(sidecar)
    found = doctor.findings(capture, [o.entry for o in outcomes], dump_seconds=seconds)
    capture["doctor"] = [f.to_dict() for f in found]
    report_progress("analysing", 1.0)
    return {
        "schema": SCHEMA,
        "source": src,
        "capture": capture,
        "devices": [o.entry for o in outcomes],
        "annotations": len(snapshot.annotations),
        "pools": [list(p) for p in snapshot.pools],
    }


def _read(source: str | Path | bytes, filename: str | None) -> tuple[Snapshot, dict[str, Any]]:
    """Stage 0: the snapshot, and the contract ``source`` section.

    The file's sha256 is taken on a thread beside the read: hashlib releases the GIL, so on a
    second CPU it costs little time. The compiled reader and the hash read one mapping of the file
    (``fastread.mapped_file``): no copy of its bytes for the hash, so the second CPU is free for
    the parse's own helper too (the pages it will write, made present ahead of it). A file the
    compiled reader leaves is read again by the Python reader, which gives any refusal. The hash is
    joined before anything forks."""
    with contextlib.ExitStack() as held:
        mapped = None
        if not isinstance(source, bytes) and fastread.wanted(None):
            mapped = held.enter_context(fastread.mapped_file(Path(source), ReadLimits()))
        data = mapped.data if mapped is not None else None
        hashed: list[dict[str, Any] | BaseException] = []
        hasher = threading.Thread(target=_source_info_into, args=(hashed, source, filename, data), daemon=True)
        hasher.start()
        try:
            snapshot = read_snapshot(mapped or (source if isinstance(source, bytes) else Path(source)))
        finally:
            hasher.join()
    if isinstance(hashed[0], BaseException):
        raise hashed[0]
    src = hashed[0]
    src["format"] = snapshot.format
    return snapshot, src


def _warnings(snapshot: Snapshot, devices: list[DeviceData], outcomes: list[_DeviceOutcome]) -> list[dict[str, str]]:
    """The reader's warnings, then each device's: its recorded replay's and its analysis's own."""
    warnings = [{"code": w.code, "message": w.message} for w in snapshot.warnings]
    for dev, outcome in zip(devices, outcomes, strict=True):
        prefix = f"device {dev.device}: " if len(devices) > 1 else ""
        # The reader and the replay can both notice the same thing (e.g. state-only): say it once.
        known = {w["code"] for w in warnings}
        warnings.extend(
            {"code": w.code, "message": prefix + w.message}
            for w in outcome.replay_warnings
            if len(devices) > 1 or w.code not in known
        )
        warnings.extend({"code": code, "message": prefix + text} for code, text in outcome.warnings)
    return warnings


def _message_unused(message: OomMessage) -> dict[str, str]:
    return {
        "code": "oom-message-unused",
        "message": (
            f"the OOM message names GPU {message.device}, but no device of the snapshot with that number "
            "ran out of memory; its limit was not used"
            if message.device is not None
            else "the OOM message names no GPU and several devices ran out of memory; its limit was not used"
        ),
    }


def _finish_device(
    outcome: _DeviceOutcome, capture: dict[str, Any], batch_size: int | None, metadata_batch: int | None
) -> None:
    """The last stages, once the capture section is known (the advisor's capture rule needs it):
    the suggestions, sizing (``sizing.size_into``) and the decision, written into the device's entry."""
    dev_report = outcome.entry
    outcome.advice.capture = capture
    dev_report["suggestions"] = advice_mod.advise(outcome.advice)
    sizing.size_into(dev_report, outcome.advice, batch_size if batch_size is not None else metadata_batch)
    dev_report["decision"] = decide(dev_report, capture)
    if dev_report.get("oom"):
        dev_report["oom"].update(run_verdict(dev_report) or {})


def _message_applies(message: OomMessage, device: int, oom_devices: list[int]) -> bool:
    if device not in oom_devices:
        return False
    return message.device == device or (message.device is None and len(oom_devices) == 1)


def build_whatif(
    source: str | Path | bytes,
    config: str,
    *,
    limit: int | None = None,
    filename: str | None = None,
    oom_message: str | None = None,
) -> dict[str, Any]:
    """``python -m analysis whatif``: one configuration replayed on every device, under what the
    report's own what-ifs replay under (``_whatif_basis``: the same limit, the same "capped" rule);
    with an OOM inside a step, the rest of that step is projected and replayed too (``step_completes``)."""
    AllocatorConfig.parse(config)
    message = parse_oom_message(oom_message) if oom_message else None
    src = _source_info(source, filename)
    snapshot = read_snapshot(source if isinstance(source, bytes) else Path(source))
    src["format"] = snapshot.format
    oom_devices = [d.device for d in snapshot.devices if (d.trace.action == OOM_ACTION).any()]
    out = []
    for dev in snapshot.devices:
        if not len(dev.trace):
            continue
        applies = message is not None and _message_applies(message, dev.device, oom_devices)
        outline = _trace_outline(snapshot, dev, limit, message if applies else None, None)
        # The report's limit: the known one, else with an OOM the trace's (_explain's rule).
        chosen = outline.known_limit
        if chosen is None and outline.oom_index is not None:
            chosen = _inferred_limit(snapshot, outline)
        projection = None
        if outline.oom_index is not None:
            projection = project_failing_step(
                dev.trace,
                outline.steps,
                outline.oom_index,
                outline.recorded_cfg,
                trace_complete=len(outline.steps) > 0 and trace_is_complete(dev),
            )
        requests = build_requests(snapshot, dev)
        basis = _whatif_basis(snapshot, outline, projection, requests, chosen)
        item = _replay_whatif(snapshot, dev, config, basis, requests)
        item.setdefault("step_completes", None)
        reserved = _recorded_reserved(dev)
        peak = int(reserved.max()) if reserved.size else 0
        out.append({"device": dev.device, "recorded_peak_reserved_bytes": peak, "whatif": item})
    return {"schema": SCHEMA, "source": src, "config": config, "devices": out}


# ------------------------------------------------------------------ per device: the stages
#
# One device goes through these stages in order; each returns a frozen result that the next take:
#   _trace_outline      -> _Outline      what the policy replays need of the trace: its OOMs, steps, the
#                                         limit the user's inputs give
#   _start              -> _Started      the request stream, and the replays that need nothing more started
#                                         on it (on a second CPU they run while the facts are found)
#   _trace_facts        -> _Facts        the trace before any replay: the outline's figures, lifetimes, the
#                                         projected failing step, and the states the recorded replay keeps
#   _record             -> _Recorded     the recorded replay and the request stream, once per device and
#                                         handed down (allocator.recording); the policy replays that need
#                                         nothing of it (the check; the what-ifs under a known limit) start
#                                         first, in the pool
#   _explain            -> _Explained    the limit (known, else the trace's) and the OOM read off the replay
#   _attribute          -> _Attribution  live blocks at the peak, OOM and end by stack; categories
#   _ledger             -> ledger.Ledger the whole device at the OOM (else the reserved peak)
#   _diagnose           -> Diagnosis     the program's mistake behind the OOM (analysis.causes' rule list)
#   _collect_whatifs    -> _WhatIfs      the what-if replays' results (analysis.parallel's pool)
# _device_json writes the device's contract entry from those results (the one serializer), and
# _advice_context the advisor's typed input from the same results; both before the what-ifs are
# collected, whose keys (oom, whatif, replay, edge_of_cap) _with_replays then fills in the same
# entry (the replays finish last: this work runs beside them). Sizing and the decision come last, in
# _build_report, once the capture section is known; they read the contract entry, as they do for a
# stored report.


@dataclass(frozen=True)
class _Moment:
    name: str  # "peak" | "oom" | "end"
    index: int
    state: AllocatorState


@dataclass(frozen=True)
class _Outline:
    """What the policy replays need of one device's trace (``_trace_outline``)."""

    dev: DeviceData
    n: int
    ooms: I64
    oom_index: int | None  # the last OOM
    recorded_cfg: AllocatorConfig
    steps: Steps
    known_limit: Limit | None  # from what the user has: given, sidecar, OOM message


@dataclass(frozen=True)
class _Facts(_Outline):
    """What one device's trace shows before any replay: its outline, and what takes longer to find."""

    lifetimes: Lifetimes
    projection: Projection | None  # the failing step projected (an OOM inside a step)
    explained: tuple[int, ...]  # the OOMs explained (the last MAX_OOMS_EXPLAINED)
    keep: tuple[int, ...]  # states the recorded replay keeps from its one pass
    live_requested: _Live | None  # live requested bytes after each allocation (the AMP estimate replays it)


@dataclass(frozen=True)
class _Started:
    """What starts before the trace's facts are read (``_start``)."""

    source: ReplaySource  # the recorded replay, built on its first need
    requests: Requests | None  # None: no events, or they wait for _record (as the replays do)
    check: Pending | None
    planned: list[_Planned] | None  # the what-ifs, where they could start


@dataclass(frozen=True)
class _Recorded:
    """The recorded replay and its columns, and the requests every policy replay is fed."""

    replay: RecordedReplay
    requests: Requests | None  # None: no events
    cols: dict[str, I64]


@dataclass(frozen=True)
class _Planned:
    """One what-if replay started in the pool."""

    setting: str
    config: str
    origin: str  # "auto" | "user"
    pending: Pending


@dataclass(frozen=True)
class _Explained:
    """The device's limit and, with an OOM, what the last one shows (``oom.explain_oom``)."""

    limit: Limit | None  # the known limit, else the trace's with an OOM, else None
    oom: dict[str, Any] | None
    usable: dict[int, UsableFree]  # what each explained OOM's request could use


@dataclass(frozen=True)
class _Attribution:
    """Live blocks by stack at the moments that matter, and memory by category at the peak."""

    moments: tuple[_Moment, ...]
    top_stacks: list[dict[str, Any]]
    live: dict[str, tuple[I64, I64, I64]]  # moment -> (stacks, sizes, alloc indices) of live blocks
    codes: npt.NDArray[np.int8]  # category of every allocation
    peak_codes: npt.NDArray[np.int8]  # category of every block live at the peak
    categories: dict[str, int]  # bytes by category at the peak
    pools: tuple[PrivatePool, ...]  # the private pools at the peak
    opt_start: I64
    opt_end: I64
    frameless: npt.NDArray[np.bool_]  # categories.frameless_backward of every allocation


@dataclass(frozen=True)
class _WhatIfs:
    items: list[dict[str, Any]]  # contract ``whatif`` items
    advice: list[advice_mod.WhatIf]  # the same, typed, for the advisor


@dataclass(frozen=True)
class _DeviceOutcome:
    """What the report keeps of one device once its stages are done."""

    entry: dict[str, Any]  # the contract entry, sizing and decision still to come
    advice: advice_mod.AdviceContext
    oom_index: int | None
    trace_complete: bool
    replay_warnings: tuple[Any, ...]  # the recorded replay's (code, message) warnings
    warnings: tuple[tuple[str, str], ...]  # this analysis's own (code, message) warnings


def _analyse_device(
    snapshot: Snapshot,
    dev: DeviceData,
    catalog: StackCatalog,
    source_bytes: int,
    limit: int | None,
    user_whatifs: list[str],
    progress: Progress,
    pool: Pool,
    *,
    message: OomMessage | None = None,
    sidecar: dict[str, Any] | None = None,
    explore: ExploreSink | None = None,
) -> _DeviceOutcome:
    """All analyses of one device, stage after stage (see above)."""
    progress("replaying", 0.0)
    warnings: list[tuple[str, str]] = []
    outline = _trace_outline(snapshot, dev, limit, message, sidecar)
    started = _start(snapshot, outline, pool, user_whatifs, warnings)
    facts = _trace_facts(snapshot, outline, checkpoints=explore is not None)
    recorded, check, planned = _record(snapshot, facts, started, pool, user_whatifs, warnings)
    progress("replaying", 0.5)
    explained = _explain(snapshot, facts, recorded, message, warnings)
    if planned is None:
        assert explained.limit is not None
        planned = _submit_whatifs(
            pool, snapshot, facts, facts.projection, recorded.requests, user_whatifs, explained.limit, warnings
        )
    timeline = _timeline(facts, recorded, catalog)
    progress("replaying", 1.0)
    progress("analysing", 0.0)
    attribution = _attribute(snapshot, facts, recorded.replay, catalog)
    progress("analysing", 0.3)
    # The causes, the entry and the advisor's input read no what-if: made while the what-if
    # replays may still run (they are the last to finish), their keys filled in once they are in.
    diagnosis = _diagnose(snapshot, facts, recorded, catalog, attribution, explained, message)
    progress("analysing", 0.5)
    ledger = _ledger(snapshot, facts, recorded.replay, catalog, message)
    entry = _device_json(facts, recorded, explained, attribution, diagnosis, timeline, catalog, ledger)
    advice = _advice_context(snapshot, facts, recorded, attribution, source_bytes, catalog)
    whatifs = _collect_whatifs(planned)
    progress("analysing", 0.8)
    oom = _oom_json(facts, explained, attribution, whatifs) if explained.oom is not None else None
    _with_replays(entry, oom, whatifs, check.result())
    advice.oom, advice.whatifs = oom, whatifs.advice
    if explore is not None:
        explore(dev.device, explore_store(snapshot, dev, catalog, recorded.replay, facts.lifetimes))
    progress("analysing", 1.0)
    return _DeviceOutcome(
        entry,
        advice,
        facts.oom_index,
        recorded.replay.trace_complete,
        tuple(recorded.replay.warnings),
        tuple(warnings),
    )


# -- stage 0: the outline, and the replays that need nothing more started on it ------
def _trace_outline(
    snapshot: Snapshot, dev: DeviceData, limit: int | None, message: OomMessage | None, sidecar: dict[str, Any] | None
) -> _Outline:
    """What the policy replays need of the trace, found at a glance: its OOMs, steps, the limit the
    user's inputs give."""
    recorded_cfg = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    ooms = oom_indices(dev.trace)
    oom_index = int(ooms[-1]) if ooms.size else None
    steps = find_steps(snapshot.annotations, dev.device, dev.trace.time_us)
    known = _known_limit(snapshot, dev, oom_index, limit, message, sidecar, recorded_cfg)
    return _Outline(dev, len(dev.trace), ooms, oom_index, recorded_cfg, steps, known)


def _start(
    snapshot: Snapshot, outline: _Outline, pool: Pool, user_whatifs: list[str], warnings: list[tuple[str, str]]
) -> _Started:
    """The device's requests and the replays that need nothing more, started at once: the check,
    and the what-ifs of a trace without an OOM (no failing step to project), where neither the
    requests nor they read the recorded replay (``reads_recorded_state``, ``needs_recorded_state``).
    On a second CPU they run while the trace's facts are found and the recorded replay runs (the
    engine holds no GIL). Else they wait for ``_record``, so that the recorded replay, built once,
    keeps the states the facts name."""
    dev, recorded_cfg = outline.dev, outline.recorded_cfg
    source = ReplaySource(snapshot, dev)
    if not outline.n:
        return _Started(source, None, pool.submit(lambda: _empty_replay_check(snapshot)), None)
    if reads_recorded_state(dev) or needs_recorded_state(dev, recorded_cfg):
        return _Started(source, None, None, None)
    requests = build_requests(snapshot, dev, source)
    check = pool.submit(lambda: replay_check(snapshot, dev, requests=requests))
    planned = None
    if outline.oom_index is None:
        planned = _submit_whatifs(pool, snapshot, outline, None, requests, user_whatifs, outline.known_limit, warnings)
    return _Started(source, requests, check, planned)


# -- stage 1: the trace before any replay ------------------------------------------
def _trace_facts(snapshot: Snapshot, outline: _Outline, *, checkpoints: bool) -> _Facts:
    dev, n, ooms, oom_index, recorded_cfg, steps = (
        outline.dev,
        outline.n,
        outline.ooms,
        outline.oom_index,
        outline.recorded_cfg,
        outline.steps,
    )
    trace = dev.trace
    lifetimes = alloc_lifetimes(trace.action, trace.addr, trace.size, trace.stack)
    projection = None
    if oom_index is not None:
        projection = project_failing_step(
            trace,
            steps,
            oom_index,
            recorded_cfg,
            trace_complete=len(steps) > 0 and trace_is_complete(dev),
            lifetimes=lifetimes,
        )
    live_requested = _live_requested(lifetimes, trace.action)
    guess = live_requested.peak_index(lifetimes) if live_requested is not None else None
    reserved_peak = _reserved_peak_index(dev) if n else None  # its segment map
    keep = [i for i in (guess, oom_index, reserved_peak) if i is not None and i >= 0]
    # Each OOM's state and the one before its malloc's own flush: what the request could use.
    explained = ooms[-MAX_OOMS_EXPLAINED:].tolist()
    keep += explained + [flush_window_start(trace, i) - 1 for i in explained]
    if checkpoints:  # the explore store's states come from this same pass
        keep += checkpoint_events(n)
    return _Facts(
        **{f.name: getattr(outline, f.name) for f in fields(_Outline)},
        lifetimes=lifetimes,
        projection=projection,
        explained=tuple(explained),
        keep=tuple(keep),
        live_requested=live_requested,
    )


def _known_limit(
    snapshot: Snapshot,
    dev: DeviceData,
    oom_index: int | None,
    limit: int | None,
    message: OomMessage | None,
    sidecar: dict[str, Any] | None,
    cfg: AllocatorConfig,
) -> Limit | None:
    """The limit from what the user has (None: only the trace can tell)."""
    side = sidecar_limit(sidecar, dev.device) if oom_index is not None else None
    if limit is None and side is None and message is None:
        return None
    # Every segment the limit check let through was allowed, so the limit is at least the most
    # of those (infer_limit's lower; only the message's range needs it).
    floor = floor_estimate(snapshot, dev, cfg).lower if message is not None and len(dev.trace) else 0
    return choose_limit(given=limit, sidecar=side, message=message, inferred=None, floor=floor)


# -- stage 2: the recorded replay and the requests, once ---------------------------
def _record(
    snapshot: Snapshot,
    facts: _Facts,
    started: _Started,
    pool: Pool,
    user_whatifs: list[str],
    warnings: list[tuple[str, str]],
) -> tuple[_Recorded, Pending, list[_Planned] | None]:
    """The recorded replay and the requests, each built once and handed to every replay.

    The policy replays start before the recorded replay when nothing they need comes from it
    (``allocator.needs_recorded_state``: else it is built first, so that no forked child builds
    its own): the check and the what-ifs (already started, then: ``_start``); the what-ifs
    unless their limit is the one an OOM shows (then they start once the OOM is explained)."""
    dev, source, requests = facts.dev, started.source, started.requests
    source.keep(facts.keep)
    if requests is None and facts.n:
        requests = build_requests(snapshot, dev, source)
    if needs_recorded_state(dev, facts.recorded_cfg):
        source.get()
    check = started.check or pool.submit(lambda: replay_check(snapshot, dev, requests=requests))
    planned = started.planned
    if planned is None and (facts.oom_index is None or facts.known_limit is not None):
        planned = _submit_whatifs(
            pool, snapshot, facts, facts.projection, requests, user_whatifs, facts.known_limit, warnings
        )
    replay = source.get()
    return _Recorded(replay, requests, columns_of(replay)), check, planned


# -- stage 3: the limit and the OOM --------------------------------------------------
def _explain(
    snapshot: Snapshot,
    facts: _Facts,
    recorded: _Recorded,
    message: OomMessage | None,
    warnings: list[tuple[str, str]],
) -> _Explained:
    replay, cols, trace = recorded.replay, recorded.cols, facts.dev.trace
    usable = {k: _usable_free(facts, replay, k) for k in facts.explained}
    if facts.oom_index is None:
        return _Explained(facts.known_limit, None, usable)
    i = facts.oom_index
    chosen = facts.known_limit if facts.known_limit is not None else _inferred_limit(snapshot, facts)
    oom = explain_oom(
        trace,
        i,
        allocated=int(cols["allocated"][i]),
        reserved=int(cols["reserved"][i]),
        cached_free=int(cols["cached_free"][i]),
        largest_free=int(cols["largest_free"][i]),
        chosen=chosen,
        all_ooms=int(facts.ooms.size),
        usable=usable.get(i),
    )
    # The process's memory outside PyTorch's cache, as the message printed it (sizing's GPU fit).
    oom["non_pytorch_bytes"] = (
        message.non_pytorch.value if message is not None and message.non_pytorch is not None else None
    )
    if message is not None:
        mismatch = _message_mismatch(message, oom, facts.recorded_cfg)
        if mismatch is not None:
            warnings.append(mismatch)
    return _Explained(chosen, oom, usable)


def _usable_free(facts: _Facts, replay: RecordedReplay, index: int) -> UsableFree:
    """What the OOM request at ``index`` could have used (``oom.UsableFree``)."""
    trace = facts.dev.trace
    before = replay.blocks_at(flush_window_start(trace, index) - 1)
    return UsableFree(trace, index, before, replay.blocks_at(index), facts.recorded_cfg)


def _inferred_limit(snapshot: Snapshot, outline: _Outline) -> Limit:
    """The limit from the trace alone: the allocator package's one rule (``LimitEstimate.stated``)."""
    estimate = floor_estimate(snapshot, outline.dev, outline.recorded_cfg)
    chosen = choose_limit(given=None, sidecar=None, message=None, inferred=estimate.stated())
    assert chosen is not None
    return chosen


def _message_mismatch(message: OomMessage, oom: dict[str, Any], cfg: AllocatorConfig) -> tuple[str, str] | None:
    """A warning when the pasted message cannot be this trace's last OOM."""
    wanted = cfg.allocation_size(int(oom["requested_bytes"]))
    problems = []
    if not message.tried.low <= wanted <= message.tried.high and not (
        message.tried.low <= int(oom["requested_bytes"]) <= message.tried.high
    ):
        problems.append(f"it tried to allocate {message.tried.text}, the trace's last OOM {wanted:,} bytes")
    if message.allocated is not None and not (
        message.allocated.low <= int(oom["allocated_bytes"]) <= message.allocated.high
    ):
        problems.append(f"it shows {message.allocated.text} allocated, the trace {int(oom['allocated_bytes']):,} bytes")
    if not problems:
        return None
    return (
        "oom-message-mismatch",
        "the OOM message does not match the trace's last OOM (" + "; ".join(problems) + "): it may come "
        "from another run or another OOM; its limit is used all the same",
    )


def _timeline(facts: _Facts, recorded: _Recorded, catalog: StackCatalog) -> dict[str, Any] | None:
    """The contract ``timeline``: the replay's columns downsampled, from the state before the trace."""
    cols, replay, dev = recorded.cols, recorded.replay, facts.dev
    timeline = (
        build_timeline(cols, dev.trace.time_us, oom_index=facts.oom_index, step_ends=facts.steps.last_event.tolist())
        if facts.n
        else None
    )
    # Fused frees settled, event info per point (the backward pass's frame-less events named so).
    timeline = finish_timeline(timeline, cols, dev, catalog, facts.lifetimes)
    if timeline is None or facts.n <= 1:  # one event (a state-only dump) is no timeline to extend
        return timeline
    init = replay.initial
    return with_initial_state(
        timeline,
        {
            "reserved": init.reserved,
            "allocated": init.allocated,
            "requested": init.requested,
            "cached_free": init.cached_free,
            "inactive_split": init.inactive_split,
            "largest_free": init.largest_free,
        },
    )


# -- stage 4: stacks and categories ---------------------------------------------------
def _attribute(snapshot: Snapshot, facts: _Facts, replay: RecordedReplay, catalog: StackCatalog) -> _Attribution:
    trace, lifetimes, n = facts.dev.trace, facts.lifetimes, facts.n
    # Moments whose live blocks are attributed to stacks.
    moments = [_Moment("peak", replay.peak_allocated_index, replay.blocks_at(replay.peak_allocated_index))]
    if facts.oom_index is not None:
        moments.append(_Moment("oom", facts.oom_index, replay.blocks_at(facts.oom_index)))
    moments.append(_Moment("end", n - 1, replay.blocks_at(n - 1)))
    own = [a for a in snapshot.annotations if a.device in (facts.dev.device, -1)]
    # Same rule as steps: a device without optimizer marks of its own uses the others'.
    if not any(a.name.startswith("Optimizer.step#") for a in own):
        own = snapshot.annotations
    opt_start, opt_end = optimizer_windows([(a.name, a.stage, a.time_us) for a in own], trace.time_us)
    trace_has_frames = bool((trace.stack >= 0).any())
    # Allocations of the backward pass that the autograd thread left without frames: the categories,
    # the stacks below and the phases (_diagnose) split them off alike.
    frameless = frameless_backward(lifetimes, catalog)
    codes = classify(lifetimes, catalog, opt_start, opt_end, trace_has_frames=trace_has_frames, frameless=frameless)
    mark_private_pools(codes, private_pool_allocations(lifetimes, trace, facts.dev.segments))
    # A block live before the trace carries the stack of the event that freed it
    # when the final snapshot no longer holds it; with context="all" that is the
    # free site, not the allocation site, so such blocks count as "no frames".
    trusted_pre: set[int] | None = None
    if _frees_record_free_sites(trace, lifetimes):
        trusted_pre = {b.address for _, b in moments[-1].state.live_blocks() if b.alloc_index < 0}
    # Split "no frames" into what is known: blocks from before the trace, and
    # (stacks="python") the backward pass, whose thread records no frames.
    backward_alloc = lifetimes.start[frameless] if trace_has_frames else np.zeros(0, np.int64)
    top_stacks: list[dict[str, Any]] = []
    live: dict[str, tuple[I64, I64, I64]] = {}
    for m in moments:
        live[m.name] = _live_blocks(m.state, trusted_pre)
        top_stacks.extend(_top_stacks_at(m.name, live[m.name], backward_alloc, catalog))
    peak_stacks, peak_sizes, peak_alloc_idx = live["peak"]
    peak_codes = _codes_of_blocks(lifetimes, codes, peak_alloc_idx, peak_stacks, catalog)
    # A block in a private pool's segment is the pool's, whatever made it (blocks from before the trace too).
    peak_codes[_in_private_pools(moments[0].state)] = PRIVATE_POOLS
    categories = bytes_by_category(peak_codes, peak_sizes)
    pools = private_pools(moments[0].state, catalog, snapshot.pools)
    return _Attribution(
        tuple(moments), top_stacks, live, codes, peak_codes, categories, pools, opt_start, opt_end, frameless
    )


def _in_private_pools(state: AllocatorState) -> npt.NDArray[np.bool_]:
    """Of the live blocks ``_live_blocks`` lists (its order), those in a private pool's segment."""
    return np.array(
        [seg.pool != 0 for seg in state.segments for b in seg.blocks if b.state == "active_allocated"], bool
    )


def _categories_json(index: int, attribution: _Attribution) -> dict[str, Any]:
    """Contract ``categories`` at the allocated peak; ``private_pools`` only where a pool held memory."""
    shown = [c for c in CATEGORIES if c != "private_pools" or attribution.categories[c]]
    return {
        "event_index": index,
        "bytes": {c: attribution.categories[c] for c in shown},
        "order": shown,
        "pools": [p.to_json() for p in attribution.pools],
    }


def _ledger(
    snapshot: Snapshot, facts: _Facts, replay: RecordedReplay, catalog: StackCatalog, message: OomMessage | None
) -> Ledger:
    """The whole device at the OOM (else the reserved peak): ``analysis.ledger``."""
    return device_ledger(snapshot, facts.dev, replay, catalog, facts.recorded_cfg, facts.oom_index, message)


def _top_stacks_at(
    when: str, live: tuple[I64, I64, I64], backward_alloc: I64, catalog: StackCatalog
) -> list[dict[str, Any]]:
    """The top groups of stacks among the blocks live at one moment; blocks without frames
    told apart where the trace can (the backward pass, blocks from before the trace)."""
    stacks, sizes, alloc_idx = live
    gids = catalog.groups_of(stacks).astype(np.int64)
    frameless = gids == 0
    if frameless.any():
        gids[frameless & np.isin(alloc_idx, backward_alloc)] = catalog.pseudo_group(BACKWARD_NO_FRAMES)
        gids[frameless & (alloc_idx < 0)] = catalog.pseudo_group(BEFORE_TRACE)
    return top_entries(catalog, totals_by_group(catalog, stacks, sizes, gids), when, TOP_STACKS)


# -- stage 5: what-if replays ---------------------------------------------------------
def _submit_whatifs(
    pool: Pool,
    snapshot: Snapshot,
    outline: _Outline,
    projected: Projection | None,
    requests: Requests | None,
    user: list[str],
    chosen: Limit | None,
    warnings: list[tuple[str, str]],
) -> list[_Planned]:
    """Start every what-if replay, the report's own candidates first, then the user's; each
    config replayed once. With a projected tail (an OOM inside a step) each replay runs it too."""
    if outline.n == 0 or requests is None:
        return []
    dev, recorded = outline.dev, outline.recorded_cfg
    basis = _whatif_basis(snapshot, outline, projected, requests, chosen)
    if chosen is not None and not basis.capped and recorded.garbage_collection_threshold > 0:
        warnings.append(_gc_without_cap(recorded))
    started: dict[str, Pending] = {}

    def start(conf: str) -> Pending:
        if conf not in started:
            started[conf] = pool.submit(lambda: _replay_whatif(snapshot, dev, conf, basis, requests, pool.beside))
        return started[conf]

    # A candidate the user also asked for is listed once, as the user's.
    budget = max(1, AUTO_WHATIF_EVENT_BUDGET // max(1, outline.n))
    own = whatif_candidates(recorded, capped=basis.capped, at_most=budget)
    auto = [(setting, conf) for setting, conf in own if conf not in user]
    planned = [_Planned(setting, conf, "auto", start(conf)) for setting, conf in auto]
    planned += [_Planned(setting_of(conf), conf, "user", start(conf)) for conf in dict.fromkeys(user)]
    return planned


@dataclass(frozen=True)
class _WhatIfBasis:
    """What every what-if replay of one device runs under, decided once (``_whatif_basis``), for the
    report and the ``whatif`` command alike."""

    limit: Limit | None  # the report's limit
    replay_limit: int | None  # what the replays run under; None: bounded from the trace (``allocator.whatif``)
    capped: bool  # a per-process cap: the GC setting acts (``limits.run_was_capped``)
    ends: list[int]  # the steps' last events
    projection: Projection | None  # the failing step's projected tail (an OOM inside a step)


def _whatif_basis(
    snapshot: Snapshot, outline: _Outline, projected: Projection | None, requests: Requests, chosen: Limit | None
) -> _WhatIfBasis:
    recorded = outline.recorded_cfg
    capped = run_was_capped(
        chosen, fraction_recorded=recorded.per_process_memory_fraction is not None, gc_ran=requests.gc_ran
    )
    projection = projected if projected is not None and projected.available else None
    replay_limit = chosen.bytes if chosen is not None else None
    gc_acts = capped and recorded.garbage_collection_threshold > 0
    if chosen is not None and chosen.source == INFERRED and gc_acts:
        # Under the GC, when it starts depends on the cap itself (threshold x limit): the trace's lower
        # bound would start it elsewhere. The replays take the limit the trace bounds, as the check.
        estimate = infer_limit(snapshot, outline.dev, requests.recorded_config, requests)
        fitted = fitted_limit(snapshot, outline.dev, requests.recorded_config, estimate, requests)
        replay_limit = fitted if fitted is not None else (estimate.lower or None)
    return _WhatIfBasis(chosen, replay_limit, capped, outline.steps.last_event.tolist(), projection)


def _replay_whatif(
    snapshot: Snapshot,
    dev: DeviceData,
    conf: str,
    basis: _WhatIfBasis,
    requests: Requests,
    beside: Beside | None = None,
) -> dict[str, Any]:
    """One what-if's contract item: the step's projected tail replayed too where there is one."""
    wlimit = basis.replay_limit
    if basis.projection is not None:
        return step_whatif(
            snapshot,
            dev,
            conf,
            wlimit,
            basis.ends,
            basis.projection,
            limit_range=_limit_range(basis.limit),
            capped=basis.capped,
            requests=requests,
            beside=beside,
        )
    return whatif(snapshot, dev, conf, wlimit, basis.ends, capped=basis.capped, requests=requests, beside=beside)


def _gc_without_cap(recorded: AllocatorConfig) -> tuple[str, str]:
    return (
        "gc-without-cap",
        f"garbage_collection_threshold:{recorded.garbage_collection_threshold:g} is set, but this run had "
        "no per-process memory cap (the device itself was full): torch runs that garbage collection only "
        "under torch.cuda.set_per_process_memory_fraction, so it did nothing here, and the replays leave "
        "it out",
    )


def _collect_whatifs(planned: list[_Planned]) -> _WhatIfs:
    """Contract ``whatif`` items (of a setting the table tries at several values, such as
    ``max_split_size_mb``, the best with the others as ``tried``; then the user's), and the same
    typed for the advisor."""
    items: list[dict[str, Any]] = []
    tried: dict[str, list[dict[str, Any]]] = {}
    user_items: list[dict[str, Any]] = []
    for p in planned:
        result = p.pending.result()
        # Without any limit the model never has to flush its cache, so a
        # setting that fragments can reserve more than a real GPU holds.
        item = {**result, "unbounded": result.get("limit_bytes") is None, "origin": p.origin, "setting": p.setting}
        row = setting_named(p.setting)
        if p.origin == "user":
            user_items.append(item)
        elif row is not None and len(row.whatifs) > 1:
            tried.setdefault(p.setting, []).append(item)
        else:
            items.append(item)
    for values in tried.values():
        best = min(values, key=_whatif_rank)
        best["tried"] = [
            {
                "config": t["config"],
                "peak_reserved_bytes": t["peak_reserved_bytes"],
                "oom_avoided": t["oom_avoided"],
                "step_completes": t.get("step_completes"),
            }
            for t in values
        ]
        items.append(best)
    items += user_items
    for w in items:
        # Without a projected step (no steps, no OOM) nothing is known at step level.
        w.setdefault("step_completes", None)
        w.setdefault("step_completes_range", None)
        w.setdefault("step_shortfall_bytes", None)
        w.setdefault("oom_projected", None)
    advice_items = [
        advice_mod.WhatIf(
            w["setting"],
            w["config"],
            int(w["peak_reserved_bytes"]),
            w["oom_avoided"],
            w["origin"],
            step_completes=w["step_completes"],
            step_shortfall_bytes=w["step_shortfall_bytes"],
            oom_projected=w.get("oom_projected"),
        )
        for w in items
    ]
    return _WhatIfs(items, advice_items)


# -- stage 6: the program's causes (analysis.causes) --------------------------------------
def _diagnose(
    snapshot: Snapshot,
    facts: _Facts,
    recorded: _Recorded,
    catalog: StackCatalog,
    attribution: _Attribution,
    explained: _Explained,
    message: OomMessage | None,
) -> Diagnosis:
    trace, lifetimes, replay = facts.dev.trace, facts.lifetimes, recorded.replay
    phases = tag_phases(
        trace,
        lifetimes,
        catalog,
        snapshot.stacks,
        attribution.opt_start,
        attribution.opt_end,
        frameless=attribution.frameless,
    )
    at = facts.oom_index if facts.oom_index is not None else (int(replay.peak_reserved_index) if facts.n else None)
    pools: tuple[PoolUse, ...] = ()
    reserved_at = 0
    if at is not None:
        by_pool: dict[int, int] = {}
        for seg in replay.blocks_at(at).segments:
            by_pool[int(seg.pool)] = by_pool.get(int(seg.pool), 0) + int(seg.total_size)
        pools = tuple(PoolUse(k, v) for k, v in sorted(by_pool.items()))
        reserved_at = int(recorded.cols["reserved"][at])
    private = trace.pool[lifetimes.start] != 0 if facts.n else np.zeros(0, bool)
    oom, limit = explained.oom, explained.limit
    inp = CauseInput(
        trace=trace,
        lifetimes=lifetimes,
        catalog=catalog,
        phases=phases,
        steps=facts.steps,
        allocated=recorded.cols["allocated"],
        oom_index=facts.oom_index,
        requested_bytes=int(oom["requested_bytes"]) if oom is not None else 0,
        limit_bytes=limit.bytes if limit is not None else None,
        message=message,
        pools_at_oom=pools,
        reserved_at_oom=reserved_at,
        pool_origin=pool_origin(catalog, lifetimes.stack[private], process=lifetimes.stack),
        optimizer_class=_optimizer_class(snapshot),
        limit_kind=limit.kind if limit is not None else "",
        limit_source=limit.source if limit is not None else "",
        reserved_peak_before_oom=(
            int(recorded.cols["reserved"][: facts.oom_index].max(initial=0)) if facts.oom_index is not None else 0
        ),
    )
    return diagnose(inp)


def _optimizer_class(snapshot: Snapshot) -> str:
    """The optimizer's class name, from the first ``Optimizer.step#Class.step`` annotation."""
    return next(
        (
            a.name.split("#", 1)[1].split(".", 1)[0]
            for a in snapshot.annotations
            if a.name.startswith("Optimizer.step#") and "#" in a.name
        ),
        "",
    )


# -- the serializer: typed results -> the device's contract entry --------------------------
def _oom_json(facts: _Facts, explained: _Explained, attribution: _Attribution, whatifs: _WhatIfs) -> dict[str, Any]:
    """Contract ``oom``: the explained OOM, its top stacks, the what-ifs' answers for it and
    the step-level verdict."""
    assert explained.oom is not None
    oom = dict(explained.oom)
    oom["top_stacks"] = [r for r in attribution.top_stacks if r["when"] == "oom"][:3]
    oom["whatif"] = [
        {
            "config": w["config"],
            "oom_avoided": w["oom_avoided"],
            "peak_reserved_bytes": w["peak_reserved_bytes"],
            "step_completes": w.get("step_completes"),
        }
        for w in whatifs.items
    ]
    oom.update(_step_verdict(facts.projection, oom, whatifs.items))
    return oom


def _summary_json(facts: _Facts, replay: RecordedReplay) -> dict[str, Any]:
    time_us = facts.dev.trace.time_us
    return {
        "peak_reserved_bytes": int(replay.peak_reserved),
        "peak_allocated_bytes": int(replay.peak_allocated),
        "peak_requested_bytes": int(replay.peak_requested),
        "final_reserved_bytes": int(replay.final.reserved),
        "final_allocated_bytes": int(replay.final.allocated),
        "peak_is_lower_bound": not replay.trace_complete,
        "peak_reserved_event_index": int(replay.peak_reserved_index),
        "peak_allocated_event_index": int(replay.peak_allocated_index),
        "peak_requested_event_index": int(replay.peak_requested_index),
        # The state before the first event (a trace that starts mid-run can peak there: index -1).
        "initial_reserved_bytes": int(replay.initial.reserved),
        "initial_allocated_bytes": int(replay.initial.allocated),
        "first_time_us": int(time_us[0]) if facts.n else 0,
        "last_time_us": int(time_us[-1]) if facts.n else 0,
    }


def _device_json(
    facts: _Facts,
    recorded: _Recorded,
    explained: _Explained,
    attribution: _Attribution,
    diagnosis: Diagnosis,
    timeline: dict[str, Any] | None,
    catalog: StackCatalog,
    ledger: Ledger,
) -> dict[str, Any]:
    """The device's contract entry, from the stages' results: ``oom``, ``whatif``, ``replay`` and
    ``edge_of_cap`` in their places but filled by ``_with_replays``, ``suggestions`` later."""
    replay, cols, steps, limit = recorded.replay, recorded.cols, facts.steps, explained.limit
    step_rows = per_step_figures(steps, cols["allocated"], cols["reserved"])
    moments = attribution.moments
    maps = {m.name: segment_map(m.state, catalog) for m in moments if m.name in ("peak", "oom")}
    if facts.n:
        maps["reserved_peak"] = segment_map(replay.blocks_at(replay.peak_reserved_index), catalog)
    entry: dict[str, Any] = {
        "device": facts.dev.device,
        "events": facts.n,
        "summary": _summary_json(facts, replay),
        "limit": limit.to_json() if limit is not None else None,
        "oom": None,
        "ooms": list_ooms(
            facts.dev.trace,
            cols,
            config=facts.recorded_cfg,
            chosen=limit,
            step_last_events=steps.last_event if len(steps) else None,
            usable=explained.usable,
        )
        if limit is not None
        else [],
        "steps": step_rows,
        "step_source": steps.source,
        "first_growth_step": first_growth_step(step_rows),
        "timeline": timeline,
        "top_stacks": attribution.top_stacks,
        "whatif": [],
        "replay": None,
        "suggestions": [],
        "moments": {m.name: m.index for m in moments},
        "segment_maps": maps,
        "categories": _categories_json(int(replay.peak_allocated_index), attribution),
        "churn": top_entries(
            catalog, totals_by_group(catalog, facts.lifetimes.stack, facts.lifetimes.size), "churn", TOP_STACKS
        ),
        "leaks": _leaks(attribution.live["end"], facts.lifetimes, steps, catalog),
        "diagnosis": diagnosis.to_json(),
        "edge_of_cap": None,
        "ledger": ledger.to_json(),
        "plateau": _plateau_json(replay, cols),
    }
    return entry


def _plateau_json(replay: RecordedReplay, cols: dict[str, I64]) -> dict[str, int] | None:
    """``devices[].plateau``: the idle cache over the events that hold the reserved peak (the headline's)."""
    init = replay.initial
    plateau = reserved_plateau(cols["reserved"], cols["allocated"], init.reserved, init.allocated)
    return plateau.to_json() if plateau is not None else None


def _with_replays(entry: dict[str, Any], oom: dict[str, Any] | None, whatifs: _WhatIfs, check: dict[str, Any]) -> None:
    """The entry's keys that read the policy replays, and what follows from them."""
    entry["oom"], entry["whatif"], entry["replay"] = oom, whatifs.items, check
    entry["edge_of_cap"] = readout.edge_of_cap(entry)  # issue 20: no OOM, but within 5% of a known cap


def _step_verdict(proj: Projection | None, oom: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """The step-level keys of ``oom`` and, where the step was projected, the verdict."""
    out: dict[str, Any] = {
        "projection": proj.to_json() if proj is not None else {"available": False, "reason": "no OOM"}
    }
    if proj is None or not proj.available:
        return out | {"step_need_bytes": None, "step_shortfall_bytes": None}
    limit = int(oom["limit_bytes"])
    need = proj.step_need_bytes
    verdict_ = verdict(need, 0, limit)
    out |= {
        "step_need_bytes": need,
        "step_shortfall_bytes": max(0, need - limit),
        "verdict": verdict_,
        "verdict_level": "step",
        "verdict_certain": not (verdict_ == "capacity" and oom["limit_is_lower_bound"]),
    }
    finishing = [w["config"] for w in items if w.get("step_completes") is True]
    out["explanation"] = f"{oom['explanation']} {_step_text(proj, need, limit, oom['limit_is_lower_bound'], finishing)}"
    return out


def _step_text(proj: Projection, need: int, limit: int, lower_bound: bool, finishing: list[str]) -> str:
    bound = "at least " if lower_bound else ""
    if need > limit:
        if lower_bound:
            tail = (
                f"more than {_gib(limit)}, the most this run reserved; the real cap is not in the snapshot, so "
                "whether it fits is unknown: paste the OOM message or give the memory cap."
            )
        else:
            tail = f"more than the limit of {_gib(limit)}: no allocator setting saves this step."
        return (
            f"Projected from step {proj.template_step}, step {proj.step} needs {_gib(need)} even packed "
            f"without fragmentation, {tail}"
        )
    if finishing:
        return (
            f"Projected from step {proj.template_step}, step {proj.step} needs {_gib(need)} packed without "
            f"fragmentation, within the limit of {bound}{_gib(limit)}; under {', '.join(finishing)} the replay "
            "runs the whole step."
        )
    return (
        f"Projected from step {proj.template_step}, step {proj.step} needs {_gib(need)} packed without "
        f"fragmentation, within the limit of {bound}{_gib(limit)}, but none of the settings replayed lets "
        "the whole step run."
    )


def _leaks(
    end_live: tuple[I64, I64, I64], lifetimes: Lifetimes, steps: Steps, catalog: StackCatalog
) -> list[dict[str, Any]]:
    """Groups holding memory at the end, with their live bytes at each step's end."""
    stacks, sizes, _ = end_live
    totals = totals_by_group(catalog, stacks, sizes)[:TOP_STACKS]
    rows = top_entries(catalog, totals, "end", len(totals))
    if not rows or len(steps) == 0:
        return rows
    ends = steps.last_event
    gids = catalog.groups_of(lifetimes.stack)
    wanted = np.array([t.group for t in totals], np.int64)
    row_of = np.full(len(catalog.groups), -1, np.int64)  # group -> its row
    row_of[wanted] = np.arange(wanted.shape[0])
    sel = np.isin(gids, wanted)
    g_sel = row_of[gids[sel]]
    # Alive at step end e when start <= e < end: a range of steps per allocation.
    k_lo = np.searchsorted(ends, lifetimes.start[sel], side="left")
    k_hi = np.searchsorted(ends, lifetimes.end[sel], side="left")
    width = len(ends) + 1
    cells = len(wanted) * width
    sizes = lifetimes.size[sel].astype(np.float64)  # per-cell sums stay far below 2**53
    diff = np.bincount(g_sel * width + k_lo, sizes, cells) - np.bincount(g_sel * width + k_hi, sizes, cells)
    per_step = np.cumsum(np.rint(diff).astype(np.int64).reshape(len(wanted), width), axis=1)[:, : len(ends)]
    pick = _even_indices(len(ends), LEAK_SERIES_MAX_POINTS)
    for row, series in zip(rows, per_step, strict=False):
        first, last = int(series[0]), int(series[-1])
        row["steps"] = len(ends)
        row["requested_at_first_step_end"] = first
        row["requested_at_last_step_end"] = last
        row["growth_per_step_bytes"] = int((last - first) // max(1, len(ends) - 1))
        row["series_step_index"] = pick.tolist()
        row["series_requested_bytes"] = series[pick].tolist()
    return rows


# -- the advisor's input, typed, from the same results --------------------------------------
def _advice_context(
    snapshot: Snapshot,
    facts: _Facts,
    recorded: _Recorded,
    attribution: _Attribution,
    source_bytes: int,
    catalog: StackCatalog,
) -> advice_mod.AdviceContext:
    """The advisor's input, its ``oom`` and ``whatifs`` left for the caller (they wait on the replays)."""
    lifetimes, replay = facts.lifetimes, recorded.replay
    stacks, sizes, _ = attribution.live["peak"]
    codes, peak_codes, categories = attribution.codes, attribution.peak_codes, attribution.categories
    act_mask = peak_codes == ACTIVATIONS
    opt_mask = peak_codes == OPTIMIZER_STATE
    opt_labels = [catalog.groups[t.group].label for t in totals_by_group(catalog, stacks[opt_mask], sizes[opt_mask])]
    traits = catalog.stack_traits(lifetimes.stack)
    alloc_sizes = lifetimes.size  # every alloc event's, in trace order
    large = alloc_sizes[alloc_sizes >= (1 << 20)]
    peak_idx = int(replay.peak_allocated_index)
    has_backward = bool((codes == GRADIENTS).any() or ((traits & TRAIT_BACKWARD) != 0).any())
    autocast_seen = bool(((traits & TRAIT_AUTOCAST) != 0).any())
    # The workload estimates cost passes over every allocation: only where a rule can use them.
    worth = has_backward and int(categories["activations"]) >= advice_mod.WORKLOAD_MIN_BYTES
    amp_low, amp_high = (
        _amp_saving_range(catalog, lifetimes, codes, facts.live_requested)
        if worth and not autocast_seen
        else (None, None)
    )
    stacks_seen = snapshot.stacks.stacks
    return advice_mod.AdviceContext(
        device=facts.dev.device,
        recorded=facts.recorded_cfg,
        events=facts.n,
        peak_reserved=int(replay.peak_reserved),
        peak_allocated=int(replay.peak_allocated),
        peak_requested=int(replay.peak_requested),
        reserved_at_peak_alloc=int(replay.reserved[peak_idx]) if 0 <= peak_idx < replay.reserved.shape[0] else 0,
        oom=None,
        whatifs=[],
        categories=categories,
        activations_by_site=_activations_by_site(catalog, stacks[act_mask], sizes[act_mask]),
        has_backward=has_backward,
        autocast_seen=autocast_seen,
        optimizer_state_bytes=int(categories["optimizer_state"]),
        optimizer_labels=opt_labels[:3],
        distinct_large_sizes=int(sorted_unique(large).size),
        large_requests=int(large.size),
        capture={},
        source_bytes=source_bytes,
        steps=len(facts.steps),
        mean_stack_frames=float(np.mean([len(st) for st in stacks_seen])) if stacks_seen else 0.0,
        optimizer_fused=any(
            "/torch/optim/" in f.filename and f.name.startswith("_fused") for g in catalog.groups for f in g.frames
        ),
        amp_saving_low=amp_low,
        amp_saving_high=amp_high,
        checkpoint=_checkpoint_estimate(catalog, stacks[act_mask], sizes[act_mask]) if worth else None,
    )


def _activations_by_site(catalog: StackCatalog, stacks: I64, sizes: I64) -> list[tuple[str, int]]:
    """Activation bytes at the peak by the site that made them, largest first."""
    by_site: dict[str, int] = {}
    for t in totals_by_group(catalog, stacks, sizes):
        info = catalog.groups[t.group]
        site = info.site
        label = info.label if site is None else f"{site.filename.rsplit('/', 1)[-1]}:{site.line} {site.name}"
        by_site[label] = by_site.get(label, 0) + t.bytes
    return sorted(by_site.items(), key=lambda kv: -kv[1])


# ------------------------------------------------------------------ helpers


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


# Ops autocast runs in float32 whatever their input (autocast_mode.cpp's fp32 lists): their
# outputs do not shrink under bf16 autocast. Matched against the names of Python frames.
_AUTOCAST_FP32_FRAMES = frozenset(
    {
        "cross_entropy",
        "nll_loss",
        "log_softmax",
        "softmax",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "kl_div",
        "binary_cross_entropy_with_logits",
        "logsumexp",
        "cosine_similarity",
    }
)


def _peak_without(live: _Live, lifetimes: Lifetimes, cut: npt.NDArray[np.bool_]) -> int:
    """Peak of live requested bytes with half of each ``cut`` allocation gone.

    Live memory only rises at an allocation, so the peak is after one of them: the cut bytes
    live there are those cut up to it less those whose end comes before it (``end_rank``)."""
    if not cut.any():
        return live.peak
    # Only the cut allocations are summed again (bincount in float64: exact below 2**53 bytes).
    half = np.where(cut, lifetimes.size // 2, 0)
    ended = np.bincount(live.end_rank[cut], half[cut].astype(np.float64), half.shape[0] + 1)
    gone = np.cumsum(half) - np.cumsum(np.rint(ended[:-1]).astype(np.int64))
    return int((live.after - gone).max())


def _amp_saving_range(
    catalog: StackCatalog, lifetimes: Lifetimes, codes: npt.NDArray[np.int8], live: _Live | None
) -> tuple[int, int]:
    """What bf16 autocast would take off the peak of live memory, as a range.

    The trace records no dtypes, so each activation is halved or kept by where it was made:
    the upper bound halves every activation except outputs of autocast's float32 ops (losses,
    softmax); the lower bound halves only those made inside ``torch.nn`` (linear and conv
    outputs, and what torch.nn computes from them: activations, norms whose output is cast
    for the next matmul), keeping elementwise code of the model's own (a residual add of a
    float32 stream stays float32; HF GPT-2's NewGELU calls ``pow``, a float32 op). Both are
    replayed over the whole trace, so a peak that moves elsewhere is found. Real reruns:
    ViT-B/16 and HF GPT-2 (est_* on the H200 bench, docs/report.md).
    """
    act = codes == ACTIVATIONS
    if not act.any() or live is None:
        return 0, 0
    groups = catalog.groups
    fp32 = np.array([any(f.name in _AUTOCAST_FP32_FRAMES for f in g.frames) for g in groups], bool)
    # The innermost Python frame (C++ frames of stacks="all" come before it) decides.
    in_nn = np.array(
        ["torch/nn/" in next((f.filename for f in g.frames if f.filename.endswith(".py")), "") for g in groups],
        bool,
    )
    gids = catalog.groups_of(lifetimes.stack)
    base = live.peak
    upper = act & ~fp32[gids]
    lower = upper & in_nn[gids]
    high = base - _peak_without(live, lifetimes, upper)
    low = base - _peak_without(live, lifetimes, lower)
    return max(0, low), max(0, high)


def _checkpoint_estimate(catalog: StackCatalog, stacks: I64, sizes: I64) -> dict[str, int] | None:
    """Checkpointing each repeated block, from the activations live at the peak.

    A model's blocks run the same code, so their activations share stacks: each such stack
    holds one tensor per block. The block count is the most common multiplicity of those
    stacks; a block's input is the most common size among them (the residual stream).
    Checkpointed, the blocks keep one input each, and the backward recomputes one block at
    a time: ``repeated - blocks * input - repeated / blocks`` comes off the peak.
    """
    if stacks.size == 0:
        return None
    gids = catalog.groups_of(stacks)
    uniq, counts = np.unique(gids, return_counts=True)
    repeated_groups = uniq[counts >= 2]
    if repeated_groups.size == 0:
        return None
    mult, freq = np.unique(counts[counts >= 2], return_counts=True)
    blocks = int(mult[np.argmax(freq)])
    if blocks < 2:
        return None
    rep = np.isin(gids, uniq[(counts >= 2) & (counts % blocks == 0)])
    repeated = int(sizes[rep].sum())
    big = sizes[rep][sizes[rep] >= (1 << 20)]
    if big.size == 0:
        return None
    values, freq_s = np.unique(big, return_counts=True)
    block_input = int(values[np.argmax(freq_s)])
    saving = repeated - blocks * block_input - repeated // blocks
    return {"blocks": blocks, "block_input_bytes": block_input, "repeated_bytes": repeated, "saving": max(0, saving)}


def _limit_range(chosen: Limit | None) -> tuple[int, int] | None:
    """Where the real limit may lie when the source gives a range (an OOM message's two
    decimals); None for an exact limit, or an inferred one (a lower bound: open above)."""
    if chosen is None or chosen.high is None or chosen.low >= chosen.high or chosen.is_lower_bound:
        return None
    return chosen.low, chosen.high


def _whatif_rank(item: dict[str, Any]) -> tuple[bool, int]:
    """Avoiding the OOM first, then the lowest peak reserved memory."""
    return (item["oom_avoided"] is not True, int(item["peak_reserved_bytes"]))


@dataclass(frozen=True)
class _Live:
    """Live requested bytes right after each allocation of a trace's lifetimes (numpy, before the
    replay). Live memory rises only at an allocation, so every peak of it is among these; where
    it peaks is usually the allocated peak too, so the replay keeps that state in its one pass,
    and the AMP estimate replays it with smaller activations."""

    after: I64  # after each allocation, in the lifetimes' order
    end_rank: I64  # per allocation, how many allocations come before its end (its free)

    @property
    def peak(self) -> int:
        return int(self.after.max())

    def peak_index(self, lifetimes: Lifetimes) -> int:
        """The first event where live requested bytes peak (as ``argmax`` over every event)."""
        k = int(self.after.argmax())
        return int(lifetimes.start[k]) if int(self.after[k]) > 0 else 0


def _live_requested(lifetimes: Lifetimes, action: npt.NDArray[np.int8]) -> _Live | None:
    """``_Live`` of the lifetimes of a trace with these actions."""
    n, m = lifetimes.n_events, lifetimes.start.shape[0]
    if n == 0 or m == 0:
        return None
    # An allocation's end ranks after the allocations before it: a running count of allocs.
    allocs_upto = np.cumsum(action == ALLOC, dtype=np.int32 if n < 2**31 else np.int64)
    freed = lifetimes.end < n
    end_rank = np.full(m, m, np.int64)
    end_rank[freed] = allocs_upto[lifetimes.end[freed] - 1]
    # bincount sums in float64: exact while totals stay below 2**53 bytes.
    ended = np.bincount(end_rank, lifetimes.size.astype(np.float64), m + 1)
    after = np.cumsum(lifetimes.size) - np.cumsum(np.rint(ended[:-1]).astype(np.int64))
    return _Live(after, end_rank)


def _frees_record_free_sites(trace: Any, lifetimes: Lifetimes) -> bool:
    """Whether frees carry their own (free-site) stacks, as with context="all"."""
    freed = lifetimes.end < lifetimes.n_events
    if not freed.any():
        return False
    free_stack = trace.stack[lifetimes.end[freed]]
    return bool((free_stack != lifetimes.stack[freed]).mean() > 0.5)


def _live_blocks(state: AllocatorState, trusted_pre: set[int] | None = None) -> tuple[I64, I64, I64]:
    """Stack ids, block sizes and alloc event indices of the allocated blocks of a state.

    Only ``active_allocated`` blocks count: ``allocated_bytes`` drops at the free
    request, so pending frees are not live bytes. With ``trusted_pre`` given,
    blocks from before the trace keep their stack only if their address is in it.
    """
    stacks: list[int] = []
    sizes: list[int] = []
    alloc_idx: list[int] = []
    for seg in state.segments:
        for b in seg.blocks:
            if b.state == "active_allocated":
                trusted = b.alloc_index >= 0 or trusted_pre is None or b.address in trusted_pre
                stacks.append(b.stack if trusted else -1)
                sizes.append(b.size)
                alloc_idx.append(b.alloc_index)
    return np.array(stacks, np.int64), np.array(sizes, np.int64), np.array(alloc_idx, np.int64)


def _codes_of_blocks(
    lifetimes: Lifetimes, codes: npt.NDArray[np.int8], alloc_idx: I64, stacks: I64, catalog: StackCatalog
) -> npt.NDArray[np.int8]:
    """Category of each live block, through its alloc event; blocks from before the
    trace are classified by their stack alone."""
    out = np.full(alloc_idx.shape[0], CATEGORIES.index("unknown"), np.int8)
    if lifetimes.start.size:
        pos = np.searchsorted(lifetimes.start, alloc_idx)
        pos_c = np.minimum(pos, lifetimes.start.size - 1)
        found = (alloc_idx >= 0) & (lifetimes.start[pos_c] == alloc_idx)
        out[found] = codes[pos_c[found]]
    else:
        found = np.zeros(alloc_idx.shape[0], bool)
    pre = ~found
    if pre.any():
        fake = Lifetimes(
            start=np.full(int(pre.sum()), -1, np.int64),
            end=np.full(int(pre.sum()), lifetimes.n_events, np.int64),
            addr=np.zeros(int(pre.sum()), np.int64),
            size=np.zeros(int(pre.sum()), np.int64),
            stack=stacks[pre].astype(np.int32),
            n_events=lifetimes.n_events,
        )
        empty = np.zeros(0, np.int64)
        out[pre] = classify(fake, catalog, empty, empty, trace_has_frames=False)
    return out


def segment_map(state: AllocatorState, catalog: StackCatalog) -> dict[str, Any]:
    """Segments and their blocks at one moment, bounded for a page.

    The largest ``SEGMENT_MAP_MAX_SEGMENTS`` segments are listed; within each,
    runs of blocks smaller than 1/64 of the segment are merged into one entry
    (state ``mixed`` when the run mixes states) and at most
    ``SEGMENT_MAP_MAX_BLOCKS`` entries are kept, the rest merged the same way.
    """
    segs = sorted(state.segments, key=lambda s: -s.total_size)
    shown = segs[:SEGMENT_MAP_MAX_SEGMENTS]
    hidden = segs[SEGMENT_MAP_MAX_SEGMENTS:]
    labels: dict[int, str] = {}
    rows = []
    for seg in sorted(shown, key=lambda s: s.address):
        blocks = _merge_blocks(seg, catalog, labels)
        rows.append(
            {
                "address": hex(seg.address),
                "size": int(seg.total_size),
                "stream": int(seg.stream),
                "pool": int(seg.pool),
                "type": seg.segment_type,
                "expandable": bool(seg.is_expandable),
                "allocated_bytes": int(sum(b.size for b in seg.blocks if b.state == "active_allocated")),
                "free_bytes": int(sum(b.size for b in seg.blocks if b.state == INACTIVE)),
                "largest_free_bytes": int(max((b.size for b in seg.blocks if b.state == INACTIVE), default=0)),
                "blocks": blocks,
            }
        )
    return {
        "event_index": int(state.index),
        "segments_total": len(segs),
        "segments_shown": len(shown),
        "hidden_bytes": int(sum(s.total_size for s in hidden)),
        "segments": rows,
        "labels": {str(k): v for k, v in labels.items()},
    }


def _merge_blocks(seg: Any, catalog: StackCatalog, labels: dict[int, str]) -> list[dict[str, Any]]:
    tiny = max(seg.total_size // 64, 1)
    blocks = list(seg.blocks)
    while True:
        out: list[dict[str, Any]] = []
        run: list[Any] = []
        for b in blocks:
            if b.size < tiny:
                run.append(b)
                continue
            if run:
                out.append(_merged_entry(seg, run))
                run = []
            group = int(catalog.group_of[b.stack + 1]) if b.state != INACTIVE else -1
            if group >= 0:
                labels.setdefault(group, catalog.groups[group].label)
            out.append(
                {
                    "offset": int(b.address - seg.address),
                    "size": int(b.size),
                    "state": b.state,
                    "requested": int(b.requested_size),
                    "count": 1,
                    "stack": group,
                }
            )
        if run:
            out.append(_merged_entry(seg, run))
        if len(out) <= SEGMENT_MAP_MAX_BLOCKS:
            return out
        tiny *= 4


def _merged_entry(seg: Any, run: list[Any]) -> dict[str, Any]:
    """One entry standing for a run of small neighbouring blocks."""
    states = {b.state for b in run}
    return {
        "offset": int(run[0].address - seg.address),
        "size": int(sum(b.size for b in run)),
        "state": states.pop() if len(states) == 1 else "mixed",
        "requested": int(sum(b.requested_size for b in run)),
        "count": len(run),
        "stack": -1,
    }


def _even_indices(n: int, k: int) -> I64:
    if n <= k:
        return np.arange(n, dtype=np.int64)
    return sorted_unique(np.r_[np.linspace(0, n - 1, k).astype(np.int64), n - 1])


def _reserved_peak_index(dev: DeviceData) -> int:
    """``allocator.requests._recorded_reserved(dev).argmax()``, from the segment events alone: reserved
    memory changes only there, so it first peaks at one of them, or at the first event."""
    t = dev.trace
    grow = (t.action == SEGMENT_ALLOC) | (t.action == SEGMENT_MAP)
    at = np.flatnonzero(grow | (t.action == SEGMENT_FREE) | (t.action == SEGMENT_UNMAP))
    if at.size == 0:
        return 0
    level = np.cumsum(np.where(grow[at], t.size[at], -t.size[at]))
    if at[0] > 0:  # nothing reserved yet before the first segment event
        at, level = np.r_[0, at], np.r_[0, level]
    return int(at[int(level.argmax())])


def _empty_replay_check(snapshot: Snapshot) -> dict[str, Any]:
    cfg = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    return {
        "recorded_config": cfg.to_conf(),
        "segment_events_recorded": 0,
        "segment_events_reproduced": 0,
        "exact": True,
    }


def _stacks_kind(snapshot: Snapshot) -> str:
    """``none``, ``python`` or ``all`` (C++ frames present), as recorded."""
    frames = snapshot.stacks.frames
    if not frames:
        return "none"
    return "all" if any(not is_python_frame(f) for f in frames) else "python"


def _source_info_into(
    out: list[dict[str, Any] | BaseException],
    source: str | Path | bytes,
    filename: str | None,
    mapped: mmap.mmap | None = None,
) -> None:
    try:
        out.append(_source_info(source, filename, mapped))
    except BaseException as exc:  # handed to the reading thread, which raises it
        out.append(exc)


def _source_info(source: str | Path | bytes, filename: str | None, mapped: mmap.mmap | None = None) -> dict[str, Any]:
    """The contract ``source`` section (its ``format`` left to the reader); ``mapped``: the file's
    bytes, mapped by the reader (``fastread.mapped_file``), hashed from there."""
    digest = hashlib.sha256()
    if isinstance(source, bytes):
        digest.update(source)
        size = len(source)
        name = filename or "snapshot"
    else:
        path = Path(source)
        size = _hash_file(path, digest) if mapped is None else _hash_mapped(mapped, digest)
        name = filename or path.name
    return {"filename": name, "bytes": size, "sha256": digest.hexdigest(), "format": None}


def _hash_mapped(mapped: mmap.mmap, digest: Any) -> int:
    """Feed the mapped file to ``digest`` in slices of it (no copy); its size."""
    with memoryview(mapped) as view:
        for at in range(0, len(view), _HASH_SLICE):
            with view[at : at + _HASH_SLICE] as part:
                digest.update(part)
        return len(view)


def _hash_file(path: Path, digest: Any) -> int:
    """Feed the file to ``digest``; its size (where the reader maps no file: the Python reader's).
    Read into one buffer used again and again, small enough to stay in the CPU's cache, rather than
    into a new bytes object per chunk (0.02 s less CPU on the 460 MB benchmark)."""
    buf = bytearray(_HASH_SLICE)
    size = 0
    with path.open("rb", buffering=0) as fh, memoryview(buf) as view:
        while got := fh.readinto(buf):
            digest.update(view[:got])
            size += got
    return size


_HASH_SLICE = 1 << 20  # hashlib releases the GIL for each slice


def _jsonable(value: Any) -> Any:
    """Settings as JSON: tuples to lists, ints past 2**53 to hex strings."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**53 else hex(value)
    return str(value)
