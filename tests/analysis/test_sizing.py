"""Batch fit, GPU fit and the ranked table (analysis.sizing) on real H200 runs.

The growing-batch runs (scripts/capture_diff.py, family grow_*) raise the batch every step until the OOM;
their truth files log the batch of every step that completed, and the failing batch is the workload's own
rule (first + grow x died_step). The uncapped runs' truth files hold the process's own peak reserved memory.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from analysis import sizing
from analysis.advice import batch_suggestion
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _truth(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.truth.json").read_text())


def _failing_batch(truth: dict) -> int:
    kw = truth["kwargs"]
    return int(kw["batch"][0] + kw["grow"] * truth["died_step"])


@pytest.fixture(scope="module", params=["grow_resnet_default", "grow_gpt2_default"])
def grown(request):
    truth = _truth(request.param)
    batch = _failing_batch(truth)
    report = build_report(FIXTURES / f"{request.param}.pickle.gz", batch_size=batch)
    return truth, batch, report["devices"][0]


def test_fitting_batch_lies_between_the_last_that_ran_and_the_one_that_failed(grown):
    truth, batch, dev = grown
    last_ran = truth["workload_log"][-1]["batch"]
    assert truth["died_step"] == len(truth["workload_log"])  # the failing step is the one after the last logged
    fit = dev["batch_fit"]
    assert fit["feasible"] and fit["batch_size"] == batch
    assert last_ran <= fit["fitting_batch"] < batch, (last_ran, fit["fitting_batch"], batch)


def test_accumulation_keeps_the_effective_batch(grown):
    _, batch, dev = grown
    fit = dev["batch_fit"]
    assert fit["micro_batch"] <= fit["fitting_batch"]
    assert fit["accumulation_steps"] * fit["micro_batch"] >= batch
    assert (fit["accumulation_steps"] - 1) * fit["micro_batch"] < batch  # no micro-step more than needed
    assert f"accum = {fit['accumulation_steps']}" in fit["snippet"]
    smaller = [s for s in dev["suggestions"] if s["id"] == "smaller_batch"]
    assert len(smaller) == 1 and smaller[0]["snippet"] == fit["snippet"]


def test_batch_fit_arithmetic(grown):
    """f = (fit - fixed) / (need - fixed), fit = what the largest completed step allocated at its peak."""
    _, batch, dev = grown
    fit, oom = dev["batch_fit"], dev["oom"]
    cats = dev["categories"]["bytes"]
    assert fit["fixed_bytes"] == sum(cats[c] for c in ("parameters", "gradients", "optimizer_state"))
    assert fit["need_bytes"] >= oom["allocated_bytes"] + oom["requested_bytes"]
    done = [s for s in dev["steps"] if s["last_event"] < oom["event_index"]]
    largest = max(done, key=lambda s: s["peak_allocated_bytes"])
    assert fit["largest_fitting_step"] == largest["index"]
    assert fit["fit_bytes"] == min(largest["peak_allocated_bytes"], fit["limit_bytes"])
    f = (fit["fit_bytes"] - fit["fixed_bytes"]) / (fit["need_bytes"] - fit["fixed_bytes"])
    assert fit["fraction"] == pytest.approx(f, abs=1e-4)
    assert fit["fitting_batch"] == math.floor(f * batch)
    assert fit["fraction"] <= fit["fraction_no_fragmentation"]


def test_without_a_batch_size_the_answer_is_a_fraction():
    dev = build_report(FIXTURES / "grow_resnet_default.pickle.gz")["devices"][0]
    fit = dev["batch_fit"]
    assert fit["batch_size"] is None and fit["fitting_batch"] is None
    assert 0 < fit["fraction"] < 1 and f"{fit['fraction'] * 100:.0f}%" in fit["explanation"]


@pytest.mark.parametrize("name", ["resnet_nocap_default", "vit_nocap_default"])
def test_uncapped_run_needs_its_real_peak_reserved(name):
    truth = _truth(name)
    dev = build_report(FIXTURES / f"{name}.pickle.gz")["devices"][0]
    gpu = dev["gpu_fit"]
    real = truth["memory_stats"]["reserved_bytes.all.peak"]
    recorded = gpu["settings"][0]
    assert recorded["config"] == "recorded"
    assert abs(recorded["reserved_bytes"] - real) <= 0.02 * real
    assert recorded["needs_bytes"] == recorded["reserved_bytes"] + sizing.ASSUMED_CONTEXT_BYTES
    assert dev["batch_fit"] is None  # no OOM: nothing to shrink
    for row in gpu["settings"]:
        assert row["fits"] == [n for n, cap in sizing.GPU_SIZES if cap >= row["needs_bytes"]]
    assert gpu["fits_default"] == recorded["fits"]


def test_gpu_sizes_are_the_ones_that_hold_it():
    # a 9.5 GB run: 16 GB and up hold it; a run of 20 GiB needs 24 GB and up (capacities from GPU_SIZES)
    caps = dict(sizing.GPU_SIZES)
    assert caps["141 GB"] == _truth("resnet_nocap_default")["total_memory"]  # measured on the H200
    inp = sizing.SizingInput(
        oom=None, categories={}, steps=(), peak_reserved=20 << 30, whatifs=(), cause=None, cause_settings=""
    )
    fit = sizing.gpu_fit(inp)
    assert fit["fits_default"] == ["24 GB", "40 GB", "48 GB", "80 GB", "94 GB", "141 GB"]


def test_ranked_puts_the_cheapest_change_that_finishes_the_step_first():
    conf = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    suggestions = [
        {"id": "activation_checkpointing", "title": "c", "config": None, "estimated_saving_bytes": 9 << 30},
        {"id": "amp", "title": "a", "config": None, "estimated_saving_bytes": 5 << 30},
        {"id": "expandable_segments", "title": "e", "config": conf, "estimated_saving_bytes": 1 << 30},
        {"id": "max_split_size_mb", "title": "m", "config": None, "estimated_saving_bytes": 1 << 29},
    ]
    for s in (suggestions[0], suggestions[1], suggestions[3]):
        s["step_completes"] = True
    # A setting's suggestion without a step figure of its own takes its what-if's projection.
    whatifs = (sizing.WhatIfFigures("expandable_segments:True", 1 << 30, oom_avoided=True, step_completes=False),)
    rows = sizing.ranked(suggestions, whatifs)
    # finishes the step first (cheapest cost first: none < precision < speed), then what does not
    assert [r["id"] for r in rows] == ["max_split_size_mb", "amp", "activation_checkpointing", "expandable_segments"]
    assert rows[-1]["step_completes"] is False


def test_batch_size_from_the_trace_metadata():
    # user_metadata is sparse: event index -> the string _set_memory_metadata set (it holds until changed)
    meta = {10: "phase=warmup", 200: "batch_size=64", 900: "batch=96 seq=512", 5000: "batch_size=128"}
    assert sizing.batch_from_metadata(meta, 950) == 96
    assert sizing.batch_from_metadata(meta, 300) == 64
    assert sizing.batch_from_metadata(meta, 100) is None  # "phase=warmup" names no batch
    assert sizing.batch_from_metadata(meta, None) == 128
    assert sizing.batch_from_metadata({}, 5) is None
    assert sizing.batch_from_metadata({0: "batch_size=0"}, 5) is None


def test_a_failing_step_below_a_completed_one_is_not_told_to_shrink_its_batch():
    # rand_s24_c40_roundup4 died in step 4 having allocated 2.68 GiB of it (its steps do not repeat, so the
    # rest is unknown: a lower bound), while step 3 allocated 3.55 GiB and completed. The old text told it to
    # "shrink to 135%" of its batch and called 2.68 GiB "-25% more" than 3.55 GiB.
    dev = build_report(FIXTURES / "captures" / "rand_s24_c40_roundup4.pickle.gz", batch_size=32)["devices"][0]
    fit = dev["batch_fit"]
    assert fit["need_is_lower_bound"] and fit["need_bytes"] < fit["largest_fitting_step_peak_allocated_bytes"]
    assert fit["fraction"] == 1.0 and fit["excess_over_largest_fitting"] < 0
    assert (fit["fitting_batch"], fit["accumulation_steps"], fit["snippet"]) == (32, 1, None)
    assert fit["explanation"].startswith("The failing step needed at least 2.68 GiB (the rest of it is not known)")
    assert "nothing shows the batch is too big" in fit["explanation"] and "shrink" not in fit["explanation"]
    assert batch_suggestion(fit) is None
