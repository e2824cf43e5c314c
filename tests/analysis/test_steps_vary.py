"""Steps whose shapes vary (issue 23, item 3): the projection answers from a recorded step like the
failing one and says which, or gives no step-level answer. Real H200 runs of the lead's issue-23 batch
(tests/fixtures/captures, docs/captures.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from analysis.allocator import trace_is_complete
from analysis.allocator.config import AllocatorConfig
from analysis.model import OOM, DeviceData, Snapshot
from analysis.projection import MIN_COHERENT, Projection, project_failing_step
from analysis.reader import read_snapshot
from analysis.steps import find_steps
from analysis.stepwhatif import step_whatif

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"


def _projection(name: str) -> tuple[Projection, Snapshot, DeviceData, list[int]]:
    s = read_snapshot(CAPTURES / f"{name}.pickle.gz")
    dev = s.devices[0]
    t = dev.trace
    steps = find_steps(s.annotations, 0, t.time_us)
    recorded = AllocatorConfig.from_settings(s.settings.raw, s.settings.conf)
    oom = int(np.flatnonzero(t.action == OOM)[-1])
    proj = project_failing_step(t, steps, oom, recorded, trace_complete=trace_is_complete(dev))
    return proj, s, dev, steps.last_event.tolist()


def test_gradient_accumulation_steps_are_optimizer_steps_and_unlike_one_another() -> None:
    # accum_c80_roundup2: HF GPT-2 with four micro-batches of 128-1024 tokens per optimizer step
    # (step 0: 469, 777, 976, 771; step 1: 253, 382, 666, 244), died in optimizer step 2. The
    # step is the optimizer step with its micro-steps: two complete steps, the OOM in the third.
    truth = json.loads((CAPTURES / "accum_c80_roundup2.truth.json").read_text())
    assert truth["died_step"] == 2 and len(truth["workload_log"]) == 2
    assert truth["workload_log"][0]["micro_lens"] == [469, 777, 976, 771]
    proj, _s, _dev, ends = _projection("accum_c80_roundup2")
    assert len(ends) == 2 and proj.step == 2
    # Each micro-batch grew by its own factor against step 1's: of the bytes that changed, almost
    # none changed by the common ratio. The rest of the step (its later micro-batches' lengths)
    # is not in the trace: no step-level answer, rather than one built from step 1's lengths.
    assert not proj.available
    assert proj.coherent < 0.01 < MIN_COHERENT
    assert "unlike" in proj.reason and "step 1" in proj.reason


def test_random_sizes_that_scale_together_are_projected_from_the_step_they_are_like() -> None:
    # unetrand_c80_default: a UNet on random image sizes and batches died in step 14 (the
    # batch-and-size product more than doubled against step 13); every activation scaled by
    # about the same factor, so step 13 is like it (95% of the changed bytes by one ratio), and
    # the projected step does not complete under expandable segments, as the real rerun under
    # them (unetrand_c80_expandable) died in step 14 too.
    proj, s, dev, ends = _projection("unetrand_c80_default")
    assert proj.available and (proj.step, proj.template_step) == (14, 13)
    assert proj.to_json()["template_coherence"] >= 0.94 and round(proj.ratio, 2) == 2.14
    rerun = json.loads((CAPTURES / "unetrand_c80_expandable.truth.json").read_text())
    assert rerun["died_step"] == 14
    cap = int(json.loads((CAPTURES / "unetrand_c80_default.truth.json").read_text())["cap_bytes"])
    item = step_whatif(s, dev, "expandable_segments:True", cap, ends, proj)
    assert item["step_completes"] is False and item["placement"]["certain"] is True


def _cap(name: str) -> int:
    return int(json.loads((CAPTURES / f"{name}.truth.json").read_text())["cap_bytes"])


def _died(name: str) -> int | None:
    died: int | None = json.loads((CAPTURES / f"{name}.truth.json").read_text())["died_step"]
    return died


def test_the_issue_example_divisions_do_not_save_gpt_varlen() -> None:
    # gpt_varlen_c70 (the shared gpt_varlen_oom rerun): the report said roundup_power2_divisions:4
    # lets step 23 complete; the real run under it died in step 23, as under divisions 2.
    proj, s, dev, ends = _projection("gpt_varlen_c70_default")
    assert proj.available and (proj.step, proj.template_step) == (23, 22)
    for name, conf in (("roundup4", "roundup_power2_divisions:4"), ("roundup2", "roundup_power2_divisions:2")):
        assert _died(f"gpt_varlen_c70_{name}") == 23
        item = step_whatif(s, dev, conf, _cap("gpt_varlen_c70_default"), ends, proj)
        assert item["step_completes"] is False and item["caught_ooms"] is None


def test_a_whatif_that_serves_a_survived_oom_gives_no_step_answer_where_it_hangs_on_it() -> None:
    # unetrr_c104_default: a UNet on random batches and resolutions under 1.04 x its peak
    # allocated died in step 1; before the fatal OOM (254,803,968 B) cuDNN probed 32 algorithms'
    # workspace of 254,878,208 B and each probe failed, caught: 33 oom entries. Under expandable
    # segments the what-if serves the first probe. Kept to the end (the model's rule for the fatal
    # entry), the step does not complete; freed at once (a workspace, used and given back), it
    # does; the real rerun (unetrr_c104_expandable) ran all 30 steps. The trace cannot tell: no
    # step-level answer, both given.
    proj, s, dev, ends = _projection("unetrr_c104_default")
    t = dev.trace
    ooms = np.flatnonzero(t.action == OOM)
    assert len(ooms) == 33 and set(t.size[ooms[:-1]].tolist()) == {254_878_208}
    assert int(t.size[ooms[-1]]) == 254_803_968
    assert proj.available and (proj.step, proj.template_step) == (1, 0)
    cap = _cap("unetrr_c104_default")
    item = step_whatif(s, dev, "expandable_segments:True", cap, ends, proj)
    assert item["caught_ooms"] == {
        "caught_served": True,
        "completes_kept": False,
        "completes_freed": True,
        "certain": False,
    }
    assert item["step_completes"] is None
    assert _died("unetrr_c104_expandable") is None
    # Where the what-if fails the probes too (max_split_size_mb:128), the answer stands: the step
    # does not complete, and the real rerun died in step 1.
    other = step_whatif(s, dev, "max_split_size_mb:128", cap, ends, proj)
    assert other["caught_ooms"] is None and other["step_completes"] is False
    assert _died("unetrr_c104_maxsplit128") == 1


def test_a_whatif_from_a_divisions_run_asks_for_the_request_behind_the_oom_entry() -> None:
    # llama_c75_roundup4 died in step 7 at an oom entry of 805,306,368 B: the request rounded to
    # 768 MiB under divisions 4, which hides up to 128 MiB of it. Step 6's like request, projected,
    # is 686,976,000 B and rounds to the entry: the what-if of expandable segments with the default
    # rounding asks for that, and the step completes, as the real rerun under expandable segments
    # (llama_c75_expandable) ran on. Asked for the entry's 768 MiB, it said the step fails.
    from analysis.projection import least_request

    proj, s, dev, ends = _projection("llama_c75_roundup4")
    t = dev.trace
    assert int(t.size[np.flatnonzero(t.action == OOM)[-1]]) == 805_306_368
    assert proj.tail is not None and proj.tail.size[0] == 686_976_000 and proj.oom_request_low is None
    conf, cap = "expandable_segments:True,roundup_power2_divisions:1", _cap("llama_c75_roundup4")
    assert step_whatif(s, dev, conf, cap, ends, proj)["step_completes"] is True
    assert _died("llama_c75_expandable") is None
    # Without a like request that tells it, the entry stands for any request from the least that
    # rounds to it: the step is replayed at both ends, and here the answer differs: none.
    recorded = AllocatorConfig.from_settings(s.settings.raw, s.settings.conf)
    assert least_request(recorded, 805_306_368) == 671_088_641
    assert least_request(recorded, 671_088_640) == 536_870_913
    assert least_request(AllocatorConfig(), 743_040_000) == 743_040_000 - 511
    proj.tail.size[0] = 805_306_368
    proj.oom_request_low = least_request(recorded, 805_306_368)
    item = step_whatif(s, dev, conf, cap, ends, proj)
    assert item["oom_request_range"] == {
        "low_bytes": 671_088_641,
        "high_bytes": 805_306_368,
        "completes_low": True,
        "completes_high": False,
        "certain": False,
    }
    assert item["step_completes"] is None


def test_under_the_garbage_collector_the_limit_range_is_always_probed() -> None:
    # gpt_autocast_c75_roundup4: the OOM message says 5.10 GiB allowed (5,476,083,302 B); the cap
    # was 5,478,285,312 B. Under garbage_collection_threshold:0.7 (a share of the limit) the step is
    # 18 MB short at the message's figure, more than the two decimals leave above it, yet complete
    # at the real cap, as the real rerun (gpt_autocast_c75_gc07) ran on. The high end is probed
    # whatever the shortfall, and the answer flips inside the range: none.
    proj, s, dev, ends = _projection("gpt_autocast_c75_roundup4")
    gib = 1 << 30
    conf = "garbage_collection_threshold:0.7,roundup_power2_divisions:1"
    span = (int(5.095 * gib), int(5.105 * gib))
    item = step_whatif(s, dev, conf, int(5.10 * gib), ends, proj, limit_range=span)
    assert item["step_shortfall_bytes"] == 18_454_938
    assert item["step_completes_range"] is not None and item["step_completes_range"]["completes_at_probe"] is True
    assert item["step_completes"] is None
    assert step_whatif(s, dev, conf, _cap("gpt_autocast_c75_roundup4"), ends, proj)["step_completes"] is True
    assert _died("gpt_autocast_c75_gc07") is None
