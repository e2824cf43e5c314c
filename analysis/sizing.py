"""Sizing advice: the batch that fits, the GPU a run needs, and every suggestion ranked by what it buys.

Pure functions of one device's figures, typed (``SizingInput``: the OOM, the steps, the categories, the what-ifs,
the primary cause), made once by the report's last stage (``stages.finish``) from the figures the report shows,
once the what-ifs and the suggestions exist.

The batch that fits (``batch_fit``). A training step's memory is a part that does not depend on the batch
(parameters, gradients and optimizer state, from ``analysis.categories`` at the peak) and a part that grows with
it (everything else: activations, temporaries, and the workspaces the classifier calls ``unknown``, which
cuDNN and cuBLAS size by the batch). The failing step needed ``need`` (``oom.step_need_bytes`` where the step
projection gave it, else the lower bound the OOM itself shows: allocated plus the request). A step fits for
sure when it needs no more than the largest step that completed under the same settings allocated at its
peak (``fit``: that step's cache did the rest), so with the batch-dependent part linear in the batch

    f = (fit - fixed) / (need - fixed)          (no completed step: fit = the limit)

and never more than ``(limit - fixed) / (need - fixed)`` (no fragmentation at all). The batch that fits is
``floor(f * batch)``; gradient accumulation over ``ceil(batch / fitting_batch)`` micro-steps keeps the effective
batch. Without the user's batch size the answer is the fraction ``f``.

The first step (issue 33: no step in the trace, the OOM in a training forward or backward pass, ``first_step``):
the trace shows what the step needed up to the failing point, not the rest of it, so ``f`` is only an upper
bound and the split is at least 2 micro-batches. Where the failing request would have fitted by bytes (a
fragmentation verdict) but what a perfectly packed cache could still give (its free bytes and the room to the
limit) is under ``FIRST_STEP_HOLES_SHARE`` of what scales with the batch, the step was cut short mid-pass with
the cache all but full: the smallest split, 2 micro-batches, is the answer (its saving at the failing point is
half the batch's part), never a claim that the step then completes (``step_completes`` stays unknown). No
setting can give more than that packed cache either: there the settings claim nothing and rank after the split
(``advice.cut_short_mid_pass``).

The GPU it needs (``gpu_fit``). Memory to finish = the reserved memory the run needs (the failing step's need
times the overhead for an OOM run, the recorded peak reserved otherwise) plus the process's memory outside
PyTorch's cache (CUDA context, cuBLAS/cuDNN handles: from the OOM message where it says so, else
``ASSUMED_CONTEXT_BYTES``), per setting tried; then which common GPU sizes hold it.

Ranking (``ranked``). Every suggestion with its saving, whether it lets the failing step finish, and its
cost in words; the cheapest that lets the step finish comes first (cost order ``COSTS``). A suggestion's cost
is its rule's (``analysis.advice``; an allocator setting's is its row of the settings table): a rule or a
setting whose cost is not a key of ``COSTS`` fails this module's import.

``size(inp, suggestions, ctx, batch_size) -> Sizing`` is the report's last stage before the decision: the batch
fit, the advisor's "sizing" rules (``smaller_batch``), the primary cause's say on the settings' claims
(``analysis.causes.CauseRule``), the GPU fit and the ranked table, which ``stages.finish`` writes into the
device's entry.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from analysis import advice
from analysis.allocator.config import SETTINGS
from analysis.causes import CauseRule
from analysis.decision import ENV_PREFIX

MiB = 1 << 20
GiB = 1 << 30

# The memory a process holds outside PyTorch's cache when nothing says how much: a CUDA context with cuBLAS
# and cuDNN loaded. Measured from our own H200 OOM messages ("this process has X memory in use" minus what
# PyTorch reserved): 0.56-0.65 GiB; 0.6 GiB is used when the message is absent.
ASSUMED_CONTEXT_BYTES = 600 * MiB

# Common GPU memory sizes and the capacity torch reports on such a card (``total_memory``). The H200 figure is
# measured (every truth file here: 150,109,880,320 B = 139.80 GiB for "141 GB"); the others are the vendors'
# nominal sizes less the ~1% that torch reports below them on the cards we know (an approximation, said so).
GPU_SIZES: tuple[tuple[str, int], ...] = (
    ("16 GB", int(16 * GiB * 0.99)),
    ("24 GB", int(24 * GiB * 0.99)),
    ("40 GB", int(40 * GiB * 0.99)),
    ("48 GB", int(48 * GiB * 0.99)),
    ("80 GB", int(80 * GiB * 0.99)),
    ("94 GB", int(94 * GiB * 0.99)),
    ("141 GB", 150_109_880_320),
)

# Cost of a change, cheapest first, with the words the table shows.
COSTS: dict[str, tuple[int, str]] = {
    "none": (0, "none: an allocator setting, same numerics and speed"),
    "precision": (1, "precision: bf16/fp16 numerics (AMP)"),
    "speed": (2, "speed: recomputes activations in backward (about a third more compute)"),
    "batch": (3, "speed: more, smaller micro-steps (same optimisation with gradient accumulation)"),
    "shapes": (2, "speed: padding to fixed shapes wastes some compute"),
    "memory": (1, "state: a lighter optimizer changes the optimisation"),
    "code": (1, "code: reorder or free allocations"),
    "capture": (0, "none: how the snapshot is recorded"),
}


def _check_costs() -> None:
    """Every rule's and every setting's cost is one of ``COSTS`` (run at import: a new row with a cost
    the ranking does not know fails here, not as a silent default in a report)."""
    named = [(f"rule {r.id}", r.cost) for r in advice.all_rules()] + [(f"setting {s.key}", s.cost) for s in SETTINGS]
    unknown = [f"{who}: {cost!r}" for who, cost in named if cost not in COSTS]
    if unknown:
        raise ValueError(f"costs that analysis.sizing.COSTS does not know: {', '.join(unknown)}")


_check_costs()

# A training script can name its batch in the trace: torch.cuda.memory._set_memory_metadata("batch_size=96")
# (torch 2.10+) tags every later trace event with that string.
_BATCH_IN_METADATA = re.compile(r"\bbatch(?:_size)?\s*[=:]\s*(\d{1,9})\b")

FIXED_CATEGORIES = ("parameters", "gradients", "optimizer_state")
# The OOM phases of a training step: a first-step OOM there gets a batch fit without any step in the trace.
TRAINING_PHASES = ("forward", "backward")
# A first step's fragmentation OOM whose free cache and room to the limit together are under this share of the
# batch's part at the failing point: the cache was all but full mid-pass (issue 33's ResNet: 56 MiB of 1.36 GiB).
FIRST_STEP_HOLES_SHARE = 0.1
SCALING_CATEGORIES = ("activations", "temporaries", "unknown")


@dataclass(frozen=True)
class StepFigures:
    """One step as sizing reads it (a ``devices[].steps`` row)."""

    index: int
    last_event: int
    peak_allocated: int
    peak_reserved: int
    complete: bool  # False where the trace starts inside the step


@dataclass(frozen=True)
class OomFigures:
    """The device's last OOM as sizing reads it (``devices[].oom``)."""

    event_index: int
    allocated: int
    requested: int
    limit: int
    step_need: int | None  # the failing step's need where it was projected
    non_pytorch: int | None  # the process's memory outside PyTorch's cache, as the OOM message printed it
    device_full_unexplained: bool  # ``decision.device_full_unexplained``
    reserved: int = 0  # reserved at the OOM
    cached_free: int = 0  # free in the cache at the OOM (what a perfect packing could still use)


