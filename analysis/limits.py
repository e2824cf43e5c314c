"""The memory limit of a run: parsed from torch's OOM message, given, or inferred.

A snapshot does not record the cap that ``set_per_process_memory_fraction``
set, nor the device's size. The user often has both in the message of the
``OutOfMemoryError`` (``c10/cuda/CUDACachingAllocator.cpp``)::

    CUDA out of memory. Tried to allocate 710.00 MiB. GPU 0 has a total capacity of
    139.80 GiB of which 132.52 GiB is free. [Process 123 has 1.46 GiB memory in use. ...]
    Including non-PyTorch memory, this process has 7.27 GiB memory in use. [7.00 GiB
    allowed; ]Of the allocated memory 5.51 GiB is allocated by PyTorch, and 1.04 GiB is
    reserved by PyTorch but unallocated. ...

and, before torch 2.1, ``Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity;
130.35 MiB already allocated; 47.06 MiB free; [3.00 GiB allowed; ]188.00 MiB reserved in
total by PyTorch)``.

Every figure goes through torch's ``format_size``: exact below 1 KiB (``N bytes``),
else two decimals of KiB, MiB or GiB. So a parsed figure is a range (``Figure``),
not a number: "7.00 GiB" is anything in [6.995, 7.005) GiB, 10.7 MiB wide.
"Tried to allocate" is the segment size the allocator wanted (``alloc_size``,
e.g. 710 MiB for a 708.6 MiB request), not the request.

Which limit a report uses (``choose_limit``), in this order: the one the user
gave (``--limit``, the upload form), the client's sidecar (its OOM observer
reads ``allowed_bytes`` exactly from torch), the OOM message, and only then
what the trace shows (``inferred``; a per-process cap inferred from the trace
is a lower bound and labelled so).

Pure: no numpy, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
_UNITS = {"bytes": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": 1 << 40}

GIVEN, SIDECAR, OOM_MESSAGE, INFERRED = "given", "sidecar", "oom_message", "inferred"
# The longest message we read: torch's is about 600 characters, plus a list of other
# processes; a pasted traceback around it is fine, a file of megabytes is not.
MAX_MESSAGE_CHARS = 64 * 1024


class OomMessageError(ValueError):
    """A text given as an OOM message that is not one; ``code`` is ``oom_message:<reason>``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    @property
    def code(self) -> str:
        return f"oom_message:{self.reason}"


@dataclass(frozen=True, slots=True)
class Figure:
    """A size as torch printed it: ``value`` (the printed number times its unit)
    and the range of byte counts that print that way, ``low <= bytes <= high``."""

    text: str
    value: int
    low: int
    high: int

    @property
    def exact(self) -> bool:
        return self.low == self.high

    def __add__(self, other: Figure) -> Figure:
        return Figure(
            f"{self.text} + {other.text}", self.value + other.value, self.low + other.low, self.high + other.high
        )

    def __sub__(self, other: Figure) -> Figure:
        return Figure(
            f"{self.text} - {other.text}",
            self.value - other.value,
            max(0, self.low - other.high),
            max(0, self.high - other.low),
        )

    def to_json(self) -> dict[str, Any]:
        return {"text": self.text, "bytes": self.value, "low": self.low, "high": self.high}


