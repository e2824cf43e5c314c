"""What kind of memory each allocation is: parameters, gradients, optimizer state,
activations, temporaries, private pools, or unknown.

The snapshot records no tensor roles, so each allocation is classified from
its stack (see ``analysis.stacks`` traits) and its lifetime (from the trace's
alloc/free pairs), with the training steps' optimizer windows as landmarks.
Rules, first match wins (docs/report.md lists them with examples):

0. ``private_pools``: allocated in a private pool (a CUDA graph's, a
   ``torch.cuda.MemPool``, a server's cache in its pool): the trace's ``pool_id``
   where its events carry one, else the address inside a private-pool segment of
   the final snapshot made before the allocation (``private_pool_allocations``).
   What a graph captured is its pool's, not activations of a training step.
1. ``optimizer_state``: allocated under ``torch/optim/`` (or, without frames,
   inside an ``Optimizer.step`` annotation) and either made by the state
   initialisation (``_init_group``) or alive after the optimizer step that made
   it ended. Other optimizer allocations are ``temporaries``. The innermost pass
   wins, as in ``analysis.phases``: a module call or an autograd pass under the
   optimizer's frames is a closure given to ``optimizer.step`` (Lightning's
   automatic optimization, LBFGS), and its allocations are the forward's and the
   backward's (rules 3-4), as are the frame-less ones inside a step window that
   ran such a closure.
2. ``parameters``: allocated by ``Module._apply`` (``.cuda()``, ``.to()``), or
   allocated before the first optimizer step began and alive after the last one
   ended, by code outside module forwards and backward (or, in a trace without
   any frames, by anything).
3. Backward allocations: stacks through the autograd engine or
   ``Tensor.backward``, or - when the trace has frames but ``stacks="python"``
   left the autograd thread's allocations without any - frame-less allocations
   inside a training step before its optimizer step. They are ``gradients`` when
   they survive until the optimizer step starts (``.grad`` tensors live until
   ``zero_grad``), else ``temporaries``; those made before the last optimizer
   step and alive after it are ``unknown`` (a library workspace; gradients kept
   by ``zero_grad(set_to_none=False)`` land here too unless an
   ``AccumulateGrad`` frame names them).
4. Forward allocations (any other allocation with frames): ``unknown`` when
   they outlive every optimizer step (a workspace or cache, e.g. cuBLAS's);
   ``activations`` when
   they live until a backward allocation happens after them (saved for
   backward) or the trace has no backward at all (inference), else
   ``temporaries``.
5. Anything else (no frames, no landmarks) is ``unknown``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator.states import AllocatorState
from analysis.model import ACTIVE_ALLOCATED, INACTIVE, SEGMENT_ALLOC, SEGMENT_MAP, Frame, Segment, Trace
from analysis.stacks import (
    TRAIT_ACCUMULATE_GRAD,
    TRAIT_BACKWARD,
    TRAIT_MODULE_APPLY,
    TRAIT_MODULE_FORWARD,
    TRAIT_OPTIMIZER,
    TRAIT_OPTIMIZER_STATE_INIT,
    Lifetimes,
    StackCatalog,
    Traits,
)
from analysis.steps import running_clock

CATEGORIES: tuple[str, ...] = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "unknown",
    "private_pools",
)
# Codes index CATEGORIES; a new category goes at the end (stored codes keep their meaning).
PARAMETERS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, TEMPORARIES, UNKNOWN, PRIVATE_POOLS = range(7)

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


def optimizer_windows(annotations: list[tuple[str, str, int]], time_us: I64) -> tuple[I64, I64]:
    """Event-index windows ``[start, end]`` of ``Optimizer.step`` annotations.

    ``annotations`` are ``(name, stage, time_us)`` of one device.
    """
    if time_us.size == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty
    times = running_clock(time_us)
    starts, ends = [], []
    open_start: int | None = None
    # Sorting is stable: the marks alone sort as they would among the others.
    marks = [(stage, t) for name, stage, t in annotations if name.startswith("Optimizer.step#")]
    for stage, t in sorted(marks, key=lambda a: a[1]):
        if stage == "START":
            open_start = t
        elif stage == "END" and open_start is not None:
            starts.append(open_start)
            ends.append(t)
            open_start = None
    if not starts:
        empty = np.zeros(0, np.int64)
        return empty, empty
    s = np.searchsorted(times, np.asarray(starts, np.int64), side="left")
    e = np.searchsorted(times, np.asarray(ends, np.int64), side="right") - 1
    return s.astype(np.int64), e.astype(np.int64)


def count_upto(marks: I64, start: I64, *, strict: bool = False) -> I64:
    """For each of ``start`` (ascending), how many ``marks`` (ascending) are at or before it, or
    before it when ``strict``: ``np.searchsorted(marks, start, side="right"/"left")``.

    Few marks (optimizer windows) against a million allocations: each mark is found among the
    allocations instead, and each count repeated over its run of them (no binary search per allocation)."""
    return np.repeat(np.arange(marks.shape[0] + 1, dtype=np.int64), mark_runs(marks, start, strict))


def mark_runs(marks: I64, start: I64, strict: bool) -> I64:
    """How many of ``start`` (ascending) have 0, 1, ..., ``len(marks)`` of ``marks`` (ascending) at or
    before them (before them when ``strict``): ``count_upto``'s runs, for a value per mark repeated."""
    at = np.searchsorted(start, marks, side="right" if strict else "left")
    runs: I64 = np.diff(at, prepend=0, append=start.shape[0])
    return runs