@dataclass(frozen=True)
class WhatIfFigures:
    """One what-if replay's answer as sizing reads it (a ``devices[].whatif`` item)."""

    config: str
    peak_reserved: int
    oom_avoided: bool | None
    step_completes: bool | None


@dataclass(frozen=True)
class SizingInput:
    """What sizing reads of one device, typed: made once by the report's last stage (``stages.finish``)."""

    oom: OomFigures | None
    categories: Mapping[str, int]  # bytes by category at the allocated peak
    steps: tuple[StepFigures, ...]
    peak_reserved: int  # the recorded run's peak reserved memory
    whatifs: tuple[WhatIfFigures, ...]
    cause: CauseRule | None  # the primary cause's rule
    cause_settings: str  # what the primary cause says of the allocator settings ("" without one)
    oom_phase: str = ""  # the OOM's phase (``causes.Diagnosis.oom_phase``)
    inference: bool = False  # the OOM's pass is inference (``causes.Diagnosis.inference``): no first-step fit


@dataclass(frozen=True)
class Sizing:
    """Sizing's answer for one device (``devices[].batch_fit``, ``gpu_fit``, ``ranked``), and the suggestions
    with the "sizing" stage's added and the claims a cause takes back taken back."""

    batch_fit: dict[str, Any] | None
    suggestions: list[dict[str, Any]]
    gpu_fit: dict[str, Any]
    ranked: list[dict[str, Any]]


