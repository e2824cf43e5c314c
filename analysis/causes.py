"""Causes: the program's mistake behind an OOM, each one rule with its evidence, fix and cost.

The allocator model says whether the failing request could have fitted (capacity
or fragmentation); most real OOMs are fixed in the program instead: a tensor kept
every step, the optimizer's temporaries, an evaluation without ``no_grad``, CUDA
graph pools, another process on the GPU, a KV cache grown by ``torch.cat``. Each
rule's function reads the typed ``CauseInput`` (the trace, its phases, the OOM and the
limit) and returns a ``Cause`` or None; its row in ``RULES`` (a ``CauseRule``) carries
what holds for every cause it finds: its cost, its phase where that is fixed, whether
memory grows (settings then only postpone the OOM) and whether a smaller batch helps
(``analysis.sizing`` and the advisor read these). ``RULES`` is the one list, in priority
order: the first cause that explains the OOM is the decision's answer
(``analysis.decision``). Documented in docs/report.md, "Causes".

Every figure is arithmetic on the trace (or the OOM message), never a guess: a
rule that cannot measure its saving says so (``saving_bytes`` None) and the
decision then does not claim that its fix fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.decision import format_size
from analysis.kvcache import cache_fit, cache_room, kv_words
from analysis.limits import OomMessage
from analysis.model import Trace, sorted_unique
from analysis.phases import (
    BACKWARD,
    DECODE,
    FORWARD,
    FORWARD_NO_BACKWARD,
    OPTIMIZER,
    OTHER,
    PHASE_WORDS,
    PHASES,
    ForwardPass,
    Phases,
    live_bytes_by_phase,
    phase_of_event,
)
from analysis.projection import horizon_is_near
from analysis.stacks import TRAIT_OPTIMIZER_STATE_INIT, Lifetimes, StackCatalog
from analysis.steps import Steps

I64 = npt.NDArray[np.int64]

# A leak worth naming: at least this much piles up, in at least this share of the steps.
LEAK_MIN_BYTES = 64 << 20
LEAK_MIN_STEP_SHARE = 0.6
LEAK_MIN_STEPS = 4
# A forward pass that holds what it allocated (saved tensors) rather than freeing it as it goes.
HOLD_MIN_SHARE = 0.5
# Memory outside the cache worth a headline, as a share of the device.
OUTSIDE_MIN_SHARE = 0.2
# Private pools worth a headline, as a share of reserved memory.
POOLS_MIN_SHARE = 0.25
# A workload that grows: at least this many completed steps, the last third's peaks this share of the limit
# above the first third's, and the peaks' ranks correlated with the steps' order at least this much.
GROWTH_MIN_STEPS = 8
GROWTH_MIN_SHARE_OF_LIMIT = 0.15
GROWTH_MIN_RANK_CORRELATION = 0.6
# Hugging Face Trainer's evaluation gathering its outputs (EvalLoopContainer.add -> nested_concat).
_TRAINER_GATHER = "/transformers/trainer_pt_utils.py"
# A cache grown by concatenation: at least this many distinct sizes, this regular.
GROWTH_MIN_SIZES = 16
GROWTH_REGULAR_SHARE = 0.8
# The Trainer's gathering needs fewer: its frames already say what the group is, so two equal steps to the refused
# request (two batches concatenated, the third's copy failing) show it. A real evaluation of a few large batches
# (fw_hf_eval: 524 MB of logits a batch) dies at its fourth batch, long before 16 sizes.
GATHER_MIN_SIZES = 3
# eval_accumulation_steps the fix names at most (the GPU keeps this many batches' outputs before the host copy).
GATHER_MAX_ACCUMULATION = 8


@dataclass(frozen=True, slots=True)
class PoolUse:
    """A memory pool's reserved bytes at the OOM (or the peak): 0 is the default pool."""

    pool: int
    reserved_bytes: int


@dataclass(frozen=True, slots=True)
class CauseInput:
    """What the rules read: one device's trace and what the report already knows of it."""

    trace: Trace
    lifetimes: Lifetimes
    catalog: StackCatalog
    phases: Phases
    steps: Steps
    allocated: I64  # allocated bytes after each event
    oom_index: int | None
    requested_bytes: int  # the failing request (0 without an OOM)
    limit_bytes: int | None
    message: OomMessage | None
    pools_at_oom: tuple[PoolUse, ...]
    reserved_at_oom: int
    pool_origin: str  # "vllm" | "compile" | "manual" | "" (how the private pools were made, from their frames)
    optimizer_class: str = ""  # from the "Optimizer.step#AdamW.step" annotations, where the run has them
    limit_kind: str = ""  # per-process-cap | device-full | "" (``Limit.kind``)
    limit_source: str = ""  # given | sidecar | oom_message | inferred (``Limit.source``)
    reserved_peak_before_oom: int = 0  # the most this process's cache reserved before the OOM


