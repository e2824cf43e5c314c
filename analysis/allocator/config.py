"""Allocator configuration and the size rules of the CUDA caching allocator.

Mirrors ``c10/cuda/CUDAAllocatorConfig`` and the size helpers of
``CUDACachingAllocator.cpp`` (see ../shared/docs/snapshot-format.md §3).
Everything here is a pure function of sizes and an ``AllocatorConfig``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.errors import ConfigError

KB = 1024
MB = 1024 * 1024
GB = 1024 * MB

K_MIN_BLOCK_SIZE = 512  # every block is a multiple of this
K_SMALL_SIZE = 1 * MB  # requests up to this go to the small pool
K_SMALL_BUFFER = 2 * MB  # small-pool segment size (and small expandable page)
K_MIN_LARGE_ALLOC = 10 * MB  # below this, large requests get a large_segment_size segment
K_ROUND_LARGE = 2 * MB  # large cudaMalloc rounding
K_LARGE_BUFFER = 20 * MB  # default large_segment_size
UNLIMITED = (1 << 64) - 1  # SIZE_MAX: max_split_size when unset
NO_SIZE_LIMIT = 1 << 64  # above every size_t: "no bound" in split_rule

# roundup_power2_divisions has one entry per power-of-two interval from 1 MiB to 32 GiB.
N_ROUNDUP_INTERVALS = 16
ROUNDUP_KEYS: tuple[str, ...] = tuple(str(1 << i) for i in range(N_ROUNDUP_INTERVALS))


@dataclass(frozen=True, slots=True)
class AllocatorConfig:
    """The effective settings of the native caching allocator."""

    max_split_size: int = UNLIMITED
    max_non_split_rounding_size: int = K_LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = (0,) * N_ROUNDUP_INTERVALS
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    large_segment_size: int = K_LARGE_BUFFER
    per_process_memory_fraction: float | None = None
    # Keys that were set but do not change block placement (kept for display).
    other: tuple[tuple[str, str], ...] = field(default=())

    # -- construction -------------------------------------------------------
    @classmethod
    def parse(cls, conf: str, base: AllocatorConfig | None = None) -> AllocatorConfig:
        """Parse a PYTORCH_CUDA_ALLOC_CONF string (``key:value,key:[a:b,c:d]``)."""
        cfg = base if base is not None else cls()
        items = [(part.key, part.value) for part in split_conf(conf)]
        # torch reads large_segment_size_mb first: max_split_size_mb and
        # max_non_split_rounding_mb may not be below it, and the rounding defaults to it.
        for key, value in items:
            if key == "large_segment_size_mb":
                cfg = _apply(cfg, key, value)
                cfg = replace(cfg, max_non_split_rounding_size=cfg.large_segment_size)
        for key, value in items:
            if key != "large_segment_size_mb":
                cfg = _apply(cfg, key, value)
        return cfg

    @classmethod
    def from_settings(cls, raw: dict[str, Any], conf: str = "") -> AllocatorConfig:
        """Effective config from a snapshot's ``allocator_settings`` dict (never raises:
        what cannot be read is left at its default; ``recorded_settings`` says what)."""
        return recorded_settings(raw, conf)[0]

    # -- description --------------------------------------------------------
    def to_conf(self) -> str:
        """A PYTORCH_CUDA_ALLOC_CONF string that reproduces the non-default values
        (each setting of ``SETTINGS`` in the table's order)."""
        return ",".join(part for part in (setting.to_conf(self) for setting in SETTINGS) if part is not None)

    # -- size rules -----------------------------------------------------------
    def divisions_for(self, size: int) -> int:
        log_size = size.bit_length() - 1
        index = max(log_size - 20, 0)
        return self.roundup_power2_divisions[min(index, N_ROUNDUP_INTERVALS - 1)]

    @property
    def rounds_plainly(self) -> bool:
        """``round_size`` is the plain ``kMinBlockSize`` rounding at every size
        (no interval has more than one division): hot loops then inline
        ``(size + 511) & -512`` (at least 512) instead of calling ``round_size``."""
        return not any(d > 1 for d in self.roundup_power2_divisions)

    def round_size(self, size: int) -> int:
        """``round_size``: the block size a request of ``size`` bytes needs: a multiple of
        512 B and at least 512 B (torch's ``size < kMinBlockSize`` branch is the ``max``),
        or, past ``512 x divisions``, the next of the interval's divisions."""
        divisions = self.divisions_for(size)
        if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
            return _roundup_power2_next_division(size, divisions)
        return max(-(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE, K_MIN_BLOCK_SIZE)

    def allocation_size(self, size: int) -> int:
        """``get_allocation_size``: the segment a cache miss for a rounded size creates."""
        if size <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if size < K_MIN_LARGE_ALLOC:
            return self.large_segment_size
        return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE

    def split_rule(self, small_pool: bool) -> tuple[int, int]:
        """``should_split`` as two numbers, for the hot loops that inline it:
        a free block of ``block_size`` is split for a request of ``size`` iff
        ``block_size - size > over`` and ``size < below``; returns ``(over, below)``.

        Small pool, or expandable segments on: the remainder must be at least
        ``kMinBlockSize`` (512 B), whatever the size. Large pool: the remainder
        must exceed ``kSmallSize`` (1 MiB) and the request be below ``max_split_size``.
        """
        if small_pool or self.expandable_segments:
            return K_MIN_BLOCK_SIZE - 1, NO_SIZE_LIMIT
        return K_SMALL_SIZE, self.max_split_size

    def should_split(self, block_size: int, size: int, small_pool: bool) -> bool:
        """``should_split``: does serving ``size`` from a free block of ``block_size`` split it?"""
        over, below = self.split_rule(small_pool)
        return block_size - size > over and size < below

    def release_available_frees(self, freed: list[int], size: int, *, flush_follows: bool) -> bool:
        """Whether ``release_available_cached_blocks`` for a rounded request of ``size``
        bytes frees exactly the segments ``freed`` (sizes, in the order freed).

        torch (``c10/cuda/CUDACachingAllocator.cpp``): only with ``max_split_size``; the
        key is ``max(size, max_split_size)`` on the request's stream. The smallest free
        block of at least the key is released alone; if none, the oversize blocks from
        the largest down until what was released reaches the key (so every block but the
        last leaves it short), and when they run out first it returns false and the
        malloc goes on to ``release_cached_blocks`` (``flush_follows``). The GC frees in
        the pool's ascending order instead, with no relation to the request's size.
        """
        mss = self.max_split_size
        if mss == UNLIMITED or not freed or any(b < mss for b in freed):
            return False
        key = max(size, mss)
        if len(freed) == 1 and freed[0] >= key:
            return True
        if any(b >= key for b in freed) or any(a < b for a, b in pairwise(freed)):
            return False
        total = sum(freed)
        return total - freed[-1] < key and (total >= key or flush_follows)

    def fit_limit(self, size: int) -> int:
        """The ``max_split_size`` filter of ``get_free_block`` as one bound: the best-fit
        block for a request of ``size`` is used only if it is smaller than this.

        A request below ``max_split_size`` never takes an oversize block (one of at
        least ``max_split_size``); a request of at least ``max_split_size`` takes a
        block only within ``max_non_split_rounding_size`` of itself. Unset
        (``UNLIMITED``), every block fits.
        """
        mss = self.max_split_size
        return mss if size < mss else size + self.max_non_split_rounding_size

    def block_fits(self, block_size: int, size: int) -> bool:
        """``get_free_block``: may a free block of ``block_size`` serve a (rounded) ``size``?"""
        return size <= block_size < self.fit_limit(size)

    def page_size(self, small_pool: bool) -> int:
        """The physical page an expandable segment maps at a time (``ExpandableSegment``'s
        ``segment_size``): ``kSmallBuffer`` for the small pool, ``large_segment_size`` else."""
        return K_SMALL_BUFFER if small_pool else self.large_segment_size

    def acting(self, capped: bool) -> AllocatorConfig:
        """The settings as the allocator acts on them. ``malloc`` runs
        ``garbage_collect_cached_blocks`` only when ``set_fraction`` is set
        (``torch.cuda.set_per_process_memory_fraction`` was called): without a
        per-process cap (``capped`` false; the device itself fills up) the
        threshold is read but never acts."""
        if capped or self.garbage_collection_threshold == 0.0:
            return self
        return replace(self, garbage_collection_threshold=0.0)

    def gc_threshold_bytes(self, limit: int) -> int:
        """``garbage_collect_cached_blocks`` starts only once reserved memory exceeds this
        (``threshold * allowed_memory_maximum``, truncated as the C++ cast does)."""
        return int(self.garbage_collection_threshold * limit)

    # -- the same rules over whole columns (numpy) ------------------------------
    def round_sizes(self, sizes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """``round_size`` of every element (what ``round_size`` does, vectorised)."""
        s = np.asarray(sizes, dtype=np.int64)
        # -(-s // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE, max K_MIN_BLOCK_SIZE, in one array: the block size is a
        # power of two, so floor division is an arithmetic right shift and the product a left shift, equal
        # for every int64 (wrapping alike); where three temporaries and an int64 division took ~15 ms of the
        # 460 MB trace's 2.2M requests (issue 34).
        out = np.negative(s)
        np.right_shift(out, _MIN_BLOCK_SHIFT, out=out)
        np.negative(out, out=out)
        np.left_shift(out, _MIN_BLOCK_SHIFT, out=out)
        np.maximum(out, K_MIN_BLOCK_SIZE, out=out)
        if self.rounds_plainly:
            return out
        # frexp (of the int64 column cast to float64, exact below 2**53) gives
        # s = m * 2**e with 0.5 <= m < 1: e is s.bit_length() (0 for 0).
        bits = np.frexp(s)[1]
        index = np.clip(bits - 1 - 20, 0, N_ROUNDUP_INTERVALS - 1)
        divs = np.array(self.roundup_power2_divisions)[index]  # Python ints: int64
        use = (divs > 1) & (s > K_MIN_BLOCK_SIZE * divs)
        if not use.any():
            return out
        su, du, bu = s[use], divs[use], bits[use]
        # _roundup_power2_next_division, column-wise: steps of 2**(e - 1) >> (bit_length(d) - 1).
        step = np.left_shift(np.int64(1), bu - 1) >> (np.frexp(du)[1] - 1)
        out[use] = -(-su // step) * step
        return out


_MIN_BLOCK_SHIFT = K_MIN_BLOCK_SIZE.bit_length() - 1
assert K_MIN_BLOCK_SIZE == 1 << _MIN_BLOCK_SHIFT  # round_sizes shifts where round_size divides


def recorded_settings(raw: dict[str, Any], conf: str = "") -> tuple[AllocatorConfig, list[str]]:
    """The effective config a snapshot recorded, and what in it could not be read.

    The dict holds the effective values of the keys it knows; keys it lacks
    (``max_non_split_rounding_mb``, ``large_segment_size_mb``,
    ``per_process_memory_fraction``) are recovered from the raw string. Unlike
    ``AllocatorConfig.parse`` (a setting the user asks for, refused with a
    ``ConfigError``) this reads what a file says: a key torch would refuse, or a
    value of the wrong type or range, is skipped and named in the returned
    problems, so a report can warn about it and go on under the defaults.
    """
    problems: list[str] = []
    cfg = AllocatorConfig()
    if conf:
        try:
            pairs = [(part.key, part.value) for part in split_conf(conf)]
        except ConfigError as exc:
            problems.append(f"PYTORCH_CUDA_ALLOC_CONF {conf[:80]!r}: {exc}")
            pairs = []
        for key, value in pairs:
            try:
                cfg = _apply(cfg, key, value)
            except ConfigError as exc:
                problems.append(str(exc))
    if not raw:
        return cfg, problems

    def bad(key: str, value: Any) -> None:
        problems.append(f"allocator_settings.{key} = {str(value)[:40]!r} is not a value torch accepts")

    mss = raw.get("max_split_size")
    if mss is not None:
        if isinstance(mss, int) and not isinstance(mss, bool) and (mss < 0 or mss >= K_LARGE_BUFFER):
            cfg = replace(cfg, max_split_size=UNLIMITED if mss < 0 else mss)
        else:
            bad("max_split_size", mss)
    gct = raw.get("garbage_collection_threshold")
    if gct is not None:
        if isinstance(gct, (int, float)) and not isinstance(gct, bool) and 0.0 <= gct < 1.0:
            cfg = replace(cfg, garbage_collection_threshold=float(gct))
        else:
            bad("garbage_collection_threshold", gct)
    exp = raw.get("expandable_segments")
    if exp is not None:
        if isinstance(exp, bool):
            cfg = replace(cfg, expandable_segments=exp)
        else:
            bad("expandable_segments", exp)
    rpd = raw.get("roundup_power2_divisions")
    if isinstance(rpd, dict):
        values = list(cfg.roundup_power2_divisions)
        for i, key in enumerate(ROUNDUP_KEYS):
            v = rpd.get(key)
            if v is None:
                continue
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0 and not v & (v - 1):
                values[i] = v
            else:
                bad(f"roundup_power2_divisions.{key}", v)
        cfg = replace(cfg, roundup_power2_divisions=tuple(values))
    elif rpd is not None:
        bad("roundup_power2_divisions", rpd)
    return cfg, problems


def is_small(size: int) -> bool:
    """``get_pool``: whether a rounded size is served from the small pool (<= 1 MiB)."""
    return size <= K_SMALL_SIZE


def small_pool(sizes: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """``is_small`` of every (rounded) element."""
    return np.asarray(sizes) <= K_SMALL_SIZE


def limit_refuses(reserved: int, alloc_size: int, limit: int | None) -> bool:
    """``alloc_block``: with a per-process cap, a new segment (or pages) of
    ``alloc_size`` is refused without calling the driver when ``reserved +
    alloc_size`` exceeds it. None: no cap."""
    return limit is not None and reserved + alloc_size > limit


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: ``size`` rounded up to the next of ``divisions``
    equal steps of the power-of-two interval that holds it.

    ``round_size`` calls it only for ``divisions >= 2`` and ``size > 512 x divisions``,
    so the interval starts at ``2**(size.bit_length() - 1) >= 512 x 2**(divisions.bit_length() - 1)``
    and a step is at least 512 B: torch's ``power2_divison == 0`` branch cannot be taken, and its
    power-of-two early return is what rounding up to a step gives anyway (a power of two
    is a multiple of every step of the interval it starts).
    """
    step = (1 << (size.bit_length() - 1)) >> (divisions.bit_length() - 1)
    return -(-size // step) * step


_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(\[[^\]]*\]|[^,\s]+)\s*(?:,|$)")


@dataclass(frozen=True, slots=True)
class ConfPart:
    """One ``key:value`` of a PYTORCH_CUDA_ALLOC_CONF string, and the text it was written as."""

    key: str
    value: str  # a ``[...]`` list keeps its brackets
    text: str  # as written, outer spaces trimmed (what a line that keeps the setting copies)


def split_conf(conf: str, *, strict: bool = True) -> list[ConfPart]:
    """The one reader of a PYTORCH_CUDA_ALLOC_CONF string: its top-level ``key:value`` parts in order
    (commas inside a ``[...]`` list belong to the value).

    ``strict`` (a setting asked for, or parsed into a config): text that is no ``key:value`` raises
    ``ConfigError``. Not strict (a string a snapshot recorded, kept as written): such text, up to the
    next comma outside brackets, is kept as one part whose key is what precedes its first colon.
    """
    conf = conf.strip()
    out: list[ConfPart] = []
    pos = 0
    while pos < len(conf):
        m = _TOKEN.match(conf, pos)
        if m is not None and m.end() > pos:
            out.append(ConfPart(m.group(1), m.group(2), conf[m.start(1) : m.end(2)]))
            pos = m.end()
            continue
        if strict:
            raise ConfigError(f"cannot parse allocator setting near {conf[pos : pos + 40]!r}")
        end = _top_level_comma(conf, pos)
        text = conf[pos:end].strip()
        if text:
            key, _, value = text.partition(":")
            out.append(ConfPart(key.strip(), value.strip(), text))
        pos = end + 1
    return out


def _top_level_comma(conf: str, pos: int) -> int:
    """The first comma at or after ``pos`` outside ``[...]`` (``len(conf)`` when none)."""
    depth = 0
    for i in range(pos, len(conf)):
        ch = conf[i]
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            return i
    return len(conf)


def _parse_bool(key: str, value: str) -> bool:
    if value in ("True", "true", "1"):
        return True
    if value in ("False", "false", "0"):
        return False
    raise ConfigError(f"{key} expects True or False, got {value!r}")


def _parse_int(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{key} expects an integer, got {value!r}") from None


def _parse_divisions(value: str) -> tuple[int, ...]:
    """``roundup_power2_divisions``: one value for every interval, or a ``[MB:d,...]`` list.

    Mirrors ``parseRoundUpPower2Divisions`` (c10/core/AllocatorConfig.cpp,
    torch 2.9+): the FIRST listed key also covers every interval below it; a
    later key sets only its own interval, so intervals between two listed keys
    keep 0 (no rounding); ``>`` fills every interval after the last listed key.
    A key is a power of two in MiB and names the interval starting there.
    """
    if not value.startswith("["):
        d = _parse_int("roundup_power2_divisions", value)
        if d <= 0 or d & (d - 1):
            raise ConfigError(f"roundup_power2_divisions value {d} is not a power of 2")
        return (d,) * N_ROUNDUP_INTERVALS
    values = [0] * N_ROUNDUP_INTERVALS
    last = 0
    first = True
    for item in filter(None, (p.strip() for p in value[1:-1].split(","))):
        key, sep, v = item.partition(":")
        if not sep:
            raise ConfigError(f"roundup_power2_divisions entry {item!r} is not KEY:VALUE")
        d = _parse_int("roundup_power2_divisions", v.strip())
        _check_division(d)
        key = key.strip()
        if key == ">":
            for i in range(last + 1, N_ROUNDUP_INTERVALS):
                values[i] = d
            continue
        mb = _parse_int("roundup_power2_divisions", key)
        if mb <= 0 or mb & (mb - 1):
            raise ConfigError(f"roundup_power2_divisions interval {key} is not a power of 2")
        index = min(mb.bit_length() - 1, N_ROUNDUP_INTERVALS - 1)
        if first:
            for i in range(index):
                values[i] = d
            first = False
        values[index] = d
        last = index
    return tuple(values)


def _check_division(d: int) -> None:
    if d != 0 and d & (d - 1):
        raise ConfigError(f"roundup_power2_divisions value {d} is not a power of 2")


def _parse_fraction(key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{key} expects a number, got {value!r}") from None


def _apply(cfg: AllocatorConfig, key: str, value: str) -> AllocatorConfig:
    setting = setting_named(key)
    if setting is not None:
        return setting.read(cfg, value)
    if key == "backend" and value not in ("native",):
        raise ConfigError(f"backend {value!r} keeps no history and cannot be replayed")
    # Keys that do not change where blocks go (pinned_*, release_lock_on_cudamalloc, backend:native, ...).
    return replace(cfg, other=(*cfg.other, (key, value)))


# ------------------------------------------------------------------ the settings, one row each


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """One PYTORCH_CUDA_ALLOC_CONF key: how it is read and written back, and how the report offers it.

    A new setting is its field on ``AllocatorConfig`` (and the rules that use it) plus one row of
    ``SETTINGS``: the advisor's rule (``analysis.advice``), the report's own what-if replays, the
    ranked table's cost (``analysis.sizing``) and the env line the decision writes all read the row.
    Every field but the what-if ones is required, so a row without a cost fails at import.
    """

    key: str
    read: Callable[[AllocatorConfig, str], AllocatorConfig]  # the value onto a config; ConfigError as torch refuses
    to_conf: Callable[[AllocatorConfig], str | None]  # the ``key:value`` that reproduces it; None at the default
    title: str  # the suggestion's title
    reason: str  # why it helps, the end of the suggestion's evidence
    cost: str  # a key of ``analysis.sizing.COSTS``
    # The report's own what-if configurations, the first tried first, the others only within the
    # event budget; none: the report never tries it on its own, and the advisor never suggests it.
    whatifs: tuple[str, ...] = ()
    whatif_order: int = 0  # where its first what-if goes among the other settings' first ones
    needs_cap: bool = False  # tried only where a per-process cap bound the run

    def is_set(self, cfg: AllocatorConfig) -> bool:
        """Whether it is "already set": the config holds a value other than the default (what ``to_conf`` writes)."""
        return self.to_conf(cfg) is not None


def _read_expandable(cfg: AllocatorConfig, value: str) -> AllocatorConfig:
    return replace(cfg, expandable_segments=_parse_bool("expandable_segments", value))


def _split_bound_mb(cfg: AllocatorConfig, key: str, value: str) -> int:
    """``max_split_size_mb`` and ``max_non_split_rounding_mb`` in bytes: torch accepts values >=
    large_segment_size_mb (kLargeBuffer, 20 MiB, unless set) and caps them at SIZE_MAX / 1 MiB."""
    mb = _parse_int(key, value)
    least = cfg.large_segment_size // MB
    if mb < least:
        raise ConfigError(f"{key} must be >= {least}, got {mb}")
    return min(mb, UNLIMITED // MB) * MB


def _read_max_split(cfg: AllocatorConfig, value: str) -> AllocatorConfig:
    return replace(cfg, max_split_size=_split_bound_mb(cfg, "max_split_size_mb", value))


def _read_non_split_rounding(cfg: AllocatorConfig, value: str) -> AllocatorConfig:
    return replace(cfg, max_non_split_rounding_size=_split_bound_mb(cfg, "max_non_split_rounding_mb", value))


def _read_divisions(cfg: AllocatorConfig, value: str) -> AllocatorConfig:
    return replace(cfg, roundup_power2_divisions=_parse_divisions(value))


def _read_gc_threshold(cfg: AllocatorConfig, value: str) -> AllocatorConfig:
    key = "garbage_collection_threshold"
    t = _parse_fraction(key, value)
    if not 0.0 < t < 1.0:
        raise ConfigError(f"{key} must be in (0, 1), got {value}")
    return replace(cfg, garbage_collection_threshold=t)


def _read_large_segment(cfg: AllocatorConfig, value: str) -> AllocatorConfig:
    key = "large_segment_size_mb"
    mb = _parse_int(key, value)
    if mb <= K_MIN_LARGE_ALLOC // MB:  # torch: > kMinLargeAlloc (10 MiB)
        raise ConfigError(f"{key} must be > {K_MIN_LARGE_ALLOC // MB}, got {mb}")
    return replace(cfg, large_segment_size=mb * MB)


def _read_fraction(cfg: AllocatorConfig, value: str) -> AllocatorConfig:
    key = "per_process_memory_fraction"
    f = _parse_fraction(key, value)
    if not 0.0 < f <= 1.0:
        raise ConfigError(f"{key} must be in (0, 1], got {value}")
    return replace(cfg, per_process_memory_fraction=f)


def _divisions_conf(cfg: AllocatorConfig) -> str | None:
    """The scalar form when every interval has the same divisions, else the ``[MB:d,...]`` list."""
    divs = cfg.roundup_power2_divisions
    if not any(divs):
        return None
    if len(set(divs)) == 1:
        return f"roundup_power2_divisions:{divs[0]}"
    inner = ",".join(f"{k}:{v}" for k, v in zip(ROUNDUP_KEYS, divs, strict=True))
    return f"roundup_power2_divisions:[{inner}]"


# The table's order is the order ``to_conf`` writes, and the advisor's order of its rules (ties in
# the suggestions' order go to the earlier row). Titles and reasons are the suggestions' words.
SETTINGS: tuple[Setting, ...] = (
    Setting(
        key="expandable_segments",
        read=_read_expandable,
        to_conf=lambda c: "expandable_segments:True" if c.expandable_segments else None,
        title="Turn on expandable segments",
        reason="segments grow in place instead of leaving unusable slivers",
        cost="none",
        whatifs=("expandable_segments:True",),
        whatif_order=0,
    ),
    Setting(
        key="max_split_size_mb",
        read=_read_max_split,
        to_conf=lambda c: f"max_split_size_mb:{c.max_split_size // MB}" if c.max_split_size != UNLIMITED else None,
        title="Stop the allocator from splitting large cached blocks",
        reason="large cached blocks are no longer carved up for smaller requests",
        cost="none",
        # The middle value first; the others only if the event budget allows.
        whatifs=tuple(f"max_split_size_mb:{mb}" for mb in (256, 64, 128, 512)),
        whatif_order=2,
    ),
    Setting(
        key="max_non_split_rounding_mb",
        read=_read_non_split_rounding,
        to_conf=lambda c: (
            f"max_non_split_rounding_mb:{c.max_non_split_rounding_size // MB}"
            if c.max_non_split_rounding_size != K_LARGE_BUFFER
            else None
        ),
        title="Let large requests take cached blocks a little larger than they ask for",
        reason="a request of max_split_size_mb or more may use a cached block up to this much larger",
        cost="none",
    ),
    Setting(
        key="roundup_power2_divisions",
        read=_read_divisions,
        to_conf=_divisions_conf,
        title="Round allocation sizes to power-of-two divisions",
        reason="requests of similar sizes share cached blocks",
        cost="none",
        whatifs=("roundup_power2_divisions:4",),
        whatif_order=3,
    ),
    Setting(
        key="garbage_collection_threshold",
        read=_read_gc_threshold,
        to_conf=lambda c: (
            f"garbage_collection_threshold:{c.garbage_collection_threshold:g}"
            if c.garbage_collection_threshold > 0
            else None
        ),
        title="Let the allocator reclaim cached blocks before hitting the cap",
        reason="old cached blocks are released before the cap is reached",
        cost="none",
        whatifs=("garbage_collection_threshold:0.6",),
        whatif_order=1,
        needs_cap=True,  # torch collects only under a per-process cap (AllocatorConfig.acting)
    ),
    Setting(
        key="large_segment_size_mb",
        read=_read_large_segment,
        to_conf=lambda c: (
            f"large_segment_size_mb:{c.large_segment_size // MB}" if c.large_segment_size != K_LARGE_BUFFER else None
        ),
        title="Change the size of the segments made for requests between 1 and 10 MiB",
        reason="such requests share segments of this size",
        cost="none",
    ),
    Setting(
        key="per_process_memory_fraction",
        read=_read_fraction,
        to_conf=lambda c: (
            f"per_process_memory_fraction:{c.per_process_memory_fraction:g}"
            if c.per_process_memory_fraction is not None
            else None
        ),
        title="Cap the share of the GPU this process may reserve",
        reason="the allocator refuses to grow past that share of the device",
        cost="none",
    ),
)


def setting_named(key: str) -> Setting | None:
    """The row of a PYTORCH_CUDA_ALLOC_CONF key (None: a key that does not move blocks, or unknown)."""
    return next((s for s in SETTINGS if s.key == key), None)


def offered_settings() -> tuple[Setting, ...]:
    """The settings the report tries on its own and the advisor may suggest, in table order."""
    return tuple(s for s in SETTINGS if s.whatifs)


def setting_of(conf: str) -> str:
    """The offered setting a what-if string tries, if it sets exactly one ("" otherwise: a mix,
    or a setting the report does not offer)."""
    keys = {part.key for part in split_conf(conf, strict=False)}
    offered = {s.key for s in offered_settings()}
    return next(iter(keys)) if len(keys) == 1 and keys <= offered else ""


def whatif_candidates(recorded: AllocatorConfig, *, capped: bool, at_most: int) -> list[tuple[str, str]]:
    """The report's own what-if configurations as (setting, config), cheapest-to-lose last: each
    offered setting the run did not set (one that ``needs_cap`` only under a cap), first what-ifs
    in ``whatif_order``, then the others; at most ``at_most`` of them."""
    rows = sorted(
        (s for s in offered_settings() if not s.is_set(recorded) and (capped or not s.needs_cap)),
        key=lambda s: s.whatif_order,
    )
    out = [(s.key, s.whatifs[0]) for s in rows] + [(s.key, conf) for s in rows for conf in s.whatifs[1:]]
    return out[:at_most]
