"""Stored reports of older shapes read as current ones through ``analysis.stored.upgrade`` (issue 17).

Each older shape is made from a real report of a fixture by taking away what that shape lacked; the
upgraded report must then read (``readout``, ``decision``) as the current one does.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from analysis import readout
from analysis.report import build_report
from analysis.stored import upgrade

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def capped() -> dict[str, Any]:
    """An OOM under a per-process cap the trace bounds from below (limit inferred, a lower bound)."""
    return build_report(FIXTURES / "gpu_grow_oom.pickle.gz")


@pytest.fixture(scope="module")
def device_full() -> dict[str, Any]:
    """An OOM with the device itself full (another process held the rest): the limit inferred, exact."""
    return build_report(FIXTURES / "diagnosis" / "otherproc_default.pickle.gz")


def _first_shape(report: dict[str, Any]) -> dict[str, Any]:
    """The first reports' shape: the inference as ``limit_source``, no other limit key, no decision."""
    old = copy.deepcopy(report)
    for dev in old["devices"]:
        oom = dev["oom"]
        assert oom["limit_source"] == "inferred"
        oom["limit_source"] = oom.pop("limit_inference")
        del oom["limit_is_lower_bound"], oom["limit_kind"], dev["limit"], dev["decision"]
    return old


def test_a_current_report_passes_through_untouched(capped: dict[str, Any]) -> None:
    report = copy.deepcopy(capped)
    assert upgrade(report) == capped


def test_a_report_stored_before_the_decision_gets_the_same_decision(capped: dict[str, Any]) -> None:
    old = copy.deepcopy(capped)
    for dev in old["devices"]:
        del dev["decision"]
    upgrade(old)
    assert [d["decision"] for d in old["devices"]] == [d["decision"] for d in capped["devices"]]
    assert old["devices"][0]["decision"]["headline"]


@pytest.mark.parametrize(
    ("name", "inference", "lower"), [("capped", "cap-lower-bound", True), ("device_full", "device-full", False)]
)
def test_the_first_reports_read_as_current_ones(
    request: pytest.FixtureRequest, name: str, inference: str, lower: bool
) -> None:
    current = request.getfixturevalue(name)
    old = _first_shape(current)
    assert readout.basis(old["devices"][0]) is None  # unreadable as stored: no devices[].limit
    upgrade(old)
    dev, now = old["devices"][0], current["devices"][0]
    assert dev["oom"]["limit_source"] == inference  # the stored value is kept
    assert dev["oom"]["limit_is_lower_bound"] is lower
    assert dev["limit"]["bytes"] == now["limit"]["bytes"] == now["oom"]["limit_bytes"]
    assert readout.basis(dev) == readout.basis(now)
    assert readout.run_facts(dev)["limit_source"] == readout.run_facts(now)["limit_source"] == inference
    assert dev["decision"]["confidence"]["limit_is_lower_bound"] is lower
    again = copy.deepcopy(old)
    assert upgrade(again) == old  # twice changes nothing
