"""Blocks, not only segments: the allocator model and the recorded replay, block by block.

The segment events and the reserved totals that test_allocator.py checks say nothing about how
a segment is cut into blocks: a split rule off by one (``>`` for ``>=``) leaves every segment
event the same. These tests compare block layouts:

- the policy model (analysis/allocator/policy.py, ``simulate``) at the end of every complete trace,
  under the recorded settings, against the snapshot's own final ``segments``;
- the recorded replay (analysis/allocator/recorded.py) at the end, against the final ``segments`` exactly,
  addresses included, and at each OOM against the figures of PyTorch's own OOM message;
- the model's inlined hot loop (``_Model.run``) against the same requests served through its
  methods (``get_free_block``, ``split``, ``free_block``), block by block at checkpoints, and
  each split decision against the one written rule, ``AllocatorConfig.should_split``;
- the rule itself at its boundaries, hand-computed.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Iterator
from functools import cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.allocator import cachestate, infer_limit, policy, simulate, trace_is_complete
from analysis.allocator import requests as request_codes
from analysis.allocator.cachemodel import _Model
from analysis.allocator.config import K_SMALL_SIZE, MB, AllocatorConfig
from analysis.allocator.recorded import recorded_replay
from analysis.model import (
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    INACTIVE,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    DeviceData,
    Snapshot,
)
from analysis.reader import read_snapshot
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = sorted(p.name.removesuffix(".truth.json") for p in FIXTURES.glob("*.truth.json"))
GiB, MiB = 1 << 30, 1 << 20
# The two fixtures that do not hold their whole history (a wrapped ring buffer, enabled="state").
PARTIAL = {"wrapped_ring", "state_only"}

# The model's block: [size, address, prev, next, state]; state True = free, False = allocated or
# pending, None = an unmapped range of an expandable reservation (allocator/cachestate.py, _SIZE.._STATE).
_SIZE, _ADDR, _PREV, _NEXT, _STATE = (
    cachestate._SIZE,
    cachestate._ADDR,
    cachestate._PREV,
    cachestate._NEXT,
    cachestate._STATE,
)


@cache
def snap(case: str) -> Snapshot:
    return read_snapshot(FIXTURES / f"{case}.pickle.gz")


@cache
def truth(case: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{case}.truth.json").read_text())
    return data


def recorded_config(s: Snapshot) -> AllocatorConfig:
    return AllocatorConfig.from_settings(s.settings.raw, s.settings.conf)


def device_cases() -> list[tuple[str, int]]:
    return [(c, d.device) for c in CASES for d in snap(c).devices if len(d.trace)]


COMPLETE = [(c, d) for c, d in device_cases() if c not in PARTIAL]


def test_complete_traces_are_all_but_the_two_partial_fixtures() -> None:
    # Guards the parametrisation: the set of complete traces is what the trace itself says, and a
    # fixture that stopped being complete (or a renamed one) cannot silently drop out.
    for case, device in device_cases():
        assert trace_is_complete(snap(case).device(device)) == (case not in PARTIAL), case
    assert len(COMPLETE) >= 21  # 20 single-device traces + the second GPU of two_gpu_pipeline


# --------------------------------------------------------------------------- layouts

Layout = tuple[tuple[int, int, str], ...]  # (offset in its segment, size, state) per block
SegmentKey = tuple[int, int, str, bool, Layout]  # pool, stream, small|large, expandable, blocks


def snapshot_segments(dev: DeviceData) -> list[SegmentKey]:
    """The snapshot's own final ``segments``, each as the segment-relative layout of its blocks."""
    out = []
    for seg in dev.segments:
        layout = tuple((b.address - seg.address, b.size, b.state) for b in seg.blocks)
        out.append((seg.pool, seg.stream, seg.segment_type, seg.is_expandable, layout))
    return sorted(out)


class _Spy(_Model):
    """The model as ``simulate`` builds it, kept for inspection, with each new segment's free list."""

    last: _Spy | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.args, self.kwargs = args, kwargs
        self.segment_lk: dict[int, int] = {}  # id(first block of a cudaMalloc'd segment) -> free list
        self.requests: tuple[Any, ...] = ()
        _Spy.last = self

    def alloc_block(self, lk: int, size: int, alloc_size: int) -> list[Any] | None:
        b = super().alloc_block(lk, size, alloc_size)
        if b is not None and not self.exp:
            self.segment_lk[id(b)] = lk
        return b

    def run(self, events: Any, ops: list[int], raddrs: list[int], sizes: list[int], lks: list[int]) -> list[int]:
        # As Python ints: simulate hands the compiled engine int64 columns.
        columns = [x.tolist() if isinstance(x, np.ndarray) else x for x in (ops, raddrs, sizes, lks)]
        self.requests = ([int(events[k]) for k in range(len(ops))], *columns)
        failed = super().run(events, ops, raddrs, sizes, lks)
        # The compiled engine makes its segments without calling alloc_block: their heads say the same.
        self.segment_lk.update({id(head): lk for head, lk in self.heads.values() if head[_PREV] is None})
        return failed


def _chain(head: list[Any]) -> Iterator[list[Any]]:
    b: list[Any] | None = head
    while b is not None:
        yield b
        b = b[_NEXT]


def model_segments(m: _Model, segment_lk: dict[int, int]) -> list[SegmentKey]:
    """The model's live segments in the snapshot's terms: cudaMalloc'd segments whole, and each
    contiguous mapped range of an expandable reservation as one segment (as torch reports them)."""
    allocated = {id(b) for b in m.amap.values()}
    pending = {id(b) for b, _lk in m.pend.values()}

    def state(b: list[Any]) -> str:
        if b[_STATE]:
            return INACTIVE
        if id(b) in pending:
            return ACTIVE_PENDING_FREE
        assert id(b) in allocated, "a block that is neither free, pending nor allocated"
        return ACTIVE_ALLOCATED

    ns = m.ns
    heads: dict[int, tuple[list[Any], int]] = {}
    for lk, blocks in enumerate(m.blks):
        for b in blocks:
            heads.setdefault(id(_head(b)), (_head(b), lk))
    for lk, blocks in enumerate(m.ublks):
        for b in blocks:
            heads.setdefault(id(_head(b)), (_head(b), lk))
    for b in [*m.amap.values(), *(b for b, _lk in m.pend.values())]:
        h = _head(b)
        if id(h) not in heads:
            heads[id(h)] = (h, segment_lk[id(h)])
    out: list[SegmentKey] = []
    for head, lk in heads.values():
        pool, large, stream = lk // ns // 2, (lk // ns) & 1, lk % ns
        kind = "large" if large else "small"
        run: list[list[Any]] = []
        for b in [*_chain(head), None]:
            if b is not None and b[_STATE] is not None:
                run.append(b)
                continue
            if run:  # a cudaMalloc'd segment, or one mapped range of a reservation
                base = run[0][_ADDR]
                layout = tuple((x[_ADDR] - base, x[_SIZE], state(x)) for x in run)
                out.append((pool, stream, kind, m.exp, layout))
                run = []
    return sorted(out)