def _completed_steps(inp: SizingInput) -> list[StepFigures]:
    """Steps that ended before the OOM (all of them without one)."""
    steps = [s for s in inp.steps if s.complete]
    if inp.oom is None:
        return steps
    return [s for s in steps if s.last_event < inp.oom.event_index]


def _overhead(steps: list[StepFigures]) -> tuple[float, int | None]:
    """Reserved / allocated at the peak of the largest completed step, and that step's index."""
    best = max(steps, key=lambda s: s.peak_allocated, default=None)
    if best is None or best.peak_allocated <= 0:
        return 1.0, None
    return max(1.0, best.peak_reserved / best.peak_allocated), best.index


def step_need(oom: OomFigures) -> tuple[int, bool]:
    """What the failing step needs, and whether that figure is only a lower bound."""
    if oom.step_need is not None:
        return oom.step_need, False
    return oom.allocated + oom.requested, True


def batch_from_metadata(user_metadata: dict[int, str], oom_index: int | None) -> int | None:
    """The batch size named in the ``user_metadata`` current at the OOM (at the end without one).

    The mapping is sparse (event index -> text, events with the default "" left out), so the text current at
    an event is the entry of the latest event at or before it; a string cleared with "" in between is not
    seen, and the older one counts (documented in docs/report.md).
    """
    upto = [i for i in user_metadata if oom_index is None or i <= oom_index]
    if not upto:
        return None
    match = _BATCH_IN_METADATA.search(user_metadata[max(upto)])
    return int(match.group(1)) if match and int(match.group(1)) > 0 else None


def batch_fit(inp: SizingInput, batch_size: int | None = None) -> dict[str, Any] | None:
    """``devices[].batch_fit``: null without an OOM or without training steps (but for a first step that died
    in its forward or backward pass)."""
    oom, cats = inp.oom, inp.categories
    first_step = not inp.steps
    if oom is None or (first_step and (inp.oom_phase not in TRAINING_PHASES or inp.inference)):
        return None
    limit = oom.limit
    need, need_lower = step_need(oom)
    fixed = sum(int(cats.get(c, 0)) for c in FIXED_CATEGORIES)
    scaling = sum(int(cats.get(c, 0)) for c in SCALING_CATEGORIES)
    done = _completed_steps(inp)
    overhead, overhead_step = _overhead(done)
    largest = max(done, key=lambda s: s.peak_allocated, default=None)
    out: dict[str, Any] = {
        "need_bytes": need,
        "need_is_lower_bound": need_lower,
        "fixed_bytes": fixed,
        "scaling_bytes_at_peak": scaling,
        "limit_bytes": limit,
        "overhead": round(overhead, 4),
        "overhead_step": overhead_step,
        "fit_bytes": None,
        "largest_fitting_step": None if largest is None else largest.index,
        "largest_fitting_step_peak_allocated_bytes": None if largest is None else largest.peak_allocated,
        "excess_over_largest_fitting": None,
        "fraction": None,
        "fraction_no_fragmentation": None,
        "batch_size": batch_size,
        "fitting_batch": None,
        "micro_batch": None,
        "accumulation_steps": None,
        "snippet": None,
        "feasible": False,
        "explanation": "",
        "first_step": first_step,
    }
    if largest is not None and largest.peak_allocated > 0:
        out["excess_over_largest_fitting"] = round(need / largest.peak_allocated - 1.0, 4)
    variable = need - fixed
    if variable <= 0 or scaling <= 0:
        out["explanation"] = (
            "The failing step's memory is all parameters, gradients and optimizer state: a smaller batch does "
            "not reduce it."
        )
        return out
    fit_bytes = limit if largest is None else min(limit, largest.peak_allocated)
    frac = (fit_bytes - fixed) / variable
    frac_nofrag = (limit - fixed) / variable
    out["fit_bytes"] = fit_bytes
    out["fraction"] = round(min(1.0, max(0.0, frac)), 4)
    out["fraction_no_fragmentation"] = round(min(1.0, max(0.0, frac_nofrag)), 4)
    if frac <= 0:
        out["explanation"] = (
            f"The part that does not depend on the batch ({_gib(fixed)}) alone is more than the largest step "
            f"that fit allocated ({_gib(fit_bytes)}): no batch size is known to fit."
        )
        return out
    out["feasible"] = True
    if first_step:
        _first_step(out, oom, need, fixed, frac, batch_size)
        return out
    if frac >= 1 and largest is not None:
        # The failing step needed no more than a step that ran: a smaller batch is not what it lacks.
        out.update(fitting_batch=batch_size, accumulation_steps=1, micro_batch=batch_size)
        step = f"step {largest.index} allocated ({_gib(fit_bytes)}), and that step completed"
        out["explanation"] = (
            f"The failing step needed at least {_gib(need)} (the rest of it is not known), no more than {step}: "
            "nothing shows the batch is too big."
            if need_lower
            else f"The failing step needed {_gib(need)}, no more than {step}: the batch is not what failed it."
        ) + " The memory was there, not in one piece: see the allocator settings above."
        return out
    _smaller_batch(out, need, need_lower, fixed, frac, fit_bytes, largest, batch_size)
    return out


