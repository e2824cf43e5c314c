"""The columnar model of a snapshot: what every analysis reads.

The reader converts the pickle's object graph into this form once, so the graph
can be dropped: per device, numpy columns of the trace; the final segments and
blocks as small frozen dataclasses; one interned table of frames and stacks.

Conventions (relied on by replay, allocator and the analyses):
- A trace is per device, oldest event first, in recorded order.
- ``Trace.addr`` holds the block/segment address; for an ``oom`` event, which has
  no address, it holds the event's ``device_free`` instead.
- ``Trace.stream`` is an ordinal into ``DeviceData.streams`` (raw cudaStream_t
  values are host pointers; ordinals keep the columns small).
- ``Trace.pool`` is an ordinal into ``Snapshot.pools``; ordinal 0 is always the
  default pool ``(0, 0)``. Where events carry no ``pool_id`` it is 0.
- ``Trace.stack`` is an index into ``Snapshot.stacks``; -1 means "no frames".
- ``Trace.time_us`` is 0 where the file has no ``time_us``.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

# Action codes of ``Trace.action``. The order is part of the model: never renumber.
ACTIONS: tuple[str, ...] = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
)
ACTION_CODE: dict[str, int] = {name: code for code, name in enumerate(ACTIONS)}
ALLOC, FREE_REQUESTED, FREE_COMPLETED = 0, 1, 2
SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP = 3, 4, 5, 6
SNAPSHOT, OOM = 7, 8

DEFAULT_POOL: tuple[int, int] = (0, 0)

# Block states as the snapshot spells them.
ACTIVE_ALLOCATED = "active_allocated"
ACTIVE_PENDING_FREE = "active_pending_free"
INACTIVE = "inactive"
BLOCK_STATES: frozenset[str] = frozenset({ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, INACTIVE})
SEGMENT_TYPES: frozenset[str] = frozenset({"small", "large"})

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]


@dataclass(frozen=True, slots=True)
class Frame:
    filename: str
    line: int
    name: str


@dataclass(slots=True)
class StackTable:
    """Interned frames and stacks. A stack is a tuple of frame ids, innermost first."""

    frames: list[Frame] = field(default_factory=list)
    stacks: list[tuple[int, ...]] = field(default_factory=list)

    def frames_of(self, stack_id: int) -> list[Frame]:
        if stack_id < 0:
            return []
        return [self.frames[i] for i in self.stacks[stack_id]]


@dataclass(frozen=True, slots=True)
class Block:
    address: int
    size: int
    requested_size: int
    state: str
    stack: int = -1


@dataclass(frozen=True, slots=True)
class Segment:
    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    requested_size: int
    stream: int  # ordinal into DeviceData.streams
    segment_type: str  # "small" | "large"
    pool: int  # ordinal into Snapshot.pools
    is_expandable: bool
    blocks: tuple[Block, ...]
    stack: int = -1


@dataclass(slots=True)
class Trace:
    """One device's trace as parallel columns (all the same length)."""

    action: I8
    addr: I64
    size: I64
    stream: I32
    time_us: I64
    stack: I32
    pool: I32

    def __len__(self) -> int:
        return int(self.action.shape[0])

    @classmethod
    def empty(cls) -> Trace:
        return cls(
            action=np.zeros(0, np.int8),
            addr=np.zeros(0, np.int64),
            size=np.zeros(0, np.int64),
            stream=np.zeros(0, np.int32),
            time_us=np.zeros(0, np.int64),
            stack=np.zeros(0, np.int32),
            pool=np.zeros(0, np.int32),
        )


