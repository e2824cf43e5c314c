"""The rest of the failing step, projected from the steps before it.

A trace that ends in an OOM stops at the failing request: what the step would
have asked for next is not recorded. A what-if that only asks "does the failing
request fit" answers the wrong question (real runs: ``gpu_grow_oom`` under
``expandable_segments`` got four allocations further and died in the same step).
Training steps repeat, so the rest of the failing step is taken from an earlier
step ("the template"), scaled by what grew:

1. **Alignment.** The failing step's allocations before the OOM are compared,
   in order, by stack with each earlier complete step's first allocations; the
   latest step whose allocation stacks start exactly like the failing step's is
   the template (without frames every stack is -1 and only the counts align).
   Failing that, the stack sequences are aligned with ``difflib`` (a step 0 with
   warm-up allocations, a data-dependent branch) and the best-aligned step is
   taken if it pairs at least ``MIN_ALIGNMENT`` of the failing step's
   allocations. The OOM request stands for the template's allocation as many
   places after the last paired one as it came after its own.
2. **Sizes.** The allocations before the OOM pair each template size with the
   failing step's size. A tail allocation keeps its template size when that size
   did not change since the nearest earlier step of another shape (weights'
   gradients, workspaces, buffers that stopped growing at a cap); else a template size seen among the pairs takes the
   paired size (backward buffers have the shapes of forward ones); else it is
   scaled by the size-weighted ratio of the pairs that changed.
3. **Frees.** A free in the template's tail frees the projected block it
   allocated, or the failing run's counterpart (same ordinal in the same step,
   or in the step as many steps back) if that block is still live at the OOM.
   Deferred frees (``record_stream``) are taken as freed at ``free_requested``.

``step_need_bytes`` is the peak of live memory over the failing step with no
fragmentation at all: blocks at their rounded request sizes (the recorded
settings' ``round_size``), over the real part and the projected tail.

The projection needs steps, an OOM inside the step after the last complete one,
a complete trace, and an earlier step that aligns; otherwise ``reason`` says
which was missing and no what-if reports ``step_completes``. The what-if that
replays the failing step with its projected tail is ``stepwhatif.step_whatif``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator import ProjectedTail
from analysis.allocator.config import AllocatorConfig
from analysis.model import ALLOC, FREE_COMPLETED, FREE_REQUESTED, Trace
from analysis.stacks import Lifetimes, alloc_lifetimes
from analysis.steps import Steps

I64 = npt.NDArray[np.int64]

# Steps looked at, newest first, when searching for a template (and for steps of
# other shapes that tell constant sizes from growing ones).
MAX_TEMPLATE_STEPS = 16
# Without an exact match, the allocation stacks are aligned as sequences (difflib, quadratic
# at worst: only for steps up to this many allocations) and the best-aligned step is taken
# if it pairs at least this share of the failing step's allocations.
FUZZY_MAX_ALLOCS = 5000
MIN_ALIGNMENT = 0.75
# The backtest (the last complete step projected the same way) must get that step's need
# within this share, else the steps do not repeat and no step-level answer is given.
MAX_BACKTEST_ERROR = 0.05
# ... and the bytes the rest of that step allocates within this share (on the H200 bench: at
# most 9% on real models, BERT's varying lengths; 25% and more on random request streams).
MAX_BACKTEST_BYTES_ERROR = 0.15
# With a single complete step there is no backtest; its allocations of REPEAT_MIN_BYTES or more must
# then mostly repeat a size within the step (bench: 96-100% on BERT, HF GPT-2, ResNet-50; 0% on random).
REPEAT_MIN_BYTES = 1 << 20
MIN_REPEATED_SHARE = 0.5
# A paired size "changed by the common ratio" within this share of it; the failing step (and
# each backtested one) is like its template when at least MIN_COHERENT of the changed bytes did
# (bench: 0.93-1.0 on every model family whose steps repeat, 0.0 on T5's independent lengths).
RATIO_TOLERANCE = 0.1
MIN_COHERENT = 0.8
# Complete steps backtested, newest first, each projected from the steps before it. Three (the
# newest and two older, from step 1 on) refused two right answers of the bench (llama_c80 from its
# roundup run) and no wrong one: the newest alone, with the likeness check on it.
BACKTEST_STEPS = 1


def _fuzzy_alignment(prefix: list[int], template: list[int]) -> tuple[dict[int, int], int, float] | None:
    """(template ordinal -> prefix ordinal, the template ordinal of the OOM request, share paired)."""
    import difflib

    m = len(prefix)
    if m == 0:
        return {}, 0, 1.0
    blocks = difflib.SequenceMatcher(None, prefix, template, autojunk=False).get_matching_blocks()
    pairing = {b + j: a + j for a, b, size in blocks for j in range(size)}
    if not pairing:
        return None
    last_t = max(pairing)
    # The OOM request comes as many allocations after the last paired one as in the prefix.
    pos = last_t + (m - pairing[last_t])
    return pairing, pos, len(pairing) / m


@dataclass
class Projection:
    """The failing step: its real part, the projected tail, and what it needs."""

    available: bool
    reason: str = ""
    step: int = -1  # index of the failing step (the one after the last complete step)
    first_event: int = -1
    oom_event: int = -1
    template_step: int = -1
    matched_allocs: int = 0  # allocations of the failing step before the OOM request
    template_allocs: int = 0  # allocations of the whole template step
    ratio: float = 1.0  # size-weighted growth of the paired sizes that changed
    coherent: float = 1.0  # share of the changed paired bytes that changed by that ratio
    alignment: float = 1.0  # share of the failing step's allocations paired with the template's
    backtest_step: int | None = None
    backtest_error: float | None = None  # (projected - real) / real need of the backtest step
    backtest_sizes_exact: float | None = None  # share of the backtest's allocation sizes projected exactly
    backtest_bytes_error: float | None = None  # (projected - real) / real bytes the rest of that step allocated
    sizes_kept: int = 0
    sizes_paired: int = 0
    sizes_scaled: int = 0
    step_need_bytes: int = 0
    tail: ProjectedTail | None = None
    # For request j of the tail: the template event it copies (request 0: the OOM's counterpart).
    template_event: list[int] = field(default_factory=list)
    # For request j of the tail: its allocation ordinal in the step (-1 for frees).
    ordinal: list[int] = field(default_factory=list)
    # The least request the OOM entry (rounded under the recorded settings) may stand for, where the
    # recorded rounding hides more than 512 B of it and no like request of the template told it; None
    # where the entry is the request (``least_request``).
    oom_request_low: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"available": self.available, "reason": self.reason}
        if self.available:
            out.update(
                {
                    "step": self.step,
                    "first_event": self.first_event,
                    "template_step": self.template_step,
                    "allocations_before_oom": self.matched_allocs,
                    "allocations_in_step": self.template_allocs,
                    "projected_requests": len(self.tail.alloc) if self.tail else 0,
                    "growth_ratio": round(self.ratio, 4),
                    # How alike the failing step is to template_step: the share of the changed bytes
                    # that changed by growth_ratio (MIN_COHERENT or more, else no projection).
                    "template_coherence": round(self.coherent, 4),
                    "alignment": self.alignment,
                    "sizes_kept": self.sizes_kept,
                    "sizes_paired": self.sizes_paired,
                    "sizes_scaled": self.sizes_scaled,
                    "backtest_step": self.backtest_step,
                    "backtest_error": None if self.backtest_error is None else round(self.backtest_error, 4),
                    "backtest_sizes_exact": None
                    if self.backtest_sizes_exact is None
                    else round(self.backtest_sizes_exact, 4),
                    "backtest_bytes_error": None
                    if self.backtest_bytes_error is None
                    else round(self.backtest_bytes_error, 4),
                }
            )
        return out


def _unavailable(reason: str) -> Projection:
    return Projection(False, reason)


def project_failing_step(
    trace: Trace,
    steps: Steps,
    oom_index: int,
    recorded: AllocatorConfig,
    *,
    trace_complete: bool,
    lifetimes: Lifetimes | None = None,
) -> Projection:
    """Project the rest of the step the OOM at ``oom_index`` ended (see the module docstring)."""
    if len(steps) == 0:
        return _unavailable("the trace has no steps (no ProfilerStep or Optimizer.step annotations)")
    if not trace_complete:
        return _unavailable("the trace does not start from an empty allocator, so the failing step's state is unknown")
    first = int(steps.last_event[-1]) + 1
    if oom_index < first:
        return _unavailable("the OOM is not in the step after the last complete one")
    act = trace.action
    has_fr = bool((act == FREE_REQUESTED).any())
    free_action = FREE_REQUESTED if has_fr else FREE_COMPLETED
    if lifetimes is None or not has_fr:
        # Without free_requested events (skip_actions) the free of a block is its free_completed.
        a = act if has_fr else np.where(act == FREE_COMPLETED, FREE_REQUESTED, act).astype(act.dtype)
        lifetimes = alloc_lifetimes(a, trace.addr, trace.size, trace.stack)

    projection = _project(trace, steps, lifetimes, free_action, recorded, len(steps), first, oom_index)
    if not projection.available:
        return projection
    if len(steps) < 2:
        # One step before: nothing to backtest on. A model's step repeats its own shapes (layers,
        # forward and backward); a stream whose sizes never repeat cannot be projected.
        k = projection.template_step
        lo, hi = int(steps.first_event[k]), int(steps.last_event[k])
        sizes = trace.size[lo + np.flatnonzero(act[lo : hi + 1] == ALLOC)]
        big = sizes[sizes >= REPEAT_MIN_BYTES]
        _, counts = np.unique(big, return_counts=True)
        share = float(counts[counts >= 2].sum()) / max(1, big.size)
        if share < MIN_REPEATED_SHARE:
            projection.available = False
            projection.reason = (
                f"only one step before the failing one, and it does not repeat its own shapes ({share:.0%} of its "
                "allocations of 1 MiB or more share a size with another): nothing to project the rest from"
            )
        return projection
    if projection.coherent < MIN_COHERENT:
        return _unlike(
            projection,
            f"the steps do not repeat, the failing one is unlike those before it: only {projection.coherent:.0%} "
            "of the bytes that "
            f"changed against step {projection.template_step} changed by one ratio (micro-batches of their own "
            "lengths, or shapes that do not scale together): the rest of the step cannot be projected",
        )
    # Backtests: the same method on each of the last complete steps (up to BACKTEST_STEPS), each
    # projected from the steps before it and cut at the same allocation, against what it really
    # needed. Steps that do not repeat (random workloads, shapes that vary from step to step)
    # fail one of them; the newest one's figures are reported. Older ones are projected from
    # step 1 on: step 0 warms up (optimizer state, first workspaces) and is unlike the rest.
    for k, last in enumerate(range(len(steps) - 1, max(0, len(steps) - 1 - BACKTEST_STEPS), -1)):
        if k > 0 and last < 2:
            break  # step 1 from step 0 (warm-up: optimizer state, first workspaces) only as the newest
        failed = _backtest(trace, steps, lifetimes, free_action, recorded, projection, last, newest=k == 0)
        if failed:
            return _unlike(projection, failed)
    return projection


def _unlike(projection: Projection, reason: str) -> Projection:
    projection.available = False
    projection.reason = reason
    return projection


def _backtest(
    trace: Trace,
    steps: Steps,
    lifetimes: Lifetimes,
    free_action: int,
    recorded: AllocatorConfig,
    projection: Projection,
    last: int,
    *,
    newest: bool,
) -> str:
    """Project complete step ``last`` from the steps before it, cut at the failing step's
    allocation; '' when it comes out close enough, else why not. ``newest``: record its figures
    on ``projection`` (``backtest_*``)."""
    act = trace.action
    lo, hi = int(steps.first_event[last]), int(steps.last_event[last])
    own = lo + np.flatnonzero(act[lo : hi + 1] == ALLOC)
    test = None
    if own.size > projection.matched_allocs:
        cut = int(own[projection.matched_allocs])
        test = _project(trace, steps, lifetimes, free_action, recorded, last, lo, cut)
    if test is None or not test.available or test.tail is None:
        # Two complete steps that cannot be projected one from the other do not repeat.
        return (
            f"the steps do not repeat: step {last} cannot be projected from the steps before it "
            f"({test.reason if test is not None else 'it made fewer allocations than the failing step'})"
        )
    real = _live_peak(lifetimes, lo, hi + 1, recorded)
    error = (test.step_need_bytes - real) / max(1, real)
    # The projected allocation sizes against the ones the step really made, in order.
    guessed = np.asarray([z for a, z in zip(test.tail.alloc, test.tail.size, strict=True) if a], np.int64)
    made = trace.size[own[projection.matched_allocs :]]
    k = min(guessed.size, made.size)
    same = float((guessed[:k] == made[:k]).sum()) / max(1, max(guessed.size, made.size))
    off = (int(guessed.sum()) - int(made.sum())) / max(1, int(made.sum()))
    if newest:
        projection.backtest_error = error
        projection.backtest_step = last
        projection.backtest_sizes_exact = same
        projection.backtest_bytes_error = off
    if test.coherent < MIN_COHERENT:
        return (
            f"the steps do not repeat, they are unlike one another: only {test.coherent:.0%} of the bytes that "
            "changed between step "
            f"{test.template_step} and step {last} changed by one ratio"
        )
    if abs(off) > MAX_BACKTEST_BYTES_ERROR:
        return (
            f"the steps do not repeat closely enough: projected the same way from the steps before it, "
            f"the rest of step {last} would allocate {abs(off):.0%} {'more' if off > 0 else 'fewer'} bytes "
            "than it really did"
        )
    if abs(error) > MAX_BACKTEST_ERROR:
        return (
            f"the steps do not repeat closely enough: projected the same way from the steps before it, "
            f"step {last} would need {test.step_need_bytes:,} bytes, it needed {real:,} ({error:+.1%})"
        )
    return ""


def _live_peak(lifetimes: Lifetimes, lo: int, hi: int, recorded: AllocatorConfig) -> int:
    """Peak live bytes (rounded requests) over events [lo, hi)."""
    start, end = lifetimes.start, lifetimes.end
    rounded = recorded.round_sizes(lifetimes.size.astype(np.int64))
    live0 = int(rounded[(start < lo) & (end >= lo)].sum())
    delta = np.zeros(hi - lo + 1, np.int64)
    a_in = (start >= lo) & (start < hi)
    np.add.at(delta, start[a_in] - lo, rounded[a_in])
    f_in = (end >= lo) & (end < hi)
    np.add.at(delta, end[f_in] - lo, -rounded[f_in])
    running = live0 + np.cumsum(delta[: hi - lo])
    return max(live0, int(running.max()) if running.size else live0)


@dataclass(frozen=True)
class _Template:
    """The complete earlier step the failing one is projected from, and how the two pair up."""

    step: int
    allocs: I64  # its allocation events
    pos: int  # the template ordinal the OOM request stands for
    score: float  # alignment: 1.0 for an exact prefix
    pairing: dict[int, int]  # template ordinal -> prefix ordinal
    step_allocs: dict[int, I64]  # allocation events of every candidate step looked at


class _SizeRule:
    """The size each template allocation takes in the failing step: kept where it never changes,
    as paired where the prefix showed the template's size become another, else scaled by the ratio."""

    def __init__(self, trace: Trace, prefix: I64, tmpl: _Template) -> None:
        size = trace.size
        self.t_sizes = size[tmpl.allocs].astype(np.int64)
        f_sizes = size[prefix].astype(np.int64)
        pairs: dict[int, dict[int, int]] = {}
        t_paired = np.asarray([int(self.t_sizes[j]) for j in tmpl.pairing], np.int64)
        f_paired = np.asarray([int(f_sizes[i]) for i in tmpl.pairing.values()], np.int64)
        for ts, fs in zip(t_paired.tolist(), f_paired.tolist(), strict=True):
            pairs.setdefault(ts, {}).setdefault(fs, 0)
            pairs[ts][fs] += 1
        self.size_map = {ts: max(c.items(), key=lambda kv: kv[1])[0] for ts, c in pairs.items()}
        changed = t_paired != f_paired
        self.ratio = float(f_paired[changed].sum() / t_paired[changed].sum()) if changed.any() else 1.0
        # How alike the failing step's shapes are to the template's: the share of the changed bytes
        # that changed by the common ratio (within RATIO_TOLERANCE). One batch or length scales
        # them together; micro-batches of their own lengths or a new resolution each scale apart.
        if changed.any():
            each = f_paired[changed] / t_paired[changed]
            near = np.abs(each / self.ratio - 1.0) <= RATIO_TOLERANCE
            self.coherent = float(t_paired[changed][near].sum() / t_paired[changed].sum())
        else:
            self.coherent = 1.0
        # Steps of the template's pattern but another shape tell sizes that never change.
        others = [
            ak
            for k, ak in tmpl.step_allocs.items()
            if k != tmpl.step
            and ak.size == tmpl.allocs.size
            and np.array_equal(trace.stack[ak], trace.stack[tmpl.allocs])
            and not np.array_equal(size[ak], self.t_sizes)
        ]
        # The nearest step of another shape decides: a size that grew early and then saturated
        # (a buffer capped at some size) stayed put between recent steps. With no step of another
        # shape, nothing is known to be constant if the failing step grew.
        self.constant = size[others[0]] == self.t_sizes if others else np.full(tmpl.allocs.size, not changed.any())
        self.kept = self.paired = self.scaled = 0

    def __call__(self, j: int) -> int:
        ts = int(self.t_sizes[j])
        if self.constant[j]:
            self.kept += 1
            return ts
        if ts in self.size_map:
            self.paired += 1
            return self.size_map[ts]
        self.scaled += 1
        return max(1, round(ts * self.ratio))


