"""SYNTHETIC framework-shaped traces: real allocations under the frames a framework would put around them.

Most users do not write the training loop themselves: Lightning runs the forward and the backward inside
``optimizer.step(closure)``, Hugging Face's ``Trainer`` calls the model from ``compute_loss`` and
``prediction_step``, DeepSpeed's engine wraps the model, the backward and the step, FSDP's hooks allocate
inside the backward. Until real captures of each exist (issue 37), these traces are made here: a real H200
capture of a plain loop (its allocations, sizes, addresses, segments, OOM and annotations untouched) whose
Python stacks are rewritten so that the loop's own line, and every frame outside it, becomes the chain the
framework's source shows for that part of the step (the call order read from each project's source:
Lightning's ``loops/optimization/automatic.py`` and precision plugin, transformers' ``trainer.py``,
accelerate's ``accelerator.py`` and ``optimizer.py``, DeepSpeed's ``runtime/engine.py``, FSDP's
``_runtime_utils.py``). Frames inside the loop's line (torch's module calls, autograd, torch/optim) are the
capture's own. Labelled synthetic wherever used: the frames are made, the memory is real.
"""

from __future__ import annotations

import gzip
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SITE = "/venv/lib/python3.12/site-packages"
USER = "/home/user/project"


def _f(path: str, line: int, name: str) -> dict[str, Any]:
    return {"filename": path, "line": line, "name": name}


def _lib(rel: str, line: int, name: str) -> dict[str, Any]:
    return _f(f"{SITE}/{rel}", line, name)


_MAIN = [_f(f"{USER}/train.py", 88, "main"), _f(f"{USER}/train.py", 95, "<module>")]

# ---------------------------------------------------------------- Lightning, automatic optimization
# fit -> ... -> _AutomaticOptimization._optimizer_step -> LightningModule.optimizer_step -> LightningOptimizer.step
# -> Strategy.optimizer_step -> Precision.optimizer_step -> torch's Optimizer.step(closure) -> (inside the step)
# Precision._wrap_closure -> Closure.__call__ -> Closure.closure -> _training_step / backward_fn.
_PL = "lightning/pytorch"
_PL_OUTER = [
    _lib(f"{_PL}/core/optimizer.py", 153, "step"),
    _lib(f"{_PL}/core/module.py", 1306, "optimizer_step"),
    _lib(f"{_PL}/trainer/call.py", 176, "_call_lightning_module_hook"),
    _lib(f"{_PL}/loops/optimization/automatic.py", 270, "_optimizer_step"),
    _lib(f"{_PL}/loops/optimization/automatic.py", 192, "run"),
    _lib(f"{_PL}/loops/training_epoch_loop.py", 251, "advance"),
    _lib(f"{_PL}/loops/training_epoch_loop.py", 140, "run"),
    _lib(f"{_PL}/loops/fit_loop.py", 355, "advance"),
    _lib(f"{_PL}/loops/fit_loop.py", 205, "run"),
    _lib(f"{_PL}/trainer/trainer.py", 1023, "_run_stage"),
    _lib(f"{_PL}/trainer/trainer.py", 979, "_run"),
    _lib(f"{_PL}/trainer/trainer.py", 580, "_fit_impl"),
    _lib(f"{_PL}/trainer/call.py", 47, "_call_and_handle_interrupt"),
    _lib(f"{_PL}/trainer/trainer.py", 544, "fit"),
    *_MAIN,
]
# torch's own step frames around the closure call (the capture's optimizer frames carry their own).
_PL_STEP = [
    _lib(f"{_PL}/plugins/precision/precision.py", 122, "optimizer_step"),
    _lib(f"{_PL}/strategies/strategy.py", 239, "optimizer_step"),
    *_PL_OUTER,
]
_PL_IN_CLOSURE = [
    _lib(f"{_PL}/loops/optimization/automatic.py", 146, "__call__"),
    _lib(f"{_PL}/plugins/precision/precision.py", 108, "_wrap_closure"),
    _lib("torch/optim/adamw.py", 209, "step"),
    _lib("torch/optim/optimizer.py", 79, "_use_grad"),
    _lib("torch/optim/optimizer.py", 485, "wrapper"),
    *_PL_STEP,
]
_PL_CLOSURE = [
    _lib(f"{_PL}/loops/optimization/automatic.py", 129, "closure"),
    _lib("torch/utils/_contextlib.py", 116, "decorate_context"),
    *_PL_IN_CLOSURE,
]
_PL_TRAINING_STEP = [
    _f(f"{USER}/lit_model.py", 31, "training_step"),
    _lib(f"{_PL}/strategies/strategy.py", 390, "training_step"),
    _lib(f"{_PL}/trainer/call.py", 319, "_call_strategy_hook"),
    _lib(f"{_PL}/loops/optimization/automatic.py", 318, "_training_step"),
    *_PL_CLOSURE,
]
LIGHTNING: dict[str, list[dict[str, Any]]] = {
    "forward": _PL_TRAINING_STEP,
    "other": _PL_TRAINING_STEP,
    "backward": [
        _lib(f"{_PL}/core/module.py", 1094, "backward"),
        _lib(f"{_PL}/plugins/precision/precision.py", 72, "backward"),
        _lib(f"{_PL}/strategies/strategy.py", 213, "backward"),
        _lib(f"{_PL}/trainer/call.py", 319, "_call_strategy_hook"),
        _lib(f"{_PL}/loops/optimization/automatic.py", 241, "backward_fn"),
        *_PL_CLOSURE,
    ],
    "optimizer": _PL_STEP,
    # An evaluation the user runs from a callback (Lightning's own validation loop runs under no_grad).
    "eval": [
        _f(f"{USER}/callbacks.py", 17, "on_train_batch_end"),
        _lib(f"{_PL}/trainer/call.py", 218, "_call_callback_hooks"),
        _lib(f"{_PL}/loops/training_epoch_loop.py", 296, "advance"),
        *_PL_OUTER[6:],
    ],
    "data": [
        _lib("lightning/fabric/utilities/apply_func.py", 103, "move_data_to_device"),
        _lib(f"{_PL}/strategies/strategy.py", 280, "batch_to_device"),
        _lib(f"{_PL}/loops/training_epoch_loop.py", 230, "advance"),
        *_PL_OUTER[6:],
    ],
}

