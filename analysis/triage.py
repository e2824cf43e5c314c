"""What a CUDA OOM's text alone says: the message, and ``torch.cuda.memory_summary()`` if there is one.

Most people who ran out of memory have only the exception's message, no snapshot. Its figures
(``analysis.limits.parse_oom_message``) already settle the first question a report answers, from
arithmetic alone: could this request have fitted?

- *room*: what the process could still take when the request failed. Under a per-process cap
  ("N allowed") torch refuses once its reserved memory plus the request passes the cap, so the room
  is ``allowed - reserved``; the device itself has ``free`` left. The smaller of the two is the
  limit that bound (``binding``). The *shortfall* is the request minus that room.
- *fragmentation*: when the request failed, the allocator had already released every cached
  segment it could (``release_cached_blocks``) and retried. What is still reserved but unallocated
  lies inside segments that also hold live tensors: free, but in pieces. If those pieces add up to
  the shortfall, the memory existed and was not in one piece; ``expandable_segments`` lets segments
  grow in place instead.
- *memory outside the process's cache*: other processes on the device ("Process N has X memory
  in use") and this process's memory that PyTorch's cache does not hold (the CUDA context, cuBLAS,
  NCCL, other libraries). They count only when the device, not the cap, was what ran out; then no
  ``PYTORCH_CUDA_ALLOC_CONF`` setting gives that memory back.
- *capacity*: neither covers the shortfall; the program must need less at that moment.

Every figure torch prints is rounded (``Figure`` is the range it stands for), so each verdict says
whether it holds over the whole range (``certain``).

``memory_summary()`` adds what the message lacks: how the free memory splits between the large and
the small pool (small-pool pieces never serve a request above 1 MiB), how many free pieces there are
(so bounds on the largest), the peaks, how many OOMs and cache flushes the process has had, and
whether ``max_split_size_mb`` is set (oversize counts). It is often printed after the exception
unwound and the tensors were freed; the triage compares its current figures with the message's and
uses its current columns only when they are the state at the OOM.

What no text gives, and a snapshot does, is listed in ``SNAPSHOT_ADDS`` with the lines that record one.

Pure: stdlib only (``limits`` is stdlib too). The summary parser reads a bounded text in one pass, with
``str.split`` only: the text is a user's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from analysis.limits import Figure, GiB, KiB, MiB, OomMessage, OomMessageError, parse_oom_message
from analysis.readout import size  # torch's format_size, the report's one wording of sizes (stdlib only)

SCHEMA = "oomscope.triage/1"
# torch's summary is about 6,000 characters per device; a log around it is fine, megabytes are not.
MAX_SUMMARY_CHARS = 64 * 1024
# The largest request the small pool serves (kSmallSize in CUDACachingAllocator.cpp).
SMALL_REQUEST_MAX = 1 * MiB
# This process's memory outside PyTorch's cache is named as the cause only above this: a CUDA
# context with its lazily loaded kernels is 0.3-1 GiB by itself (0.51-0.75 GiB in the H200 messages here)
# and cannot be given back; more than that is a library's own pool (NCCL, cuDNN workspaces, CuPy, JAX).
NON_PYTORCH_NOTABLE = 1 * GiB

# The verdicts (``Triage.cause``).
OUTSIDE = "outside-process"  # other processes, or this process's memory outside PyTorch's cache
FRAGMENTATION = "fragmentation"  # the cache's free pieces add up to the shortfall
CAPACITY = "capacity"  # the program needed more than there was
UNEXPLAINED = "unexplained"  # the message's own figures show room for the request

RECORD_SNAPSHOT = """import torch

# As early as possible, before the first CUDA allocation, so the trace is complete.
torch.cuda.memory._record_memory_history(max_entries=1_000_000)

try:
    train()
except torch.cuda.OutOfMemoryError:
    torch.cuda.memory._dump_snapshot("oom.pickle")
    raise"""

SNAPSHOT_ADDS = (
    "which lines of your code held the memory at the OOM and at the peak (parameters, gradients, optimizer "
    "state, activations, temporaries)",
    "the phase the OOM came in (forward, backward, optimizer step, evaluation without no_grad) and whether "
    "memory grows from step to step (a leak), with the step where the limit is reached",
    "a replay of the whole run under expandable_segments, max_split_size_mb and garbage_collection_threshold: "
    "whether a setting avoids the OOM or only postpones it to a later step",
    "the largest free block and where the free pieces lie, exactly, instead of the bounds the text allows",
)


class TriageError(ValueError):
    """A text that cannot be triaged; ``code`` is ``oom_message:<reason>`` or ``memory_summary:<reason>``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ------------------------------------------------------------------ memory_summary()

