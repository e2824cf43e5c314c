"""The allocator model fed a request stream: its hot loop, that loop's reference, the compiled engine's hand-over.

``_Model`` is ``cachestate._Allocator`` serving the requests of a trace (``requests.Requests``' op codes):
``run`` serves them all, the hot path's rules inlined; ``run_reference`` serves the same through the
rule methods alone, and the tests hold the two to the same result.

Speed: the hot path (a best-fit hit and a free with merges) runs inline in one
loop over pre-filtered columns, on sorted lists of packed ``size << 57 | addr``
integers searched with ``bisect``; everything else is a method call. Where it is
built, the whole replay runs in C on C state instead (``analysis.allocator.compiled``:
the model's state goes in once and comes back once, ``_Model.engine_rules`` /
``_Model.adopt``); this loop stays the reference.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import count
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator import compiled
from analysis.allocator.cachestate import _ADDR, _RESV_BYTES, _RESV_STRIDE, _SH, _Allocator
from analysis.allocator.config import UNLIMITED
from analysis.allocator.placement import CHUNK, PLACEMENTS, TOP, DriverPlacement, MirrorPlacement
from analysis.allocator.requests import (
    _OP_ALLOC,
    _OP_FLUSH,
    _OP_FREE,
    _OP_FREE_DONE,
    _OP_FREE_REQ,
    _OP_OOM,
)

# The request codes, as the compiled engine takes them (``compiled.policy_engine``).
_OP_CODES = {
    "op_alloc": _OP_ALLOC,
    "op_free": _OP_FREE,
    "op_free_req": _OP_FREE_REQ,
    "op_free_done": _OP_FREE_DONE,
    "op_oom": _OP_OOM,
    "op_flush": _OP_FLUSH,
}


class _LazyList:
    """Index access to a numpy column as Python ints, without converting it all."""

    __slots__ = ("_a",)

    def __init__(self, a: npt.NDArray[Any]) -> None:
        self._a = a

    def __getitem__(self, i: int) -> int:
        return int(self._a[i])


def _loop_events(events: Any) -> Any:
    """The event indices as the Python loop reads them: Python ints, a list when short."""
    return events.tolist() if len(events) < 4096 else _LazyList(events)


def _loop_inputs(events: Any, ops: Any, raddrs: Any, sizes: Any, lks: Any) -> tuple[Any, ...]:
    """The Python loop's inputs from the compiled engine's (its columns become lists)."""
    ev = _loop_events(events) if isinstance(events, np.ndarray) else events
    listed = [x.tolist() if isinstance(x, np.ndarray) else x for x in (ops, raddrs, sizes, lks)]
    return (ev, *listed)


class _Model(_Allocator):
    """One simulated ``DeviceCachingAllocator`` (``cachestate._Allocator``) serving a request stream:
    ``run`` (on C state through ``compiled.policy_engine`` where it is built), ``run_reference``."""

    # -- the compiled engine's hand-over (analysis.allocator.compiled.policy_engine) -------------
    def engine_rules(self, split_over: list[int], split_below: list[int]) -> dict[str, Any]:
        """Every number the compiled engine needs, each from its one definition (``config``,
        ``placement``, ``cachestate``): the same ones ``run`` inlines, plus those of the methods."""
        cfg, limit, n_lists = self.cfg, self.limit, len(self.keys)
        rec: tuple[Any, ...] | None = self.rec_cols
        if rec is None:
            rec = tuple(np.asarray(x, np.int64).reshape(-1) for x in (self.rec_act, self.rec_size, self.rec_addr))
        return {
            "sh": _SH,
            "ns": self.ns,
            "n_lists": n_lists,
            "exp": self.exp,
            "gc_on": self.gc_on,
            "mss_on": self.mss != UNLIMITED,
            "mirror": self.placement_kind == MirrorPlacement.name,
            "mss": self.mss,
            "nsr": self.nsr,
            "limit": limit,
            "gc_threshold": cfg.gc_threshold_bytes(limit) if self.gc_on and limit is not None else 0,
            "split_over": split_over,
            "split_below": split_below,
            "page": np.array([self._page(lk) for lk in range(n_lists)], np.int64),
            "bp_lists": np.array([lk for lks in self.bp_lists for lk in lks], np.int64),
            "resv_stride": _RESV_STRIDE,
            "resv_bytes": _RESV_BYTES,
            "chunk": CHUNK,
            "top": TOP,
            "allocation_size": cfg.allocation_size,
            "rec_act": rec[0],
            "rec_size": rec[1],
            "rec_addr": rec[2],
            "freeable_pools": np.array(list(self.freeable_from), np.int64),
            "freeable_since": np.array(list(self.freeable_from.values()), np.int64),
            "transient": np.array(sorted(self.transient), np.int64),
            **_OP_CODES,
        }

    def adopt(self, state: dict[str, Any]) -> None:
        """Take the compiled engine's final state: the attributes ``run`` would have left, and the
        placement model it made (``va``: None, ("driver", low, free ranges) or ("mirror", next))."""
        va = state.pop("va")
        for name, value in state.items():
            setattr(self, name, value)
        if va is None:
            return
        if va[0] == MirrorPlacement.name:
            mirror = MirrorPlacement()
            mirror.next = va[1]
            self.va = mirror
        else:
            driver = DriverPlacement()
            driver.low, driver.free = va[1], va[2]
            self.va = driver

    # -- the request stream --------------------------------------------------------------
    def run(self, events: Any, ops: list[int], raddrs: list[int], sizes: list[int], lks: list[int]) -> list[int]:
        """Serve every request; returns the event indices the model failed.
        ``events[k]`` is the trace index of request k."""
        keys, blks, gcb = self.keys, self.blks, self.gcb
        pend, pmap, amap = self.pend, self.pmap, self.amap
        failed: list[int] = []
        gc_on = self.gc_on
        fast = not self.exp and not gc_on
        exp_hit = self.exp and not gc_on
        sh = _SH
        bisect = bisect_left
        cfg = self.cfg
        # The rules inlined below, as numbers taken from their one definition in
        # analysis.allocator.config (test_allocator checks this loop against run_reference,
        # which calls the methods):
        # - get_free_block's max_split_size filter (AllocatorConfig.fit_limit): a
        #   block fits if smaller than mss (request below mss) or than request + nsr;
        #   unset (UNLIMITED), every block fits.
        mss, nsr = cfg.max_split_size, cfg.max_non_split_rounding_size
        mss_on = mss != UNLIMITED
        # - should_split (AllocatorConfig.split_rule): split iff remainder > over and
        #   request < below, per pool kind (the free-list index's small|large bit).
        rules = (cfg.split_rule(True), cfg.split_rule(False))
        split_over = [rules[(lk // self.ns) & 1][0] for lk in range(len(keys))]
        split_below = [rules[(lk // self.ns) & 1][1] for lk in range(len(keys))]
        allocation_size = cfg.allocation_size
        if compiled.wanted() and self.placement_kind in PLACEMENTS:
            # The whole replay in C on C state, fed the same numbers (analysis.allocator.compiled);
            # None: the engine declined a state outside its bounds, and this loop serves instead.
            numbers = self.engine_rules(split_over, split_below)
            served = compiled.policy_engine(self, numbers, events, ops, raddrs, sizes, lks)
            if served is not None:
                return served
            events, ops, raddrs, sizes, lks = _loop_inputs(events, ops, raddrs, sizes, lks)
        for k, op, ra, rs, lk in zip(count(), ops, raddrs, sizes, lks):
            if op == 1:  # _OP_FREE: free_requested + free_completed
                b = amap.pop(ra, None)
                if b is None:
                    continue  # the model never served this request
                s = b[0]
                kl = keys[lk]
                bl = blks[lk]
                p = b[2]
                if p and p[4]:  # merge into the free block before
                    ps = p[0]
                    j = bisect(kl, (ps << sh) | p[1])
                    del kl[j]
                    del bl[j]
                    n = b[3]
                    p[3] = n
                    if n:
                        n[2] = p
                    s += ps
                    b = p
                n = b[3]
                if n and n[4]:  # absorb the free block after
                    ns = n[0]
                    j = bisect(kl, (ns << sh) | n[1])
                    del kl[j]
                    del bl[j]
                    nn = n[3]
                    b[3] = nn
                    if nn:
                        nn[2] = b
                    s += ns
                b[0] = s
                b[4] = True
                key = (s << sh) | b[1]
                j = bisect(kl, key)
                kl.insert(j, key)
                bl.insert(j, b)
                if gc_on:
                    gcb[b[1]] = self.gcc
            elif op == 0:  # _OP_ALLOC
                kl = keys[lk]
                b = None
                if fast:
                    i = bisect(kl, rs << sh)
                    if i < len(kl):
                        key = kl[i]
                        if not mss_on or key >> sh < (mss if rs < mss else rs + nsr):
                            del kl[i]
                            b = blks[lk].pop(i)
                            b[4] = False
                elif exp_hit:
                    # get_free_block's expandable walk, inline: best fit by "free block
                    # + the unmapped range after it" (state None marks unmapped).
                    i = bisect(kl, rs << sh)
                    nk = len(kl)
                    if i < nk:
                        bl = blks[lk]
                        c = bl[i]
                        nb = c[3]
                        cur = c[0] + nb[0] if nb and nb[4] is None else c[0]
                        while i + 1 < nk:
                            c = bl[i + 1]
                            nb = c[3]
                            nxt = c[0] + nb[0] if nb and nb[4] is None else c[0]
                            if nxt >= cur:
                                break
                            i += 1
                            cur = nxt
                        key = kl[i]
                        if not mss_on or key >> sh < (mss if rs < mss else rs + nsr):
                            del kl[i]
                            b = bl.pop(i)
                            b[4] = False
                else:
                    b = self.get_free_block(lk, rs)
                if b is None:
                    self.cur = events[k]
                    b = self.miss(lk, rs, allocation_size(rs))
                    if b is None:
                        failed.append(events[k])
                        continue
                rem = b[0] - rs
                if rem > split_over[lk] and rs < split_below[lk]:
                    n = b[3]
                    a = b[1] + rs
                    r = [rem, a, b, n, True]
                    if n:
                        n[2] = r
                    b[3] = r
                    b[0] = rs
                    key = (rem << sh) | a
                    j = bisect(kl, key)
                    kl.insert(j, key)
                    blks[lk].insert(j, r)
                    if gc_on:
                        gcb[a] = self.gcc
                amap[ra] = b
            elif op == _OP_FREE_REQ:  # freed, but in use on another stream until completed
                b = amap.pop(ra, None)
                if b is not None:
                    pend[b[1]] = (b, lk)
                    pmap[ra] = b
            elif op == _OP_FREE_DONE:
                b = pmap.pop(ra, None)
                if b is not None and pend.pop(b[1], None) is not None:
                    self.free_block(lk, b)
            elif op == _OP_OOM:
                self.cur = events[k]
                b = self.get_free_block(lk, rs) or self.miss(lk, rs, allocation_size(rs))
                if b is None:
                    failed.append(events[k])
                    continue
                self.split(lk, b, rs)  # kept to the end: the program never freed it
                if self.cur in self.transient:
                    self.free_block(lk, b)
            elif op == _OP_FLUSH:
                self.cur = events[k]
                self.release_cached(ra)
        return failed

    def run_reference(
        self, events: Any, ops: list[int], raddrs: list[int], sizes: list[int], lks: list[int]
    ) -> list[int]:
        """``run`` written with the methods only (``get_free_block``, ``split``,
        ``free_block``): no inlined rule. Slower; the tests check that ``run``, whose
        hot path inlines those rules for speed, does exactly the same."""
        pend, pmap, amap = self.pend, self.pmap, self.amap
        failed: list[int] = []
        allocation_size = self.cfg.allocation_size
        for k, op, ra, rs, lk in zip(count(), ops, raddrs, sizes, lks):
            if op == _OP_FREE:
                b = amap.pop(ra, None)
                if b is not None:
                    self.free_block(lk, b)
            elif op in (_OP_ALLOC, _OP_OOM):
                self.cur = events[k]
                b = self.get_free_block(lk, rs) or self.miss(lk, rs, allocation_size(rs))
                if b is None:
                    failed.append(events[k])
                    continue
                self.split(lk, b, rs)
                if op == _OP_ALLOC:
                    amap[ra] = b
                elif self.cur in self.transient:
                    self.free_block(lk, b)
            elif op == _OP_FREE_REQ:
                b = amap.pop(ra, None)
                if b is not None:
                    pend[b[_ADDR]] = (b, lk)
                    pmap[ra] = b
            elif op == _OP_FREE_DONE:
                b = pmap.pop(ra, None)
                if b is not None and pend.pop(b[_ADDR], None) is not None:
                    self.free_block(lk, b)
            elif op == _OP_FLUSH:
                self.cur = events[k]
                self.release_cached(ra)
        return failed
