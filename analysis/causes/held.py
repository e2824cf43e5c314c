"""Causes where the program holds what it does not need: a leak, the optimizer's step, a forward without no_grad.

A leak keeps tensors across steps; the optimizer's step allocates its temporaries (and its state, where the step
creates it) on top of everything else; a forward pass without ``no_grad`` keeps its graph (an evaluation's graphs)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from analysis.causes.base import (
    HOLD_MIN_SHARE,
    Cause,
    CauseInput,
    _allocated_at,
    _fits,
    _oom_phase,
    _oom_position,
    _repeats_without_backward,
    _top_labels,
)
from analysis.decision import format_size
from analysis.phases import FORWARD_NO_BACKWARD, OPTIMIZER, PHASES, ForwardPass
from analysis.stacks import TRAIT_OPTIMIZER_STATE_INIT

# A leak worth naming: at least this much piles up, in at least this share of the steps.
LEAK_MIN_BYTES = 64 << 20
LEAK_MIN_STEP_SHARE = 0.6
LEAK_MIN_STEPS = 4


def leak(inp: CauseInput) -> Cause | None:
    """Memory live at step ends grows: allocations made in one step outlive it and pile up."""
    ends = inp.steps.last_event
    if inp.oom_index is not None:
        ends = ends[ends < inp.oom_index]
    k_steps = int(ends.shape[0])
    if k_steps < LEAK_MIN_STEPS:
        return None
    lt = inp.lifetimes
    at = inp.oom_index if inp.oom_index is not None else int(ends[-1])
    # Made after the first step (state and caches are made there) and still live at the end.
    survivor = (lt.start > ends[0]) & (lt.start <= ends[-1]) & (lt.end > at)
    if not survivor.any():
        return None
    step_of = np.searchsorted(ends, lt.start[survivor], side="left")
    per_step = np.bincount(step_of, lt.size[survivor], k_steps)[1:]
    piled = int(lt.size[survivor].sum())
    share = float((per_step > 0).mean()) if per_step.size else 0.0
    floor = max(LEAK_MIN_BYTES, int(0.05 * inp.limit_bytes)) if inp.limit_bytes else LEAK_MIN_BYTES
    if piled < floor or share < LEAK_MIN_STEP_SHARE:
        return None
    rate = piled // max(1, k_steps - 1)
    stacks = _top_labels(inp, survivor)
    phase_counts = np.bincount(inp.phases.of_alloc[survivor].astype(np.int64), lt.size[survivor])
    held_phase = int(np.argmax(phase_counts))
    graph_note = ""
    if held_phase == FORWARD_NO_BACKWARD:
        graph_note = (
            " They were made by a forward pass that no backward used: each kept result holds its whole autograd "
            "graph (compute it under torch.no_grad(), keep .detach())."
        )
    fix_line = "keep a number or a host copy, not the GPU tensor: x.item() / x.detach().cpu(); clear what you append"
    if held_phase == FORWARD_NO_BACKWARD:
        fix_line = "with torch.no_grad(): kept.append(model(...).detach().cpu())   # not the GPU tensor with its graph"
    figures: dict[str, Any] = {"steps": k_steps, "piled_bytes": piled, "growth_per_step_bytes": rate}
    settings = "a setting cannot stop memory from growing; at best it postpones the OOM"
    headline_tail = ""
    if inp.limit_bytes is not None and inp.oom_index is not None:
        # A perfectly packed cache (no fragmentation at all) is the most any setting can reach.
        packed_room = inp.limit_bytes - _allocated_at(inp, inp.oom_index) - inp.requested_bytes
        more = math.ceil(max(0, packed_room) / max(1, rate))
        figures["died_in_step"] = k_steps
        figures["postpone_packed_steps"] = int(more)
        settings = (
            f"no setting saves the run: with the growth going on, even a perfectly packed cache (what "
            f"expandable_segments approaches) only postpones the OOM, by about {more} step{'s' if more != 1 else ''} "
            f"(to step {k_steps + more})"
        )
        headline_tail = f"; the run died in step {k_steps} and would die again a few steps later under any setting"
    saving = piled
    return Cause(
        title="Memory grows step after step (a leak)",
        phase=PHASES[held_phase],
        explains_oom=inp.oom_index is not None,
        headline=(
            f"Memory grows every step: allocations that outlive their step pile up by about "
            f"{format_size(rate)} a step ({format_size(piled)} over {k_steps} steps){headline_tail}."
        ),
        evidence=(
            f"Of the allocations made after step 0, {format_size(piled)} were still live at the "
            f"{'OOM' if inp.oom_index is not None else 'end'}, made in {share:.0%} of the steps, most by "
            f"{stacks[0] if stacks else 'code without frames'}.{graph_note}"
        ),
        fix_title="Stop keeping every step's tensors on the GPU",
        fix_line=fix_line,
        saving_bytes=saving,
        fits_after_fix=_fits(inp, saving),
        settings=settings,
        stacks=stacks,
        figures=figures,
    )


def optimizer_step(inp: CauseInput) -> Cause | None:
    """The OOM is inside optimizer.step(): its state and its foreach temporaries, not the batch."""
    if inp.oom_index is None or _oom_phase(inp) != "optimizer":
        return None
    lt, pos = inp.lifetimes, _oom_position(inp)
    # The step's own allocations: the run of optimizer allocations before the OOM (other code inside
    # the step, a closure's forward, ends it).
    codes = inp.phases.of_alloc[: pos + 1]
    marked = np.flatnonzero(codes != 0)
    not_opt = marked[codes[marked] != OPTIMIZER]
    first = int(not_opt[-1]) + 1 if not_opt.size else 0
    in_step = np.zeros(lt.start.shape[0], bool)
    in_step[first : pos + 1] = True
    live = in_step & (lt.end > inp.oom_index)
    traits = inp.catalog.traits[inp.catalog.groups_of(lt.stack)]
    state = live & ((traits & TRAIT_OPTIMIZER_STATE_INIT) != 0)
    temps = live & ~state
    temp_bytes = int(lt.size[temps].sum())
    state_bytes = int(lt.size[state].sum())
    impl, opt_name = _optimizer_kind(inp, first, pos)
    saving: int | None = temp_bytes + (inp.requested_bytes if impl == "foreach" else 0)
    # Conservative: the fused step's own (small) request is counted as if it were still made.
    fits = _fits(inp, temp_bytes)
    if impl == "fused":
        fix_title = "Shrink the optimizer's state: 8-bit or sharded"
        fix_line = "bitsandbytes.optim.AdamW8bit(model.parameters(), ...)  # or shard it: FSDP / ZeRO"
        saving, fits = None, None
    else:
        fix_title = f"Use the fused {opt_name} step (no whole-model temporaries)"
        fix_line = f"torch.optim.{opt_name}(model.parameters(), ..., fused=True)"
    what = {
        "foreach": "the foreach implementation's whole-model temporaries",
        "loop": "per-parameter temporaries",
        "fused": "the fused step",
    }.get(impl, "its temporaries")
    return Cause(
        title="The optimizer step",
        explains_oom=True,
        headline=(
            f"Out of memory inside optimizer.step() ({opt_name}{', ' + impl if impl else ''}), not in the forward "
            "or backward pass: "
            f"the batch is not what failed it. The step held {format_size(temp_bytes)} of temporaries and "
            f"{format_size(state_bytes)} of new state when the {format_size(inp.requested_bytes)} request failed."
        ),
        evidence=(
            f"The failing request and the {format_size(temp_bytes + state_bytes)} live from this step come from "
            f"torch/optim ({what})."
        ),
        fix_title=fix_title,
        fix_line=fix_line,
        saving_bytes=saving,
        fits_after_fix=fits,
        settings="no setting shrinks the step's temporaries, and a smaller batch does not either",
        stacks=_top_labels(inp, live),
        figures={"temporaries_bytes": temp_bytes, "new_state_bytes": state_bytes, "implementation": impl or None},
    )


def _optimizer_kind(inp: CauseInput, first: int, pos: int) -> tuple[str, str]:
    """(implementation, optimizer class) from the step's frames: ``_multi_tensor_*`` is foreach,
    ``_fused_*`` fused, ``_single_tensor_*`` the per-parameter loop, "" where no frame says."""
    names = {
        "adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "rmsprop": "RMSprop", "adagrad": "Adagrad",
        "adamax": "Adamax", "nadam": "NAdam", "radam": "RAdam", "adadelta": "Adadelta", "lion": "Lion",
    }  # fmt: skip
    impl, opt = "", ""
    stacks = [int(inp.trace.stack[inp.oom_index])] if inp.oom_index is not None else []
    stacks += inp.lifetimes.stack[first : pos + 1][-64:].tolist()
    for sid in stacks:
        for f in inp.catalog.groups[int(inp.catalog.groups_of(np.array([sid]))[0])].frames:
            if "/torch/optim/" not in f.filename:
                continue
            opt = opt or names.get(f.filename.rsplit("/", 1)[-1].removesuffix(".py"), "")
            if not impl:
                impl = (
                    "foreach" if "_multi_tensor" in f.name
                    else "fused" if "_fused" in f.name
                    else "loop" if "_single_tensor" in f.name
                    else ""
                )  # fmt: skip
    # A rule names only what the frames show: no implementation frame, no implementation named.
    return impl, inp.optimizer_class or opt or "AdamW"


def forward_without_no_grad(inp: CauseInput) -> Cause | None:
    """A forward pass that no backward uses holds its activations for autograd: the OOM is in that pass, or
    in a later one while earlier such passes' activations are still live (an evaluation's loss kept with its
    graph: issue 33's ``feval`` capture died in the next training forward, 1.6 GiB of its evaluations live)."""
    if inp.oom_index is None or _oom_phase(inp) not in ("forward", "forward_no_backward"):
        return None
    pos = _oom_position(inp)
    p = inp.phases.pass_at(pos)
    if p is None:
        return None
    if p.training_site or p.followed_by_backward:
        return _kept_eval_graphs(inp, p)
    has_training = any(q.training_site for q in inp.phases.passes)
    if not has_training and not _repeats_without_backward(inp, p):
        return None
    lt = inp.lifetimes
    made = slice(p.first, pos + 1)
    sizes = lt.size[made]
    held_mask = lt.end[made] > inp.oom_index
    made_bytes = int(sizes.sum())
    held = int(sizes[held_mask].sum())
    if made_bytes == 0 or held < HOLD_MIN_SHARE * made_bytes:
        return None
    # Under no_grad a layer's input dies once its output exists: about the two largest tensors live.
    largest = np.sort(sizes)[-2:]
    saving = max(0, held - int(largest.sum()))
    if saving < inp.requested_bytes:
        return None
    where = p.site or "the evaluation"
    return Cause(
        title="A forward pass without torch.no_grad()",
        explains_oom=True,
        headline=(
            f"Out of memory in a forward pass that no backward uses ({where}): it kept "
            f"{format_size(held)} of activations for a backward that never comes. Under torch.no_grad() about "
            f"{format_size(saving)} of it would not be held."
        ),
        evidence=(
            f"Of the {format_size(made_bytes)} this pass allocated before the OOM, {format_size(held)} "
            f"({held / made_bytes:.0%}) was still live: autograd saves each layer's input. "
            + (
                "The training passes of this run come from other lines."
                if has_training
                else "No backward runs anywhere in this trace."
            )
        ),
        fix_title="Run the evaluation under torch.no_grad()",
        fix_line=f"with torch.no_grad():   # or torch.inference_mode(), around {where}",
        saving_bytes=saving,
        fits_after_fix=_fits(inp, saving),
        settings="a setting cannot give back what the pass holds for autograd",
        stacks=_top_labels(inp, np.isin(np.arange(lt.start.shape[0]), np.arange(p.first, pos + 1)[held_mask])),
        figures={"held_bytes": held, "allocated_in_pass_bytes": made_bytes, "site": where},
    )


