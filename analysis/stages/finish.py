"""The last stages, once every device is analysed: the capture section, then each device's verdicts.

The suggestions, sizing and the decision of a device wait for the capture section (the advisor's capture
rule reads it).

``capture_section(...) -> dict`` (contract ``capture``: the reader's and each device's warnings),
``finish_device(...)`` (``advice.advise``, ``sizing.size``, ``decision.decide``, the run verdict) and
``doctor_into(...)`` (``capture.doctor``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analysis import advice as advice_mod
from analysis import doctor, sizing
from analysis.causes import Diagnosis, rule_named
from analysis.decision import decide, device_full_unexplained, run_verdict
from analysis.decision_input import DecisionInput
from analysis.limits import OomMessage
from analysis.model import DeviceData, Snapshot
from analysis.stacks import is_python_frame
from analysis.stages.source import Source


@dataclass(frozen=True)
class DeviceOutcome:
    """What the report keeps of one device once its stages are done."""

    entry: dict[str, Any]  # the contract entry, sizing and decision still to come
    advice: advice_mod.AdviceContext
    oom_index: int | None
    trace_complete: bool
    replay_warnings: tuple[Any, ...]  # the recorded replay's (code, message) warnings
    warnings: tuple[tuple[str, str], ...]  # this analysis's own (code, message) warnings
    sizing: sizing.SizingInput  # what sizing reads of the device, typed (``sizing_input``)


def capture_section(src: Source, message: OomMessage | None, outcomes: list[DeviceOutcome]) -> dict[str, Any]:
    """Contract ``capture`` (its ``doctor`` left for ``doctor_into``): what the snapshot holds, and every
    warning, the reader's first, then each device's."""
    snapshot, devices = src.snapshot, list(src.devices)
    warnings = _warnings(snapshot, devices, outcomes)
    if message is not None and not any(src.message_for(message, d.device) for d in devices):
        warnings.append(_message_unused(message))
    has_trace = any(len(d.trace) > 1 for d in devices)
    capture = {
        "has_trace": has_trace,
        "trace_complete": bool(all(o.trace_complete for o in outcomes) and has_trace),
        "has_frames": bool(snapshot.stacks.stacks),
        "stacks": _stacks_kind(snapshot),
        "allocator_settings": _jsonable(snapshot.settings.raw),
        "warnings": warnings,
    }
    if not has_trace and not any(w["code"] == "state-only" for w in warnings):
        warnings.append({"code": "no-history", "message": "the snapshot holds no allocation history"})
    return capture


def finish_device(outcome: DeviceOutcome, dev: DeviceData, capture: dict[str, Any], batch_size: int | None) -> None:
    """The last stages, once the capture section is known (the advisor's capture rule needs it):
    the suggestions, sizing (``sizing.size``) and the decision, written into the device's entry.
    Without a batch size from the user, the device's metadata may name one (``sizing.batch_from_metadata``)."""
    if batch_size is None:
        batch_size = sizing.batch_from_metadata(dev.user_metadata, outcome.oom_index)
    dev_report = outcome.entry
    outcome.advice.capture = capture
    sized = sizing.size(outcome.sizing, advice_mod.advise(outcome.advice), outcome.advice, batch_size)
    dev_report["suggestions"] = sized.suggestions
    dev_report["batch_fit"] = sized.batch_fit
    dev_report["gpu_fit"] = sized.gpu_fit
    dev_report["ranked"] = sized.ranked
    dev_report["decision"] = decide(DecisionInput.of(dev_report), capture)
    if dev_report.get("oom"):
        dev_report["oom"].update(run_verdict(dev_report) or {})


def sizing_input(entry: dict[str, Any], diagnosis: Diagnosis) -> sizing.SizingInput:
    """What sizing reads of one device, typed once from the figures its contract entry shows (``oom``,
    ``steps``, ``categories``, ``summary``, ``whatif``: the stages wrote every one of these keys) and the
    primary cause (``causes.Diagnosis.primary``)."""
    oom = entry["oom"]
    figures = None
    if oom is not None:
        figures = sizing.OomFigures(
            event_index=int(oom["event_index"]),
            allocated=int(oom["allocated_bytes"]),
            requested=int(oom["requested_bytes"]),
            limit=int(oom["limit_bytes"]),
            step_need=None if oom["step_need_bytes"] is None else int(oom["step_need_bytes"]),
            non_pytorch=None if oom["non_pytorch_bytes"] is None else int(oom["non_pytorch_bytes"]),
            device_full_unexplained=device_full_unexplained(oom),
            reserved=int(oom["reserved_bytes"]),
            cached_free=int(oom["cached_free_bytes"]),
        )
    steps = tuple(
        sizing.StepFigures(
            int(s["index"]),
            int(s["last_event"]),
            int(s["peak_allocated_bytes"]),
            int(s["peak_reserved_bytes"]),
            bool(s["complete"]),
        )
        for s in entry["steps"]
    )
    whatifs = tuple(
        sizing.WhatIfFigures(str(w["config"]), int(w["peak_reserved_bytes"]), w["oom_avoided"], w["step_completes"])
        for w in entry["whatif"]
    )
    primary = diagnosis.primary
    return sizing.SizingInput(
        oom=figures,
        categories={k: int(v) for k, v in entry["categories"]["bytes"].items()},
        steps=steps,
        peak_reserved=int(entry["summary"]["peak_reserved_bytes"]),
        whatifs=whatifs,
        cause=rule_named(primary.id) if primary is not None else None,
        cause_settings=primary.settings if primary is not None else "",
        oom_phase=diagnosis.oom_phase or "",
        inference=diagnosis.inference,
    )


def doctor_into(capture: dict[str, Any], outcomes: list[DeviceOutcome], sidecar: dict[str, Any] | None) -> None:
    """``capture.doctor``: what the capture could not answer and the call that captures it right."""
    seconds = doctor.sidecar_dump_seconds(sidecar)
    found = doctor.findings(capture, [o.entry for o in outcomes], dump_seconds=seconds)
    capture["doctor"] = [f.to_dict() for f in found]


def _warnings(snapshot: Snapshot, devices: list[DeviceData], outcomes: list[DeviceOutcome]) -> list[dict[str, str]]:
    """The reader's warnings, then each device's: its recorded replay's and its analysis's own."""
    warnings = [{"code": w.code, "message": w.message} for w in snapshot.warnings]
    for dev, outcome in zip(devices, outcomes, strict=True):
        prefix = f"device {dev.device}: " if len(devices) > 1 else ""
        # The reader and the replay can both notice the same thing (e.g. state-only): say it once.
        known = {w["code"] for w in warnings}
        warnings.extend(
            {"code": w.code, "message": prefix + w.message}
            for w in outcome.replay_warnings
            if len(devices) > 1 or w.code not in known
        )
        warnings.extend({"code": code, "message": prefix + text} for code, text in outcome.warnings)
    return warnings


def _message_unused(message: OomMessage) -> dict[str, str]:
    return {
        "code": "oom-message-unused",
        "message": (
            f"the OOM message names GPU {message.device}, but no device of the snapshot with that number "
            "ran out of memory; its limit was not used"
            if message.device is not None
            else "the OOM message names no GPU and several devices ran out of memory; its limit was not used"
        ),
    }


def _stacks_kind(snapshot: Snapshot) -> str:
    """``none``, ``python`` or ``all`` (C++ frames present), as recorded."""
    frames = snapshot.stacks.frames
    if not frames:
        return "none"
    return "all" if any(not is_python_frame(f) for f in frames) else "python"


def _jsonable(value: Any) -> Any:
    """Settings as JSON: tuples to lists, ints past 2**53 to hex strings."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (str, float)):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**53 else hex(value)
    return str(value)