def _smaller_batch(
    out: dict[str, Any],
    need: int,
    need_lower: bool,
    fixed: int,
    frac: float,
    fit_bytes: int,
    largest: StepFigures | None,
    batch_size: int | None,
) -> None:
    """The batch that fits (or its fraction) and the gradient accumulation that keeps the effective
    batch, written into ``out`` with their explanation."""
    limit, variable = int(out["limit_bytes"]), need - fixed
    basis = (
        f"no more than step {largest.index}, the largest that completed, allocated ({_gib(fit_bytes)})"
        if largest is not None
        else f"no more than the limit ({_gib(limit)})"
    )
    ahead = ""
    if largest is not None:
        ahead = (
            f" The failing step needs {_gib(need)}{' at least' if need_lower else ''}, "
            f"{out['excess_over_largest_fitting'] * 100:.0f}% more than step {largest.index}."
        )
    if batch_size:
        fitting = max(1, math.floor(frac * batch_size)) if frac < 1 else batch_size
        micro = math.ceil(batch_size / fitting)
        micro_batch = math.ceil(batch_size / micro)
        out.update(
            fitting_batch=fitting,
            accumulation_steps=micro,
            micro_batch=micro_batch,
            snippet=_accumulation_snippet(batch_size, micro, micro_batch),
        )
        out["explanation"] = (
            f"The failing step needed {_gib(need)}{' or more' if need_lower else ''}: {_gib(fixed)} that does "
            f"not depend on the batch and {_gib(variable)} that does. To need {basis}, that part must "
            f"shrink to {frac * 100:.0f}%, so a batch of at most {fitting} (of {batch_size}) fits; "
            f"{micro} micro-steps of {micro_batch} with gradient accumulation keep the effective batch of "
            f"{batch_size}." + ahead
        )
    else:
        accum = math.ceil(1 / frac) if frac < 1 else 1
        out["explanation"] = (
            f"The failing step needed {_gib(need)}{' or more' if need_lower else ''}: {_gib(fixed)} that does "
            f"not depend on the batch and {_gib(variable)} that does. To need {basis}, that part must "
            f"shrink to {frac * 100:.0f}%: run at most "
            f"{frac * 100:.0f}% of the failing step's batch, and keep the effective batch with gradient "
            f"accumulation over {accum} micro-steps (give the batch size for a number)." + ahead
        )
        out["accumulation_steps"] = accum
        out["snippet"] = _accumulation_snippet_fraction(accum)