@dataclass(frozen=True, slots=True, kw_only=True)
class Cause:
    """One cause with its evidence, its fix and what the fix is worth. ``id``, ``cost`` and a fixed
    ``phase`` are its rule's (``CauseRule``): ``diagnose`` fills them in."""

    id: str = ""
    title: str
    phase: str = ""
    explains_oom: bool  # without it, the failing request would have fitted
    headline: str  # one sentence for the decision screen
    evidence: str
    fix_title: str
    fix_line: str  # what to copy
    saving_bytes: int | None  # what the fix frees at the failing point (None: not measurable)
    fits_after_fix: bool | None  # arithmetic: the failing point fits once the fix is made
    settings: str  # what allocator settings can do about it
    cost: str = ""
    stacks: tuple[str, ...] = ()
    figures: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "phase": self.phase,
            "explains_oom": self.explains_oom,
            "headline": self.headline,
            "evidence": self.evidence,
            "fix": {"title": self.fix_title, "line": self.fix_line},
            "saving_bytes": self.saving_bytes,
            "fits_after_fix": self.fits_after_fix,
            "settings": self.settings,
            "cost": self.cost,
            "stacks": list(self.stacks),
            "figures": dict(self.figures),
        }


# ------------------------------------------------------------------ shared measurements


def _oom_position(inp: CauseInput) -> int:
    """Position in the lifetimes of the last allocation before the OOM (-1 when none)."""
    assert inp.oom_index is not None
    return int(np.searchsorted(inp.lifetimes.start, inp.oom_index, side="right")) - 1


def _allocated_at(inp: CauseInput, index: int) -> int:
    return int(inp.allocated[index]) if 0 <= index < inp.allocated.shape[0] else 0


def _fits(inp: CauseInput, saving: int) -> bool | None:
    """Whether the failing request fits once ``saving`` bytes are not allocated (packed, no
    fragmentation: the rule's saving is in allocated bytes)."""
    if inp.oom_index is None or inp.limit_bytes is None:
        return None
    return _allocated_at(inp, inp.oom_index) - saving + inp.requested_bytes <= inp.limit_bytes


def _top_labels(inp: CauseInput, mask: npt.NDArray[np.bool_], limit: int = 3) -> tuple[str, ...]:
    """The stack groups holding the most bytes among the allocations in ``mask``."""
    if not mask.any():
        return ()
    gids = inp.catalog.groups_of(inp.lifetimes.stack[mask]).astype(np.int64)
    sums = np.bincount(gids, inp.lifetimes.size[mask])
    order = np.argsort(-sums)[:limit]
    return tuple(inp.catalog.groups[int(g)].label for g in order if sums[g] > 0)


def _oom_phase(inp: CauseInput) -> str:
    """The OOM's phase: its own frames where they name a graph capture (its request is not in the
    allocations), else the phase of the allocations right before it; code outside the modules right after
    a training forward pass that still holds its activations (the loss on the model's output, before its
    backward) is that forward pass (issue 33's ``fgpt_c60`` died in ``cross_entropy`` of its first step)."""
    assert inp.oom_index is not None
    sid = int(inp.trace.stack[inp.oom_index])
    if sid >= 0:
        frames = inp.catalog.groups[int(inp.catalog.groups_of(np.array([sid]))[0])].frames
        if any(f.filename.endswith("torch/cuda/graphs.py") or "cudagraph_trees" in f.filename for f in frames):
            return "graph_capture"
    phase = phase_of_event(inp.phases, inp.lifetimes, inp.oom_index)
    return "forward" if phase == PHASES[OTHER] and _in_loss_of_forward(inp) else phase


def _repeats_without_backward(inp: CauseInput, p: ForwardPass) -> bool:
    """Whether pass ``p`` is inference: no backward or optimizer step came before it, and an earlier finished
    pass from the same line had none after it either. Without a training pass to compare with, only that tells
    inference from the first forward of a training run (whose trace has no backward yet either)."""
    codes = inp.phases.of_alloc
    if bool(((codes[: p.first] == BACKWARD) | (codes[: p.first] == OPTIMIZER)).any()):
        return False
    return any(q.site == p.site and q.followed_by and q.last < p.first for q in inp.phases.passes)


def _pass_before_oom(inp: CauseInput) -> ForwardPass | None:
    """The forward pass the OOM is in, else the last one before it."""
    assert inp.oom_index is not None
    pos = _oom_position(inp)
    marked = np.flatnonzero(inp.phases.of_alloc[: pos + 1] == FORWARD)
    return inp.phases.pass_at(int(marked[-1])) if marked.size else None


def _in_loss_of_forward(inp: CauseInput) -> bool:
    """Whether the allocations since the last marked one are the loss of a training forward pass: that pass
    (``FORWARD``, not an evaluation's) came last, and it still holds most of what it allocated."""
    assert inp.oom_index is not None
    pos = _oom_position(inp)
    marked = np.flatnonzero(inp.phases.of_alloc[: pos + 1] != OTHER)
    if marked.size == 0 or int(inp.phases.of_alloc[marked[-1]]) != FORWARD:
        return False
    p = inp.phases.pass_at(int(marked[-1]))
    if p is None or (not p.training_site and _repeats_without_backward(inp, p)):
        return False  # an inference loop's code between its passes (a KV cache's torch.cat) is not a loss
    sizes = inp.lifetimes.size[p.first : p.last + 1]
    held = int(sizes[inp.lifetimes.end[p.first : p.last + 1] > inp.oom_index].sum())
    return held > 0 and held >= HOLD_MIN_SHARE * int(sizes.sum())