def _head(b: list[Any]) -> list[Any]:
    while b[_PREV] is not None:
        b = b[_PREV]
    return b


def simulate_recorded(case: str, device: int) -> tuple[_Spy, Any]:
    s = snap(case)
    dev = s.device(device)
    cfg = recorded_config(s)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(policy, "_Model", _Spy)
        result = simulate(s, dev, cfg, infer_limit(s, dev, cfg).value)
    model = _Spy.last
    assert model is not None
    return model, result


# Equal-size best-fit ties: gpu_side_stream, event 609, a 25,763,840 B request found three free
# 35,651,584 B blocks; the C++ best fit breaks the tie by address. The model used to break it by its own
# bump-pointer addresses (this test caught it, xfail strict); since the model takes the recorded
# cudaMalloc addresses while its segment events match the trace's, it breaks the tie as torch does and
# the layout matches. A trace that needs a tie listed here is marked xfail(strict) again.
ADDRESS_TIES: set[tuple[str, int]] = set()
LAYOUT_CASES = [
    pytest.param(
        c,
        d,
        marks=pytest.mark.xfail(strict=True, reason="equal-size best-fit tie broken by simulated addresses"),
    )
    if (c, d) in ADDRESS_TIES
    else (c, d)
    for c, d in COMPLETE
]


@pytest.mark.parametrize(("case", "device"), LAYOUT_CASES)
def test_model_block_layout_at_the_end_equals_the_snapshots_segments(case: str, device: int) -> None:
    """Every block of every segment at the end of the trace: its offset in its segment, size and
    state, under the recorded settings and the inferred limit (as ``replay_check`` runs it).

    The model allocates its own addresses (a bump pointer for cudaMalloc'd segments, fixed strides
    for expandable reservations: the driver's placement is not in the requests), so addresses are
    compared relative to their segment, and segments as a multiset keyed by (pool, stream, pool
    kind, expandable, blocks): the driver's address order of segments is not the model's either.
    Within a segment, offsets are real: a split at the wrong boundary moves every later block.
    """
    s = snap(case)
    dev = s.device(device)
    model, result = simulate_recorded(case, device)
    # The model failed exactly the recorded OOM requests, so no served-OOM block is left untracked.
    assert result.ooms == [int(i) for i in (dev.trace.action == OOM).nonzero()[0]]
    want = snapshot_segments(dev)
    got = model_segments(model, model.segment_lk)
    assert len(got) == len(want)
    assert sum(sum(b[1] for b in seg[4]) for seg in got) == sum(seg.total_size for seg in dev.segments)
    assert got == want


# --------------------------------------------------------------------------- the recorded replay


def state_segments(state: Any) -> list[tuple[int, int, int, int, str, bool, tuple[tuple[int, int, str], ...]]]:
    return sorted(
        (
            seg.address,
            seg.total_size,
            seg.pool,
            seg.stream,
            seg.segment_type,
            seg.is_expandable,
            tuple((b.address, b.size, b.state) for b in seg.blocks),
        )
        for seg in state.segments
    )


@pytest.mark.parametrize(("case", "device"), COMPLETE)
def test_recorded_replay_end_state_equals_the_final_segments_with_addresses(case: str, device: int) -> None:
    s = snap(case)
    dev = s.device(device)
    rep = recorded_replay(s, dev)
    assert not rep.warnings, rep.warnings
    assert state_segments(rep.blocks_at(len(dev.trace) - 1)) == state_segments(dev)


def _gib(text: str, pattern: str) -> float:
    m = re.search(pattern, text)
    assert m, pattern
    return float(m.group(1)) * {"GiB": GiB, "MiB": MiB, "KiB": 1024}[m.group(2)]


OOM_CASES = sorted(c for c in CASES if truth(c).get("oom_message") and c not in PARTIAL)


def test_oom_cases_are_the_recorded_ooms() -> None:
    assert OOM_CASES == [
        "frag_oom",
        "gpt_varlen_expandable",
        "gpt_varlen_maxsplit256",
        "gpt_varlen_oom",
        "gpu_client_oom",
        "gpu_expandable_oom",
        "gpu_grow_oom",
        "gpu_maxsplit_oom",
        "grow_gpt2_default",
        "grow_resnet_default",
    ]


@pytest.mark.parametrize("case", OOM_CASES)
def test_oom_free_blocks_named_by_the_report_are_those_of_the_rebuilt_state(case: str) -> None:
    """The report's OOM figures, summed block by block from the replay's state at that event, and
    checked against PyTorch's own message (two decimals: 0.005 GiB / MiB of rounding)."""
    s = snap(case)
    dev = s.devices[0]
    oom = build_report(FIXTURES / f"{case}.pickle.gz", jobs=1)["devices"][0]["oom"]
    state = recorded_replay(s, dev).blocks_at(oom["event_index"])
    free = [b.size for seg in state.segments for b in seg.blocks if b.state == INACTIVE]
    live = [b.size for seg in state.segments for b in seg.blocks if b.state != INACTIVE]
    reserved = sum(seg.total_size for seg in state.segments)
    assert oom["largest_free_block_bytes"] == max(free, default=0)
    assert oom["cached_free_bytes"] == sum(free)
    assert oom["allocated_bytes"] == sum(live)
    assert oom["reserved_bytes"] == reserved
    text = truth(case)["oom_message"]
    unit = r"(GiB|MiB|KiB)"
    assert sum(live) == pytest.approx(_gib(text, rf"([\d.]+) {unit} is allocated by PyTorch"), abs=0.005 * GiB)
    unallocated = _gib(text, rf"([\d.]+) {unit} is reserved by PyTorch but unallocated")
    # Reserved but unallocated is every free byte of the cache (pending frees count as allocated).
    assert reserved - sum(live) == pytest.approx(unallocated, abs=0.005 * (GiB if unallocated >= GiB else MiB))


