"""The compiled pass of ``eventorder.check_event_order`` (``_replaycore.block_order``) against its reference.

The reference sorts a trace's block events by address and compares each with its neighbour; the
compiled pass keeps each address's last block event in a map, in trace order. Both must refuse the
same event with the same message, or both pass: on every fixture as it is, and on a seeded fuzz of
swaps, drops and repeats of their events (the mutants of ``test_event_order``), which reaches both
kinds of refusal (an action out of turn, and a free in another pool or stream than its alloc).
"""

from __future__ import annotations

import gzip
import itertools
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


def _pairing_reference(
    action: np.ndarray, addr: np.ndarray, size: np.ndarray
) -> tuple[list[int], list[int], list[int], bool, list[int], list[int]]:
    """alloc_pairing's answer from the references: the sort by address (``_paired_by_address``), the
    ranks counted over the events (``outline._end_ranks``), the live bytes of ``live_requested``'s
    bincount, and the alternation address by address."""
    from analysis.model import ALLOC, FREE_REQUESTED
    from analysis.stacks import Lifetimes
    from analysis.stages.outline import _end_ranks, live_requested

    n = action.shape[0]
    starts, ends = _paired_by_address(action, addr, n)
    zeros = np.zeros(starts.shape[0], np.int64)
    lifetimes = Lifetimes(starts, ends, zeros, size[starts], zeros.astype(np.int32), n)
    ranks = _end_ranks(lifetimes) if starts.size else zeros
    live = live_requested(lifetimes)
    after = live.after if live is not None else zeros
    kinds: dict[int, list[bool]] = {}
    for i in np.flatnonzero((action == ALLOC) | (action == FREE_REQUESTED)).tolist():
        kinds.setdefault(int(addr[i]), []).append(bool(action[i] == ALLOC))
    alternates = all(k[0] and all(x != y for x, y in itertools.pairwise(k)) for k in kinds.values())
    return starts.tolist(), ends.tolist(), ranks.tolist(), alternates, size[starts].tolist(), after.tolist()


def _kept_by_the_order_check(
    action: np.ndarray,
    addr: np.ndarray,
    size: np.ndarray,
    stream: np.ndarray,
    pools: np.ndarray,
    next_kind: np.ndarray,
    lanes: bool,
) -> tuple[list[int], list[int], list[int], bool, list[int], list[int]]:
    """The pairing the event-order pass keeps, held equal to alloc_pairing's own pass, with the sizes and
    without (the completeness check's: no bytes, the same pairs)."""
    from analysis.model import FREE_REQUESTED

    compiled._PAIRED.clear()
    assert compiled.first_block_out_of_order(action, addr, stream, pools, next_kind, lanes, size) == ()
    kept = compiled._remembered(action, addr, FREE_REQUESTED, size)
    assert kept is not None and not kept.starts.flags.writeable and not kept.after.flags.writeable
    assert compiled.alloc_pairing(action, addr, size=size) is kept  # read again, not paired again
    assert compiled.alloc_pairing(action, addr) is kept
    compiled._PAIRED.clear()
    alone = compiled.alloc_pairing(action, addr, size=size)
    assert alone is not None

    def columns(p: compiled.Pairing) -> tuple[list[int], list[int], list[int], bool, list[int], list[int]]:
        return p.starts.tolist(), p.ends.tolist(), p.ranks.tolist(), p.alternates, p.sizes.tolist(), p.after.tolist()

    got = columns(kept)
    assert got == columns(alone)
    compiled._PAIRED.clear()  # without the sizes: the pairs alone
    assert compiled.first_block_out_of_order(action, addr, stream, pools, next_kind, lanes) == ()
    bare = compiled.alloc_pairing(action, addr)
    assert bare is not None and bare.sizes is None and bare.after is None
    assert (bare.starts.tolist(), bare.ends.tolist(), bare.ranks.tolist(), bare.alternates) == got[:4]
    assert compiled.alloc_pairing(action, addr, size=size) is not bare  # asked with the sizes: paired with them
    return got


