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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from analysis.causes.base import Cause, CauseInput, PoolUse, _oom_phase, _pass_before_oom, _repeats_without_backward
from analysis.causes.growth import eval_outputs_on_gpu, growing_workload, kv_cache_growth
from analysis.causes.held import forward_without_no_grad, leak, optimizer_step
from analysis.causes.outside import cuda_graph_pools, outside_memory, pool_origin
from analysis.phases import PHASE_WORDS, PHASES, live_bytes_by_phase

__all__ = ["RULES", "Cause", "CauseInput", "CauseRule", "Diagnosis", "PoolUse", "diagnose", "pool_origin", "rule_named"]


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
