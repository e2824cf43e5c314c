"""What every cause rule reads and returns, and the measurements more than one rule takes.

``CauseInput`` is one device's trace with what the report already knows of it; ``Cause`` is a rule's
finding; the functions below (where the OOM sits in the allocations, whether a saving makes the request
fit, the OOM's phase, whether a forward pass is inference) are shared by the rule families in
``outside``, ``held`` and ``growth`` and by ``diagnose``, so each is measured one way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.limits import OomMessage
from analysis.model import Trace
from analysis.phases import BACKWARD, FORWARD, OPTIMIZER, OTHER, PHASES, ForwardPass, Phases, phase_of_event
from analysis.stacks import Lifetimes, StackCatalog
from analysis.steps import Steps

I64 = npt.NDArray[np.int64]

# A forward pass that holds what it allocated (saved tensors) rather than freeing it as it goes.
HOLD_MIN_SHARE = 0.5


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


def _device_full_without_message(inp: CauseInput) -> bool:
    """The limit is the device's free memory at the OOM (inferred: the OOM entry's ``device_free`` was less
    than the request), and no message says who held the rest: this run's own limit is not known."""
    return inp.message is None and inp.limit_kind == "device-full" and inp.limit_source == "inferred"
