"""The what-if replays: what they run under, decided once per device, started on the pool and collected.

``whatif_basis(...) -> WhatIfBasis`` (the limit, the one "capped" rule ``limits.run_was_capped``, the
projected step), ``submit_whatifs(...) -> list[Planned]`` (the settings table's candidates, then the
user's), ``collect_whatifs(planned) -> WhatIfs`` (the contract items and the advisor's typed ones), and
``command_item(...)``: the ``whatif`` command's answer for one device, from the same stages;
``add_grown_horizons(...)``: a growing run's horizon under each setting that gets the failing step through
(``analysis.horizon``), once the diagnosis has measured the growth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from analysis import advice as advice_mod
from analysis.allocator import Requests, build_requests, infer_limit, whatif
from analysis.allocator.answers import Beside, fitted_limit
from analysis.allocator.config import AllocatorConfig, setting_named, setting_of, whatif_candidates
from analysis.allocator.reserved import recorded_reserved
from analysis.horizon import NEAR_HORIZON_SHARE, NEAR_HORIZON_STEPS, grown_horizon
from analysis.limits import INFERRED, Limit, OomMessage, run_was_capped
from analysis.model import DeviceData, Snapshot
from analysis.parallel import Pending, Pool
from analysis.projection import Projection
from analysis.stages.outline import Outline, chosen_limit, failing_step, trace_outline
from analysis.stepwhatif import step_whatif

# The report's own what-if candidates are the settings table's (analysis.allocator.config.SETTINGS).
# The report's own what-if replays cost a full pass each: past this many
# simulated events in total, the cheapest-to-skip candidates are dropped
# (expandable_segments is always tried).
AUTO_WHATIF_EVENT_BUDGET = 4_000_000
# Grown steps replayed after the failing one (``add_grown_horizons``): at least this many, and always more than
# twice the steps within which a horizon is near (``horizon.horizon_is_near``), so that "near" and "far" are
# both answers the replay can give and a far horizon is a step the replay reached, not a guess.
GROWN_STEPS_MIN = 10


@dataclass(frozen=True)
class Planned:
    """One what-if replay started in the pool."""

    setting: str
    config: str
    origin: str  # "auto" | "user"
    pending: Pending
    basis: WhatIfBasis | None = None  # what it replays under (the same for every what-if of a device)


@dataclass(frozen=True)
class WhatIfs:
    items: list[dict[str, Any]]  # contract ``whatif`` items
    advice: list[advice_mod.WhatIf]  # the same, typed, for the advisor
    basis: WhatIfBasis | None = None  # what they replayed under (None: no what-if ran)


@dataclass(frozen=True)
class WhatIfBasis:
    """What every what-if replay of one device runs under, decided once (``whatif_basis``), for the
    report and the ``whatif`` command alike."""

    limit: Limit | None  # the report's limit
    replay_limit: int | None  # what the replays run under; None: bounded from the trace (``allocator.whatif``)
    capped: bool  # a per-process cap: the GC setting acts (``limits.run_was_capped``)
    ends: list[int]  # the steps' last events
    projection: Projection | None  # the failing step's projected tail (an OOM inside a step)


def submit_whatifs(
    pool: Pool,
    snapshot: Snapshot,
    outline: Outline,
    projected: Projection | None,
    requests: Requests | None,
    user: list[str],
    chosen: Limit | None,
    warnings: list[tuple[str, str]],
) -> list[Planned]:
    """Start every what-if replay, the report's own candidates first, then the user's; each
    config replayed once. With a projected tail (an OOM inside a step) each replay runs it too."""
    if outline.n == 0 or requests is None:
        return []
    dev, recorded = outline.dev, outline.recorded_cfg
    basis = whatif_basis(snapshot, outline, projected, requests, chosen)
    if chosen is not None and not basis.capped and recorded.garbage_collection_threshold > 0:
        warnings.append(_gc_without_cap(recorded))
    started: dict[str, Pending] = {}

    def start(conf: str) -> Pending:
        if conf not in started:
            started[conf] = pool.submit(lambda: replay_whatif(snapshot, dev, conf, basis, requests, pool.beside))
        return started[conf]

    # A candidate the user also asked for is listed once, as the user's.
    budget = max(1, AUTO_WHATIF_EVENT_BUDGET // max(1, outline.n))
    own = whatif_candidates(recorded, capped=basis.capped, at_most=budget)
    auto = [(setting, conf) for setting, conf in own if conf not in user]
    planned = [Planned(setting, conf, "auto", start(conf), basis) for setting, conf in auto]
    planned += [Planned(setting_of(conf), conf, "user", start(conf), basis) for conf in dict.fromkeys(user)]
    return planned


def whatif_basis(
    snapshot: Snapshot, outline: Outline, projected: Projection | None, requests: Requests, chosen: Limit | None
) -> WhatIfBasis:
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
    return WhatIfBasis(chosen, replay_limit, capped, outline.steps.last_event.tolist(), projection)


def replay_whatif(
    snapshot: Snapshot,
    dev: DeviceData,
    conf: str,
    basis: WhatIfBasis,
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


def collect_whatifs(planned: list[Planned]) -> WhatIfs:
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
                # A follow-up's horizon for this exact value reads it (analysis.followup._replay_prediction).
                "step_peak_reserved_bytes": t.get("step_peak_reserved_bytes"),
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
    return WhatIfs(items, advice_items, planned[0].basis if planned else None)


def grown_steps(step: int) -> int:
    """How many grown steps to replay after the failing ``step`` (see ``GROWN_STEPS_MIN``)."""
    near = max(NEAR_HORIZON_STEPS, math.ceil(NEAR_HORIZON_SHARE * step))
    return max(GROWN_STEPS_MIN, 2 * near + 1)


def add_grown_horizons(
    snapshot: Snapshot, dev: DeviceData, whatifs: WhatIfs, growth_per_step: int, requests: Requests | None
) -> None:
    """``whatif[].grown_horizon`` of every setting whose replay ran the failing step to its end, where the run's
    steps grow (``growth_per_step``: ``causes.growing_workload``'s measured line, 0 without one): the failing step
    and its grown copies replayed under the setting (``analysis.horizon.grown_horizon``), under what the what-if
    itself replayed under. A setting that only gets past the step postpones the OOM; how far is this answer."""
    basis = whatifs.basis
    if basis is None or basis.projection is None or growth_per_step <= 0 or requests is None:
        return
    steps = grown_steps(basis.projection.step)
    for item in whatifs.items:
        if item.get("step_completes") is not True:
            continue
        horizon = grown_horizon(
            snapshot,
            dev,
            str(item["config"]),
            basis.replay_limit,
            basis.ends,
            basis.projection,
            growth_per_step,
            steps,
            capped=basis.capped,
            requests=requests,
        )
        item["grown_horizon"] = horizon.to_json()


def _whatif_rank(item: dict[str, Any]) -> tuple[bool, int]:
    """Avoiding the OOM first, then the lowest peak reserved memory."""
    return (item["oom_avoided"] is not True, int(item["peak_reserved_bytes"]))


def _limit_range(chosen: Limit | None) -> tuple[int, int] | None:
    """Where the real limit may lie when the source gives a range (an OOM message's two
    decimals); None for an exact limit, or an inferred one (a lower bound: open above)."""
    if chosen is None or chosen.high is None or chosen.low >= chosen.high or chosen.is_lower_bound:
        return None
    return chosen.low, chosen.high


def command_item(
    snapshot: Snapshot, dev: DeviceData, config: str, limit: int | None, message: OomMessage | None
) -> dict[str, Any]:
    """``python -m analysis whatif``'s answer for one device: ``config`` replayed under what the report's
    own what-ifs replay under, reached through the same stages (``trace_outline``, ``chosen_limit``,
    ``failing_step``, ``whatif_basis``, ``replay_whatif``); with an OOM inside a step, the rest of that
    step is projected and replayed too (``step_completes``)."""
    outline = trace_outline(snapshot, dev, limit, message, None)
    requests = build_requests(snapshot, dev)
    basis = whatif_basis(snapshot, outline, failing_step(outline), requests, chosen_limit(snapshot, outline))
    item = replay_whatif(snapshot, dev, config, basis, requests)
    item.setdefault("step_completes", None)
    reserved = recorded_reserved(dev)
    peak = int(reserved.max()) if reserved.size else 0
    return {"device": dev.device, "recorded_peak_reserved_bytes": peak, "whatif": item}