def _step_allocs(trace: Trace, lo: int, hi: int) -> I64:
    """The allocation events in [lo, hi)."""
    return (lo + np.flatnonzero(trace.action[lo:hi] == ALLOC)).astype(np.int64)


def _choose_template(trace: Trace, steps: Steps, step_index: int, prefix: I64) -> _Template | None:
    """The newest complete step, of the last ``MAX_TEMPLATE_STEPS``, that starts with the failing
    step's allocations (exactly, else the best fuzzy alignment) and has more of them."""
    m = int(prefix.size)
    prefix_stacks = trace.stack[prefix]
    step_allocs: dict[int, I64] = {}
    found: tuple[int, int, float, dict[int, int]] | None = None  # step, pos, score, pairing
    for k in range(step_index - 1, max(-1, step_index - 1 - MAX_TEMPLATE_STEPS), -1):
        if not steps.complete[k]:
            continue
        ak = _step_allocs(trace, int(steps.first_event[k]), int(steps.last_event[k]) + 1)
        step_allocs[k] = ak
        best = found[2] if found is not None else 0.0
        if best < 1.0 and ak.size > m and np.array_equal(trace.stack[ak[:m]], prefix_stacks):
            found = (k, m, 1.0, {j: j for j in range(m)})
        elif best < 1.0 and ak.size > m and m <= FUZZY_MAX_ALLOCS and ak.size <= 4 * FUZZY_MAX_ALLOCS:
            fuzzy = _fuzzy_alignment(prefix_stacks.tolist(), trace.stack[ak].tolist())
            if fuzzy is not None and fuzzy[2] > best:
                found = (k, fuzzy[1], fuzzy[2], fuzzy[0])
    if found is None or found[2] < MIN_ALIGNMENT:
        return None
    k, pos, score, pairing = found
    return _Template(k, step_allocs[k], pos, score, pairing, step_allocs)


