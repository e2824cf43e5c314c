"""The compiled replay loops: when they run, and their hand-over from the Python loops.

``analysis.allocator._replaycore`` (C) holds four of them, and three helpers:

- The allocator model's whole replay, ``policy_engine`` (``analysis/allocator/_policycore.c``,
  compiled into the same module): ``cachemodel._Model.run`` on C state. It reads the model's state once
  (after ``seed`` / ``seed_live``, which stay Python) into C structures (a block arena, free lists as
  chunked sorted arrays of the packed ``size << 57 | addr`` keys, hash maps by address, the
  placement model), serves every request there, the rare paths included (misses, garbage collection,
  ``release_available`` / ``release_cached`` with pending frees and private pools, expandable
  segments' map and unmap, transient OOMs), and hands the final state back into the Python model
  once (``_Model.adopt``), so ``layout()``, the results and the tests read it as the Python loop
  leaves it. A state outside its bounds (sizes or addresses past 2**62, free lists that do not hold
  the blocks their keys name: only a hostile trace makes one) is declined before anything changes,
  and the Python loop serves it (``last_declined`` says why); its pass over the requests before the
  loop (``policy_scan``: their range checks, the sizes that allocate, and each free paired with the
  alloc it frees, by which the loop keeps ``amap`` without hashing addresses) is made once for the
  columns that a report's replays share (``_scanned``). Its loop touches no Python object
  (``allocation_size`` is asked for every request size before it) and runs without the GIL, so a
  report runs its policy replays on threads side by side (``analysis.parallel``).
- The recorded replay, ``recorded_core`` (``analysis/allocator/_replaycore.c``): ``replayer._Replayer``'s
  whole state in C (int64 maps keyed by address, the size counts and records as arrays, the
  per-event columns summed straight into numpy arrays); every method that moves the state is
  written again there, and only ``_issue``, ``_meta_of_event`` and a ``round_size`` that does
  not round plainly are called back.
- The pairing of each alloc with the event that ends it, ``alloc_ends`` (``stacks.alloc_lifetimes``,
  and ``policy.trace_is_complete``'s check that allocs and frees alternate at every address): one
  pass with a map of the open blocks, where the reference sorts every alloc and free by address;
  kept for the same columns, since both ask it of each trace.
- The event-order check's block events, ``block_order`` (``eventorder.check_event_order``): each
  alloc and free against the one before it at its address, from a map of each address's last
  event, where the reference sorts them by address; it names the same first wrong pair. The same
  pass pairs the allocs as ``alloc_ends`` does and keeps the answer for it: the check runs first.
- And three helpers of numpy passes: ``request_stream`` (``requests._stream_of``'s op column and the
  requests it selects, in two passes where numpy made some twenty), ``distinct_count`` (the advisor's
  count of distinct large request sizes: a hash set where ``model.sorted_unique`` sorts) and
  ``peak_without`` (the AMP estimate's peak with some allocations halved, in two passes).

The two replays take every number of the allocator's rules from the Python caller
(``AllocatorConfig.split_rule``, ``fit_limit``'s ``max_split_size`` and ``max_non_split_rounding_size``,
``page_size``, ``gc_threshold_bytes``, ``round_size``, ``allocation_size`` itself, placement's ``CHUNK`` /
``TOP``, the reservation stride), so the rules keep their one definition in ``analysis.allocator.config``.
The Python loops stay the reference: ``tests/analysis/test_replaycore.py`` runs both on every fixture
and on the captures and demands identical results, model state and report JSON, and that every path
of the engine ran (``last_counts``).

Which loops run: the compiled ones when the extension is built (``make install``),
unless the environment sets ``OOMSCOPE_REPLAY=python``. ``loops_in_use()`` says which
(``python -m analysis --version``).
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, NamedTuple

import numpy as np

from analysis.model import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
)

try:  # built by `make install` (setup.py build_ext --inplace); absent without a compiler
    from analysis.allocator import _replaycore  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the machine
    _replaycore = None

ENV_VAR = "OOMSCOPE_REPLAY"


def available() -> bool:
    """Whether the compiled loops are built on this machine."""
    return _replaycore is not None


def wanted() -> bool:
    """Whether the replays run the compiled loops (built, and not turned off by ``OOMSCOPE_REPLAY=python``)."""
    return _replaycore is not None and os.environ.get(ENV_VAR, "").strip().lower() != "python"


def loops_in_use() -> str:
    """``compiled`` or ``python``, with the reason when it is the Python one."""
    if not available():
        return "python (the compiled replay loops are not built)"
    if not wanted():
        return f"python ({ENV_VAR}=python)"
    return "compiled (analysis.allocator._replaycore)"


# What the last ``policy_engine`` call did: how often each path of the model ran (the tests
# assert that the paths they mean to cover ran; ``key_bits``: its free lists' key width, 64 unless a
# key did not fit there and the call ran again with 128-bit ones), and why it declined, if it did. With replays on
# threads (a report's pool) "last" is the last to finish; nothing but the tests reads these.
last_counts: dict[str, int] = {}
last_declined: str | None = None

# The free lists' key width ``policy_engine`` tries first: 64 bits, where a key does not fit there the
# whole call again with 128 (``_policycore.c``); the tests set 128 to compare the two widths.
KEY_BITS = 64


def policy_engine(
    model: Any, rules: dict[str, Any], events: Any, ops: Any, raddrs: Any, sizes: Any, lks: Any
) -> list[int] | None:
    """``cachemodel._Model.run`` whole in C, on C state (``_policycore.c``): imports the model's state,
    serves every request, and hands the final state back (``model.adopt``). ``rules``: every
    number of the model's rules and the request codes (``cachemodel._Model.engine_rules``). The
    columns may be int64 arrays (taken as they are) or lists; the op codes one byte each (an int8 array
    taken as it is: ``Requests.op_col``). Returns the failed event indices, or None when the engine declined
    a state outside its bounds (the model is then untouched)."""
    global last_declined, last_counts
    try:
        cols = {
            name: np.ascontiguousarray(value, dtype=np.int64).reshape(-1)
            for name, value in (("events", events), ("raddrs", raddrs), ("sizes", sizes), ("lks", lks))
        }
        cols["ops"] = _op_codes(ops)
    except OverflowError:
        last_declined = "a number past int64"
        return None
    if cols["ops"] is None:
        last_declined = "an op code past int8"
        return None
    cols["scan"] = _scanned((ops, sizes, lks, raddrs), cols, rules)
    params = dict(
        rules,
        **cols,
        seg_alloc=SEGMENT_ALLOC,
        seg_free=SEGMENT_FREE,
        seg_map=SEGMENT_MAP,
        seg_unmap=SEGMENT_UNMAP,
        key_bits=KEY_BITS,
    )
    served = _replaycore.policy_engine(model, params)
    if served[0] is None:
        last_declined = served[1]
        return None
    failed, state, counts = served
    model.adopt(state)
    last_counts, last_declined = counts, None
    failed_events: list[int] = failed
    return failed_events


# policy_scan's answer by the columns it read (ids -> (weak refs to them, scan)): the check and the
# what-ifs of a report replay the same columns (``Requests.columns``, ``op_col``, ``raddr_col``) on the
# pool's threads, and each replay's pass over them before its loop (the range checks and the sizes that
# allocate, 2.5-4 ms on the 460 MB trace; the pairing of each free with its alloc, ~12 ms, which spares each
# loop hashing every request's address: 11 ms a replay) is then made once. A trace's columns are never
# written once read (as ``_PAIRED``). Two entries: the next columns replace the oldest.
_SCANNED: dict[tuple[int, ...], tuple[Any, ...]] = {}
_SCAN_LOCK = threading.Lock()


def _scanned(columns: tuple[Any, Any, Any, Any], cols: dict[str, Any], rules: dict[str, Any]) -> Any:
    """policy_scan of the engine's columns ``cols``, kept for the caller's ``columns`` (ops, sizes, free
    lists, addresses) while they live; None where they are no arrays (nothing to key it on): the engine
    scans."""
    if not all(isinstance(c, np.ndarray) for c in columns):
        return None
    codes = (rules["op_alloc"], rules["op_oom"], rules["op_free"], rules["op_free_req"])
    key = (*(id(c) for c in columns), *codes)
    with _SCAN_LOCK:  # one thread scans (without the GIL), the others wait here and take its answer
        memo = _SCANNED.get(key)
        if memo is not None and all(ref() is c for ref, c in zip(memo[:-1], columns, strict=True)):
            return memo[-1]
        scan = _replaycore.policy_scan(cols["ops"], cols["sizes"], cols["lks"], cols["raddrs"], *codes)
        refs = tuple(weakref.ref(c) for c in columns)
        if len(_SCANNED) >= 2:
            _SCANNED.pop(next(iter(_SCANNED)))
        _SCANNED[key] = (*refs, scan)
        return scan


def _op_codes(ops: Any) -> Any:
    """The op codes as the engine takes them, one byte each; None where a code does not fit one (no code of
    ``requests._OP_*`` is past 5: a column that holds one is declined, never wrapped into another code)."""
    if isinstance(ops, np.ndarray) and ops.dtype == np.int8:
        return np.ascontiguousarray(ops).reshape(-1)
    wide = np.ascontiguousarray(ops, dtype=np.int64).reshape(-1)
    if wide.size and (int(wide.min()) < -128 or int(wide.max()) > 127):
        return None
    return wide.astype(np.int8)


def recorded_core(act: bytes, addr: Any, size: Any, stream: Any, pool: Any, stops: list[int], **rules: Any) -> Any:
    """``replayer._Replayer``'s state in C, empty, over one device's trace (``act``: the action codes as
    bytes; ``addr``, ``size``: int64 arrays; ``stream``, ``pool``: the trace's columns, read at segment
    events); ``stops``: the events a strict pass never fuses a free across; ``rules`` are the numbers and
    the callables ``run`` uses (its own locals)."""
    params = dict(
        rules,
        alloc=ALLOC,
        free_requested=FREE_REQUESTED,
        free_completed=FREE_COMPLETED,
        seg_alloc=SEGMENT_ALLOC,
        seg_free=SEGMENT_FREE,
        seg_map=SEGMENT_MAP,
        seg_unmap=SEGMENT_UNMAP,
    )
    return _replaycore.recorded_core(act, addr, size, stream, pool, stops, params)


class Pairing(NamedTuple):
    """``alloc_pairing``'s answer: per alloc in trace order (read-only int64 columns), its event, its end and
    how many allocs come before its end; whether the kinds alternate; and, where the trace's sizes were
    given, each alloc's requested bytes and the requested bytes live right after it (else None)."""

    starts: Any
    ends: Any
    ranks: Any
    alternates: bool
    sizes: Any = None
    after: Any = None


