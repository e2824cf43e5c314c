"""Trace -> requests: what the policy replay is fed, built once per device trace.

The policy replay (``policy.simulate``) forgets every decision the allocator
made and keeps the *requests*: the ``alloc`` sizes with their stream and pool,
the order of the frees, cross-stream frees that complete later, ``oom``
requests, and the ``empty_cache()`` calls made by user code. Telling those
calls apart from the flushes a malloc makes itself (the GC,
``release_available_cached_blocks``, ``release_cached_blocks``) is the work of
``bursts_of``. ``build_requests`` does it all once and returns a ``Requests``,
which every ``simulate`` / ``replay_check`` / ``whatif`` / ``infer_limit`` of the
same trace takes (``requests=``); only the rounding depends on the settings
replayed, and ``Requests.lists`` keeps one rounding per distinct
``roundup_power2_divisions``.

``requests_for`` remembers the last few built, by the identity of the trace's
action column held through a weak reference (an entry dies with its trace),
for callers that do not pass them.
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator import compiled
from analysis.allocator.bursts import Burst, bursts_of
from analysis.allocator.config import (
    AllocatorConfig,
    small_pool,
)
from analysis.allocator.eventorder import check_event_order
from analysis.allocator.recording import ReplaySource
from analysis.allocator.reserved import segment_events
from analysis.model import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    I32,
    I64,
    OOM,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    DeviceData,
    Snapshot,
)

# Operation codes of the request stream.
_OP_ALLOC, _OP_FREE, _OP_FREE_REQ, _OP_FREE_DONE, _OP_OOM, _OP_FLUSH = 0, 1, 2, 3, 4, 5


def _device(snapshot: Snapshot, device: DeviceData | int) -> DeviceData:
    return device if isinstance(device, DeviceData) else snapshot.device(device)


def _stream_of(snapshot: Snapshot, dev: DeviceData, bursts: list[Burst], pools: I32) -> tuple[Any, ...]:
    """The request stream (config-free): event indices, op codes, recorded addresses and the (pool,
    stream) lane of each (their sizes: ``Requests.sizes``)."""
    t = dev.trace
    user = [(b.start, b.end) for b in bursts if b.kind == "user"]
    malloc_flushes = tuple((b.start, b.request) for b in bursts if b.synced)
    act = t.action
    addr = t.addr
    flushes = np.array([start for start, _end in user], np.int64)
    got = compiled.request_stream(act, addr, _STREAM_CODES, flushes)
    op, sel, ops, raddr = got if got is not None else _ops_of(act, addr, flushes)
    if user:  # a flush carries the end of its burst instead of an address
        pos = np.searchsorted(sel, [start for start, _end in user])
        raddr[pos] = [end for _start, end in user]
    # A flush inside malloc (release_cached_blocks, after get_free_block missed and
    # the limit refused a segment) first runs synchronize_and_free_events: the
    # free_completed entries right before its segment_free run are its own doing,
    # not frees the request could have used. The model makes that flush itself, so
    # those completions move to just after the request: under the recorded settings
    # the model's flush has synced them already; under others, a block whose
    # stream work was only forced to finish by the flush finishes then.
    # An OOM's malloc flushed too, and after that flush torch retries only
    # alloc_block, never get_free_block: the completions its sync emitted, right
    # before the OOM entry (with no segment released, no run above marks them),
    # came too late for the request. Had some been process_events' at the
    # malloc's start instead, the request missed with them all the same.
    late: list[tuple[int, int]] = []
    for start, request in (*malloc_flushes, *((int(o), int(o)) for o in np.flatnonzero(act == OOM))):
        j = start - 1
        while j >= 0 and op[j] == _OP_FREE_DONE:
            late.append((j, request))
            j -= 1
    if late:
        order_key = sel.astype(np.float64)
        order_key[np.searchsorted(sel, [j for j, _r in late])] = [r + 0.5 for _j, r in late]
        order = np.argsort(order_key, kind="stable")
        sel, ops, raddr = sel[order], ops[order], raddr[order]
    ns = max(len(dev.streams), 1)
    lane = None
    if not (ns == 1 and len(snapshot.pools) == 1):
        lane = _lanes(pools, t.stream, sel, ns)
    return sel, ops, raddr.astype(np.int64, copy=False), lane


# request_stream's codes: the actions it reads, then the ops it writes (compiled.request_stream).
_STREAM_CODES = bytes(
    [ALLOC, FREE_REQUESTED, FREE_COMPLETED, OOM, _OP_ALLOC, _OP_FREE, _OP_FREE_REQ, _OP_FREE_DONE, _OP_OOM, _OP_FLUSH]
)


def _ops_of(act: npt.NDArray[np.int8], addr: I64, flushes: I64) -> tuple[npt.NDArray[np.int8], I64, Any, I64]:
    """Each event's op (-1: none; ``flushes``: events made a flush) and the requests it selects: their events,
    ops and recorded addresses (``compiled.request_stream``'s reference)."""
    is_fr = act == FREE_REQUESTED
    is_fc = act == FREE_COMPLETED
    paired, completes = _free_pairing(is_fr, is_fc, addr)
    # Each event's op + 1 (0: none): the five kinds are disjoint, so their codes add up. Masked stores
    # of each kind into a column of -1 took 0.02 s of the 460 MB trace, these int8 passes a fifth of it.
    op = _op_code(act == ALLOC, _OP_ALLOC)
    op += _op_code(paired, _OP_FREE)
    op += _op_code(is_fr & ~paired, _OP_FREE_REQ)
    op += _op_code(is_fc & ~(completes | paired), _OP_FREE_DONE)
    op += _op_code(act == OOM, _OP_OOM)
    op -= 1
    op[flushes] = _OP_FLUSH
    sel = np.flatnonzero(op >= 0)
    return op, sel, op[sel], addr[sel]


def _free_pairing(
    is_fr: npt.NDArray[np.bool_], is_fc: npt.NDArray[np.bool_], addr: npt.NDArray[Any]
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """The frees of a trace (``is_fr``: its free_requested, ``is_fc``: its free_completed) as requests: ``paired``,
    a free_requested followed at once by its block's free_completed (one ``_OP_FREE``), and ``completes``, the
    free_completed such a pair holds (no request of its own)."""
    n = is_fr.shape[0]
    paired = np.zeros(n, bool)
    if n > 1:  # in place: no temporary column of the trace's length
        np.equal(addr[1:], addr[:-1], out=paired[:-1])
        paired[:-1] &= is_fr[:-1]
        paired[:-1] &= is_fc[1:]
    completes = np.zeros(n, bool)
    completes[1:] = paired[:-1]
    # skip_actions (torch 2.10+) may drop one of the two: the other is then the free.
    if not is_fc.any():
        paired = is_fr
    elif not is_fr.any():
        paired, completes = is_fc, np.zeros(n, bool)
    return paired, completes


def _op_code(kind: npt.NDArray[np.bool_], code: int) -> npt.NDArray[np.int8]:
    """``code + 1`` where ``kind`` holds, else 0 (``_stream_of``'s op column, one kind at a time)."""
    out: npt.NDArray[np.int8] = kind.view(np.int8) * np.int8(code + 1)
    return out


def _lanes(pools: I32, stream: npt.NDArray[Any], events: npt.ArrayLike, n_streams: int) -> I64:
    """The (pool, stream) lane of requests at trace ``events``: ``pool * 2 * streams + stream``; the
    free-list index adds ``large * streams`` (``_free_lists``). The model's only spelling of it."""
    idx = np.asarray(events, np.int64)
    lane: I64 = pools[idx].astype(np.int64) * 2 * n_streams + stream[idx].astype(np.int64)
    return lane


def _free_lists(rounded: I64, lane: I64 | None, n_streams: int) -> npt.NDArray[Any]:
    """Free-list index of requests of ``rounded`` sizes in their lanes (small pool 0, large 1, per lane)."""
    large = ~small_pool(rounded)
    return large.view(np.int8) if lane is None else lane + large * n_streams


def _event_pools(dev: DeviceData) -> npt.NDArray[np.int32]:
    """Pool of every event, recovering what torch 2.11 traces leave out.

    Before ``pool_id`` was recorded on trace entries (2.12), every event reads as
    the default pool even while a CUDA graph captured into a private one. The
    final ``segments`` do name each live segment's pool, and every block lies in
    a segment, so an event's pool is that of the recorded segment holding its
    address at the time. Segments released before the dump (a deleted graph's
    pool, or default-pool segments freed by a flush) read as the default pool.
    """
    t = dev.trace
    if (t.pool != 0).any() or not any(seg.pool != 0 for seg in dev.segments):
        return t.pool
    act = t.action
    final = sorted((seg.address, seg.address + seg.total_size, seg.pool) for seg in dev.segments)
    final_starts = [f[0] for f in final]

    def final_pool(addr: int) -> int:
        i = bisect_left(final_starts, addr + 1) - 1
        return final[i][2] if i >= 0 and addr < final[i][1] else 0

    seg_events = segment_events(act)
    # A segment_alloc's segment lives to the end unless a later segment_free has its address.
    survives = {}
    freed_later: set[int] = set()
    for i in seg_events[::-1].tolist():
        a = int(t.addr[i])
        if act[i] == SEGMENT_FREE:
            freed_later.add(a)
        elif act[i] == SEGMENT_ALLOC:
            survives[i] = a not in freed_later
            freed_later.discard(a)
    pools = np.zeros(len(t), np.int32)
    # A final segment that no segment_alloc or segment_map of the trace made existed
    # before its first event (a wrapped ring buffer): its pool holds from the start.
    made = {int(a) for a in t.addr[(act == SEGMENT_ALLOC) | (act == SEGMENT_MAP)].tolist()}
    live: dict[int, tuple[int, int]] = {  # start -> (end, pool)
        seg.address: (seg.address + seg.total_size, seg.pool)
        for seg in dev.segments
        if seg.address not in made and not seg.is_expandable
    }
    has_addr = (act == ALLOC) | (act == FREE_REQUESTED) | (act == FREE_COMPLETED)
    bounds = [*seg_events.tolist(), len(t)]
    prev = -1
    for i in bounds:
        lo, hi = prev + 1, i
        if hi > lo and live:
            idx = lo + np.flatnonzero(has_addr[lo:hi])
            if idx.size:
                starts = sorted(live)
                sa = np.asarray(starts, np.int64)
                ends = np.asarray([live[x][0] for x in starts], np.int64)
                pl = np.asarray([live[x][1] for x in starts], np.int32)
                addr = t.addr[idx]
                pos = np.searchsorted(sa, addr, side="right") - 1
                ok = (pos >= 0) & (addr < ends[np.maximum(pos, 0)])
                pools[idx] = np.where(ok, pl[np.maximum(pos, 0)], 0)
        if i < len(t):
            a, size, kind = int(t.addr[i]), int(t.size[i]), int(act[i])
            if kind == SEGMENT_ALLOC:
                live[a] = (a + size, final_pool(a) if survives.get(i) else 0)
                pools[i] = live[a][1]
            elif kind == SEGMENT_MAP:
                live[a] = (a + size, final_pool(a))
                pools[i] = live[a][1]
            elif kind == SEGMENT_FREE:
                pools[i] = live.pop(a, (0, 0))[1]
            else:  # SEGMENT_UNMAP: cut [a, a + size) out of the mapped ranges
                for start, (end, pool) in list(live.items()):
                    if end <= a or start >= a + size:
                        continue
                    pools[i] = pool
                    del live[start]
                    if start < a:
                        live[start] = (a, pool)
                    if end > a + size:
                        live[a + size] = (end, pool)
        prev = i
    return pools


def _freeable_from(dev: DeviceData, pools: npt.NDArray[np.int32], seg: I64) -> dict[int, int]:
    """Private pool -> first event index where the trace shows it being released (``seg``: the trace's
    segment events, ``reserved.segment_events``: a few hundred, the releases looked for among them alone)."""
    t = dev.trace
    kind = t.action[seg]
    rel = seg[((kind == SEGMENT_FREE) | (kind == SEGMENT_UNMAP)) & (pools[seg] != 0)]
    out: dict[int, int] = {}
    for i in rel.tolist():
        out.setdefault(int(pools[i]), i)
    return out


@dataclass
class Requests:
    """One device trace as the policy replay's input (see the module docstring)."""

    recorded_config: AllocatorConfig
    bursts: list[Burst]
    pools: I32  # the pool of every event (torch 2.11 traces recover it from the segments)
    freeable_from: dict[int, int]  # private pool -> first event showing it released
    recorded_segments: tuple[list[int], list[int], list[int]]  # (action, size, address) of each segment event
    events: npt.NDArray[np.intp]  # trace index of each request
    op_col: npt.NDArray[np.int8]  # op code of each request (``_OP_*``), one byte each as the compiled engine takes it
    raddr_col: I64  # recorded address of each request (a user flush: the end of its burst)
    trace_size: I64  # the trace's size column, every event's (``sizes`` gathers the requests')
    lane: I64 | None  # (pool * 2) * streams + stream per request; None: one pool, one stream
    n_streams: int
    source: ReplaySource  # the device's recorded replay, for the few rules that read its states
    # The recorded segment events as int64 columns (the compiled engine's input: no Python lists).
    segment_cols: tuple[I64, I64, I64] | None = None
    _rounded: dict[tuple[int, ...], tuple[I64, I64]] = field(default_factory=dict)
    _listed: dict[tuple[int, ...], tuple[list[int], list[int]]] = field(default_factory=dict)
    # Answers several replays of the trace ask for, each made once (``remembered``): the check and the
    # what-ifs start at once on the pool's threads, and without a lock two or three of them each made
    # the same one (issue 34, the 460 MB benchmark: the rounded columns twice, 38 MB of fresh pages and
    # ~15 ms of CPU each time; the inferred limit three times, ~15 ms each).
    _answers: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    _making: dict[Any, threading.Lock] = field(default_factory=dict, init=False, repr=False, compare=False)
    _locks_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _ops: list[int] | None = None
    _raddrs: list[int] | None = None
    # Whether the trace's segment history is whole (``policy._segments_complete``), once per trace: it
    # sums a column of every event, and each replay of the trace asks.
    complete: bool | None = None

    @property
    def gc_ran(self) -> bool:
        """Whether the trace shows ``garbage_collect_cached_blocks`` runs (``bursts_of``' "gc" runs):
        proof that the run was under a per-process cap (``analysis.limits.run_was_capped``)."""
        return any(b.kind == "gc" for b in self.bursts)

    @property
    def sizes(self) -> I64:
        """Each request's size, gathered from the trace when asked and not kept: only ``columns`` reads them,
        once per rounding, on the thread that first asks (a report's pool thread; issue 34: gathered in
        ``build_requests`` they were 13 MB of fresh pages and ~5 ms on the report's main thread for the
        460 MB trace, and lived as long as the trace)."""
        out: I64 = self.trace_size.take(self.events)
        return out

    # The columns as Python lists, made when first asked for: the Python loop's inputs (the compiled
    # engine takes the columns, and a report that runs it never needs these).
    @property
    def ops(self) -> list[int]:
        if self._ops is None:
            self._ops = self.op_col.tolist()
        return self._ops

    @property
    def raddrs(self) -> list[int]:
        if self._raddrs is None:
            self._raddrs = self.raddr_col.tolist()
        return self._raddrs

    def remembered(self, key: Any, make: Callable[[], Any]) -> Any:
        """``make()``, made once for this trace under ``key`` however many threads ask at once (the
        others wait for it), then kept. Only for small answers that every replay of the trace may ask
        for (a config's inferred limit): nothing here is ever let go."""
        if key in self._answers:
            return self._answers[key]
        with self._lock_of(key):
            if key not in self._answers:
                self._answers[key] = make()
            return self._answers[key]

    def _lock_of(self, key: Any) -> threading.Lock:
        """The lock that the makers of ``key`` take, one per key: another answer is made meanwhile."""
        with self._locks_lock:
            return self._making.setdefault(key, threading.Lock())

    def columns(self, cfg: AllocatorConfig) -> tuple[I64, I64]:
        """Rounded size and free-list index of every request under ``cfg``'s rounding, as int64 columns."""
        key = cfg.roundup_power2_divisions
        hit = self._rounded.get(key)
        if hit is not None:
            return hit
        with self._lock_of(("columns", key)):
            hit = self._rounded.get(key)
            return hit if hit is not None else self._made_columns(cfg, key)

    def _made_columns(self, cfg: AllocatorConfig, key: tuple[int, ...]) -> tuple[I64, I64]:
        # An oom entry's size is the request rounded under the recorded settings: rounded again
        # under ``cfg`` like the others (issue 23: gpt_varlen's 708.6 MiB request failed as 710 MiB
        # by default, as 768 MiB under divisions 4). Rounding is idempotent, and torch's divisions
        # are powers of two, so a coarser recorded rounding stays (an upper bound) under a finer one.
        rounded = cfg.round_sizes(self.sizes)
        out = (rounded, _free_lists(rounded, self.lane, self.n_streams).astype(np.int64))
        _remember(self._rounded, key, out)
        return out

    def lists(self, cfg: AllocatorConfig) -> tuple[list[int], list[int]]:
        """``columns`` as Python lists (the Python loop's inputs)."""
        key = cfg.roundup_power2_divisions
        hit = self._listed.get(key)
        if hit is not None:
            return hit
        with self._lock_of(("lists", key)):
            hit = self._listed.get(key)
            if hit is not None:
                return hit
            sizes, lks = self.columns(cfg)
            out = (sizes.tolist(), lks.tolist())
            _remember(self._listed, key, out)
            return out

    def with_tail(
        self, dev: DeviceData, cfg: AllocatorConfig, tail: Any
    ) -> tuple[npt.NDArray[np.intp], list[int], list[int], list[int], list[int]]:
        """(events, ops, raddrs, sizes, free lists) cut before ``tail.cut`` with the projected tail's
        requests after them (``ProjectedTail``, ``analysis.projection``); new lists, since the cut
        ones are shared by every config that rounds alike."""
        sizes, lks = self.lists(cfg)
        keep = int(np.searchsorted(self.events, tail.cut, side="left"))
        if not len(tail.alloc):
            return self.events[:keep], self.ops[:keep], self.raddrs[:keep], sizes[:keep], lks[:keep]
        n = len(dev.trace)
        # Request 0 is the oom entry: rounded under cfg like the rest (see ``lists``).
        rounded = cfg.round_sizes(np.asarray(tail.size, np.int64))
        lane = None if self.lane is None else _lanes(self.pools, dev.trace.stream, tail.like, self.n_streams)
        tail_events = np.r_[tail.cut, n + np.arange(1, len(tail.alloc))].astype(self.events.dtype)
        return (
            np.r_[self.events[:keep], tail_events],
            self.ops[:keep] + [_OP_ALLOC if a else _OP_FREE for a in tail.alloc],
            self.raddrs[:keep] + list(tail.addr),
            sizes[:keep] + rounded.tolist(),
            lks[:keep] + _free_lists(rounded, lane, self.n_streams).tolist(),
        )

    def tail_columns(
        self, dev: DeviceData, cfg: AllocatorConfig, tail: Any
    ) -> tuple[I64, npt.NDArray[Any], I64, I64, I64]:
        """``with_tail`` as int64 columns (the compiled engine's inputs; the op codes int8 where no request is
        added: ``op_col`` cut)."""
        sizes, lks = self.columns(cfg)
        keep = int(np.searchsorted(self.events, tail.cut, side="left"))
        events = self.events[:keep].astype(np.int64)
        cut = (events, self.op_col[:keep], self.raddr_col[:keep], sizes[:keep], lks[:keep])
        if not len(tail.alloc):
            return cut
        n = len(dev.trace)
        rounded = cfg.round_sizes(np.asarray(tail.size, np.int64))
        lane = None if self.lane is None else _lanes(self.pools, dev.trace.stream, tail.like, self.n_streams)
        added = (
            np.r_[tail.cut, n + np.arange(1, len(tail.alloc))],
            np.where(np.asarray(tail.alloc, bool), _OP_ALLOC, _OP_FREE),
            np.asarray(tail.addr, np.int64),
            rounded,
            _free_lists(rounded, lane, self.n_streams),
        )
        a, b, c, d, e = (np.r_[x, y].astype(np.int64) for x, y in zip(cut, added, strict=True))
        return a, b, c, d, e


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    """Keep ``value`` in a cache of at most four; the oldest goes. Replays in threads of one process
    share a ``Requests``: two may fill the same key at once (both computed the same value), and
    neither may fail on an entry the other has just evicted."""
    if len(cache) >= 4:
        cache.pop(next(iter(cache.copy()), None), None)
    cache[key] = value


def build_requests(snapshot: Snapshot, device: DeviceData | int, source: ReplaySource | None = None) -> Requests:
    """The ``Requests`` of one device trace (see the module docstring). ``source``: the
    device's recorded replay, built once by its owner (a new one, built only if needed, else)."""
    dev = _device(snapshot, device)
    source = source if source is not None else ReplaySource(snapshot, dev)
    recorded = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    pools = _event_pools(dev)
    t = dev.trace
    seg = segment_events(t.action)  # the event-order check, the freeable pools and the segment columns read them
    check_event_order(dev, pools, seg)
    bursts = bursts_of(snapshot, dev, recorded, pools, source)
    events, ops, raddrs, lane = _stream_of(snapshot, dev, bursts, pools)
    cols = (t.action[seg].astype(np.int64), t.size[seg].astype(np.int64), t.addr[seg].astype(np.int64))
    segments = (cols[0].tolist(), cols[1].tolist(), cols[2].tolist())
    return Requests(
        recorded,
        bursts,
        pools,
        _freeable_from(dev, pools, seg),
        segments,
        events,
        ops,
        raddrs,
        t.size,
        lane,
        max(len(dev.streams), 1),
        source,
        segment_cols=cols,
    )


# (weak reference to a trace's action column, its Requests), newest last.
_MEMO: list[tuple[weakref.ref[Any], Requests]] = []


def requests_for(snapshot: Snapshot, device: DeviceData | int) -> Requests:
    """``build_requests``, remembered for the last few traces: a report replays one
    trace several times (the check and each what-if). Matched by the identity of
    the live trace (a weak reference), never by an ``id()`` that a freed trace
    could pass on to a new one."""
    dev = _device(snapshot, device)
    action = dev.trace.action
    for ref, req in _MEMO:
        if ref() is action:
            return req
    req = build_requests(snapshot, dev)
    _MEMO[:] = [(r, q) for r, q in _MEMO if r() is not None][-3:]
    _MEMO.append((weakref.ref(action), req))
    return req