def _project(
    trace: Trace,
    steps: Steps,
    lifetimes: Lifetimes,
    free_action: int,
    recorded: AllocatorConfig,
    step_index: int,
    first: int,
    oom_index: int,
) -> Projection:
    """Project step ``step_index`` (events from ``first``) past event ``oom_index`` from the steps before it:
    the template step, the sizes its allocations take now, then its events after the OOM as the tail."""
    prefix = _step_allocs(trace, first, oom_index)
    tmpl = _choose_template(trace, steps, step_index, prefix)
    if tmpl is None:
        return _unavailable("no earlier step starts with the same allocations as the failing one")
    if tmpl.pos >= tmpl.allocs.size:
        return _unavailable("the failing step has already made more allocations than the steps before it")
    sizes = _SizeRule(trace, prefix, tmpl)
    counterpart = _Counterparts(trace, steps, tmpl, prefix, step_index)
    oom_request, oom_low = _oom_request(int(trace.size[oom_index]), recorded, sizes, tmpl.pos)
    tail, t_event, t_ord, freed_real = _tail(
        trace, lifetimes, free_action, recorded, oom_index, oom_request, tmpl, sizes, counterpart
    )
    need = _step_need(lifetimes, first, oom_index, len(trace), recorded, tail, freed_real)
    return Projection(
        True,
        "",
        step=step_index,
        first_event=first,
        oom_event=oom_index,
        template_step=tmpl.step,
        matched_allocs=tmpl.pos,
        alignment=round(tmpl.score, 4),
        template_allocs=int(tmpl.allocs.size),
        ratio=sizes.ratio,
        coherent=sizes.coherent,
        sizes_kept=sizes.kept,
        sizes_paired=sizes.paired,
        sizes_scaled=sizes.scaled,
        step_need_bytes=need,
        tail=tail,
        template_event=t_event,
        ordinal=t_ord,
        oom_request_low=oom_low,
    )


