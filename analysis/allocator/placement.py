"""Where the driver puts a new ``cudaMalloc``'d segment: a model, for what-ifs.

The caching allocator breaks ties between equal-sized free blocks by address
(its free lists are ordered by (stream, size, address)), so the address the
driver gives a new segment decides which of two equal blocks later serves a
request. Under ``roundup_power2_divisions`` sizes collapse into few classes and
such ties are common: a what-if that took its addresses from the run it replays
inherited that run's layout (issue 23; docs/allocator.md, "cudaMalloc
placement").

Learned from the recorded addresses of the captures (docs/allocator.md gives the
figures): the driver hands out virtual memory in chunks of whole 32 MiB, each new
chunk directly below the lowest one so far, the segment at the chunk's bottom;
the rest of a chunk, and the range of a segment freed since, is free again for
later segments, and a new segment takes the lowest free range that holds it
before any new chunk is made. ``DriverPlacement`` is that rule;
``MirrorPlacement`` is its opposite (every new segment above every earlier one,
no reuse), replayed beside it to tell an answer that hangs on the tie order.

Both work on simulated addresses (below ``2**57``, the free lists' packing) and
can continue from a layout made elsewhere (the recorded addresses of a replay
that followed the trace, or the seeded state of a trace that starts mid-run).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

CHUNK = 32 << 20  # the driver's granule for a new range (25,362 of 32,537 segments >= 32 MiB start on it)
TOP = 1 << 52  # simulated addresses start below this


class DriverPlacement:
    """The driver's rule as learned: lowest free range first, else a new 32 MiB-granular
    chunk below every earlier one (the segment at its bottom, the rest free)."""

    name = "driver"

    def __init__(self, live: Iterable[tuple[int, int]] = ()) -> None:
        spans = sorted(live)
        # Free ranges as sorted (address, size); merged with their neighbours on release.
        self.free: list[tuple[int, int]] = []
        if spans:
            # Continue from a layout made elsewhere: the holes between its segments are free.
            self.low = spans[0][0] - spans[0][0] % CHUNK
            end = self.low
            for addr, size in spans:
                if addr > end:
                    self.free.append((end, addr - end))
                end = max(end, addr + size)
        else:
            self.low = TOP

    def place(self, size: int) -> int:
        for k, (addr, room) in enumerate(self.free):
            if room >= size:
                if room == size:
                    del self.free[k]
                else:
                    self.free[k] = (addr + size, room - size)
                return addr
        chunk = -(-size // CHUNK) * CHUNK
        self.low -= chunk
        if chunk > size:
            self._give_back(self.low + size, chunk - size)
        return self.low

    def release(self, addr: int, size: int) -> None:
        self._give_back(addr, size)

    def _give_back(self, addr: int, size: int) -> None:
        free = self.free
        k = bisect_left(free, (addr, 0))
        if k < len(free) and free[k][0] == addr + size:  # merge with the range after
            size += free[k][1]
            del free[k]
        if k > 0 and free[k - 1][0] + free[k - 1][1] == addr:  # and the one before
            addr, size = free[k - 1][0], free[k - 1][1] + size
            del free[k - 1]
        insort(free, (addr, size))


class MirrorPlacement:
    """The opposite order: every new segment above every earlier one, freed ranges never
    reused (the model's bump pointer before issue 23)."""

    name = "mirror"

    def __init__(self, live: Iterable[tuple[int, int]] = ()) -> None:
        self.next = max((a + s for a, s in live), default=TOP)

    def place(self, size: int) -> int:
        addr = self.next
        self.next += size
        return addr

    def release(self, addr: int, size: int) -> None:
        pass


Placement = DriverPlacement | MirrorPlacement
PLACEMENTS: dict[str, type[DriverPlacement] | type[MirrorPlacement]] = {
    "driver": DriverPlacement,
    "mirror": MirrorPlacement,
}