# Row titles of torch.cuda.memory_summary() -> the memory_stats() key they print, and whether
# the row is bytes (else a count). The order is torch's own (torch/cuda/memory.py).
_ROWS: dict[str, tuple[str, bool]] = {
    "Allocated memory": ("allocated_bytes", True),
    "Active memory": ("active_bytes", True),
    "Requested memory": ("requested_bytes", True),
    "GPU reserved memory": ("reserved_bytes", True),
    "Non-releasable memory": ("inactive_split_bytes", True),
    "Allocations": ("allocation", False),
    "Active allocs": ("active", False),
    "GPU reserved segments": ("segment", False),
    "Non-releasable allocs": ("inactive_split", False),
    "Oversize allocations": ("oversize_allocations", False),
    "Oversize GPU segments": ("oversize_segments", False),
}
_POOL_ROWS = {"from large pool": "large_pool", "from small pool": "small_pool"}
_COLUMNS = ("current", "peak", "allocated", "freed")
# torch >= 1.10 prints B/KiB/MiB/GiB; earlier releases KB/MB/GB with the same powers of 1024.
_SIZE_UNITS = {"B": 1, "KiB": KiB, "KB": KiB, "MiB": MiB, "MB": MiB, "GiB": GiB, "GB": GiB, "TiB": 1 << 40}
_COUNT_UNITS = {"": 1, "K": 1000, "M": 1000**2}


@dataclass(frozen=True, slots=True)
class MemorySummary:
    """The figures of one ``torch.cuda.memory_summary()`` table, under their ``memory_stats()`` keys.

    ``figures["reserved_bytes.large_pool.current"]`` is the range of byte counts the table's cell
    stands for: torch floors every cell to the unit chosen for its column (``sz //= 1024``), so
    "3010 MiB" is any count in [3010 MiB, 3011 MiB).
    """

    device: int | None
    num_ooms: int | None
    num_alloc_retries: int | None
    figures: Mapping[str, Figure]
    abbreviated: bool  # memory_summary(abbreviated=True): no per-pool rows

    def get(self, key: str) -> Figure | None:
        return self.figures.get(key)

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "num_ooms": self.num_ooms,
            "num_alloc_retries": self.num_alloc_retries,
            "abbreviated": self.abbreviated,
            "figures": {k: f.to_json() for k, f in sorted(self.figures.items())},
        }


def _floored(number: str, unit: str, scale: int) -> Figure:
    n = int(number)
    return Figure(f"{number} {unit}".strip(), n * scale, n * scale, n * scale + scale - 1)


def _cell(text: str, is_bytes: bool) -> Figure | None:
    parts = text.split()
    if not parts or not parts[0].isdigit() or len(parts) > 2:
        return None
    unit = parts[1] if len(parts) == 2 else ""
    units = _SIZE_UNITS if is_bytes else _COUNT_UNITS
    if unit not in units or (is_bytes and not unit):
        return None
    return _floored(parts[0], unit, units[unit])


def _header_count(cell: str, label: str) -> int | None:
    if label not in cell:
        return None
    word = cell.partition(label)[2].split()[:1]
    return int(word[0]) if word and word[0].isdigit() else None