def _oom_request(entry: int, recorded: AllocatorConfig, projected_size: _SizeRule, pos: int) -> tuple[int, int | None]:
    """The failing request the tail starts with, and the least request the oom entry may stand for
    (None where the entry is the request, ``Projection.oom_request_low``).

    An oom entry holds the request rounded under the recorded settings; under roundup divisions that
    hides up to a division of it (a 640 MiB entry may have asked for 513 MiB), and a what-if under
    finer rounding would ask for too much. The template's like request, projected, is the request
    where it rounds to the entry (issue 23: three what-ifs from divisions-4 runs said the step fails
    where the real reruns completed it)."""
    guess = projected_size(pos)
    projected_size.kept = projected_size.paired = projected_size.scaled = 0  # the tail's sizes alone
    if guess != entry and int(recorded.round_sizes(np.asarray([guess], np.int64))[0]) == entry:
        return guess, None
    low = least_request(recorded, entry)
    return entry, (low if entry - low >= 512 else None)


class _Counterparts:
    """The failing run's allocation event standing for an allocation of the template's run."""

    def __init__(self, trace: Trace, steps: Steps, tmpl: _Template, prefix: I64, step_index: int) -> None:
        self.trace, self.steps, self.tmpl, self.prefix, self.step_index = trace, steps, tmpl, prefix, step_index
        self.t_first, self.t_last = int(steps.first_event[tmpl.step]), int(steps.last_event[tmpl.step])
        self.pos_of_alloc = {int(e): j for j, e in enumerate(tmpl.allocs.tolist())}

    def allocs_of(self, k: int) -> I64:
        ak = self.tmpl.step_allocs.get(k)
        if ak is None:
            ak = _step_allocs(self.trace, int(self.steps.first_event[k]), int(self.steps.last_event[k]) + 1)
        return ak

    def __call__(self, a: int) -> int | None:
        if self.t_first <= a <= self.t_last:
            j = self.pos_of_alloc.get(a)
            i = self.tmpl.pairing.get(j) if j is not None else None
            return int(self.prefix[i]) if i is not None else None
        # An allocation d steps before the template stands for one d steps before the failing step.
        k = int(np.searchsorted(self.steps.last_event, a, side="left"))
        d = self.tmpl.step - k
        if k >= self.step_index or d <= 0 or self.step_index - d < 0:
            return None
        ak = self.allocs_of(k)
        j = int(np.searchsorted(ak, a))
        if j >= ak.size or int(ak[j]) != a:
            return None
        fa = self.allocs_of(self.step_index - d)
        return int(fa[j]) if j < fa.size and self.trace.stack[fa[j]] == self.trace.stack[a] else None


