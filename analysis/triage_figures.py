"""The figures a CUDA OOM's texts give, worked out once for the triage, and the findings that word them.

``arithmetic`` reads the OOM message (and ``torch.cuda.memory_summary()``'s figures where there
are some) into ``Arithmetic``: the limit that bound (the per-process cap's room or the device's
free memory), the room and the shortfall, the memory reserved but unallocated and what a request
of this size can use of it, the memory outside this process's cache, the cache's free pieces.
Every printed figure is a range (``limits.Figure``), and so is each one computed from them.
``findings`` are the sentences behind the triage's verdict (``analysis.triage``), each with its
figures, in the order a reader checks them. Pure: stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analysis.limits import Figure, GiB, MiB, OomMessage
from analysis.memory_summary import MemorySummary, TriageError
from analysis.readout import size  # torch's format_size, the report's one wording of sizes (stdlib only)

# The largest request the small pool serves (kSmallSize in CUDACachingAllocator.cpp).
SMALL_REQUEST_MAX = 1 * MiB
# This process's memory outside PyTorch's cache is named as the cause only above this: a CUDA
# context with its lazily loaded kernels is 0.3-1 GiB by itself (0.51-0.75 GiB in the H200 messages here)
# and cannot be given back; more than that is a library's own pool (NCCL, cuDNN workspaces, CuPy, JAX).
NON_PYTORCH_NOTABLE = 1 * GiB


@dataclass(frozen=True, slots=True)
class FreePieces:
    """The cache's free pieces at the OOM, from the summary's "Non-releasable" rows (large pool).

    The summary gives their total and their number, not their sizes: the largest lies between
    their mean and their total.
    """

    pool: str
    total: Figure
    count: Figure
    largest_at_least: int
    largest_at_most: int

    def to_json(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "total": self.total.to_json(),
            "count": self.count.to_json(),
            "largest_at_least_bytes": self.largest_at_least,
            "largest_at_most_bytes": self.largest_at_most,
        }


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the text shows, in a sentence with its figures."""

    key: str
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "text": self.text}


def _derived(value: int, low: int, high: int) -> Figure:
    """A figure computed from printed ones: its own text, the range it inherits."""
    return Figure(size(max(0, value)), max(0, value), max(0, low), max(0, high))


def _minus(a: Figure, b: Figure) -> Figure:
    d = a - b
    return _derived(a.value - b.value, d.low, d.high)


def _overlaps(a: Figure, b: Figure) -> bool:
    return a.low <= b.high and b.low <= a.high


def total_of(figures: list[Figure]) -> Figure | None:
    if not figures:
        return None
    total = figures[0]
    for f in figures[1:]:
        total = total + f
    return _derived(total.value, total.low, total.high)


def covers(amount: Figure | None, need: Figure) -> bool | None:
    """Does ``amount`` cover ``need``? True/False when the rounding cannot change it, else None."""
    if amount is None:
        return False
    if amount.low >= need.high:
        return True
    if amount.high < need.low:
        return False
    return None


def _summary_timing(message: OomMessage, summary: MemorySummary) -> str:
    """When the summary was printed, judged from its current figures against the message's.

    Freeing tensors (the exception unwinding) changes allocated memory but returns it to the cache,
    so reserved memory stays; so: both match, at the OOM; reserved only, after the tensors went;
    neither, another moment (after ``empty_cache``, another device, another OOM).
    """
    reserved = summary.get("reserved_bytes.all.current")
    allocated = summary.get("allocated_bytes.all.current")
    if message.device is not None and summary.device is not None and message.device != summary.device:
        return "other"
    if message.reserved is None or message.allocated is None or reserved is None or allocated is None:
        return "other"
    if not _overlaps(reserved, message.reserved):
        return "other"
    return "at-oom" if _overlaps(allocated, message.allocated) else "after-oom"