def sorted_unique(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``np.unique`` of a 1-D integer array: its distinct values, ascending. np.unique's first call
    without ``return_*`` imports numpy.ma (~10 ms, once per process) to ask whether it is masked.
    Equal values are alike, so the sort need not be stable: numpy's default (a vectorised quicksort)
    took 2.5 ms for the 460 MB trace's 446k large request sizes where the stable one took 15 ms."""
    ordered = np.sort(values)
    keep = np.ones(ordered.shape[0], bool)
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


# Digits of address_order's radix sort; past this many 16-bit digits a comparison sort is as quick.
_ADDRESS_DIGITS = 3
# address_runs' last answer by the address column it was computed on (id -> (column, idx, answer)),
# dropped with its column: the lifetimes and the completeness check order the same events, one
# device after the other (with the Python loops: the compiled ones pair them without the sort,
# analysis.allocator.compiled.alloc_ends).
_ADDRESS_ORDERS: dict[int, tuple[weakref.ref[I64], I64, tuple[I64, npt.NDArray[np.bool_]]]] = {}


def address_order(addr: I64, idx: I64) -> I64:
    """Positions into ``idx`` (event indices, ascending) that order its events by address, each
    address's events in trace order: ``np.argsort(addr[idx], kind="stable")`` (``address_runs``)."""
    return address_runs(addr, idx)[0]


def address_runs(addr: I64, idx: I64) -> tuple[I64, npt.NDArray[np.bool_]]:
    """``address_order(addr, idx)``, and whether each event in that order has the same address as
    the next one (one fewer than the events).

    Pairing events by address (an alloc with its free) needs this order on millions of events;
    numpy's stable sort of int64 is a comparison sort, of uint16 a counting sort several times
    quicker. Addresses share their alignment, so relative to the lowest and in units of it they
    fit in a few 16-bit digits: a least-significant-digit radix sort, a stable pass per digit.

    The last answer is kept while ``addr`` lives, and given again (read-only) for the same
    ``idx``: a trace's columns are never written once read. ``idx`` is kept with it, read-only."""
    key = id(addr)
    memo = _ADDRESS_ORDERS.get(key)
    if memo is not None and memo[0]() is addr and memo[1].shape == idx.shape and np.array_equal(memo[1], idx):
        return memo[2]
    order, same = _radix_order(addr[idx])
    if idx.shape[0] > 1:
        order.flags.writeable = False
        same.flags.writeable = False
        idx.flags.writeable = False
        _ADDRESS_ORDERS.clear()
        _ADDRESS_ORDERS[key] = (weakref.ref(addr, lambda _: _ADDRESS_ORDERS.pop(key, None)), idx, (order, same))
    return order, same


def _radix_order(a: I64) -> tuple[I64, npt.NDArray[np.bool_]]:
    """``np.argsort(a, kind="stable")`` by 16-bit digits of ``a`` (``address_order``'s own copy:
    it is shifted in place), and the neighbours in that order that are equal."""
    if a.shape[0] < 2:
        return np.zeros(a.shape[0], np.int64), np.zeros(0, bool)
    lo, hi = int(a.min()), int(a.max())
    if hi - lo >= 1 << 62:  # hostile values: a - lo would overflow
        return _compared_order(a)
    a -= lo
    common = int(np.bitwise_or.reduce(a))
    shift = (common & -common).bit_length() - 1 if common else 0
    digits = max(1, -(-((hi - lo) >> shift).bit_length() // 16))
    if digits > _ADDRESS_DIGITS:
        return _compared_order(a)
    if shift:
        a >>= shift
    # The digits apart, and the addresses dropped before sorting (fewer fresh pages).
    parts = []
    for _ in range(digits):
        parts.append(a.astype(np.uint16))
        a >>= 16
    del a
    order = np.argsort(parts[0], kind="stable")
    for digit in parts[1:]:
        order = order[np.argsort(digit[order], kind="stable")]
    # Equal neighbours agree in every digit (2-byte columns read, not the 8-byte addresses).
    same = np.ones(order.shape[0] - 1, bool)
    for digit in parts:
        ordered = digit[order]
        same &= ordered[1:] == ordered[:-1]
    return order, same


def _compared_order(a: I64) -> tuple[I64, npt.NDArray[np.bool_]]:
    order = np.argsort(a, kind="stable")
    ordered = a[order]
    return order, ordered[1:] == ordered[:-1]


@dataclass(slots=True)
class DeviceData:
    device: int
    trace: Trace
    segments: list[Segment]
    streams: list[int]  # raw stream values; Trace.stream / Segment.stream index this
    # Interned per-event strings, sparse: event index -> text, only where the text
    # differs from the default ("N/A" for compile_context, "" for user_metadata).
    compile_context: dict[int, str] = field(default_factory=dict)
    user_metadata: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Annotation:
    name: str
    stage: str  # "START" | "END"
    device: int
    time_us: int


@dataclass(frozen=True, slots=True)
class AllocatorSettings:
    """What the snapshot says about the allocator configuration.

    ``raw`` is the settings dict as recorded (empty for files older than 2.3);
    ``conf`` is the PYTORCH_CUDA_ALLOC_CONF string. The effective values are
    parsed by ``analysis.allocator.config.AllocatorConfig.from_settings``.
    """

    recorded: bool
    conf: str
    raw: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Warning_:
    code: str
    message: str


@dataclass(slots=True)
class Snapshot:
    format: str  # "pickle" | "pickle.gz" | "torch-zip" | "json"
    layout: str  # "segments-only" (<=1.13 list) | "history" (2.0) | "modern" (2.1+)
    devices: list[DeviceData]
    pools: list[tuple[int, int]]
    stacks: StackTable
    annotations: list[Annotation]
    settings: AllocatorSettings
    warnings: list[Warning_] = field(default_factory=list)

    def device(self, ordinal: int) -> DeviceData:
        for d in self.devices:
            if d.device == ordinal:
                return d
        raise KeyError(ordinal)
