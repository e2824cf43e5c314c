"""The differential bench: the allocator model against real runs of the real allocator.

    python3 scripts/diffbench.py [DIR ...] [--only SUBSTRING] [--json FILE] [-v]

DIRs default to tests/fixtures/captures (the bench's captures under 400 KB) and tests/fixtures. Every
``NAME.pickle.gz`` with a ``NAME.truth.json`` beside it is one capture: a real
snapshot and what the same process said about itself (``memory_stats``, the
settings, the cap, the OOM message, ``died_step``). For each capture, under its
recorded settings:

- ``replay``: the policy replay (``analysis.allocator.replay_check``) reproduces
  every recorded segment event and fails exactly the recorded OOM requests, n/n;
  only complete traces count (a wrapped ring buffer is never called exact);
- ``ooms``: of those with OOMs, the recorded OOMs failed in the replay too;
- ``layout``: the model's final segments and blocks (size and state, in address
  order) equal the snapshot's final ``segments``;
- ``peak``: the replay's peak reserved memory against ``reserved_bytes.all.peak``.

Captures come in families (truth key ``family``, else the same workload, kwargs
and cap): the same program under different ``PYTORCH_CUDA_ALLOC_CONF``. From the
family's default run (empty conf), the what-if of each other member's setting,
under the real cap (``cap_bytes``; the device's memory without one), is compared
with that member's real run:

- ``oom``: the what-if fails at the same request as the real run did (requests
  are counted in order, ``alloc`` and ``oom`` entries; the programs are seeded
  alike), or fails nowhere where the real run never died. When the real run died
  at a request the default run never reached (it died first), the default
  trace cannot show it: ``beyond`` (a step-level projection is needed; not
  counted as a pass or a fail);
- ``peak``: where neither run died, the what-if's peak reserved memory within 1 %
  of the real run's.

- self-consistency (issue 23): the what-if's segment events against those of the
  member's own trace replayed under its own settings and the same cap, over the
  requests before the first one where the two traces differ; once with the
  placement model (must agree: one answer from either trace) and once with the
  member's recorded addresses (how often the model's placement is the driver's);
- the what-if again with new segments in the opposite order: where its first
  failing request moves, the answer hangs on placement.

Prints one row per capture, one per what-if, a self-consistency table per family,
then totals; the held-out reproducer pair in ../shared/snapshots/reproducers apart
when present. Exits 1 if anything failed. ``make diffbench`` runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.allocator import (  # noqa: E402
    allowed_for_fraction,
    recorded_layout,
    recorded_segment_events,
    replay_check,
    same_layout,
    simulate,
    simulate_layout,
)
from analysis.allocator.config import AllocatorConfig  # noqa: E402
from analysis.allocator.policy import placement_for  # noqa: E402
from analysis.allocator.requests import _OP_ALLOC, _OP_FLUSH, _OP_OOM, Requests, requests_for  # noqa: E402
from analysis.model import ALLOC, FREE_COMPLETED, FREE_REQUESTED, OOM, DeviceData, Snapshot  # noqa: E402
from analysis.reader import read_snapshot  # noqa: E402

DEFAULT_DIRS = [ROOT / "tests" / "fixtures" / "captures", ROOT / "tests" / "fixtures"]
# Held-out pairs kept outside the repository (never copied in); checked apart when present.
SHARED_REPRODUCERS = ROOT.parent / "shared" / "snapshots" / "reproducers"
PEAK_TOLERANCE = 0.01  # what-if peak reserved vs the real run's, where neither died


def real_cap(truth: dict[str, Any]) -> int:
    """The cap the allocator really had: capture_diff set the fraction ``cap_bytes / total_memory``."""
    cap, total = int(truth["cap_bytes"]), truth.get("total_memory")
    return allowed_for_fraction(cap / total, int(total)) if total else cap


@dataclass
class Capture:
    name: str
    path: Path
    truth: dict[str, Any]

    @property
    def conf(self) -> str:
        return str(self.truth.get("alloc_conf", self.truth.get("conf", "")) or "")

    @property
    def family(self) -> str:
        fam = self.truth.get("family")
        if fam:
            return str(fam)
        kwargs = json.dumps(self.truth.get("kwargs") or {}, sort_keys=True)
        return f"{self.truth.get('workload')}:{kwargs}:{self.cap}"

    @property
    def cap(self) -> int | None:
        """The per-process cap the run had (bytes), None without one."""
        if self.truth.get("cap_bytes"):
            return real_cap(self.truth)
        kwargs = self.truth.get("kwargs") or {}
        if isinstance(kwargs, dict) and kwargs.get("cap_gib"):
            return int(float(kwargs["cap_gib"]) * (1 << 30))
        return None

    @property
    def died(self) -> bool:
        return self.truth.get("oom_message") is not None


@dataclass
class Row:
    name: str
    device: int
    events: int
    complete: bool
    recorded: int = 0
    reproduced: int = 0
    exact: bool = False
    ooms: int = 0  # recorded OOM entries
    ooms_ok: bool = True  # the replay failed exactly those requests
    layout: bool | None = None
    peak_model: int = 0
    peak_truth: int | None = None
    first_mismatch: Any = None
    exact_under_cap: bool | None = None  # inexact replays: exact given the real cap instead of the inferred limit?
    seconds: float = 0.0

    @property
    def peak_error(self) -> float | None:
        if not self.peak_truth:
            return None
        return abs(self.peak_model - self.peak_truth) / self.peak_truth


@dataclass
class WhatIfRow:
    family: str
    base: str
    member: str
    conf: str
    limit: int | None
    real_oom: int | None  # request ordinal of the member's first OOM
    model_oom: int | None  # request ordinal of the what-if's first failure
    base_requests: int  # requests in the default run's trace
    diverges_at: int | None  # first request whose size differs between the two runs
    real_peak: int | None
    model_peak: int
    status: str = ""  # same | differ | beyond
    peak_ok: bool | None = None
    notes: list[str] = field(default_factory=list)
    # Self-consistency (no GPU): the what-if from the default trace against the replay of the
    # member's own trace under its own settings and the real cap, segment event for segment
    # event, up to the first request where the two traces differ.
    same_requests: int = 0  # requests the two traces share from the start
    consistent_events: int = 0  # segment events compared (the member's replay, before that request)
    # One answer from either trace: the member's own trace replayed as a what-if of its own
    # settings (the placement model, not its recorded addresses) gives the same segment events.
    consistent: bool = True
    first_disagreement: str | None = None
    # The same against the exact replay of the member's trace (the driver's real addresses): where
    # it differs, the placement model put a segment on the other side of an equal free block.
    agrees_with_real: bool = True
    first_real_disagreement: str | None = None
    # The opposite order of new segments (placement.MirrorPlacement): the what-if's answer again.
    mirror_oom: int | None = None
    placement_certain: bool = True


def find_captures(dirs: list[Path], only: str | None) -> list[Capture]:
    seen: dict[str, Capture] = {}
    for d in dirs:
        if not d.is_dir():
            continue
        for truth_path in sorted(d.glob("*.truth.json")):
            name = truth_path.name.removesuffix(".truth.json")
            pkl = d / f"{name}.pickle.gz"
            if not pkl.exists() or name in seen or (only and only not in name):
                continue
            seen[name] = Capture(name, pkl, json.loads(truth_path.read_text()))
    return list(seen.values())


def device_truth(truth: dict[str, Any], device: int) -> dict[str, Any]:
    per = truth.get("memory_stats_per_device") or [truth.get("memory_stats") or {}]
    return per[device] if device < len(per) else {}


def is_complete(cap: Capture, snap: Snapshot) -> bool:
    if "trace_complete" in cap.truth:
        return bool(cap.truth["trace_complete"])
    if cap.name == "state_only":  # enabled="state": one event; the truth does not say so
        return False
    counts = cap.truth.get("n_trace_events") or [len(d.trace) for d in snap.devices]
    counts = counts if isinstance(counts, list) else [counts]
    max_entries = cap.truth.get("max_entries") or 0
    return not max_entries or all(n < max_entries for n in counts)


def check_capture(cap: Capture, snap: Snapshot) -> list[Row]:
    rows = []
    complete = is_complete(cap, snap)
    cfg = AllocatorConfig.from_settings(snap.settings.raw, snap.settings.conf)
    for dev in snap.devices:
        if not len(dev.trace):
            continue
        t0 = time.perf_counter()
        rc = replay_check(snap, dev)
        row = Row(cap.name, dev.device, len(dev.trace), complete and rc["trace_complete"])
        row.recorded, row.reproduced = rc["segment_events_recorded"], rc["segment_events_reproduced"]
        row.exact = bool(rc["exact"])
        row.ooms, row.ooms_ok = len(rc["ooms_recorded"]), bool(rc["ooms_reproduced"])
        row.first_mismatch = rc["first_mismatch"]
        row.peak_model = int(rc["peak_reserved_bytes"])
        stats = device_truth(cap.truth, dev.device)
        row.peak_truth = stats.get("reserved_bytes.all.peak")
        if row.complete:
            _res, layout = simulate_layout(snap, dev, cfg, rc["limit_bytes"])
            row.layout = same_layout(layout, recorded_layout(dev))
        if row.complete and not row.exact and cap.cap is not None:
            # The allocator rules alone: the same replay under the cap the process really had.
            res = simulate(snap, dev, cfg, cap.cap)
            row.exact_under_cap = res.segment_events == recorded_segment_events(dev)
        row.seconds = time.perf_counter() - t0
        rows.append(row)
    return rows


def request_ordinals(dev: DeviceData) -> tuple[np.ndarray, np.ndarray]:
    """Event indices of the requests (alloc and oom entries, in order) and their sizes."""
    act = dev.trace.action
    idx = np.flatnonzero((act == ALLOC) | (act == OOM))
    return idx, dev.trace.size[idx]


def first_oom_ordinal(dev: DeviceData) -> int | None:
    idx, _sizes = request_ordinals(dev)
    ooms = np.flatnonzero(dev.trace.action[idx] == OOM)
    return int(ooms[0]) if ooms.size else None


def whatif_rows(caps: list[Capture], snaps: dict[str, Snapshot]) -> list[WhatIfRow]:
    families: dict[str, list[Capture]] = defaultdict(list)
    for cap in caps:
        families[cap.family].append(cap)
    out: list[WhatIfRow] = []
    for fam, members in sorted(families.items()):
        bases = [m for m in members if m.conf == ""]
        if not bases or len(members) < 2:
            continue
        base = bases[0]
        bsnap = snaps[base.name]
        bdev = bsnap.devices[0]
        bidx, _bsizes = request_ordinals(bdev)
        recorded = AllocatorConfig.from_settings(bsnap.settings.raw, bsnap.settings.conf)
        limit = base.cap or int(base.truth.get("total_memory") or 0) or None
        for m in members:
            if m is base or m.conf == base.conf:  # the same settings: a workload variant, not a what-if
                continue
            msnap = snaps[m.name]
            mdev = msnap.devices[0]
            midx, _msizes = request_ordinals(mdev)
            cfg = AllocatorConfig.parse(m.conf, base=recorded)
            res = simulate(bsnap, bdev, cfg, limit, placement=placement_for(cfg, recorded))
            model_oom = int(np.searchsorted(bidx, res.oom)) if res.oom is not None else None
            mirror = simulate(bsnap, bdev, cfg, limit, placement="mirror")
            mirror_oom = int(np.searchsorted(bidx, mirror.oom)) if mirror.oom is not None else None
            real_oom = first_oom_ordinal(mdev)
            diverges = _diverges(bdev, bidx, mdev, midx)
            row = WhatIfRow(
                fam,
                base.name,
                m.name,
                m.conf,
                limit,
                real_oom,
                model_oom,
                len(bidx),
                diverges,
                device_truth(m.truth, 0).get("reserved_bytes.all.peak"),
                res.peak_reserved,
            )
            row.mirror_oom = mirror_oom
            row.placement_certain = mirror_oom == model_oom
            _self_consistency(row, bsnap, bdev, res, msnap, mdev, m.cap or limit)
            upto = min(x for x in (real_oom, model_oom, len(bidx)) if x is not None)
            if not is_complete(base, bsnap):
                row.status = "partial"  # a what-if of a trace that starts mid-run
            elif diverges is not None and diverges < upto:
                row.status = "diverged"  # the program asked for other things from there on
                row.notes.append(f"requests differ from #{diverges}")
            elif model_oom == real_oom:
                row.status = "same"
            elif model_oom is None and real_oom is not None and real_oom >= len(bidx):
                row.status = "beyond"  # the default run died before the request the real run failed at
            elif model_oom is None and real_oom is None:
                row.status = "same"
            else:
                row.status = "differ"
            late = _completions_differ(bdev, mdev) if row.status == "differ" or not (base.died or m.died) else None
            freed = _frees_diverge(bdev, mdev) if row.status == "differ" else None
            if freed is not None and freed <= upto:
                # The program freed in another order (autograd's, Python's): not the same
                # request stream any more, so the what-if cannot be held to the real run.
                row.status = "diverged"
                row.notes.append(f"frees in another order from request #{freed}")
            elif row.status == "differ" and late is not None and late <= upto:
                # A cross-stream free (record_stream) completes when the allocator sees its
                # event done: GPU timing, not the program. The two real runs saw the same
                # free complete at different requests; the what-if has the default run's.
                row.status = "timing"
                row.notes.append(f"deferred frees complete elsewhere from request #{late}")
            if row.status == "partial" and not base.died and not m.died and row.real_peak:
                # A trace that starts mid-run (issue 23): the what-if's peak against the real one, told, not
                # counted (the state before the trace, and so the peak, is not known: docs/allocator.md).
                row.notes.append(
                    f"peak {row.model_peak / 1e9:.2f} GB, real {row.real_peak / 1e9:.2f} GB "
                    f"({(row.model_peak - row.real_peak) / row.real_peak:+.1%}), not counted"
                )
            if row.status in ("same", "differ") and not base.died and not m.died and row.real_peak:
                row.peak_ok = abs(row.model_peak - row.real_peak) <= PEAK_TOLERANCE * row.real_peak
                if not row.peak_ok and late is not None:
                    row.peak_ok = None  # the same timing caveat: the peak cannot be compared
                    row.notes.append(f"peak not compared: deferred frees complete elsewhere from request #{late}")
            out.append(row)
    return out


def stream_keys(req: Requests) -> list[tuple[int, int, int, int]]:
    """One comparable key per request: (op, size, lane, the request that allocated the
    block a free frees, -1 otherwise). Two runs of one program make the same requests
    as long as these are equal; recorded addresses are left out (each run has its own
    driver's). A flush's key carries nothing but its op."""
    lanes = [0] * len(req.ops) if req.lane is None else req.lane.tolist()
    sizes = req.sizes.tolist()
    owner: dict[int, int] = {}
    keys = []
    for k, (op, ra) in enumerate(zip(req.ops, req.raddrs, strict=True)):
        if op == _OP_FLUSH:
            keys.append((op, 0, 0, -1))
            continue
        if op in (_OP_ALLOC, _OP_OOM):
            if op == _OP_ALLOC:
                owner[ra] = k
            keys.append((op, sizes[k], lanes[k], -1))
        else:
            keys.append((op, sizes[k], lanes[k], owner.get(ra, -1)))
    return keys


def _self_consistency(
    row: WhatIfRow, bsnap: Snapshot, bdev: DeviceData, res: Any, msnap: Snapshot, mdev: DeviceData, cap: int | None
) -> None:
    """Fill ``row``'s self-consistency fields: the what-if ``res`` (the member's settings replayed
    on the default trace) against the replay of the member's own trace under its recorded
    settings (its own addresses: the exact replay) and the same cap, segment event for segment
    event, over the requests before the first one where the two traces differ."""
    breq, mreq = requests_for(bsnap, bdev), requests_for(msnap, mdev)
    bkeys, mkeys = stream_keys(breq), stream_keys(mreq)
    n = min(len(bkeys), len(mkeys))
    d = next((k for k in range(n) if bkeys[k] != mkeys[k]), n)
    modelled = simulate(msnap, mdev, mreq.recorded_config, cap, requests=mreq, placement="driver")
    real = simulate(msnap, mdev, mreq.recorded_config, cap, requests=mreq)

    def before(result: Any, req: Any) -> list[tuple[str, int]]:
        # A segment event happens while serving a request (its event index is the request's);
        # req.events is not sorted where a malloc flush's completions moved after its request.
        position = {int(e): k for k, e in enumerate(req.events.tolist())}
        return [e for e, i in zip(result.segment_events, result.segment_event_index, strict=True) if position[i] < d]

    def first_difference(a: list[tuple[str, int]], b: list[tuple[str, int]]) -> str:
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        return f"segment event {k}: what-if {a[k] if k < len(a) else None}, own trace {b[k] if k < len(b) else None}"

    a, b, c = before(res, breq), before(modelled, mreq), before(real, mreq)
    row.same_requests = d
    row.consistent_events = len(b)
    row.consistent = a == b
    if not row.consistent:
        row.first_disagreement = first_difference(a, b)
    row.agrees_with_real = a == c
    if not row.agrees_with_real:
        row.first_real_disagreement = first_difference(a, c)


def _diverges(bdev: DeviceData, bidx: np.ndarray, mdev: DeviceData, midx: np.ndarray) -> int | None:
    """The first request after which the two runs' request streams stop being the same
    program's (None: the same as far as both go).

    Both are alloc entries of different sizes; or one run failed a request (an oom
    entry) where the other served it, and the next requests differ too: the program
    caught the OOM and took another path (cuDNN trying a smaller workspace).
    """
    n = min(len(bidx), len(midx))
    ba, ma = bdev.trace.action[bidx[:n]], mdev.trace.action[midx[:n]]
    bs, ms = bdev.trace.size[bidx[:n]], mdev.trace.size[midx[:n]]
    both = (ba == ALLOC) & (ma == ALLOC)
    differ = np.flatnonzero(both & (bs != ms))
    first = int(differ[0]) if differ.size else None
    kinds = np.flatnonzero(ba != ma)
    for k in kinds.tolist():
        if first is not None and k >= first:
            break
        if k + 1 < n and (ba[k + 1] != ma[k + 1] or bs[k + 1] != ms[k + 1]):
            return k
    return first


def _frees_diverge(bdev: DeviceData, mdev: DeviceData) -> int | None:
    """The request count at which the two runs first free different sizes (the
    program's frees in another order: autograd's or Python's, not the allocator's),
    None if they never do before one trace ends. oom entries are skipped."""

    def frees(dev: DeviceData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        t = dev.trace
        sel = np.flatnonzero((t.action == ALLOC) | (t.action == FREE_REQUESTED))
        req = np.cumsum((t.action == ALLOC) | (t.action == OOM))
        return t.action[sel], t.size[sel], req[sel]

    ba, bs, br = frees(bdev)
    ma, ms, _mr = frees(mdev)
    n = min(len(ba), len(ma))
    bad = np.flatnonzero((ba[:n] != ma[:n]) | (bs[:n] != ms[:n]))
    return int(br[bad[0]]) if bad.size else None


def _completions_differ(bdev: DeviceData, mdev: DeviceData) -> int | None:
    """The first request at which the two runs' deferred frees (free_completed
    entries not right after their free_requested) stop completing alike: the
    request count at each completion, and the size freed, compared in order."""

    def completions(dev: DeviceData) -> list[tuple[int, int]]:
        t = dev.trace
        act = t.action
        req = np.cumsum((act == ALLOC) | (act == OOM))
        fr, fc = act == FREE_REQUESTED, act == FREE_COMPLETED
        paired = np.zeros(len(t), bool)
        paired[1:] = fr[:-1] & fc[1:] & (t.addr[1:] == t.addr[:-1])
        late = np.flatnonzero(fc & ~paired)
        return list(zip(req[late].tolist(), t.size[late].tolist(), strict=True))

    a, b = completions(bdev), completions(mdev)
    for x, y in zip(a, b, strict=False):
        if x != y:
            return min(x[0], y[0])
    if len(a) != len(b):
        longer = a if len(a) > len(b) else b
        return longer[min(len(a), len(b))][0]
    return None


def print_consistency(wrows: list[WhatIfRow]) -> None:
    """Per family: what-ifs whose answer from the default trace equals the replay of the member's
    own trace (segment events, before the first request where the traces differ), and the first
    disagreement."""
    fams: dict[str, list[WhatIfRow]] = defaultdict(list)
    for w in wrows:
        fams[w.family].append(w)
    print()
    print(f"{'self-consistency (family)':32} {'agree':>6} {'events':>7} {'real':>6}  first disagreement")
    for fam, rows in sorted(fams.items()):
        bad = next((w for w in rows if not w.consistent), None)
        off = next((w for w in rows if not w.agrees_with_real), None)
        first = "-" if bad is None else f"{bad.member}: {bad.first_disagreement}"
        if off is not None:
            first += f"; with the real addresses: {off.member}: {off.first_real_disagreement}"
        agree = f"{sum(w.consistent for w in rows)}/{len(rows)}"
        real = f"{sum(w.agrees_with_real for w in rows)}/{len(rows)}"
        print(f"{fam[:32]:32} {agree:>6} {sum(w.consistent_events for w in rows):>7} {real:>6}  {first}")


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):,.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", type=Path)
    ap.add_argument("--only", help="only captures whose name contains this")
    ap.add_argument("--json", type=Path, help="write every row here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the first mismatch of inexact replays")
    args = ap.parse_args(argv)
    dirs = args.dirs or [d for d in DEFAULT_DIRS if d.is_dir()]
    caps = find_captures(dirs, args.only)
    t0 = time.perf_counter()
    snaps: dict[str, Snapshot] = {}
    rows: list[Row] = []
    print(f"{'capture':34} {'dev':>3} {'events':>7} {'replay':>11} {'layout':>6} {'peak MiB':>10} {'err':>7}  s")
    for cap in caps:
        snap = read_snapshot(cap.path)
        snaps[cap.name] = snap
        for row in check_capture(cap, snap):
            rows.append(row)
            rep = f"{row.reproduced}/{row.recorded}" + ("" if row.complete else "*")
            mark = "" if not row.complete or row.exact else (" X" if row.ooms_ok else " X (OOMs not reproduced)")
            layout = "-" if row.layout is None else ("ok" if row.layout else "DIFF")
            err = "-" if row.peak_error is None else f"{row.peak_error:.2%}"
            print(
                f"{row.name:34} {row.device:>3} {row.events:>7} {rep:>11} {layout:>6} "
                f"{_mib(row.peak_model):>10} {err:>7} {row.seconds:5.2f}{mark}"
            )
            if args.verbose and row.complete and not row.exact:
                print(f"    first mismatch: {row.first_mismatch}")
    wrows = whatif_rows(caps, snaps)
    if wrows:
        print()
        print(
            f"{'what-if (from the default run)':34} {'conf':38} {'real oom':>8} {'model':>6} {'reqs':>6} status  peak"
        )
        for w in wrows:
            peak = (
                "-"
                if w.peak_ok is None
                else (
                    f"{'ok' if w.peak_ok else 'OFF'} {abs(w.model_peak - (w.real_peak or 0)) / (w.real_peak or 1):.2%}"
                )
            )
            ro = "-" if w.real_oom is None else str(w.real_oom)
            mo = "-" if w.model_oom is None else str(w.model_oom)
            notes = ("  " + "; ".join(w.notes)) if w.notes else ""
            if not w.placement_certain:
                notes += f"  the other tie order fails at {w.mirror_oom}"
            print(f"{w.member:34} {w.conf[:38]:38} {ro:>8} {mo:>6} {w.base_requests:>6} {w.status:6}  {peak}{notes}")
        print_consistency(wrows)
    complete = [r for r in rows if r.complete]
    exact = sum(r.exact for r in complete)
    layouts = [r for r in complete if r.layout is not None]
    peaks = [r for r in complete if r.peak_error is not None]
    worst = max(peaks, key=lambda r: r.peak_error or 0.0, default=None)
    print()
    print(
        f"captures: {len(caps)} ({len(rows)} device traces, {len(complete)} complete), "
        f"families with a default run: {len({w.family for w in wrows})}, what-ifs: {len(wrows)}"
    )
    print(f"exact replays (every segment event and OOM, complete traces): {exact}/{len(complete)}")
    with_ooms = [r for r in complete if r.ooms]
    print(
        f"  recorded OOMs failed in the replay too: {sum(r.ooms_ok for r in with_ooms)}/{len(with_ooms)} traces "
        f"with OOMs ({sum(r.ooms for r in with_ooms)} OOM entries)"
    )
    under_cap = [r for r in complete if r.exact_under_cap is not None]
    if under_cap:
        print(
            f"  of the inexact ones, exact under the real cap (the limit inferred from the trace is what is off): "
            f"{sum(bool(r.exact_under_cap) for r in under_cap)}/{len(complete) - exact}"
        )
    print(f"final layout equal to the snapshot's segments: {sum(bool(r.layout) for r in layouts)}/{len(layouts)}")
    if worst is not None:
        print(
            f"replayed peak reserved equal to memory_stats: {sum(r.peak_error == 0 for r in peaks)}/{len(peaks)}; "
            f"worst {worst.peak_error:.3%} ({worst.name})"
        )
    counted = [w for w in wrows if w.status in ("same", "differ")]
    print(
        f"what-if OOM at the real run's request (or none where it had none): "
        f"{sum(w.status == 'same' for w in counted)}/{len(counted)}; not comparable: "
        f"{sum(w.status == 'beyond' for w in wrows)} beyond the default trace (the real run died later), "
        f"{sum(w.status == 'diverged' for w in wrows)} diverged (the program asked for other sizes first), "
        f"{sum(w.status == 'timing' for w in wrows)} with deferred frees completing at other requests in the real run, "
        f"{sum(w.status == 'partial' for w in wrows)} of a partial trace"
    )
    pk = [w for w in wrows if w.peak_ok is not None]
    if pk:
        worst_w = max(pk, key=lambda w: abs(w.model_peak - (w.real_peak or 0)) / (w.real_peak or 1))
        err_w = abs(worst_w.model_peak - (worst_w.real_peak or 0)) / (worst_w.real_peak or 1)
        print(
            f"what-if peak reserved within 1% where neither died: {sum(bool(w.peak_ok) for w in pk)}/{len(pk)}; "
            f"worst {err_w:.2%} ({worst_w.member})"
        )
    print(
        f"self-consistency (what-if from the default trace = replay of the member's own trace, up to the first "
        f"request that differs): {sum(w.consistent for w in wrows)}/{len(wrows)} what-ifs, "
        f"{sum(w.consistent_events for w in wrows if w.consistent)} segment events compared; "
        f"against the exact replay of the member's trace (its real addresses): "
        f"{sum(w.agrees_with_real for w in wrows)}/{len(wrows)}; "
        f"what-ifs whose first failing request moves with the tie order: {sum(not w.placement_certain for w in wrows)}"
    )
    if not args.dirs and SHARED_REPRODUCERS.is_dir():
        shared = find_captures([SHARED_REPRODUCERS], args.only)
        shared_snaps = {c.name: read_snapshot(c.path) for c in shared}
        srows = whatif_rows(shared, shared_snaps)
        print(f"reproducers ({SHARED_REPRODUCERS}, not in the repository):")
        for w in srows:
            print(
                f"  {w.member}: {w.conf}: real oom at request {w.real_oom}, what-if {w.model_oom} ({w.status}); "
                f"other tie order {w.mirror_oom}; self-consistent {w.consistent} over {w.consistent_events} "
                f"segment events ({w.same_requests} requests alike), with the real addresses {w.agrees_with_real}"
                + (f"; first disagreement {w.first_disagreement}" if w.first_disagreement else "")
            )
        wrows_failed = any(w.status == "differ" or not w.consistent for w in srows)
    else:
        wrows_failed = False
    print(f"{time.perf_counter() - t0:.1f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "captures": [r.__dict__ | {"peak_error": r.peak_error} for r in rows],
                    "whatifs": [w.__dict__ for w in wrows],
                },
                indent=1,
                default=str,
            )
        )
    failed = (
        (exact < len(complete))
        or any(r.layout is False for r in layouts)
        or any(w.status == "differ" or w.peak_ok is False or not w.consistent for w in wrows)
        or wrows_failed
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
