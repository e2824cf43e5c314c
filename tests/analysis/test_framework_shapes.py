"""The first answer where a framework wraps the loop (issue 32, item 1), on SYNTHETIC framework-shaped traces:
real H200 captures of plain loops whose Python frames are rewritten to the call chains of Lightning's automatic
optimization, Hugging Face's Trainer, DeepSpeed's engine and FSDP's backward hooks (tests/analysis/fwshapes.py
says how). The memory is the capture's own, so the answer must be the plain loop's: a phase is the innermost
pass holding the allocation, never the outermost frame."""

from __future__ import annotations

import functools
import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from analysis.report import build_report
from tests.analysis import fwshapes as fw

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
DIAG = FIXTURES / "diagnosis"
OPTIM = DIAG / "optim_mlp_default.pickle.gz"  # AdamW (foreach) dies in its first step
EVAL = DIAG / "eval_bert_default.pickle.gz"  # an evaluation without no_grad dies in its forward
GROW = FIXTURES / "grow_resnet_default.pickle.gz"  # a growing batch dies in a training forward (SGD)
# The capture's own lines (scripts/capture_diagnosis.py): the batch made on the GPU, the evaluation.
OPTIM_DATA = frozenset({150})
EVAL_DATA = frozenset({241, 242, 255})
EVAL_LINES = frozenset({256, 257})


def _message(source: Path) -> str | None:
    return json.loads(source.with_name(source.name.replace(".pickle.gz", ".truth.json")).read_text()).get("oom_message")


@functools.cache
def _oom_device(source: Path, shape: str = "", variant: str = "") -> dict[str, Any]:
    """The OOM device of ``source``'s report, its frames reshaped as ``shape`` ("" = the capture as it is)."""
    workload = {OPTIM: "optim_mlp", EVAL: "eval_bert", GROW: "_train"}[source]
    data_lines = {OPTIM: OPTIM_DATA, EVAL: EVAL_DATA, GROW: frozenset()}[source]
    eval_lines = EVAL_LINES if source == EVAL else frozenset()
    shapes = {
        "": {},
        "lightning": fw.LIGHTNING,
        "hf": fw.HF_TRAINER,
        "hf_trainer_eval": {**fw.HF_TRAINER, "eval": fw.HF_TRAINER["trainer_eval"]},
        "deepspeed": fw.DEEPSPEED,
    }
    roles: dict[str, int] = {}
    data: bytes | Path = source
    if shape or variant:
        data = fw.reshaped(
            source,
            workload,
            shapes[shape],
            eval_lines=eval_lines,
            data_lines=data_lines,
            closure_windows=shape == "lightning",
            frameless_backward_frames=fw.FSDP_POST_BACKWARD if variant == "fsdp_hooks" else None,
            roles=roles,
        )
        if shape:
            assert roles.get("forward", 0) > 0 and roles.get("optimizer", 0) > 0, roles  # the frames were rewritten
    if variant == "no_multi_tensor":
        data = _without_multi_tensor_frames(data)
    report = build_report(data, oom_message=_message(source))
    return next(d for d in report["devices"] if d.get("oom"))  # type: ignore[no-any-return]


def _without_multi_tensor_frames(data: bytes | Path) -> bytes:
    """The snapshot with every ``_multi_tensor_*`` frame dropped (an optimizer whose frames do not say foreach)."""
    raw = data.read_bytes() if isinstance(data, Path) else data
    snap = pickle.loads(gzip.decompress(raw) if isinstance(data, Path) else raw)  # our own fixture
    dropped = 0
    for trace in snap["device_traces"]:
        for e in trace:
            frames = e.get("frames") or []
            kept = [f for f in frames if not f["name"].startswith("_multi_tensor")]
            dropped += len(frames) - len(kept)
            e["frames"] = kept
    assert dropped > 0
    return pickle.dumps(snap)


def _primary(dev: dict[str, Any]) -> dict[str, Any] | None:
    d = dev["diagnosis"]
    return next((c for c in d["causes"] if c["id"] == d["primary"]), None)


