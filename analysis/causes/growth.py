"""Causes where what the program allocates grows: the workload, an evaluation's gathered outputs, a KV cache.

The workload grows step after step; an evaluation gathers its outputs on the GPU; a KV cache grows by
concatenation. The last two are one stack group growing by regular steps (``_growing_group``)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from analysis.causes.base import (
    Cause,
    CauseInput,
    _allocated_at,
    _device_full_without_message,
    _oom_phase,
    _oom_position,
)
from analysis.decision import format_size
from analysis.horizon import horizon_is_near
from analysis.kvcache import cache_fit, cache_room, kv_words
from analysis.model import sorted_unique
from analysis.phases import BACKWARD, DECODE, OPTIMIZER, PHASES

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
