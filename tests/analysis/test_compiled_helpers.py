"""The compiled helpers of numpy passes against their references: the count of distinct values
(``compiled.distinct_count``, the sort's) and the request stream's op column (``compiled.request_stream``,
``requests._ops_of``)."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.allocator import compiled, requests
from analysis.model import ALLOC, FREE_COMPLETED, FREE_REQUESTED, OOM, SEGMENT_FREE, sorted_unique
from analysis.stages.workload import _distinct

pytestmark = pytest.mark.skipif(not compiled.wanted(), reason="the compiled loops are off")


@pytest.mark.parametrize("seed", range(20))
def test_the_count_is_the_sorted_distinct_values(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 5000))
    spread = int(rng.choice([1, 7, 300, 2**20, 2**62]))
    values = rng.integers(-spread, spread, n).astype(np.int64) << int(rng.integers(0, 9))
    if seed % 3 == 0 and n:  # the hash set's empty key, a value of its own
        values[rng.integers(0, n, 3)] = np.iinfo(np.int64).min
    assert compiled.distinct_count(values) == sorted_unique(values).size


def test_the_count_grows_past_its_first_table_and_takes_any_integer_column() -> None:
    values = np.arange(100_000, dtype=np.int64)[::-1] * 512
    assert compiled.distinct_count(values) == 100_000
    assert compiled.distinct_count(np.r_[values, values].astype(np.int32)) == 100_000
    assert compiled.distinct_count(np.zeros(0, np.int64)) == 0


def test_the_advisor_reads_the_same_count_either_way(monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.repeat(np.arange(5000, dtype=np.int64) << 20, 3)
    assert _distinct(values) == 5000
    monkeypatch.setenv(compiled.ENV_VAR, "python")
    assert compiled.distinct_count(values) is None and _distinct(values) == 5000


@pytest.mark.parametrize("seed", range(40))
def test_the_request_stream_is_numpys(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    kinds = [ALLOC, FREE_REQUESTED, FREE_COMPLETED, OOM, SEGMENT_FREE]
    if seed % 4 == 1:  # skip_actions: one kind of free only
        kinds.remove(FREE_COMPLETED)
    elif seed % 4 == 2:
        kinds.remove(FREE_REQUESTED)
    act = rng.choice(kinds, n).astype(np.int8)
    addr = rng.integers(0, 4, n).astype(np.int64) * 512  # few addresses: pairs at the same one and not
    flushes = (
        np.unique(rng.integers(0, max(n, 1), int(rng.integers(0, 3)))).astype(np.int64) if n else np.zeros(0, np.int64)
    )
    got = compiled.request_stream(act, addr, requests._STREAM_CODES, flushes)
    assert got is not None
    for mine, ref in zip(got, requests._ops_of(act, addr, flushes), strict=True):
        assert mine.dtype == ref.dtype
        np.testing.assert_array_equal(mine, ref)


@pytest.mark.parametrize("seed", range(20))
def test_the_peak_without_the_cut_halves_is_numpys(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from analysis.stages.outline import Live
    from analysis.stages.workload import _peak_without

    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 3000))
    size = rng.integers(0, 1 << 40, m).astype(np.int64)
    end_rank = np.minimum(np.arange(1, m + 1) + rng.integers(0, 50, m), m).astype(np.int64)
    end_rank[rng.random(m) < 0.2] = m  # live at the end
    live = Live(np.cumsum(size) - rng.integers(0, 1 << 30, m), end_rank)
    cut = rng.random(m) < rng.random()
    cut[int(rng.integers(0, m))] = True
    halves = size >> 1
    got = _peak_without(live, halves, cut)
    assert compiled.peak_without(live.after, live.end_rank, halves, cut) == got
    monkeypatch.setenv(compiled.ENV_VAR, "python")
    assert _peak_without(live, halves, cut) == got
