"""Issue 37's real framework captures (tests/fixtures/diagnosis/fw_*, scripts/capture_frameworks.py, docs/captures.md):
Lightning (automatic and manual optimization), the Hugging Face Trainer (training, and its evaluation loop keeping
logits), accelerate. Each default run died under a per-process cap and was dumped by the allocator's OOM observer
inside the failing malloc, as the oomscope client dumps it; each family's real reruns are in FAMILY.reruns.json.

Here the replay is checked against each truth file: every segment event and the recorded OOM reproduced, the peak
reserved equal to the process's own ``memory_stats`` at the OOM, the final state that of the dump, and the OOM at
the request the process was refused. What the diagnosis names on them is scripts/diagnosis_bench.py's business;
how the bench judges a family with no mistake in the program (``expected_cause`` null) is checked here on a real
report.

The captures need a GPU machine (``python3 scripts/capture_frameworks.py OUTDIR``; the first ran on one H200 on
2026-12-05, docs/captures.md). Without the fixtures the per-capture tests are not defined (not skipped: under
CI=true a skip fails the run). fw_hf_eval's decision (the Trainer's gathering, eval_accumulation_steps) is checked
here too, against the real reruns of its fixes.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from analysis.allocator import replay_check
from analysis.allocator.config import AllocatorConfig
from analysis.model import ACTION_CODE, Snapshot
from analysis.reader import read_snapshot
from tests.analysis.benches import diagnosis_bench as _bench

ROOT = Path(__file__).resolve().parents[2]
DIAG = ROOT / "tests" / "fixtures" / "diagnosis"
FAMILIES = sorted(p.name.removesuffix(".reruns.json") for p in DIAG.glob("fw_*.reruns.json"))


@cache
def snap(family: str) -> Snapshot:
    return read_snapshot(DIAG / f"{family}_default.pickle.gz")


@cache
def truth(family: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DIAG / f"{family}_default.truth.json").read_text())
    return data


def reruns(family: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DIAG / f"{family}.reruns.json").read_text())
    return data


def test_the_bench_calls_a_cause_wrong_where_the_program_has_no_mistake() -> None:
    # optim_mlp's real report names the optimizer step, which its fused rerun bore out. The same report judged as a
    # family with no mistake (a Lightning closure's forward OOM, issue 32 item 1) is wrong whatever its change says.
    bench = _bench()
    family = json.loads((DIAG / "optim_mlp.reruns.json").read_text())
    truth_ = json.loads((DIAG / "optim_mlp_default.truth.json").read_text())
    report = bench.build_report(DIAG / "optim_mlp_default.pickle.gz", oom_message=truth_["oom_message"])
    assert bench.judge(report, family)[0] == "right"
    capacity = {**family, "expected_cause": None, "expected_change": ["smaller_batch"]}
    verdict, what, _overclaims = bench.judge(report, capacity)
    assert (verdict, what) == ("wrong", "optimizer_step (no mistake: capacity)")
    # With no cause named: a change whose real rerun ran is right, one whose rerun died is wrong, one with no rerun
    # is unanswered.
    members = family["members"]
    assert bench._judge_capacity(None, {"id": "smaller_batch"}, capacity) == ("right", "capacity, smaller_batch")
    died = {**capacity, "expected_change": [], "members": {**members, "accum": members["halfbatch"]}}
    assert members["halfbatch"]["died"]  # the real half-batch rerun died in step 0
    assert bench._judge_capacity(None, {"id": "smaller_batch"}, died) == ("wrong", "smaller_batch (its rerun died)")
    assert bench._judge_capacity(None, {"id": "amp"}, died)[0] == "unanswered"


if FAMILIES:  # the GPU captures of issue 37 are in the repository

    def test_the_framework_families_are_there() -> None:
        # Guards the parametrisation: every framework of the issue that ran on one GPU.
        assert {"fw_pl_auto", "fw_pl_manual", "fw_hf_train", "fw_hf_eval", "fw_accel"} <= set(FAMILIES)

    @pytest.mark.parametrize("family", FAMILIES)
    def test_the_default_died_and_was_dumped_at_its_oom(family: str) -> None:
        t = truth(family)
        assert t["died"] and t["oom_message"] and t["snapshot_at"] == "oom_observer"
        assert t["trace_complete"]
        assert reruns(family)["members"]["default"]["died"]
        # The truth file's own figures agree: the message's request is the observer's.
        tried = re.search(r"Tried to allocate ([\d.]+) (MiB|GiB)", t["oom_message"])
        assert tried is not None
        unit = 1 << (20 if tried.group(2) == "MiB" else 30)
        assert abs(float(tried.group(1)) * unit - t["oom_observed"]["alloc_bytes"]) <= 0.01 * unit

    @pytest.mark.parametrize("family", FAMILIES)
    def test_the_replay_meets_the_truth_file(family: str) -> None:
        t = truth(family)
        s = snap(family)
        result = replay_check(s, s.devices[0])
        assert result["exact"], result["first_mismatch"]
        # ooms_recorded lists the trace positions of the recorded OOMs: the dump's one, at its last entry.
        assert result["ooms_recorded"] == [len(s.devices[0].trace) - 1] and result["ooms_reproduced"]
        assert result["peak_reserved_bytes"] == t["memory_stats"]["reserved_bytes.all.peak"]
        assert result["final_reserved_bytes"] == t["memory_stats"]["reserved_bytes.all.current"]

    @pytest.mark.parametrize("family", FAMILIES)
    def test_the_trace_ends_at_the_request_the_process_was_refused(family: str) -> None:
        t = truth(family)
        s = snap(family)
        dev = s.devices[0]
        ooms = (dev.trace.action == ACTION_CODE["oom"]).nonzero()[0]
        assert ooms.size, "no oom entry in the trace"
        last = int(ooms[-1])
        # The entry holds the rounded request; the observer (and the message) the segment a miss for it asks for.
        cfg = AllocatorConfig.from_settings(s.settings.raw, s.settings.conf)
        assert cfg.allocation_size(int(dev.trace.size[last])) == t["oom_observed"]["alloc_bytes"]
        # Dumped inside the failing malloc: nothing after the fatal request.
        assert last == len(dev.trace) - 1

    @cache
    def _oom_device(family: str, with_message: bool) -> dict[str, Any]:
        message = truth(family)["oom_message"] if with_message else None
        report = _bench().build_report(DIAG / f"{family}_default.pickle.gz", oom_message=message)
        device: dict[str, Any] = next(d for d in report["devices"] if d.get("oom"))
        return device

    @pytest.mark.parametrize("with_message", [True, False])
    def test_the_trainers_evaluation_names_its_gathering_and_a_fix_that_ran(with_message: bool) -> None:
        # fw_hf_eval: the Trainer's evaluation concatenated each batch's logits on the GPU (nested_concat) and died
        # copying them at its fourth batch: three batches' worth, far fewer sizes than a KV cache shows.
        family, t = reruns("fw_hf_eval"), truth("fw_hf_eval")
        dev = _oom_device("fw_hf_eval", with_message)
        decision = dev["decision"]
        assert decision["cause"] == _bench().expected_cause(family) == "eval_outputs_on_gpu"
        assert _bench().judge({"devices": [dev]}, family)[0] == "right"
        cause = next(c for c in dev["diagnosis"]["causes"] if c["id"] == "eval_outputs_on_gpu")
        assert decision["change"]["kind"] == "code" and decision["change"]["line"] == cause["fix"]["line"]
        figures = cause["figures"]
        # What was held: the batches the loop had gathered when it died, the block devices[].leaks lists too.
        assert figures["gathered_bytes"] == figures["bytes_per_batch"] * t["eval_batches_done"]
        assert figures["gathered_bytes"] in {leak["bytes"] for leak in dev["leaks"]}
        # The fix: eval_accumulation_steps at most the batches whose copies the run made (3 here), and the real
        # rerun of the fix (eval_accumulation_steps=1) ran its whole run, as did the other two changes it names.
        steps = figures["eval_accumulation_steps"]
        assert 1 <= steps <= t["eval_batches_done"]
        assert f"eval_accumulation_steps={steps}" in decision["change"]["line"]
        assert "preprocess_logits_for_metrics" in decision["change"]["line"]
        members = family["members"]
        assert members["fix"]["kwargs"] == {"eval_accum": 1} and not members["fix"]["died"]
        assert not members["preprocess"]["died"] and not members["loss_only"]["died"]
        assert members["fix"]["steps_completed"] == members["default"]["steps_completed"]
        # The arithmetic: k - 1 batches kept and the k-th batch's copy fit beside the rest (the limit read from the
        # message, or inferred from the reserved peak without it), and the state with 3 was one the run lived through.
        assert cause["fits_after_fix"] is True
        assert cause["saving_bytes"] == figures["gathered_bytes"] - (steps - 1) * figures["bytes_per_batch"]
