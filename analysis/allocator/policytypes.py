"""The policy replay's types: the projected tail it may be fed, what it did, the segments' shapes it leaves.

Shared by the model (``cachestate``, ``cachemodel``), its replay (``policy``) and the contract items made of
it (``answers``), so none of them imports another for a type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from analysis.allocator.config import AllocatorConfig
from analysis.model import DeviceData

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class ProjectedTail:
    """Requests standing in for the part of a step the trace does not hold (built by
    ``analysis.projection``): the recorded requests stop before event ``cut`` (the
    OOM: what follows it is the exception unwinding), then these run in order.

    ``alloc[j]`` True: allocate ``size[j]`` bytes (requested, rounded here) under
    the address ``addr[j]``; False: free the block held under ``addr[j]`` (a
    recorded address, or one an earlier tail request allocated). ``like[j]`` is a
    recorded event whose stream and pool the request takes. Request 0 is the
    recorded OOM request and keeps the event index ``cut``; request ``j`` > 0 has
    the synthetic index ``len(trace) + j``.
    """

    cut: int
    alloc: list[bool]
    addr: list[int]
    size: list[int]
    like: list[int]


@dataclass(slots=True)
class PolicyResult:
    """What the model did with one device's requests.

    ``oom`` is the event index of the first request the model could not serve
    (``ooms`` lists all of them; the replay continues past each). Reserved
    memory after any event is ``reserved_at([i])``; the whole column is
    ``reserved_per_event()``.
    """

    config: AllocatorConfig
    limit_bytes: int | None
    events: int
    peak_reserved: int
    final_reserved: int
    oom: int | None
    ooms: list[int]
    oom_avoided: bool | None
    segment_events: list[tuple[str, int]]
    segment_event_index: list[int]
    flushes: list[int]  # event indices where the model ran release_cached_blocks
    step_ends: list[int] = field(default_factory=list)
    step_reserved: list[int] = field(default_factory=list)
    change_index: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    change_reserved: I64 = field(default_factory=lambda: np.zeros(0, np.int64))
    # Where the replay started (``start_state``): "empty" (a complete trace), "recorded" (the
    # recorded state before the first event, under the settings that made it), "live-blocks"
    # (an expandable what-if of a partial trace: its live blocks alone), "recorded-other-settings"
    # (a partial trace under other settings: the recorded segments, which they would not have made).
    start: str = "empty"

    def reserved_at(self, indices: Sequence[int]) -> list[int]:
        """Reserved bytes right after each event index (-1: before the first event)."""
        if len(indices) == 0:
            return []
        if not self.change_index.size:  # no segment ever: nothing reserved
            return [0] * len(indices)
        idx = np.asarray(indices, dtype=np.int64)
        pos = np.searchsorted(self.change_index, idx, side="right") - 1
        vals = np.where(pos >= 0, self.change_reserved[np.maximum(pos, 0)], 0)
        return [int(v) for v in vals]

    def reserved_per_event(self) -> I64:
        """Reserved bytes after every event, one int64 per trace event."""
        if not self.change_index.size:
            return np.zeros(self.events, np.int64)
        pos = np.searchsorted(self.change_index, np.arange(self.events), side="right") - 1
        return np.where(pos >= 0, self.change_reserved[np.maximum(pos, 0)], 0).astype(np.int64)


@dataclass(frozen=True, slots=True)
class SegmentLayout:
    """One segment's shape, comparable between the model and a snapshot (whose
    addresses the model does not reproduce): its pool, kind, stream, whether it
    is an expandable range, and its blocks' (size, state) in address order."""

    pool: int
    segment_type: str
    stream: int
    is_expandable: bool
    blocks: tuple[tuple[int, str], ...]

    @property
    def total_size(self) -> int:
        return sum(size for size, _state in self.blocks)


def recorded_layout(device: DeviceData) -> list[SegmentLayout]:
    """The snapshot's final segments as ``SegmentLayout`` s (address order)."""
    return [
        SegmentLayout(
            seg.pool, seg.segment_type, seg.stream, seg.is_expandable, tuple((b.size, b.state) for b in seg.blocks)
        )
        for seg in sorted(device.segments, key=lambda x: x.address)
    ]


def same_layout(a: Sequence[SegmentLayout], b: Sequence[SegmentLayout]) -> bool:
    """Equal as multisets: the model places segments at simulated addresses."""
    key = lambda x: (x.pool, x.segment_type, x.stream, x.is_expandable, x.blocks)  # noqa: E731
    return sorted(a, key=key) == sorted(b, key=key)