StepWindows = tuple[Mask, I64, I64, int]


def step_windows(start: I64, opt_start: I64, opt_end: I64, n: int) -> StepWindows:
    """The optimizer step window each allocation (``start``, ascending) falls in or before: (inside one, the end
    of the last one started at or before it (-1: none), the start of the next, the first window's start (``n``
    without any)). The attribution makes them once for the categories and the phases (``analysis.phases``
    reads the first)."""
    if not opt_start.size:
        return (
            np.zeros(start.shape[0], bool),
            np.full(start.shape[0], -1, np.int64),
            np.full(start.shape[0], n, np.int64),
            n,
        )
    # Per allocation, the end of the last window started at or before it (-1: none) and the start of the
    # next one starting at or after it (n: none), each a value per window repeated over its allocations.
    last_end = np.repeat(np.concatenate(([-1], opt_end)), mark_runs(opt_start, start, False))
    in_window = start <= last_end
    next_opt_start = np.repeat(np.concatenate((opt_start, [n])), mark_runs(opt_start, start, True))
    return in_window, last_end, next_opt_start, int(opt_start[0])


def classify(
    lifetimes: Lifetimes,
    catalog: StackCatalog,
    opt_start: I64,
    opt_end: I64,
    *,
    trace_has_frames: bool,
    frameless: npt.NDArray[np.bool_] | None = None,
    windows: StepWindows | None = None,
) -> npt.NDArray[np.int8]:
    """A category code per allocation of ``lifetimes`` (vectorised, no per-event loop): rules 1-5.

    ``frameless`` is ``frameless_backward(lifetimes, catalog)`` and ``windows`` ``step_windows(lifetimes.start,
    opt_start, opt_end, lifetimes.n_events)`` where the caller has them already."""
    n = lifetimes.n_events
    start, end = lifetimes.start, lifetimes.end
    traits = catalog.stack_traits(lifetimes.stack)
    has_frames = catalog.groups_of(lifetimes.stack) != 0
    out = np.full(start.shape[0], UNKNOWN, np.int8)
    decided = np.zeros(start.shape[0], bool)

    def assign(mask: npt.NDArray[np.bool_], code: int) -> None:
        nonlocal decided
        m = mask & ~decided
        # Each allocation is decided once, still holding UNKNOWN: adding the difference where m
        # holds is a masked store without its branch per element (several times quicker).
        np.add(out, m.view(np.int8) * np.int8(code - UNKNOWN), out=out)
        decided |= m

    windows = windows if windows is not None else step_windows(start, opt_start, opt_end, n)
    in_window, last_end, next_opt_start, first_opt = windows
    # 1. optimizer: frames under torch/optim, or (without frames) made inside an optimizer step; never a pass
    # that runs inside the step (a closure's forward or backward: the innermost pass wins).
    optimizer = _optimizer_allocations(traits, has_frames, in_window, start, opt_start, opt_end)
    # Outliving the step window it was made in (none outside one).
    assign(optimizer & (((traits & TRAIT_OPTIMIZER_STATE_INIT) != 0) | (in_window & (end > last_end))), OPTIMIZER_STATE)
    assign(optimizer, TEMPORARIES)

    # 2. parameters: Module._apply, or made before the first optimizer step and
    # alive after the last one ended.
    backward_trait = (traits & TRAIT_BACKWARD) != 0
    assign((traits & TRAIT_MODULE_APPLY) != 0, PARAMETERS)
    forward_trait = (traits & TRAIT_MODULE_FORWARD) != 0
    if opt_start.size:
        last_opt_end = int(opt_end[-1])
        # With frames, only code outside module forwards/backward qualifies (a forward
        # that allocates once and keeps it is a library workspace, not a parameter);
        # frame-less allocations qualify only when the whole trace has no frames.
        eligible = (has_frames & ~forward_trait & ~backward_trait) | (~has_frames & (not trace_has_frames))
        assign((start < first_opt) & (end > last_opt_end) & eligible, PARAMETERS)

    # 3. backward. With stacks="python" the autograd thread records no frames; a
    # frame-less allocation whose nearest earlier framed allocation is the
    # backward's own (Tensor.backward -> _make_grads) belongs to the backward.
    backward = backward_trait.copy()
    if trace_has_frames:
        backward |= frameless_backward(lifetimes, catalog) if frameless is None else frameless
    backward &= ~decided
    # Made before the last optimizer step and alive after it (rules 3 and 4 ask it).
    persistent = (start < opt_start[-1]) & (end > opt_end[-1]) if opt_start.size else None
    if persistent is not None:
        # Backward's: not a gradient of zero_grad(set_to_none=True) (the default) but a workspace
        # (cuBLAS's), unless the autograd node says it accumulates a .grad.
        assign(backward & persistent & ((traits & TRAIT_ACCUMULATE_GRAD) == 0), UNKNOWN)
    assign(backward & (end >= next_opt_start) & (next_opt_start < n), GRADIENTS)
    assign(backward, TEMPORARIES)

    # 4. forward. Activations die every step; a forward allocation that outlives
    # the last optimizer step after starting before it is a cache or workspace.
    forward = has_frames
    if persistent is not None:
        assign(forward & persistent, UNKNOWN)
    if backward.any():
        next_bwd = next_marked(start, backward, n)
        # (an end is at most n: outliving the next backward allocation says there is one)
        assign(forward & (end > next_bwd), ACTIVATIONS)
        assign(forward, TEMPORARIES)
    else:
        assign(forward, ACTIVATIONS)
    return out