# ---------------------------------------------------------------- Hugging Face Trainer (accelerate under it)
# train -> _inner_training_loop -> training_step -> compute_loss -> model(**inputs); accelerator.backward(loss);
# optimizer.step() through accelerate's AcceleratedOptimizer; evaluate -> evaluation_loop -> prediction_step.
# The line numbers are transformers 5.17's, as the captures helper's CPU dry run recorded them
# (tests/fixtures/diagnosis/fw_frames.json on its branch): both passes call the model through compute_loss.
_HF = "transformers/trainer.py"
_HF_LOOP = [_lib(_HF, 1842, "_run_epoch"), _lib(_HF, 1602, "_inner_training_loop"), _lib(_HF, 1520, "train"), *_MAIN]
_HF_STEP = [_lib(_HF, 2014, "training_step"), *_HF_LOOP]
_HF_EVAL = [
    _lib(_HF, 2879, "evaluation_loop"),
    _lib(_HF, 2754, "evaluate"),
    _lib(_HF, 3171, "_evaluate"),
    _lib(_HF, 2196, "_maybe_log_save_evaluate"),
    _lib(_HF, 1883, "_run_epoch"),
    *_HF_LOOP[1:],
]
HF_TRAINER: dict[str, list[dict[str, Any]]] = {
    "forward": [_lib(_HF, 2088, "compute_loss"), *_HF_STEP],
    "other": _HF_STEP,
    "backward": [_lib("accelerate/accelerator.py", 2861, "backward"), _lib(_HF, 2044, "training_step"), *_HF_LOOP],
    "optimizer": [
        _lib("accelerate/optimizer.py", 186, "step"),
        _lib("torch/optim/lr_scheduler.py", 166, "wrapper"),
        _lib(_HF, 1868, "_run_epoch"),
        *_HF_LOOP[1:],
    ],
    "data": [_lib(_HF, 2000, "_prepare_inputs"), *_HF_STEP],
    # A subclass's prediction_step (the user's file): Trainer's own runs under torch.no_grad().
    "eval": [_f(f"{USER}/my_trainer.py", 22, "prediction_step"), *_HF_EVAL],
    # Trainer's own prediction_step calling the model through compute_loss.
    "trainer_eval": [_lib(_HF, 2088, "compute_loss"), _lib(_HF, 3137, "prediction_step"), *_HF_EVAL],
}