def test_lightning_closure_forward_oom_is_forward_not_the_optimizer() -> None:
    """Lightning's optimizer.step(closure): the forward that died (a growing batch under SGD) carries
    torch/optim frames outside it. Before the rule change this read "inside optimizer.step() (SGD, foreach),
    7.65 GiB of temporaries"; it is the forward, with the plain loop's answer."""
    plain, wrapped = _oom_device(GROW), _oom_device(GROW, "lightning")
    assert wrapped["diagnosis"]["oom_phase"] == plain["diagnosis"]["oom_phase"] == "forward"
    assert "optimizer_step" not in [c["id"] for c in wrapped["diagnosis"]["causes"]]
    assert wrapped["diagnosis"]["live_by_phase_at_oom"] == plain["diagnosis"]["live_by_phase_at_oom"]
    assert wrapped["diagnosis"]["live_by_phase_at_oom"]["forward"] == 7_915_495_424
    assert wrapped["decision"].get("cause") == plain["decision"].get("cause")
    assert wrapped["oom"]["verdict"] == plain["oom"]["verdict"] == "capacity"


@pytest.mark.parametrize("shape", ["lightning", "hf", "deepspeed"])
def test_an_oom_in_the_step_itself_is_still_the_optimizer_step(shape: str) -> None:
    """AdamW's first step under each wrapper: the same cause, figures and foreach (its frames show it)."""
    plain, wrapped = _oom_device(OPTIM), _oom_device(OPTIM, shape)
    cause, plain_cause = _primary(wrapped), _primary(plain)
    assert cause is not None and plain_cause is not None
    assert cause["id"] == "optimizer_step"
    assert cause["figures"] == plain_cause["figures"]
    assert cause["figures"]["implementation"] == "foreach"
    assert cause["figures"]["temporaries_bytes"] == 201_375_744
    assert cause["saving_bytes"] == plain_cause["saving_bytes"] == 268_484_608
    assert wrapped["diagnosis"]["live_by_phase_at_oom"] == plain["diagnosis"]["live_by_phase_at_oom"]


def test_no_foreach_without_a_multi_tensor_frame() -> None:
    """The same step with its _multi_tensor_* frames gone: the implementation is not named, nor the request
    the foreach step alone would make counted as saved."""
    cause = _primary(_oom_device(OPTIM, variant="no_multi_tensor"))
    assert cause is not None and cause["id"] == "optimizer_step"
    assert cause["figures"]["implementation"] is None
    assert "foreach" not in cause["headline"] and "foreach" not in cause["evidence"]
    assert cause["saving_bytes"] == cause["figures"]["temporaries_bytes"] == 201_375_744


def test_hf_trainer_evaluation_without_no_grad_names_its_prediction_step() -> None:
    """Trainer.train -> evaluate -> evaluation_loop -> a prediction_step override without no_grad."""
    plain, wrapped = _oom_device(EVAL), _oom_device(EVAL, "hf")
    cause, plain_cause = _primary(wrapped), _primary(plain)
    assert cause is not None and plain_cause is not None
    assert cause["id"] == "forward_without_no_grad"
    assert cause["figures"]["site"] == "project/my_trainer.py:22 prediction_step"
    assert cause["saving_bytes"] == plain_cause["saving_bytes"] == 3_629_977_600


def test_hf_trainers_own_calls_of_the_model_are_the_passes_sites() -> None:
    """The user's one line (trainer.train()) is under every pass, and both of the Trainer's passes call the model
    through compute_loss (real frames, transformers 5.17): training_step and prediction_step tell them apart."""
    dev = _oom_device(EVAL, "hf_trainer_eval")
    cause = _primary(dev)
    assert cause is not None and cause["id"] == "forward_without_no_grad"
    assert cause["figures"]["site"] == "transformers/trainer.py:3137 prediction_step"
    assert cause["figures"]["held_bytes"] == 4_233_957_376


