"""A follow-up run scored against the incident it follows (issue 33).

``compare(incident, follow_up, declared=...)`` reads two contract reports (``oomscope.report/1``): the
incident (a run that ran out of memory) and the next run of the same job. It says what changed between
them, from the files where they show it and from the user's answer where they do not; what the incident's
report predicted for that change (its what-if replay of that exact setting, else its ranked row); what
happened (the follow-up's OOM, at which step, its peak); and the outcome:

- ``borne_out``: the prediction held (it finishes and the run did, or it runs out and the run did);
- ``refuted``: it did not (predicted to finish and the run died at the same step or earlier, or predicted
  to run out and the run finished);
- ``postponed``: the same job ran out of memory again, at a later step (whatever was predicted);
- ``not_applied``: the follow-up made a change the incident did not advise (the text says what it did);
- ``unknown``: no change seen or declared, no prediction for it, or no OOM to follow up.

What the files show, reliably (the rest is the user's answer, ``DECLARABLE``):
allocator settings (``capture.allocator_settings``, torch's own record of ``PYTORCH_CUDA_ALLOC_CONF``), the
optimizer's implementation (torch's ``_single_tensor_*`` / ``_multi_tensor_*`` / ``_fused_*`` step functions
in the recorded frames) and activation checkpointing (``torch/utils/checkpoint.py`` frames, the recompute in
backward). The batch, AMP and the dtype are not read from the files: the step's tensor sizes change for many
reasons (sequence lengths, buckets), so a guess would score advice on noise.
Pure: stdlib only, no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from analysis.readout import ENV_PREFIX, ranked_rows

OUTCOMES = ("borne_out", "refuted", "postponed", "not_applied", "unknown")
# The changes a user can declare ("what did you change?"): the ranked advice ids the files cannot show.
DECLARABLE: dict[str, str] = {
    "smaller_batch": "a smaller batch (or micro-batches with gradient accumulation)",
    "amp": "mixed precision (torch.autocast) or a lower dtype",
    "activation_checkpointing": "activation checkpointing",
    "optimizer_state": "a lighter optimizer (8-bit, sharded or fused)",
    "growing_workload": "capped the growing batch or sequence length",
    "shape_bucketing": "padded shapes to a few buckets",
    "eval_no_grad": "evaluation under torch.no_grad / inference_mode",
    "expandable_segments": "expandable_segments:True",
    "max_split_size_mb": "max_split_size_mb",
    "garbage_collection_threshold": "garbage_collection_threshold",
    "roundup_power2_divisions": "roundup_power2_divisions",
    "other": "something else",
}
_SETTINGS = ("expandable_segments", "max_split_size_mb", "garbage_collection_threshold", "roundup_power2_divisions")
_OPTIMIZER_STEPS = {"_fused_": "fused", "_multi_tensor_": "foreach", "_single_tensor_": "for-loop"}
_CHECKPOINT_FILE = "torch/utils/checkpoint.py"


@dataclass(frozen=True)
class Change:
    """One change between the incident and its follow-up; ``source`` is ``file`` or ``user``."""

    id: str
    label: str
    source: str
    config: str | None = None


@dataclass(frozen=True)
class Prediction:
    """What the incident's report said the change would do: ``answer`` is ``fixes``, ``postpones``,
    ``runs_out`` or ``unknown``; ``basis`` ``replay`` (that exact setting replayed) or ``ranked``."""

    change_id: str
    answer: str
    basis: str
    peak_reserved_bytes: int | None
    text: str


@dataclass(frozen=True)
class Actual:
    """What the follow-up did: its OOM and the step it came in (None where steps are not known)."""

    oom: bool
    oom_step: int | None
    steps_recorded: int
    peak_reserved_bytes: int


@dataclass(frozen=True)
class FollowUp:
    advised_change: str | None
    followed: bool
    applied: tuple[Change, ...]
    scored_change: str | None
    predicted: Prediction | None
    actual: Actual
    incident_oom_step: int | None
    outcome: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(incident: Mapping[str, Any], follow_up: Mapping[str, Any], declared: Sequence[str] = ()) -> FollowUp:
    """The follow-up scored against the incident; ``declared``: change ids from ``DECLARABLE`` (the user's)."""
    dev = _failing_device(incident)
    after = _failing_device(follow_up)
    applied = changes_between(incident, follow_up, declared)
    actual = _actual(after)
    advised = str(((dev.get("decision") or {}).get("change") or {}).get("id") or "") or None
    incident_step = _oom_step(dev)
    if not dev.get("ooms") and not dev.get("oom"):
        return FollowUp(advised, False, applied, None, None, actual, None, "unknown", _NO_INCIDENT)
    ids = [c.id for c in applied]
    followed = advised is not None and advised in ids
    scored = _scored_change(dev, applied, advised)
    predicted = predict(dev, scored) if scored else None
    if not applied:
        return FollowUp(advised, False, applied, None, None, actual, incident_step, "unknown", _NOTHING_SEEN)
    if scored is None:
        # Not advised; a setting the incident replayed anyway still has its prediction, said beside it.
        other = next((p for p in (_replay_prediction(dev, c) for c in applied) if p is not None), None)
        said = f" (predicted: {other.text})" if other else ""
        text = (
            f"A change the incident did not advise: {_labels(applied)}{said}; "
            f"what happened: {_what_happened(actual, incident_step)}."
        )
        return FollowUp(advised, False, applied, None, other, actual, incident_step, "not_applied", text)
    outcome = _outcome(predicted, actual, incident_step)
    text = _text(scored, predicted, actual, incident_step, outcome)
    return FollowUp(advised, followed, applied, scored.id, predicted, actual, incident_step, outcome, text)


_NO_INCIDENT = "The run it follows did not run out of memory: there was no advice to score."
_NOTHING_SEEN = (
    "No change is seen in the files (allocator settings, optimizer, checkpointing) and none was declared: "
    "say what you changed to score the advice."
)


def changes_between(
    incident: Mapping[str, Any], follow_up: Mapping[str, Any], declared: Sequence[str] = ()
) -> tuple[Change, ...]:
    """The changes the files show (settings, optimizer, checkpointing), then the declared ones not seen."""
    seen = list(_setting_changes(incident, follow_up))
    seen.extend(_frame_changes(_failing_device(incident), _failing_device(follow_up)))
    ids = {c.id for c in seen}
    for change_id in declared:
        if change_id in DECLARABLE and change_id not in ids:
            ids.add(change_id)
            seen.append(Change(change_id, DECLARABLE[change_id], "user"))
    return tuple(seen)


def predict(dev: Mapping[str, Any], change: Change) -> Prediction | None:
    """What the incident's report predicted for ``change``: the replay of its exact setting where one ran,
    else its ranked row (a setting at another value, or a code change's estimate); None if neither."""
    rows = {str(r.get("id")): r for r in ranked_rows(dev)}
    row = rows.get(change.id)
    if row is not None:
        replayed = _replay_prediction(dev, change)
        if replayed is not None:
            return replayed
    if row is None:
        return None
    answer = _STATE_ANSWERS.get(str(row.get("state")), "unknown")
    if answer == "postpones" and not str(row.get("state_text") or "").startswith("finishes"):
        answer = "unknown"  # the run grows, and the replay could not tell whether even the failing step finishes
    return Prediction(change.id, answer, "ranked", None, f"{row.get('title')}: {row.get('state_text')}")


def _replay_prediction(dev: Mapping[str, Any], change: Change) -> Prediction | None:
    """What the replay of the change's exact setting said (None for a code change or a value not replayed)."""
    replay = _replay_of(dev, change.config) if change.config else None
    if replay is None:
        return None
    ranked = {str(r.get("id")): r for r in dev.get("ranked") or []}
    completes = replay.get("step_completes")
    answer = "unknown" if completes is None else ("runs_out" if completes is False else "fixes")
    if answer == "fixes" and (ranked.get(change.id) or {}).get("run_completes") is False:
        answer = "postpones"  # the run grows: getting past the failing step only moves the OOM later
    peak = replay.get("peak_reserved_bytes")
    text = f"the replay of {change.config}: {_ANSWER_WORDS[answer]}"
    return Prediction(change.id, answer, "replay", int(peak) if peak is not None else None, text)


_ANSWER_WORDS = {
    "fixes": "finishes the failing step",
    "postpones": "finishes the failing step, but the run keeps growing: the OOM comes later",
    "runs_out": "still runs out in the failing step",
    "unknown": "cannot tell",
}
_STATE_ANSWERS = {"finishes-step": "fixes", "estimate": "fixes", "postpones": "postpones", "runs-out": "runs_out"}


def _replay_of(dev: Mapping[str, Any], config: str) -> Mapping[str, Any] | None:
    """The what-if (or one of the values it tried) that replayed exactly ``config``."""
    for w in dev.get("whatif") or []:
        if w.get("config") == config:
            return w  # type: ignore[no-any-return]
        for tried in w.get("tried") or []:
            if tried.get("config") == config:
                return tried  # type: ignore[no-any-return]
    return None


def _scored_change(dev: Mapping[str, Any], applied: Sequence[Change], advised: str | None) -> Change | None:
    """The applied change the incident predicted something for: the advised one first, then by rank."""
    order = [str(r.get("id")) for r in dev.get("ranked") or []]
    if advised and advised not in order:
        order.insert(0, advised)
    by_id = {c.id: c for c in applied}
    for change_id in order:
        change = by_id.get(change_id)
        if change is not None and predict(dev, change) is not None:
            return change
    return None


def _outcome(predicted: Prediction | None, actual: Actual, incident_step: int | None) -> str:
    if actual.oom and actual.oom_step is not None and incident_step is not None and actual.oom_step > incident_step:
        return "postponed"
    if predicted is None or predicted.answer == "unknown":
        return "unknown"
    if not actual.oom:
        return "borne_out" if predicted.answer == "fixes" else "refuted"
    return "borne_out" if predicted.answer == "runs_out" else "refuted"


def _text(change: Change, predicted: Prediction | None, actual: Actual, incident_step: int | None, outcome: str) -> str:
    said = f"predicted: {predicted.text}" if predicted else "no prediction"
    words = {
        "borne_out": "borne out",
        "refuted": "refuted",
        "postponed": "postponed: the same job ran out later",
        "unknown": "unknown",
    }[outcome]
    return f"{change.label} ({said}); what happened: {_what_happened(actual, incident_step)}. Outcome: {words}."


def _what_happened(actual: Actual, incident_step: int | None) -> str:
    if not actual.oom:
        return f"no OOM over {actual.steps_recorded} recorded steps"
    at = f"at step {actual.oom_step}" if actual.oom_step is not None else "at a step not known"
    was = f" (the incident's at step {incident_step})" if incident_step is not None else ""
    return f"out of memory {at}{was}"


def _labels(changes: Iterable[Change]) -> str:
    return ", ".join(c.label for c in changes)


def _failing_device(report: Mapping[str, Any]) -> Mapping[str, Any]:
    """The device that ran out of memory first, else the first device."""
    devices = list(report.get("devices") or [])
    failing = [d for d in devices if d.get("ooms")]
    pick = min(failing, key=lambda d: int(d["ooms"][0].get("event_index") or 0)) if failing else None
    return pick or (devices[0] if devices else {})


def _oom_step(dev: Mapping[str, Any]) -> int | None:
    ooms = dev.get("ooms") or []
    step = ooms[0].get("step") if ooms else None
    return int(step) if step is not None else None


def _actual(dev: Mapping[str, Any]) -> Actual:
    peak = int((dev.get("summary") or {}).get("peak_reserved_bytes") or 0)
    oom = bool(dev.get("ooms"))
    return Actual(oom, _oom_step(dev) if oom else None, len(dev.get("steps") or []), peak)


# ------------------------------------------------------------------ what the files show


def _alloc_conf(report: Mapping[str, Any]) -> dict[str, str] | None:
    """The recorded PYTORCH_CUDA_ALLOC_CONF as {key: value}; None when the snapshot records no settings."""
    settings = (report.get("capture") or {}).get("allocator_settings")
    if not isinstance(settings, Mapping) or "PYTORCH_CUDA_ALLOC_CONF" not in settings:
        return None
    out: dict[str, str] = {}
    for part in _split_conf(str(settings.get("PYTORCH_CUDA_ALLOC_CONF") or "")):
        key, _, value = part.partition(":")
        out[key.strip()] = value.strip()
    return out


def _split_conf(conf: str) -> Iterator[str]:
    """``a:1,b:[64:8,>:1]`` into its entries (commas inside brackets belong to the value)."""
    depth, start = 0, 0
    for i, ch in enumerate(conf):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            yield conf[start:i]
            start = i + 1
    if conf[start:].strip():
        yield conf[start:]


def _setting_changes(incident: Mapping[str, Any], follow_up: Mapping[str, Any]) -> Iterator[Change]:
    before, after = _alloc_conf(incident), _alloc_conf(follow_up)
    if before is None or after is None:
        return
    for key in _SETTINGS:
        if before.get(key) != after.get(key):
            config = f"{key}:{after[key]}" if key in after else None
            label = f"{ENV_PREFIX}{config}" if config else f"{key} back to its default"
            yield Change(key, label, "file", config)


def _frames(dev: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every recorded frame the report keeps (top stacks, churn, leaks, the OOM's stacks)."""
    groups = [dev.get("top_stacks"), dev.get("churn"), dev.get("leaks"), (dev.get("oom") or {}).get("top_stacks")]
    for group in groups:
        for stack in group or []:
            yield from stack.get("frames") or []


def _optimizer_kind(dev: Mapping[str, Any]) -> str | None:
    kinds = {kind for f in _frames(dev) for marker, kind in _OPTIMIZER_STEPS.items() if marker in str(f.get("name"))}
    return next(iter(kinds)) if len(kinds) == 1 else None


def _checkpointed(dev: Mapping[str, Any]) -> bool:
    return any(str(f.get("filename") or "").endswith(_CHECKPOINT_FILE) for f in _frames(dev))


def _frame_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> Iterator[Change]:
    """Changes the recorded frames show; only where both files record frames."""
    if not any(True for _ in _frames(before)) or not any(True for _ in _frames(after)):
        return
    was, now = _optimizer_kind(before), _optimizer_kind(after)
    if was and now and was != now:
        yield Change("optimizer_state", f"the optimizer step from {was} to {now}", "file", None)
    if _checkpointed(after) and not _checkpointed(before):
        yield Change("activation_checkpointing", "activation checkpointing (recompute frames)", "file", None)
