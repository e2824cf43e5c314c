"""Allocator settings and size rules (analysis.config), checked against what torch itself does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.config import GB, MB, UNLIMITED, AllocatorConfig, ConfigError
from analysis.reader import read_snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def divisions_at(cfg: AllocatorConfig, mb: int) -> int:
    return cfg.divisions_for(mb * MB)


def test_division_list_fills_below_the_first_key_and_after_the_last_only() -> None:
    # The expectations of c10/test/core/AllocatorConfig_test.cpp (torch 2.9+).
    cfg = AllocatorConfig.parse("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]")
    got = {mb: divisions_at(cfg, mb) for mb in (64, 128, 256, 512, 1024, 2048, 4096)}
    assert got == {64: 8, 128: 8, 256: 16, 512: 1, 1024: 0, 2048: 8, 4096: 2}
    cfg = AllocatorConfig.parse("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]")
    got = {mb: divisions_at(cfg, mb) for mb in (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)}
    assert got == {32: 8, 64: 8, 128: 2, 256: 4, 512: 2, 1024: 4, 2048: 1, 4096: 1, 8192: 1}


def test_division_list_as_recorded_by_a_real_run() -> None:
    # gpu_roundup_list ran with this string; the snapshot's settings hold torch's own expansion.
    conf = json.loads((FIXTURES / "gpu_roundup_list.truth.json").read_text())["alloc_conf"]
    s = read_snapshot(FIXTURES / "gpu_roundup_list.pickle.gz")
    assert AllocatorConfig.parse(conf).roundup_power2_divisions == tuple(
        s.settings.raw["roundup_power2_divisions"][k]
        for k in sorted(s.settings.raw["roundup_power2_divisions"], key=int)
    )
    assert AllocatorConfig.from_settings(s.settings.raw, s.settings.conf) == AllocatorConfig.parse(conf)


def test_single_division_value_applies_everywhere() -> None:
    cfg = AllocatorConfig.parse("roundup_power2_divisions:4")
    assert cfg.roundup_power2_divisions == (4,) * 16
    assert cfg.round_size(1200 * MB) == 1280 * MB  # quarters between 1 GiB and 2 GiB
    assert cfg.round_size(1024 * MB) == 1024 * MB  # powers of two stay
    assert cfg.round_size(1000) == 1024  # 1000 > 512 * 4 is false: plain 512 rounding


@pytest.mark.parametrize(
    "bad",
    [
        "roundup_power2_divisions:3",
        "roundup_power2_divisions:[100:4]",
        "roundup_power2_divisions:[128:3]",
        "max_split_size_mb:19",
        "max_non_split_rounding_mb:10",
        "expandable_segments:yes",
        "garbage_collection_threshold:1.5",
        "backend:cudaMallocAsync",
    ],
)
def test_rejects_settings_torch_rejects(bad: str) -> None:
    with pytest.raises(ConfigError):
        AllocatorConfig.parse(bad)


def test_split_limits_accept_the_20_mib_minimum() -> None:
    cfg = AllocatorConfig.parse("max_split_size_mb:20,max_non_split_rounding_mb:20")
    assert cfg.max_split_size == 20 * MB
    assert cfg.max_non_split_rounding_size == 20 * MB
    assert AllocatorConfig().max_split_size == UNLIMITED


def test_parse_on_a_base_keeps_the_base() -> None:
    base = AllocatorConfig.parse("max_split_size_mb:256")
    both = AllocatorConfig.parse("expandable_segments:True", base=base)
    assert both.max_split_size == 256 * MB
    assert both.expandable_segments
    assert both.to_conf() == "expandable_segments:True,max_split_size_mb:256"


@pytest.mark.parametrize(
    "conf",
    [
        "",
        "roundup_power2_divisions:4",
        "roundup_power2_divisions:[1:2,64:8,>:16]",
        "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
        "large_segment_size_mb:64",
    ],
)
def test_column_rules_equal_the_scalar_rules(conf: str) -> None:
    cfg = AllocatorConfig.parse(conf)
    rng = np.random.default_rng(7)
    sizes = np.r_[
        rng.integers(1, 1 << rng.integers(2, 38, 5000), dtype=np.int64),
        [1, 511, 512, 513, MB, MB + 1, 10 * MB - 1, 10 * MB, 3 * GB + 1],
    ].astype(np.int64)
    rounded = cfg.round_sizes(sizes)
    assert rounded.tolist() == [cfg.round_size(int(x)) for x in sizes]
    assert cfg.allocation_sizes(rounded).tolist() == [cfg.allocation_size(int(x)) for x in rounded]


def test_size_rules() -> None:
    cfg = AllocatorConfig()
    assert cfg.round_size(1) == 512
    assert cfg.round_size(513) == 1024
    assert cfg.allocation_size(MB) == 2 * MB  # small pool segment
    assert cfg.allocation_size(MB + 512) == 20 * MB  # 1-10 MiB share a 20 MiB segment
    assert cfg.allocation_size(10 * MB + 1) == 12 * MB  # else rounded to 2 MiB
    assert cfg.should_split(2 * MB, 512, small_pool=True)
    assert not cfg.should_split(20 * MB, 19 * MB, small_pool=False)  # remainder not > 1 MiB
    assert cfg.should_split(20 * MB, 18 * MB, small_pool=False)
    capped = AllocatorConfig.parse("max_split_size_mb:256")
    assert not capped.should_split(600 * MB, 300 * MB, small_pool=False)  # request above max_split
    assert not capped.block_fits(300 * MB, 100 * MB)  # oversize block, small request
    assert capped.block_fits(300 * MB, 290 * MB)  # within max_non_split_rounding (20 MiB)
    assert not capped.block_fits(320 * MB, 290 * MB)
