"""Categories at the peak, against what the captured models must hold.

The fixtures' models are known (../shared/snapshots/capture.py): a GPT
(vocab 32000, d 768, 8 layers, ctx 2048) trained with AdamW, and a 6-block MLP
(2048 -> 8192 -> 2048) for inference, all float32. Their parameter bytes are
computed here from the architecture, not read from the report.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.allocator.recorded import recorded_replay
from analysis.categories import (
    CATEGORIES,
    GRADIENTS,
    bytes_by_category,
    classify,
    optimizer_windows,
)
from analysis.reader import read_snapshot
from analysis.report import build_report
from analysis.stacks import StackCatalog, alloc_lifetimes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def gpt_parameter_bytes(vocab: int = 32000, d: int = 768, layers: int = 8, ctx: int = 2048) -> int:
    per_layer = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d)
    params = vocab * d + ctx * d + layers * per_layer + 2 * d + vocab * d
    return 4 * params


def mlp_parameter_bytes(blocks: int = 6, d: int = 2048, hidden: int = 8192) -> int:
    return 4 * blocks * (d * hidden + hidden + hidden * d + d)


@cache
def categories(case: str) -> dict[str, Any]:
    dev = build_report(FIXTURES / f"{case}.pickle.gz")["devices"][0]
    return {"bytes": dev["categories"]["bytes"], "peak": dev["summary"]["peak_allocated_bytes"]}


@pytest.mark.parametrize(
    "case",
    ["gpt_varlen_oom", "gpt_varlen_expandable", "infer_varbatch", "compiled_train", "no_context", "wrapped_ring"],
)
def test_categories_add_up_to_the_peak(case: str) -> None:
    cat = categories(case)
    # "private_pools" is listed only where a private pool held memory (none of these runs has one).
    assert set(cat["bytes"]) == set(CATEGORIES) - {"private_pools"}
    assert sum(cat["bytes"].values()) == cat["peak"]


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "gpt_varlen_expandable"])
def test_gpt_parameters_and_adam_state_at_the_peak(case: str) -> None:
    b = categories(case)["bytes"]
    params = gpt_parameter_bytes()
    # Blocks are rounded up to 512 bytes: a little above the exact tensor bytes.
    assert params <= b["parameters"] <= params * 1.01
    # AdamW keeps two float32 moments per parameter (plus tiny step counters).
    assert 2 * params <= b["optimizer_state"] <= 2 * params * 1.01
    # The peak is in the forward/backward of the last step: activations dominate.
    assert b["activations"] > b["parameters"] + b["optimizer_state"]


def test_inference_holds_parameters_and_activations_only() -> None:
    b = categories("infer_varbatch")["bytes"]
    assert b["parameters"] == mlp_parameter_bytes()
    assert b["optimizer_state"] == b["gradients"] == 0
    assert b["activations"] == categories("infer_varbatch")["peak"] - b["parameters"]


def test_gradients_equal_parameters_when_the_optimizer_starts_with_cpp_stacks() -> None:
    # stacks="all": backward allocations carry autograd-engine frames.
    s = read_snapshot(FIXTURES / "big_all_stacks.pickle.gz")
    t = s.devices[0].trace
    life = alloc_lifetimes(t.action, t.addr, t.size, t.stack)
    opt_start, opt_end = optimizer_windows([(a.name, a.stage, a.time_us) for a in s.annotations], t.time_us)
    codes = classify(life, StackCatalog(s.stacks), opt_start, opt_end, trace_has_frames=True)
    at = int(opt_start[60])
    live = life.live_at(at)
    grads = bytes_by_category(codes[live], life.size[live])["gradients"]
    assert grads == pytest.approx(gpt_parameter_bytes(), rel=0.01)
    assert (codes == GRADIENTS).sum() > 0


def test_frameless_backward_of_python_stacks_is_found_by_its_neighbours() -> None:
    # stacks="python": the autograd thread records no frames; its allocations
    # follow Tensor.backward's own framed allocation (_make_grads).
    s = read_snapshot(FIXTURES / "gpt_varlen_oom.pickle.gz")
    t = s.devices[0].trace
    life = alloc_lifetimes(t.action, t.addr, t.size, t.stack)
    opt_start, opt_end = optimizer_windows([(a.name, a.stage, a.time_us) for a in s.annotations], t.time_us)
    codes = classify(life, StackCatalog(s.stacks), opt_start, opt_end, trace_has_frames=True)
    live = life.live_at(int(opt_start[10]))
    grads = bytes_by_category(codes[live], life.size[live])["gradients"]
    assert grads == pytest.approx(gpt_parameter_bytes(), rel=0.01)
    frameless = life.stack < 0
    assert np.isin(codes[frameless], [GRADIENTS, CATEGORIES.index("temporaries")]).mean() > 0.95


GRAPH_RUNS = {
    # case: (activations before issue 32, activations now, private pools at the allocated peak, pools)
    "diagnosis/graphs_resnet_default": (1496769536, 615285760, 881483776, 15),
    "diagnosis/graphs_manual_default": (372245504, 133170176, 239075328, 13),
}


@pytest.mark.parametrize("case", sorted(GRAPH_RUNS))
def test_cuda_graph_pools_are_named_as_pools_not_activations(case: str) -> None:
    """Issue 32, item 2: what a captured graph holds is its pool's. On the real runs that captured one
    graph per batch size into its own pool (torch.cuda.graph), the pools' blocks at the allocated peak
    were counted as activations; they are now ``private_pools``, the bytes the final snapshot's own
    segments put in private pools at the OOM, each pool named by the capture that made it."""
    before, activations, pooled, n = GRAPH_RUNS[case]
    path = FIXTURES / f"{case}.pickle.gz"
    dev = build_report(path)["devices"][0]
    cat = dev["categories"]
    assert cat["bytes"]["activations"] == activations
    assert cat["bytes"]["private_pools"] == pooled
    assert activations + pooled == before  # nothing else moved
    assert sum(cat["bytes"].values()) == dev["summary"]["peak_allocated_bytes"]
    # The pools' live blocks at the peak, by a replay run here: exactly the category.
    snap = read_snapshot(path)
    state = recorded_replay(snap, snap.devices[0]).blocks_at(cat["event_index"])
    live = sum(b.size for s in state.segments if s.pool != 0 for b in s.blocks if b.state == "active_allocated")
    assert live == pooled
    assert len(cat["pools"]) == n
    for pool in cat["pools"]:
        assert pool["origin"] == "cuda_graph" and pool["pool_id"][1] == 0  # made by a capture without a pool
        assert "capture_diagnosis.py" in pool["made_by"] and pool["label"].startswith(f"pool {pool['pool_id'][0]},0: ")
    # At the OOM the ledger's pool row is what torch's own final segments hold in private pools.
    final = sum(s.total_size for s in snap.devices[0].segments if s.pool != 0)
    row = next(r for r in dev["ledger"]["rows"] if r["id"] == "private_pools")
    cause = next(c for c in dev["diagnosis"]["causes"] if c["id"] == "cuda_graph_pools")
    assert row["bytes"] == final == cause["figures"]["private_pool_bytes"]
    assert len(row["parts"]) == n and sum(p["bytes"] for p in row["parts"]) == final


def test_a_single_graph_pool_is_no_longer_unknown() -> None:
    """gpu_cuda_graph (no OOM): one captured graph's pool held 49.00 MiB live at the allocated peak, which
    the rules called a workspace (unknown)."""
    dev = build_report(FIXTURES / "gpu_cuda_graph.pickle.gz")["devices"][0]
    b = dev["categories"]["bytes"]
    assert (b["private_pools"], b["unknown"], b["activations"]) == (51380224, 166809600, 518341120)
    (pool,) = dev["categories"]["pools"]
    assert (pool["pool_id"], pool["reserved_bytes"], pool["origin"]) == ([1, 0], 236978176, "cuda_graph")
    assert dev["ledger"]["moment"] == "peak" and dev["ledger"]["total_bytes"] is None