# Trainer's evaluation loop gathering each batch's outputs on the GPU (no eval_accumulation_steps):
# evaluation_loop -> EvalLoopContainer.add -> nested_concat -> torch_pad_and_concatenate (real frames:
# trainer_pt_utils.py add, trainer.py:2891 evaluation_loop in the captures helper's fw_frames.json).
HF_EVAL_GATHER: dict[str, list[dict[str, Any]]] = {
    "forward": HF_TRAINER["trainer_eval"],
    "other": [
        _lib("transformers/trainer_pt_utils.py", 134, "torch_pad_and_concatenate"),
        _lib("transformers/trainer_pt_utils.py", 167, "nested_concat"),
        _lib("transformers/trainer_pt_utils.py", 377, "add"),
        _lib(_HF, 2891, "evaluation_loop"),
        *_HF_EVAL[1:],
    ],
}

# ---------------------------------------------------------------- DeepSpeed's engine
# engine(batch) is a module call into DeepSpeedEngine.forward -> self.module(...); engine.backward(loss);
# engine.step() -> _take_model_step -> the ZeRO optimizer's step -> torch's optimizer.
_DS = "deepspeed/runtime/engine.py"
DEEPSPEED: dict[str, list[dict[str, Any]]] = {
    "forward": [
        _lib(_DS, 1899, "forward"),
        _lib("deepspeed/utils/nvtx.py", 18, "wrapped_fn"),
        _lib("torch/nn/modules/module.py", 1784, "_call_impl"),
        _lib("torch/nn/modules/module.py", 1773, "_wrapped_call_impl"),
        *_MAIN,
    ],
    "other": _MAIN,
    "backward": [_lib(_DS, 2046, "backward"), _lib("deepspeed/utils/nvtx.py", 18, "wrapped_fn"), *_MAIN],
    "optimizer": [
        _lib("deepspeed/runtime/zero/stage_1_and_2.py", 1876, "step"),
        _lib(_DS, 2159, "_take_model_step"),
        _lib(_DS, 2266, "step"),
        *_MAIN,
    ],
    "data": _MAIN,
    # The engine called from the user's evaluation line.
    "eval": [
        _lib(_DS, 1899, "forward"),
        _lib("deepspeed/utils/nvtx.py", 18, "wrapped_fn"),
        _lib("torch/nn/modules/module.py", 1784, "_call_impl"),
        _lib("torch/nn/modules/module.py", 1773, "_wrapped_call_impl"),
        _f(f"{USER}/train.py", 120, "evaluate"),
        *_MAIN,
    ],
}

# ---------------------------------------------------------------- vLLM's model runner capturing its graphs
# LLM(...) -> LLMEngine -> the worker's _warm_up_model -> ModelRunner.capture_model -> CUDAGraphRunner.capture,
# which runs the model inside torch.cuda.graph (vllm/worker/model_runner.py, the v0 runner).
_VLLM = "vllm/worker/model_runner.py"
VLLM_CAPTURE: dict[str, list[dict[str, Any]]] = {
    "forward": [
        _lib(_VLLM, 1420, "capture"),
        _lib(_VLLM, 1146, "capture_model"),
        _lib("torch/utils/_contextlib.py", 116, "decorate_context"),
        _lib("vllm/worker/worker.py", 231, "_warm_up_model"),
        _lib("vllm/engine/llm_engine.py", 407, "_initialize_kv_caches"),
        _lib("vllm/entrypoints/llm.py", 177, "__init__"),
        *_MAIN,
    ],
}

