"""The serializer: the stages' typed results written as a device's contract entry, once.

``device_json(...) -> dict`` (every key but those that read the policy replays), ``oom_json(...)`` and
``with_replays(...)`` (``oom``, ``whatif``, ``replay``, ``edge_of_cap`` once the replays are in), and
``timeline_json(...)`` (the replay's columns downsampled, from the state before the trace).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from analysis import readout
from analysis.allocator.recorded import RecordedReplay
from analysis.categories import CATEGORIES
from analysis.causes import Diagnosis
from analysis.explore import finish_timeline
from analysis.ledger import Ledger
from analysis.model import sorted_unique
from analysis.oom import verdict
from analysis.ooms import list_ooms
from analysis.projection import Projection
from analysis.stacks import Lifetimes, StackCatalog, top_entries, totals_by_group
from analysis.stages.attribution import TOP_STACKS, Attribution
from analysis.stages.explain import Explained
from analysis.stages.outline import Facts
from analysis.stages.replays import Recorded
from analysis.stages.segment_maps import segment_map
from analysis.stages.whatifs import WhatIfs
from analysis.steps import Steps, first_growth_step, per_step_figures
from analysis.timeline import Columns, build_timeline, fused_free_settler, reserved_plateau, with_initial_state

I64 = npt.NDArray[np.int64]


LEAK_SERIES_MAX_POINTS = 200


def timeline_json(facts: Facts, recorded: Recorded, catalog: StackCatalog) -> dict[str, Any] | None:
    """The contract ``timeline``: the replay's columns downsampled, from the state before the trace."""
    cols, replay, dev = recorded.cols, recorded.replay, facts.dev
    timeline = (
        build_timeline(
            cols,
            dev.trace.time_us,
            oom_index=facts.oom_index,
            step_ends=facts.steps.last_event.tolist(),
            settle=fused_free_settler(dev.trace),
        )
        if facts.n
        else None
    )
    # Event info per point (the backward pass's frame-less events named so).
    timeline = finish_timeline(timeline, dev, catalog, facts.lifetimes)
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


def _categories_json(index: int, attribution: Attribution) -> dict[str, Any]:
    """Contract ``categories`` at the allocated peak; ``private_pools`` only where a pool held memory."""
    shown = [c for c in CATEGORIES if c != "private_pools" or attribution.categories[c]]
    return {
        "event_index": index,
        "bytes": {c: attribution.categories[c] for c in shown},
        "order": shown,
        "pools": [p.to_json() for p in attribution.pools],
    }


def oom_json(facts: Facts, explained: Explained, attribution: Attribution, whatifs: WhatIfs) -> dict[str, Any]:
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


def _summary_json(facts: Facts, replay: RecordedReplay) -> dict[str, Any]:
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


def device_json(
    facts: Facts,
    recorded: Recorded,
    explained: Explained,
    attribution: Attribution,
    diagnosis: Diagnosis,
    timeline: dict[str, Any] | None,
    catalog: StackCatalog,
    ledger: Ledger,
) -> dict[str, Any]:
    """The device's contract entry, from the stages' results: ``oom``, ``whatif``, ``replay`` and
    ``edge_of_cap`` in their places but filled by ``with_replays``, ``suggestions`` later."""
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


def _plateau_json(replay: RecordedReplay, cols: Columns) -> dict[str, int] | None:
    """``devices[].plateau``: the idle cache over the events that hold the reserved peak (the headline's)."""
    init = replay.initial
    plateau = reserved_plateau(
        cols["reserved"], cols["allocated"], init.reserved, init.allocated, int(replay.peak_reserved_index)
    )
    return plateau.to_json() if plateau is not None else None


def with_replays(entry: dict[str, Any], oom: dict[str, Any] | None, whatifs: WhatIfs, check: dict[str, Any]) -> None:
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
    # group -> its row, in a byte (at most TOP_STACKS rows): the gather below writes one byte an allocation
    row_of = np.full(len(catalog.groups), -1, np.int8)
    assert wanted.shape[0] <= np.iinfo(np.int8).max
    row_of[wanted] = np.arange(wanted.shape[0])
    # Each allocation's row (-1: its group has none): one gather, no np.isin. Every id is a group's, so
    # "clip" changes none; it spares take the bounds check, and the int32 ids their copy as intp
    # (1.8 -> 0.8 ms over the 460 MB trace's 802k allocations).
    rows_of_all = np.take(row_of, gids, mode="clip")
    # The allocations of those groups (a few: 15k of 802k), found once and gathered from each column.
    sel = np.flatnonzero(rows_of_all >= 0)
    g_sel = rows_of_all.take(sel).astype(np.int64)
    # Alive at step end e when start <= e < end: a range of steps per allocation.
    k_lo = np.searchsorted(ends, lifetimes.start.take(sel), side="left")
    k_hi = np.searchsorted(ends, lifetimes.end.take(sel), side="left")
    width = len(ends) + 1
    cells = len(wanted) * width
    sizes = lifetimes.size.take(sel).astype(np.float64)  # per-cell sums stay far below 2**53
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


def _even_indices(n: int, k: int) -> I64:
    if n <= k:
        return np.arange(n, dtype=np.int64)
    return sorted_unique(np.r_[np.linspace(0, n - 1, k).astype(np.int64), n - 1])


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