def test_fsdp_backward_hooks_are_the_backward() -> None:
    """FSDP's _post_backward_hook runs on the autograd engine's thread (no torch/autograd frame): its
    allocations, and the frame-less ones after them, are the backward's."""
    plain, hooked = _oom_device(EVAL), _oom_device(EVAL, variant="fsdp_hooks")
    assert hooked["diagnosis"]["live_by_phase_at_oom"] == plain["diagnosis"]["live_by_phase_at_oom"]
    assert hooked["diagnosis"]["live_by_phase_at_oom"]["backward"] == 33_554_432
    assert hooked["diagnosis"]["primary"] == "forward_without_no_grad"


def test_hf_trainers_gathered_eval_outputs_are_no_kv_cache() -> None:
    """Trainer's evaluation loop concatenating every batch's outputs on the GPU (EvalLoopContainer.add ->
    nested_concat, no eval_accumulation_steps): the allocations of the capture's concatenating decoder under the
    Trainer's frames. The answer is eval_accumulation_steps, not a static KV cache."""
    kv = DIAG / "kv_manual_default.pickle.gz"
    roles: dict[str, int] = {}
    data = fw.reshaped(kv, "kv_manual", fw.HF_EVAL_GATHER, roles=roles)
    assert roles["other"] > 0 and roles["forward"] > 0
    report = build_report(data, oom_message=_message(kv))
    dev = next(d for d in report["devices"] if d.get("oom"))
    assert [c["id"] for c in dev["diagnosis"]["causes"]] == ["eval_outputs_on_gpu"]
    assert dev["decision"]["cause"] == "eval_outputs_on_gpu"
    assert "eval_accumulation_steps" in dev["decision"]["change"]["line"]
    cause = dev["diagnosis"]["causes"][0]
    # The blocks of the capture's two concatenating lines (one group under the Trainer's frames) live at the OOM.
    assert cause["figures"]["gathered_bytes"] == 5_088_739_328
    assert cause["figures"]["bytes_per_batch"] == 131_072


def test_vllms_captured_graphs_get_vllms_own_knobs() -> None:
    """The capture's per-size CUDA graph pools under vLLM's model runner frames (capture_model ->
    CUDAGraphRunner.capture): the same cause and figures, with vLLM's own change (its capture sizes, eager mode),
    not a torch.cuda.graph pool handle the user cannot reach."""
    source = DIAG / "graphs_manual_default.pickle.gz"
    roles: dict[str, int] = {}
    data = fw.reshaped(source, "graphs_manual", fw.VLLM_CAPTURE, roles=roles)
    assert roles["forward"] > 0
    dev = next(d for d in build_report(data, oom_message=_message(source))["devices"] if d.get("oom"))
    plain = next(d for d in build_report(source, oom_message=_message(source))["devices"] if d.get("oom"))
    cause, plain_cause = _primary(dev), _primary(plain)
    assert cause is not None and plain_cause is not None
    assert cause["id"] == plain_cause["id"] == "cuda_graph_pools"
    assert cause["figures"] == plain_cause["figures"]
    assert "cudagraph_capture_sizes" in cause["fix"]["line"] and "enforce_eager=True" in cause["fix"]["line"]
    assert "graph_pool_handle" in plain_cause["fix"]["line"]


def test_lightning_closures_forward_is_not_filed_as_optimizer_memory() -> None:
    """The categories read the innermost pass too (analysis.categories.closure_pass): the growing batch's forward
    under Lightning's optimizer.step(closure) is the plain loop's temporaries, and the optimizer state is the
    optimizer's alone (before: the closure's allocations inflated it by 68.5 MB that were a workspace)."""
    plain, wrapped = _oom_device(GROW)["categories"]["bytes"], _oom_device(GROW, "lightning")["categories"]["bytes"]
    for name in ("parameters", "gradients", "optimizer_state", "temporaries"):
        assert wrapped[name] == plain[name], name
    assert wrapped["optimizer_state"] == 105_771_008
    assert wrapped["temporaries"] == 7_959_741_440
    # The closure windows move where "alive after the last step" starts: a 320 KB batch tensor changes hands.
    assert wrapped["activations"] + wrapped["unknown"] == plain["activations"] + plain["unknown"]
