"""The workload as the advisor reads it: its typed input (``advice.AdviceContext``) from the stages' results.

``advice_context(...) -> AdviceContext``: the peaks, the categories, the activations by site, whether a
backward pass and autocast ran, and the estimates the rules quote (bf16 autocast's saving as a range,
checkpointing the repeated blocks); its ``oom`` and ``whatifs`` wait for the replays.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from analysis import advice as advice_mod
from analysis.allocator import compiled as compiled_loops
from analysis.categories import ACTIVATIONS, GRADIENTS, OPTIMIZER_STATE
from analysis.model import Snapshot, sorted_unique
from analysis.stacks import TRAIT_AUTOCAST, TRAIT_BACKWARD, Lifetimes, StackCatalog, totals_by_group
from analysis.stages.attribution import Attribution
from analysis.stages.outline import Facts, Live
from analysis.stages.replays import Recorded

I64 = npt.NDArray[np.int64]


def advice_context(
    snapshot: Snapshot,
    facts: Facts,
    recorded: Recorded,
    attribution: Attribution,
    source_bytes: int,
    catalog: StackCatalog,
) -> advice_mod.AdviceContext:
    """The advisor's input, its ``oom`` and ``whatifs`` left for the caller (they wait on the replays)."""
    lifetimes, replay = facts.lifetimes, recorded.replay
    stacks, sizes, _ = attribution.live["peak"]
    codes, peak_codes, categories = attribution.codes, attribution.peak_codes, attribution.categories
    act_mask = peak_codes == ACTIVATIONS
    opt_mask = peak_codes == OPTIMIZER_STATE
    opt_labels = [catalog.groups[t.group].label for t in totals_by_group(catalog, stacks[opt_mask], sizes[opt_mask])]
    traits = catalog.stack_traits(lifetimes.stack)
    alloc_sizes = lifetimes.size  # every alloc event's, in trace order
    large = alloc_sizes[alloc_sizes >= (1 << 20)]
    peak_idx = int(replay.peak_allocated_index)
    has_backward = bool((codes == GRADIENTS).any() or ((traits & TRAIT_BACKWARD) != 0).any())
    autocast_seen = bool(((traits & TRAIT_AUTOCAST) != 0).any())
    # The workload estimates cost passes over every allocation: only where a rule can use them.
    worth = has_backward and int(categories["activations"]) >= advice_mod.WORKLOAD_MIN_BYTES
    amp_low, amp_high = (
        _amp_saving_range(catalog, lifetimes, codes, facts.live_requested)
        if worth and not autocast_seen
        else (None, None)
    )
    stacks_seen = snapshot.stacks.stacks
    return advice_mod.AdviceContext(
        device=facts.dev.device,
        recorded=facts.recorded_cfg,
        events=facts.n,
        peak_reserved=int(replay.peak_reserved),
        peak_allocated=int(replay.peak_allocated),
        peak_requested=int(replay.peak_requested),
        reserved_at_peak_alloc=int(replay.reserved[peak_idx]) if 0 <= peak_idx < replay.reserved.shape[0] else 0,
        oom=None,
        whatifs=[],
        categories=categories,
        activations_by_site=_activations_by_site(catalog, stacks[act_mask], sizes[act_mask]),
        has_backward=has_backward,
        autocast_seen=autocast_seen,
        optimizer_state_bytes=int(categories["optimizer_state"]),
        optimizer_labels=opt_labels[:3],
        distinct_large_sizes=_distinct(large),
        large_requests=int(large.size),
        capture={},
        source_bytes=source_bytes,
        steps=len(facts.steps),
        mean_stack_frames=float(np.mean([len(st) for st in stacks_seen])) if stacks_seen else 0.0,
        optimizer_fused=any(
            "/torch/optim/" in f.filename and f.name.startswith("_fused") for g in catalog.groups for f in g.frames
        ),
        amp_saving_low=amp_low,
        amp_saving_high=amp_high,
        checkpoint=_checkpoint_estimate(catalog, stacks[act_mask], sizes[act_mask]) if worth else None,
    )


