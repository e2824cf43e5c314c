"""The first screen's words: the runner-up qualified where its replay also runs out in the failing step
(``readout.runner_up_note``), on the real grow_gpt2_default capture: its ranked table's
expandable_segments row runs out later in step 4, as the real rerun with that setting did; and "the trace ends
at the OOM" said only where it does (``readout.not_projected_reason``)."""

from __future__ import annotations

from pathlib import Path

from analysis import readout
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_a_runner_up_that_runs_out_in_the_step_is_qualified() -> None:
    dev = build_report(FIXTURES / "grow_gpt2_default.pickle.gz")["devices"][0]
    rows = readout.ranked_rows(dev)
    runs_out = next(r for r in rows if r["id"] == "expandable_segments")
    assert runs_out["state"] == "runs-out" and runs_out["state_text"] == "runs out later in step 4"
    # Whichever change the decision names second, the first screen says what the ranked table knows of it.
    dev["decision"]["runner_up"] = {"id": "expandable_segments", "line": "PYTORCH_CUDA_ALLOC_CONF=..."}
    assert readout.runner_up_note(dev, rows) == f"runs out later in step 4: {runs_out['why']}"
    estimate = next(r for r in rows if r["state"] == "estimate")
    dev["decision"]["runner_up"] = {"id": estimate["id"], "line": "..."}
    assert readout.runner_up_note(dev, rows) is None  # an estimate is not a rerun that died


def test_a_runner_up_whose_step_is_not_known_says_so() -> None:
    """eval_bert_default (tests/fixtures/diagnosis): the runner-up, expandable_segments, gets past the failing
    request in the replay but the step was not projected; the real rerun with it died in the same step (2)."""
    import json

    reruns = json.loads((FIXTURES / "diagnosis" / "eval_bert.reruns.json").read_text())["members"]
    assert reruns["expandable"]["died"] and reruns["expandable"]["died_step"] == 2
    dev = build_report(FIXTURES / "diagnosis" / "eval_bert_default.pickle.gz")["devices"][0]
    assert dev["decision"]["runner_up"]["id"] == "expandable_segments"
    rows = readout.ranked_rows(dev)
    row = next(r for r in rows if r["id"] == "expandable_segments")
    assert row["state"] == "not-known"
    assert readout.runner_up_note(dev, rows) == (
        "it only gets past the failing request; the rest of the step is not known, since the step was not "
        "projected: no earlier step starts with the same allocations as the failing one"
    )


def test_the_trace_ends_at_the_oom_only_where_it_does() -> None:
    """bert_mlm_c70_default's OOM is event 4,404 of 6,065 (the frees of the unwinding follow it)."""
    dev = build_report(FIXTURES / "captures" / "bert_mlm_c70_default.pickle.gz")["devices"][0]
    oom = {**dev["oom"], "projection": {}}  # no projection's own reason to give
    assert (oom["event_index"], dev["events"]) == (4404, 6065)
    assert readout.not_projected_reason(oom, dev["events"]) == (
        "the rest of the step was not projected (the OOM is event 4,404 of 6,065)"
    )
    assert readout.not_projected_reason(oom, 4405) == "the trace ends at the OOM"
    reason = {**oom, "projection": {"reason": "the trace has no steps"}}
    assert readout.not_projected_reason(reason, dev["events"]) == "the trace has no steps"
