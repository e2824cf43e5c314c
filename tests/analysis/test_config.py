"""Allocator settings and size rules (analysis.allocator.config), checked against what torch itself does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.allocator.config import GB, MB, UNLIMITED, AllocatorConfig, ConfigError, recorded_settings
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


def _random_sizes(seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    out = rng.integers(1, 1 << rng.integers(2, 36, 3000), dtype=np.int64).tolist()
    return [int(x) for x in out] + [1, 511, 512, 513, MB, MB + 1, 20 * MB, 64 * MB, 256 * MB, 3 * GB]


@pytest.mark.parametrize(
    "conf",
    [
        "",
        "max_split_size_mb:64",
        "max_split_size_mb:256,max_non_split_rounding_mb:40",
        "expandable_segments:True",
        "expandable_segments:True,max_split_size_mb:64",
    ],
)
def test_split_and_fit_rules_are_torchs_should_split_and_get_free_block(conf: str) -> None:
    # torch, c10/cuda/CUDACachingAllocator.cpp, spelled out here as the source has them:
    #   should_split: small pool or expandable -> remaining >= kMinBlockSize (512);
    #                 else size < max_split_size && remaining > kSmallSize (1 MiB)
    #   get_free_block: reject if size < mss && block >= mss,
    #                   or if size >= mss && block >= size + max_non_split_rounding_size
    cfg = AllocatorConfig.parse(conf)
    mss, nsr = cfg.max_split_size, cfg.max_non_split_rounding_size
    sizes = _random_sizes(3)
    rng = np.random.default_rng(4)
    for size in sizes:
        for extra in (0, 1, 511, 512, MB, MB + 1, 20 * MB - 1, 20 * MB, int(rng.integers(0, 1 << 32))):
            block = size + extra
            small = size <= MB
            remaining = block - size
            torch_split = remaining >= 512 if small or cfg.expandable_segments else size < mss and remaining > MB
            assert cfg.should_split(block, size, small) is torch_split
            over, below = cfg.split_rule(small)
            assert (remaining > over and size < below) is torch_split
            torch_fits = not (size < mss and block >= mss) and not (size >= mss and block >= size + nsr)
            assert cfg.block_fits(block, size) is torch_fits
            assert (block < cfg.fit_limit(size)) is torch_fits
        assert not cfg.block_fits(size - 1, size)


def test_gc_threshold_truncates_like_the_cpp_cast() -> None:
    # static_cast<size_t>(0.6 * 4.5 GiB) = 2899102924.8 -> 2899102924
    cfg = AllocatorConfig.parse("garbage_collection_threshold:0.6")
    assert cfg.gc_threshold_bytes(int(4.5 * GB)) == 2899102924


def test_expandable_pages_are_2_mib_small_and_the_large_segment_size_large() -> None:
    assert AllocatorConfig().page_size(True) == 2 * MB
    assert AllocatorConfig().page_size(False) == 20 * MB
    assert AllocatorConfig.parse("large_segment_size_mb:64").page_size(False) == 64 * MB


@pytest.mark.parametrize("conf", ["", "roundup_power2_divisions:1", "roundup_power2_divisions:4"])
def test_plain_rounding_flag_means_round_size_is_512_rounding(conf: str) -> None:
    cfg = AllocatorConfig.parse(conf)
    plain = [max(512, (s + 511) & -512) for s in _random_sizes(5)]
    rounded = [cfg.round_size(s) for s in _random_sizes(5)]
    # divisions of 1 round nothing (torch issue #161139): still plain
    assert cfg.rounds_plainly is (plain == rounded)
    assert cfg.rounds_plainly is (conf != "roundup_power2_divisions:4")


def _with_settings(settings: object, tmp_path: Path) -> Path:
    import gzip
    import pickle

    raw = pickle.loads(gzip.decompress((FIXTURES / "gpu_grow_oom.pickle.gz").read_bytes()))
    raw["allocator_settings"] = settings
    out = tmp_path / "garbage_settings.pickle.gz"
    out.write_bytes(gzip.compress(pickle.dumps(raw)))
    return out


GARBAGE = {
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:maybe,max_split_size_mb:3,roundup_power2_divisions:[x:y]",
    "max_split_size": "lots",
    "garbage_collection_threshold": 7.5,
    "expandable_segments": "yes",
    "roundup_power2_divisions": {"1": "x", "2": 3},
}


def test_recorded_settings_torch_would_refuse_are_named_and_left_at_defaults() -> None:
    cfg, problems = recorded_settings(GARBAGE, GARBAGE["PYTORCH_CUDA_ALLOC_CONF"])
    assert cfg == AllocatorConfig()
    assert len(problems) == 8  # 3 in the string, max_split_size, the threshold, expandable, two divisions
    assert any("expandable_segments expects True or False" in p for p in problems)
    # What can be read still is: a valid string key beside a bad one.
    cfg, problems = recorded_settings({}, "max_split_size_mb:3,expandable_segments:True")
    assert cfg.expandable_segments
    assert problems == ["max_split_size_mb must be >= 20, got 3"]


def test_a_snapshot_with_garbage_allocator_settings_is_analysed_with_a_warning(tmp_path: Path) -> None:
    from analysis.allocator import replay_check
    from analysis.report import build_report

    path = _with_settings(GARBAGE, tmp_path)
    report = build_report(path, jobs=1)  # no ConfigError escapes (the worker would call it internal)
    codes = [w["code"] for w in report["capture"]["warnings"]]
    assert "allocator-settings-unreadable" in codes
    # Under the defaults the real run (default settings) is still reproduced event for event.
    assert replay_check(read_snapshot(path), 0)["exact"]


def test_release_available_frees_exactly_what_torch_frees() -> None:
    # release_available_cached_blocks (max_split_size 128 MB): key = max(request, 128 MB).
    cfg = AllocatorConfig.parse("max_split_size_mb:128")
    # rand_s19_c25_maxsplit_gc, event 2120, for a 1,255,586,816 B request: no single block reaches
    # the key, so the largest go first until the total does: 767.6 + 205.5 + 188.7 = 1,161.8 MB
    # < 1,255.6 MB, + 153.1 = 1,314.9 MB >= it, and it stops there.
    freed = [767_557_632, 205_520_896, 188_743_680, 153_092_096]
    assert cfg.release_available_frees(freed, 1_255_586_816, flush_follows=False)
    # One more block would be past the stop; ascending order is the GC's (the pool's order).
    assert not cfg.release_available_frees([*freed, 140 * MB], 1_255_586_816, flush_follows=False)
    assert not cfg.release_available_frees(freed[::-1], 1_255_586_816, flush_follows=False)
    # Short of the key: only when it ran out of oversize blocks and the malloc went on to flush
    # (rand_s20_c25_maxsplit_gc, event 1870: 627 MB freed for a 1,186,276,864 B request).
    assert cfg.release_available_frees([627_048_448], 1_186_276_864, flush_follows=True)
    assert not cfg.release_available_frees([627_048_448], 1_186_276_864, flush_follows=False)
    # A single block of at least the key is released alone; a block under 128 MB never is.
    assert cfg.release_available_frees([300 * MB], 200 * MB, flush_follows=False)
    assert not cfg.release_available_frees([300 * MB, 200 * MB], 200 * MB, flush_follows=False)
    assert not cfg.release_available_frees([100 * MB], 50 * MB, flush_follows=True)
    # Without max_split_size there is no release_available at all.
    assert not AllocatorConfig().release_available_frees([300 * MB], 200 * MB, flush_follows=False)


def test_large_segment_size_is_read_first_and_bounds_the_split_settings() -> None:
    # torch's AllocatorConfig::parseArgs reads large_segment_size_mb before the other keys, wherever
    # it stands: it must exceed kMinLargeAlloc (10 MiB); max_split_size_mb and
    # max_non_split_rounding_mb may not be below it; and the rounding defaults to it.
    cfg = AllocatorConfig.parse("max_split_size_mb:64,large_segment_size_mb:32")
    assert (cfg.large_segment_size, cfg.max_split_size, cfg.max_non_split_rounding_size) == (32 * MB, 64 * MB, 32 * MB)
    explicit = AllocatorConfig.parse("max_non_split_rounding_mb:40,large_segment_size_mb:32")
    assert explicit.max_non_split_rounding_size == 40 * MB
    for bad in (
        "large_segment_size_mb:64,max_split_size_mb:32",  # a split size below the segment size
        "max_non_split_rounding_mb:24,large_segment_size_mb:32",
        "large_segment_size_mb:10",  # not above 10 MiB
        "max_split_size_mb:19",  # below the default 20 MiB segment
    ):
        with pytest.raises(ConfigError):
            AllocatorConfig.parse(bad)
    assert AllocatorConfig.parse("max_split_size_mb:20").max_split_size == 20 * MB  # >=, not >
