"""The explore store (issue 10): the state at an event rebuilt from stored checkpoints equals the
recorded replay's own ``blocks_at``, block by block, on real snapshots; the store survives ``.npz``."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.allocator.recorded import recorded_replay
from analysis.explore import CHECKPOINT_EVERY, StoredExplorer, checkpoint_events, explore_store, store_of_snapshot
from analysis.reader import read_snapshot
from analysis.report import build_report
from analysis.stacks import BACKWARD_NO_FRAMES, StackCatalog

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURES = FIXTURES / "captures"

# Complete traces, incomplete ones (wrapped ring, history started late: a rebuilt initial state),
# expandable segments (mapped ranges), max_split, two devices, and captures under each setting.
CASES = [
    FIXTURES / "gpt_varlen_oom.pickle.gz",
    FIXTURES / "gpt_varlen_expandable.pickle.gz",
    FIXTURES / "gpt_varlen_maxsplit256.pickle.gz",
    FIXTURES / "wrapped_ring.pickle.gz",
    FIXTURES / "two_gpu_pipeline.pickle.gz",
    FIXTURES / "gpu_side_stream.pickle.gz",
    FIXTURES / "gpu_gc_threshold.pickle.gz",
    *sorted(CAPTURES.glob("bert_mlm_c70_*.pickle.gz")),
]


def _probe(n: int, every: int) -> list[int]:
    """The events around every checkpoint (at, before, after) and some in between."""
    out = {-1, 0, n - 1, n - 2, n // 2}
    for k in checkpoint_events(n, every):
        out |= {k - 1, k, k + 1, k + every // 2}
    return sorted(i for i in out if -1 <= i < n)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_state_from_checkpoints_is_the_replays(path: Path) -> None:
    snap = read_snapshot(path)
    for dev in snap.devices:
        n = len(dev.trace)
        assert n > 1
        every = max(5, n // 7)  # 6-7 checkpoints, so most probes are replayed on from one
        explorer = StoredExplorer(store_of_snapshot(snap, dev.device, every=every))
        rep = recorded_replay(snap, dev)  # a fresh replay: blocks_at replays from the start
        for i in _probe(n, every):
            got, want = explorer.blocks_at(i), rep.blocks_at(i)
            assert got.segments == want.segments, f"{path.name} device {dev.device} event {i}"
            if i >= 0:  # and the totals are the replay's columns there
                assert got.figures().allocated == int(rep.allocated[i])
                assert got.figures().reserved == int(rep.reserved[i])
                assert got.figures().largest_free == int(rep.largest_free[i])


def test_store_round_trips_through_npz_and_answers_like_the_snapshot() -> None:
    path = FIXTURES / "big_all_stacks.pickle.gz"  # stacks="all", context="all": frees have their own stacks
    snap = read_snapshot(path)
    dev = snap.devices[0]
    store = store_of_snapshot(snap, 0, every=20_000)
    buf = io.BytesIO()
    np.savez(buf, **store)  # type: ignore[arg-type]
    loaded = np.load(io.BytesIO(buf.getvalue()), allow_pickle=False)
    explorer = StoredExplorer({k: loaded[k] for k in loaded.files})
    trace = dev.trace
    alloc = int(np.flatnonzero(trace.action == 0)[1000])
    info = explorer.block(alloc)
    assert [f["name"] for f in info["alloc_frames"]] == [f.name for f in snap.stacks.frames_of(int(trace.stack[alloc]))]
    assert info["free_event"] is not None and int(trace.addr[info["free_event"]]) == int(trace.addr[alloc])
    assert info["free_frames"] == [
        {"filename": f.filename, "line": f.line, "name": f.name}
        for f in snap.stacks.frames_of(int(trace.stack[info["free_event"]]))
    ]
    rep = recorded_replay(snap, dev)
    i = 123_456
    state = explorer.state_at(i)
    assert state["allocated_bytes"] == int(rep.allocated[i]) and state["reserved_bytes"] == int(rep.reserved[i])
    assert state["free_records_stack"] is True
    with pytest.raises(KeyError):
        explorer.block(0)  # a segment_alloc, not an allocation


def test_report_keeps_its_figures_with_the_store_made_from_its_replay() -> None:
    """build_report(explore=...) adds checkpoints to its own replay's pass: the report is unchanged
    and the store equals one made from the snapshot alone."""
    path = FIXTURES / "gpt_varlen_oom.pickle.gz"  # 36,316 events: checkpoints after 16,383 and 32,767
    stores: dict[int, dict[str, np.ndarray]] = {}
    with_store = build_report(path, explore=lambda d, s: stores.__setitem__(d, s))
    plain = build_report(path)
    with_store["source"].pop("analysed_at", None)
    plain["source"].pop("analysed_at", None)
    assert with_store == plain
    assert sorted(stores) == [0]
    store = stores[0]
    assert store["ck_index"].tolist() == [-1, CHECKPOINT_EVERY - 1, 2 * CHECKPOINT_EVERY - 1, 36_315]
    snap = read_snapshot(path)
    alone = explore_store(snap, snap.devices[0], StackCatalog(snap.stacks), recorded_replay(snap, snap.devices[0]))
    assert sorted(store) == sorted(alone)
    for key in store.keys() - {"labels"}:
        np.testing.assert_array_equal(store[key], alone[key], err_msg=key)
    # The report adds pseudo groups to its catalog ("allocated before the trace began", ...): their
    # labels come on top; every group of the snapshot's own is labelled the same.
    labels, own = (json.loads(bytes(s["labels"]).decode()) for s in (store, alone))
    # The groups of gpt_varlen_oom's 27 stacks and the backward pass's frame-less one (issue 35: its
    # events are named so in the event list, not "unknown / no frames").
    assert own.items() <= labels.items() and len(own) == 28
    assert own["27"] == BACKWARD_NO_FRAMES and int(np.count_nonzero(store["group"] == 27)) > 1000


def test_store_made_after_the_report_equals_the_one_made_within(monkeypatch: pytest.MonkeyPatch) -> None:
    """build_report(explore_later=...) hands each device's store as a function the caller runs once the
    report is out (the worker's child, issue 34): the report is the same, no store is made inside
    build_report, and each made afterwards equals the one ``explore=`` gets, on two devices."""
    import analysis.explore as explore_mod

    path = FIXTURES / "two_gpu_pipeline.pickle.gz"
    within: dict[int, dict[str, np.ndarray]] = {}
    makers: dict[int, Callable[[], dict[str, np.ndarray]]] = {}
    made: list[int] = []
    real = explore_mod.explore_store

    def counted(*args: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(explore_mod, "explore_store", counted)
    deferred = build_report(path, explore_later=makers.__setitem__)
    assert made == [], "a store was made before the report was returned"
    stores = {d: make() for d, make in makers.items()}
    assert len(made) == len(makers) == 2
    plain = build_report(path, explore=within.__setitem__)
    deferred["source"].pop("analysed_at", None)
    plain["source"].pop("analysed_at", None)
    assert deferred == plain
    assert sorted(stores) == sorted(within) == [0, 1]
    for device, store in stores.items():
        assert sorted(store) == sorted(within[device])
        for key in store:
            np.testing.assert_array_equal(store[key], within[device][key], err_msg=f"{device} {key}")
