"""A run whose optimizer step already runs fused is not told to use ``fused=True`` (issue 35).

The real grow_gpt2_default capture (AdamW, the foreach step: ``torch/optim/adam.py _multi_tensor_adam``) is
told to shrink its optimizer state, ``fused=True`` among the ways; the same capture with that step's frames
named as the fused step's (``_fused_adam``, what ``torch.optim.AdamW(..., fused=True)`` records) is not.
"""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from typing import Any

from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def as_fused(node: Any) -> int:
    """Rename the foreach step's frames to the fused step's, in place; how many were renamed."""
    renamed = 0
    if isinstance(node, dict):
        if "/torch/optim/" in str(node.get("filename", "")) and str(node.get("name", "")).startswith("_multi_tensor"):
            node["name"] = "_fused_" + node["name"].removeprefix("_multi_tensor_")
            renamed += 1
        for value in node.values():
            renamed += as_fused(value)
    elif isinstance(node, list):
        renamed += sum(as_fused(item) for item in node)
    return renamed


def optimizer_row(report: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in report["devices"][0]["suggestions"] if s["id"] == "optimizer_state")


def test_the_foreach_step_is_told_fused_and_the_fused_one_is_not() -> None:
    path = FIXTURES / "grow_gpt2_default.pickle.gz"
    foreach = optimizer_row(build_report(path))
    assert "fused=True" in foreach["config"]
    snapshot = pickle.loads(gzip.decompress(path.read_bytes()))  # our own fixture
    assert as_fused(snapshot) > 0
    report = build_report(pickle.dumps(snapshot), filename="fused.pickle")
    fused = optimizer_row(report)
    assert fused["config"] == "bitsandbytes.optim.AdamW8bit(...) or ZeRO/FSDP sharding"
    assert "already runs fused" in fused["evidence"]
    assert fused["estimated_saving_bytes"] == foreach["estimated_saving_bytes"]
    runner = report["devices"][0]["decision"].get("runner_up") or {}
    assert "fused=True" not in str(runner.get("line", ""))