def next_marked(start: I64, marked: Mask, n: int) -> I64:
    """Per allocation (``start`` ascending), the start of the first ``marked`` allocation after it (``n``: none)."""
    at = start[marked]
    if not at.size:
        return np.full(start.shape[0], n, np.int64)
    if start.shape[0] < 2 or bool((start[1:] > start[:-1]).all()):
        # Every start its own: each marked start holds from the marked one before it (itself included) up
        # to its own position, a value per marked allocation repeated (a running count and a gather over
        # every allocation took three times as long).
        pos = np.flatnonzero(marked)
        runs = np.empty(pos.shape[0] + 1, np.intp)  # the gaps between the marked ones, written in place
        runs[0], runs[-1] = pos[0], start.shape[0] - pos[-1]
        np.subtract(pos[1:], pos[:-1], out=runs[1:-1])
        out: I64 = np.repeat(np.append(at, n).astype(np.int64, copy=False), runs)
        return out
    j = np.searchsorted(at, start, side="right")
    return np.where(j < at.size, at[np.minimum(j, at.size - 1)], n).astype(np.int64, copy=False)


def closure_pass(traits: Traits) -> npt.NDArray[np.bool_]:
    """Allocations (by their stack's traits) of a pass run inside ``optimizer.step(closure)``: optimizer frames
    with a module call or an autograd frame in the same stack. An optimizer never calls a module or the
    autograd engine itself, so the pass is the innermost of the two (``analysis.phases`` reads the frames'
    order for the same rule, and Lightning's closure frames besides)."""
    a_pass = (traits & (TRAIT_MODULE_FORWARD | TRAIT_BACKWARD)) != 0
    out: npt.NDArray[np.bool_] = ((traits & TRAIT_OPTIMIZER) != 0) & a_pass
    return out


