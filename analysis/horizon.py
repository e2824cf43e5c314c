"""A growing run's horizon under a setting, by replaying the grown steps (issue 32, item 7), and by arithmetic.

A setting that gets the failing step through only postpones the OOM of a run whose steps keep growing; how far
it postpones it decides the answer: the free setting first (with its horizon) where the run goes on well past
the failing step, "no setting saves it" only where it dies again soon (``horizon_is_near``).
``setting_horizon`` carries one replayed step's packing forward by arithmetic; ``grown_horizon`` replays the
steps themselves under the setting, with its own packing of each grown size:

- the failing step (its recorded part up to the OOM, then ``projection``'s projected tail) is the pattern;
- each of the next ``steps`` steps repeats the pattern's allocations that the step frees itself (what a step
  keeps, such as optimizer state made in the first one, is made once), every size grown so that the step's
  transient peak rises by ``growth_per_step`` bytes a step (the growing workload's measured line,
  ``causes.growing_workload``'s ``growth_per_step_bytes``);
- the whole sequence is one policy replay (``allocator.simulate`` with the extended tail), so the segments the
  setting made for smaller steps, its splitting, rounding and expanding are all in the answer.

The step the replay first fails in is the horizon; None where every replayed step completed (the setting
carries the run at least that far).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.allocator import ProjectedTail, Requests, simulate
from analysis.allocator.config import AllocatorConfig
from analysis.allocator.policy import placement_for
from analysis.model import FREE_COMPLETED, FREE_REQUESTED, OOM, DeviceData, Snapshot
from analysis.projection import Projection
from analysis.stacks import Lifetimes, alloc_lifetimes
from analysis.stepwhatif import first_failure

# A growing run's horizon under a setting is near (no setting saves the run) when the setting carries it at most
# this many steps past the failing one, or this share of the steps it already ran if that is more. The real
# reruns bear the line out: where even a perfectly packed cache gained nothing, every setting's rerun died in the
# same step (rand_s1_c40, 8 steps run); where it gained 3 steps or more on a run of 8 or 9 (rand_s17, s23, s26),
# the expandable_segments and max_split_size_mb reruns ran all their steps; gpt_varlen_oom, 23 steps run, gains
# 2 or 3 steps by its replayed horizon, and its expandable_segments and max_split_size_mb:256 reruns died 4 steps
# later.
NEAR_HORIZON_STEPS = 2
NEAR_HORIZON_SHARE = 0.15


def horizon_is_near(step: int, dies_at: int) -> bool:
    """Whether a run that died in ``step`` (after ``step`` complete ones) dies again soon under a setting that
    carries it to ``dies_at``: "no setting saves it" is said only then."""
    return dies_at - step <= max(NEAR_HORIZON_STEPS, math.ceil(NEAR_HORIZON_SHARE * step))


def setting_horizon(step: int, need_bytes: int, limit_bytes: int, growth_per_step: int, peak_reserved: int) -> int:
    """The step a growing run dies in under a setting whose replay ran the failing ``step`` to its end, reserving
    ``peak_reserved`` for the step's ``need_bytes`` (its packing): each later step needs ``growth_per_step`` more,
    packed as well, until the limit is reached. A horizon from the setting's own replay, never the recorded run's
    waste carried forward."""
    if need_bytes <= 0 or growth_per_step <= 0:
        return step + 1
    packing = max(1.0, peak_reserved / need_bytes)
    room = limit_bytes / packing - need_bytes
    return step + 1 + max(0, int(room // growth_per_step))


@dataclass(frozen=True, slots=True)
class GrownHorizon:
    """The replay of ``steps_replayed`` grown steps after the failing one under ``config``."""

    config: str
    failing_step: int  # the step the recorded run died in (the number of steps it completed)
    steps_replayed: int  # grown steps replayed after the failing one
    dies_in_step: int | None  # the step the replay first fails in; None: every replayed step completed
    growth_per_step_bytes: int

    @property
    def reaches(self) -> int:
        """The last step the run is known to get into under the setting: where it dies, else past the replay."""
        return self.dies_in_step if self.dies_in_step is not None else self.failing_step + self.steps_replayed + 1

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "failing_step": self.failing_step,
            "steps_replayed": self.steps_replayed,
            "dies_in_step": self.dies_in_step,
            "growth_per_step_bytes": self.growth_per_step_bytes,
        }


@dataclass(frozen=True, slots=True)
class _Request:
    alloc: bool
    key: tuple[str, int]  # ("r", lifetime) for a recorded allocation, ("t", address) for a projected one
    size: int
    like: int  # a recorded event whose stream the request takes


def _pattern(lifetimes: Lifetimes, projection: Projection) -> list[_Request]:
    """The failing step's requests in order: its recorded allocations and frees up to the OOM, then the tail."""
    assert projection.tail is not None
    first, oom = projection.first_event, projection.oom_event
    start, end = lifetimes.start, lifetimes.end
    made = np.flatnonzero((start >= first) & (start < oom))
    events: list[tuple[int, _Request]] = []
    for i in made.tolist():
        key = ("r", i)
        events.append((int(start[i]), _Request(True, key, int(lifetimes.size[i]), int(start[i]))))
        if int(end[i]) < oom:
            events.append((int(end[i]), _Request(False, key, 0, int(start[i]))))
    events.sort(key=lambda e: e[0])
    live_at_oom = {int(lifetimes.addr[i]): i for i in made.tolist() if int(end[i]) >= oom}
    out = [r for _, r in events]
    tail = projection.tail
    for is_alloc, addr, size, like in zip(tail.alloc, tail.addr, tail.size, tail.like, strict=True):
        if addr >= 0:  # a recorded block the tail frees: the step's own only if the step made it
            if not is_alloc and addr in live_at_oom:
                out.append(_Request(False, ("r", live_at_oom[addr]), 0, like))
            continue
        out.append(_Request(bool(is_alloc), ("t", int(addr)), int(size), int(like)))
    return out


