"""The compiled reader's check that every free names its block's stream and pool, against the reference.

``schemacheck._check_frees_match_their_blocks`` sorts the block events by address; the compiled reader
asks ``fastread.first_free_off_lane`` (``_snapread.free_lanes``: one pass in trace order, a map of each
address's last block event). Both must refuse the same event with the same message, or both pass: on
random columns (few addresses, several streams and pools, every kind of event), and through both
readers on fixtures whose frees were moved to another stream.
"""

from __future__ import annotations

import gzip
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis import fastread
from analysis.errors import SnapshotError
from analysis.reader import ReadLimits, read_snapshot
from analysis.schemacheck import check_trace_columns

pytestmark = pytest.mark.skipif(not fastread.available(), reason="the compiled reader is not built")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _refusal(columns: tuple[np.ndarray, ...], compiled: bool) -> str | None:
    action, addr, stream, pool = columns
    streams = sorted(set(stream.tolist())) or [0]
    off_lane = fastread.first_free_off_lane if compiled else None
    try:
        check_trace_columns(ReadLimits(), action, addr, stream, pool, streams, "t", first_off_lane=off_lane)
    except SnapshotError as exc:
        return f"{exc.code}: {exc.message}"
    return None


def test_random_columns_are_refused_alike() -> None:
    rng = np.random.default_rng(34)
    outcomes = {"refused": 0, "passed": 0}
    for _ in range(400):
        n = int(rng.integers(0, 80))
        action = rng.integers(0, 5, n).astype(np.int8)  # the three block kinds and two segment kinds
        addr = (rng.integers(-3, 4, n) * 512).astype(np.int64)  # negative too: the sort is signed
        stream = rng.choice(np.array([0, 0, 0, 1], np.int32), n)
        pool = rng.choice(np.array([0, 0, 0, 0, 2], np.int32), n)
        columns = (action, addr, stream, pool)
        fast = _refusal(columns, compiled=True)
        assert fast == _refusal(columns, compiled=False)
        assert fast is None or fast.startswith("snapshot:schema:inconsistent-trace: ")
        outcomes["passed" if fast is None else "refused"] += 1
    assert all(outcomes.values()), outcomes


def test_the_pass_reads_the_columns_it_is_given() -> None:
    action = np.array([0, 1, 2, 0, 1], np.int8)
    addr = np.full(5, 1 << 21, np.int64)
    stream = np.zeros(5, np.int32)
    pool = np.zeros(5, np.int32)
    assert fastread.first_free_off_lane(action, addr, stream, pool) == ()
    stream[4] = 1  # the second free_requested on another stream than its alloc (event 3)
    assert fastread.first_free_off_lane(action, addr, stream, pool) == (4, 3)
    stream[4], pool[3] = 0, 1  # an alloc in another pool than the free_completed before it: no pair
    assert fastread.first_free_off_lane(action, addr, stream, pool) == (4, 3)
    pool[4] = 1
    assert fastread.first_free_off_lane(action, addr, stream, pool) == ()


def _moved_frees(raw: dict[str, Any], rng: random.Random) -> bytes:
    traces = [list(t) for t in raw["device_traces"]]
    trace = max(traces, key=len)
    streams = [*sorted({e.get("stream", 0) for e in trace}), 7]
    frees = [k for k, e in enumerate(trace) if e["action"] in ("free_requested", "free_completed")]
    for k in rng.sample(frees, min(len(frees), rng.randint(1, 3))):
        trace[k] = {**trace[k], "stream": rng.choice(streams)}
    return pickle.dumps({**raw, "device_traces": traces})


@pytest.mark.parametrize("name", ["gpu_side_stream", "gpu_cuda_graph", "frag_oom"])
def test_both_readers_refuse_a_free_moved_to_another_stream_alike(name: str) -> None:
    with gzip.open(FIXTURES / f"{name}.pickle.gz") as fh:
        raw = pickle.load(fh)
    rng = random.Random(f"34:{name}")  # noqa: S311 - a seeded fuzz, not a secret
    refused = 0
    for _ in range(12):
        data = _moved_frees(raw, rng)
        answers: list[Any] = []
        for compiled in (True, False):
            try:
                snap = read_snapshot(data, compiled=compiled)
                answers.append([d.trace.stream.tolist() for d in snap.devices])
            except SnapshotError as exc:
                answers.append(exc.message)
            if compiled:
                assert fastread.give_up_line() == 0  # the compiled reader read it (no hand-over)
        assert answers[0] == answers[1]
        refused += isinstance(answers[0], str) and "names stream" in answers[0]
    assert refused, name
