"""Stacks: filtering, attribution to user code, conservation of bytes at every moment."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.model import ALLOC, FREE_REQUESTED, Frame, Snapshot, StackTable, address_order, address_runs
from analysis.reader import read_snapshot
from analysis.report import build_report
from analysis.stacks import (
    TRAIT_BACKWARD,
    TRAIT_MODULE_APPLY,
    TRAIT_OPTIMIZER,
    UNKNOWN_LABEL,
    StackCatalog,
    alloc_lifetimes,
    is_user_frame,
    top_entries,
    totals_by_group,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@cache
def snap(case: str) -> Snapshot:
    return read_snapshot(FIXTURES / f"{case}.pickle.gz")


@cache
def report(case: str) -> dict[str, Any]:
    return build_report(FIXTURES / f"{case}.pickle.gz")


@pytest.mark.parametrize(
    "case", ["gpt_varlen_oom", "frag_oom", "gpt_varlen_expandable", "wrapped_ring", "no_context", "two_gpu_pipeline"]
)
def test_groups_add_up_to_the_live_bytes_at_each_moment(case: str) -> None:
    for dev in report(case)["devices"]:
        rows: dict[str, int] = {}
        for row in dev["top_stacks"]:
            rows[row["when"]] = rows.get(row["when"], 0) + row["bytes"]
        summary = dev["summary"]
        assert rows["peak"] == summary["peak_allocated_bytes"]
        assert rows.get("end", 0) == summary["final_allocated_bytes"]
        if dev["oom"] is not None:
            assert rows.get("oom", 0) == dev["oom"]["allocated_bytes"]
        # The peak moment is the allocated peak itself.
        assert dev["moments"]["peak"] == summary["peak_allocated_event_index"]


def test_big_all_stacks_filters_interpreter_and_dispatcher_frames() -> None:
    s = snap("big_all_stacks")
    catalog = StackCatalog(s.stacks)
    assert len(catalog.groups) < len(s.stacks.stacks)
    names = [f.name for g in catalog.groups for f in g.frames]
    for noise in (
        "_PyEval_EvalFrameDefault",
        "c10::impl::wrap_kernel_functor",
        "torch::unwind::unwind",
        "DeviceCachingAllocator::malloc",
        "__libc_start_main",
        "_call_impl",
    ):
        assert not any(noise in n for n in names), noise
    # C++-only backward stacks are named by the autograd node that allocated.
    labels = [g.label for g in catalog.groups]
    assert any("AddmmBackward0" in label for label in labels)
    backward = [g for g in catalog.groups if g.traits & TRAIT_BACKWARD]
    assert backward and all(g.site is None for g in backward if "Backward" in g.label)
    # Every kept name is short (C++ symbols reduced to an op or node name).
    assert max(len(n) for n in names) < 200


def test_groups_are_attributed_to_the_first_user_frame() -> None:
    s = snap("gpt_varlen_oom")
    catalog = StackCatalog(s.stacks)
    for g in catalog.groups[1:]:
        assert g.site is not None and g.site.filename.endswith("capture.py")
        assert g.site == next(f for f in g.frames if is_user_frame(f))
        assert not any(f.name == "_wrapped_call_impl" for f in g.frames)
    traits = {g.label: g.traits for g in catalog.groups}
    assert any(t & TRAIT_OPTIMIZER for label, t in traits.items() if "_init_group" in label)
    assert any(t & TRAIT_MODULE_APPLY for label, t in traits.items() if "<lambda>" in label)


def test_no_frames_fall_in_the_unknown_group() -> None:
    s = snap("no_context")
    catalog = StackCatalog(s.stacks)
    assert [g.label for g in catalog.groups] == [UNKNOWN_LABEL]
    rows = [r for r in report("no_context")["devices"][0]["top_stacks"] if r["when"] == "peak"]
    assert len(rows) == 1 and rows[0]["label"] == UNKNOWN_LABEL and rows[0]["frames"] == []


def test_totals_are_exact_and_top_entries_fold_the_rest() -> None:
    s = snap("big_all_stacks")
    catalog = StackCatalog(s.stacks)
    t = s.devices[0].trace
    m = t.action == ALLOC
    totals = totals_by_group(catalog, t.stack[m], t.size[m])
    assert sum(x.bytes for x in totals) == int(t.size[m].sum())
    assert [x.bytes for x in totals] == sorted((x.bytes for x in totals), reverse=True)
    rows = top_entries(catalog, totals, "churn", 5)
    assert len(rows) == 6 and rows[-1]["group"] == -1
    assert sum(r["bytes"] for r in rows) == int(t.size[m].sum())


def test_lifetimes_pair_each_alloc_with_its_free() -> None:
    t = snap("gpt_varlen_oom").devices[0].trace
    life = alloc_lifetimes(t.action, t.addr, t.size, t.stack)
    assert life.start.size == int((t.action == ALLOC).sum())
    freed = life.end < life.n_events
    assert (t.action[life.end[freed]] == FREE_REQUESTED).all()
    assert (t.addr[life.end[freed]] == life.addr[freed]).all()
    # Blocks never freed are the live blocks at the end of the trace.
    final_live = sum(
        b.requested_size
        for seg in snap("gpt_varlen_oom").devices[0].segments
        for b in seg.blocks
        if b.state == "active_allocated"
    )
    assert int(life.size[~freed].sum()) == final_live
    # Live requested bytes at the requested peak equal the replay's requested peak
    # (no cross-stream frees here, so requests end at their free request).
    rep = report("gpt_varlen_oom")["devices"][0]["summary"]
    assert int(life.size[life.live_at(rep["peak_requested_event_index"])].sum()) == rep["peak_requested_bytes"]


@pytest.mark.parametrize("values", ["aligned", "wide", "tiny", "any", "few"])
def test_address_order_is_a_stable_sort_by_address(values: str) -> None:
    """The radix sort of ``address_order`` is ``argsort(kind="stable")``, whatever the addresses, and
    ``address_runs`` says which neighbours in it share an address."""
    rng = np.random.default_rng(len(values))
    for n in (0, 1, 2, 7, 1000, 70_000):
        addr = {
            "aligned": 0x7F0000000000 + rng.integers(0, 5000, n) * 512,
            "wide": rng.integers(0, 1 << 47, n),
            "tiny": rng.integers(-3, 3, n),
            "any": rng.integers(-(1 << 63), (1 << 63) - 1, n),
            "few": rng.integers(0, 4, n) << 46,
        }[values].astype(np.int64)
        idx = np.flatnonzero(rng.random(n) < 0.7)
        order, same = address_runs(addr.copy(), idx)
        assert np.array_equal(order, np.argsort(addr[idx], kind="stable"))
        ordered = addr[idx][order]
        assert np.array_equal(same, ordered[1:] == ordered[:-1])
        assert np.array_equal(address_order(addr, idx), order)


def test_address_order_is_kept_for_the_same_events_only() -> None:
    """The last answer is given again for the same column and events, never for other events."""
    rng = np.random.default_rng(7)
    addr = (rng.integers(0, 300, 5000) * 512).astype(np.int64)
    every = np.arange(5000)
    first = address_order(addr, every)
    assert address_order(addr, np.arange(5000)) is first and not first.flags.writeable
    odd = np.arange(1, 5000, 2)
    assert np.array_equal(address_order(addr, odd), np.argsort(addr[odd], kind="stable"))
    other = addr.copy()
    other[:10] = 0
    assert np.array_equal(address_order(other, every), np.argsort(other, kind="stable"))


def test_python_module_wrappers_are_dropped_but_user_frames_kept() -> None:
    table = StackTable(
        frames=[
            Frame("/x/site-packages/torch/nn/modules/linear.py", 134, "forward"),
            Frame("/x/site-packages/torch/nn/modules/module.py", 1790, "_call_impl"),
            Frame("/home/me/train.py", 12, "forward"),
            Frame("??", 0, "_PyEval_EvalFrameDefault"),
            Frame("Functions.cpp", 0, "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),
        ],
        stacks=[(0, 1, 2, 3), (4, 3)],
    )
    catalog = StackCatalog(table)
    g = catalog.groups[int(catalog.group_of[1])]
    assert [f.name for f in g.frames] == ["forward", "forward"]
    assert g.site == Frame("/home/me/train.py", 12, "forward")
    assert g.label == "linear.py:134 forward ← me/train.py:12 forward"
    g2 = catalog.groups[int(catalog.group_of[2])]
    assert [f.name for f in g2.frames] == ["MmBackward0"] and g2.site is None
    assert g2.traits & TRAIT_BACKWARD
    assert catalog.groups_of(np.array([-1, 0, 1])).tolist() == [0, catalog.group_of[1], catalog.group_of[2]]


def test_frameless_blocks_are_split_into_what_is_known() -> None:
    from analysis.stages.attribution import BACKWARD_NO_FRAMES, BEFORE_TRACE

    # stacks="python": the peak (in the backward of the failing step) holds the
    # autograd thread's frame-less blocks, named as such.
    peak = [r for r in report("gpt_varlen_oom")["devices"][0]["top_stacks"] if r["when"] == "peak"]
    assert peak[0]["label"] == BACKWARD_NO_FRAMES
    assert UNKNOWN_LABEL not in [r["label"] for r in peak]
    # A wrapped ring: blocks from before the first recorded event get their own row.
    ring = report("wrapped_ring")["devices"][0]
    rows = {r["label"]: r["bytes"] for r in ring["top_stacks"] if r["when"] == "peak"}
    assert rows[BEFORE_TRACE] > 0
    assert sum(rows.values()) == ring["summary"]["peak_allocated_bytes"]