def alloc_pairing(action: Any, addr: Any, free: int = FREE_REQUESTED, size: Any = None) -> Pairing | None:
    """One compiled pass over a trace's allocs and frees (``free``: the action code that frees), by
    address: per alloc in trace order its event, where it ends (``stacks.alloc_lifetimes``' pairing: the
    next alloc or free at its address, else the trace's length) and how many allocs come before its end
    (``outline.live_requested``'s end_rank), and whether every address starts with an alloc and its kinds
    alternate (``policy.trace_is_complete``); with ``size`` (the trace's size column), each alloc's bytes
    and the requested bytes live after it (``outline.live_requested``'s ``after``). None where it declines
    (the loops are off, or an address is its map's empty key): the reference's sort by address then
    answers. The answer is kept while the columns live (read-only), and given again for the same columns
    and free code: the lifetimes and the completeness check ask it of each trace, and the event-order
    check's pass finds it first (``first_block_out_of_order``)."""
    if not wanted():
        return None
    memo = _remembered(action, addr, free, size)
    if memo is not None:
        return memo
    columns = (action, addr, size)
    action = np.ascontiguousarray(action, np.int8)
    out = _pairing_columns(action, size is not None)
    got = _replaycore.alloc_ends(action, np.ascontiguousarray(addr, np.int64), ALLOC, free, out, _sizes(size))
    if got is None:
        return None
    return _remember_pairing(columns, free, out, bool(got[1]))


