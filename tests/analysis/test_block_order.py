"""The compiled pass of ``eventorder.check_event_order`` (``_replaycore.block_order``) against its reference.

The reference sorts a trace's block events by address and compares each with its neighbour; the
compiled pass keeps each address's last block event in a map, in trace order. Both must refuse the
same event with the same message, or both pass: on every fixture as it is, and on a seeded fuzz of
swaps, drops and repeats of their events (the mutants of ``test_event_order``), which reaches both
kinds of refusal (an action out of turn, and a free in another pool or stream than its alloc).
"""

from __future__ import annotations

import gzip
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.allocator import compiled
from analysis.allocator.eventorder import _next_kind, check_event_order
from analysis.allocator.requests import _event_pools
from analysis.errors import SnapshotError
from analysis.model import DeviceData
from analysis.reader import read_snapshot
from analysis.stacks import _paired_by_address

pytestmark = pytest.mark.skipif(not compiled.available(), reason="the compiled replay loops are not built")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE_FILES = sorted(p.name.removesuffix(".pickle.gz") for p in FIXTURES.glob("*.pickle.gz"))
FUZZ_FILES = ["gpu_cuda_graph", "gpu_side_stream", "gpu_maxsplit_oom", "gpu_empty_cache", "frag_oom", "wrapped_ring"]
FUZZ_CASES = 300


def _outcome(dev: DeviceData, monkeypatch: pytest.MonkeyPatch, loops: str) -> str | None:
    """The refusal's message of check_event_order on ``dev`` with the given loops, or None (in order)."""
    if loops == "python":
        monkeypatch.setenv(compiled.ENV_VAR, "python")
    else:
        monkeypatch.delenv(compiled.ENV_VAR, raising=False)
    try:
        check_event_order(dev, _event_pools(dev))
    except SnapshotError as exc:
        return f"{exc.code}: {exc.message}"
    return None


def _devices(source: Any) -> list[DeviceData]:
    try:
        return [d for d in read_snapshot(source).devices if len(d.trace)]
    except SnapshotError:
        return []  # a mutant the reader refuses never reaches the model


def _raw(name: str) -> dict[str, Any]:
    with gzip.open(FIXTURES / f"{name}.pickle.gz") as fh:
        data: dict[str, Any] = pickle.load(fh)
    return data


@pytest.mark.parametrize("name", FIXTURE_FILES)
def test_every_fixture_passes_both_ways(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real traces are in order: the compiled pass runs (does not decline) and agrees with the reference."""
    for dev in _devices(FIXTURES / f"{name}.pickle.gz"):
        pools = _event_pools(dev)
        t = dev.trace
        lanes = len(dev.streams) > 1 or bool(pools.any())
        monkeypatch.delenv(compiled.ENV_VAR, raising=False)
        assert compiled.first_block_out_of_order(t.action, t.addr, t.stream, pools, _next_kind(t), lanes) == ()
        assert _outcome(dev, monkeypatch, "python") is None


def _mutant(rng: random.Random, raw: dict[str, Any]) -> bytes:
    traces = [list(t) for t in raw["device_traces"]]
    trace = max(traces, key=len)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(trace))
        kind = rng.choice(["swap", "near", "drop", "repeat"])
        if kind in ("swap", "near"):
            j = rng.randrange(len(trace)) if kind == "swap" else max(0, min(len(trace) - 1, i + rng.randint(-6, 6)))
            trace[i], trace[j] = trace[j], trace[i]
        elif kind == "drop":
            del trace[i]
        else:
            trace.insert(min(len(trace), i + rng.randint(0, 20)), trace[i])
    return pickle.dumps({**raw, "device_traces": traces})


def test_a_fuzz_of_event_order_refuses_the_same_event_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    raws = {name: _raw(name) for name in FUZZ_FILES}
    rng = random.Random(34)  # noqa: S311 - a seeded fuzz, not a secret
    seen = {"in order": 0, "follows": 0, "does not match": 0}
    # A free in another pool than its alloc's: the reader refuses a stream or pool that differs in the
    # trace itself, so this reaches the model only where the pools are read off the segments (torch
    # 2.11): gpu_cuda_graph's segment_alloc of a private pool swapped with the alloc inside it.
    swapped = [list(t) for t in raws["gpu_cuda_graph"]["device_traces"]]
    swapped[0][96], swapped[0][97] = swapped[0][97], swapped[0][96]
    cases = [pickle.dumps({**raws["gpu_cuda_graph"], "device_traces": swapped})]
    cases += [_mutant(rng, raws[rng.choice(FUZZ_FILES)]) for _ in range(FUZZ_CASES)]
    for case in cases:
        for dev in _devices(case):
            fast = _outcome(dev, monkeypatch, "compiled")
            assert fast == _outcome(dev, monkeypatch, "python")
            if fast is None:
                seen["in order"] += 1
            elif not fast.startswith("snapshot:schema:event-order: "):
                pytest.fail(fast)
            elif "segment_" not in fast.split(") ", 1)[0]:  # the block events' refusals (the segments' stay Python)
                seen["follows" if " follows " in fast else "does not match"] += 1
    assert all(seen.values()), seen


def test_an_address_at_the_maps_empty_key_is_left_to_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """INT64_MIN, which no real address is, is the map's empty slot: the pass declines it."""
    monkeypatch.delenv(compiled.ENV_VAR, raising=False)
    action = np.array([0, 1, 2, 0], np.int8)
    addr = np.array([np.iinfo(np.int64).min] * 4, np.int64)
    zeros = np.zeros(4, np.int32)
    next_kind = np.array([1, 2, 0], np.int8)
    assert compiled.first_block_out_of_order(action, addr, zeros, zeros, next_kind, False) is None
    addr[:] = 1 << 20
    assert compiled.first_block_out_of_order(action, addr, zeros, zeros, next_kind, False) == ()
    action[3] = 1  # a free_requested after the free_completed
    assert compiled.first_block_out_of_order(action, addr, zeros, zeros, next_kind, False) == (3, 2, True)


def test_the_pairing_is_kept_for_the_same_columns_and_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """alloc_ends' answer is given again for the same columns (the lifetimes and the completeness check
    ask it of each trace), read-only; other columns with other contents get their own answer."""
    monkeypatch.delenv(compiled.ENV_VAR, raising=False)
    dev = max(_devices(FIXTURES / "gpu_maxsplit_oom.pickle.gz"), key=lambda d: len(d.trace))
    action, addr = dev.trace.action, dev.trace.addr
    first = compiled.alloc_ends(action, addr, ends=False)
    kept = compiled.alloc_ends(action, addr)
    assert kept is not None and compiled.alloc_ends(action, addr)[0] is kept[0]  # type: ignore[index]
    fresh = compiled.alloc_ends(action.copy(), addr.copy())
    assert first is not None and fresh is not None
    assert first[0] is None and first[1] == kept[1] == fresh[1]
    assert kept[0].tolist() == fresh[0].tolist() and not kept[0].flags.writeable
    cut = (action[:400].copy(), addr[:400].copy())  # other columns: answered for themselves
    got = compiled.alloc_ends(*cut)
    assert got is not None and got[0].tolist() == _paired_by_address(*cut, 400)[1].tolist()