def _first_step(out: dict[str, Any], oom: OomFigures, need: int, fixed: int, frac: float, batch: int | None) -> None:
    """The first step's split (module docstring): ``f`` from the failing point where it is below 1, else 2
    micro-batches where the cache was all but full mid-pass; nothing where neither holds."""
    variable = need - fixed
    room = oom.cached_free + max(0, oom.limit - oom.reserved)
    if frac >= 1 and room >= FIRST_STEP_HOLES_SHARE * variable:
        out["feasible"] = False
        out["explanation"] = (
            f"The first step died before any step completed; the failing point needed {_gib(need)}, within the "
            f"limit, and the cache could still give {_gib(room)}: nothing shows the batch is too big."
        )
        return
    _smaller_batch(out, need, True, fixed, min(frac, 0.5) if frac >= 1 else frac, oom.limit, None, batch)
    if frac >= 1:
        out["fraction"] = None  # not measured: the split is the smallest, not a share that fits
        out["explanation"] = (
            f"The first step died in its pass before any step completed, with {_gib(need - oom.requested)} "
            f"allocated of the {_gib(oom.limit)} limit and {_gib(variable)} of it scaling with the batch: a "
            f"perfectly packed cache could give only {_gib(room)} more ({room / max(1, variable):.0%} of the "
            f"batch's part), and the rest of the step is still to come. Half the batch holds about "
            f"{_gib(variable // 2)} less at the failing point: 2 micro-batches with gradient accumulation keep "
            "the effective batch (the smallest split; the trace does not show the rest of the step)."
        )
    else:
        out["explanation"] += (
            " This was the first step (none completed before it): the trace shows its need up to the failing "
            "point only, so the share is an upper bound and the split is at least 2."
        )


def _accumulation_snippet(batch: int, micro: int, micro_batch: int) -> str:
    return (
        f"# effective batch {batch} = {micro} micro-steps x {micro_batch}\n"
        f"accum = {micro}\n"
        "for i, (x, y) in enumerate(loader):            # loader yields batches of "
        f"{micro_batch}\n"
        "    loss = loss_fn(model(x), y) / accum\n"
        "    loss.backward()\n"
        "    if (i + 1) % accum == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad(set_to_none=True)\n"
    )


def _accumulation_snippet_fraction(micro: int) -> str:
    return (
        f"# the same effective batch in {micro} micro-steps of batch_size // {micro}\n"
        f"accum = {micro}\n"
        "for i, (x, y) in enumerate(loader):            # loader yields batches of batch_size // accum\n"
        "    loss = loss_fn(model(x), y) / accum\n"
        "    loss.backward()\n"
        "    if (i + 1) % accum == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad(set_to_none=True)\n"
    )


def gpu_fit(inp: SizingInput) -> dict[str, Any]:
    """``devices[].gpu_fit``: the memory the run needs under each setting tried, and the GPU sizes that hold it."""
    oom = inp.oom
    non_pytorch = oom.non_pytorch if oom is not None else None
    context = non_pytorch if non_pytorch is not None else ASSUMED_CONTEXT_BYTES
    rows: list[dict[str, Any]] = []
    if oom is None:
        rows.append({"config": "recorded", "reserved_bytes": inp.peak_reserved, "basis": "peak"})
        rows += [{"config": w.config, "reserved_bytes": w.peak_reserved, "basis": "replay"} for w in inp.whatifs]
    else:
        need, lower = step_need(oom)
        overhead, _ = _overhead(_completed_steps(inp))
        rows.append(
            {
                "config": "recorded",
                "reserved_bytes": max(int(need * overhead), inp.peak_reserved),
                "basis": "failing step x overhead" + (" (lower bound)" if lower else ""),
            }
        )
        # Under a setting that leaves no stranded cache the step needs what it asks for.
        rows += [
            {"config": w.config, "reserved_bytes": max(w.peak_reserved, need), "basis": "replay"}
            for w in inp.whatifs
            if w.step_completes is True or w.oom_avoided is True
        ]
    for r in rows:
        r["needs_bytes"] = r["reserved_bytes"] + context
        r["fits"] = [name for name, cap in GPU_SIZES if cap >= r["needs_bytes"]]
    best = min(rows, key=lambda r: r["needs_bytes"])
    return {
        "non_pytorch_bytes": context,
        "non_pytorch_source": "oom_message" if non_pytorch is not None else "assumed",
        "settings": rows,
        "needs_bytes": rows[0]["needs_bytes"],
        "best_config": best["config"],
        "best_needs_bytes": best["needs_bytes"],
        "fits_default": rows[0]["fits"],
        "fits_best": best["fits"],
        "sizes": [{"name": n, "capacity_bytes": c} for n, c in GPU_SIZES],
        "beyond_failing_step": oom is not None,
    }


