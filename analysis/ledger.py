"""The whole device at one moment: where every byte of the GPU went, in rows that add up.

Users ask first where the card's memory went (``nvidia-smi`` against ``memory_allocated``). At the
OOM (or, without one, the reserved peak) the ledger has one row per holder, in this order:

- ``allocated``: live tensors in PyTorch's default pool (parts: the bytes asked for, and the
  rounding of each block up to its size); from the trace.
- ``cached_free``: reserved by PyTorch but unallocated (the cache), split into what the trace can tell
  apart: blocks freed but waiting on other streams' work (``record_stream``), free blocks in another
  stream's segments, in the other size pool (small blocks of at most 1 MiB for a large request, or
  the reverse), too small for the failing request, kept whole by ``max_split_size_mb``, and large
  enough (the allocator's own flush freed them after its search); from the trace.
- ``private_pools``: segments of private pools (CUDA graphs, ``torch.cuda.MemPool``, a server's
  cache), one part per pool named by what made it; from the trace.
- ``non_pytorch``: this process outside PyTorch's cache (CUDA context, library workspaces, NCCL):
  the message's "this process has X memory in use" less what PyTorch reserved.
- ``other_processes``: the message's "Process N has X memory in use" lines, one part per process,
  and memory in use by no listed process (another container's, the driver's), inferred.
- ``free``: the device's free memory: the trace's own OOM entry (``device_free``, exact), else the
  message's "of which X is free".

The device's size (``total_bytes``) is the message's "total capacity". torch prints every figure
rounded to two decimals (``analysis.limits.Figure``: a range), so the printed figures rarely add up
to the printed total; each is moved inside its own printed range until they do (``_reconcile``), and
only what no range absorbs is memory of no listed process. Without the message the ledger has the
rows the trace alone knows and ``total_bytes`` is null. Pure: a function of typed inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analysis.allocator.config import AllocatorConfig, is_small
from analysis.allocator.recorded import RecordedReplay
from analysis.allocator.states import AllocatorState
from analysis.categories import PrivatePool, private_pools
from analysis.limits import Figure, OomMessage
from analysis.memory_summary import MemorySummary
from analysis.model import ACTIVE_ALLOCATED, ACTIVE_PENDING_FREE, DeviceData, Snapshot
from analysis.readout import size as format_size
from analysis.stacks import StackCatalog

TRACE, MESSAGE, INFERRED = "trace", "message", "inferred"
SUMMARY = "summary"  # torch.cuda.memory_summary(), on the triage page only
ROW_IDS = ("allocated", "cached_free", "private_pools", "non_pytorch", "other_processes", "free")
ROW_LABELS = {
    "allocated": "allocated by PyTorch (live tensors)",
    "cached_free": "reserved by PyTorch but unallocated (its cache)",
    "private_pools": "private pools (CUDA graphs, memory pools)",
    "non_pytorch": "this process outside PyTorch's cache (CUDA context, library workspaces, NCCL)",
    "other_processes": "other processes",
    "free": "free on the device",
}
PART_LABELS = {
    "requested": "asked for by the program",
    "rounding": "rounding of each block up to its size",
    "pending_free": "freed, waiting on other streams' work (record_stream)",
    "other_stream": "free, in another stream's segments",
    "other_size_pool": "free, in the other size pool (small blocks: at most 1 MiB)",
    "small_pool": "free, in small-block segments (requests up to 1 MiB)",
    "large_pool": "free, in large-block segments",
    "too_small": "free blocks too small for the failing request",
    "kept_whole": "free blocks kept whole by max_split_size_mb",
    "large_enough": "free blocks large enough, freed by the allocator's own flush after its search",
    "unlisted": "in use by no process the message lists (another container's, the driver's)",
    # torch >= 2.6 prints the private pools' free bytes ("with X allocated in private pools"); their live
    # tensors are inside its "allocated by PyTorch".
    "pools_free": "private pools' free memory (CUDA graphs, memory pools; their live tensors are under allocated)",
}


@dataclass(frozen=True, slots=True)
class LedgerPart:
    id: str
    label: str
    bytes: int
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "label": self.label, "bytes": self.bytes, "source": self.source}


@dataclass(frozen=True, slots=True)
class LedgerRow:
    id: str  # one of ROW_IDS
    label: str
    bytes: int
    source: str  # trace | message | inferred
    parts: tuple[LedgerPart, ...] = ()  # add up to ``bytes`` when given

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "label": self.label,
            "bytes": self.bytes,
            "source": self.source,
            "parts": [p.to_json() for p in self.parts],
        }


@dataclass(frozen=True, slots=True)
class Ledger:
    """``devices[].ledger``: the rows add up to ``total_bytes`` where the device's size is known."""

    moment: str  # "oom" | "peak" (the reserved peak)
    event_index: int | None  # None: from the OOM message alone
    total_bytes: int | None
    rows: tuple[LedgerRow, ...]
    note: str = ""

    def row(self, row_id: str) -> LedgerRow | None:
        return next((r for r in self.rows if r.id == row_id), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "moment": self.moment,
            "event_index": self.event_index,
            "total_bytes": self.total_bytes,
            "rows": [r.to_json() for r in self.rows],
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class FailedRequest:
    """The OOM's request, as ``get_free_block`` searched for it."""

    size: int  # the request's bytes (rounded here by the recorded settings)
    stream: int
    pool: int
    device_free: int  # the trace's OOM entry: cudaMemGetInfo's free bytes at the failure


@dataclass(frozen=True, slots=True)
class LedgerInput:
    """What the ledger reads: the allocator's state at the moment, and what else is known of it."""

    moment: str  # "oom" | "peak"
    state: AllocatorState
    pools: tuple[PrivatePool, ...]  # the state's private pools (categories.private_pools)
    config: AllocatorConfig  # the recorded settings (size pools, max_split_size)
    request: FailedRequest | None = None  # at an OOM
    message: OomMessage | None = None  # torch's message of this OOM


def device_ledger(
    snapshot: Snapshot,
    dev: DeviceData,
    replay: RecordedReplay,
    catalog: StackCatalog,
    config: AllocatorConfig,
    oom_index: int | None,
    message: OomMessage | None,
) -> Ledger:
    """One device's ledger at its last OOM (``oom_index``), else its reserved peak, from its recorded
    replay; ``message`` is torch's message of that OOM (None: not given, or another device's)."""
    trace = dev.trace
    request = None
    if oom_index is not None:
        i = oom_index  # the model keeps an OOM entry's device_free in its addr column
        request = FailedRequest(int(trace.size[i]), int(trace.stream[i]), int(trace.pool[i]), int(trace.addr[i]))
    at = oom_index if oom_index is not None else (int(replay.peak_reserved_index) if len(trace) else -1)
    state = replay.blocks_at(at)
    pools = private_pools(state, catalog, snapshot.pools)
    moment = "oom" if oom_index is not None else "peak"
    return build_ledger(LedgerInput(moment, state, pools, config, request, message))


def build_ledger(inp: LedgerInput) -> Ledger:
    """The ledger at ``inp.state``'s moment (see the module's docstring)."""
    cache = [_allocated_row(inp.state), _cached_free_row(inp), _pools_row(inp.pools)]
    reserved = sum(r.bytes for r in cache)
    msg, req = inp.message, inp.request
    free: tuple[int, Figure | None, str] | None = None
    if req is not None:
        free = (req.device_free, None, TRACE)
    elif msg is not None and msg.device_free is not None:
        free = (msg.device_free.value, msg.device_free, MESSAGE)
    if msg is None or msg.total_capacity is None or msg.process_in_use is None or free is None:
        rows = cache + ([LedgerRow("free", ROW_LABELS["free"], free[0], free[2])] if free is not None else [])
        return Ledger(inp.moment, inp.state.index, None, tuple(rows), _without_message_note(msg, free))
    return _with_message(inp.moment, inp.state.index, cache, reserved, msg, free)


def message_ledger(
    msg: OomMessage, summary: MemorySummary | None = None, summary_at_oom: bool = False
) -> Ledger | None:
    """The ledger from torch's OOM message alone (the triage page): every row from its printed figures,
    reconciled to its total like the report's; None for a message without the figures (torch < 2.1).
    A ``memory_summary()`` printed at the OOM (``summary_at_oom``: its reserved and allocated memory
    are the message's) splits the cache into its small-block part and the rest."""
    if msg.allocated is None or msg.reserved is None or msg.total_capacity is None or msg.process_in_use is None:
        return None
    if msg.device_free is None:
        return None
    pools = msg.private_pools.value if msg.private_pools is not None else 0
    unallocated = (msg.reserved - msg.allocated).value
    cache = [
        LedgerRow("allocated", ROW_LABELS["allocated"], max(0, msg.allocated.value - pools), MESSAGE),
        LedgerRow(
            "cached_free",
            ROW_LABELS["cached_free"],
            unallocated,
            MESSAGE,
            _summary_parts(unallocated, summary) if summary_at_oom and not pools else (),
        ),
        LedgerRow("private_pools", PART_LABELS["pools_free"] if pools else ROW_LABELS["private_pools"], pools, MESSAGE),
    ]
    free = (msg.device_free.value, msg.device_free, MESSAGE)
    return _with_message("oom", None, cache, msg.reserved.value, msg, free)


def _summary_parts(unallocated: int, summary: MemorySummary | None) -> tuple[LedgerPart, ...]:
    """The cache's small-block part from the summary's small pool (reserved - allocated), the rest inferred."""
    if summary is None:
        return ()
    reserved, allocated = (
        summary.get("reserved_bytes.small_pool.current"),
        summary.get("allocated_bytes.small_pool.current"),
    )
    if reserved is None or allocated is None:
        return ()
    small = min(unallocated, max(0, reserved.value - allocated.value))
    parts = (
        LedgerPart("small_pool", PART_LABELS["small_pool"], small, SUMMARY),
        LedgerPart("large_pool", PART_LABELS["large_pool"], unallocated - small, INFERRED),
    )
    return _nonzero(parts)


def _allocated_row(state: AllocatorState) -> LedgerRow:
    size = requested = 0
    for seg in state.segments:
        if seg.pool != 0:
            continue
        for b in seg.blocks:
            if b.state == ACTIVE_ALLOCATED:
                size += b.size
                requested += min(b.requested_size, b.size)
    parts = (
        LedgerPart("requested", PART_LABELS["requested"], requested, TRACE),
        LedgerPart("rounding", PART_LABELS["rounding"], size - requested, TRACE),
    )
    return LedgerRow("allocated", ROW_LABELS["allocated"], size, TRACE, _nonzero(parts))


def _cached_free_row(inp: LedgerInput) -> LedgerRow:
    """The default pool's reserved-but-unallocated bytes, each block under the first reason it could
    not serve the failing request (without an OOM: pending, small-pool or large-pool)."""
    req, cfg = inp.request, inp.config
    wanted = cfg.round_size(req.size) if req is not None else 0
    sums: dict[str, int] = {}
    for seg in inp.state.segments:
        if seg.pool != 0:
            continue
        small_segment = seg.segment_type == "small"
        for b in seg.blocks:
            if b.state == ACTIVE_ALLOCATED:
                continue
            if b.state == ACTIVE_PENDING_FREE:
                why = "pending_free"
            elif req is None:
                why = "small_pool" if small_segment else "large_pool"
            elif seg.stream != req.stream:
                why = "other_stream"
            elif small_segment != is_small(wanted):
                why = "other_size_pool"
            elif b.size < wanted:
                why = "too_small"
            elif not cfg.block_fits(b.size, wanted):
                why = "kept_whole"
            else:
                why = "large_enough"
            sums[why] = sums.get(why, 0) + b.size
    parts = tuple(LedgerPart(k, PART_LABELS[k], v, TRACE) for k, v in sums.items() if k in PART_LABELS)
    order = list(PART_LABELS)
    parts = tuple(sorted(parts, key=lambda p: order.index(p.id)))
    return LedgerRow("cached_free", ROW_LABELS["cached_free"], sum(sums.values()), TRACE, _nonzero(parts))


def _pools_row(pools: tuple[PrivatePool, ...]) -> LedgerRow:
    parts = tuple(LedgerPart(f"pool_{p.pool_id[0]}_{p.pool_id[1]}", p.label, p.reserved_bytes, TRACE) for p in pools)
    return LedgerRow("private_pools", ROW_LABELS["private_pools"], sum(p.bytes for p in parts), TRACE, parts)


def _nonzero(parts: tuple[LedgerPart, ...]) -> tuple[LedgerPart, ...]:
    kept = tuple(p for p in parts if p.bytes)
    return kept if len(kept) > 1 else ()  # one part is the row itself


def _without_message_note(msg: OomMessage | None, free: tuple[int, Figure | None, str] | None) -> str:
    if msg is not None:
        return "The OOM message lacks the device's total or this process's figure: the rows the trace knows."
    where = " and the device's free memory at the OOM" if free is not None else ""
    return (
        f"From the trace alone: PyTorch's own memory{where}. The OOM message tells the rest (this process outside "
        "PyTorch's cache, other processes, the device's size): give it with the snapshot."
    )


def _with_message(
    moment: str,
    index: int | None,
    cache: list[LedgerRow],
    reserved: int,
    msg: OomMessage,
    free: tuple[int, Figure | None, str],
) -> Ledger:
    """The rows of the message beside the trace's, reconciled to the printed total."""
    assert msg.total_capacity is not None
    assert msg.process_in_use is not None
    total = msg.total_capacity.value
    # Rounded figures, each free to move inside its printed range: this process, the listed
    # processes, and the free memory where only the message gives it.
    figures: list[Figure] = [msg.process_in_use] + [f for _, f in msg.other_processes]
    if free[1] is not None:
        figures.append(free[1])
    target = total - (0 if free[1] is not None else free[0])
    values, left = _reconcile(figures, target)
    process = values[0]
    others = values[1 : 1 + len(msg.other_processes)]
    free_bytes = values[-1] if free[1] is not None else free[0]
    non_pytorch = process - reserved
    notes = []
    if non_pytorch < 0:
        notes.append("The message's figure for this process is below what the trace shows PyTorch reserved.")
        left += non_pytorch  # the process held at least what PyTorch reserved
        non_pytorch = 0
    parts = [
        LedgerPart(f"process_{pid}", f"process {pid}", b, MESSAGE)
        for (pid, _), b in zip(msg.other_processes, others, strict=True)
    ]
    # The message's own list (none listed is the message's word too), unless only inferred bytes fill it.
    other_source = INFERRED if left > 0 and not parts else MESSAGE
    if left > 0:
        parts.append(LedgerPart("unlisted", PART_LABELS["unlisted"], left, INFERRED))
    elif left < 0:
        # The figures pass the device's size beyond their rounding: NVML's per-process figures and the
        # free memory are read at different instants (a process that exits between them). The device's
        # size and the free memory hold; other processes (then this process's rest) are what is left.
        excess = -left
        listed = sum(p.bytes for p in parts)
        notes.append(
            f"The message's figures pass the device's {format_size(total)} by {format_size(excess)} beyond their "
            "rounding (the processes' figures and the free memory are read at different instants): other processes "
            f"are shown as what the rest leaves{'' if not parts else ' (listed: ' + format_size(listed) + ')'}."
        )
        cut = min(excess, listed)
        parts = [LedgerPart("left", "what the device's size leaves", listed - cut, INFERRED)] if listed - cut else []
        other_source, excess = INFERRED, excess - cut
        cut = min(excess, non_pytorch)
        non_pytorch, excess = non_pytorch - cut, excess - cut
        total += excess  # past every row the trace does not fix: the figures' sum stands
    rows = [
        *cache,
        LedgerRow("non_pytorch", ROW_LABELS["non_pytorch"], non_pytorch, MESSAGE),
        LedgerRow(
            "other_processes",
            ROW_LABELS["other_processes"],
            sum(p.bytes for p in parts),
            other_source,
            tuple(parts) if len(parts) > 1 else (),
        ),
        LedgerRow("free", ROW_LABELS["free"], free_bytes, free[2]),
    ]
    return Ledger(moment, index, total, tuple(rows), " ".join(notes))


def _reconcile(figures: list[Figure], target: int) -> tuple[list[int], int]:
    """The printed values moved inside their ranges, widest first, so that they sum to ``target``
    as far as the ranges allow; with what is left over (positive: more in use than they show)."""
    values = [f.value for f in figures]
    left = target - sum(values)
    for k in sorted(range(len(figures)), key=lambda k: -(figures[k].high - figures[k].low)):
        if left == 0:
            break
        f = figures[k]
        moved = min(left, f.high - values[k]) if left > 0 else max(left, f.low - values[k])
        values[k] += moved
        left -= moved
    return values, left
