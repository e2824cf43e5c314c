"""The report: every analysis of a snapshot assembled into the contract JSON.

``build_report(source)`` reads a snapshot, replays each device's trace once
(``analysis.replay``), runs the what-if replays (``analysis.allocator``) and the
analyses of this package, and returns a plain dict (``schema:
"oomscope.report/1"``, see ../shared/docs/contract.md and docs/report.md for
the keys beyond the contract). Bytes are ints, addresses hex strings, and
nothing in it needs more than ``json.dumps``.

Work per device is a handful of numpy passes over the replay's columns; the
only per-event Python loops are inside the replays themselves.
"""

from __future__ import annotations

import gc
import hashlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis import advice as advice_mod
from analysis import readout, sizing
from analysis.allocator import floor_estimate, replay_check, trace_is_complete, whatif
from analysis.allocator.config import setting_of, whatif_candidates
from analysis.categories import (
    ACTIVATIONS,
    CATEGORIES,
    GRADIENTS,
    OPTIMIZER_STATE,
    bytes_by_category,
    classify,
    frameless_backward,
    optimizer_windows,
)
from analysis.causes import CauseInput, Diagnosis, PoolUse, diagnose, pool_origin
from analysis.config import AllocatorConfig
from analysis.decision import decide
from analysis.explore import ExploreSink, checkpoint_events, explore_store, finish_timeline
from analysis.limits import Limit, OomMessage, choose_limit, parse_oom_message, sidecar_limit
from analysis.model import ALLOC, INACTIVE, DeviceData, Snapshot
from analysis.model import OOM as OOM_ACTION
from analysis.oom import MAX_OOMS_EXPLAINED, UsableFree, explain_oom, flush_window_start, oom_indices, verdict
from analysis.ooms import list_ooms
from analysis.parallel import Pending, Pool
from analysis.phases import tag_phases
from analysis.projection import Projection, project_failing_step, step_whatif
from analysis.reader import read_snapshot
from analysis.replay import AllocatorState, recorded_replay
from analysis.stacks import (
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
from analysis.timeline import build_timeline, columns_of, with_initial_state

SCHEMA = "oomscope.report/1"
Progress = Callable[[str, float], None]
I64 = npt.NDArray[np.int64]

# The report's own what-if candidates are the settings table's (analysis.allocator.config.SETTINGS).
# The report's own what-if replays cost a full pass each: past this many
# simulated events in total, the cheapest-to-skip candidates are dropped
# (expandable_segments is always tried).
AUTO_WHATIF_EVENT_BUDGET = 4_000_000
TOP_STACKS = 10
BACKWARD_NO_FRAMES = "backward pass (no frames: stacks='python' records none on the autograd thread)"
BEFORE_TRACE = "allocated before the trace began (stack unknown)"
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
    to that many forked child processes beside the rest (``analysis.parallel``);
    the report is the same. ``oom_message`` is torch's OOM message as the user
    has it, ``sidecar`` the client's sidecar JSON (``oomscope_client``): both give
    the real limit (``analysis.limits``); a text that is not an OOM message
    raises ``OomMessageError`` before any heavy work.
    """
    # The replays allocate millions of short-lived objects and create no cycles
    # worth collecting; the cyclic GC's passes over them are pure overhead.
    was_enabled = gc.isenabled()
    gc.disable()
    pool = Pool(jobs)
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
    # The file's sha256 is taken on a thread beside the read: hashlib and file
    # reads release the GIL, so on a second CPU it costs no time. It is joined
    # before anything forks.
    hashed: list[dict[str, Any] | BaseException] = []
    hasher = threading.Thread(target=_source_info_into, args=(hashed, source, filename), daemon=True)
    hasher.start()
    try:
        snapshot = read_snapshot(source if isinstance(source, bytes) else Path(source))
    finally:
        hasher.join()
    if isinstance(hashed[0], BaseException):
        raise hashed[0]
    src = hashed[0]
    src["format"] = snapshot.format
    report_progress("reading", 1.0)

    catalog = StackCatalog(snapshot.stacks)
    devices = [d for d in snapshot.devices if len(d.trace) or d.segments]
    device_reports = []
    advice_contexts: list[advice_mod.AdviceContext] = []
    metadata_batches: list[int | None] = []  # batch sizes the training script set with _set_memory_metadata
    warnings = [{"code": w.code, "message": w.message} for w in snapshot.warnings]
    complete = True
    has_trace = False
    # The message names its GPU; without a number it is the one device that ran out of memory.
    oom_devices = [d.device for d in devices if (d.trace.action == OOM_ACTION).any()]
    for k, dev in enumerate(devices):

        def dev_progress(stage: str, f: float, k: int = k) -> None:
            report_progress(stage, (k + f) / max(1, len(devices)))

        dev_message = message if message is not None and _message_applies(message, dev.device, oom_devices) else None
        analysis = _DeviceAnalysis(
            snapshot,
            dev,
            catalog,
            src["bytes"],
            limit,
            user_whatifs,
            dev_progress,
            pool,
            message=dev_message,
            sidecar=sidecar,
            checkpoints=explore is not None,
        )
        device_reports.append(analysis.report)
        if explore is not None:
            explore(dev.device, explore_store(snapshot, dev, catalog, analysis.replay, analysis.lifetimes))
        advice_contexts.append(analysis.advice_context)
        metadata_batches.append(sizing.batch_from_metadata(dev.user_metadata, analysis.oom_index))
        complete &= analysis.replay.trace_complete
        has_trace |= len(dev.trace) > 1
        prefix = f"device {dev.device}: " if len(devices) > 1 else ""
        # The reader and the replay can both notice the same thing (e.g. state-only): say it once.
        known = {w["code"] for w in warnings}
        warnings.extend(
            {"code": w.code, "message": prefix + w.message}
            for w in analysis.replay.warnings
            if len(devices) > 1 or w.code not in known
        )
        warnings.extend({"code": code, "message": prefix + text} for code, text in analysis.warnings)
    if message is not None and not any(_message_applies(message, d.device, oom_devices) for d in devices):
        warnings.append(
            {
                "code": "oom-message-unused",
                "message": (
                    f"the OOM message names GPU {message.device}, but no device of the snapshot with that number "
                    "ran out of memory; its limit was not used"
                    if message.device is not None
                    else "the OOM message names no GPU and several devices ran out of memory; its limit was not used"
                ),
            }
        )

    capture = {
        "has_trace": has_trace,
        "trace_complete": bool(complete and has_trace),
        "has_frames": bool(snapshot.stacks.stacks),
        "stacks": _stacks_kind(snapshot),
        "allocator_settings": _jsonable(snapshot.settings.raw),
        "warnings": warnings,
    }
    if not has_trace and not any(w["code"] == "state-only" for w in warnings):
        warnings.append({"code": "no-history", "message": "the snapshot holds no allocation history"})
    # The advisor's capture rule needs the capture section, known only now.
    for dev_report, ctx, metadata_batch in zip(device_reports, advice_contexts, metadata_batches, strict=True):
        ctx.capture = capture
        dev_report["suggestions"] = advice_mod.advise(ctx)
        sizing.size_into(dev_report, ctx, batch_size if batch_size is not None else metadata_batch)
        dev_report["decision"] = decide(dev_report, capture)
    report_progress("analysing", 1.0)
    return {
        "schema": SCHEMA,
        "source": src,
        "capture": capture,
        "devices": device_reports,
        "annotations": len(snapshot.annotations),
        "pools": [list(p) for p in snapshot.pools],
    }


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
    """``python -m analysis whatif``: one configuration replayed on every device; with an OOM
    inside a step, the rest of that step is projected and replayed too (``step_completes``)."""
    AllocatorConfig.parse(config)
    message = parse_oom_message(oom_message) if oom_message else None
    src = _source_info(source, filename)
    snapshot = read_snapshot(source if isinstance(source, bytes) else Path(source))
    src["format"] = snapshot.format
    out = []
    for dev in snapshot.devices:
        if not len(dev.trace):
            continue
        reserved = _reserved_from_segments_events(dev)
        peak = int(reserved.max()) if reserved.size else 0
        ooms = oom_indices(dev.trace)
        wlimit = limit
        recorded = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
        # The limit from the trace alone: the report's rule (infer_limit's bounds from below, one home).
        estimate = floor_estimate(snapshot, dev, recorded) if ooms.size and wlimit is None else None
        if estimate is not None and message is not None and message.device in (None, dev.device):
            chosen = choose_limit(given=None, sidecar=None, message=message, inferred=None, floor=estimate.lower)
            wlimit = chosen.bytes if chosen is not None else None
            span = _limit_range(chosen)
        else:
            span = None
        if estimate is not None and wlimit is None:
            wlimit = estimate.stated()[0]
        steps = find_steps(snapshot.annotations, dev.device, dev.trace.time_us)
        projection = None
        if ooms.size:
            projection = project_failing_step(
                dev.trace,
                steps,
                int(ooms[-1]),
                recorded,
                trace_complete=len(steps) > 0 and trace_is_complete(dev),
            )
        if projection is not None and projection.available:
            item = step_whatif(snapshot, dev, config, wlimit, steps.last_event.tolist(), projection, limit_range=span)
        else:
            item = whatif(snapshot, dev, config, wlimit, steps.last_event.tolist())
            item["step_completes"] = None
        out.append({"device": dev.device, "recorded_peak_reserved_bytes": peak, "whatif": item})
    return {"schema": SCHEMA, "source": src, "config": config, "devices": out}


# ------------------------------------------------------------------ per device


@dataclass
class _Moment:
    name: str  # "peak" | "oom" | "end"
    index: int
    state: AllocatorState


class _DeviceAnalysis:
    """All analyses of one device; ``report`` is its contract entry."""

    def __init__(
        self,
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
        checkpoints: bool = False,
    ) -> None:
        self.snapshot, self.dev, self.catalog = snapshot, dev, catalog
        trace = dev.trace
        n = len(trace)
        self.n = n
        ooms = oom_indices(trace)
        self.oom_index = int(ooms[-1]) if ooms.size else None
        self.warnings: list[tuple[str, str]] = []
        recorded_cfg = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
        self.recorded_cfg = recorded_cfg

        progress("replaying", 0.0)
        steps = find_steps(snapshot.annotations, dev.device, trace.time_us)
        # The limit from what the user has (given, sidecar, OOM message), before any replay.
        known_limit = self._known_limit(limit, message, sidecar, recorded_cfg)
        lifetimes = alloc_lifetimes(trace.action, trace.addr, trace.size, trace.stack)
        self.lifetimes = lifetimes
        self.projection: Projection | None = None
        if self.oom_index is not None:
            self.projection = project_failing_step(
                trace,
                steps,
                self.oom_index,
                recorded_cfg,
                trace_complete=len(steps) > 0 and trace_is_complete(dev),
                lifetimes=lifetimes,
            )
        # The policy replays start first when nothing they need comes from the
        # recorded replay: always the check; the what-ifs unless their limit is
        # the one an OOM shows (then they start right after the OOM is explained).
        check_pending = pool.submit(lambda: replay_check(snapshot, dev) if n else _empty_replay_check(snapshot))
        planned = None
        if self.oom_index is None or known_limit is not None:
            planned = self._submit_whatifs(
                pool, user_whatifs, known_limit.bytes if known_limit else None, known_limit, steps
            )
        self.live_requested: I64 | None = _live_requested(lifetimes, n)
        guess = int(self.live_requested.argmax()) if self.live_requested is not None else None
        reserved_peak = int(_reserved_from_segments_events(dev).argmax()) if n else None  # its segment map
        keep = [i for i in (guess, self.oom_index, reserved_peak) if i is not None and i >= 0]
        # Each OOM's state and the one before its malloc's own flush: what the request could use.
        explained = ooms[-MAX_OOMS_EXPLAINED:].tolist()
        keep += explained + [flush_window_start(trace, i) - 1 for i in explained]
        if checkpoints:  # the explore store's states come from this same pass
            keep += checkpoint_events(n)
        replay = recorded_replay(snapshot, dev, keep_at=keep)
        self.replay = replay
        progress("replaying", 0.5)
        cols = columns_of(replay)

        step_rows = per_step_figures(steps, cols["allocated"], cols["reserved"])
        summary = {
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
            "first_time_us": int(trace.time_us[0]) if n else 0,
            "last_time_us": int(trace.time_us[-1]) if n else 0,
        }
        oom = None
        device_limit = known_limit
        usable = {k: self._usable_free(k) for k in explained}
        if self.oom_index is not None:
            i = self.oom_index
            if device_limit is None:
                device_limit = self._inferred_limit(recorded_cfg)
            oom = explain_oom(
                trace,
                i,
                allocated=int(cols["allocated"][i]),
                reserved=int(cols["reserved"][i]),
                cached_free=int(cols["cached_free"][i]),
                largest_free=int(cols["largest_free"][i]),
                chosen=device_limit,
                all_ooms=int(ooms.size),
                usable=usable.get(i),
            )
            # The process's memory outside PyTorch's cache, as the message printed it (sizing's GPU fit).
            oom["non_pytorch_bytes"] = (
                message.non_pytorch.value if message is not None and message.non_pytorch is not None else None
            )
            if message is not None:
                self._check_message(message, oom, recorded_cfg)
        if planned is None:
            assert device_limit is not None
            planned = self._submit_whatifs(pool, user_whatifs, device_limit.bytes, device_limit, steps)

        timeline = (
            build_timeline(cols, trace.time_us, oom_index=self.oom_index, step_ends=steps.last_event.tolist())
            if n
            else None
        )
        timeline = finish_timeline(timeline, cols, dev, catalog)  # fused frees settled, event info per point
        if timeline is not None and n > 1:  # one event (a state-only dump) is no timeline to extend
            init = replay.initial
            timeline = with_initial_state(
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

        # Moments whose live blocks are attributed to stacks.
        moments = [_Moment("peak", replay.peak_allocated_index, replay.blocks_at(replay.peak_allocated_index))]
        if self.oom_index is not None:
            moments.append(_Moment("oom", self.oom_index, replay.blocks_at(self.oom_index)))
        moments.append(_Moment("end", n - 1, replay.blocks_at(n - 1)))
        progress("replaying", 1.0)

        progress("analysing", 0.0)
        own = [a for a in snapshot.annotations if a.device in (dev.device, -1)]
        # Same rule as steps: a device without optimizer marks of its own uses the others'.
        if not any(a.name.startswith("Optimizer.step#") for a in own):
            own = snapshot.annotations
        ann = [(a.name, a.stage, a.time_us) for a in own]
        opt_start, opt_end = optimizer_windows(ann, trace.time_us)
        trace_has_frames = bool((trace.stack >= 0).any())
        codes = classify(lifetimes, catalog, opt_start, opt_end, trace_has_frames=trace_has_frames)

        # A block live before the trace carries the stack of the event that freed it
        # when the final snapshot no longer holds it; with context="all" that is the
        # free site, not the allocation site, so such blocks count as "no frames".
        trusted_pre: set[int] | None = None
        if _frees_record_free_sites(trace, lifetimes):
            trusted_pre = {b.address for _, b in moments[-1].state.live_blocks() if b.alloc_index < 0}
        # Split "no frames" into what is known: blocks from before the trace, and
        # (stacks="python") the backward pass, whose thread records no frames.
        backward_alloc = (
            lifetimes.start[frameless_backward(lifetimes, catalog)] if trace_has_frames else np.zeros(0, np.int64)
        )
        top_stacks: list[dict[str, Any]] = []
        live_by_moment: dict[str, tuple[I64, I64, I64]] = {}
        for m in moments:
            stacks, sizes, alloc_idx = _live_blocks(m.state, trusted_pre)
            live_by_moment[m.name] = (stacks, sizes, alloc_idx)
            gids = catalog.groups_of(stacks).astype(np.int64)
            frameless = gids == 0
            if frameless.any():
                gids[frameless & np.isin(alloc_idx, backward_alloc)] = catalog.pseudo_group(BACKWARD_NO_FRAMES)
                gids[frameless & (alloc_idx < 0)] = catalog.pseudo_group(BEFORE_TRACE)
            totals = totals_by_group(catalog, stacks, sizes, gids)
            top_stacks.extend(top_entries(catalog, totals, m.name, TOP_STACKS))

        peak_stacks, peak_sizes, peak_alloc_idx = live_by_moment["peak"]
        peak_codes = _codes_of_blocks(lifetimes, codes, peak_alloc_idx, peak_stacks, catalog)
        categories = bytes_by_category(peak_codes, peak_sizes)

        if oom is not None:
            oom_rows = [r for r in top_stacks if r["when"] == "oom"]
            oom["top_stacks"] = oom_rows[:3]
        progress("analysing", 0.3)

        whatif_items, advice_whatifs = self._whatif_items(planned)
        if oom is not None:
            oom["whatif"] = [
                {
                    "config": w["config"],
                    "oom_avoided": w["oom_avoided"],
                    "peak_reserved_bytes": w["peak_reserved_bytes"],
                    "step_completes": w.get("step_completes"),
                }
                for w in whatif_items
            ]
            self._step_verdict(oom, whatif_items)
        progress("analysing", 0.8)
        check = check_pending.result()
        diagnosis = self._diagnose(lifetimes, steps, cols, opt_start, opt_end, oom, device_limit, message)

        report: dict[str, Any] = {
            "device": dev.device,
            "events": n,
            "summary": summary,
            "limit": device_limit.to_json() if device_limit is not None else None,
            "oom": oom,
            "ooms": list_ooms(
                trace,
                cols,
                config=recorded_cfg,
                chosen=device_limit,
                step_last_events=steps.last_event if len(steps) else None,
                usable=usable,
            )
            if device_limit is not None
            else [],
            "steps": step_rows,
            "step_source": steps.source,
            "first_growth_step": first_growth_step(step_rows),
            "timeline": timeline,
            "top_stacks": top_stacks,
            "whatif": whatif_items,
            "replay": check,
            "suggestions": [],
            "moments": {m.name: m.index for m in moments},
            "segment_maps": {m.name: segment_map(m.state, catalog) for m in moments if m.name in ("peak", "oom")}
            | ({"reserved_peak": segment_map(replay.blocks_at(replay.peak_reserved_index), catalog)} if n else {}),
            "categories": {
                "event_index": int(replay.peak_allocated_index),
                "bytes": categories,
                "order": list(CATEGORIES),
            },
            "churn": top_entries(
                catalog, totals_by_group(catalog, lifetimes.stack, lifetimes.size), "churn", TOP_STACKS
            ),
            "leaks": self._leaks(live_by_moment["end"], lifetimes, steps),
            "diagnosis": diagnosis.to_json(),
        }
        report["edge_of_cap"] = readout.edge_of_cap(report)  # issue 20: no OOM, but within 5% of a known cap
        # The advisor's input travels beside the report, typed, not inside it.
        self.advice_context: advice_mod.AdviceContext = self._advice_context(
            report, lifetimes, codes, peak_codes, live_by_moment["peak"], advice_whatifs, source_bytes, len(steps)
        )
        self.live_requested = None  # its last use: an int64 per event need not outlive the device
        self.report = report
        progress("analysing", 1.0)

    # -- what-if replays ---------------------------------------------------------
    def _submit_whatifs(
        self, pool: Pool, user: list[str], wlimit: int | None, chosen: Limit | None, steps: Steps
    ) -> list[tuple[str, str, str, Pending]]:
        """Start every what-if replay: (setting, config, origin, its pending result),
        the report's own candidates first, then the user's; each config replayed once.
        With a projected tail (an OOM inside a step) each replay runs it too."""
        if self.n == 0:
            return []
        snapshot, dev = self.snapshot, self.dev
        recorded = self.recorded_cfg
        # A cap, not the device's size, was binding: the GC setting can act under it.
        cap_exists = (chosen is not None and (chosen.source == "given" or chosen.kind == "per-process-cap")) or (
            recorded.per_process_memory_fraction is not None
        )
        if chosen is not None and not cap_exists and recorded.garbage_collection_threshold > 0:
            self.warnings.append(
                (
                    "gc-without-cap",
                    f"garbage_collection_threshold:{recorded.garbage_collection_threshold:g} is set, but this run had "
                    "no per-process memory cap (the device itself was full): torch runs that garbage collection only "
                    "under torch.cuda.set_per_process_memory_fraction, so it did nothing here, and the replays leave "
                    "it out",
                )
            )
        ends = steps.last_event.tolist()
        started: dict[str, Pending] = {}
        projection = self.projection if self.projection is not None and self.projection.available else None
        span = _limit_range(chosen)

        def start(conf: str) -> Pending:
            if conf not in started:
                if projection is not None:
                    started[conf] = pool.submit(
                        lambda: step_whatif(
                            snapshot, dev, conf, wlimit, ends, projection, limit_range=span, capped=cap_exists
                        )
                    )
                else:
                    started[conf] = pool.submit(lambda: whatif(snapshot, dev, conf, wlimit, ends, capped=cap_exists))
            return started[conf]

        # A candidate the user also asked for is listed once, as the user's.
        budget = max(1, AUTO_WHATIF_EVENT_BUDGET // max(1, self.n))
        own = whatif_candidates(recorded, capped=cap_exists, at_most=budget)
        auto = [(setting, conf) for setting, conf in own if conf not in user]
        planned = [(setting, conf, "auto", start(conf)) for setting, conf in auto]
        planned += [(setting_of(conf), conf, "user", start(conf)) for conf in dict.fromkeys(user)]
        return planned

    def _whatif_items(
        self, planned: list[tuple[str, str, str, Pending]]
    ) -> tuple[list[dict[str, Any]], list[advice_mod.WhatIf]]:
        """The contract's what-if items (the report's own, the best max_split_size_mb
        of those tried, then the user's) and the advisor's view of them."""
        items: list[dict[str, Any]] = []
        tried_split: list[dict[str, Any]] = []
        user_items: list[dict[str, Any]] = []
        for setting, _conf, origin, pending in planned:
            result = pending.result()
            # Without any limit the model never has to flush its cache, so a
            # setting that fragments can reserve more than a real GPU holds.
            item = {**result, "unbounded": result.get("limit_bytes") is None, "origin": origin, "setting": setting}
            if origin == "user":
                user_items.append(item)
            else:
                (tried_split if setting == "max_split_size_mb" else items).append(item)
        if tried_split:
            # Several max_split_size_mb values are tried; the best one is listed.
            best = min(tried_split, key=_whatif_rank)
            best["tried"] = [
                {
                    "config": t["config"],
                    "peak_reserved_bytes": t["peak_reserved_bytes"],
                    "oom_avoided": t["oom_avoided"],
                    "step_completes": t.get("step_completes"),
                }
                for t in tried_split
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
        return items, advice_items

    # -- the limit -----------------------------------------------------------------
    def _known_limit(
        self, limit: int | None, message: OomMessage | None, sidecar: dict[str, Any] | None, cfg: AllocatorConfig
    ) -> Limit | None:
        """The limit from what the user has (None: only the trace can tell)."""
        side = sidecar_limit(sidecar, self.dev.device) if self.oom_index is not None else None
        if limit is None and side is None and message is None:
            return None
        # Every segment the limit check let through was allowed, so the limit is at least the most
        # of those (infer_limit's lower; only the message's range needs it).
        floor = floor_estimate(self.snapshot, self.dev, cfg).lower if message is not None and self.n else 0
        return choose_limit(given=limit, sidecar=side, message=message, inferred=None, floor=floor)

    def _usable_free(self, index: int) -> UsableFree:
        """What the OOM request at ``index`` could have used (``oom.UsableFree``)."""
        before = self.replay.blocks_at(flush_window_start(self.dev.trace, index) - 1)
        return UsableFree(self.dev.trace, index, before, self.replay.blocks_at(index), self.recorded_cfg)

    def _inferred_limit(self, cfg: AllocatorConfig) -> Limit:
        """The limit from the trace alone: the allocator package's one rule (``LimitEstimate.stated``)."""
        chosen = choose_limit(
            given=None, sidecar=None, message=None, inferred=floor_estimate(self.snapshot, self.dev, cfg).stated()
        )
        assert chosen is not None
        return chosen

    def _check_message(self, message: OomMessage, oom: dict[str, Any], cfg: AllocatorConfig) -> None:
        """Warn when the pasted message cannot be this trace's last OOM."""
        wanted = cfg.allocation_size(int(oom["requested_bytes"]))
        problems = []
        if not message.tried.low <= wanted <= message.tried.high and not (
            message.tried.low <= int(oom["requested_bytes"]) <= message.tried.high
        ):
            problems.append(f"it tried to allocate {message.tried.text}, the trace's last OOM {wanted:,} bytes")
        if message.allocated is not None and not (
            message.allocated.low <= int(oom["allocated_bytes"]) <= message.allocated.high
        ):
            problems.append(
                f"it shows {message.allocated.text} allocated, the trace {int(oom['allocated_bytes']):,} bytes"
            )
        if problems:
            self.warnings.append(
                (
                    "oom-message-mismatch",
                    "the OOM message does not match the trace's last OOM (" + "; ".join(problems) + "): it may come "
                    "from another run or another OOM; its limit is used all the same",
                )
            )

    # -- step level ----------------------------------------------------------------
    def _step_verdict(self, oom: dict[str, Any], items: list[dict[str, Any]]) -> None:
        """The step-level keys of ``oom`` and, where the step was projected, the verdict."""
        proj = self.projection
        oom["projection"] = proj.to_json() if proj is not None else {"available": False, "reason": "no OOM"}
        if proj is None or not proj.available:
            oom["step_need_bytes"] = None
            oom["step_shortfall_bytes"] = None
            return
        limit = int(oom["limit_bytes"])
        need = proj.step_need_bytes
        oom["step_need_bytes"] = need
        oom["step_shortfall_bytes"] = max(0, need - limit)
        finishing = [w["config"] for w in items if w.get("step_completes") is True]
        oom["verdict"] = verdict(need, 0, limit)
        oom["verdict_level"] = "step"
        oom["verdict_certain"] = not (oom["verdict"] == "capacity" and oom["limit_is_lower_bound"])
        bound = "at least " if oom["limit_is_lower_bound"] else ""
        if need > limit:
            if oom["limit_is_lower_bound"]:
                tail = (
                    f"more than {_gib(limit)}, the most this run reserved; the real cap is not in the snapshot, so "
                    "whether it fits is unknown: paste the OOM message or give --limit."
                )
            else:
                tail = f"more than the limit of {_gib(limit)}: no allocator setting saves this step."
            text = (
                f"Projected from step {proj.template_step}, step {proj.step} needs {_gib(need)} even packed "
                f"without fragmentation, {tail}"
            )
        elif finishing:
            text = (
                f"Projected from step {proj.template_step}, step {proj.step} needs {_gib(need)} packed without "
                f"fragmentation, within the limit of {bound}{_gib(limit)}; under {', '.join(finishing)} the replay "
                "runs the whole step."
            )
        else:
            text = (
                f"Projected from step {proj.template_step}, step {proj.step} needs {_gib(need)} packed without "
                f"fragmentation, within the limit of {bound}{_gib(limit)}, but none of the settings replayed lets "
                "the whole step run."
            )
        oom["explanation"] = f"{oom['explanation']} {text}"

    # -- leak suspects -----------------------------------------------------------
    def _leaks(self, end_live: tuple[I64, I64, I64], lifetimes: Lifetimes, steps: Steps) -> list[dict[str, Any]]:
        """Groups holding memory at the end, with their live bytes at each step's end."""
        stacks, sizes, _ = end_live
        totals = totals_by_group(self.catalog, stacks, sizes)[:TOP_STACKS]
        rows = top_entries(self.catalog, totals, "end", len(totals))
        if not rows or len(steps) == 0:
            return rows
        ends = steps.last_event
        gids = self.catalog.groups_of(lifetimes.stack)
        wanted = np.array([t.group for t in totals], np.int64)
        pos = {g: k for k, g in enumerate(wanted.tolist())}
        sel = np.isin(gids, wanted)
        g_sel = np.array([pos[g] for g in gids[sel].tolist()], np.int64) if sel.any() else np.zeros(0, np.int64)
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

    # -- the program's causes (analysis.causes) ------------------------------------
    def _diagnose(
        self,
        lifetimes: Lifetimes,
        steps: Steps,
        cols: dict[str, I64],
        opt_start: I64,
        opt_end: I64,
        oom: dict[str, Any] | None,
        limit: Limit | None,
        message: OomMessage | None,
    ) -> Diagnosis:
        trace, replay = self.dev.trace, self.replay
        phases = tag_phases(trace, lifetimes, self.catalog, self.snapshot.stacks, opt_start, opt_end)
        at = self.oom_index if self.oom_index is not None else (int(replay.peak_reserved_index) if self.n else None)
        pools: tuple[PoolUse, ...] = ()
        reserved_at = 0
        if at is not None:
            by_pool: dict[int, int] = {}
            for seg in replay.blocks_at(at).segments:
                by_pool[int(seg.pool)] = by_pool.get(int(seg.pool), 0) + int(seg.total_size)
            pools = tuple(PoolUse(k, v) for k, v in sorted(by_pool.items()))
            reserved_at = int(cols["reserved"][at])
        private = trace.pool[lifetimes.start] != 0 if self.n else np.zeros(0, bool)
        inp = CauseInput(
            trace=trace,
            lifetimes=lifetimes,
            catalog=self.catalog,
            phases=phases,
            steps=steps,
            allocated=cols["allocated"],
            oom_index=self.oom_index,
            requested_bytes=int(oom["requested_bytes"]) if oom is not None else 0,
            limit_bytes=limit.bytes if limit is not None else None,
            message=message,
            pools_at_oom=pools,
            reserved_at_oom=reserved_at,
            pool_origin=pool_origin(self.catalog, lifetimes.stack[private]) if private.any() else "",
            optimizer_class=next(
                (
                    a.name.split("#", 1)[1].split(".", 1)[0]
                    for a in self.snapshot.annotations
                    if a.name.startswith("Optimizer.step#") and "#" in a.name
                ),
                "",
            ),
        )
        return diagnose(inp)

    # -- the advisor's inputs ----------------------------------------------------
    def _advice_context(
        self,
        report: dict[str, Any],
        lifetimes: Lifetimes,
        codes: npt.NDArray[np.int8],
        peak_codes: npt.NDArray[np.int8],
        peak_live: tuple[I64, I64, I64],
        whatifs: list[advice_mod.WhatIf],
        source_bytes: int,
        n_steps: int,
    ) -> advice_mod.AdviceContext:
        catalog, trace = self.catalog, self.dev.trace
        stacks, sizes, _ = peak_live
        act_mask = peak_codes == ACTIVATIONS
        by_site: dict[str, int] = {}
        for t in totals_by_group(catalog, stacks[act_mask], sizes[act_mask]):
            info = catalog.groups[t.group]
            site = info.site
            label = info.label if site is None else f"{site.filename.rsplit('/', 1)[-1]}:{site.line} {site.name}"
            by_site[label] = by_site.get(label, 0) + t.bytes
        opt_mask = peak_codes == OPTIMIZER_STATE
        opt_labels = [
            catalog.groups[t.group].label for t in totals_by_group(catalog, stacks[opt_mask], sizes[opt_mask])
        ]
        traits = catalog.stack_traits(lifetimes.stack)
        alloc_sizes = trace.size[trace.action == ALLOC]
        large = alloc_sizes[alloc_sizes >= (1 << 20)]
        summary = report["summary"]
        peak_idx = int(summary["peak_allocated_event_index"])
        reserved = self.replay.reserved
        has_backward = bool((codes == GRADIENTS).any() or ((traits & TRAIT_BACKWARD) != 0).any())
        autocast_seen = bool(((traits & TRAIT_AUTOCAST) != 0).any())
        # The workload estimates cost passes over every allocation: only where a rule can use them.
        worth = has_backward and int(report["categories"]["bytes"]["activations"]) >= advice_mod.WORKLOAD_MIN_BYTES
        amp_low, amp_high = (
            _amp_saving_range(catalog, lifetimes, codes, self.live_requested)
            if worth and not autocast_seen
            else (None, None)
        )
        ckpt = _checkpoint_estimate(catalog, stacks[act_mask], sizes[act_mask]) if worth else None
        return advice_mod.AdviceContext(
            device=self.dev.device,
            recorded=AllocatorConfig.from_settings(self.snapshot.settings.raw, self.snapshot.settings.conf),
            events=self.n,
            peak_reserved=int(summary["peak_reserved_bytes"]),
            peak_allocated=int(summary["peak_allocated_bytes"]),
            peak_requested=int(summary["peak_requested_bytes"]),
            reserved_at_peak_alloc=int(reserved[peak_idx]) if 0 <= peak_idx < reserved.shape[0] else 0,
            oom=report["oom"],
            whatifs=whatifs,
            categories=report["categories"]["bytes"],
            activations_by_site=sorted(by_site.items(), key=lambda kv: -kv[1]),
            has_backward=has_backward,
            autocast_seen=autocast_seen,
            optimizer_state_bytes=int(report["categories"]["bytes"]["optimizer_state"]),
            optimizer_labels=opt_labels[:3],
            distinct_large_sizes=int(np.unique(large).size),
            large_requests=int(large.size),
            capture={},
            source_bytes=source_bytes,
            steps=n_steps,
            mean_stack_frames=float(np.mean([len(st) for st in self.snapshot.stacks.stacks]))
            if self.snapshot.stacks.stacks
            else 0.0,
            amp_saving_low=amp_low,
            amp_saving_high=amp_high,
            checkpoint=ckpt,
        )


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


def _peak_without(live: I64, lifetimes: Lifetimes, cut: npt.NDArray[np.bool_]) -> int:
    """Peak of ``live`` (live requested bytes per event) with half of each ``cut`` allocation gone."""
    n = lifetimes.n_events
    if not cut.any():
        return int(live.max())
    # Only the cut allocations are summed again (bincount in float64: exact below 2**53 bytes).
    half = (lifetimes.size[cut] // 2).astype(np.float64)
    delta = np.bincount(lifetimes.start[cut], half, n + 1) - np.bincount(lifetimes.end[cut], half, n + 1)
    return int((live - np.cumsum(np.rint(delta[:n]).astype(np.int64))).max())


def _amp_saving_range(
    catalog: StackCatalog, lifetimes: Lifetimes, codes: npt.NDArray[np.int8], live: I64 | None
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
    base = int(live.max())
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


def _live_requested(lifetimes: Lifetimes, n: int) -> I64 | None:
    """Live requested bytes after every event (numpy, before the replay). Where it peaks is
    usually the allocated peak too, so the replay keeps that state in its one pass; the AMP
    estimate replays it with smaller activations."""
    if n == 0 or lifetimes.start.size == 0:
        return None
    # bincount sums in float64: exact while totals stay below 2**53 bytes.
    sizes = lifetimes.size.astype(np.float64)
    delta = np.bincount(lifetimes.start, sizes, n + 1) - np.bincount(lifetimes.end, sizes, n + 1)
    return np.cumsum(np.rint(delta[:n]).astype(np.int64))


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
    return np.unique(np.r_[np.linspace(0, n - 1, k).astype(np.int64), n - 1])


def _reserved_from_segments_events(dev: DeviceData) -> I64:
    from analysis.model import SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP

    t = dev.trace
    grow = (t.action == SEGMENT_ALLOC) | (t.action == SEGMENT_MAP)
    shrink = (t.action == SEGMENT_FREE) | (t.action == SEGMENT_UNMAP)
    return np.cumsum(np.where(grow, t.size, 0) - np.where(shrink, t.size, 0))


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
    out: list[dict[str, Any] | BaseException], source: str | Path | bytes, filename: str | None
) -> None:
    try:
        out.append(_source_info(source, filename))
    except BaseException as exc:  # handed to the reading thread, which raises it
        out.append(exc)


def _source_info(source: str | Path | bytes, filename: str | None) -> dict[str, Any]:
    digest = hashlib.sha256()
    if isinstance(source, bytes):
        digest.update(source)
        size = len(source)
        name = filename or "snapshot"
    else:
        path = Path(source)
        size = 0
        with path.open("rb") as fh:
            # Large chunks: the thread needs the GIL once per chunk (see build_report).
            for chunk in iter(lambda: fh.read(4 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
        name = filename or path.name
    return {"filename": name, "bytes": size, "sha256": digest.hexdigest(), "format": None}


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
