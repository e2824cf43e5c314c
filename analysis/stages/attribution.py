"""Live blocks by stack at the moments that matter (peak, OOM, end), and memory by category at the peak.

``attribute(snapshot, facts, replay, catalog) -> Attribution``: the top stacks at each moment (blocks
without frames told apart where the trace can), the category of every allocation and of every block live
at the peak, private pools apart, and the optimizer windows the phases use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator.recorded import RecordedReplay
from analysis.allocator.states import AllocatorState
from analysis.categories import (
    CATEGORIES,
    PRIVATE_POOLS,
    PrivatePool,
    bytes_by_category,
    classify,
    frameless_backward,
    mark_private_pools,
    optimizer_windows,
    private_pool_allocations,
    private_pools,
    step_windows,
)
from analysis.model import Snapshot
from analysis.stacks import BACKWARD_NO_FRAMES, BEFORE_TRACE, Lifetimes, StackCatalog, top_entries, totals_by_group
from analysis.stages.outline import Facts

I64 = npt.NDArray[np.int64]


TOP_STACKS = 10


@dataclass(frozen=True)
class Moment:
    name: str  # "peak" | "oom" | "end"
    index: int
    state: AllocatorState


@dataclass(frozen=True)
class Attribution:
    """Live blocks by stack at the moments that matter, and memory by category at the peak."""

    moments: tuple[Moment, ...]
    top_stacks: list[dict[str, Any]]
    live: dict[str, tuple[I64, I64, I64]]  # moment -> (stacks, sizes, alloc indices) of live blocks
    codes: npt.NDArray[np.int8]  # category of every allocation
    peak_codes: npt.NDArray[np.int8]  # category of every block live at the peak
    categories: dict[str, int]  # bytes by category at the peak
    pools: tuple[PrivatePool, ...]  # the private pools at the peak
    opt_start: I64
    opt_end: I64
    frameless: npt.NDArray[np.bool_]  # categories.frameless_backward of every allocation
    # categories.step_windows' first of every allocation (inside an optimizer step window): the phases read it. Its
    # other columns (two int64 per allocation: 12.8 MB on the 460 MB trace) are the categories' alone, let go after.
    in_window: npt.NDArray[np.bool_]
    private: npt.NDArray[np.bool_]  # categories.private_pool_allocations: the allocations a private pool made


def attribute(snapshot: Snapshot, facts: Facts, replay: RecordedReplay, catalog: StackCatalog) -> Attribution:
    trace, lifetimes, n = facts.dev.trace, facts.lifetimes, facts.n
    # Moments whose live blocks are attributed to stacks.
    moments = [Moment("peak", replay.peak_allocated_index, replay.blocks_at(replay.peak_allocated_index))]
    if facts.oom_index is not None:
        moments.append(Moment("oom", facts.oom_index, replay.blocks_at(facts.oom_index)))
    moments.append(Moment("end", n - 1, replay.blocks_at(n - 1)))
    own = [a for a in snapshot.annotations if a.device in (facts.dev.device, -1)]
    # Same rule as steps: a device without optimizer marks of its own uses the others'.
    if not any(a.name.startswith("Optimizer.step#") for a in own):
        own = snapshot.annotations
    opt_start, opt_end = optimizer_windows([(a.name, a.stage, a.time_us) for a in own], trace.time_us)
    trace_has_frames = bool((trace.stack >= 0).any())
    # Allocations of the backward pass that the autograd thread left without frames: the categories,
    # the stacks below and the phases (diagnose_device) split them off alike.
    frameless = frameless_backward(lifetimes, catalog)
    # The optimizer windows each allocation is in or before: the categories and the phases read them.
    windows = step_windows(lifetimes.start, opt_start, opt_end, lifetimes.n_events)
    codes = classify(
        lifetimes,
        catalog,
        opt_start,
        opt_end,
        trace_has_frames=trace_has_frames,
        frameless=frameless,
        windows=windows,
    )
    # Computed once: the categories, the phases and the causes (diagnose_device) read the same mask.
    private = private_pool_allocations(lifetimes, trace, facts.dev.segments)
    mark_private_pools(codes, private)
    # A block live before the trace carries the stack of the event that freed it
    # when the final snapshot no longer holds it; with context="all" that is the
    # free site, not the allocation site, so such blocks count as "no frames".
    trusted_pre: set[int] | None = None
    if _frees_record_free_sites(trace, lifetimes):
        trusted_pre = {b.address for _, b in moments[-1].state.live_blocks() if b.alloc_index < 0}
    # Split "no frames" into what is known: blocks from before the trace, and
    # (stacks="python") the backward pass, whose thread records no frames.
    backward_alloc = lifetimes.start[frameless] if trace_has_frames else np.zeros(0, np.int64)
    top_stacks: list[dict[str, Any]] = []
    live: dict[str, tuple[I64, I64, I64]] = {}
    for m in moments:
        live[m.name] = _live_blocks(m.state, trusted_pre)
        top_stacks.extend(_top_stacks_at(m.name, live[m.name], backward_alloc, catalog))
    peak_stacks, peak_sizes, peak_alloc_idx = live["peak"]
    peak_codes = _codes_of_blocks(lifetimes, codes, peak_alloc_idx, peak_stacks, catalog)
    # A block in a private pool's segment is the pool's, whatever made it (blocks from before the trace too).
    peak_codes[_in_private_pools(moments[0].state)] = PRIVATE_POOLS
    categories = bytes_by_category(peak_codes, peak_sizes)
    pools = private_pools(moments[0].state, catalog, snapshot.pools)
    return Attribution(
        tuple(moments),
        top_stacks,
        live,
        codes,
        peak_codes,
        categories,
        pools,
        opt_start,
        opt_end,
        frameless,
        windows[0],
        private,
    )


def _in_private_pools(state: AllocatorState) -> npt.NDArray[np.bool_]:
    """Of the live blocks ``_live_blocks`` lists (its order), those in a private pool's segment."""
    return np.array(
        [seg.pool != 0 for seg in state.segments for b in seg.blocks if b.state == "active_allocated"], bool
    )