def _optimizer_allocations(
    traits: Traits, has_frames: Mask, in_window: Mask, start: I64, opt_start: I64, opt_end: I64
) -> Mask:
    """Rule 1's allocations: the optimizer's frames without a closure's pass inside them, and the frame-less
    ones inside a step window that ran no closure."""
    closure = closure_pass(traits)
    frameless_in_step = ~has_frames & in_window & ~_closure_windows(start, opt_start, opt_end, closure)
    out: Mask = (((traits & TRAIT_OPTIMIZER) != 0) & ~closure) | frameless_in_step
    return out


def _closure_windows(start: I64, opt_start: I64, opt_end: I64, closure: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Per allocation, whether it lies in an ``Optimizer.step`` window that ran a closure's pass: the
    frame-less allocations there are the closure's autograd work, not the step's."""
    if not opt_start.size or not closure.any():
        return np.zeros(start.shape[0], bool)
    k = count_upto(opt_start, start) - 1
    inside = (k >= 0) & (start <= opt_end[np.maximum(k, 0)])
    ran = np.zeros(opt_start.shape[0], bool)
    ran[k[inside & closure]] = True
    out: npt.NDArray[np.bool_] = inside & ran[np.maximum(k, 0)]
    return out


def mark_private_pools(codes: npt.NDArray[np.int8], private: Mask) -> None:
    """Rule 0, before every other: an allocation made in a private pool (``private_pool_allocations``)
    is the pool's, whatever its stack and lifetime say (a captured graph's tensors are not activations)."""
    codes[private] = PRIVATE_POOLS


def frameless_backward(lifetimes: Lifetimes, catalog: StackCatalog) -> npt.NDArray[np.bool_]:
    """Frame-less allocations that belong to a backward pass.

    With stacks="python" the autograd thread records no frames. Such an
    allocation whose nearest earlier framed allocation is the backward's own
    (``Tensor.backward`` -> ``_make_grads``, or an autograd-engine frame) is
    taken to be part of that backward.
    """
    gids = catalog.groups_of(lifetimes.stack)
    has_frames = gids != 0
    if not has_frames.any() or has_frames.all():  # nothing framed to follow, or nothing frame-less
        return np.zeros(gids.shape[0], bool)
    # The allocations are in trace order: the nearest earlier framed one is the last framed
    # position so far (a running maximum), no search needed.
    last_framed = np.maximum.accumulate(np.where(has_frames, np.arange(gids.shape[0], dtype=np.int32), -1))
    backward_group = (catalog.traits & TRAIT_BACKWARD) != 0
    prev_is_backward = (last_framed >= 0) & backward_group[gids[np.maximum(last_framed, 0)]]
    out: npt.NDArray[np.bool_] = ~has_frames & prev_is_backward
    return out


def bytes_by_category(codes: npt.NDArray[np.int8], sizes: I64) -> dict[str, int]:
    sums = np.zeros(len(CATEGORIES), np.int64)
    np.add.at(sums, codes.astype(np.int64), np.asarray(sizes, np.int64))
    return {name: int(sums[i]) for i, name in enumerate(CATEGORIES)}


def private_pool_allocations(lifetimes: Lifetimes, trace: Trace, final: list[Segment]) -> Mask:
    """Which allocations were made in a private pool.

    The trace's ``pool`` column says so where events carry a ``pool_id``; torch <= 2.11's do not, so
    there an allocation is a pool's when its address lies in a private-pool segment of the final
    snapshot (whose ``pool`` is always recorded) and it came after that segment was made (its last
    ``segment_alloc``/``segment_map`` at the segment's address; before the trace: -1). A graph's pool
    lives as long as its graph: pools freed before the dump are not known this way.
    """
    start = lifetimes.start
    out: Mask = trace.pool[start] != 0 if start.size else np.zeros(0, bool)
    private = sorted((s.address, s.address + s.total_size) for s in final if s.pool != 0)
    if not private or not start.size:
        return out
    addr = lifetimes.addr  # gathered when first read (stacks.Lifetimes): only where a private segment is
    lo = np.array([p[0] for p in private], np.int64)
    hi = np.array([p[1] for p in private], np.int64)
    made = np.full(lo.shape[0], -1, np.int64)
    created = np.flatnonzero((trace.action == SEGMENT_ALLOC) | (trace.action == SEGMENT_MAP))
    at = np.searchsorted(lo, trace.addr[created])
    hit = (at < lo.shape[0]) & (lo[np.minimum(at, lo.shape[0] - 1)] == trace.addr[created])
    np.maximum.at(made, at[hit], created[hit])  # the last making of each segment's address
    k = np.searchsorted(lo, addr, side="right") - 1
    kc = np.maximum(k, 0)
    inside = (k >= 0) & (addr < hi[kc]) & (start > made[kc])
    return out | inside


@dataclass(frozen=True, slots=True)
class PrivatePool:
    """One private pool at a moment: what it reserved and held, and what made it."""

    pool: int  # ordinal into Snapshot.pools
    pool_id: tuple[int, int]
    reserved_bytes: int  # its segments
    allocated_bytes: int  # its live blocks
    origin: str  # one of POOL_ORIGINS
    made_by: str  # the label of the stack that made most of its segments ("" without frames)

    @property
    def label(self) -> str:
        where = f" at {self.made_by}" if self.made_by else ""
        return f"pool {self.pool_id[0]},{self.pool_id[1]}: {POOL_ORIGINS[self.origin]}{where}"

    def to_json(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "pool_id": list(self.pool_id),
            "reserved_bytes": self.reserved_bytes,
            "allocated_bytes": self.allocated_bytes,
            "origin": self.origin,
            "made_by": self.made_by,
            "label": self.label,
        }


# How a private pool came to be, told from its stacks' frames and its id (torch's MemPool ids: a graph
# captured without a pool gets ``(uuid, 0)``; ``graph_pool_handle()`` and ``torch.cuda.MemPool()`` give
# ``(0, uid)``).
POOL_ORIGINS = {
    "compile": "CUDA graphs of torch.compile (mode='reduce-overhead')",
    "server": "an inference server's pool (its KV cache or CUDA graphs)",
    "cuda_graph": "a CUDA graph capture",
    "mem_pool": "a shared graph pool or torch.cuda.MemPool",
}
_SERVER_DIRS = ("/vllm/", "/sglang/", "/tensorrt_llm/", "/lmdeploy/")


def pool_origin_of(frames: list[Frame], pool_id: tuple[int, int]) -> str:
    """``POOL_ORIGINS`` key of a pool whose stacks hold ``frames``."""
    names = [f.filename.replace("\\", "/") for f in frames]
    if any("cudagraph_trees" in n or "/_inductor/" in n for n in names):
        return "compile"
    if any(d in n for n in names for d in _SERVER_DIRS):
        return "server"
    if any(n.endswith("torch/cuda/graphs.py") for n in names) or (pool_id[0] != 0 and pool_id[1] == 0):
        return "cuda_graph"
    return "mem_pool"


def private_pools(
    state: AllocatorState, catalog: StackCatalog, pool_ids: list[tuple[int, int]]
) -> tuple[PrivatePool, ...]:
    """The private pools of a state (segments in a pool other than the default one), largest first."""
    reserved: dict[int, int] = {}
    allocated: dict[int, int] = {}
    made: dict[int, dict[int, int]] = {}  # pool -> stack group -> segment bytes
    frames: dict[int, list[Frame]] = {}
    for seg in state.segments:
        if seg.pool == 0:
            continue
        reserved[seg.pool] = reserved.get(seg.pool, 0) + seg.total_size
        allocated[seg.pool] = allocated.get(seg.pool, 0) + sum(
            b.size for b in seg.blocks if b.state == ACTIVE_ALLOCATED
        )
        groups = made.setdefault(seg.pool, {})
        stacks = [seg.stack] + [b.stack for b in seg.blocks if b.state != INACTIVE]
        for gid in catalog.groups_of(np.array(stacks, np.int64)).tolist():
            frames.setdefault(seg.pool, []).extend(catalog.groups[gid].frames)
        gid = int(catalog.groups_of(np.array([seg.stack], np.int64))[0])
        groups[gid] = groups.get(gid, 0) + seg.total_size
    out = []
    for pool, size in reserved.items():
        best = max(made[pool].items(), key=lambda kv: (kv[1], -kv[0]))[0]
        pid = pool_ids[pool] if pool < len(pool_ids) else (0, pool)
        label = catalog.groups[best].label if best != 0 else ""
        out.append(PrivatePool(pool, pid, size, allocated[pool], pool_origin_of(frames.get(pool, []), pid), label))
    return tuple(sorted(out, key=lambda p: (-p.reserved_bytes, p.pool)))