def alloc_ends(action: Any, addr: Any, free: int = FREE_REQUESTED, *, ends: bool = True) -> tuple[Any, bool] | None:
    """``alloc_pairing``'s ends (None with ``ends`` false) and whether the kinds alternate."""
    got = alloc_pairing(action, addr, free)
    if got is None:
        return None
    return (got.ends if ends else None), got.alternates


def _pairing_columns(action: Any, sized: bool) -> Any:
    """The pairing's columns, unwritten: int64 rows (starts, ends, ranks, and with the sizes bytes and
    after), one column per alloc."""
    return np.empty((5 if sized else 3, int(np.count_nonzero(action == ALLOC))), np.int64)


def _sizes(size: Any) -> Any:
    return None if size is None else np.ascontiguousarray(size, np.int64)


# The pairing's last answer by the columns it read (ids -> (action, addr, size, its answer)), dropped with
# them: the event-order check, the lifetimes and the completeness check pair the same trace's events, one
# after the other or from two threads (a report's pool). The columns are kept read-only; a trace's columns
# are never written once read. One entry: the next trace replaces it.
_PAIRED: dict[tuple[int, int, int], tuple[Any, Any, Any, Pairing]] = {}


def _remembered(action: Any, addr: Any, free: int, size: Any = None) -> Pairing | None:
    """The kept answer for these columns; where ``size`` is asked, only one paired with those sizes."""
    memo = _PAIRED.get((id(action), id(addr), free))
    if memo is None or memo[0]() is not action or memo[1]() is not addr:
        return None
    if size is not None and (memo[2] is None or memo[2]() is not size):
        return None
    return memo[3]


