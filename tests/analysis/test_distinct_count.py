"""The compiled count of distinct values (``compiled.distinct_count``) against its reference, the sort's."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.allocator import compiled
from analysis.model import sorted_unique
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
