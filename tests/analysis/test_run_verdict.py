"""The run-level verdict (issue 32, item 4): ``oom.run_verdict`` is what a user reads (the page, the API's summary,
the webhook, the history); ``oom.request_verdict`` stays the failing request's. On the diagnosis families every
allocator setting's real rerun died in the same step (or, for a leak, a few steps later): the run is capacity
even where the one request would have fitted (tests/fixtures/diagnosis/*.reruns.json)."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import pytest

from analysis import stored
from analysis.readout import run_facts
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DIAG = FIXTURES / "diagnosis"
SETTINGS = ("expandable", "maxsplit128")


@functools.cache
def _report(path: Path, with_message: bool = True) -> dict[str, Any]:
    truth = json.loads(path.with_name(path.name.replace(".pickle.gz", ".truth.json")).read_text())
    message = truth.get("oom_message") if with_message else None
    return json.loads(json.dumps(build_report(path, oom_message=message)))  # type: ignore[no-any-return]


def _oom_device(report: dict[str, Any]) -> dict[str, Any]:
    return next(d for d in report["devices"] if d.get("oom"))  # type: ignore[no-any-return]


@pytest.mark.parametrize("family", ["eval_bert", "eval_resnet", "graphs_manual", "kv_gqa", "leak_conv2"])
def test_a_request_that_fragmentation_failed_in_a_run_no_setting_saves_is_capacity(family: str) -> None:
    reruns = json.loads((DIAG / f"{family}.reruns.json").read_text())["members"]
    assert all(reruns[s]["died"] for s in SETTINGS if s in reruns)  # every setting's real rerun died
    oom = _oom_device(_report(DIAG / f"{family}_default.pickle.gz"))["oom"]
    assert oom["request_verdict"] == "fragmentation"  # the one request would have fitted
    assert oom["run_verdict"] == "capacity"
    assert oom["run_verdict_basis"] == "cause"


def test_without_a_cause_the_run_verdict_is_the_steps_or_the_requests() -> None:
    for name in ("frag_oom", "grow_gpt2_default", "grow_resnet_default"):
        dev = _oom_device(_report(FIXTURES / f"{name}.pickle.gz"))
        assert dev["diagnosis"]["primary"] is None, name
        oom = dev["oom"]
        assert oom["run_verdict"] == oom["verdict"], name
        assert oom["run_verdict_basis"] == ("step" if oom["verdict_level"] == "step" else "request"), name


def test_the_summary_a_row_and_the_api_carry_says_the_run_verdict() -> None:
    dev = _oom_device(_report(DIAG / "eval_bert_default.pickle.gz"))
    facts = run_facts(dev)
    assert facts["verdict"] == "capacity"
    assert facts["request_verdict"] == "fragmentation"


def test_an_older_stored_report_gets_the_run_verdict_on_upgrade() -> None:
    report = copy.deepcopy(_report(DIAG / "optim_wide_default.pickle.gz"))
    new = _oom_device(report)["oom"]
    expected = (new["run_verdict"], new["run_verdict_basis"])
    for dev in report["devices"]:
        if dev.get("oom"):
            del dev["oom"]["run_verdict"], dev["oom"]["run_verdict_basis"]
    stored.upgrade(report)
    oom = _oom_device(report)["oom"]
    assert (oom["run_verdict"], oom["run_verdict_basis"]) == expected == ("capacity", "cause")
    before = copy.deepcopy(report)
    assert stored.upgrade(report) == before  # twice changes nothing
