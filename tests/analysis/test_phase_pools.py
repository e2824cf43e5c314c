"""A graph capture's phase comes from the one rule that knows which allocations a private pool made
(``categories.private_pool_allocations``), not from ``trace.pool``: torch 2.11's trace entries carry no
``pool_id``, so that column is 0 in every real capture here (issue 32). Real H200 captures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis.categories import private_pool_allocations
from analysis.phases import GRAPH_CAPTURE, tag_phases
from analysis.reader import read_snapshot
from analysis.stacks import StackCatalog, alloc_lifetimes

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.mark.parametrize(
    ("case", "in_pools"),
    [("diagnosis/graphs_resnet_default", 947), ("diagnosis/graphs_manual_default", 236), ("gpu_cuda_graph", 8)],
)
def test_allocations_in_private_pools_are_the_graph_capture_phase(case: str, in_pools: int) -> None:
    snap = read_snapshot(FIXTURES / f"{case}.pickle.gz")
    dev = next(d for d in snap.devices if d.trace is not None and d.trace.action.size)
    trace = dev.trace
    lifetimes = alloc_lifetimes(trace.action, trace.addr, trace.size, trace.stack)
    catalog, none = StackCatalog(snap.stacks), np.zeros(0, np.int64)
    assert not trace.pool.any()  # the column the old rule read says nothing on torch 2.11
    private = private_pool_allocations(lifetimes, trace, dev.segments)
    assert int(private.sum()) == in_pools
    old = tag_phases(trace, lifetimes, catalog, snap.stacks, none, none)
    new = tag_phases(trace, lifetimes, catalog, snap.stacks, none, none, private=private)
    assert int((old.of_alloc == GRAPH_CAPTURE).sum()) == 0
    assert ((new.of_alloc == GRAPH_CAPTURE) == private).all()
    # Outside the pools nothing moved.
    assert (new.of_alloc[~private] == old.of_alloc[~private]).all()