def grown_tail(
    lifetimes: Lifetimes, projection: Projection, growth_per_step: int, steps: int
) -> tuple[ProjectedTail, int, int]:
    """``projection``'s tail followed by ``steps`` grown copies of the failing step: (the tail, the number of
    requests of the original tail, the number of requests of each copy)."""
    assert projection.tail is not None
    pattern = _pattern(lifetimes, projection)
    freed = {r.key for r in pattern if not r.alloc}
    made = {r.key for r in pattern if r.alloc}
    # What the step makes and frees itself; a block it keeps, or frees from before the step, is not repeated.
    transient = [r for r in pattern if r.key in freed and r.key in made]
    live, peak = 0, 0
    sizes = {r.key: r.size for r in transient if r.alloc}
    for r in transient:
        live += sizes[r.key] if r.alloc else -sizes[r.key]
        peak = max(peak, live)
    tail = projection.tail
    alloc, addr, size, like = list(tail.alloc), list(tail.addr), list(tail.size), list(tail.like)
    base = min([-1, *addr]) - 1
    for k in range(1, steps + 1):
        factor = 1.0 + k * growth_per_step / max(1, peak)
        address: dict[tuple[str, int], tuple[int, int]] = {}
        for r in transient:
            if r.alloc:
                address[r.key] = (base, max(1, int(sizes[r.key] * factor)))
                base -= 1
            # A free carries its block's size, as the projected tail's do: the allocator finds the free list by it.
            at, grown = address[r.key]
            alloc.append(r.alloc)
            addr.append(at)
            size.append(grown)
            like.append(r.like)
    return ProjectedTail(tail.cut, alloc, addr, size, like), len(tail.alloc), len(transient)


def grown_horizon(
    snapshot: Snapshot,
    dev: DeviceData,
    conf: str,
    limit_bytes: int | None,
    step_ends: list[int],
    projection: Projection,
    growth_per_step: int,
    steps: int,
    *,
    capped: bool = True,
    requests: Requests | None = None,
) -> GrownHorizon:
    """The failing step and ``steps`` grown ones replayed under ``conf`` (see the module docstring)."""
    assert projection.tail is not None
    assert projection.available
    trace = dev.trace
    act = trace.action
    has_fr = bool((act == FREE_REQUESTED).any())
    a = act if has_fr else np.where(act == FREE_COMPLETED, FREE_REQUESTED, act).astype(act.dtype)
    lifetimes = alloc_lifetimes(a, trace.addr, trace.size, trace.stack)
    tail, n_tail, n_copy = grown_tail(lifetimes, projection, growth_per_step, steps)
    base = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    cfg = AllocatorConfig.parse(conf, base=base).acting(capped)
    result = simulate(
        snapshot, dev, cfg, limit_bytes, step_ends, tail=tail, placement=placement_for(cfg, base), requests=requests
    )
    n = len(trace)
    caught = frozenset(int(i) for i in np.flatnonzero(act == OOM).tolist()) - {projection.oom_event}
    at_event, at_request = first_failure(result.ooms, projection, n, caught)
    dies: int | None
    if at_event is not None and at_request is None:
        dies = projection.step  # the recorded part itself fails under the setting
    elif at_request is None:
        dies = None
    elif at_request < n_tail:
        dies = projection.step
    else:
        dies = projection.step + 1 + (at_request - n_tail) // max(1, n_copy)
    return GrownHorizon(conf, projection.step, steps, dies, int(growth_per_step))