# ------------------------------------------------------------------ the rules


def outside_memory(inp: CauseInput) -> Cause | None:
    """The device was full of memory this process's cache does not hold (another process, or
    this process's own memory outside PyTorch), as the OOM message says."""
    m = inp.message
    if m is None:
        return _outside_from_trace(inp)
    if m.allowed is not None or inp.oom_index is None:
        return None  # under a per-process cap only PyTorch's reserved memory counts
    if m.total_capacity is None or m.device_free is None or m.reserved is None:
        return None
    total, free, reserved = m.total_capacity.value, m.device_free.value, m.reserved.value
    outside = total - free - reserved
    others = sum(f.value for _, f in m.other_processes)
    in_process = m.non_pytorch.value if m.non_pytorch is not None else max(0, outside - others)
    if outside < OUTSIDE_MIN_SHARE * total or outside < inp.requested_bytes:
        return None
    biggest = max(m.other_processes, key=lambda p: p[1].value, default=None)
    if biggest is not None and others >= in_process:
        pid, fig = biggest
        who = f"another process (PID {pid}) held {format_size(fig.value)}"
        if len(m.other_processes) > 1:
            who = f"{len(m.other_processes)} other processes held {format_size(others)} (PID {pid}: {fig.text})"
        fix_title = "Give this job the GPU: stop the other process or run on a free GPU"
        fix_line = (
            f"nvidia-smi --query-compute-apps=pid,used_memory --format=csv   # stop PID {pid}, "
            "or CUDA_VISIBLE_DEVICES=<a free GPU>"
        )
    else:
        who = f"this process held {format_size(in_process)} outside PyTorch's cache"
        fix_title = "Free the memory this process holds outside PyTorch's cache"
        fix_line = (
            "# a library's own cudaMalloc (CuPy/Numba pools, NCCL buffers, a raw buffer): free it before training, "
            "e.g. cupy.get_default_memory_pool().free_all_blocks()"
        )
    return Cause(
        title="Memory outside this process's cache",
        phase=_oom_phase(inp),
        explains_oom=outside + free >= inp.requested_bytes,
        headline=(
            f"The GPU was full, but not of this run's tensors: {who}, and PyTorch had reserved only "
            f"{format_size(reserved)} of the {format_size(total)} device when the {format_size(inp.requested_bytes)} "
            "request failed."
        ),
        evidence=(
            f"The OOM message: {format_size(free)} free of {format_size(total)}; PyTorch reserved "
            f"{format_size(reserved)}; {format_size(outside)} was memory outside this process's cache "
            f"({format_size(others)} in other processes, {format_size(in_process)} in this one outside PyTorch)."
        ),
        fix_title=fix_title,
        fix_line=fix_line,
        saving_bytes=outside,
        fits_after_fix=True,
        settings="no PYTORCH_CUDA_ALLOC_CONF setting gives back memory PyTorch does not hold",
        figures={"outside_bytes": outside, "other_processes_bytes": others, "in_process_outside_bytes": in_process},
    )


def _device_full_without_message(inp: CauseInput) -> bool:
    """The limit is the device's free memory at the OOM (inferred: the OOM entry's ``device_free`` was less
    than the request), and no message says who held the rest: this run's own limit is not known."""
    return inp.message is None and inp.limit_kind == "device-full" and inp.limit_source == "inferred"


def _outside_from_trace(inp: CauseInput) -> Cause | None:
    """Without the message, what the trace alone proves: this process once reserved more than it reserved at
    the OOM plus the device's free memory then (the OOM entry's ``device_free``). The device holds at least
    the earlier peak, so the difference was taken by memory outside this process's cache since: another
    process or a library in this one (which of them only the message tells)."""
    if inp.oom_index is None:
        return None
    free = int(inp.trace.addr[inp.oom_index])  # the model keeps an oom entry's device_free in addr
    if free >= inp.requested_bytes:
        return None  # the device had the room: a per-process cap refused the request, not the device
    peak = inp.reserved_peak_before_oom
    taken = peak - inp.reserved_at_oom - free
    if taken < inp.requested_bytes or taken < OUTSIDE_MIN_SHARE * max(1, peak):
        return None
    return Cause(
        title="Memory outside this process's cache",
        phase=_oom_phase(inp),
        explains_oom=taken + free >= inp.requested_bytes,
        headline=(
            f"The GPU was full, but not of this run's tensors: this process had reserved {format_size(peak)} "
            f"earlier, and when the {format_size(inp.requested_bytes)} request failed it held "
            f"{format_size(inp.reserved_at_oom)} with {format_size(free)} free on the device: at least "
            f"{format_size(taken)} had been taken by memory outside this process's cache (another process, or a "
            "library in this one; the OOM message's "
            "'Process N has' lines would say which)."
        ),
        evidence=(
            f"The trace's reserved memory peaked at {format_size(peak)} before the OOM; the OOM entry's device_free "
            f"was {format_size(free)} beside {format_size(inp.reserved_at_oom)} reserved."
        ),
        fix_title="Give this job the GPU: find what else holds it, stop it or run on a free GPU",
        fix_line=(
            "nvidia-smi --query-compute-apps=pid,used_memory --format=csv   # or CUDA_VISIBLE_DEVICES=<a free GPU>"
        ),
        saving_bytes=taken,
        fits_after_fix=taken + free >= inp.requested_bytes,
        settings="no PYTORCH_CUDA_ALLOC_CONF setting gives back memory PyTorch does not hold",
        figures={
            "outside_bytes": taken,
            "other_processes_bytes": None,
            "in_process_outside_bytes": None,
            "outside_is_lower_bound": True,
            "reserved_peak_before_oom_bytes": peak,
        },
    )


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


