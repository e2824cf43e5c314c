"""Issue 32, item 6, on real H200 captures: the CUDA-graph families get the same first change with the OOM
message and without it (the trace alone proves the pools: their segments and what each holds); where an answer
rests on the limit, which only the message gives, the report says what is missing instead of claiming more."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DIAG = FIXTURES / "diagnosis"


def _message(path: Path) -> str | None:
    return json.loads(path.with_name(path.name.replace(".pickle.gz", ".truth.json")).read_text()).get("oom_message")


@functools.cache
def _oom_device(path: Path, with_message: bool) -> dict[str, Any]:
    report = build_report(path, oom_message=_message(path) if with_message else None)
    return next(d for d in report["devices"] if d.get("oom"))  # type: ignore[no-any-return]


@pytest.mark.parametrize("family", ["graphs_resnet", "graphs_manual"])
def test_cuda_graph_pools_get_the_same_first_change_without_the_message(family: str) -> None:
    path = DIAG / f"{family}_default.pickle.gz"
    reruns = json.loads((DIAG / f"{family}.reruns.json").read_text())["members"]
    # One shared pool ran through; the setting did not.
    assert reruns["fix"]["died"] is False
    assert reruns["expandable"]["died"] is True
    with_it, without = _oom_device(path, True), _oom_device(path, False)
    assert with_it["oom"]["limit_source"] == "oom_message" and without["oom"]["limit_source"] == "inferred"
    for dev in (with_it, without):
        assert dev["decision"]["cause"] == "cuda_graph_pools"
        assert dev["decision"]["change"]["id"] == "cuda_graph_pools"
    assert with_it["decision"]["change"]["line"] == without["decision"]["change"]["line"]


def test_allocation_order_says_the_message_is_missing_under_the_traces_lower_bound() -> None:
    """frag_oom: long-lived blocks pin holes; without the message the settings' replays ran under the trace's
    least limit, so "no allocator setting can move" them is not proven there, and the suggestion says what would
    tell. With the message (4 GiB allowed) the same suggestion stands on the real limit and says nothing more."""
    path = FIXTURES / "frag_oom.pickle.gz"
    without = next(s for s in _oom_device(path, False)["suggestions"] if s["id"] == "allocation_order")
    assert _oom_device(path, False)["oom"]["limit_is_lower_bound"] is True
    assert "only the OOM message tells" in without["evidence"]
    limit = _oom_device(path, False)["oom"]["limit_bytes"]
    assert f"ran under {limit / (1 << 30):.2f} GiB" in without["evidence"]
    with_it = [s for s in _oom_device(path, True)["suggestions"] if s["id"] == "allocation_order"]
    assert _oom_device(path, True)["oom"]["limit_is_lower_bound"] is False
    assert all("only the OOM message tells" not in s["evidence"] for s in with_it)