def _tail(
    trace: Trace,
    lifetimes: Lifetimes,
    free_action: int,
    recorded: AllocatorConfig,
    oom_index: int,
    oom_request: int,
    tmpl: _Template,
    projected_size: _SizeRule,
    counterpart: _Counterparts,
) -> tuple[ProjectedTail, list[int], list[int], dict[int, int]]:
    """The template's events after the OOM request as the failing step's requests: (the tail, the
    template event and ordinal of each request, the rounded bytes of recorded blocks it frees)."""
    act, size = trace.action, trace.size
    alloc_of_free = dict(zip(lifetimes.end.tolist(), lifetimes.start.tolist(), strict=True))
    starts = lifetimes.start

    def live_at_oom(x: int) -> bool:
        i = int(np.searchsorted(starts, x))
        return i < starts.size and int(starts[i]) == x and int(lifetimes.end[i]) > oom_index

    pos, first_alloc = tmpl.pos, int(tmpl.allocs[tmpl.pos])
    t_alloc, t_addr, t_size = [True], [-1], [oom_request]  # synthetic addresses are negative: recorded ones never are
    t_like, t_event, t_ord = [first_alloc], [first_alloc], [pos]
    block_of: dict[int, int] = {first_alloc: -1}  # template alloc event -> tail address
    size_of: dict[int, int] = {-1: oom_request}  # tail address -> requested bytes
    freed_real: dict[int, int] = {}  # recorded address -> rounded bytes, for the need
    for e in range(first_alloc + 1, counterpart.t_last + 1):
        kind = int(act[e])
        if kind == ALLOC:
            addr = -1 - len(t_alloc)
            block_of[e] = addr
            t_size.append(projected_size(counterpart.pos_of_alloc[e]))
            size_of[addr] = t_size[-1]
            t_ord.append(counterpart.pos_of_alloc[e])
        elif kind == free_action:
            a = alloc_of_free.get(e)
            if a is None:
                continue
            if a in block_of:
                addr = block_of.pop(a)
                freed = size_of[addr]
            else:
                x = counterpart(a)
                if x is None or not live_at_oom(x):
                    continue
                addr = int(trace.addr[x])
                if addr in freed_real:
                    continue
                freed = int(size[x])
                freed_real[addr] = int(recorded.round_sizes(np.asarray([freed], np.int64))[0])
            # A free carries its block's size: the allocator finds the free list by it.
            t_size.append(freed)
            t_ord.append(-1)
        else:
            continue
        t_alloc.append(kind == ALLOC)
        t_addr.append(addr)
        t_like.append(e)
        t_event.append(e)
    return ProjectedTail(oom_index, t_alloc, t_addr, t_size, t_like), t_event, t_ord, freed_real