def parse_memory_summary(text: str) -> MemorySummary:
    """Parse ``torch.cuda.memory_summary()`` output (text around it is ignored); ``TriageError`` if it is none.

    One pass over the lines, each split on ``|``: linear in the text, which is capped at
    ``MAX_SUMMARY_CHARS``. Several tables in one text: the first is read.
    """
    if not isinstance(text, str) or not text.strip():
        raise TriageError("memory_summary:empty", "the memory summary is empty")
    if len(text) > MAX_SUMMARY_CHARS:
        raise TriageError(
            "memory_summary:too-long", f"the memory summary is longer than {MAX_SUMMARY_CHARS:,} characters"
        )
    device = num_ooms = retries = None
    figures: dict[str, Figure] = {}
    metric: tuple[str, bool] | None = None
    tables = 0
    for line in text.splitlines():
        line = line.strip()
        if "PyTorch CUDA memory summary" in line:
            tables += 1
            if tables > 1:
                break  # the first table only: a second is another device or another moment
            word = line.partition("device ID")[2].split()[:1]
            device = int(word[0]) if word and word[0].isdigit() else None
            continue
        # Logs put a prefix before each line ("[rank0]: ", a timestamp): the table starts at its first bar.
        bar = line.find("|")
        if bar < 0 or tables == 0:
            continue
        cells = [c.strip() for c in line[bar:].strip("|").split("|")]
        if len(cells) == 2 and "CUDA OOMs:" in cells[0]:
            num_ooms = _header_count(cells[0], "CUDA OOMs:")
            retries = _header_count(cells[1], "cudaMalloc retries:")
            continue
        if len(cells) != 5:
            continue
        title = cells[0]
        if title in _ROWS:
            metric = _ROWS[title]
            pool = "all"
        elif title in _POOL_ROWS and metric is not None:
            pool = _POOL_ROWS[title]
        else:
            metric = None
            continue
        key, is_bytes = metric
        values = [_cell(c, is_bytes) for c in cells[1:]]
        if any(v is None for v in values):
            continue
        # The oversize rows have no pools in torch's table and no ".all" in their stats keys.
        prefix = key if key.startswith("oversize_") else f"{key}.{pool}"
        for column, value in zip(_COLUMNS, values, strict=True):
            assert value is not None
            figures[f"{prefix}.{column}"] = value
    if "reserved_bytes.all.current" not in figures or "allocated_bytes.all.current" not in figures:
        raise TriageError(
            "memory_summary:unrecognised",
            "no torch.cuda.memory_summary() table (rows 'Allocated memory' and 'GPU reserved memory') in the text",
        )
    abbreviated = "reserved_bytes.large_pool.current" not in figures
    return MemorySummary(device, num_ooms, retries, figures, abbreviated)


# ------------------------------------------------------------------ the triage


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


@dataclass(frozen=True, slots=True)
class Triage:
    """What the text alone answers; ``to_json()`` is the API's body (docs/contract.md)."""

    message: OomMessage
    summary: MemorySummary | None
    summary_timing: str | None  # at-oom | after-oom | other | None (no summary)
    binding: str  # per-process-cap | device
    room: Figure  # what the process could still take under the binding limit
    shortfall: Figure  # the request minus the room
    unallocated: Figure | None  # reserved by PyTorch but unallocated
    usable_unallocated: Figure | None  # of that, what a request of this size can use (large pool, at the OOM)
    other_processes: Figure | None  # every other process on the device, together
    non_pytorch: Figure | None  # this process's memory outside PyTorch's cache
    unaccounted: Figure | None  # in use on the device by no process the message lists
    free_pieces: FreePieces | None
    cause: str
    certain: bool
    confidence: str  # high | low: how far to trust the change
    confidence_reason: str
    headline: str
    change: str
    findings: tuple[Finding, ...]
    alternatives: tuple[str, ...]
    snapshot_adds: tuple[str, ...] = field(default=SNAPSHOT_ADDS)
    record_snapshot: str = RECORD_SNAPSHOT

    def to_json(self) -> dict[str, Any]:
        def fig(f: Figure | None) -> dict[str, Any] | None:
            return None if f is None else f.to_json()

        return {
            "schema": SCHEMA,
            "cause": self.cause,
            "certain": self.certain,
            "confidence": self.confidence,
            "confidence_reason": self.confidence_reason,
            "headline": self.headline,
            "change": self.change,
            "alternatives": list(self.alternatives),
            "findings": [f.to_json() for f in self.findings],
            "binding_limit": self.binding,
            "figures": {
                "tried_to_allocate": fig(self.message.tried),
                "limit": fig(self.message.limit),
                "limit_kind": self.message.limit_kind,
                "room": fig(self.room),
                "shortfall": fig(self.shortfall),
                "unallocated": fig(self.unallocated),
                "usable_unallocated": fig(self.usable_unallocated),
                "other_processes": fig(self.other_processes),
                "non_pytorch": fig(self.non_pytorch),
                "unaccounted": fig(self.unaccounted),
                "free_pieces": None if self.free_pieces is None else self.free_pieces.to_json(),
            },
            "message": self.message.to_json(),
            "summary": None if self.summary is None else self.summary.to_json(),
            "summary_timing": self.summary_timing,
            "snapshot_adds": list(self.snapshot_adds),
            "record_snapshot": self.record_snapshot,
        }


def _derived(value: int, low: int, high: int) -> Figure:
    """A figure computed from printed ones: its own text, the range it inherits."""
    return Figure(size(max(0, value)), max(0, value), max(0, low), max(0, high))


