"""The trace before any replay: its outline (OOMs, steps, the limit the user's inputs give) and its facts.

``trace_outline(...) -> Outline`` is what the policy replays need, found at a glance; ``trace_facts(...)
-> Facts`` adds what takes longer (lifetimes, the failing step projected, the states the recorded replay
is to keep, live requested bytes). ``chosen_limit`` is the one rule for a device's limit (the known one,
else with an OOM the trace's), and ``failing_step`` the one projection of the step an OOM ended: the
report and the ``whatif`` command both read them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator import floor_estimate, trace_is_complete
from analysis.allocator.config import AllocatorConfig
from analysis.allocator.reserved import segment_levels
from analysis.explore import checkpoint_events
from analysis.limits import Limit, OomMessage, choose_limit, sidecar_limit
from analysis.model import DeviceData, Snapshot
from analysis.oom import MAX_OOMS_EXPLAINED, flush_window_start, oom_indices
from analysis.projection import Projection, project_failing_step
from analysis.stacks import Lifetimes, alloc_lifetimes
from analysis.steps import Steps, find_steps

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Outline:
    """What the policy replays need of one device's trace (``trace_outline``)."""

    dev: DeviceData
    n: int
    ooms: I64
    oom_index: int | None  # the last OOM
    recorded_cfg: AllocatorConfig
    steps: Steps
    known_limit: Limit | None  # from what the user has: given, sidecar, OOM message


@dataclass(frozen=True)
class Facts(Outline):
    """What one device's trace shows before any replay: its outline, and what takes longer to find."""

    lifetimes: Lifetimes
    projection: Projection | None  # the failing step projected (an OOM inside a step)
    explained: tuple[int, ...]  # the OOMs explained (the last MAX_OOMS_EXPLAINED)
    keep: tuple[int, ...]  # states the recorded replay keeps from its one pass
    live_requested: Live | None  # live requested bytes after each allocation (the AMP estimate replays it)


@dataclass(frozen=True)
class Live:
    """Live requested bytes right after each allocation of a trace's lifetimes (numpy, before the
    replay). Live memory rises only at an allocation, so every peak of it is among these; where
    it peaks is usually the allocated peak too, so the replay keeps that state in its one pass,
    and the AMP estimate replays it with smaller activations."""

    after: I64  # after each allocation, in the lifetimes' order
    end_rank: I64  # per allocation, how many allocations come before its end (its free)

    @property
    def peak(self) -> int:
        return int(self.after.max())

    def peak_index(self, lifetimes: Lifetimes) -> int:
        """The first event where live requested bytes peak (as ``argmax`` over every event)."""
        k = int(self.after.argmax())
        return int(lifetimes.start[k]) if int(self.after[k]) > 0 else 0


def live_requested(lifetimes: Lifetimes) -> Live | None:
    """``Live`` of a trace's lifetimes (``alloc_lifetimes``: its every alloc, in order)."""
    n, m = lifetimes.n_events, lifetimes.start.shape[0]
    if n == 0 or m == 0:
        return None
    end_rank = lifetimes.end_rank  # the compiled pairing counts them where it meets each end
    if end_rank is None:
        end_rank = _end_ranks(lifetimes)
    elif lifetimes.live_after is not None:  # and sums the live bytes (in int64: as exact as the sums below)
        return Live(lifetimes.live_after, end_rank)
    # bincount sums in float64: exact while totals stay below 2**53 bytes.
    ended = np.bincount(end_rank, lifetimes.size.astype(np.float64), m + 1)
    # ``cumsum(size) - cumsum(ended)`` in one pass (the same in int64); a float64 sum of integers is an
    # integer, so the difference and its cast are exact where the sums are.
    after = np.subtract(lifetimes.size, ended[:-1], out=np.empty(m, np.int64), casting="unsafe")
    np.cumsum(after, out=after)
    return Live(after, end_rank)


def _end_ranks(lifetimes: Lifetimes) -> I64:
    """Per allocation, how many allocations come before its end (``Lifetimes.end_rank``, where the
    compiled pairing has not found it)."""
    n, m, start = lifetimes.n_events, lifetimes.start.shape[0], lifetimes.start
    # Per event (and n, a live one's end), how many allocations come before it, each allocation's rank
    # repeated up to the next (the starts ascend). A running count over every event's action took twice
    # as long.
    runs = np.empty(m + 1, np.int64)  # the gaps between the starts, written in place (no temporaries)
    runs[0], runs[m] = start[0] + 1, n - start[-1]
    np.subtract(start[1:], start[:-1], out=runs[1:m])
    before = np.repeat(np.arange(m + 1, dtype=np.int32 if n < 2**31 else np.int64), runs)
    return before[lifetimes.end].astype(np.int64)