@pytest.mark.parametrize("name", FIXTURE_FILES)
def test_the_order_checks_pass_pairs_the_allocs_as_the_reference(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """block_order's pass pairs each alloc with its end, counts the allocs before it and sums the live bytes,
    as alloc_ends' own pass and the references do: the lifetimes and the completeness check read it, not a
    second pass."""
    monkeypatch.delenv(compiled.ENV_VAR, raising=False)
    for dev in _devices(FIXTURES / f"{name}.pickle.gz"):
        pools = _event_pools(dev)
        t = dev.trace
        lanes = len(dev.streams) > 1 or bool(pools.any())
        got = _kept_by_the_order_check(t.action, t.addr, t.size, t.stream, pools, _next_kind(t), lanes)
        assert got == _pairing_reference(t.action, t.addr, t.size), f"{name} device {dev.device}"


def test_the_order_checks_pairing_on_random_traces_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random traces in order (each address's alloc, free_requested, free_completed in turn, some started
    mid-lifetime as a wrapped ring is, some with one kind of free dropped, segment events between): the
    kept pairing equals the references, alternating or not."""
    from analysis.model import ALLOC, FREE_COMPLETED, FREE_REQUESTED, SEGMENT_ALLOC

    monkeypatch.delenv(compiled.ENV_VAR, raising=False)
    rng = np.random.default_rng(34)
    seen = set()
    for _ in range(300):
        kinds = [ALLOC, FREE_REQUESTED, FREE_COMPLETED]
        drop = int(rng.integers(0, 3))  # 1, 2: that free dropped (skip_actions)
        if drop:
            kinds.remove(drop)
        n_addr = int(rng.integers(1, 7))
        phase = {a: int(rng.integers(0, len(kinds))) for a in range(n_addr)}
        action, addr = [], []
        for _ in range(int(rng.integers(0, 60))):
            if rng.random() < 0.1:
                action.append(SEGMENT_ALLOC)
                addr.append(int(rng.integers(0, n_addr)) * 512)
                continue
            a = int(rng.integers(0, n_addr))
            action.append(kinds[phase[a] % len(kinds)])
            addr.append(a * 512)
            phase[a] += 1
        act, ad = np.array(action, np.int8), np.array(addr, np.int64)
        size = rng.integers(0, 1 << 40, act.shape[0]).astype(np.int64)
        zeros = np.zeros(act.shape[0], np.int32)
        nxt = np.full(3, -1, np.int8)
        for k, kind in enumerate(kinds):
            nxt[kind] = kinds[(k + 1) % len(kinds)]
        got = _kept_by_the_order_check(act, ad, size, zeros, zeros, nxt, False)
        assert got == _pairing_reference(act, ad, size)
        seen.add(got[3])
    assert seen == {True, False}


def test_the_address_map_grows_and_keeps_each_addresss_last_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of addresses (the map starts at 1024 slots and grows past half full): every address's
    lifetimes in order pass and pair as the references do, and a repeated free after the table grew is
    refused at the event the reference names."""
    from analysis.model import ALLOC, FREE_COMPLETED, FREE_REQUESTED

    monkeypatch.delenv(compiled.ENV_VAR, raising=False)
    rng = np.random.default_rng(36)
    n_addr = 3000
    cycle = [ALLOC, FREE_REQUESTED, FREE_COMPLETED]
    phase = np.zeros(n_addr, np.int64)
    action, addr = [], []
    for a in rng.integers(0, n_addr, 40000).tolist():
        action.append(cycle[phase[a] % 3])
        addr.append((a + 1) << 12)
        phase[a] += 1
    act, ad = np.array(action, np.int8), np.array(addr, np.int64)
    size = rng.integers(1, 1 << 30, act.shape[0]).astype(np.int64)
    zeros = np.zeros(act.shape[0], np.int32)
    nxt = np.array([FREE_REQUESTED, FREE_COMPLETED, ALLOC], np.int8)
    got = _kept_by_the_order_check(act, ad, size, zeros, zeros, nxt, False)
    assert got == _pairing_reference(act, ad, size)
    last = int(np.flatnonzero(ad == ad[0])[-1])  # the first address's last event, repeated at the end
    wrong_act, wrong_ad = np.r_[act, act[last]], np.r_[ad, ad[last]]
    z = np.zeros(wrong_act.shape[0], np.int32)
    n = act.shape[0]
    assert compiled.first_block_out_of_order(wrong_act, wrong_ad, z, z, nxt, False) == (n, last, True)
    # With lanes, the grown table keeps each address's last event too: a free on another stream than its
    # alloc's, both after the growth, is refused against that alloc.
    lane_act = np.r_[act, np.array([ALLOC, FREE_REQUESTED], np.int8)]
    lane_ad = np.r_[ad, np.array([(n_addr + 5) << 12] * 2, np.int64)]
    stream = np.zeros(lane_act.shape[0], np.int32)
    stream[-1] = 1
    pools = np.zeros(lane_act.shape[0], np.int32)
    assert compiled.first_block_out_of_order(lane_act, lane_ad, stream, pools, nxt, True) == (n + 1, n, False)
