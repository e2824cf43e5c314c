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