def _top_stacks_at(
    when: str, live: tuple[I64, I64, I64], backward_alloc: I64, catalog: StackCatalog
) -> list[dict[str, Any]]:
    """The top groups of stacks among the blocks live at one moment; blocks without frames
    told apart where the trace can (the backward pass, blocks from before the trace)."""
    stacks, sizes, alloc_idx = live
    gids = catalog.groups_of(stacks).astype(np.int64)
    frameless = gids == 0
    if frameless.any():
        gids[frameless & np.isin(alloc_idx, backward_alloc)] = catalog.pseudo_group(BACKWARD_NO_FRAMES)
        gids[frameless & (alloc_idx < 0)] = catalog.pseudo_group(BEFORE_TRACE)
    return top_entries(catalog, totals_by_group(catalog, stacks, sizes, gids), when, TOP_STACKS)


def _frees_record_free_sites(trace: Any, lifetimes: Lifetimes) -> bool:
    """Whether frees carry their own (free-site) stacks, as with context="all"."""
    freed = lifetimes.end < lifetimes.n_events
    n_freed = int(np.count_nonzero(freed))
    if not n_freed:
        return False
    # Every allocation's end looked up (a live one's, n, clipped and then not counted): no gathers of the
    # freed ones first. More than half differ: the same test as the mean of the freed ones' > 0.5. A block
    # of allocations at a time, until the count decides it either way (on the 460 MB trace every free
    # differs: half of its 802k allocations are read).
    differs = seen = 0
    for lo in range(0, freed.shape[0], _FREE_SITES_BLOCK):
        part = slice(lo, lo + _FREE_SITES_BLOCK)
        in_part = freed[part]
        at = trace.stack.take(lifetimes.end[part], mode="clip") != lifetimes.stack[part]
        differs += int(np.count_nonzero(at & in_part))
        seen += int(np.count_nonzero(in_part))
        if 2 * differs > n_freed or 2 * (differs + n_freed - seen) <= n_freed:  # decided
            break
    return 2 * differs > n_freed


_FREE_SITES_BLOCK = 1 << 16  # allocations a block (_frees_record_free_sites)


def _live_blocks(state: AllocatorState, trusted_pre: set[int] | None = None) -> tuple[I64, I64, I64]:
    """Stack ids, block sizes and alloc event indices of the allocated blocks of a state.

    Only ``active_allocated`` blocks count: ``allocated_bytes`` drops at the free
    request, so pending frees are not live bytes. With ``trusted_pre`` given,
    blocks from before the trace keep their stack only if their address is in it.
    """
    stacks: list[int] = []
    sizes: list[int] = []
    alloc_idx: list[int] = []
    for seg in state.segments:
        for b in seg.blocks:
            if b.state == "active_allocated":
                trusted = b.alloc_index >= 0 or trusted_pre is None or b.address in trusted_pre
                stacks.append(b.stack if trusted else -1)
                sizes.append(b.size)
                alloc_idx.append(b.alloc_index)
    return np.array(stacks, np.int64), np.array(sizes, np.int64), np.array(alloc_idx, np.int64)


def _codes_of_blocks(
    lifetimes: Lifetimes, codes: npt.NDArray[np.int8], alloc_idx: I64, stacks: I64, catalog: StackCatalog
) -> npt.NDArray[np.int8]:
    """Category of each live block, through its alloc event; blocks from before the
    trace are classified by their stack alone."""
    out = np.full(alloc_idx.shape[0], CATEGORIES.index("unknown"), np.int8)
    if lifetimes.start.size:
        pos = np.searchsorted(lifetimes.start, alloc_idx)
        pos_c = np.minimum(pos, lifetimes.start.size - 1)
        found = (alloc_idx >= 0) & (lifetimes.start[pos_c] == alloc_idx)
        out[found] = codes[pos_c[found]]
    else:
        found = np.zeros(alloc_idx.shape[0], bool)
    pre = ~found
    if pre.any():
        fake = Lifetimes(
            start=np.full(int(pre.sum()), -1, np.int64),
            end=np.full(int(pre.sum()), lifetimes.n_events, np.int64),
            addr=np.zeros(int(pre.sum()), np.int64),
            size=np.zeros(int(pre.sum()), np.int64),
            stack=stacks[pre].astype(np.int32),
            n_events=lifetimes.n_events,
        )
        empty = np.zeros(0, np.int64)
        out[pre] = classify(fake, catalog, empty, empty, trace_has_frames=False)
    return out
