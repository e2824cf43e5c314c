"""What kind of memory each allocation is: parameters, gradients, optimizer state,
activations, temporaries, or unknown.

The snapshot records no tensor roles, so each allocation is classified from
its stack (see ``analysis.stacks`` traits) and its lifetime (from the trace's
alloc/free pairs), with the training steps' optimizer windows as landmarks.
Rules, first match wins (docs/report.md lists them with examples):

1. ``optimizer_state``: allocated under ``torch/optim/`` (or, without frames,
   inside an ``Optimizer.step`` annotation) and either made by the state
   initialisation (``_init_group``) or alive after the optimizer step that made
   it ended. Other optimizer allocations are ``temporaries``.
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

import numpy as np
import numpy.typing as npt

from analysis.stacks import (
    TRAIT_ACCUMULATE_GRAD,
    TRAIT_BACKWARD,
    TRAIT_MODULE_APPLY,
    TRAIT_MODULE_FORWARD,
    TRAIT_OPTIMIZER,
    TRAIT_OPTIMIZER_STATE_INIT,
    Lifetimes,
    StackCatalog,
)
from analysis.steps import running_clock

CATEGORIES: tuple[str, ...] = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "unknown",
)
PARAMETERS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, TEMPORARIES, UNKNOWN = range(6)

I64 = npt.NDArray[np.int64]


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
    allocations instead, and a running count spreads them (no binary search per allocation)."""
    at = np.searchsorted(start, marks, side="right" if strict else "left")
    counts = np.zeros(start.shape[0] + 1, np.int64)
    np.add.at(counts, at, 1)
    return np.cumsum(counts[:-1])


def _step_windows(start: I64, opt_start: I64, opt_end: I64, n: int) -> tuple[npt.NDArray[np.bool_], I64, I64, int]:
    """The optimizer step window each allocation falls in or before: (inside one, the end of the one it is
    in (``n`` outside), the start of the next, the first window's start (``n`` without any))."""
    if not opt_start.size:
        return (
            np.zeros(start.shape[0], bool),
            np.full(start.shape[0], n, np.int64),
            np.full(start.shape[0], n, np.int64),
            n,
        )
    k = count_upto(opt_start, start) - 1  # last window started at or before
    in_window = (k >= 0) & (start <= opt_end[np.maximum(k, 0)])
    window_end = np.where(in_window, opt_end[np.maximum(k, 0)], n)
    nxt = count_upto(opt_start, start, strict=True)  # next window starting at or after
    next_opt_start = np.where(nxt < opt_start.size, opt_start[np.minimum(nxt, opt_start.size - 1)], n)
    return in_window, window_end, next_opt_start, int(opt_start[0])


def classify(
    lifetimes: Lifetimes,
    catalog: StackCatalog,
    opt_start: I64,
    opt_end: I64,
    *,
    trace_has_frames: bool,
    frameless: npt.NDArray[np.bool_] | None = None,
) -> npt.NDArray[np.int8]:
    """A category code per allocation of ``lifetimes`` (vectorised, no per-event loop).

    ``frameless`` is ``frameless_backward(lifetimes, catalog)`` where the caller has it already."""
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

    in_window, window_end, next_opt_start, first_opt = _step_windows(start, opt_start, opt_end, n)

    # 1. optimizer: frames under torch/optim, or (without frames) made inside an optimizer step.
    optimizer = ((traits & TRAIT_OPTIMIZER) != 0) | (~has_frames & in_window)
    assign(optimizer & (((traits & TRAIT_OPTIMIZER_STATE_INIT) != 0) | (end > window_end)), OPTIMIZER_STATE)
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
    if opt_start.size:
        # Made before the last optimizer step and alive after it: not a gradient
        # of zero_grad(set_to_none=True) (the default) but a workspace (cuBLAS's),
        # unless the autograd node says it accumulates a .grad.
        persistent = (start < opt_start[-1]) & (end > opt_end[-1])
        assign(backward & persistent & ((traits & TRAIT_ACCUMULATE_GRAD) == 0), UNKNOWN)
    assign(backward & (end >= next_opt_start) & (next_opt_start < n), GRADIENTS)
    assign(backward, TEMPORARIES)

    # 4. forward. Activations die every step; a forward allocation that outlives
    # the last optimizer step after starting before it is a cache or workspace.
    forward = has_frames
    if opt_start.size:
        persistent = (start < opt_start[-1]) & (end > opt_end[-1])
        assign(forward & persistent, UNKNOWN)
    bwd_idx = start[backward]
    if bwd_idx.size:
        # Backward allocations at or before each one: a running count where every start is its own.
        strictly = start.shape[0] < 2 or bool((start[1:] > start[:-1]).all())
        j = np.cumsum(backward) if strictly else np.searchsorted(bwd_idx, start, side="right")
        next_bwd = np.where(j < bwd_idx.size, bwd_idx[np.minimum(j, bwd_idx.size - 1)], n)
        assign(forward & (end > next_bwd) & (next_bwd < n), ACTIVATIONS)
        assign(forward, TEMPORARIES)
    else:
        assign(forward, ACTIVATIONS)
    return out


def frameless_backward(lifetimes: Lifetimes, catalog: StackCatalog) -> npt.NDArray[np.bool_]:
    """Frame-less allocations that belong to a backward pass.

    With stacks="python" the autograd thread records no frames. Such an
    allocation whose nearest earlier framed allocation is the backward's own
    (``Tensor.backward`` -> ``_make_grads``, or an autograd-engine frame) is
    taken to be part of that backward.
    """
    gids = catalog.groups_of(lifetimes.stack)
    has_frames = gids != 0
    if not has_frames.any():
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