def size(
    inp: SizingInput, suggestions: list[dict[str, Any]], ctx: advice.AdviceContext, batch_size: int | None
) -> Sizing:
    """Batch fit, the "sizing" stage's suggestions, GPU fit and the ranked table of one device; the primary
    cause's rule says what the settings' replays may still claim. ``suggestions`` (the advisor's, the
    contract's items) are left as they are: the answer holds changed copies."""
    fit = batch_fit(inp, batch_size)
    mid_pass = advice.cut_short_mid_pass(fit)
    kept = _take_back_claims([dict(s) for s in suggestions], inp.oom, inp.cause, mid_pass)
    late = advice.advise(replace(ctx, batch_fit=fit, cause=inp.cause), stage="sizing")
    if late:
        kept = advice.ordered([*kept, *late])
    rows = ranked(kept, inp.whatifs)
    if mid_pass:
        # No setting can give more than a perfectly packed cache, under FIRST_STEP_HOLES_SHARE of what the batch's
        # part needs, and the rest of the step is still to come: a setting that only got past the failing request
        # goes after the split (issue 33's held-out ViT-S: expandable_segments' replay served the request, its
        # real rerun died 37 events later in the same forward; the 2-micro-batch rerun ran).
        rows.sort(key=lambda r: r["cost"] == "none" and r["step_completes"] is not True)
    if inp.cause is not None and inp.cause.grows:
        # Growth across steps: a setting that gets past the failing step still dies a few steps on.
        for row in rows:
            if row["cost"] == "none":
                row["run_completes"] = False
                row["run_note"] = inp.cause_settings
        rows.sort(key=lambda r: r.get("run_completes") is False)  # stable: the rest keep order
    return Sizing(fit, kept, gpu_fit(inp), rows)


def _take_back_claims(
    suggestions: list[dict[str, Any]], oom: OomFigures | None, rule: CauseRule | None, mid_pass: bool = False
) -> list[dict[str, Any]]:
    """A setting's "avoids the OOM" where a cause, a full device nothing explains, or a first step cut short
    mid-pass (``advice.cut_short_mid_pass``) says otherwise: only a claim is taken back, never made."""
    if rule is None and not mid_pass and not (oom is not None and oom.device_full_unexplained):
        return suggestions
    for s in suggestions:
        if not str(s["config"] or "").startswith(ENV_PREFIX) or s["avoids_oom"] is not True:
            continue
        if rule is not None and rule.grows:
            s["avoids_oom"] = False  # the failing step may pass; the growth kills a later one
        elif s.get("step_completes") is not True:
            s["avoids_oom"] = None  # past the request says nothing of the rest of a step the cause fills
    return suggestions


def ranked(suggestions: list[dict[str, Any]], whatifs: tuple[WhatIfFigures, ...]) -> list[dict[str, Any]]:
    """``devices[].ranked``: every suggestion, those that let the failing step finish first, cheapest first."""
    rows = []
    cost_of = {rule.id: rule.cost for rule in advice.all_rules()}
    projected = {f"{ENV_PREFIX}{w.config}": w.step_completes for w in whatifs}
    for s in suggestions:
        # Only what a projection computed: getting past the failing request says nothing of the rest of
        # the step (the diagnosis bench's eval and graph runs died in that same step under such settings).
        # ("step_completes" is a key of the suggestions that know it, the smaller batch's and the settings'.)
        completes = s.get("step_completes")
        if completes is None:
            completes = projected.get(str(s["config"] or ""))
        cost = cost_of[s["id"]]  # every suggestion comes from a rule, and every rule has its cost
        rank, words = COSTS[cost]
        rows.append(
            {
                "id": s["id"],
                "title": s["title"],
                "config": s["config"],
                "estimated_saving_bytes": s["estimated_saving_bytes"],
                "step_completes": completes,
                "cost": cost,
                "cost_words": words,
                "_key": (completes is not True, rank, -(s["estimated_saving_bytes"] or 0)),
            }
        )
    rows.sort(key=lambda r: r["_key"])
    for r in rows:
        del r["_key"]
    return rows


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"