def trace_outline(
    snapshot: Snapshot, dev: DeviceData, limit: int | None, message: OomMessage | None, sidecar: dict[str, Any] | None
) -> Outline:
    """What the policy replays need of the trace, found at a glance: its OOMs, steps, the limit the
    user's inputs give."""
    recorded_cfg = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    ooms = oom_indices(dev.trace)
    oom_index = int(ooms[-1]) if ooms.size else None
    steps = find_steps(snapshot.annotations, dev.device, dev.trace.time_us)
    known = _known_limit(snapshot, dev, oom_index, limit, message, sidecar, recorded_cfg)
    return Outline(dev, len(dev.trace), ooms, oom_index, recorded_cfg, steps, known)


def trace_facts(snapshot: Snapshot, outline: Outline, *, checkpoints: bool) -> Facts:
    """What takes longer to find before any replay: lifetimes, the failing step projected, live requested
    bytes, and the states the recorded replay is to keep from its one pass."""
    dev, n, ooms, oom_index = outline.dev, outline.n, outline.ooms, outline.oom_index
    trace = dev.trace
    lifetimes = alloc_lifetimes(trace.action, trace.addr, trace.size, trace.stack)
    projection = failing_step(outline, lifetimes)
    live = live_requested(lifetimes)
    guess = live.peak_index(lifetimes) if live is not None else None
    reserved_peak = _reserved_peak_index(dev) if n else None  # its segment map
    keep = [i for i in (guess, oom_index, reserved_peak) if i is not None and i >= 0]
    # Each OOM's state and the one before its malloc's own flush: what the request could use.
    explained = ooms[-MAX_OOMS_EXPLAINED:].tolist()
    keep += explained + [flush_window_start(trace, i) - 1 for i in explained]
    if checkpoints:  # the explore store's states come from this same pass
        keep += checkpoint_events(n)
    return Facts(
        **{f.name: getattr(outline, f.name) for f in fields(Outline)},
        lifetimes=lifetimes,
        projection=projection,
        explained=tuple(explained),
        keep=tuple(keep),
        live_requested=live,
    )


def failing_step(outline: Outline, lifetimes: Lifetimes | None = None) -> Projection | None:
    """The step the last OOM ended, projected to its end (``projection.project_failing_step``); None
    without an OOM. ``lifetimes``: the trace's, where already found (else the projection finds them)."""
    if outline.oom_index is None:
        return None
    dev, steps = outline.dev, outline.steps
    return project_failing_step(
        dev.trace,
        steps,
        outline.oom_index,
        outline.recorded_cfg,
        trace_complete=len(steps) > 0 and trace_is_complete(dev),
        lifetimes=lifetimes,
    )


def chosen_limit(snapshot: Snapshot, outline: Outline) -> Limit | None:
    """The device's limit: the known one (given, sidecar, OOM message), else with an OOM the trace's
    (``inferred_limit``), else None. The report's what-ifs and the ``whatif`` command replay under it."""
    if outline.known_limit is not None or outline.oom_index is None:
        return outline.known_limit
    return inferred_limit(snapshot, outline)


def _known_limit(
    snapshot: Snapshot,
    dev: DeviceData,
    oom_index: int | None,
    limit: int | None,
    message: OomMessage | None,
    sidecar: dict[str, Any] | None,
    cfg: AllocatorConfig,
) -> Limit | None:
    """The limit from what the user has (None: only the trace can tell)."""
    side = sidecar_limit(sidecar, dev.device) if oom_index is not None else None
    if limit is None and side is None and message is None:
        return None
    # Every segment the limit check let through was allowed, so the limit is at least the most
    # of those (infer_limit's lower; only the message's range needs it).
    floor = floor_estimate(snapshot, dev, cfg).lower if message is not None and len(dev.trace) else 0
    return choose_limit(given=limit, sidecar=side, message=message, inferred=None, floor=floor)


def inferred_limit(snapshot: Snapshot, outline: Outline) -> Limit:
    """The limit from the trace alone: the allocator package's one rule (``LimitEstimate.stated``)."""
    estimate = floor_estimate(snapshot, outline.dev, outline.recorded_cfg)
    chosen = choose_limit(given=None, sidecar=None, message=None, inferred=estimate.stated())
    assert chosen is not None
    return chosen


def _reserved_peak_index(dev: DeviceData) -> int:
    """``allocator.reserved.recorded_reserved(dev).argmax()``, from the segment events alone: reserved
    memory changes only there, so it first peaks at one of them, or at the first event."""
    at, level = segment_levels(dev)
    if at.size == 0:
        return 0
    if at[0] > 0:  # nothing reserved yet before the first segment event
        at, level = np.r_[0, at], np.r_[0, level]
    return int(at[int(level.argmax())])