def _minus(a: Figure, b: Figure) -> Figure:
    d = a - b
    return _derived(a.value - b.value, d.low, d.high)


def _overlaps(a: Figure, b: Figure) -> bool:
    return a.low <= b.high and b.low <= a.high


def _sum(figures: list[Figure]) -> Figure | None:
    if not figures:
        return None
    total = figures[0]
    for f in figures[1:]:
        total = total + f
    return _derived(total.value, total.low, total.high)


def _covers(amount: Figure | None, need: Figure) -> bool | None:
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
class _Arithmetic:
    """The figures the rules read, worked out once from the texts (``_findings`` and ``_verdict`` share them)."""

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


def _arithmetic(message: OomMessage, summary: MemorySummary | None) -> _Arithmetic:
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
    others = _sum([f for _, f in message.other_processes])
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
    return _Arithmetic(
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


def triage(message_text: str, summary_text: str | None = None) -> Triage:
    """Triage one OOM from its message and, optionally, ``torch.cuda.memory_summary()``'s output.

    ``OomMessageError`` (from ``parse_oom_message``) for a message that is not torch's; ``TriageError``
    for a summary that is not one, or a message without the figures a triage needs.
    """
    message = parse_oom_message(message_text)
    summary = parse_memory_summary(summary_text) if summary_text and summary_text.strip() else None
    a = _arithmetic(message, summary)
    outside = _sum([f for _, f in a.outside()])
    # The rules in order: memory outside the process first (when the device bound, no setting of this
    # process's allocator can win it back, whatever its cache looks like), then the cache's own pieces.
    if a.shortfall.high == 0 or message.tried.high <= a.room.low:
        cause, certain = UNEXPLAINED, False
    elif a.binding == "device" and _covers(outside, a.shortfall) is not False:
        cause, certain = OUTSIDE, bool(_covers(outside, a.shortfall)) and a.binding_certain
    elif _covers(a.usable, a.shortfall) is not False:
        cause, certain = FRAGMENTATION, bool(_covers(a.usable, a.shortfall))
    else:
        cause, certain = CAPACITY, a.shortfall.low > 0
    confidence, confidence_reason = _confidence(cause, certain)
    headline, change, alternatives = _verdict(cause, a)
    return Triage(
        message=message,
        summary=summary,
        summary_timing=a.timing,
        binding=a.binding,
        room=a.room,
        shortfall=a.shortfall,
        unallocated=a.unallocated,
        usable_unallocated=a.usable,
        other_processes=a.others,
        non_pytorch=a.non_pytorch,
        unaccounted=a.unaccounted,
        free_pieces=a.pieces,
        cause=cause,
        certain=certain,
        confidence=confidence,
        confidence_reason=confidence_reason,
        headline=headline,
        change=change,
        findings=tuple(_findings(a)),
        alternatives=tuple(alternatives),
    )


# The bench's real reruns (tests/fixtures/captures/, followups/ and heldout/: families with a default run that
# died with a message and an expandable_segments:True rerun) where this triage says fragmentation: how often the
# rerun finished, died at a later step, or died at the same step. Recomputed from the fixtures by
# tests/analysis/test_triage.py::test_fragmentation_odds_are_the_benchs.
FRAGMENTATION_RERUNS = {"runs": 71, "finished": 20, "died_later": 22, "died_same_step": 29}


def _confidence(cause: str, certain: bool) -> tuple[str, str]:
    """How far to trust the change the triage names, and why.

    Memory outside the process and capacity are facts of the message's figures: high when the
    rounding cannot change them (on the bench, every capacity verdict's expandable_segments rerun died
    no later). Fragmentation is a fact about one request only: whether the step, and the steps after
    it, fit is not in the text, and on the bench expandable_segments finished fewer than a third of
    such runs (``FRAGMENTATION_RERUNS``). A snapshot's replay tells which.
    """
    if cause == UNEXPLAINED:
        return "low", "The message's figures do not explain the failure."
    if not certain:
        return "low", "The printed figures are rounded, and the verdict flips within their rounding."
    if cause == FRAGMENTATION:
        r = FRAGMENTATION_RERUNS
        return "low", (
            "The message shows one request, not the step or the steps after it. Of "
            f"{r['runs']} real runs whose message showed fragmentation like this, expandable_segments finished "
            f"{r['finished']}, died at a later step in {r['died_later']} and at the same step in "
            f"{r['died_same_step']}: a snapshot's replay tells which this run is."
        )
    if cause == OUTSIDE:
        return "high", "The message names the memory held outside this process's cache."
    return "high", "Even with every free piece joined, the request did not fit: no allocator setting helps."


def _verdict(cause: str, a: _Arithmetic) -> tuple[str, str, list[str]]:
    """(headline, the one change, alternatives) for a cause."""
    message, tried, shortfall, usable = a.message, a.message.tried, a.shortfall, a.usable
    limit_text = (
        f"under the {message.allowed.text} cap"
        if a.binding == "per-process-cap" and message.allowed
        else "on the full device"
    )
    if cause == UNEXPLAINED:
        return (
            f"The message's own figures leave {a.room.text} of room {limit_text} for a {tried.text} request: "
            "the text does not say why it failed (another process may have freed memory in between, or the "
            "request was in a CUDA graph's private pool).",
            "Record a snapshot (below): only the trace can show what failed.",
            [],
        )
    if cause == OUTSIDE:
        held = " and ".join(f"{label} ({fig.text})" for label, fig in a.outside())
        return (
            f"The device was full, and the memory is held outside this process's PyTorch cache: {held}. "
            f"The request for {tried.text} was {shortfall.text} short.",
            "Free that memory where it is held (stop or move the other process, or free what the other library "
            "holds); no PYTORCH_CUDA_ALLOC_CONF setting gives it back.",
            [
                "Run on a device of your own (CUDA_VISIBLE_DEVICES), or give each process a cap with "
                "torch.cuda.set_per_process_memory_fraction so they cannot crowd each other out.",
                *(
                    [
                        f"{usable.text} is reserved but unallocated in this process; expandable_segments may get "
                        "past this one request, but the room is what the other memory leaves."
                    ]
                    if _covers(usable, shortfall) is not False
                    else []
                ),
            ],
        )
    if cause == FRAGMENTATION:
        return (
            f"Fragmentation at this request: {usable.text} was reserved but unallocated, which covers the "
            f"{shortfall.text} the {tried.text} request lacked {limit_text}, but not in one piece.",
            "Try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments then grow in place and the free "
            "pieces stop being stranded, which gets past this request. If the step needs more than the limit, "
            "or memory grows from step to step, it only postpones the OOM; record a snapshot to know.",
            [
                "max_split_size_mb:N (e.g. 256) keeps large cached blocks from being split for small requests.",
                "Or make the program need less at that moment (below): that works whatever the layout.",
            ],
        )
    alternatives: list[str] = []
    free = message.device_free
    # A higher cap helps only where the device has the shortfall free.
    if a.binding == "per-process-cap" and free is not None and message.allowed is not None and _covers(free, shortfall):
        alternatives.append(
            f"Raise the cap (torch.cuda.set_per_process_memory_fraction): the device still had {free.text} "
            f"free, the cap is {message.allowed.text}."
        )
    outside = a.outside() if a.binding == "device" else []
    if outside:
        total = _sum([f for _, f in outside])
        assert total is not None
        alternatives.append(
            f"Memory held outside this process's cache ({total.text}) covers {_share(total, shortfall)}: freeing "
            "it would help, but not enough alone."
        )
    return (
        f"Capacity: the {tried.text} request lacked {shortfall.text} {limit_text}, and only {usable.text} "
        "was reserved but unallocated; even in one piece the memory was not there.",
        "The program must need less at that moment: a smaller batch or sequence, torch.no_grad() for evaluation, "
        "mixed precision, activation checkpointing, a fused or foreach=False optimizer step. An allocator setting "
        "does not help.",
        alternatives,
    )


def _findings(a: _Arithmetic) -> list[Finding]:
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
            f"{unallocated.text} was reserved by PyTorch but unallocated, {_share(unallocated, shortfall)}; the "
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
            else _share(a.others, shortfall)
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


def _share(part: Figure, whole: Figure, of: str = "the shortfall") -> str:
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


__all__ = [
    "CAPACITY",
    "FRAGMENTATION",
    "MAX_SUMMARY_CHARS",
    "OUTSIDE",
    "RECORD_SNAPSHOT",
    "SNAPSHOT_ADDS",
    "UNEXPLAINED",
    "FreePieces",
    "MemorySummary",
    "OomMessageError",
    "Triage",
    "TriageError",
    "parse_memory_summary",
    "triage",
]
