"""The program's mistake behind the OOM (``analysis.causes``' rules) and the whole device at the OOM.

``diagnose_device(...) -> Diagnosis`` feeds ``causes.diagnose`` its typed input (the phases, the pools
at the OOM, the limit); ``ledger_of(...) -> Ledger`` is ``ledger.device_ledger`` at the OOM (else the
reserved peak).
"""

from __future__ import annotations

from analysis.allocator.recorded import RecordedReplay
from analysis.causes import Diagnosis, diagnose
from analysis.causes.base import CauseInput, PoolUse
from analysis.causes.outside import pool_origin
from analysis.ledger import Ledger, device_ledger
from analysis.limits import OomMessage
from analysis.model import Snapshot
from analysis.phases import Phases, pass_figures, tag_phases
from analysis.stacks import TRAIT_AUTOCAST, StackCatalog
from analysis.stages.attribution import Attribution
from analysis.stages.explain import Explained
from analysis.stages.outline import Facts
from analysis.stages.replays import Recorded


def diagnose_device(
    snapshot: Snapshot,
    facts: Facts,
    recorded: Recorded,
    catalog: StackCatalog,
    attribution: Attribution,
    explained: Explained,
    message: OomMessage | None,
    phases: Phases | None = None,
) -> Diagnosis:
    """``phases``: ``device_phases``' answer where the caller has it already."""
    trace, lifetimes, replay = facts.dev.trace, facts.lifetimes, recorded.replay
    if phases is None:
        phases = device_phases(snapshot, facts, catalog, attribution)
    at = facts.oom_index if facts.oom_index is not None else (int(replay.peak_reserved_index) if facts.n else None)
    pools: tuple[PoolUse, ...] = ()
    reserved_at = 0
    if at is not None:
        by_pool: dict[int, int] = {}
        for seg in replay.blocks_at(at).segments:
            by_pool[int(seg.pool)] = by_pool.get(int(seg.pool), 0) + int(seg.total_size)
        pools = tuple(PoolUse(k, v) for k, v in sorted(by_pool.items()))
        reserved_at = int(recorded.cols["reserved"][at])
    # The allocations a private pool made: the trace's pool ids where recorded, else the final segments' pools
    # (torch <= 2.11's entries carry no pool id), the same mask as the categories and the phases.
    private = attribution.private
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


def device_phases(snapshot: Snapshot, facts: Facts, catalog: StackCatalog, attribution: Attribution) -> Phases:
    """The phase of every allocation (``phases.tag_phases``), with the masks the attribution computed once."""
    return tag_phases(
        facts.dev.trace,
        facts.lifetimes,
        catalog,
        snapshot.stacks,
        attribution.opt_start,
        attribution.opt_end,
        frameless=attribution.frameless,
        private=attribution.private,
        in_window=attribution.in_window,
    )


def signature_of(facts: Facts, catalog: StackCatalog, attribution: Attribution, phases: Phases) -> dict[str, object]:
    """``devices[].signature``: the passes' figures a follow-up compares (``phases.pass_figures``)."""
    # Every event's stack: autocast's frames come on the frees it makes at ``__exit__`` (its cast cache).
    autocast = catalog.any_has(facts.dev.trace.stack, TRAIT_AUTOCAST)
    return pass_figures(phases, facts.lifetimes, autocast, attribution.opt_start)


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


def ledger_of(
    snapshot: Snapshot, facts: Facts, replay: RecordedReplay, catalog: StackCatalog, message: OomMessage | None
) -> Ledger:
    """The whole device at the OOM (else the reserved peak): ``analysis.ledger``."""
    return device_ledger(snapshot, facts.dev, replay, catalog, facts.recorded_cfg, facts.oom_index, message)


def growth_per_step(diagnosed: Diagnosis) -> int:
    """The growing workload's measured growth a step (``causes.growing_workload``'s figure), 0 where no cause
    says the steps grow: what ``whatifs.add_grown_horizons`` grows the replayed steps by."""
    for cause in diagnosed.causes:
        if cause.id == "growing_workload":
            return int(cause.figures.get("growth_per_step_bytes") or 0)
    return 0
