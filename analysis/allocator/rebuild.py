"""The state at the first event of an incomplete trace, rebuilt backwards from the snapshot's final segments.

A trace that does not start from an empty allocator (ring buffer wrapped, history enabled late,
``enabled="state"``) leaves the recorded replay (``allocator.recorded``) no state to start from: it is
rebuilt here from the final ``segments`` and the trace (``_rebuild_initial``), and the replay runs
forward from it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from analysis.allocator.config import K_LARGE_BUFFER, K_MIN_BLOCK_SIZE, K_SMALL_BUFFER, AllocatorConfig, is_small
from analysis.allocator.states import AllocatorState, BlockState, SegmentState, _Meta
from analysis.model import (
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    INACTIVE,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    DeviceData,
)


def _final_state(device: DeviceData, index: int) -> AllocatorState:
    segments = []
    for s in sorted(device.segments, key=lambda s: s.address):
        blocks = tuple(
            BlockState(b.address, b.size, b.requested_size if b.state != INACTIVE else 0, b.state, b.stack)
            for b in s.blocks
        )
        segments.append(
            SegmentState(
                s.address,
                s.total_size,
                s.stream,
                s.pool,
                s.segment_type,
                s.is_expandable,
                blocks,
                s.stack,
            )
        )
    return AllocatorState(index, tuple(segments))


@dataclass(slots=True)
class _Rebuilt:
    state: AllocatorState
    orphans: int  # blocks live before the trace that no segment at its start holds
    conflicts: int  # guessed sizes that had to be clipped to the next block


def _rebuild_initial(device: DeviceData, cfg: AllocatorConfig, final: AllocatorState) -> _Rebuilt:
    """The state at the first event, from the final segments and the trace.

    Segments: undo the segment events backwards from the final ones (as MemoryViz
    does). Live blocks: those freed in the trace before any alloc at their address,
    plus final live blocks that the trace never allocated. Their layout gives the
    free blocks (the allocator always merges neighbouring free blocks). The size of
    a block freed in the trace but allocated before it is not recorded: it is the
    rounded request, plus the rest of the gap behind it where ``should_split``
    would not have split that gap off.
    """
    tr = device.trace
    act = tr.action
    addr, size = tr.addr, tr.size
    segs: dict[int, tuple[int, _Meta]] = {
        s.address: (s.total_size, (s.stream, s.pool, s.segment_type, s.is_expandable, s.stack)) for s in final.segments
    }
    seg_events = np.nonzero((act >= SEGMENT_ALLOC) & (act <= SEGMENT_UNMAP))[0][::-1]
    for i in seg_events.tolist():
        a, ad, sz = int(act[i]), int(addr[i]), int(size[i])
        stream, pool, stack = int(tr.stream[i]), int(tr.pool[i]), int(tr.stack[i])
        if a == SEGMENT_ALLOC:
            segs.pop(ad, None)
        elif a == SEGMENT_FREE:
            kind = "small" if sz == K_SMALL_BUFFER else "large"
            segs[ad] = (sz, (stream, pool, kind, False, stack))
        elif a == SEGMENT_MAP:
            _unmap_range(segs, ad, sz)
        else:
            _map_range(segs, ad, sz, (stream, pool, "", True, stack))

    live: dict[int, int] = {}
    pre: dict[int, BlockState] = {}
    idx = np.nonzero(act <= FREE_COMPLETED)[0]
    stacks = tr.stack[idx].tolist()
    for a, ad, sz, st in zip(act[idx].tolist(), addr[idx].tolist(), size[idx].tolist(), stacks, strict=True):
        if a == ALLOC:
            live[ad] = 1
        elif a == FREE_REQUESTED:
            if ad not in live and ad not in pre:
                pre[ad] = BlockState(ad, 0, sz, ACTIVE_ALLOCATED, st)
            live[ad] = 2
        elif live.pop(ad, None) is None and ad not in pre:
            pre[ad] = BlockState(ad, 0, sz, ACTIVE_PENDING_FREE, st)
    exact: dict[int, BlockState] = {}
    for _, b in final.live_blocks():
        if b.address not in live and b.address not in pre:
            exact[b.address] = b

    starts = sorted(segs)
    per_seg: dict[int, list[BlockState]] = {s: [] for s in starts}
    orphans = 0
    for b in list(pre.values()) + list(exact.values()):
        j = bisect.bisect_right(starts, b.address) - 1
        if j < 0 or b.address >= starts[j] + segs[starts[j]][0]:
            orphans += 1
            continue
        per_seg[starts[j]].append(b)

    conflicts = 0
    segments = []
    for start in starts:
        total, (stream, pool, seg_type, expandable, stack) = segs[start]
        stop = start + total
        held = sorted(per_seg[start], key=lambda b: b.address)
        out: list[BlockState] = []
        cursor = start
        for k, b in enumerate(held):
            nxt = held[k + 1].address if k + 1 < len(held) else stop
            if b.address < cursor:
                conflicts += 1
                continue
            if b.address > cursor:
                out.append(BlockState(cursor, b.address - cursor, 0, INACTIVE))
            if b.size:
                bsize = b.size
            else:
                r = cfg.round_size(b.requested_size)
                gap = nxt - (b.address + r)
                if gap < 0:
                    conflicts += 1
                    bsize = max(nxt - b.address, K_MIN_BLOCK_SIZE)
                elif gap and not (expandable or cfg.should_split(r + gap, r, is_small(r))):
                    bsize = r + gap
                else:
                    bsize = r
            out.append(BlockState(b.address, bsize, b.requested_size, b.state, b.stack))
            cursor = b.address + bsize
        if cursor < stop:
            out.append(BlockState(cursor, stop - cursor, 0, INACTIVE))
        if not seg_type:  # a range put back by undoing an unmap, next to no other
            seg_type = "large" if total % K_LARGE_BUFFER == 0 else "small"
        segments.append(SegmentState(start, total, stream, pool, seg_type, expandable, tuple(out), stack))
    return _Rebuilt(AllocatorState(-1, tuple(segments)), orphans, conflicts)


def _unmap_range(segs: dict[int, tuple[int, _Meta]], ad: int, sz: int) -> None:
    """Undo a segment_map: cut [ad, ad+sz) out of the mapped range holding it."""
    end = ad + sz
    for start, (total, meta) in list(segs.items()):
        stop = start + total
        if meta[3] and start <= ad and end <= stop:
            del segs[start]
            if start < ad:
                segs[start] = (ad - start, meta)
            if end < stop:
                segs[end] = (stop - end, meta)
            return


def _map_range(segs: dict[int, tuple[int, _Meta]], ad: int, sz: int, meta: _Meta) -> None:
    """Undo a segment_unmap: put [ad, ad+sz) back, joined to touching ranges."""
    start, stop = ad, ad + sz
    for s, (total, m) in list(segs.items()):
        if not m[3] or m[0] != meta[0] or (meta[1] and m[1] != meta[1]):
            continue
        e = s + total
        if e == ad or s == stop:
            del segs[s]
            start, stop = min(start, s), max(stop, e)
            meta = m
    segs[start] = (stop - start, meta)
