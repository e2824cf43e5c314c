"""``torch.cuda.memory_summary()``'s table read as figures: each cell the range of bytes or counts it stands for.

The summary adds what an OOM message lacks (``analysis.triage``): how the free memory splits
between the large and the small pool, how many free pieces there are, the peaks, how many OOMs
and cache flushes the process has had, and whether ``max_split_size_mb`` is set (oversize
counts). ``parse_memory_summary`` reads a bounded text (``MAX_SUMMARY_CHARS``) in one pass, with
``str.split`` only: the text is a user's. A text that cannot be triaged, this one or the OOM
message, is a ``TriageError``. Pure: stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from analysis.limits import Figure, GiB, KiB, MiB

# torch's summary is about 6,000 characters per device; a log around it is fine, megabytes are not.
MAX_SUMMARY_CHARS = 64 * 1024


class TriageError(ValueError):
    """A text that cannot be triaged; ``code`` is ``oom_message:<reason>`` or ``memory_summary:<reason>``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
