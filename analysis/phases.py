"""Phases: which part of the program each allocation belongs to.

A training step is a forward pass, a backward pass and an optimizer step; an
evaluation is a forward pass that no backward follows; ``generate()`` decodes
token by token; a CUDA graph capture allocates in a private pool. The OOM's
phase is the first thing a user needs to know (an OOM inside ``optimizer.step()``
is not fixed by a smaller batch), and the causes (``analysis.causes``) read the
phases to tell a leak, an evaluation without ``no_grad`` or the optimizer's
temporaries apart.

Rules, from what the trace shows (docs/report.md, "Phases"):
- *optimizer*: a frame under ``torch/optim/`` with no module call or autograd
  frame inside it, or an allocation without frames inside an ``Optimizer.step``
  annotation window that holds no such closure. The phase is the innermost pass
  that holds the allocation, never the outermost frame: ``optimizer.step(closure)``
  (Lightning's automatic optimization, LBFGS, any optimizer given a closure) runs
  the forward and the backward inside the step, and those allocations are forward
  and backward;
- *backward*: a frame of the autograd engine or ``Tensor.backward``, or (with
  ``stacks="python"``, whose autograd thread records no frames) a frame-less
  allocation right after one (``categories.frameless_backward``);
- *graph capture*: an allocation in a private memory pool (CUDA graphs);
- *decode*: a frame of Hugging Face ``generate()`` (``generation/utils.py``);
- *data loading*: a frame under ``torch/utils/data/`` (a DataLoader, its collate or pin-memory step);
- *forward*: inside an ``nn.Module`` call. Forward allocations form *passes*: a
  pass ends where a backward or optimizer allocation comes, or where the user
  line that called the outermost module changes. A pass that a backward
  follows is a training forward; a pass from a call site that never was is
  *forward without backward* (an evaluation, a metric, inference);
- *other*: the rest (data, the loss, user code outside modules).

Everything is vectorised over the allocations; the per-stack work runs once per
distinct stack.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analysis.categories import frameless_backward, mark_runs
from analysis.model import Frame, StackTable, Trace, sorted_unique
from analysis.stacks import (
    TRAIT_BACKWARD,
    TRAIT_MODULE_FORWARD,
    TRAIT_OPTIMIZER,
    Lifetimes,
    StackCatalog,
    frame_label,
    frame_traits,
    is_user_frame,
)

I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]

PHASES: tuple[str, ...] = (
    "other",
    "forward",
    "backward",
    "optimizer",
    "forward_no_backward",
    "decode",
    "graph_capture",
    "data_loading",
)
OTHER, FORWARD, BACKWARD, OPTIMIZER, FORWARD_NO_BACKWARD, DECODE, GRAPH_CAPTURE, DATA_LOADING = range(len(PHASES))
# How each phase is said on the page and in the headline.
PHASE_WORDS = {
    "other": "outside the model's passes",
    "forward": "the forward pass",
    "backward": "the backward pass",
    "optimizer": "the optimizer step",
    "forward_no_backward": "a forward pass that no backward followed (evaluation or inference)",
    "decode": "generate()'s decoding loop",
    "graph_capture": "a CUDA graph capture (a private memory pool)",
    "data_loading": "data loading (a DataLoader or its collate putting tensors on the GPU)",
}
_MODULE_CALL = frozenset({"_call_impl", "_wrapped_call_impl"})
_GENERATE_PATH = "/generation/utils.py"
_DATA_PATH = "/torch/utils/data/"
# Lightning hands the optimizer a closure (loops/optimization/automatic.py, its precision plugin's
# _wrap_closure): its frames inside torch/optim are the closure's. Other libraries (DeepSpeed, transformers)
# ship optimizers of their own that subclass torch's, so their frames there are no closure.
_TRAINER_PATH = re.compile(r"/(lightning|pytorch_lightning)/")
# Hugging Face's Trainer calls the model itself: training_step and prediction_step, each through compute_loss
# (shared by both, so it tells nothing), or prediction_step directly (real frames: tests/fixtures/diagnosis/
# fw_frames.json of the captures helper, transformers 5.17).
_TRAINER_CALLS_MODEL = re.compile(r"/transformers/trainer[a-z_0-9]*\.py$")
_TRAINER_SHARED = frozenset({"compute_loss"})


def _trainer_calls_model(frame: Frame) -> bool:
    return bool(_TRAINER_CALLS_MODEL.search(frame.filename)) and frame.name not in _TRAINER_SHARED


@dataclass(frozen=True, slots=True)
class ForwardPass:
    """One run of forward allocations from one call site."""

    first: int  # position in the lifetimes of its first allocation
    last: int  # position of its last allocation
    site: str  # the user line that called the outermost module ("" when unknown)
    followed_by_backward: bool
    followed_by: str  # the phase of the next marked allocation ("" at the end of the trace)
    training_site: bool  # some pass from this site was followed by a backward


@dataclass(frozen=True, slots=True)
class Phases:
    """A phase code per allocation (``Lifetimes`` order) and the forward passes."""

    of_alloc: I8
    passes: tuple[ForwardPass, ...]
    has_frames: bool

    def pass_at(self, position: int) -> ForwardPass | None:
        """The forward pass holding the allocation at ``position`` (None outside passes)."""
        lo, hi = 0, len(self.passes)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.passes[mid].last < position:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.passes) and self.passes[lo].first <= position:
            return self.passes[lo]
        return None


def tag_phases(
    trace: Trace,
    lifetimes: Lifetimes,
    catalog: StackCatalog,
    table: StackTable,
    opt_start: I64,
    opt_end: I64,
    *,
    frameless: npt.NDArray[np.bool_] | None = None,
    private: npt.NDArray[np.bool_] | None = None,
    in_window: npt.NDArray[np.bool_] | None = None,
) -> Phases:
    """The phase of every allocation of ``lifetimes``; ``frameless`` is
    ``categories.frameless_backward(lifetimes, catalog)`` where the caller has it already; ``private`` is
    ``categories.private_pool_allocations(lifetimes, trace, final_segments)``, the one rule that knows which
    allocations a private pool made (torch <= 2.11's trace entries carry no ``pool_id``, so ``trace.pool`` alone,
    the fallback without it, is 0 there); ``in_window`` is ``categories.step_windows``' first (which allocations
    an ``Optimizer.step`` window holds), read, not written."""
    n = lifetimes.start.shape[0]
    gids = catalog.groups_of(lifetimes.stack)
    traits = catalog.stack_traits(lifetimes.stack)  # kept by the catalog: the categories read them first
    has_frames = gids != 0
    out = np.full(n, OTHER, np.int8)
    if n == 0:
        return Phases(out, (), False)
    kind, site_of_stack, closure_of_stack = _stack_kinds(table)
    # Per stack id + 1 (0: no stack), so that each is one gather over the allocations.
    row = lifetimes.stack.astype(np.int64) + 1
    stack_kind = np.concatenate((np.zeros(1, kind.dtype), kind))[row]
    in_closure = np.concatenate(([False], closure_of_stack))[row]
    window = None
    if in_window is None:
        window = _window_of(lifetimes.start, opt_start, opt_end)
        in_window = window >= 0
    if in_closure.any() and in_window.any():
        # A step window that ran a closure (a pass inside it) holds the closure's frame-less autograd work too.
        if window is None:
            window = _window_of(lifetimes.start, opt_start, opt_end)
        closure_window = np.zeros(opt_start.shape[0], bool)
        closure_window[window[in_closure & in_window]] = True
        in_window = in_window & ~closure_window[np.maximum(window, 0)]

    # Assigned in order of precedence: a later rule never overrides an earlier one.
    decided = np.zeros(n, bool)

    def assign(mask: npt.NDArray[np.bool_], code: int) -> None:
        nonlocal decided
        m = mask & ~decided
        # Each allocation is decided once, still holding OTHER: adding the difference where m
        # holds is a masked store without its branch per element (several times quicker).
        np.add(out, m.view(np.int8) * np.int8(code - OTHER), out=out)
        decided |= m

    assign(trace.pool[lifetimes.start] != 0 if private is None else private, GRAPH_CAPTURE)
    assign((((traits & TRAIT_OPTIMIZER) != 0) & ~in_closure) | (~has_frames & in_window), OPTIMIZER)
    if frameless is None:
        frameless = frameless_backward(lifetimes, catalog)
    assign(((traits & TRAIT_BACKWARD) != 0) | frameless, BACKWARD)
    assign(stack_kind == _KIND_GENERATE, DECODE)
    assign(stack_kind == _KIND_DATA, DATA_LOADING)
    assign((traits & TRAIT_MODULE_FORWARD) != 0, FORWARD)
    passes = _forward_passes(out, np.concatenate(([-1], site_of_stack)), row, _site_names(table, site_of_stack))
    for p in passes:
        # The trace's last pass has nothing after it: an OOM inside it says nothing about a backward.
        if p.followed_by and not p.followed_by_backward and not p.training_site:
            out[p.first : p.last + 1][out[p.first : p.last + 1] == FORWARD] = FORWARD_NO_BACKWARD
    return Phases(out, tuple(passes), bool(has_frames.any()))


def phase_of_event(phases: Phases, lifetimes: Lifetimes, index: int) -> str:
    """The phase of any event: that of the last allocation at or before it (an OOM's own
    request is made by the code that made the allocations just before it)."""
    k = int(np.searchsorted(lifetimes.start, index, side="right")) - 1
    if k < 0:
        return PHASES[OTHER]
    return PHASES[int(phases.of_alloc[k])]


def live_bytes_by_phase(phases: Phases, lifetimes: Lifetimes, index: int) -> dict[str, int]:
    """Requested bytes live at event ``index``, by the phase that allocated them."""
    live = lifetimes.live_at(index)
    sums = np.bincount(phases.of_alloc[live].astype(np.int64), lifetimes.size[live], len(PHASES))
    return {name: int(sums[k]) for k, name in enumerate(PHASES) if sums[k]}


# ------------------------------------------------------------------ per stack

_KIND_NONE, _KIND_GENERATE, _KIND_DATA = 0, 1, 2


def _stack_kinds(table: StackTable) -> tuple[npt.NDArray[np.int8], I64, npt.NDArray[np.bool_]]:
    """Per stack: whether it runs inside generate(), the id of its *entry site* (the user frame
    that called the outermost module, -1 when it has none), and whether a module call or an
    autograd pass runs inside its optimizer frames (a closure given to ``optimizer.step``)."""
    kinds = np.zeros(max(1, len(table.stacks)), np.int8)
    sites = np.full(max(1, len(table.stacks)), -1, np.int64)
    closure = np.zeros(max(1, len(table.stacks)), bool)
    # Frames are shared by many stacks: each is looked at once.
    generate = {i for i, f in enumerate(table.frames) if f.filename.endswith(_GENERATE_PATH) and f.name == "generate"}
    data = {i for i, f in enumerate(table.frames) if _DATA_PATH in f.filename}
    call = {
        i
        for i, f in enumerate(table.frames)
        if f.name in _MODULE_CALL and f.filename.endswith("torch/nn/modules/module.py")
    }
    # A trainer's frame that calls the model is the site (the user's one line, trainer.train(), runs every pass).
    user = {i for i, f in enumerate(table.frames) if is_user_frame(f) or _trainer_calls_model(f)}
    traits = [frame_traits(f) for f in table.frames]
    optimizer = {i for i, t in enumerate(traits) if t & TRAIT_OPTIMIZER}
    # What a closure runs: a module call, an autograd pass or Lightning's closure (a user's own frame inside
    # the step may be a custom optimizer's, so it alone does not make a closure).
    inner_pass = {
        i
        for i, (f, t) in enumerate(zip(table.frames, traits, strict=True))
        if t & (TRAIT_MODULE_FORWARD | TRAIT_BACKWARD) or _TRAINER_PATH.search(f.filename)
    }
    for sid, frame_ids in enumerate(table.stacks):
        if not optimizer.isdisjoint(frame_ids):
            closure[sid] = _pass_inside_optimizer(frame_ids, optimizer, inner_pass)
        if not generate.isdisjoint(frame_ids):
            kinds[sid] = _KIND_GENERATE
        elif not data.isdisjoint(frame_ids):
            kinds[sid] = _KIND_DATA
        site = _entry_site(frame_ids, call, user)
        if site is not None:
            sites[sid] = site
    return kinds, sites, closure


def _pass_inside_optimizer(frame_ids: tuple[int, ...], optimizer: set[int], inner_pass: set[int]) -> bool:
    """Whether a module call, an autograd frame or a trainer's code comes before (inside) the
    innermost optimizer frame: frames are innermost first."""
    for fid in frame_ids:
        if fid in optimizer:
            return False
        if fid in inner_pass:
            return True
    return False


def _entry_site(frame_ids: tuple[int, ...], call: set[int], user: set[int]) -> int | None:
    """The frame id of the first user frame outside the outermost module call (frames are
    innermost first, so the outermost call is the last module wrapper); ``call`` and ``user``
    are the ids of module-call and user frames (a Trainer's own call of the model counts as the user's)."""
    outer = -1
    for k, fid in enumerate(frame_ids):
        if fid in call:
            outer = k
    if outer < 0:
        return None
    return next((fid for fid in frame_ids[outer + 1 :] if fid in user), None)


def _site_names(table: StackTable, site_of_stack: I64) -> dict[int, str]:
    return {int(fid): frame_label(table.frames[int(fid)]) for fid in sorted_unique(site_of_stack) if fid >= 0}


def _window_of(start: I64, opt_start: I64, opt_end: I64) -> I64:
    """The ``Optimizer.step`` window each allocation is inside (-1: none)."""
    if opt_start.size == 0:
        return np.full(start.shape[0], -1, np.int64)
    # The last window started at or before each allocation, and its end: a value per window repeated over
    # its run of allocations (``categories.step_windows`` likewise).
    runs = mark_runs(opt_start, start, False)
    k = np.repeat(np.arange(-1, opt_start.shape[0], dtype=np.int64), runs)
    last_end = np.repeat(np.concatenate(([-1], opt_end)), runs)
    out: I64 = np.where(start <= last_end, k, -1)
    return out


def _forward_passes(codes: I8, site_of_row: I64, row: I64, names: dict[int, str]) -> list[ForwardPass]:
    """Runs of forward allocations, broken by backward/optimizer allocations and by a change of
    entry site; each with whether a backward comes next. ``site_of_row[row]`` is each allocation's site
    (-1: unknown)."""
    # A graph capture ends a pass too: the eager warm-up before each capture is a pass of its own.
    is_marked = (
        (codes == FORWARD) | (codes == BACKWARD) | (codes == OPTIMIZER) | (codes == DECODE) | (codes == GRAPH_CAPTURE)
    )
    marked = np.flatnonzero(is_marked)
    mc = codes[marked]
    # The forward allocations alone (a fifth of the marked ones on the 460 MB trace): the runs, their sites and
    # what follows them are read off them and their neighbours, where every marked allocation's site carried
    # and compared took most of the tagging's time.
    fw = np.flatnonzero(mc == FORWARD)  # positions among the marked ones
    if fw.size == 0:
        return []
    first_of = marked[fw]  # positions among the allocations
    sites = site_of_row[row[first_of]]
    _carry_known_sites(sites, first_of, lambda: np.where(is_marked, site_of_row[row], -1))
    # A run goes on from one forward allocation to the next marked one while that is forward (the next among
    # the forward ones) at the same site.
    goes_on = (fw[1:] == fw[:-1] + 1) & (sites[1:] == sites[:-1])
    starts = np.flatnonzero(np.r_[True, ~goes_on])
    ends = np.flatnonzero(np.r_[~goes_on, True])
    nxt = fw[ends] + 1  # the marked allocation after each run
    after = np.where(nxt < mc.size, mc[np.minimum(nxt, mc.size - 1)], -1)
    followed = (after == BACKWARD).tolist()
    site_ids = sites[starts].tolist()
    training = {site for site, f in zip(site_ids, followed, strict=True) if f}
    return [
        ForwardPass(
            first=first,
            last=last,
            site=names.get(site, ""),
            followed_by_backward=f,
            followed_by=PHASES[a] if a >= 0 else "",
            training_site=site in training,
        )
        for first, last, site, f, a in zip(
            first_of[starts].tolist(), first_of[ends].tolist(), site_ids, followed, after.tolist(), strict=True
        )
    ]


def _carry_known_sites(sites: I64, at: I64, marked_sites: Callable[[], I64]) -> None:
    """Each unknown site (-1) of ``sites`` (those of the allocations at ``at``, ascending) takes, in place, the last
    known site of a marked allocation before it (the first known one where none is before; it stays -1 where none
    is known). ``marked_sites()``: every allocation's site, -1 where unknown or not marked, made only where a site
    of ``sites`` is unknown. A stack cut short (deep module nesting) loses the frames above the model's call: its
    site is unknown, and it continues the pass it is in rather than starting another."""
    unknown = np.flatnonzero(sites < 0)
    if not unknown.size:
        return
    every = marked_sites()
    known = np.flatnonzero(every >= 0)
    if known.size:
        k = np.searchsorted(known, at[unknown], side="right") - 1
        sites[unknown] = every[known[np.maximum(k, 0)]]


# ------------------------------------------------------------------ the passes, for a follow-up's comparison


FIRST_PASS_SIZES = 2048  # a forward pass's allocations kept in the report (a ResNet-152's pass makes ~1000)


def pass_figures(phases: Phases, lifetimes: Lifetimes, autocast: bool, opt_start: I64) -> dict[str, object]:
    """``devices[].signature`` (issue 33): what a follow-up run compares with its incident to see a batch,
    micro-batches, autocast or an evaluation that stopped keeping activations (``analysis.followup``).

    Per forward pass, the requested bytes its forward allocations asked for (``bytes``: the same ops on a
    batch half the size ask for half, whatever checkpointing frees early) and those still live when the pass
    ends (``kept``: what the pass leaves for a backward, or an evaluation keeps with its graph). Training
    passes (a backward followed) and evaluation passes (none did) apart; ``passes_per_step``: the training
    passes before each ``Optimizer.step`` (gradient accumulation runs several), the median over the steps;
    ``first_pass``: the requested size of each forward allocation of the first training pass (or of the pass
    the trace ends in, ``complete`` false), in order, at most ``FIRST_PASS_SIZES``: the same ops on another
    batch ask for sizes in one ratio, allocation by allocation; ``autocast``: an event of the trace recorded
    under ``torch/amp/autocast_mode.py`` frames (``TRAIT_AUTOCAST``: ``StackCatalog.any_has``)."""
    train: list[list[int]] = []
    evals: list[list[int]] = []
    train_starts: list[int] = []
    first: dict[str, object] | None = None
    # Each pass's own (forward) allocations are a slice [lo, hi) of them all: its sums are differences of
    # running sums, its kept bytes one pass over the slices together (a loop of numpy calls per pass was
    # 0.02 s of the 460 MB report: 1,500 passes).
    passes = phases.passes
    codes = phases.of_alloc
    own = np.flatnonzero((codes == FORWARD) | (codes == FORWARD_NO_BACKWARD))
    firsts = np.fromiter((p.first for p in passes), np.int64, len(passes))
    lasts = np.fromiter((p.last for p in passes), np.int64, len(passes))
    lo, hi = np.searchsorted(own, firsts), np.searchsorted(own, lasts, side="right")
    sizes = lifetimes.size[own].astype(np.int64, copy=False)
    summed = np.concatenate(([0], np.cumsum(sizes)))
    counts = hi - lo
    which = np.repeat(np.arange(len(passes)), counts)
    ends = np.cumsum(counts)
    if len(passes) and lo[0] == 0 and hi[-1] == own.shape[0] and bool((lo[1:] == hi[:-1]).all()):
        # The passes hold every forward allocation, one after the other (as tag_phases makes them): their
        # allocations are ``own`` itself, in order, with no indices to gather them by.
        own_at, sizes_at = own, sizes
    else:
        at = np.arange(int(ends[-1]) if len(passes) else 0) - np.repeat(ends - counts - lo, counts)  # into own
        own_at, sizes_at = own[at], sizes[at]
    still_live = lifetimes.end[own_at] > lifetimes.start[lasts][which]
    kept = np.concatenate(([0], np.cumsum(np.where(still_live, sizes_at, 0))))
    no_backward = np.concatenate(([0], np.cumsum(codes[own] == FORWARD_NO_BACKWARD)))
    rows = zip(
        (summed[hi] - summed[lo]).tolist(),
        (kept[ends] - kept[ends - counts]).tolist(),
        (no_backward[hi] - no_backward[lo] > 0).tolist(),
        strict=True,
    )
    first_starts = lifetimes.start[firsts].tolist()
    for p, a, b, start, (total, kept_bytes, evaluates) in zip(
        passes, lo.tolist(), hi.tolist(), first_starts, rows, strict=True
    ):
        if a == b:
            continue
        row = [total, kept_bytes]
        if first is None and (p.followed_by_backward or not p.followed_by):
            first = {"sizes": sizes[a:b][:FIRST_PASS_SIZES].tolist(), "complete": p.followed_by_backward}
        if p.followed_by_backward:
            train.append(row)
            train_starts.append(start)
        elif evaluates:
            evals.append(row)
    per_step: int | None = None
    if opt_start.size and train_starts:
        # Training passes between one optimizer step and the next (the first step: from the trace's start).
        counts = np.diff(np.searchsorted(np.asarray(train_starts, np.int64), opt_start), prepend=0)
        per_step = int(np.median(counts))
    return {
        "training_passes": train,
        "eval_passes": evals,
        "passes_per_step": per_step,
        "first_pass": first,
        "autocast": autocast,
    }