def reference_replay(dev: DeviceData, cfg: AllocatorConfig, keep: set[int]) -> dict[int, list[Any]]:
    """The recorded replay written plainly, with the rules called where replay.py inlines them:
    ``round_size`` and ``should_split`` on each alloc, merging with free neighbours of the same
    segment on each completed free. cudaMalloc'd segments only (no map/unmap). Returns the state
    (segment address, size, blocks) after each event index in ``keep``."""
    t = dev.trace
    segs: dict[int, int] = {}  # segment start -> size
    free: dict[int, int] = {}  # free block start -> size
    free_end: dict[int, int] = {}  # free block end -> start
    used: dict[int, list[Any]] = {}  # block start -> [size, pending]
    out: dict[int, list[Any]] = {}

    def add_free(start: int, size: int) -> None:
        free[start] = size
        free_end[start + size] = start

    def take_free(start: int) -> int:
        size = free.pop(start)
        del free_end[start + size]
        return size

    for i, (a, ad, sz) in enumerate(zip(t.action.tolist(), t.addr.tolist(), t.size.tolist(), strict=True)):
        if a == ALLOC:
            f = take_free(ad)
            r = cfg.round_size(sz)
            if cfg.should_split(f, r, r <= K_SMALL_SIZE):
                add_free(ad + r, f - r)
                used[ad] = [r, False]
            else:
                used[ad] = [f, False]
        elif a == FREE_REQUESTED:
            used[ad][1] = True
        elif a == FREE_COMPLETED:
            start, end = ad, ad + used.pop(ad)[0]
            if end in free and end not in segs:  # the free block after, in the same segment
                end += take_free(end)
            if ad in free_end and ad not in segs:  # the free block before
                start = free_end[ad]
                take_free(start)
            add_free(start, end - start)
        elif a == SEGMENT_ALLOC:
            segs[ad] = sz
            add_free(ad, sz)
        elif a == SEGMENT_FREE:
            del segs[ad]
            take_free(ad)
        if i in keep:
            rows = []
            for start, size in segs.items():
                blocks = []
                b = start
                while b < start + size:
                    if b in free:
                        blocks.append((b, free[b], INACTIVE))
                        b += free[b]
                    else:
                        bs, pending = used[b]
                        blocks.append((b, bs, ACTIVE_PENDING_FREE if pending else ACTIVE_ALLOCATED))
                        b += bs
                rows.append((start, size, tuple(blocks)))
            out[i] = sorted(rows)
    return out


def replay_rows(state: Any) -> list[Any]:
    return sorted(
        (seg.address, seg.total_size, tuple((b.address, b.size, b.state) for b in seg.blocks)) for seg in state.segments
    )


# Complete traces of cudaMalloc'd segments (the reference does not map or unmap).
PLAIN = [
    (c, d)
    for c, d in COMPLETE
    if not recorded_config(snap(c)).expandable_segments
    and not np.isin(snap(c).device(d).trace.action, [SEGMENT_MAP, SEGMENT_UNMAP]).any()
]


