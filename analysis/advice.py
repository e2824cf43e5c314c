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
``smaller_batch``. The allocator settings' rules are made from the settings table
(``analysis.allocator.config.SETTINGS``: one row each, with its title, reason and cost), so ``all_rules()``
reads the table when called. Every rule carries its cost (a key of ``analysis.sizing.COSTS``, checked
when sizing is imported) and its stage: ``"report"`` rules run in ``advise`` once the report's
measurements exist; ``"sizing"`` rules (``smaller_batch``) need the batch fit and the diagnosis, and
``analysis.sizing`` runs them after the others (``advise(ctx, stage="sizing")``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from analysis.allocator.config import AllocatorConfig, Setting, offered_settings, setting_named
from analysis.causes import CauseRule
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
    # The trace's optimizer step already runs fused (``torch/optim`` frames named ``_fused_*``).
    optimizer_fused: bool = False
    notes: list[str] = field(default_factory=list)
    # bf16 autocast's saving on the peak of live memory, as a range (stages.workload._amp_saving_range).
    amp_saving_low: int | None = None
    amp_saving_high: int | None = None
    # Checkpointing repeated blocks (stages.workload._checkpoint_estimate): blocks, block_input_bytes, ...
    checkpoint: dict[str, int] | None = None
    # Known at the "sizing" stage (analysis.sizing): the batch fit, and the rule of the primary cause.
    batch_fit: dict[str, Any] | None = None
    cause: CauseRule | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule:
    id: str
    applies: Callable[[AdviceContext], bool]
    suggest: Callable[[AdviceContext], dict[str, Any] | None]
    cost: str  # a key of analysis.sizing.COSTS: what the change costs the run
    stage: str = "report"  # "report" | "sizing" (needs the batch fit and the diagnosis)


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
    row = setting_named(setting)
    return row is not None and row.is_set(ctx.recorded)


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


def _allocator_rule(row: Setting) -> Rule:
    setting = row.key

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
            row.title,
            f"PYTORCH_CUDA_ALLOC_CONF={best.config}",
            replay + f" ({row.reason}).",
            saving,
            avoids_oom=best.avoids_oom,
        )

    return Rule(id=setting, applies=applies, suggest=suggest, cost=row.cost)


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
    evidence = (
        f"Optimizer state held {_gib(state)} at the allocation peak{made_by}, "
        f"{state / max(1, ctx.peak_allocated):.0%} of allocated memory; 8-bit state takes a quarter of float32's "
        "bytes, sharding divides it by the number of ranks"
    )
    if ctx.optimizer_fused:  # a run told to use what it already uses learns nothing (issue 35)
        return _suggestion(
            "optimizer_state",
            "Shrink optimizer state: 8-bit or sharded Adam",
            "bitsandbytes.optim.AdamW8bit(...) or ZeRO/FSDP sharding",
            f"{evidence}. The step already runs fused, so fused=True would change nothing.",
            state * 3 // 4,
        )
    return _suggestion(
        "optimizer_state",
        "Shrink optimizer state: 8-bit or sharded Adam, fused step",
        "bitsandbytes.optim.AdamW8bit(...) or ZeRO/FSDP sharding; torch.optim.AdamW(..., fused=True)",
        f"{evidence}, and fused=True avoids the multi-tensor step's temporaries.",
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
    if cut_short_mid_pass(ctx.batch_fit):
        # A first step cut short mid-pass with the cache all but full (analysis.sizing): the holes are a small
        # part of what the step still needs, and the live blocks are the pass's own activations, whose order
        # a user cannot change (issue 33's torchvision ResNet: its half-batch rerun ran, every setting died).
        return False
    return bool(ctx.whatifs) and not any(w.avoids_oom is True for w in ctx.whatifs)


def _allocation_order_suggest(ctx: AdviceContext) -> dict[str, Any]:
    oom = ctx.oom or {}
    tried = ", ".join(sorted({w.config for w in ctx.whatifs}))
    block, named = named_free_block(oom)
    # Under the trace's own lower bound a setting's replay may fail where the real limit lets it through (issue
    # 32: a run without its message read "change the allocation order"; with it, expandable_segments, which
    # its rerun bore out): the trace alone does not prove that no setting helps, and the message is what says.
    missing = (
        f" But the replays ran under {_gib(int(oom.get('limit_bytes') or 0))}, the least limit the trace shows: "
        "whether a setting fits under the real one only the OOM message tells (its 'allowed' figure, or the GPU's "
        "total): give it with the snapshot before changing the code."
        if oom.get("limit_is_lower_bound")
        else ""
    )
    return _suggestion(
        "allocation_order",
        "Change the allocation order: make big, long-lived tensors first",
        "allocate (or preallocate and reuse) the large buffer before the many small long-lived tensors",
        f"At the OOM the cache held {_gib(oom.get('cached_free_bytes', 0))} free but {named} was {_gib(block)}, "
        f"too small for the {_gib(oom.get('requested_bytes', 0))} request, and the replays under {tried} fail at "
        "the same point: the free memory sits in holes between blocks that stay alive, which no allocator setting "
        f"can move.{missing}",
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
# -- the batch (needs the batch fit: the "sizing" stage) --------------------------


def cut_short_mid_pass(fit: Mapping[str, Any] | None) -> bool:
    """A first step cut short mid-pass with the cache all but full (``analysis.sizing``'s batch fit: 2
    micro-batches, the share not measured): what a setting or a better order could free is a small part of
    what the step still needs."""
    return fit is not None and bool(fit.get("first_step")) and bool(fit["feasible"]) and fit["fraction"] is None


def batch_suggestion(fit: dict[str, Any] | None) -> dict[str, Any] | None:
    """A ``smaller_batch`` suggestion from a feasible batch fit whose batch must shrink. A first step's
    (``first_step``: the trace holds the step only up to the failing point) claims the failing point, never
    the step; where its fraction is not measured (a mid-pass first step) the split halves the batch."""
    if not fit or not fit["feasible"]:
        return None
    first = bool(fit.get("first_step"))
    fraction = fit["fraction"] if fit["fraction"] is not None or not first else 0.5
    if fraction is None or fraction >= 1.0:
        return None
    saving = round((1.0 - fraction) * (fit["need_bytes"] - fit["fixed_bytes"]))
    if fit["fitting_batch"] is not None:
        title = f"Run micro-batches of {fit['micro_batch']} with {fit['accumulation_steps']}-step gradient accumulation"
        batch = fit["batch_size"]
        last = batch - (fit["accumulation_steps"] - 1) * fit["micro_batch"]
        config = (
            f"batch_size = {fit['micro_batch']}; accumulation_steps = {fit['accumulation_steps']}"
            f"  # effective batch {batch}" + (f" (the last micro-batch {last})" if last != fit["micro_batch"] else "")
        )
    else:
        accum = fit["accumulation_steps"] or 1
        # The line halves (or splits further); the title must say the same, not the fraction alone.
        share = (
            f"at most {fit['fraction'] * 100:.0f}% of it fits"
            if fit["fraction"] is not None
            else "the first step did not fit"
        )
        title = f"Split the batch into {accum} micro-batches with gradient accumulation ({share})"
        config = f"batch_size = batch_size // {accum}; accumulation_steps = {accum}  # same effective batch"
    return {
        "id": "smaller_batch",
        "title": title,
        "config": config,
        "evidence": fit["explanation"],
        "estimated_saving_bytes": saving,
        "avoids_oom": True,
        "step_completes": None if first else True,
        "snippet": fit["snippet"],
    }


def _smaller_batch_applies(ctx: AdviceContext) -> bool:
    # A cause that a smaller batch does not fix (its rule says so) gets no smaller-batch advice beside it.
    return ctx.cause is None or ctx.cause.smaller_batch_helps


def _smaller_batch_suggest(ctx: AdviceContext) -> dict[str, Any] | None:
    return batch_suggestion(ctx.batch_fit)


# The order is the order of evaluation; the output is re-sorted by impact, so
# the order only decides ties: allocator settings first (no code change), in the
# settings table's order; smaller_batch last (it is added after the others).
WORKLOAD_RULES: tuple[Rule, ...] = (
    Rule(id="amp", applies=_amp_applies, suggest=_amp_suggest, cost="precision"),
    Rule(id="activation_checkpointing", applies=_checkpoint_applies, suggest=_checkpoint_suggest, cost="speed"),
    Rule(id="optimizer_state", applies=_optimizer_applies, suggest=_optimizer_suggest, cost="memory"),
    Rule(id="shape_bucketing", applies=_bucketing_applies, suggest=_bucketing_suggest, cost="shapes"),
    # After the batch fit (the "sizing" stage): a first step's fit can say the holes are not the answer.
    Rule(
        id="allocation_order",
        applies=_allocation_order_applies,
        suggest=_allocation_order_suggest,
        cost="code",
        stage="sizing",
    ),
    Rule(id="capture_settings", applies=_capture_applies, suggest=_capture_suggest, cost="capture"),
    Rule(
        id="smaller_batch",
        applies=_smaller_batch_applies,
        suggest=_smaller_batch_suggest,
        cost="batch",
        stage="sizing",
    ),
)
# Ties between suggestions added at different stages keep the earlier one first.
_LAST = 1 << 30


def all_rules() -> tuple[Rule, ...]:
    """Every rule: one per offered allocator setting (read from the settings table now), then the workload's."""
    return (*(_allocator_rule(row) for row in offered_settings()), *WORKLOAD_RULES)


def advise(ctx: AdviceContext, rules: tuple[Rule, ...] | None = None, *, stage: str = "report") -> list[dict[str, Any]]:
    """The suggestions of one stage's rules for one device, most useful first."""
    out: list[dict[str, Any]] = []
    for position, rule in enumerate(all_rules() if rules is None else rules):
        if rule.stage != stage or _already_set(ctx, rule.id) or not rule.applies(ctx):
            continue
        suggestion = rule.suggest(ctx)
        if suggestion is not None:
            out.append({**suggestion, "_order": position})
    return ordered(out)


def ordered(suggestions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The suggestions' one order: what avoids the OOM first, then by saving, ties in rule order
    (within one stage; ``analysis.sizing`` re-sorts with it after adding the "sizing" stage's, which
    then come after the others they tie with)."""
    out = sorted(
        suggestions,
        key=lambda s: (s["avoids_oom"] is not True, -s["estimated_saving_bytes"], s.get("_order", _LAST)),
    )
    for s in out:
        s.pop("_order", None)
    return out