def figure(number: str, unit: str) -> Figure:
    """The range of byte counts that torch's ``format_size`` prints as ``number unit``.

    ``format_size`` prints ``size / unit`` with ``std::fixed`` and precision 2, so
    the printed number ``v`` stands for sizes in [(v - 0.005) unit, (v + 0.005) unit];
    a unit is used only above the previous one (more than 1024 bytes for KiB, and
    so on), which clips the low end. "N bytes" is exact.
    """
    scale = _UNITS[unit]
    text = f"{number} {unit}"
    if scale == 1:
        n = int(float(number))
        return Figure(text, n, n, n)
    # Exact in binary: two decimals times a power of two, computed in integers.
    hundredths = round(float(number) * 100)
    value = hundredths * scale // 100
    # format_size switches to a unit only above the previous one: KiB from 1025 bytes, MiB
    # from 1 MiB + 1, GiB from 1 GiB + 1 (and TiB never: GiB goes on growing).
    low = max((2 * hundredths - 1) * scale // 200 + 1, scale + 1 if scale <= GiB else 0)
    high = (2 * hundredths + 1) * scale // 200
    return Figure(text, value, low, high)


# A printed size. Every pattern is linear in the text: a number cannot start inside another
# (the look-behind) and has a bounded length, so a search for "<size> allowed;" over a long run
# of digits tries each digit once instead of re-scanning the run from every digit (issue 22:
# 64 KB of digits took 68 s of CPU with ``\d+``). torch prints at most 20 digits and 2 decimals.
_SIZE = r"(?<![\d.])(\d{1,20}(?:\.\d{1,6})?) (bytes|KiB|MiB|GiB|TiB)"
_TRIED = re.compile(r"Tried to allocate " + _SIZE)
# torch >= 2.1 ("capacty" is the spelling of some releases).
_CAPACITY = re.compile(r"GPU (\d*) has a total capac\w* of " + _SIZE + r" of which " + _SIZE + r" is free")
_PROCESS = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_THIS_PROCESS = re.compile(r"Including non-PyTorch memory, this process has " + _SIZE + r" memory in use")
_ALLOWED = re.compile(_SIZE + r" allowed;")
_ALLOCATED = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
_UNALLOCATED = re.compile(r"and " + _SIZE + r" is reserved by PyTorch but unallocated")
# torch >= 2.6: the private pools' unallocated bytes, which the figure before counts as allocated.
_PRIVATE_POOLS = re.compile(r"with " + _SIZE + r" allocated in private pools")
# torch < 2.1
_OLD = re.compile(
    r"\(GPU (\d*); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; " + _SIZE + r" free; "
    r"(?:" + _SIZE + r" allowed; )?" + _SIZE + r" reserved in total by PyTorch\)"
)


@dataclass(frozen=True, slots=True)
class OomMessage:
    """The figures of one ``OutOfMemoryError`` message (None where the message has none)."""

    tried: Figure  # the segment size the allocator wanted (alloc_size)
    device: int | None
    total_capacity: Figure | None
    device_free: Figure | None
    process_in_use: Figure | None  # this process, PyTorch's reserved memory included
    allowed: Figure | None  # the per-process cap ("... allowed"), only when a fraction is set
    allocated: Figure | None  # allocated by PyTorch (allocated_bytes.all.current)
    reserved: Figure | None  # reserved by PyTorch (reserved_bytes.all.current)
    other_processes: tuple[tuple[int, Figure], ...] = ()
    # "with X allocated in private pools (e.g., CUDA Graphs)": the pools' free bytes, inside ``allocated``.
    private_pools: Figure | None = None

    @property
    def non_pytorch(self) -> Figure | None:
        """This process's memory outside PyTorch's cache (CUDA context, cuBLAS/NCCL buffers...)."""
        if self.process_in_use is None or self.reserved is None:
            return None
        return self.process_in_use - self.reserved

    @property
    def limit(self) -> Figure | None:
        """What the process could reserve: the cap when one was set, else (the device was
        full) what it had reserved plus what the device still had free."""
        if self.allowed is not None:
            return self.allowed
        if self.reserved is not None and self.device_free is not None:
            return self.reserved + self.device_free
        return None

    @property
    def limit_kind(self) -> str:
        return "per-process-cap" if self.allowed is not None else "device-full"

    def to_json(self) -> dict[str, Any]:
        def fig(f: Figure | None) -> dict[str, Any] | None:
            return None if f is None else f.to_json()

        return {
            "tried_to_allocate": fig(self.tried),
            "device": self.device,
            "total_capacity": fig(self.total_capacity),
            "device_free": fig(self.device_free),
            "process_in_use": fig(self.process_in_use),
            "allowed": fig(self.allowed),
            "allocated": fig(self.allocated),
            "reserved": fig(self.reserved),
            "non_pytorch": fig(self.non_pytorch),
            "other_processes": [{"pid": pid, **f.to_json()} for pid, f in self.other_processes],
            "private_pools": fig(self.private_pools),
        }


def parse_oom_message(text: str) -> OomMessage:
    """Parse torch's CUDA OOM message (either layout); ``OomMessageError`` if it is none.

    Text around the message (a traceback, a log line) is ignored. Several
    messages in one text: the last one is read (the run's final OOM).
    """
    if not isinstance(text, str) or not text.strip():
        raise OomMessageError("empty", "the OOM message is empty")
    if len(text) > MAX_MESSAGE_CHARS:
        raise OomMessageError("too-long", f"the OOM message is longer than {MAX_MESSAGE_CHARS:,} characters")
    text = " ".join(text.split())  # pasted messages come wrapped over lines
    tried_all = list(_TRIED.finditer(text))
    if not tried_all:
        raise OomMessageError(
            "unrecognised", "no 'CUDA out of memory. Tried to allocate ...' message found in the given text"
        )
    start = tried_all[-1].start()
    text = text[start:]
    tried = figure(*tried_all[-1].groups())
    old = _OLD.search(text)
    if old is not None and _CAPACITY.search(text) is None:
        g = old.groups()
        allowed = figure(g[7], g[8]) if g[7] else None
        return OomMessage(
            tried=tried,
            device=int(g[0]) if g[0] else None,
            total_capacity=figure(g[1], g[2]),
            device_free=figure(g[5], g[6]),
            process_in_use=None,
            allowed=allowed,
            allocated=figure(g[3], g[4]),
            reserved=figure(g[9], g[10]),
        )
    cap = _CAPACITY.search(text)
    if cap is None:
        raise OomMessageError("unrecognised", "the OOM message names no total capacity and free memory")

    def one(rx: re.Pattern[str]) -> Figure | None:
        m = rx.search(text)
        return None if m is None else figure(*m.groups()[-2:])

    allocated, unallocated = one(_ALLOCATED), one(_UNALLOCATED)
    reserved = allocated + unallocated if allocated is not None and unallocated is not None else None
    if reserved is not None:
        reserved = Figure(f"({reserved.text})", reserved.value, reserved.low, reserved.high)
    return OomMessage(
        tried=tried,
        device=int(cap.group(1)) if cap.group(1) else None,
        total_capacity=figure(cap.group(2), cap.group(3)),
        device_free=figure(cap.group(4), cap.group(5)),
        process_in_use=one(_THIS_PROCESS),
        allowed=one(_ALLOWED),
        allocated=allocated,
        reserved=reserved,
        other_processes=tuple((int(m.group(1)), figure(m.group(2), m.group(3))) for m in _PROCESS.finditer(text)),
        private_pools=one(_PRIVATE_POOLS),
    )


# ------------------------------------------------------------------ choosing the limit


@dataclass(frozen=True, slots=True)
class Limit:
    """The limit a report reasons with, and where it came from."""

    bytes: int
    source: str  # given | sidecar | oom_message | inferred
    is_lower_bound: bool
    low: int  # the range the real limit lies in, as far as the source tells
    high: int | None  # None: no upper bound known
    inference: str = ""  # for inferred limits: device-full | cap-lower-bound
    kind: str = ""  # per-process-cap | device-full | "" (unknown)

    def note(self) -> str:
        """One sentence for the report: the limit, its source, how exact it is."""
        gib = self.bytes / GiB
        if self.source == GIVEN:
            return f"Limit {gib:.2f} GiB ({self.bytes:,} bytes), as given."
        if self.source == SIDECAR:
            return f"Limit {gib:.2f} GiB ({self.bytes:,} bytes), read exactly by the client's OOM observer."
        if self.source == OOM_MESSAGE:
            what = "the per-process cap" if self.kind == "per-process-cap" else "reserved plus free device memory"
            return (
                f"Limit {gib:.2f} GiB, {what} from the OOM message; torch prints two decimals, so the real "
                f"limit lies between {self.low:,} and {self.high:,} bytes."
            )
        if self.inference == "device-full":
            return (
                f"Limit {gib:.2f} GiB inferred: the device itself was full at the OOM (reserved plus the device's "
                "free memory). Memory outside PyTorch's cache (CUDA's lazily loaded kernels, library handles, other "
                "processes) can grow during a run, so earlier the limit may have been higher; paste the OOM message "
                "or give the memory cap to be sure."
            )
        return (
            f"Limit at least {gib:.2f} GiB: inferred from the trace (the most it shows the cap allowed); the real "
            "per-process cap is not in the snapshot and may be higher. Paste the OOM message or give the memory cap "
            "for the real figure."
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "source": self.source,
            "is_lower_bound": self.is_lower_bound,
            "low_bytes": self.low,
            "high_bytes": self.high,
            "inference": self.inference,
            "kind": self.kind,
            "note": self.note(),
        }


def run_was_capped(chosen: Limit | None, *, fraction_recorded: bool, gc_ran: bool) -> bool:
    """Was the run under a per-process cap (``set_per_process_memory_fraction``)? The one rule,
    for the report's what-ifs and the ``whatif`` command alike: only under a cap does
    ``garbage_collection_threshold`` act (``AllocatorConfig.acting``).

    Proof of a cap is any of: a limit the user gave, a limit whose source names a per-process
    cap (the sidecar, an OOM message with "allowed", a cap the trace bounds from below), a
    fraction in the recorded settings, or recorded garbage-collection runs (``gc_ran``: torch
    runs ``garbage_collect_cached_blocks`` only under a cap, so a trace that shows one was capped,
    whatever else is known of its limit).
    """
    if gc_ran or fraction_recorded:
        return True
    return chosen is not None and (chosen.source == GIVEN or chosen.kind == "per-process-cap")


def sidecar_limit(sidecar: dict[str, Any] | None, device: int) -> tuple[int, str] | None:
    """``(bytes, kind)`` from the client's sidecar: its OOM observer gets torch's
    ``allowed_bytes`` (the cap when a fraction is set, else the device's total)."""
    if not isinstance(sidecar, dict):
        return None
    obs = sidecar.get("observer")
    if not isinstance(obs, dict) or obs.get("device", device) != device:
        return None
    allowed = obs.get("allowed_bytes")
    if not isinstance(allowed, int) or isinstance(allowed, bool) or allowed <= 0:
        return None
    total = sidecar.get("total_memory")
    if isinstance(total, int) and allowed >= total:
        return None  # no cap: allowed_bytes is the device's size, not what the process could get
    return allowed, "per-process-cap"


def choose_limit(
    *,
    given: int | None,
    sidecar: tuple[int, str] | None,
    message: OomMessage | None,
    inferred: tuple[int, str] | None,
    floor: int = 0,
) -> Limit | None:
    """The limit by source priority (given, sidecar, OOM message, inferred).

    ``floor`` is what the trace proves the limit was at least (every segment was
    allowed before it was made): a message's range is clipped to it, and the
    parsed figure raised to it, so rounding never puts the limit below memory
    the run really reserved.
    """
    if given is not None:
        return Limit(int(given), GIVEN, False, int(given), int(given))
    if sidecar is not None:
        return Limit(sidecar[0], SIDECAR, False, sidecar[0], sidecar[0], kind=sidecar[1])
    if message is not None and message.limit is not None:
        fig = message.limit
        low = max(fig.low, floor) if floor <= fig.high else fig.low
        value = min(max(fig.value, low), fig.high)
        return Limit(value, OOM_MESSAGE, False, low, fig.high, kind=message.limit_kind)
    if inferred is not None:
        value, how = inferred
        lower = how == "cap-lower-bound"
        return Limit(
            int(value),
            INFERRED,
            lower,
            int(value),
            None if lower else int(value),
            inference=how,
            kind="per-process-cap" if lower else "device-full",
        )
    return None