def _distinct(values: I64) -> int:
    """How many distinct values: the compiled count where it runs (the 460 MB trace's 446k large request sizes:
    19-23 ms of the sort on the 2-core VM, its vectorised quicksort slowed by the many equal values), else the
    sort's."""
    got = compiled_loops.distinct_count(values)
    return int(sorted_unique(values).size) if got is None else got


def _activations_by_site(catalog: StackCatalog, stacks: I64, sizes: I64) -> list[tuple[str, int]]:
    """Activation bytes at the peak by the site that made them, largest first."""
    by_site: dict[str, int] = {}
    for t in totals_by_group(catalog, stacks, sizes):
        info = catalog.groups[t.group]
        site = info.site
        label = info.label if site is None else f"{site.filename.rsplit('/', 1)[-1]}:{site.line} {site.name}"
        by_site[label] = by_site.get(label, 0) + t.bytes
    return sorted(by_site.items(), key=lambda kv: -kv[1])


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


def _peak_without(live: Live, halves: I64, cut: npt.NDArray[np.bool_]) -> int:
    """Peak of live requested bytes with half of each ``cut`` allocation gone.

    Live memory only rises at an allocation, so the peak is after one of them: the cut bytes
    live there are those cut up to it less those whose end comes before it (``end_rank``)."""
    if not cut.any():
        return live.peak
    got = compiled_loops.peak_without(live.after, live.end_rank, halves, cut)
    if got is not None:  # the same sums in two compiled passes (warm: 5.5 -> ~1.5 ms a bound on the 460 MB trace)
        return got
    # Only the cut allocations are summed again (bincount in float64: exact below 2**53 bytes).
    half = np.where(cut, halves, 0)
    ended = np.bincount(live.end_rank[cut], halves[cut].astype(np.float64), half.shape[0] + 1)
    # ``cumsum(half) - cumsum(ended)`` in one pass (the same in int64); a float64 sum of integers is an
    # integer, so the difference and its cast are exact where the sums are. Each step in place: no fresh column.
    np.subtract(half, ended[:-1], out=half, casting="unsafe")
    gone = np.cumsum(half, out=half)
    return int(np.subtract(live.after, gone, out=gone).max())


def _amp_saving_range(
    catalog: StackCatalog, lifetimes: Lifetimes, codes: npt.NDArray[np.int8], live: Live | None
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
    base = live.peak
    # Per group first (a few hundred): how many bounds halve it (0, 1: the upper alone, 2: both; the lower
    # halves a subset of the upper's), then one gather over the allocations for both (np.take: a third of
    # the time of two indexed gathers on the 460 MB trace's 802k allocations).
    upper, lower = _halved_by_bounds(act, gids, ~fp32, ~fp32 & in_nn)
    halves = lifetimes.size >> 1  # each allocation's half (// 2: a shift floors alike, at a tenth of the division)
    high = base - _peak_without(live, halves, upper)
    low = base - _peak_without(live, halves, lower)
    return max(0, low), max(0, high)


def _halved_by_bounds(
    act: npt.NDArray[np.bool_],
    gids: npt.NDArray[np.integer],
    upper_groups: npt.NDArray[np.bool_],
    lower_groups: npt.NDArray[np.bool_],
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Which activations each bound halves: ``act & upper_groups[gids]`` and ``act & lower_groups[gids]``,
    ``lower_groups`` a subset of ``upper_groups``."""
    assert not (lower_groups & ~upper_groups).any()
    # Every id is a group's, so "clip" changes none; it spares take the bounds check, and the int32 ids
    # their copy as intp (the 460 MB trace's 802k allocations: 1.5 -> 0.8 ms).
    level = np.take(upper_groups.view(np.uint8) + lower_groups.view(np.uint8), gids, mode="clip")
    level *= act
    return level >= 1, level == 2


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
