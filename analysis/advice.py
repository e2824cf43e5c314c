"""The advisor: an ordered list of small rules turning measurements into suggestions.

Socorro style: each ``Rule`` has an id, a predicate ``applies(ctx)`` and an
action ``suggest(ctx)`` returning one suggestion ``{id, title, config, evidence,
estimated_saving_bytes}`` (or None when, on a closer look, it has nothing to
say). The rules only read the ``AdviceContext`` that the report fills in; they
compute nothing heavy. ``advise`` runs every rule, drops suggestions for
settings the snapshot already has, and orders the rest: first what would have
avoided a recorded OOM, then by estimated saving.

Suggestion ids (docs/report.md documents each): ``expandable_segments``,
``max_split_size_mb``, ``roundup_power2_divisions``,
``garbage_collection_threshold``, ``amp``, ``activation_checkpointing``,
``optimizer_state``, ``shape_bucketing``, ``allocation_order``, ``capture_settings``, and
``smaller_batch`` (added by ``analysis.sizing`` once the report is finished).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from analysis.config import UNLIMITED, AllocatorConfig
from analysis.oom import named_free_block

MiB = 1 << 20
GiB = 1 << 30

# A what-if counts as an improvement when it lowers peak reserved memory by this
# much (both a share and an absolute floor, so tiny traces do not get advice).
MIN_SAVING_SHARE = 0.05
MIN_SAVING_BYTES = 64 * MiB
# C++ stacks are worth their cost only on small captures: past either figure
# (file bytes, trace events) the advisor suggests stacks="python".
HUGE_SNAPSHOT_BYTES = 100 * 1000 * 1000
HUGE_TRACE_EVENTS = 500_000
# The AMP and checkpointing rules look at activations from this size on.
WORKLOAD_MIN_BYTES = 256 * MiB


@dataclass
class WhatIf:
    """One what-if replay as the advisor sees it."""

    setting: str  # suggestion id of the setting it tries ("" for a user's mixed config)
    config: str
    peak_reserved_bytes: int
    oom_avoided: bool | None
    origin: str = "auto"  # "auto" (the report's own candidate) | "user" (--whatif)
    # Step level (analysis.projection): does the failing step run to its end; None without steps.
    step_completes: bool | None = None
    step_shortfall_bytes: int | None = None
    oom_projected: dict[str, Any] | None = None  # where in the projected tail the replay failed

    @property
    def avoids_oom(self) -> bool | None:
        """Step level where known: a request that fits helps nobody if the step dies later."""
        return self.step_completes if self.step_completes is not None else self.oom_avoided


@dataclass
class AdviceContext:
    device: int
    recorded: AllocatorConfig
    events: int
    peak_reserved: int
    peak_allocated: int
    peak_requested: int
    reserved_at_peak_alloc: int
    oom: dict[str, Any] | None
    whatifs: list[WhatIf]
    categories: dict[str, int]  # bytes at the peak of allocated memory
    activations_by_site: list[tuple[str, int]]  # largest first
    has_backward: bool
    autocast_seen: bool
    optimizer_state_bytes: int
    optimizer_labels: list[str]
    distinct_large_sizes: int  # distinct request sizes >= 1 MiB
    large_requests: int
    capture: dict[str, Any]
    source_bytes: int
    steps: int
    mean_stack_frames: float = 0.0
    notes: list[str] = field(default_factory=list)
    # bf16 autocast's saving on the peak of live memory, as a range (report._amp_saving_range).
    amp_saving_low: int | None = None
    amp_saving_high: int | None = None
    # Checkpointing repeated blocks (report._checkpoint_estimate): blocks, block_input_bytes, ...
    checkpoint: dict[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    applies: Callable[[AdviceContext], bool]
    suggest: Callable[[AdviceContext], dict[str, Any] | None]


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _suggestion(
    sid: str, title: str, config: str | None, evidence: str, saving: int, *, avoids_oom: bool | None = None
) -> dict[str, Any]:
    return {
        "id": sid,
        "title": title,
        "config": config,
        "evidence": evidence,
        "estimated_saving_bytes": int(max(0, saving)),
        "avoids_oom": avoids_oom,
    }


# -- allocator settings (from the what-if replays) ----------------------------


def _already_set(ctx: AdviceContext, setting: str) -> bool:
    rec = ctx.recorded
    return {
        "expandable_segments": rec.expandable_segments,
        "max_split_size_mb": rec.max_split_size != UNLIMITED,
        "roundup_power2_divisions": any(rec.roundup_power2_divisions),
        "garbage_collection_threshold": rec.garbage_collection_threshold > 0,
    }.get(setting, False)


def _best_whatif(ctx: AdviceContext, setting: str) -> WhatIf | None:
    tried = [w for w in ctx.whatifs if w.setting == setting]
    if not tried:
        return None
    # Avoiding the OOM beats everything (the whole step, then the request); then the lowest peak.
    return min(tried, key=lambda w: (w.avoids_oom is not True, w.oom_avoided is not True, w.peak_reserved_bytes))


def _improves(ctx: AdviceContext, w: WhatIf) -> bool:
    if ctx.oom is not None:
        return w.oom_avoided is True
    saving = ctx.peak_reserved - w.peak_reserved_bytes
    return saving >= MIN_SAVING_BYTES and saving >= MIN_SAVING_SHARE * ctx.peak_reserved


_SETTING_TITLES = {
    "expandable_segments": "Turn on expandable segments",
    "max_split_size_mb": "Stop the allocator from splitting large cached blocks",
    "roundup_power2_divisions": "Round allocation sizes to power-of-two divisions",
    "garbage_collection_threshold": "Let the allocator reclaim cached blocks before hitting the cap",
}
_SETTING_WHY = {
    "expandable_segments": "segments grow in place instead of leaving unusable slivers",
    "max_split_size_mb": "large cached blocks are no longer carved up for smaller requests",
    "roundup_power2_divisions": "requests of similar sizes share cached blocks",
    "garbage_collection_threshold": "old cached blocks are released before the cap is reached",
}


def _allocator_rule(setting: str) -> Rule:
    def applies(ctx: AdviceContext) -> bool:
        # A replay of part of the history cannot be compared with the whole run's peak.
        if _already_set(ctx, setting) or not ctx.capture.get("trace_complete", False):
            return False
        best = _best_whatif(ctx, setting)
        return best is not None and _improves(ctx, best)

    def suggest(ctx: AdviceContext) -> dict[str, Any] | None:
        best = _best_whatif(ctx, setting)
        if best is None:
            return None
        saving = ctx.peak_reserved - best.peak_reserved_bytes
        same = _gib(best.peak_reserved_bytes) == _gib(ctx.peak_reserved)
        compared = ", about the same as" if same else " instead of"
        replay = (
            f"Replaying the {ctx.events:,} recorded events under {best.config}, peak reserved memory is "
            f"{_gib(best.peak_reserved_bytes)}{compared} the recorded {_gib(ctx.peak_reserved)}"
        )
        if ctx.oom is not None:
            oom = ctx.oom
            at_least = "at least " if oom.get("limit_is_lower_bound") else ""
            replay += (
                f", and the {_gib(oom['requested_bytes'])} request that failed at event {oom['event_index']:,} "
                f"fits within {at_least}{_gib(oom['limit_bytes'])}, so this request no longer fails"
            )
            proj = oom.get("projection") or {}
            if best.step_completes is True:
                replay += (
                    f"; replaying the rest of step {proj.get('step')} as projected from step "
                    f"{proj.get('template_step')}, the whole step runs"
                )
            elif best.step_completes is False:
                where = best.oom_projected
                if where is not None:
                    replay += (
                        f"; but replaying the rest of step {proj.get('step')} as projected from step "
                        f"{proj.get('template_step')}, it still runs out of memory {where['allocations_later']} "
                        f"allocations later (allocation {where['allocation']} of the step's "
                        f"{where['allocations_in_step']}, asking {_gib(where['requested_bytes'])})"
                    )
                else:
                    replay += f"; but step {proj.get('step')} still runs out of memory"
                lacks = best.step_shortfall_bytes or 0
                if lacks > 0:
                    replay += f", so the step lacks at least {_gib(lacks)}"
            else:
                # No steps to project from: what the program would have asked for next is
                # unknown. Little headroom left means a later, larger request may fail anyway
                # (real runs gpu_grow_oom -> gpu_expandable_oom: the OOM moved four allocations on).
                headroom = oom["limit_bytes"] - best.peak_reserved_bytes
                if headroom < oom["requested_bytes"]:
                    replay += (
                        f"; but it leaves {_gib(max(0, headroom))} below the limit, less than the failing request, "
                        "so a later, larger request may still run out of memory"
                    )
            # The saving is what the replay shows, never more: the recorded peak minus the what-if's.
        else:
            replay += f"; {_gib(ctx.peak_reserved - ctx.peak_allocated)} of the recorded peak held no live block"
        return _suggestion(
            setting,
            _SETTING_TITLES[setting],
            f"PYTORCH_CUDA_ALLOC_CONF={best.config}",
            replay + f" ({_SETTING_WHY[setting]}).",
            saving,
            avoids_oom=best.avoids_oom,
        )

    return Rule(setting, applies, suggest)


# -- workload rules ------------------------------------------------------------


def _amp_applies(ctx: AdviceContext) -> bool:
    act = ctx.categories.get("activations", 0)
    return (
        ctx.has_backward
        and not ctx.autocast_seen
        and act >= WORKLOAD_MIN_BYTES
        and act >= 0.25 * max(1, ctx.peak_allocated)
    )


def _amp_suggest(ctx: AdviceContext) -> dict[str, Any]:
    act = ctx.categories.get("activations", 0)
    evidence = (
        f"At the allocation peak, {_gib(act)} of the {_gib(ctx.peak_allocated)} allocated were activations "
        "and no autocast frame appears in the stacks; activations in bfloat16 take half the bytes of float32."
    )
    saving = act // 2
    if ctx.amp_saving_low is not None and ctx.amp_saving_high is not None:
        # The midpoint of what the trace bounds (dtypes are not recorded): replayed with the
        # activations of torch.nn's ops halved, and with every activation but float32 ops' halved.
        saving = (ctx.amp_saving_low + ctx.amp_saving_high) // 2
        evidence = (
            f"At the allocation peak, {_gib(act)} of the {_gib(ctx.peak_allocated)} allocated were activations "
            "and no autocast frame appears in the stacks. Replayed with bfloat16 activations, the peak falls by "
            f"{_gib(ctx.amp_saving_low)} (only outputs of torch.nn's ops halved) to {_gib(ctx.amp_saving_high)} "
            "(every activation but the float32 ops' halved: losses, softmax); the estimate is the middle."
        )
    return _suggestion(
        "amp",
        "Run the forward pass in bfloat16 (torch.autocast)",
        "with torch.autocast('cuda', dtype=torch.bfloat16): ...",
        evidence,
        saving,
    )


def _checkpoint_applies(ctx: AdviceContext) -> bool:
    act = ctx.categories.get("activations", 0)
    return ctx.has_backward and act >= WORKLOAD_MIN_BYTES and act >= 0.3 * max(1, ctx.peak_allocated)


def _checkpoint_suggest(ctx: AdviceContext) -> dict[str, Any]:
    act = ctx.categories.get("activations", 0)
    sites = ctx.activations_by_site[:3]
    largest = sites[0][1] if sites else 0
    where = "; ".join(f"{label} {_gib(b)}" for label, b in sites)
    evidence = (
        f"At the allocation peak, {_gib(act)} of activations were held from the forward pass for the backward"
        + (f"; the largest holders: {where}" if where else "")
        + ". Checkpointing keeps only module inputs and recomputes the rest in the backward pass."
    )
    # Recomputation still needs one module's activations at a time.
    saving = act - largest
    ck = ctx.checkpoint
    if ck is not None:
        saving = ck["saving"]
        evidence += (
            f" {_gib(ck['repeated_bytes'])} of them come from {ck['blocks']} repeated blocks (the same stacks "
            f"{ck['blocks']} times); checkpointed per block they keep one {_gib(ck['block_input_bytes'])} input "
            "each plus one block's activations while it is recomputed."
        )
    return _suggestion(
        "activation_checkpointing",
        "Checkpoint activations of the largest modules",
        "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
        evidence,
        saving,
    )


def _optimizer_applies(ctx: AdviceContext) -> bool:
    state = ctx.optimizer_state_bytes
    return state >= 256 * MiB and state >= 0.10 * max(1, ctx.peak_allocated)


def _optimizer_suggest(ctx: AdviceContext) -> dict[str, Any]:
    state = ctx.optimizer_state_bytes
    made_by = f" (made by {ctx.optimizer_labels[0]})" if ctx.optimizer_labels else ""
    return _suggestion(
        "optimizer_state",
        "Shrink optimizer state: 8-bit or sharded Adam, fused step",
        "bitsandbytes.optim.AdamW8bit(...) or ZeRO/FSDP sharding; torch.optim.AdamW(..., fused=True)",
        f"Optimizer state held {_gib(state)} at the allocation peak{made_by}, "
        f"{state / max(1, ctx.peak_allocated):.0%} of allocated memory; 8-bit state takes a quarter of float32's "
        "bytes, sharding divides it by the number of ranks, and fused=True avoids the multi-tensor step's "
        "temporaries.",
        state * 3 // 4,
    )


def _bucketing_applies(ctx: AdviceContext) -> bool:
    stranded = ctx.peak_reserved - ctx.peak_allocated
    return ctx.distinct_large_sizes >= 32 and stranded >= 0.2 * max(1, ctx.peak_reserved) and stranded >= 256 * MiB


def _bucketing_suggest(ctx: AdviceContext) -> dict[str, Any]:
    stranded = ctx.peak_reserved - ctx.peak_allocated
    # The cache can only be re-used exactly when shapes repeat; at best bucketing
    # recovers what the allocator settings cannot, counted here as a quarter of
    # the stranded memory (it changes the workload, so no replay can measure it).
    return _suggestion(
        "shape_bucketing",
        "Pad variable shapes to a few bucket sizes",
        "pad batch/sequence sizes up to multiples (e.g. 64) or a fixed set of buckets",
        f"{ctx.distinct_large_sizes:,} distinct request sizes of 1 MiB or more over {ctx.large_requests:,} large "
        f"requests; at the peak {_gib(ctx.peak_reserved)} was reserved for at most {_gib(ctx.peak_allocated)} "
        "allocated, so freed blocks rarely fit the next shape.",
        stranded // 4,
    )


def _allocation_order_applies(ctx: AdviceContext) -> bool:
    # The textbook fragmentation OOM that no allocator setting fixes: long-lived
    # blocks pin holes between them, and only the program's order can change that.
    oom = ctx.oom
    if oom is None or oom.get("verdict") != "fragmentation" or not ctx.capture.get("trace_complete", False):
        return False
    return bool(ctx.whatifs) and not any(w.avoids_oom is True for w in ctx.whatifs)


def _allocation_order_suggest(ctx: AdviceContext) -> dict[str, Any]:
    oom = ctx.oom or {}
    tried = ", ".join(sorted({w.config for w in ctx.whatifs}))
    block, named = named_free_block(oom)
    return _suggestion(
        "allocation_order",
        "Change the allocation order: make big, long-lived tensors first",
        "allocate (or preallocate and reuse) the large buffer before the many small long-lived tensors",
        f"At the OOM the cache held {_gib(oom.get('cached_free_bytes', 0))} free but {named} was {_gib(block)}, "
        f"too small for the {_gib(oom.get('requested_bytes', 0))} request, and the replays under {tried} fail at "
        "the same point: the free memory sits in holes between blocks that stay alive, which no allocator setting "
        "can move.",
        int(oom.get("cached_free_bytes", 0)),
    )


def _capture_applies(ctx: AdviceContext) -> bool:
    cap = ctx.capture
    return not cap["trace_complete"] or not cap["has_frames"] or _cpp_stacks_too_costly(ctx)


def _cpp_stacks_too_costly(ctx: AdviceContext) -> bool:
    return ctx.capture["stacks"] == "all" and (
        ctx.source_bytes >= HUGE_SNAPSHOT_BYTES or ctx.events >= HUGE_TRACE_EVENTS
    )


def _capture_suggest(ctx: AdviceContext) -> dict[str, Any]:
    cap = ctx.capture
    changes: list[str] = []
    evidence: list[str] = []
    if not cap["has_trace"]:
        changes.append("enabled='all'")
        evidence.append(
            f"the snapshot holds {ctx.events} trace event{'s' if ctx.events != 1 else ''}, no allocation history "
            "(enabled='state' or history off)"
        )
    elif not cap["trace_complete"]:
        changes.append("max_entries=<more than one step's events>")
        evidence.append(
            f"the trace holds only {ctx.events:,} events and does not reach back to the start of the process"
            + (f" ({ctx.steps} steps covered)" if ctx.steps else " (not one whole step fits in it)")
            + ", so peaks are lower bounds; record from the start with a ring buffer larger than a step"
        )
    if not cap["has_frames"]:
        changes.append("context='all'")
        evidence.append(f"none of the {ctx.events:,} events carries a stack, so no code can be named")
    if _cpp_stacks_too_costly(ctx):
        changes.append("stacks='python'")
        evidence.append(
            f"C++ stacks ({ctx.mean_stack_frames:.0f} frames per stack on average) on {ctx.events:,} events made a "
            f"{ctx.source_bytes / 1e6:,.1f} MB file that is slow to dump and to read; Python stacks name the same "
            "user code"
        )
    return _suggestion(
        "capture_settings",
        "Record the next snapshot differently",
        f"torch.cuda.memory._record_memory_history({', '.join(changes)})",
        "; ".join(evidence).capitalize() + ".",
        0,
    )


# The order is the order of evaluation; the output is re-sorted by impact, so
# the order only decides ties: allocator settings first (no code change).
RULES: tuple[Rule, ...] = (
    _allocator_rule("expandable_segments"),
    _allocator_rule("max_split_size_mb"),
    _allocator_rule("roundup_power2_divisions"),
    _allocator_rule("garbage_collection_threshold"),
    Rule("amp", _amp_applies, _amp_suggest),
    Rule("activation_checkpointing", _checkpoint_applies, _checkpoint_suggest),
    Rule("optimizer_state", _optimizer_applies, _optimizer_suggest),
    Rule("shape_bucketing", _bucketing_applies, _bucketing_suggest),
    Rule("allocation_order", _allocation_order_applies, _allocation_order_suggest),
    Rule("capture_settings", _capture_applies, _capture_suggest),
)


def advise(ctx: AdviceContext, rules: tuple[Rule, ...] = RULES) -> list[dict[str, Any]]:
    """Suggestions for one device, most useful first."""
    out: list[dict[str, Any]] = []
    for position, rule in enumerate(rules):
        if _already_set(ctx, rule.id) or not rule.applies(ctx):
            continue
        suggestion = rule.suggest(ctx)
        if suggestion is not None:
            out.append({**suggestion, "_order": position})
    return ordered(out)


def ordered(suggestions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The suggestions' one order: what avoids the OOM first, then by saving, ties in rule order.

    ``analysis.report`` re-sorts with it after ``analysis.sizing`` adds ``smaller_batch`` (which has no
    rule here: it needs the finished report).
    """
    out = sorted(
        suggestions,
        key=lambda s: (s["avoids_oom"] is not True, -s["estimated_saving_bytes"], s.get("_order", len(RULES))),
    )
    for s in out:
        s.pop("_order", None)
    return out
