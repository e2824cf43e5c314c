"""The capture doctor (``analysis/doctor.py``) on real captures: each way a file reads as a snapshot but was
captured so that it cannot answer gets one line and the call that would have captured it right.

The real files: ``state_only``, ``no_context``, ``big_all_stacks``, ``wrapped_ring``
(a 5,000-event ring over a 20-step run). A ring that wrapped and a history that started
late are also made from the complete ``gpt_varlen_oom`` capture by dropping the head of its trace (the last 5,000
events: a full ring; the last 63%: a late start), and an empty capture by emptying it.
"""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any

from analysis import doctor
from analysis.report import build_report
from analysis.stored import upgrade

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
RECORD = "torch.cuda.memory._record_memory_history"


def doctor_of(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {f["code"]: f for f in report["capture"]["doctor"]}


def snapshot_of(case: str) -> dict[str, Any]:
    data: dict[str, Any] = pickle.loads(gzip.decompress((FIXTURES / f"{case}.pickle.gz").read_bytes()))
    return data


def test_a_complete_capture_has_nothing_to_say() -> None:
    assert build_report(FIXTURES / "gpt_varlen_oom.pickle.gz")["capture"]["doctor"] == []


def test_state_only_says_to_record_all_events() -> None:
    found = doctor_of(build_report(FIXTURES / "state_only.pickle.gz"))
    assert set(found) == {"state-only"}
    assert found["state-only"]["fix"] == f'{RECORD}(enabled="all", max_entries=1_000_000)'


def test_no_context_says_to_record_stacks() -> None:
    found = doctor_of(build_report(FIXTURES / "no_context.pickle.gz"))
    assert found["no-frames"]["fix"] == 'torch.cuda.memory._record_memory_history(context="all", stacks="python")'


def test_stacks_all_names_the_dumps_cost_from_the_sidecar() -> None:
    found = doctor_of(build_report(FIXTURES / "big_all_stacks.pickle.gz", sidecar={"dump_seconds": 184.2}))
    assert "(this one took 184 s)" in found["stacks-all"]["problem"]
    assert found["stacks-all"]["fix"] == f'{RECORD}(stacks="python", max_entries=1_000_000)'


def test_a_ring_that_wrapped_is_sized_from_the_steps_it_kept() -> None:
    snap = snapshot_of("gpt_varlen_oom")
    snap["device_traces"][0] = snap["device_traces"][0][-5000:]
    report = build_report(pickle.dumps(snap), filename="ring.pickle")
    per_step = doctor.events_per_step(report["devices"][0])
    assert per_step is not None and per_step < 5000
    found = doctor_of(report)["trace-truncated"]
    assert (
        f"kept only the last 5,000 events (max_entries=5,000: about {5000 / per_step:.1f} steps of {per_step:,}"
        in (found["problem"])
    )
    assert found["fix"].startswith(f"{RECORD}(max_entries={1_000_000:_}) keeps at least")


def test_the_real_wrapped_ring_held_three_steps_of_twenty() -> None:
    truth = json.loads((FIXTURES / "wrapped_ring.truth.json").read_text())
    report = build_report(FIXTURES / "wrapped_ring.pickle.gz")
    found = doctor_of(report)["trace-truncated"]
    assert truth["max_entries"] == 5000 and f"max_entries={truth['max_entries']:,}" in found["problem"]
    per_step = doctor.events_per_step(report["devices"][0])
    assert per_step == 1614 and "about 3.1 steps of 1,614 events" in found["problem"]


def test_history_started_after_the_model_was_built() -> None:
    snap = snapshot_of("gpt_varlen_oom")
    trace = snap["device_traces"][0]
    snap["device_traces"][0] = trace[int(len(trace) * 0.37) :]
    found = doctor_of(build_report(pickle.dumps(snap), filename="late.pickle"))["history-started-late"]
    assert found["problem"].startswith("history started after the model was built: ")
    assert "segments" in found["problem"] and "live blocks" in found["problem"]
    assert "before the model is built or moved to the GPU" in found["fix"]


def test_an_empty_capture_says_nothing_was_recorded() -> None:
    snap = snapshot_of("gpt_varlen_oom")
    snap["segments"], snap["device_traces"] = [], [[]]
    report = build_report(pickle.dumps(snap), filename="empty.pickle")
    assert report["devices"] == [] and list(doctor_of(report)) == ["empty-capture"]
    assert "_record_memory_history(max_entries=1_000_000) at the start" in doctor_of(report)["empty-capture"]["fix"]


def test_no_event_at_all_is_no_history_not_state_only() -> None:
    snap = snapshot_of("state_only")
    snap["device_traces"] = [[]]
    assert list(doctor_of(build_report(pickle.dumps(snap), filename="s.pickle"))) == ["no-history"]


def test_a_stored_report_without_the_doctor_gets_it() -> None:
    report = build_report(FIXTURES / "state_only.pickle.gz")
    expected = report["capture"].pop("doctor")
    assert upgrade(report)["capture"]["doctor"] == expected