def _free_pieces(summary: MemorySummary) -> FreePieces | None:
    total = summary.get("inactive_split_bytes.large_pool.current")
    count = summary.get("inactive_split.large_pool.current")
    pool = "large"
    if total is None or count is None:  # an abbreviated table: both pools together
        total = summary.get("inactive_split_bytes.all.current")
        count = summary.get("inactive_split.all.current")
        pool = "all"
    if total is None or count is None or count.high == 0:
        return None
    least = -(-total.low // count.high) if count.low > 0 else 0
    return FreePieces(pool, total, count, least, total.high)


@dataclass(frozen=True, slots=True)
class Arithmetic:
    """The figures the rules read, worked out once from the texts (``findings`` and ``triage._verdict`` share them)."""

    message: OomMessage
    summary: MemorySummary | None
    timing: str | None  # the summary's: at-oom | after-oom | other | None
    binding: str  # per-process-cap | device
    binding_certain: bool  # the rounding cannot swap the two limits
    room: Figure
    shortfall: Figure
    unallocated: Figure
    usable: Figure  # of the unallocated memory, what a request of this size can use
    others: Figure | None  # every listed other process, together
    non_pytorch: Figure | None  # this process's memory outside PyTorch's cache
    unaccounted: Figure | None  # used on the device, by no process the message lists
    pieces: FreePieces | None

    def outside(self) -> list[tuple[str, Figure]]:
        """The memory outside this process's PyTorch cache that counts against a full device, worded.

        This process's non-PyTorch memory, and memory no listed process accounts for, count only above
        ``NON_PYTORCH_NOTABLE``: below it they are a CUDA context, which no change gives back.
        """
        held: list[tuple[str, Figure]] = []
        if self.others is not None:
            count = len(self.message.other_processes)
            held.append(("another process" if count == 1 else f"{count} other processes", self.others))
        if self.non_pytorch is not None and self.non_pytorch.low > NON_PYTORCH_NOTABLE:
            held.append(("this process outside PyTorch's cache", self.non_pytorch))
        if self.unaccounted is not None and self.unaccounted.low > NON_PYTORCH_NOTABLE:
            held.append(
                (
                    "memory no listed process accounts for"
                    if self.message.process_in_use is not None
                    else "memory held outside PyTorch's cache by processes this older message layout does not name",
                    self.unaccounted,
                )
            )
        return held


def arithmetic(message: OomMessage, summary: MemorySummary | None) -> Arithmetic:
    if message.reserved is None or message.allocated is None or message.device_free is None:
        raise TriageError(
            "oom_message:incomplete",
            "the OOM message lacks the allocated, reserved or free figures a triage needs",
        )
    tried, reserved, free = message.tried, message.reserved, message.device_free
    unallocated = _minus(reserved, message.allocated)

    # Which limit stopped the request: the cap's room (allowed - reserved) or the device's free memory.
    cap_room = _minus(message.allowed, reserved) if message.allowed is not None else None
    if cap_room is not None and cap_room.value <= free.value:
        binding, room = "per-process-cap", cap_room
    else:
        binding, room = "device", free
    binding_certain = cap_room is None or cap_room.high < free.low or free.high < cap_room.low
    shortfall = _derived(tried.value - room.value, tried.low - room.high, tried.high - room.low)

    timing = _summary_timing(message, summary) if summary is not None else None
    usable = unallocated
    pieces = None
    if summary is not None and timing == "at-oom":
        pieces = _free_pieces(summary)
        large = summary.get("inactive_split_bytes.large_pool.current")
        # Small-pool pieces (2 MiB segments for requests up to 1 MiB) never serve a larger request.
        if large is not None and tried.low > SMALL_REQUEST_MAX:
            usable = _derived(large.value, large.low, large.high)
    others = total_of([f for _, f in message.other_processes])
    non_pytorch = message.non_pytorch
    if non_pytorch is not None:
        non_pytorch = _derived(non_pytorch.value, non_pytorch.low, non_pytorch.high)
    # The device's capacity minus its free memory is what every process uses: whatever this process and
    # the listed ones do not account for (the old layout lists none, and names no non-PyTorch memory;
    # NVML may not list another container's processes) is held by someone else.
    unaccounted = None
    if message.total_capacity is not None:
        used = _minus(message.total_capacity, free)
        unaccounted = _minus(used, message.process_in_use or reserved)
        if others is not None:
            unaccounted = _minus(unaccounted, others)
    return Arithmetic(
        message=message,
        summary=summary,
        timing=timing,
        binding=binding,
        binding_certain=binding_certain,
        room=room,
        shortfall=shortfall,
        unallocated=unallocated,
        usable=usable,
        others=others,
        non_pytorch=non_pytorch,
        unaccounted=unaccounted,
        pieces=pieces,
    )


def findings(a: Arithmetic) -> list[Finding]:
    """The sentences behind the verdict, each with its figures, in the order a reader checks them."""
    message, tried, room, shortfall, unallocated = a.message, a.message.tried, a.room, a.shortfall, a.unallocated
    out: list[Finding] = []
    if a.binding == "per-process-cap" and message.allowed is not None and message.reserved is not None:
        out.append(
            Finding(
                "limit",
                f"A per-process cap of {message.allowed.text} was set, and it bound: PyTorch had reserved "
                f"{size(message.reserved.value)}, leaving {room.text} under the cap, "
                f"while the device had {message.device_free.text if message.device_free else 'more'} free.",
            )
        )
    else:
        cap = f" (the cap of {message.allowed.text} was not reached)" if message.allowed is not None else ""
        out.append(Finding("limit", f"The device itself was full: {room.text} free{cap}."))
    out.append(
        Finding(
            "request",
            f"The request for {tried.text} (the segment size the allocator wanted) lacked {shortfall.text}."
            if shortfall.value > 0
            else f"The request for {tried.text} (the segment size the allocator wanted) fits in that room, by the "
            "message's own figures.",
        )
    )
    if unallocated.value == 0:
        text = "Nothing was reserved but unallocated: every byte PyTorch had reserved held a live tensor."
    elif shortfall.value == 0:
        text = f"{unallocated.text} was reserved by PyTorch but unallocated."
    else:
        text = (
            f"{unallocated.text} was reserved by PyTorch but unallocated, {share(unallocated, shortfall)}; the "
            "allocator had already released every cached segment it could, so this memory lies in pieces inside "
            "segments that hold live tensors."
        )
    out.append(Finding("unallocated", text))
    if a.others is not None:
        listed = ", ".join(f"{pid} ({f.text})" for pid, f in message.other_processes[:8])
        more = f" and {len(message.other_processes) - 8} more" if len(message.other_processes) > 8 else ""
        where = (
            "they do not count against this process's cap, which is what bound"
            if a.binding == "per-process-cap"
            else share(a.others, shortfall)
        )
        out.append(
            Finding("other-processes", f"Other processes on the device hold {a.others.text}: {listed}{more}; {where}.")
        )
    if a.non_pytorch is not None and message.process_in_use is not None:
        out.append(
            Finding(
                "non-pytorch",
                f"This process uses {message.process_in_use.text} in all, {a.non_pytorch.text} of it outside "
                "PyTorch's cache (the CUDA context and its kernels, cuBLAS/cuDNN/NCCL workspaces, other libraries); "
                + (
                    "the cap does not count it."
                    if a.binding == "per-process-cap"
                    else "it is part of what filled the device."
                ),
            )
        )
    if a.unaccounted is not None and a.unaccounted.low > NON_PYTORCH_NOTABLE:
        whose = (
            "by no process the message lists (NVML may not list processes of other containers or users)"
            if message.process_in_use is not None
            else "outside PyTorch's cache, by this process's CUDA context or by other processes (this message's "
            "layout does not say which)"
        )
        out.append(Finding("unaccounted", f"{a.unaccounted.text} of the device is in use {whose}."))
    if a.summary is not None:
        out.extend(_summary_findings(message, a.summary, a.timing, unallocated, a.usable, a.pieces))
    return out


def share(part: Figure, whole: Figure, of: str = "the shortfall") -> str:
    """``part`` against ``whole`` in words: "7 times the shortfall", "40% of the shortfall"."""
    if whole.value <= 0:
        return f"more than {of}"
    ratio = part.value / whole.value
    return f"{ratio:.0f} times {of}" if ratio >= 2 else f"{100 * ratio:.0f}% of {of}"


def _summary_findings(
    message: OomMessage,
    summary: MemorySummary,
    timing: str | None,
    unallocated: Figure,
    usable: Figure,
    pieces: FreePieces | None,
) -> list[Finding]:
    out: list[Finding] = []
    if timing == "at-oom":
        out.append(
            Finding("summary-timing", "The memory summary was printed at the OOM: its figures match the message's.")
        )
        out += _at_oom_findings(message.tried, summary, unallocated, usable, pieces)
    elif timing == "after-oom":
        out.append(
            Finding(
                "summary-timing",
                "The memory summary was printed after the OOM, once the failing step's tensors were freed (its "
                "reserved memory matches the message, its allocated memory does not): only its peaks and counts "
                "speak of the OOM.",
            )
        )
    else:
        out.append(
            Finding(
                "summary-timing",
                "The memory summary does not match the message (another moment, after empty_cache, or another "
                "device): only its peaks and counts are used.",
            )
        )
    return out + _counter_findings(summary)


def _at_oom_findings(
    tried: Figure, summary: MemorySummary, unallocated: Figure, usable: Figure, pieces: FreePieces | None
) -> list[Finding]:
    """What a summary printed at the OOM adds: which pool the free memory is in, its pieces, the segments."""
    out: list[Finding] = []
    if usable is not unallocated and tried.low > SMALL_REQUEST_MAX and unallocated.value > 0:
        small = summary.get("inactive_split_bytes.small_pool.current")
        out.append(
            Finding(
                "pools",
                f"Of the memory reserved but unallocated, {usable.text} is in the large pool, the only one a "
                f"{tried.text} request can use"
                + (f"; {size(small.value)} is small-pool pieces (for requests up to 1 MiB)." if small else "."),
            )
        )
    if pieces is not None:
        fits = (
            "none of them can hold the request"
            if pieces.largest_at_most < tried.low
            else "at least one is as large as the request, so it was on another stream or in a private pool"
            if pieces.largest_at_least >= tried.high
            else "the summary cannot tell whether one of them was large enough"
        )
        out.append(
            Finding(
                "free-pieces",
                f"The free pieces ({pieces.pool} pool): {pieces.count.text.strip()} of them, "
                f"{size(pieces.total.value)} in all, so the largest is between "
                f"{size(pieces.largest_at_least)} and {size(pieces.largest_at_most)}; {fits}.",
            )
        )
    segments = summary.get("segment.all.current")
    reserved = summary.get("reserved_bytes.all.current")
    if segments is not None and reserved is not None and segments.value > 0:
        out.append(
            Finding(
                "segments",
                f"{segments.value} segments reserved, {size(reserved.value // segments.value)} each on average.",
            )
        )
    return out


def _counter_findings(summary: MemorySummary) -> list[Finding]:
    """What a summary's peaks and counters say whenever it was printed."""
    out: list[Finding] = []
    peak_reserved = summary.get("reserved_bytes.all.peak")
    peak_allocated = summary.get("allocated_bytes.all.peak")
    if peak_reserved is not None and peak_allocated is not None:
        out.append(
            Finding(
                "peaks",
                f"Peaks since the process started (or the last reset): {size(peak_allocated.value)} allocated, "
                f"{size(peak_reserved.value)} reserved.",
            )
        )
    if summary.num_ooms is not None and summary.num_ooms > 1:
        out.append(
            Finding(
                "earlier-ooms",
                f"The process had {summary.num_ooms} OOMs, not one: earlier ones were caught and the run went on "
                "(a retry with a smaller batch, or a skipped step).",
            )
        )
    # Every OOM comes after one release-and-retry of its own; retries beyond those were earlier
    # requests that fitted only once the cache was emptied.
    extra = (summary.num_alloc_retries or 0) - (summary.num_ooms or 0)
    if extra > 0:
        out.append(
            Finding(
                "retries",
                f"{extra} earlier request{'s' if extra > 1 else ''} fitted only after the allocator released its "
                "cache and retried cudaMalloc: memory was tight before this OOM too.",
            )
        )
    oversize = summary.get("oversize_allocations.allocated")
    if oversize is not None and oversize.high > 0:
        out.append(
            Finding(
                "max-split-size",
                f"{oversize.text.strip()} oversize allocations: max_split_size_mb is set (only then are requests "
                "counted as oversize).",
            )
        )
    return out
