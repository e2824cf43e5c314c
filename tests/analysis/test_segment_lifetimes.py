"""``analysis.explore.segment_lifetimes`` (issue 36: by bisection, not a scan of every open range per
unmap) gives the rows of the quadratic reference it replaced, on real traces and random valid ones."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from analysis.explore import segment_lifetimes
from analysis.model import SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP
from analysis.reader import read_snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def reference(action: np.ndarray, addr: np.ndarray, size: np.ndarray, before: list[tuple[int, int]]) -> list[tuple]:
    """The web tier's former pass: every open range compared with each unmap."""
    n = int(action.shape[0])
    open_at: dict[tuple[int, int], int] = dict.fromkeys(before, 0)
    rows = []
    for i in np.flatnonzero(np.isin(action, (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP))).tolist():
        a, z, what = int(addr[i]), int(size[i]), int(action[i])
        if what in (SEGMENT_ALLOC, SEGMENT_MAP):
            open_at[(a, z)] = i
        elif what == SEGMENT_FREE:
            rows.append((open_at.pop((a, z), 0), i, z, a))
        else:
            for ra, rz in [k for k in open_at if k[0] < a + z and a < k[0] + k[1]]:
                rows.append((open_at.pop((ra, rz)), i, rz, ra))
                if ra < a:
                    open_at[(ra, a - ra)] = i
                if a + z < ra + rz:
                    open_at[(a + z, ra + rz - a - z)] = i
    rows.extend((start, n, key[1], key[0]) for key, start in open_at.items())
    return sorted(r for r in rows if r[0] < r[1] or r[0] == 0)


def rows_of(life: dict[str, np.ndarray]) -> list[tuple]:
    return list(zip(*(life[k].tolist() for k in ("start", "end", "size", "address")), strict=True))


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "frag_oom", "gpu_empty_cache", "gpt_varlen_expandable"])
def test_real_traces_give_the_reference_rows(case: str) -> None:
    trace = read_snapshot(FIXTURES / f"{case}.pickle.gz").devices[0].trace
    action, addr, size = np.asarray(trace.action), np.asarray(trace.addr, np.int64), np.asarray(trace.size, np.int64)
    got = rows_of(segment_lifetimes(action, addr, size))
    assert got == reference(action, addr, size, [])
    assert len(got) > 0


def random_valid_trace(seed: int, steps: int = 3000) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """Segments made and freed whole, page ranges mapped over free pages and unmapped anywhere mapped."""
    rng = random.Random(seed)  # noqa: S311 (a test trace, not a secret)
    page = 1 << 21
    mapped: set[int] = set()  # page numbers of the expandable region
    segments: list[tuple[int, int]] = []
    before = [(1 << 40, 3 * page)]
    events = []
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.2:
            a = (1 << 38) + rng.randrange(1 << 20) * page * 8
            if all(a != s for s, _ in segments):
                segments.append((a, page * rng.randint(1, 8)))
                events.append((SEGMENT_ALLOC, *segments[-1]))
        elif roll < 0.3 and segments:
            events.append((SEGMENT_FREE, *segments.pop(rng.randrange(len(segments)))))
        elif roll < 0.65:
            p, k = rng.randrange(200), rng.randint(1, 6)
            if not any(q in mapped for q in range(p, p + k)):
                mapped.update(range(p, p + k))
                events.append((SEGMENT_MAP, p * page, k * page))
        else:
            p, k = rng.randrange(200), rng.randint(1, 12)
            if all(q in mapped for q in range(p, p + k)):
                mapped.difference_update(range(p, p + k))
                events.append((SEGMENT_UNMAP, p * page, k * page))
        if rng.random() < 0.3:
            events.append((0, 0, 512))  # an allocation between: not a segment event
    if rng.random() < 0.5:
        events.append((SEGMENT_UNMAP, before[0][0] + page, page))
    cols = np.array(events, np.int64).reshape(-1, 3)
    return cols[:, 0].astype(np.int8), cols[:, 1], cols[:, 2], before


@pytest.mark.parametrize("seed", range(8))
def test_random_valid_traces_give_the_reference_rows(seed: int) -> None:
    action, addr, size, before = random_valid_trace(seed)
    assert rows_of(segment_lifetimes(action, addr, size, before)) == reference(action, addr, size, before)