# ---------------------------------------------------------------- FSDP 1's post-backward hook
# Run by the autograd engine (on its thread, so no torch/autograd Python frame): reduce-scatter buffers.
# A plain loop's frames (no role rewritten) with these on its backward's frame-less allocations.
FSDP_POST_BACKWARD = [
    _lib("torch/distributed/fsdp/_runtime_utils.py", 715, "_post_backward_hook"),
    _lib("torch/utils/_contextlib.py", 116, "decorate_context"),
]


def role_of(frames: list[dict[str, Any]], k: int, eval_lines: frozenset[int], data_lines: frozenset[int]) -> str:
    """The part of the step that the loop's frame ``frames[k]`` runs, from the capture's frames inside it."""
    inner = frames[:k]
    line = int(frames[k]["line"])
    if line in eval_lines:
        return "eval"
    if line in data_lines:
        return "data"
    if any("/torch/optim/" in f["filename"] for f in inner):
        return "optimizer"
    if any(f["filename"].endswith("torch/_tensor.py") and f["name"] == "backward" for f in inner):
        return "backward"
    if any(f["name"] in ("_call_impl", "_wrapped_call_impl") for f in inner):
        return "forward"
    return "other"


def reshaped(
    source: Path,
    workload: str | frozenset[str],
    shape: Mapping[str, list[dict[str, Any]]],
    *,
    eval_lines: frozenset[int] = frozenset(),
    data_lines: frozenset[int] = frozenset(),
    closure_windows: bool = False,
    frameless_backward_frames: list[dict[str, Any]] | None = None,
    roles: dict[str, int] | None = None,
) -> bytes:
    """The snapshot pickle of ``source`` (a capture of ours) with each event's frames from the workload
    function ``workload`` outwards replaced by ``shape``'s chain for its role (a role ``shape`` lacks keeps
    the capture's frames). ``closure_windows``: the
    ``Optimizer.step`` annotations open with the step's first forward allocation (the closure runs inside the
    step). ``frameless_backward_frames``: the frames given to every frame-less allocation between a backward's
    start and the next optimizer allocation (a hook run by the autograd engine). ``roles`` counts the events
    rewritten per role."""
    snap = pickle.loads(gzip.decompress(source.read_bytes()))  # our own fixture, not an upload
    counts = roles if roles is not None else {}
    names = frozenset({workload}) if isinstance(workload, str) else workload
    first_forward_us: list[int] = []
    in_backward = False
    for trace in snap["device_traces"]:
        for e in trace:
            frames = e.get("frames") or []
            k = next((i for i, f in enumerate(frames) if f["name"] in names), -1)
            if k < 0:
                if frameless_backward_frames and in_backward and not frames and e["action"] == "alloc":
                    e["frames"] = list(frameless_backward_frames)
                    counts["hook"] = counts.get("hook", 0) + 1
                continue
            role = role_of(frames, k, eval_lines, data_lines)
            if role in shape:
                e["frames"] = frames[:k] + shape[role]
            counts[role] = counts.get(role, 0) + 1
            in_backward = (role == "backward") or (in_backward and role not in ("optimizer", "forward", "eval"))
            if role == "forward" and e["action"] == "alloc":
                first_forward_us.append(int(e["time_us"]))
    if closure_windows:
        _open_windows_at_the_closure(snap, sorted(first_forward_us))
    return pickle.dumps(snap)


def _open_windows_at_the_closure(snap: dict[str, Any], forward_us: list[int]) -> None:
    """Each ``Optimizer.step`` window starts at the first forward allocation after the previous window ended."""
    previous_end = 0
    for i, a in enumerate(snap.get("external_annotations") or []):
        if a["stage"] == "END":
            previous_end = int(a["time_us"])
        elif a["stage"] == "START" and a["name"].startswith("Optimizer.step"):
            first = next((t for t in forward_us if previous_end < t < int(a["time_us"])), None)
            if first is not None:
                snap["external_annotations"][i] = dict(a, time_us=first - 1)