def _remember_pairing(columns: tuple[Any, Any, Any], free: int, out: Any, alternates: bool) -> Pairing:
    out.flags.writeable = False
    action, addr, size = columns
    answer = Pairing(out[0], out[1], out[2], alternates, *(out[3:] if size is not None else ()))
    key = (id(action), id(addr), free)
    try:
        refs = (
            weakref.ref(action, lambda _: _PAIRED.pop(key, None)),
            weakref.ref(addr),
            None if size is None else weakref.ref(size),
        )
    except TypeError:  # a list, not an array: nothing to key the answer on
        return answer
    _PAIRED.clear()
    _PAIRED[key] = (*refs, answer)
    return answer


def peak_without(after: Any, end_rank: Any, halves: Any, cut: Any) -> int | None:
    """``workload._peak_without``'s peak of live requested bytes with the ``cut`` allocations' ``halves`` gone
    (``after``, ``end_rank``: ``outline.Live``'s), in two compiled passes; None where the loops are off."""
    if not wanted():
        return None
    columns = (np.ascontiguousarray(after, np.int64), np.ascontiguousarray(end_rank, np.int64))
    got: int = _replaycore.peak_without(
        *columns, np.ascontiguousarray(halves, np.int64), np.ascontiguousarray(cut, bool)
    )
    return got


def distinct_count(values: Any) -> int | None:
    """How many distinct values a 1-D integer array holds (``model.sorted_unique(values).size``), by the
    compiled hash set; None where the loops are off (the caller's sort answers)."""
    if not wanted():
        return None
    return int(_replaycore.distinct_count(np.ascontiguousarray(values, np.int64)))


def request_stream(action: Any, addr: Any, codes: bytes, flushes: Any) -> tuple[Any, Any, Any, Any] | None:
    """``requests._stream_of``'s op column (``codes``: the actions alloc, free_requested, free_completed and
    oom, then its op codes alloc, free, free_requested, free_completed, oom and flush; ``flushes``: the events
    whose op is a flush) and the requests it selects: (op, events, ops, addresses), two compiled passes where
    numpy made some twenty; None where the loops are off (the caller's numpy answers)."""
    if not wanted():
        return None
    action = np.ascontiguousarray(action, np.int8)
    addr = np.ascontiguousarray(addr, np.int64)
    op = np.empty(action.shape[0], np.int8)
    m = _replaycore.request_ops(action, addr, codes, np.ascontiguousarray(flushes, np.int64), op)
    sel, ops, raddr = np.empty(m, np.int64), np.empty(m, np.int8), np.empty(m, np.int64)
    _replaycore.request_select(op, addr, sel, ops, raddr)
    return op, sel, ops, raddr


def first_block_out_of_order(
    action: Any, addr: Any, stream: Any, pool: Any, next_kind: Any, lanes: bool, size: Any = None
) -> tuple[int, int, bool] | tuple[()] | None:
    """``eventorder.check_event_order``'s block events in one compiled pass: each alloc, free_requested
    and free_completed against the one before it at its address in trace order (``next_kind``: the
    action that may follow each of the three; ``lanes``: a free must keep its alloc's pool and stream).
    ``()`` where every pair is in order, ``(cur, prev, kind_wrong)`` for the wrong pair with the earliest
    ``cur``, None where it declines (the loops are off, or an address is its map's empty key): the
    reference's sort by address then answers. Where every pair is in order, the same pass's pairing of the
    allocs (``alloc_pairing``, its default free; with ``size``, the trace's sizes) is kept for the lifetimes
    and the completeness check."""
    if not wanted():
        return None
    columns = (action, addr, size)
    action = np.ascontiguousarray(action, np.int8)
    kept = _remembered(columns[0], addr, FREE_REQUESTED, size)
    out = None if kept is not None else _pairing_columns(action, size is not None)
    got = _replaycore.block_order(
        action,
        np.ascontiguousarray(addr, np.int64),
        np.ascontiguousarray(stream, np.int32),
        np.ascontiguousarray(pool, np.int32),
        np.ascontiguousarray(next_kind, np.int8).tobytes(),
        bool(lanes),
        ALLOC,
        FREE_REQUESTED,
        out,
        None if out is None else _sizes(size),
    )
    if got is None:
        return None
    found: tuple[int, int, bool] | tuple[()] = got[0]
    if not found and out is not None:
        _remember_pairing(columns, FREE_REQUESTED, out, bool(got[1]))
    return found