@pytest.mark.parametrize(("case", "device"), PLAIN)
def test_recorded_replay_inlined_split_and_merge_equal_the_called_rules(case: str, device: int) -> None:
    s = snap(case)
    dev = s.device(device)
    n = len(dev.trace)
    keep = {n * k // 16 for k in range(1, 16)} | {n - 1}
    rep = recorded_replay(s, dev, keep_at=keep)
    want = reference_replay(dev, recorded_config(s), keep)
    for k in sorted(keep):
        assert replay_rows(rep.blocks_at(k)) == want[k], f"state after event {k}"


# --------------------------------------------------------------------------- inlined vs called


def _reference_run(
    m: _Model,
    events: list[int],
    ops: list[int],
    raddrs: list[int],
    sizes: list[int],
    lks: list[int],
    log: list[tuple[int, int, bool]],
) -> list[int]:
    """``_Model.run`` with every inlined rule replaced by the method that holds it.

    Each split decision is also checked against ``AllocatorConfig.should_split`` and each best fit
    against ``AllocatorConfig.block_fits`` (the rules as written once); ``log`` gets (block size,
    request size, small pool) per split decision.
    """
    failed: list[int] = []
    cfg = m.cfg
    for k, op, ra, rs, lk in zip(range(len(ops)), ops, raddrs, sizes, lks, strict=True):
        if op == request_codes._OP_FREE:
            b = m.amap.pop(ra, None)
            if b is not None:
                m.free_block(lk, b)
        elif op in (request_codes._OP_ALLOC, request_codes._OP_OOM):
            m.cur = events[k]
            kl = m.keys[lk]
            i = bisect_left(kl, rs << cachestate._SH)
            best = kl[i] >> cachestate._SH if i < len(kl) else None  # the best fit by size
            b = m.get_free_block(lk, rs)
            if best is not None and not m.exp:  # (the expandable walk may pick a later block)
                # get_free_block's max_split_size filter is the rule AllocatorConfig.block_fits.
                assert (b is not None) == cfg.block_fits(best, rs), (best, rs)
            if b is None:
                b = m.miss(lk, rs, cfg.allocation_size(rs))
            if b is None:
                failed.append(events[k])
                continue
            block_size, small = b[_SIZE], rs <= K_SMALL_SIZE
            handed = m.split(lk, b, rs)
            log.append((block_size, rs, small))
            assert (handed == rs < block_size) == cfg.should_split(block_size, rs, small), (block_size, rs, small)
            if op == request_codes._OP_ALLOC:
                m.amap[ra] = b
        elif op == request_codes._OP_FREE_REQ:
            b = m.amap.pop(ra, None)
            if b is not None:
                m.pend[b[_ADDR]] = (b, lk)
                m.pmap[ra] = b
        elif op == request_codes._OP_FREE_DONE:
            b = m.pmap.pop(ra, None)
            if b is not None and m.pend.pop(b[_ADDR], None) is not None:
                m.free_block(lk, b)
        elif op == request_codes._OP_FLUSH:
            m.cur = events[k]
            m.release_cached(ra)
    return failed


def _exact_layout(m: _Model) -> list[tuple[int, ...]]:
    """Every block the model holds, with its simulated address: (address, size, state, segment start)."""
    seen: dict[int, list[Any]] = {}
    for blocks in [*m.blks, *m.ublks, list(m.amap.values()), [b for b, _ in m.pend.values()]]:
        for b in blocks:
            seen.setdefault(id(_head(b)), _head(b))
    code = {True: 1, False: 0, None: 2}
    return sorted((h[_ADDR], b[_ADDR], b[_SIZE], code[b[_STATE]]) for h in seen.values() for b in _chain(h))


def compare_inline_and_called(model: _Spy, checkpoints: int = 12) -> list[tuple[int, int, bool]]:
    """Serve ``model``'s recorded request stream twice, by ``_Model.run`` and by the reference,
    and compare the two block by block after each of ``checkpoints`` chunks. Returns the split log."""
    events, ops, raddrs, sizes, lks = model.requests
    fast = _Model(*model.args, **model.kwargs)
    slow = _Model(*model.args, **model.kwargs)
    n = len(ops)
    cuts = sorted({n * i // checkpoints for i in range(checkpoints + 1)})
    log: list[tuple[int, int, bool]] = []
    for lo, hi in pairwise(cuts):
        chunk = (events[lo:hi], ops[lo:hi], raddrs[lo:hi], sizes[lo:hi], lks[lo:hi])
        failed_fast = fast.run(*chunk)
        failed_slow = _reference_run(slow, *chunk, log)
        assert failed_fast == failed_slow, (lo, hi)
        assert fast.reserved == slow.reserved and fast.peak == slow.peak, (lo, hi)
        assert fast.seg_size == slow.seg_size and fast.seg_act == slow.seg_act, (lo, hi)
        assert _exact_layout(fast) == _exact_layout(slow), f"block layouts differ after request {hi}"
    return log


# The requests of these runs cover the default path (frag_oom, gpt_varlen_oom: cudaMalloc'd
# segments, flushes, OOMs), max_split_size, expandable segments, GC under a cap, side streams
# with pending frees, and graph pools.
INLINE_CASES = [
    ("frag_oom", ""),
    ("gpt_varlen_oom", ""),
    ("gpt_varlen_oom", "max_split_size_mb:256"),
    ("gpt_varlen_oom", "expandable_segments:True"),
    ("gpt_varlen_maxsplit256", ""),
    ("gpt_varlen_expandable", ""),
    ("gpu_gc_threshold", ""),
    ("gpu_side_stream", ""),
    ("gpu_cuda_graph", ""),
    ("gpu_expandable_maxsplit", ""),
    ("infer_varbatch", ""),
]


@pytest.mark.parametrize(("case", "conf"), INLINE_CASES)
def test_inlined_hot_loop_equals_the_methods_block_by_block(case: str, conf: str) -> None:
    s = snap(case)
    dev = s.devices[0]
    cfg = AllocatorConfig.parse(conf, base=recorded_config(s)) if conf else recorded_config(s)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(policy, "_Model", _Spy)
        simulate(s, dev, cfg, infer_limit(s, dev, recorded_config(s)).value)
    assert _Spy.last is not None
    log = compare_inline_and_called(_Spy.last)
    assert log  # requests were served


def test_fixture_requests_meet_the_large_pool_split_boundary() -> None:
    # A best fit whose remainder is exactly 1 MiB (not split) must occur in the real requests, else
    # the comparison above could not tell ">" from ">=" there.
    s = snap("gpt_varlen_oom")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(policy, "_Model", _Spy)
        simulate(s, s.devices[0], recorded_config(s), infer_limit(s, s.devices[0]).value)
    assert _Spy.last is not None
    log = compare_inline_and_called(_Spy.last, checkpoints=2)
    assert any(not small and block - size == K_SMALL_SIZE for block, size, small in log)


def _synthetic(
    requests: list[tuple[Any, ...]],
    conf: str = "",
    limit: int | None = None,
    pools: int = 1,
    freeable: dict[int, int] | None = None,
    streams: int = 1,
) -> _Spy:
    """A model fed a hand-written request stream, in the model's own encoding (rounded sizes,
    free-list index ``(pool * 2 + large) * streams + stream``), one stream. A request is
    ("alloc", handle, size[, pool[, stream]]), ("free", handle, 0) or ("flush", upto, 0): a user
    ``empty_cache()`` that may release private pools the trace released by event ``upto``;
    ``freeable`` maps a private pool to the first event showing it released."""
    cfg = AllocatorConfig.parse(conf)
    events, ops, raddrs, sizes, lks = [], [], [], [], []
    lane: dict[int, int] = {}
    for k, (op, handle, size, *where) in enumerate(requests):
        events.append(k)
        raddrs.append(handle)
        if op == "alloc":
            rounded = cfg.round_size(size)
            pool, stream = (*where, 0, 0)[:2]
            lane[handle] = (pool * 2 + int(rounded > K_SMALL_SIZE)) * streams + stream
            ops.append(request_codes._OP_ALLOC)
            sizes.append(rounded)
            lks.append(lane[handle])
        elif op == "free":
            ops.append(request_codes._OP_FREE)
            sizes.append(0)
            lks.append(lane[handle])
        else:
            ops.append(request_codes._OP_FLUSH)
            sizes.append(0)
            lks.append(0)
    m = _Spy(cfg, limit, pools, list(range(streams)), dict(freeable or {}))
    m.requests = (events, ops, raddrs, sizes, lks)
    return m


def _gc_round_requests(s4: int) -> list[tuple[str, int, int]]:
    """The requests of the GC-round streams below: segments S1, S2 of 14 MiB, S3 of 16 MiB and S4
    of ``s4`` made and freed, S1 reused, then two 20 MiB requests (each stream's arithmetic is
    in its comment)."""
    return [
        ("alloc", 1, 14 * MiB),
        ("alloc", 2, 14 * MiB),
        ("free", 1, 0),
        ("free", 2, 0),
        ("alloc", 3, 16 * MiB),
        ("alloc", 4, s4),
        ("free", 4, 0),
        ("free", 3, 0),
        ("alloc", 5, 14 * MiB),
        ("free", 5, 0),
        ("alloc", 6, 20 * MiB),
        ("alloc", 7, 20 * MiB),
    ]


A, F = ACTIVE_ALLOCATED, INACTIVE
# Each stream puts one split decision exactly on a boundary. Expected: the final segments as
# (pool, stream, kind, expandable, ((offset, size, state), ...)), hand-computed in the comment.
BOUNDARY_STREAMS: dict[str, tuple[Any, ...]] = {  # requests, conf, expected segments[, options]
    # Small pool (<= 1 MiB), 2 MiB segments. 1 MiB leaves 1 MiB: split. 1 MiB - 512 takes that
    # free 1 MiB and leaves exactly 512 B: split (>= 512). The last 512 B request takes it: still
    # one segment. (Splitting only on > 512 would need a second segment for it.)
    "small-remainder-512": (
        [("alloc", 1, MiB), ("alloc", 2, MiB - 512), ("alloc", 3, 512)],
        "",
        [(0, 0, "small", False, ((0, MiB, A), (MiB, MiB - 512, A), (2 * MiB - 512, 512, A)))],
    ),
    # Large pool. 19 MiB (>= 10 MiB) gets a segment rounded up to 2 MiB: 20 MiB; the remainder is
    # exactly 1 MiB, not above 1 MiB: no split, the block is the whole 20 MiB. 1 MiB + 512 (< 10 MiB)
    # then gets a 20 MiB segment of its own and leaves 19 MiB - 512, split off free.
    "large-remainder-1MiB": (
        [("alloc", 1, 19 * MiB), ("alloc", 2, MiB + 512)],
        "",
        sorted(
            [
                (0, 0, "large", False, ((0, 20 * MiB, A),)),
                (0, 0, "large", False, ((0, MiB + 512, A), (MiB + 512, 19 * MiB - 512, F))),
            ]
        ),
    ),
    # 19 MiB - 512: same 20 MiB segment, remainder 1 MiB + 512 > 1 MiB: split; the next request of
    # 1 MiB + 512 fits the remainder exactly: one segment, no free byte.
    "large-remainder-1MiB+512": (
        [("alloc", 1, 19 * MiB - 512), ("alloc", 2, MiB + 512)],
        "",
        [(0, 0, "large", False, ((0, 19 * MiB - 512, A), (19 * MiB - 512, MiB + 512, A)))],
    ),
    # max_split_size 256 MiB: a 270 MiB segment, freed; 256 MiB is not below max_split_size, and
    # 270 < 256 + 20 (max_non_split_rounding) lets it take the oversize block, unsplit (270 MiB).
    # 40 MiB then needs its own segment.
    "request-equal-to-max-split": (
        [("alloc", 1, 270 * MiB), ("free", 1, 0), ("alloc", 2, 256 * MiB), ("alloc", 3, 40 * MiB)],
        "max_split_size_mb:256",
        sorted([(0, 0, "large", False, ((0, 270 * MiB, A),)), (0, 0, "large", False, ((0, 40 * MiB, A),))]),
    ),
    # Expandable segments: one 20 MiB page is mapped for 20 MiB - 512, and a remainder of 512 B
    # splits in the large pool too (>= 512).
    "expandable-large-remainder-512": (
        [("alloc", 1, 20 * MiB - 512)],
        "expandable_segments:True",
        [(0, 0, "large", True, ((0, 20 * MiB - 512, A), (20 * MiB - 512, 512, F)))],
    ),
    # max_split_size 256 MiB under a 1000 MiB limit: segments of 300, 300 and 280 MiB, all freed
    # (880 MiB cached). 600 MiB fits no block; a new segment would reach 1480 > 1000, so
    # release_available_cached_blocks frees the largest oversize blocks until 600 MiB: the two of
    # 300 MiB, exactly enough, and keeps the 280 MiB one. 280 + 600 = 880 <= 1000: a 600 MiB segment.
    "release-available-exactly-enough": (
        [
            ("alloc", 1, 300 * MiB),
            ("alloc", 2, 300 * MiB),
            ("alloc", 3, 280 * MiB),
            ("free", 1, 0),
            ("free", 2, 0),
            ("free", 3, 0),
            ("alloc", 4, 600 * MiB),
        ],
        "max_split_size_mb:256",
        sorted([(0, 0, "large", False, ((0, 280 * MiB, F),)), (0, 0, "large", False, ((0, 600 * MiB, A),))]),
        {"limit": 1000 * MiB, "flushes": 0},
    ),
    # The same with 850 MiB and a 256 MiB third segment: 300 + 300 is not enough, so the walk goes
    # on to the smallest oversize block, 256 MiB (exactly max_split_size still counts): 856 >= 850,
    # all three go, and no full flush (release_cached_blocks) is needed.
    "release-available-down-to-the-smallest": (
        [
            ("alloc", 1, 300 * MiB),
            ("alloc", 2, 300 * MiB),
            ("alloc", 3, 256 * MiB),
            ("free", 1, 0),
            ("free", 2, 0),
            ("free", 3, 0),
            ("alloc", 4, 850 * MiB),
        ],
        "max_split_size_mb:256",
        [(0, 0, "large", False, ((0, 850 * MiB, A),))],
        {"limit": 1000 * MiB, "flushes": 0},
    ),
    # A flush releases the small pool too: under a 30 MiB limit, a cached 2 MiB small segment and
    # a cached 20 MiB large one (22 MiB); 28 MiB fits neither, 22 + 28 > 30: flush both, then the
    # 28 MiB segment alone. (Keeping the small one would also fit, 2 + 28 = 30: the layout tells.)
    "flush-releases-small-and-large": (
        [("alloc", 1, 512 * 1024), ("free", 1, 0), ("alloc", 2, 20 * MiB), ("free", 2, 0), ("alloc", 3, 28 * MiB)],
        "",
        [(0, 0, "large", False, ((0, 28 * MiB, A),))],
        {"limit": 30 * MiB, "flushes": 1},
    ),
    # Private pool 1 (a CUDA graph's): a cached 20 MiB segment in it and one in the default pool.
    # A user empty_cache at request 4 releases the default pool's, and pool 1's only if the trace
    # showed pool 1 released by then: at event 4 (<= 4) yes, at event 10 not yet.
    # (Both of pool 1's free lists go: a small 2 MiB segment too.)
    "flush-releases-a-private-pool-from-its-release-on": (
        [
            ("alloc", 1, 20 * MiB, 1),
            ("free", 1, 0),
            ("alloc", 2, 20 * MiB),
            ("free", 2, 0),
            ("alloc", 3, 512 * 1024, 1),
            ("free", 3, 0),
            ("flush", 4, 0),
        ],
        "",
        [],
        {"pools": 2, "freeable": {1: 4}, "flushes": 1},
    ),
    # The flush of a cache miss releases a private pool too once the trace showed it released by the
    # failing request: pool 1's cached 20 MiB (released from event 0 on), then 20 MiB of the default
    # pool under a 30 MiB limit at event 2: 20 + 20 > 30, flush; 0 <= 2, so pool 1's segment goes and
    # the new one fits.
    "miss-flush-releases-a-private-pool-released-by-then": (
        [("alloc", 1, 20 * MiB, 1), ("free", 1, 0), ("alloc", 2, 20 * MiB)],
        "",
        [(0, 0, "large", False, ((0, 20 * MiB, A),))],
        {"limit": 30 * MiB, "pools": 2, "freeable": {1: 0}, "flushes": 1},
    ),
    # The same with pool 1 released only from event 5 on: at event 2 it is kept, and the request fails.
    "miss-flush-keeps-a-private-pool-released-later": (
        [("alloc", 1, 20 * MiB, 1), ("free", 1, 0), ("alloc", 2, 20 * MiB)],
        "",
        [(1, 0, "large", False, ((0, 20 * MiB, F),))],
        {"limit": 30 * MiB, "pools": 2, "freeable": {1: 5}, "flushes": 1, "failed": [2]},
    ),
    # Two streams: stream 0 has no cached block, stream 1 a 20 MiB segment; the flush walks every
    # stream's free list of the pool and releases it.
    "flush-releases-every-stream": (
        [("alloc", 1, 20 * MiB, 0, 1), ("free", 1, 0), ("flush", 2, 0)],
        "",
        [],
        {"streams": 2, "flushes": 1},
    ),
    "flush-keeps-a-private-pool-not-yet-released": (
        [("alloc", 1, 20 * MiB, 1), ("free", 1, 0), ("alloc", 2, 20 * MiB), ("free", 2, 0), ("flush", 4, 0)],
        "",
        [(1, 0, "large", False, ((0, 20 * MiB, F),))],
        {"pools": 2, "freeable": {1: 10}, "flushes": 1},
    ),
    # garbage_collection_threshold 0.5 under a 100 MiB limit: the GC starts above 50 MiB. Ages count
    # get_free_block calls (one per request here). Segments S1, S2 of 14 MiB (requests 1, 2), freed
    # at age-clock 2; S3 16 MiB and S4 24 MiB (clock 3, 4), freed at 4; request 9 (14 MiB) reuses
    # S1, freed again at 5; request 11 (20 MiB) splits S4 (20 + 4 free). Request 12 (20 MiB, clock
    # 7) fits nothing: reserved 68 MiB > 50, target 18 MiB. Unsplit free segments: S1 age 2, S2
    # age 5, S3 age 3 (S4 is split: not a candidate). Round 1: mean 10/3 = 3.33 frees S2 (14 MiB,
    # short of 18). Round 2: mean of the two left, 5/2 = 2.5, frees S3 (age 3) and keeps S1 (age 2):
    # 30 MiB reclaimed. Then 38 + 20 <= 100: a 20 MiB segment.
    "gc-second-round-uses-the-remaining-mean": (
        _gc_round_requests(24 * MiB),
        "garbage_collection_threshold:0.5",
        sorted(
            [
                (0, 0, "large", False, ((0, 14 * MiB, F),)),
                (0, 0, "large", False, ((0, 20 * MiB, A), (20 * MiB, 4 * MiB, F))),
                (0, 0, "large", False, ((0, 20 * MiB, A),)),
            ]
        ),
        {"limit": 100 * MiB},
    ),
    # The same with S4 of 20 MiB: request 11 takes S4 whole, reserved is 64 MiB, the target 14 MiB.
    # Round 1 (mean 3.33) frees S2, exactly 14 MiB: the target is met and the GC stops there,
    # keeping S1 and S3. 50 + 20 <= 100: a new 20 MiB segment.
    "gc-stops-at-exactly-the-target": (
        _gc_round_requests(20 * MiB),
        "garbage_collection_threshold:0.5",
        sorted(
            [
                (0, 0, "large", False, ((0, 14 * MiB, F),)),
                (0, 0, "large", False, ((0, 16 * MiB, F),)),
                (0, 0, "large", False, ((0, 20 * MiB, A),)),
                (0, 0, "large", False, ((0, 20 * MiB, A),)),
            ]
        ),
        {"limit": 100 * MiB},
    ),
    # The same under a limit of 100 MiB - 2 B: the threshold is int(0.5 x (100 MiB - 2)) = 50 MiB - 1,
    # the target 64 MiB - (50 MiB - 1) = 14 MiB + 1 B. Round 1 frees S2, 14 MiB: one byte short, so
    # round 2 runs (mean 5/2 = 2.5) and frees S3 (age 3), keeping S1 (age 2): 30 MiB reclaimed.
    # 34 + 20 <= the limit: a new 20 MiB segment.
    "gc-target-one-byte-past-the-first-round": (
        _gc_round_requests(20 * MiB),
        "garbage_collection_threshold:0.5",
        sorted(
            [
                (0, 0, "large", False, ((0, 14 * MiB, F),)),
                (0, 0, "large", False, ((0, 20 * MiB, A),)),
                (0, 0, "large", False, ((0, 20 * MiB, A),)),
            ]
        ),
        {"limit": 100 * MiB - 2},
    ),
    # Two free blocks of one size: the best fit breaks the tie by address (torch's BlockComparatorSize:
    # stream, size, address), and the driver places a new segment below the earlier ones (the placement
    # learned from the captures, docs/allocator.md), so the block of the *later* segment, at the lower
    # address, wins. 5 MiB gets a 20 MiB segment S1 (5 A + 15 F), 15 MiB takes the 15 F whole; 2 MiB a
    # second 20 MiB segment S2 below it (2 A + 18 F), 3 MiB splits the 18 F (3 A + 15 F); freeing the first
    # 15 MiB leaves a free 15 MiB in each segment. The last 15 MiB takes S2's: S2 full, S1 keeps its 15 F.
    # (Under the old bump pointer S1 had the lower address and its block won.)
    "equal-size-tie-goes-to-the-lower-address": (
        [
            ("alloc", 1, 5 * MiB),
            ("alloc", 2, 15 * MiB),
            ("alloc", 3, 2 * MiB),
            ("alloc", 4, 3 * MiB),
            ("free", 2, 0),
            ("alloc", 5, 15 * MiB),
        ],
        "",
        [
            (0, 0, "large", False, ((0, 2 * MiB, A), (2 * MiB, 3 * MiB, A), (5 * MiB, 15 * MiB, A))),
            (0, 0, "large", False, ((0, 5 * MiB, A), (5 * MiB, 15 * MiB, F))),
        ],
    ),
    # The GC's age clock counts get_free_block calls on the default large pool, whatever the stream
    # (torch: ``++pool.get_free_blocks_call_count`` on large_blocks, one BlockPool for every stream).
    # "gc-second-round-uses-the-remaining-mean" with every request on stream 1 of two: the same
    # ages, the same two rounds, the same blocks (on stream 1). A clock that counted stream 0 only
    # would leave every age 0: round 1 (mean 0) would free S1, S2 and S3 alike.
    "gc-ages-count-large-requests-on-a-second-stream": (
        [
            ("alloc", 1, 14 * MiB, 0, 1),
            ("alloc", 2, 14 * MiB, 0, 1),
            ("free", 1, 0),
            ("free", 2, 0),
            ("alloc", 3, 16 * MiB, 0, 1),
            ("alloc", 4, 24 * MiB, 0, 1),
            ("free", 4, 0),
            ("free", 3, 0),
            ("alloc", 5, 14 * MiB, 0, 1),
            ("free", 5, 0),
            ("alloc", 6, 20 * MiB, 0, 1),
            ("alloc", 7, 20 * MiB, 0, 1),
        ],
        "garbage_collection_threshold:0.5",
        sorted(
            [
                (0, 1, "large", False, ((0, 14 * MiB, F),)),
                (0, 1, "large", False, ((0, 20 * MiB, A), (20 * MiB, 4 * MiB, F))),
                (0, 1, "large", False, ((0, 20 * MiB, A),)),
            ]
        ),
        {"limit": 100 * MiB, "streams": 2},
    ),
    # A request into a private pool (a graph capture is underway) never flushes the cache: under a
    # 21 MiB limit a cached 20 MiB segment of the default pool, then 512 KiB in pool 1 (its small
    # list: free-list index 2, the first past the default pool's two) needs a 2 MiB segment:
    # 20 + 2 = 22 > 21, refused, and no release_cached_blocks: the request fails, the 20 MiB stays.
    # (Flushing would release it and fit the 2 MiB segment.)
    "private-pool-small-request-does-not-flush": (
        [("alloc", 1, 20 * MiB), ("free", 1, 0), ("alloc", 2, 512 * 1024, 1)],
        "",
        [(0, 0, "large", False, ((0, 20 * MiB, F),))],
        {"limit": 21 * MiB, "pools": 2, "flushes": 0, "failed": [2]},
    ),
    # The same on stream 1 of two (a cached 20 MiB segment of the default pool on stream 1): pool
    # 1's small list on stream 1 is free-list index (1 x 2 + 0) x 2 + 1 = 5, a private pool: the
    # request fails, no flush. Then 512 KiB of the default pool on stream 1 (index 1): 20 + 2 > 21,
    # refused, and this one flushes: the 20 MiB goes, the 2 MiB small segment fits.
    "private-pool-request-on-a-second-stream-does-not-flush": (
        [("alloc", 1, 20 * MiB, 0, 1), ("free", 1, 0), ("alloc", 2, 512 * 1024, 1, 1), ("alloc", 3, 512 * 1024, 0, 1)],
        "",
        [(0, 1, "small", False, ((0, 512 * 1024, A), (512 * 1024, 2 * MiB - 512 * 1024, F)))],
        {"limit": 21 * MiB, "pools": 2, "streams": 2, "flushes": 1, "failed": [2]},
    ),
    # Expandable segments, two streams, each with a free 20 MiB page of its own reservation: a flush
    # unmaps the free pages of every stream's list and gives both reservations back.
    "expandable-flush-unmaps-every-stream": (
        [("alloc", 1, 20 * MiB, 0, 0), ("alloc", 2, 20 * MiB, 0, 1), ("free", 1, 0), ("free", 2, 0), ("flush", 4, 0)],
        "expandable_segments:True",
        [],
        {"streams": 2, "flushes": 1},
    ),
}

# get_free_block's max_split_size filter (AllocatorConfig.fit_limit) at its exact edges. The model
# has it three times: _Model.run's inline best fit (no GC, no expandable segments), run's inline
# expandable walk, and get_free_block (the path taken with a GC threshold set). Each stream below is
# served on its inline path, and again with a GC that never starts, through get_free_block.
FIT_EDGE_STREAMS: dict[str, tuple[Any, ...]] = {  # requests, conf, expected segments[, options]
    # max_split_size 256 MiB: a 256 MiB segment (>= 10 MiB: rounded to 2 MiB, itself), freed. For
    # 100 MiB (< 256) a block of exactly max_split_size is oversize (not below 256 MiB): refused,
    # and 100 MiB gets its own segment. (Taking it would split it: 100 A + 156 F.)
    "max-split-block-refused-to-a-smaller-request": (
        [("alloc", 1, 256 * MiB), ("free", 1, 0), ("alloc", 2, 100 * MiB)],
        "max_split_size_mb:256",
        sorted([(0, 0, "large", False, ((0, 256 * MiB, F),)), (0, 0, "large", False, ((0, 100 * MiB, A),))]),
    ),
    # A request of exactly max_split_size (256 MiB) may take a block below 256 + 20 MiB: the cached
    # 270 MiB one, unsplit (256 is not below max_split_size); 40 MiB then needs its own segment.
    "request-equal-to-max-split": BOUNDARY_STREAMS["request-equal-to-max-split"],
    # A block of exactly request + max_non_split_rounding (256 + 20 = 276 MiB) is past the bound:
    # 256 MiB gets its own segment and the 276 MiB one stays cached. (Taking it: 276 A, unsplit.)
    "block-of-request-plus-rounding-refused": (
        [("alloc", 1, 276 * MiB), ("free", 1, 0), ("alloc", 2, 256 * MiB)],
        "max_split_size_mb:256",
        sorted([(0, 0, "large", False, ((0, 276 * MiB, F),)), (0, 0, "large", False, ((0, 256 * MiB, A),))]),
    ),
    # Expandable segments (20 MiB pages), max_split_size 240 MiB, a 300 MiB cap. 240 MiB maps 12
    # pages exactly, freed: a free block of exactly max_split_size, refused to 100 MiB. A new
    # mapping would reach 240 + 100 > 300: refused; release_available frees nothing (expandable);
    # the flush unmaps the 240 MiB and gives the reservation back; then 5 pages for 100 MiB.
    # (Taking the block: 100 A + 140 F split off, no flush.)
    "expandable-max-split-block-refused-to-a-smaller-request": (
        [("alloc", 1, 240 * MiB), ("free", 1, 0), ("alloc", 2, 100 * MiB)],
        "expandable_segments:True,max_split_size_mb:240",
        [(0, 0, "large", True, ((0, 100 * MiB, A),))],
        {"limit": 300 * MiB, "flushes": 1},
    ),
    # 250 MiB maps 13 pages (260 MiB) and splits off 10 MiB, which 10 MiB then takes whole; 250 MiB
    # freed (its neighbour held). 240 MiB (= max_split_size) may take a block below 240 + 20: the
    # 250 MiB one, split (expandable: any remainder >= 512 B): 240 A + 10 F, no flush. (Refusing it:
    # 260 + 240 > 300, a flush unmapping 12 pages and mapping them again, the same blocks.)
    "expandable-request-equal-to-max-split": (
        [("alloc", 1, 250 * MiB), ("alloc", 2, 10 * MiB), ("free", 1, 0), ("alloc", 3, 240 * MiB)],
        "expandable_segments:True,max_split_size_mb:240",
        [(0, 0, "large", True, ((0, 240 * MiB, A), (240 * MiB, 10 * MiB, F), (250 * MiB, 10 * MiB, A)))],
        {"limit": 300 * MiB, "flushes": 0},
    ),
    # 260 MiB (13 pages) freed; for 240 MiB it is exactly request + 20 MiB: refused. 260 + 240 > 300:
    # flush (all 13 pages unmapped), then 12 pages: 240 A alone. (Taking it: 240 A + 20 F, no flush.)
    "expandable-block-of-request-plus-rounding-refused": (
        [("alloc", 1, 260 * MiB), ("free", 1, 0), ("alloc", 2, 240 * MiB)],
        "expandable_segments:True,max_split_size_mb:240",
        [(0, 0, "large", True, ((0, 240 * MiB, A),))],
        {"limit": 300 * MiB, "flushes": 1},
    ),
}


def _with_gc(stream: tuple[Any, ...]) -> tuple[Any, ...]:
    """The same stream with a GC threshold whose start is never reached (reserved memory stays
    below 0.9 x the cap; 10 GiB where the stream has none): run serves it by get_free_block."""
    requests, conf, expected, *more = stream
    options = dict(more[0]) if more else {}
    options.setdefault("limit", 10 * GiB)
    return (requests, f"{conf},garbage_collection_threshold:0.9", expected, options)


BOUNDARY_STREAMS |= FIT_EDGE_STREAMS
BOUNDARY_STREAMS |= {f"{name}+gc": _with_gc(stream) for name, stream in FIT_EDGE_STREAMS.items()}


@pytest.mark.parametrize("name", sorted(BOUNDARY_STREAMS))
def test_boundary_requests_give_the_hand_computed_blocks_inlined_and_called(name: str) -> None:
    requests, conf, expected, *more = BOUNDARY_STREAMS[name]
    options = dict(more[0]) if more else {}
    flushes = options.pop("flushes", None)
    failed = options.pop("failed", None)
    m = _synthetic(requests, conf, **options)
    compare_inline_and_called(m, checkpoints=1)
    failed_here = m.run(*m.requests)
    assert model_segments(m, m.segment_lk) == expected
    if flushes is not None:  # how many times the whole cache was flushed (release_cached_blocks)
        assert len(m.flushes) == flushes
    if failed is not None:  # the requests (indices in the stream) the model could not serve
        assert failed_here == failed


# --------------------------------------------------------------------------- the rule itself


def test_should_split_boundaries_hand_computed() -> None:
    cfg = AllocatorConfig()
    # Small pool: split when the remainder is at least kMinBlockSize (512 B).
    assert cfg.should_split(2 * MB, 2 * MB - 512, small_pool=True)  # remainder 512
    assert not cfg.should_split(2 * MB, 2 * MB, small_pool=True)  # remainder 0
    assert cfg.should_split(1024, 512, small_pool=True)  # remainder 512
    # Large pool: split only when the remainder exceeds kSmallSize (1 MiB).
    assert not cfg.should_split(20 * MB, 19 * MB, small_pool=False)  # remainder 1 MiB exactly
    assert cfg.should_split(20 * MB, 19 * MB - 512, small_pool=False)  # remainder 1 MiB + 512
    # ... and only for requests below max_split_size.
    capped = AllocatorConfig.parse("max_split_size_mb:256")
    assert capped.should_split(300 * MB, 256 * MB - 512, small_pool=False)  # below: remainder 44 MiB + 512
    assert not capped.should_split(300 * MB, 256 * MB, small_pool=False)  # equal: not below
    # Expandable segments: any remainder of at least 512 B splits, in the large pool too.
    exp = AllocatorConfig.parse("expandable_segments:True")
    assert exp.should_split(20 * MB, 20 * MB - 512, small_pool=False)  # remainder 512
    assert not exp.should_split(20 * MB, 20 * MB, small_pool=False)
    assert exp.should_split(600 * MB, 300 * MB, small_pool=False)  # no max_split_size limit applies
