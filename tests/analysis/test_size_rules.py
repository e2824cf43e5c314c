"""The allocator's size rules (analysis/config.py) at their boundaries, hand-computed.

Each case sits on an edge of a comparison (``<`` against ``<=``, ``>`` against ``>=``), so an
off-by-one in the rule fails it; the arithmetic is in the comment. The scalar rules and their
numpy column forms must agree on every case.
"""

from __future__ import annotations

import numpy as np
import pytest

from analysis.allocator.config import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    MB,
    AllocatorConfig,
    is_small,
)

GB = 1024 * MB


def both(cfg: AllocatorConfig, size: int) -> int:
    """round_size, checked to equal round_sizes on the same value."""
    scalar = cfg.round_size(size)
    column = cfg.round_sizes(np.asarray([size], np.int64))
    assert column.dtype == np.int64
    assert int(column[0]) == scalar, (size, scalar, int(column[0]))
    return scalar


def test_round_size_plain_512_rounding() -> None:
    cfg = AllocatorConfig()
    assert both(cfg, 1) == 512  # below kMinBlockSize: one 512 B block
    assert both(cfg, 511) == 512
    assert both(cfg, 512) == 512
    assert both(cfg, 513) == 1024  # one byte over: the next multiple of 512
    assert both(cfg, 2 * MB - 1) == 2 * MB


def test_round_size_with_two_divisions() -> None:
    # roundup_power2_divisions:2 splits [1 MiB, 2 MiB) in halves: 1.3 MiB (1,363,149 B) rounds
    # up to the 1.5 MiB division (1,572,864 B), not to plain 512 B rounding (1,363,456 B).
    cfg = AllocatorConfig.parse("roundup_power2_divisions:2")
    assert both(cfg, 1_363_149) == 1_572_864
    assert both(cfg, 3 * MB // 2) == 3 * MB // 2  # on a division: unchanged
    # 1,024 B = 512 x 2 is not above 512 x divisions: plain rounding; 1,025 is, and rounds to a
    # half of [1024, 2048): 1,536 B.
    assert both(cfg, 1024) == 1024
    assert both(cfg, 1025) == 1536


def test_round_size_one_below_a_power_of_two() -> None:
    # 2 MiB - 1 with 4 divisions: the floor division is 2 MiB - 256 KiB (1,835,008 B), the next
    # one is 2 MiB. (A size of the form 2^k - 1 is not a power of two: it must still round.)
    cfg = AllocatorConfig.parse("roundup_power2_divisions:4")
    assert both(cfg, 2 * MB - 1) == 2 * MB
    assert both(cfg, 2 * MB) == 2 * MB  # a power of two stays
    assert both(cfg, 2 * MB + 1) == 2 * MB + 512 * 1024  # quarters of [2 MiB, 4 MiB)


def test_the_last_division_interval_covers_everything_from_32_gib() -> None:
    # Keys name intervals in MiB: 16384 (16 GiB) is interval 14, 32768 (32 GiB) interval 15, the
    # last; the first key also covers every interval below it.
    cfg = AllocatorConfig.parse("roundup_power2_divisions:[16384:4,32768:8]")
    assert cfg.divisions_for(20 * GB) == 4
    assert cfg.divisions_for(40 * GB) == 8
    assert cfg.divisions_for(100 * GB) == 8  # past 32 GiB: still the last interval
    # 40 GiB + 1 with 8 divisions of [32 GiB, 64 GiB): steps of 4 GiB, up to 44 GiB.
    assert both(cfg, 40 * GB + 1) == 44 * GB
    # 20 GiB + 1 with 4 divisions of [16 GiB, 32 GiB): steps of 4 GiB, up to 24 GiB.
    assert both(cfg, 20 * GB + 1) == 24 * GB


def test_allocation_size_boundaries() -> None:
    cfg = AllocatorConfig()
    sizes = [K_SMALL_SIZE, K_SMALL_SIZE + 512, 10 * MB - 512, 10 * MB, 10 * MB + 512, 22 * MB]
    # <= 1 MiB: a 2 MiB small segment; (1 MiB, 10 MiB): a 20 MiB large one; >= 10 MiB: the size
    # rounded up to 2 MiB (10 MiB + 512 -> 12 MiB).
    expected = [K_SMALL_BUFFER, K_LARGE_BUFFER, K_LARGE_BUFFER, 10 * MB, 12 * MB, 22 * MB]
    assert [cfg.allocation_size(s) for s in sizes] == expected
    bigger = AllocatorConfig.parse("large_segment_size_mb:64")
    assert bigger.allocation_size(2 * MB) == 64 * MB


def test_is_small_is_the_small_pool_boundary() -> None:
    assert is_small(K_SMALL_SIZE)  # exactly 1 MiB is still small
    assert not is_small(K_SMALL_SIZE + 512)


@pytest.mark.parametrize(
    ("block", "size", "fits"),
    [
        # max_split_size 256 MiB, max_non_split_rounding 20 MiB (defaults).
        (256 * MB, 256 * MB, True),  # a request equal to max_split_size may take a block of it
        (256 * MB, 256 * MB - 512, False),  # a smaller request never takes an oversize block
        (256 * MB - 512, 256 * MB - 1024, True),  # below max_split_size both: fits
        (276 * MB - 512, 256 * MB, True),  # within 256 + 20 MiB of rounding
        (276 * MB, 256 * MB, False),  # exactly 256 + 20 MiB: past the rounding limit
    ],
)
def test_block_fits_boundaries(block: int, size: int, fits: bool) -> None:
    cfg = AllocatorConfig.parse("max_split_size_mb:256")
    assert cfg.block_fits(block, size) is fits


def test_column_rules_answer_int64_whatever_integer_column_they_get() -> None:
    # A column read as int32 (the reader's stream and pool columns are int32) must not come back
    # as int32: sizes past 2 GiB would wrap. 1,363,149 B with 2 divisions -> 1,572,864 B.
    cfg = AllocatorConfig.parse("roundup_power2_divisions:2")
    got = cfg.round_sizes(np.asarray([1000, 1_363_149], np.int32))
    assert got.dtype == np.int64
    assert got.tolist() == [1024, 1_572_864]
