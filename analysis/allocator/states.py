"""A caching allocator's state at one moment: its segments, their blocks, and the figures they add up to.

The recorded replay (``allocator.recorded``) hands its states out as these (``RecordedReplay.blocks_at``),
the pass that moves them (``replayer``) exports them, and the state before an incomplete trace is rebuilt
as one (``rebuild``); the policy model starts a partial trace from one (``cachestate._Allocator.seed``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from analysis.model import ACTIVE_ALLOCATED, INACTIVE


@dataclass(frozen=True, slots=True)
class BlockState:
    """One block at a moment of the replay.

    ``stack`` is the stack of the block's ``alloc`` event; for a block that was
    live before the trace it is the final snapshot's frames or the stack of the
    event that freed it. ``alloc_index`` is the event index of the ``alloc``
    (-1 for free blocks and blocks from before the trace).
    """

    address: int
    size: int
    requested_size: int
    state: str  # model.ACTIVE_ALLOCATED | model.ACTIVE_PENDING_FREE | model.INACTIVE
    stack: int = -1
    alloc_index: int = -1

    @property
    def live(self) -> bool:
        return self.state != INACTIVE


@dataclass(frozen=True, slots=True)
class SegmentState:
    """A segment (for expandable segments: one contiguous mapped range)."""

    address: int
    total_size: int
    stream: int  # ordinal into DeviceData.streams
    pool: int  # ordinal into Snapshot.pools
    segment_type: str  # "small" | "large"
    is_expandable: bool
    blocks: tuple[BlockState, ...]
    stack: int = -1


@dataclass(frozen=True, slots=True)
class StateFigures:
    """The allocator's totals at one moment, as ``memory_stats()`` counts them."""

    allocated: int
    requested: int
    reserved: int
    active: int
    cached_free: int  # reserved - active
    inactive_split: int
    largest_free: int


@dataclass(frozen=True, slots=True)
class AllocatorState:
    """Segments and blocks after event ``index`` (-1: before the first event)."""

    index: int
    segments: tuple[SegmentState, ...]

    def live_blocks(self) -> Iterator[tuple[SegmentState, BlockState]]:
        for seg in self.segments:
            for block in seg.blocks:
                if block.state != INACTIVE:
                    yield seg, block

    def figures(self) -> StateFigures:
        allocated = requested = reserved = active = inactive_split = largest = 0
        for seg in self.segments:
            reserved += seg.total_size
            split = len(seg.blocks) > 1 and not seg.is_expandable
            for b in seg.blocks:
                if b.state == INACTIVE:
                    largest = max(largest, b.size)
                    if split:
                        inactive_split += b.size
                    continue
                active += b.size
                requested += b.requested_size
                if b.state == ACTIVE_ALLOCATED:
                    allocated += b.size
        return StateFigures(allocated, requested, reserved, active, reserved - active, inactive_split, largest)


# A segment's (stream, pool, segment_type, is_expandable, stack), as the replay keeps it.
_Meta = tuple[int, int, str, bool, int]