def least_request(recorded: AllocatorConfig, entry: int) -> int:
    """The least request that ``recorded``'s rounding makes ``entry`` (an oom entry's size): rounding
    is monotonic and never halves, so a bisection over (entry / 2, entry]."""
    lo, hi = max(1, entry // 2), entry
    while lo < hi:
        mid = (lo + hi) // 2
        if recorded.round_size(mid) >= entry:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _step_need(
    lifetimes: Lifetimes,
    first: int,
    oom_index: int,
    n: int,
    recorded: AllocatorConfig,
    tail: ProjectedTail,
    freed_real: dict[int, int],
) -> int:
    """Peak live bytes (rounded requests) over the failing step: its real part, then the tail."""
    start, end = lifetimes.start, lifetimes.end
    rounded = recorded.round_sizes(lifetimes.size.astype(np.int64))
    live0 = int(rounded[(start < first) & (end >= first)].sum())
    # Within [first, oom): + at an alloc, - at its free (allocated_bytes drops at free_requested).
    window = oom_index - first
    delta = np.zeros(window + 1, np.int64)
    a_in = (start >= first) & (start < oom_index)
    np.add.at(delta, start[a_in] - first, rounded[a_in])
    f_in = (end >= first) & (end < oom_index)
    np.add.at(delta, end[f_in] - first, -rounded[f_in])
    running = live0 + np.cumsum(delta[:window])
    peak = max(live0, int(running.max()) if running.size else live0)
    live = int(running[-1]) if running.size else live0
    rounded_tail = recorded.round_sizes(np.asarray(tail.size, np.int64)).tolist()
    sizes = {a: s for a, s, is_alloc in zip(tail.addr, rounded_tail, tail.alloc, strict=True) if is_alloc}
    for is_alloc, addr in zip(tail.alloc, tail.addr, strict=True):
        if is_alloc:
            live += sizes[addr]
            peak = max(peak, live)
        else:
            live -= sizes[addr] if addr < 0 else freed_real.get(addr, 0)
    return peak