def _kept_eval_graphs(inp: CauseInput, at: ForwardPass) -> Cause | None:
    """The OOM is in a training pass (``at``) while earlier passes that no backward followed, from lines that
    never train, still hold most of what they allocated: their outputs were kept with their graphs."""
    lt = inp.lifetimes
    assert inp.oom_index is not None
    held, made_bytes, kept_passes, sites, mask = 0, 0, 0, [], np.zeros(lt.start.shape[0], dtype=bool)
    for q in inp.phases.passes:
        if q.last >= at.first or q.training_site or q.followed_by_backward:
            continue
        sizes = lt.size[q.first : q.last + 1]
        live = lt.end[q.first : q.last + 1] > inp.oom_index
        q_held = int(sizes[live].sum())
        if q_held == 0 or q_held < HOLD_MIN_SHARE * int(sizes.sum()):
            continue  # under no_grad only the pass's output outlives it
        # The pass's largest live tensor (its output, or the logits) is counted as kept under no_grad too.
        held += q_held - int(sizes[live].max())
        made_bytes += int(sizes.sum())
        kept_passes += 1
        mask[q.first : q.last + 1] |= live
        sites.append(q.site)
    if kept_passes == 0 or held < inp.requested_bytes:
        return None
    where = sites[-1] or "the evaluation"
    return Cause(
        title="Evaluation passes kept with their graphs (no torch.no_grad())",
        explains_oom=True,
        headline=(
            f"Out of memory in a training forward pass while {kept_passes} earlier forward pass"
            f"{'es' if kept_passes > 1 else ''} that no backward used ({where}) still held {format_size(held)} "
            "of activations: their outputs were kept with their graphs. Under torch.no_grad() that memory "
            "would have been freed when each pass ended."
        ),
        evidence=(
            f"Of the {format_size(made_bytes)} those passes allocated, {format_size(held)} (less each pass's "
            "largest tensor) was still live at the OOM, long after the pass ended; no backward ever read it. "
            "The training passes of this run come from other lines."
        ),
        fix_title="Run the evaluation under torch.no_grad() (and keep loss.item(), not the loss)",
        fix_line=f"with torch.no_grad():   # or torch.inference_mode(), around {where}",
        saving_bytes=held,
        fits_after_fix=_fits(inp, held),
        settings="a setting cannot give back what the kept graphs hold",
        stacks=_top_labels(inp, mask),
        figures={"held_bytes": held, "allocated_in_pass_bytes": made_bytes, "site": where, "kept_passes": kept_passes},
    )