def growing_workload(inp: CauseInput) -> Cause | None:
    """The steps need more and more (a growing batch or sequence length): the step that failed is
    not the last that would, and a setting that gets past it only postpones the OOM."""
    if inp.oom_index is None or inp.limit_bytes is None:
        return None
    ends = inp.steps.last_event
    firsts = inp.steps.first_event
    done = ends < inp.oom_index
    k = int(done.sum())
    if k < GROWTH_MIN_STEPS:
        return None
    peaks = np.array(
        [
            int(inp.allocated[int(a) : int(b) + 1].max()) if b >= a else 0
            for a, b in zip(firsts[:k], ends[:k], strict=True)
        ],
        np.int64,
    )
    third = max(1, k // 3)
    early, late = float(peaks[:third].mean()), float(peaks[-third:].mean())
    slope = float(np.polyfit(np.arange(k, dtype=np.float64), peaks.astype(np.float64), 1)[0])
    if slope <= 0 or late - early < GROWTH_MIN_SHARE_OF_LIMIT * inp.limit_bytes:
        return None
    # A trend, not shapes drawn at random: the steps' ranks by peak follow their order (Spearman's rho;
    # gpt_varlen_oom's jittery lengths 0.8, random batch x length draws of 8 steps anything).
    ranks = np.argsort(np.argsort(peaks, kind="stable"), kind="stable").astype(np.float64)
    rho = float(np.corrcoef(np.arange(k, dtype=np.float64), ranks)[0, 1]) if k > 1 else 0.0
    if rho < GROWTH_MIN_RANK_CORRELATION:
        return None
    rate = int(slope)
    best = int(peaks.max())
    best_step = int(np.argmax(peaks))
    # The device itself was full and no message says of what: the limit the growth ran into may be another
    # process's doing. The growth is named, but not as the answer: only the message can tell.
    unknown_limit = _device_full_without_message(inp)
    missing = (
        " But the GPU itself was full at the OOM, and the limit it grew into is only its free memory then: "
        "whether the growth or memory outside this process filled it, only the OOM message says (give it)."
        if unknown_limit
        else ""
    )
    packed_room = inp.limit_bytes - _allocated_at(inp, inp.oom_index) - inp.requested_bytes
    more = math.ceil(max(0, packed_room) / max(1, rate))
    need = _allocated_at(inp, inp.oom_index) + inp.requested_bytes
    settings_words = _growth_settings_words(k, more)
    return Cause(
        title="The workload grows step after step (batch or sequence length)",
        phase=_oom_phase(inp),
        explains_oom=not unknown_limit,
        headline=(
            f"The steps need more and more: peak allocated memory grew from {format_size(int(early))} in the first "
            f"steps to {format_size(int(late))} in the last (about {format_size(rate)} a step: a growing batch or "
            f"sequence length), and step {k} needed more than the limit. {settings_words[0]}{missing}"
        ),
        evidence=(
            f"Peak allocated per completed step, by a line through the {k} steps: +{format_size(rate)} a step; the "
            f"largest completed step (step {best_step}) peaked at {format_size(best)}; the failing one needed at least "
            f"{format_size(need)}."
        ),
        fix_title="Cap what grows: the batch or sequence length at what the largest completed step used",
        fix_line=(
            f"max_len = ...  # cap the batch / sequence length at step {best_step}'s ({format_size(best)} peak), or "
            "bucket lengths so the largest bucket fits"
        ),
        saving_bytes=max(0, need - best),
        fits_after_fix=best <= inp.limit_bytes,
        settings=settings_words[1],
        figures={
            "steps": k,
            "rank_correlation": round(rho, 3),
            "growth_per_step_bytes": rate,
            "largest_completed_step": best_step,
            "largest_completed_peak_bytes": best,
            "died_in_step": k,
            "postpone_packed_steps": int(more),
            "horizon_near": horizon_is_near(k, k + more),
        },
    )


def _growth_settings_words(k: int, more: int) -> tuple[str, str]:
    """(the headline's sentence, the cause's ``settings``) of a growing workload whose perfectly packed cache
    gains ``more`` steps past the failing step ``k``. Whether a setting still comes first (its horizon is not
    near) is the decision's, which reads the settings' replays (``analysis.decision``)."""
    steps = f"{more} step{'s' if more != 1 else ''}"
    return (
        f"No allocator setting saves such a run: one that gets past step {k} dies a few steps later.",
        f"no setting saves the run while the steps keep growing: even a perfectly packed cache (what "
        f"expandable_segments approaches) only postpones the OOM, by about {steps} (to step {k + more})",
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


def cuda_graph_pools(inp: CauseInput) -> Cause | None:
    """Private pools of CUDA graphs (one per captured shape) hold much of the reserved memory."""
    private = [p for p in inp.pools_at_oom if p.pool != 0 and p.reserved_bytes > 0]
    if len(private) < 2:
        return None
    held = sum(p.reserved_bytes for p in private)
    in_capture = inp.oom_index is not None and _oom_phase(inp) == "graph_capture"
    if held < POOLS_MIN_SHARE * max(1, inp.reserved_at_oom) and not in_capture:
        return None
    largest = max(p.reserved_bytes for p in private)
    saving = held - largest
    if inp.pool_origin == "vllm":
        # vLLM captures its graphs itself (its model runner's capture_model): the knobs are its own.
        fix_title = "Fewer captured batch sizes in vLLM, or no CUDA graphs"
        fix_line = (
            "LLM(..., compilation_config={'cudagraph_capture_sizes': [1, 2, 4, 8]})   # fewer sizes; "
            "or enforce_eager=True, or a lower gpu_memory_utilization"
        )
    elif inp.pool_origin == "compile":
        fix_title = "Fewer captured shapes: pad to a few buckets, or compile with dynamic shapes"
        fix_line = "torch.compile(model, mode='reduce-overhead', dynamic=True)   # or pad inputs to a few bucket sizes"
    else:
        fix_title = "Capture every graph into one shared pool, largest first"
        fix_line = (
            "pool = torch.cuda.graph_pool_handle()   # torch.cuda.graph(g, pool=pool) for each size, largest first"
        )
    fits = None
    if inp.oom_index is not None and inp.limit_bytes is not None:
        fits = inp.reserved_at_oom - saving + inp.requested_bytes <= inp.limit_bytes
    return Cause(
        title="CUDA graph pools, one per captured shape",
        phase="graph_capture" if in_capture else (_oom_phase(inp) if inp.oom_index is not None else "other"),
        explains_oom=inp.oom_index is not None and saving >= inp.requested_bytes,
        headline=(
            f"{len(private)} CUDA graph pools held {format_size(held)} of the {format_size(inp.reserved_at_oom)} "
            f"reserved, each kept for its own captured shape (the largest {format_size(largest)}); one shared "
            f"pool would hold about {format_size(largest)}."
        ),
        evidence=(
            f"Segments in private pools: {len(private)} pools, {format_size(held)}; memory a pool reserves serves "
            "only that pool's graphs."
        ),
        fix_title=fix_title,
        fix_line=fix_line,
        saving_bytes=saving,
        fits_after_fix=fits,
        settings="each setting acts inside every pool; none merges pools",
        figures={"pools": len(private), "private_pool_bytes": held, "largest_pool_bytes": largest},
    )


def _growing_group(inp: CauseInput, pos: int) -> tuple[int, npt.NDArray[np.intp], npt.NDArray[np.int64], int] | None:
    """The group of stacks behind the OOM request when its allocations since the last backward grew by one
    regular step: (group, its allocations, their distinct sizes, the step), else None."""
    assert inp.oom_index is not None
    lt = inp.lifetimes
    gids = inp.catalog.groups_of(lt.stack)
    oom_group = int(inp.catalog.groups_of(np.array([inp.trace.stack[inp.oom_index]]))[0])
    group = oom_group if oom_group != 0 else int(gids[pos])
    if group == 0:
        return None
    # Token by token within one pass: a batch or sequence that grows step after step (one new size per
    # training step, a backward between each) is no cache (the DDP capture's growing batch).
    since = _since_training(inp, pos)
    mine = since + np.flatnonzero(gids[since : pos + 1] == group)
    sizes = lt.size[mine]
    distinct = sorted_unique(sizes)
    if distinct.size < GROWTH_MIN_SIZES:
        return None
    steps = np.diff(distinct[-GROWTH_MIN_SIZES * 4 :])
    delta = int(np.median(steps))
    if delta <= 0 or float((np.abs(steps - delta) <= max(1, delta // 100)).mean()) < GROWTH_REGULAR_SHARE:
        return None
    if float((np.diff(sizes[-256:]) >= 0).mean()) < 0.5:
        return None  # sizes that come and go (variable batches), not a growing cache
    return group, mine, distinct, delta


def _since_training(inp: CauseInput, pos: int) -> int:
    """First allocation position after the last backward or optimizer allocation up to ``pos`` (0 when none)."""
    codes = inp.phases.of_alloc[: pos + 1]
    trained = np.flatnonzero((codes == BACKWARD) | (codes == OPTIMIZER))
    return int(trained[-1]) + 1 if trained.size else 0


def _gather_growth(inp: CauseInput, pos: int) -> tuple[int, npt.NDArray[np.intp], npt.NDArray[np.int64], int] | None:
    """``_growing_group``'s answer where it is the Trainer's gathering; else, for an evaluation of few batches, the
    OOM request's Trainer-gathering group when its sizes since the last training pass, the refused request
    included, step up by one regular amount (at least ``GATHER_MIN_SIZES`` sizes)."""
    growth = _growing_group(inp, pos)
    if growth is not None:
        return growth if _trainer_gathers(inp, growth[0]) else None
    assert inp.oom_index is not None
    lt = inp.lifetimes
    gids = inp.catalog.groups_of(lt.stack)
    group = int(inp.catalog.groups_of(np.array([inp.trace.stack[inp.oom_index]]))[0])
    if group == 0 or not _trainer_gathers(inp, group):
        return None  # the refused request itself must be the gathering's next copy
    since = _since_training(inp, pos)
    mine = since + np.flatnonzero(gids[since : pos + 1] == group)
    sizes = np.append(lt.size[mine], np.int64(inp.trace.size[inp.oom_index]))
    every = sorted_unique(sizes)
    if every.size < GATHER_MIN_SIZES or float((np.diff(sizes) >= 0).mean()) < 0.5:
        return None
    steps = np.diff(every)
    delta = int(np.median(steps))
    if delta <= 0 or not bool((np.abs(steps - delta) <= max(1, delta // 100)).all()):
        return None
    return group, mine, sorted_unique(lt.size[mine]), delta


def _gather_accumulation(inp: CauseInput, held: int, per_batch: int, delta: int) -> tuple[int, bool | None]:
    """(eval_accumulation_steps to name, whether the failing point then fits). With k the GPU keeps at most k - 1
    batches' outputs (``per_batch`` bytes each) while the k-th batch's copy (``delta`` per tensor, one at a time)
    is made: the largest k (at most ``GATHER_MAX_ACCUMULATION``) where that fits beside what is not the
    gathering's; 1 where even that does not, or the limit is unknown."""
    if inp.limit_bytes is None or inp.oom_index is None:
        return 1, None
    beside = _allocated_at(inp, inp.oom_index) - held
    room = inp.limit_bytes - beside + per_batch
    k = min(GATHER_MAX_ACCUMULATION, room // (per_batch + delta)) if per_batch + delta > 0 else 1
    k = max(1, int(k))
    return k, beside + (k - 1) * per_batch + k * delta <= inp.limit_bytes


def _trainer_gathers(inp: CauseInput, group: int) -> bool:
    """Whether a growing group is Hugging Face Trainer's evaluation gathering outputs (``EvalLoopContainer.add``
    -> ``nested_concat`` in ``trainer_pt_utils.py``), not a cache."""
    return any(f.filename.endswith(_TRAINER_GATHER) for f in inp.catalog.groups[group].frames)


def eval_outputs_on_gpu(inp: CauseInput) -> Cause | None:
    """Hugging Face Trainer's evaluation keeps every batch's outputs on the GPU: without
    ``eval_accumulation_steps`` it concatenates them there (a larger copy each batch) until the loop ends."""
    if inp.oom_index is None:
        return None
    lt, pos = inp.lifetimes, _oom_position(inp)
    growth = _gather_growth(inp, pos) if pos >= 0 else None
    if growth is None:
        return None
    group, mine, distinct, delta = growth
    live = mine[lt.end[mine] > inp.oom_index]
    held = int(lt.size[live].sum())
    per_batch = delta * max(1, int(live.size))
    # With eval_accumulation_steps=k the GPU holds at most k batches' outputs before they go to the host: k is
    # what fits (an evaluation that died at its fourth batch gets at most 3, never a fixed 8 it would die under).
    steps, fits = _gather_accumulation(inp, held, per_batch, delta)
    saving = max(0, held - (steps - 1) * per_batch)
    label = inp.catalog.groups[group].label
    return Cause(
        title="The Trainer's evaluation keeps every batch's outputs on the GPU",
        phase=_oom_phase(inp),
        explains_oom=True,
        headline=(
            f"Hugging Face Trainer's evaluation gathers every batch's outputs on the GPU: {format_size(held)} "
            f"after about {int(distinct[-1]) // delta:,} batches' worth ({format_size(delta)} more each), copied "
            "into a larger block at each batch, until the evaluation ends. eval_accumulation_steps moves them to "
            "the host every few batches."
        ),
        evidence=(
            f"{mine.size:,} allocations from {label} (trainer_pt_utils' nested_concat) grew by {format_size(delta)} "
            f"at a time to {format_size(int(distinct[-1]))}; {format_size(held)} of them were live at the OOM."
        ),
        fix_title="Move the gathered outputs to the host every few batches (eval_accumulation_steps)",
        fix_line=(
            f"TrainingArguments(..., eval_accumulation_steps={steps})   # or preprocess_logits_for_metrics="
            "lambda logits, labels: logits.argmax(-1), which keeps only the predictions"
        ),
        saving_bytes=saving,
        fits_after_fix=fits,
        settings="a setting cannot shrink what the evaluation loop keeps",
        stacks=(label,),
        figures={
            "gathered_bytes": held,
            "bytes_per_batch": delta,
            "tensors": int(live.size),
            "eval_accumulation_steps": steps,
        },
    )


def kv_cache_growth(inp: CauseInput) -> Cause | None:
    """A cache grown by concatenation, token by token: each step copies it into a larger block."""
    if inp.oom_index is None:
        return None
    lt, pos = inp.lifetimes, _oom_position(inp)
    if pos < 0:
        return None
    growth = _growing_group(inp, pos)
    if growth is None or _trainer_gathers(inp, growth[0]):
        return None
    group, mine, distinct, delta = growth
    live = mine[lt.end[mine] > inp.oom_index]
    cache_bytes = int(lt.size[live].sum())
    # The cache's tensors (2 x layers for keys and values): each gets one new copy a token, so the copies made
    # at the last complete length count them (the live ones at the OOM include the copy in flight).
    complete = int((lt.size[mine] == distinct[-2]).sum()) if distinct.size >= 2 else 0
    tensors = max(1, complete or int(live.size))
    tokens_now = int(distinct[-1]) // delta
    room = cache_room(inp.allocated, lt.start, lt.end, lt.size, mine, delta, inp.oom_index)
    # A static cache is advised only where its own bytes fit: every token's keys and values for the full length
    # beside the weights and the prefill's (or a token's) own peak (analysis.kvcache sizes each change).
    fit = cache_fit(inp.limit_bytes, room, tensors, delta, tokens_now)
    label = inp.catalog.groups[group].label
    hf = (
        any(f.filename.endswith("/cache_utils.py") for f in inp.catalog.groups[group].frames)
        or inp.phases.of_alloc[pos] == DECODE
    )
    helps, fits_tokens = fit.static_fits, fit.static
    words = kv_words(hf, fit, delta, room)
    return Cause(
        title="A cache grown by concatenation (KV cache)",
        phase=PHASES[int(inp.phases.of_alloc[pos])],
        explains_oom=helps,
        headline=words[0],
        evidence=(
            f"{mine.size:,} allocations from {label} grew by {format_size(delta)} at a time to "
            f"{format_size(int(distinct[-1]))}; {live.size} of them ({format_size(cache_bytes)}) were live at the "
            f"OOM. Beside the cache {format_size(room.resident)} stayed live and at most "
            f"{format_size(room.peak_beside)} was (the prefill's or a token's own peak); the prompt was "
            f"{room.prompt_tokens:,} tokens."
        ),
        fix_title=words[1],
        fix_line=words[2],
        saving_bytes=inp.requested_bytes if helps else None,
        fits_after_fix=helps if fits_tokens is not None else None,
        settings="expandable_segments can map the growing blocks in place, but each token still copies the cache",
        stacks=(label,),
        figures={
            "tensors": tensors,
            "bytes_per_token_per_tensor": delta,
            "tokens_at_oom": tokens_now,
            "tokens_that_fit_preallocated": fits_tokens,
            "cache_bytes": cache_bytes,
            "resident_beside_cache_bytes": room.resident,
            "peak_beside_cache_bytes": room.peak_beside,
            "prompt_tokens": room.prompt_tokens,
            "tokens_that_fit_preallocated_half_batch": fit.half_batch,
            **fit.to_figures(),
        },
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


# ------------------------------------------------------------------ the diagnosis


@dataclass(frozen=True, slots=True, kw_only=True)
class CauseRule:
    """One cause: the function that finds it, and what holds for every cause it finds. Adding a
    cause is one function and one row of ``RULES``; the report, the advisor and the sizing read the row."""

    id: str
    find: Callable[[CauseInput], Cause | None]
    cost: str  # what the fix costs the run, in words (``Cause.cost``)
    phase: str | None  # the phase it is found in (``Cause.phase``); None: measured from the trace each time
    grows: bool  # memory grows step after step: a setting that gets past the OOM only postpones it
    smaller_batch_helps: bool  # a smaller batch fixes it (else no smaller-batch advice beside it)

    def __post_init__(self) -> None:
        if self.phase is not None and self.phase not in PHASES:
            raise ValueError(f"cause {self.id}: phase {self.phase!r} is none of {PHASES}")


# Priority order: the first cause that explains the OOM is the decision's answer. The real
# half-batch reruns of the optimizer and evaluation families died in the same step, and a leak's
# growth goes on: a smaller batch does not help there.
RULES: tuple[CauseRule, ...] = (
    CauseRule(
        id="outside_memory",
        find=outside_memory,
        cost="none to the run: the memory belongs elsewhere",
        phase=None,
        grows=False,
        smaller_batch_helps=False,
    ),
    CauseRule(
        id="leak",
        find=leak,
        cost="none: the kept tensors are a bug (keep numbers or host copies instead)",
        phase=None,
        grows=True,
        smaller_batch_helps=False,
    ),
    CauseRule(
        id="optimizer_step",
        find=optimizer_step,
        cost="none for fused (same numerics); 8-bit state changes the optimisation",
        phase="optimizer",
        grows=False,
        smaller_batch_helps=False,
    ),
    CauseRule(
        id="forward_without_no_grad",
        find=forward_without_no_grad,
        cost="none: no gradients are needed there",
        phase="forward_no_backward",
        grows=False,
        smaller_batch_helps=False,
    ),
    CauseRule(
        id="cuda_graph_pools",
        find=cuda_graph_pools,
        cost="none for a shared pool (replay graphs in capture order); padding wastes some compute",
        phase=None,
        grows=False,
        smaller_batch_helps=False,
    ),
    CauseRule(
        id="eval_outputs_on_gpu",
        find=eval_outputs_on_gpu,
        cost="none: the outputs go to the host every few batches (a copy), or only the predictions are kept",
        phase=None,
        grows=False,
        smaller_batch_helps=False,
    ),
    CauseRule(
        id="kv_cache_growth",
        find=kv_cache_growth,
        cost="none for a preallocated cache of the length you generate; more if max_len is far above it",
        phase=None,
        grows=False,
        smaller_batch_helps=True,
    ),
    CauseRule(
        id="growing_workload",
        find=growing_workload,
        cost="the longest batches or sequences are cut or split (or padded to buckets)",
        phase=None,
        grows=True,
        smaller_batch_helps=True,
    ),
)


def rule_named(cause_id: str) -> CauseRule:
    """The rule of a cause id (a ``KeyError`` for an id no rule makes)."""
    for rule in RULES:
        if rule.id == cause_id:
            return rule
    raise KeyError(cause_id)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Every cause found, in rule order, and the phase of the OOM."""

    oom_phase: str | None
    live_by_phase: Mapping[str, int]
    causes: tuple[Cause, ...]
    phases_known: bool
    # The OOM's forward pass (or the last before it) is inference (``_repeats_without_backward``): not a
    # training step, whatever its phase (sizing's first-step batch fit reads it).
    inference: bool = False

    @property
    def primary(self) -> Cause | None:
        """The cause the decision names: the first that explains the OOM (or, without an OOM,
        the first found)."""
        for c in self.causes:
            if c.explains_oom:
                return c
        return None

    def to_json(self) -> dict[str, Any]:
        primary = self.primary
        return {
            "oom_phase": self.oom_phase,
            "oom_phase_words": PHASE_WORDS.get(self.oom_phase or "", None),
            "live_by_phase_at_oom": dict(self.live_by_phase),
            "phases_known": self.phases_known,
            "primary": primary.id if primary is not None else None,
            "causes": [c.to_json() for c in self.causes],
        }


def diagnose(inp: CauseInput, rules: Sequence[CauseRule] | None = None) -> Diagnosis:
    """Every rule of ``rules`` (``RULES`` as it is when called) run on one device."""
    found = (_found(rule, inp) for rule in (RULES if rules is None else rules))
    causes = tuple(c for c in found if c is not None)
    oom_phase = _oom_phase(inp) if inp.oom_index is not None else None
    live = live_bytes_by_phase(inp.phases, inp.lifetimes, inp.oom_index) if inp.oom_index is not None else {}
    last = _pass_before_oom(inp) if inp.oom_index is not None else None
    inference = last is not None and not last.training_site and _repeats_without_backward(inp, last)
    return Diagnosis(oom_phase, live, causes, inp.phases.has_frames, inference)


def _found(rule: CauseRule, inp: CauseInput) -> Cause | None:
    """The rule's cause, if any, with what the rule says of it: its id, cost and fixed phase."""
    cause = rule.find(inp)
    if cause is None:
        return None
    return replace(cause, id=rule.id, cost=rule.cost, phase=rule.phase or cause.phase)


def pool_origin(
    catalog: StackCatalog, stacks: npt.NDArray[np.integer], *, process: npt.NDArray[np.integer] | None = None
) -> str:
    """How private-pool allocations (``stacks``) were made: vLLM's model runner capturing its graphs (a vLLM
    frame anywhere in the ``process``'s allocations: the trace often does not say which allocations went to a
    private pool, and a capture's context manager leaves no frame), torch.compile's CUDA graph trees, or a
    manual capture."""
    if process is not None and process.size:
        everywhere = sorted_unique(catalog.groups_of(process).astype(np.int64)).tolist()
        if any("/vllm/" in f.filename for gid in everywhere for f in catalog.groups[int(gid)].frames):
            return "vllm"  # before compile: vLLM compiles its model too, but captures the graphs itself
    seen = set(catalog.groups_of(stacks).tolist())
    for gid in seen:
        for f in catalog.groups[int(gid)].frames:
            if "cudagraph_trees" in f.filename or "/_inductor/" in f.filename:
                return "compile"
    return "manual" if seen else ""
