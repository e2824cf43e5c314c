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
in the recorded frames), activation checkpointing (``torch/utils/checkpoint.py`` frames, the recompute in
backward), autocast (``torch/amp/autocast_mode.py`` frames) and, from the forward passes' sizes
(``devices[].signature``, ``analysis.phases.pass_figures``): a 16-bit model (the parameters' bytes halve), a
smaller batch or micro-batches (the first pass's allocations each in one smaller ratio, where each run's passes
keep one size step after step: sequence lengths that vary per step change the sizes as a batch does, and then
nothing is said), and an evaluation that stopped keeping its activations (docs/runs.md, "What changed").
Pure: no Django (the horizon arithmetic is analysis.projection's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from analysis.horizon import NEAR_HORIZON_SHARE, NEAR_HORIZON_STEPS, setting_horizon
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
    "leak": "stopped keeping each step's tensors on the GPU (a leak fixed)",
    "kv_cache_growth": "a preallocated KV cache (no growth by concatenation)",
    "cuda_graph_pools": "CUDA graphs sharing one memory pool",
    "outside_memory": "freed the GPU memory held outside PyTorch (another process or library)",
    "expandable_segments": "expandable_segments:True",
    "max_split_size_mb": "max_split_size_mb",
    "garbage_collection_threshold": "garbage_collection_threshold",
    "roundup_power2_divisions": "roundup_power2_divisions",
    "other": "something else",
}
# The decision's change is a cause's fix (analysis/causes/ ids); where the user's answer (or what the files
# show) names the same change under its advice id, they are one change.
# The Trainer's gathered evaluation outputs (eval_accumulation_steps) are tensors no longer kept on the GPU: the
# user's "leak" answer.
ADVICE_ALIASES = {
    "forward_without_no_grad": "eval_no_grad",
    "optimizer_step": "optimizer_state",
    "eval_outputs_on_gpu": "leak",
}
# Causes that are the run's growth: their fix stops it (the run is then steady, not postponed).
GROWTH_CAUSES = ("growing_workload", "leak", "kv_cache_growth")
_SETTINGS = ("expandable_segments", "max_split_size_mb", "garbage_collection_threshold", "roundup_power2_divisions")
_OPTIMIZER_STEPS = {"_fused_": "fused", "_multi_tensor_": "foreach", "_single_tensor_": "for-loop"}
_CHECKPOINT_FILE = "torch/utils/checkpoint.py"
STEADY_SHARE = 0.02  # a complete step's peak within 2% of the one before: not growing
STEADY_MIN_STEPS = 3  # fewer complete steps than this: no trend to read


@dataclass(frozen=True)
class Change:
    """One change between the incident and its follow-up; ``source`` is ``file`` or ``user``."""

    id: str
    label: str
    source: str
    config: str | None = None


@dataclass(frozen=True)
class Horizon:
    """How long the run lasts under a change, from the incident's growth across its recorded steps:
    ``kind`` ``postpones`` (it dies again in about ``step``: ``basis`` ``replay``, the change's own replay of
    the failing step with the growth carried forward, or ``packed``, a perfectly packed cache: the most any
    setting gains), ``steady`` (the steps stopped growing: memory steady from ``step``), or ``cannot_tell``
    (a growing run under a code change, or too few steps to see a trend)."""

    kind: str
    step: int | None
    basis: str | None
    text: str


@dataclass(frozen=True)
class HorizonScore:
    """The follow-up against the predicted horizon: ``verdict`` ``on_time`` (died within ``tolerance`` steps
    of the predicted step), ``earlier``, ``later``, ``lived_past`` (no OOM, and it ran past the step), or
    ``ended_before`` (no OOM, but it stopped before the step: the horizon is not tested)."""

    predicted_step: int
    actual_step: int | None
    steps_recorded: int
    off_by_steps: int | None
    tolerance_steps: int
    verdict: str


@dataclass(frozen=True)
class Prediction:
    """What the incident's report said the change would do: ``answer`` is ``fixes``, ``postpones``,
    ``runs_out`` or ``unknown``; ``basis`` ``replay`` (that exact setting replayed) or ``ranked``."""

    change_id: str
    answer: str
    basis: str
    peak_reserved_bytes: int | None
    text: str
    horizon: Horizon | None = None  # how long the run lasts under the change (``horizon_of``)


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
    horizon: HorizonScore | None = None  # the predicted horizon scored (a ``postpones`` prediction only)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(incident: Mapping[str, Any], follow_up: Mapping[str, Any], declared: Sequence[str] = ()) -> FollowUp:
    """The follow-up scored against the incident; ``declared``: change ids from ``DECLARABLE`` (the user's)."""
    applied = changes_between(incident, follow_up, declared)
    before, after = _failing_device(incident), _failing_device(follow_up)
    actual = _actual(after)
    if actual.oom and actual.oom_step is None and _died_before_first_step(follow_up, before):
        actual = Actual(True, 0, actual.steps_recorded, actual.peak_reserved_bytes)
    zero = 0 if _died_before_first_step(incident, after) else None
    return score(incident, applied, actual, incident_step=zero)


def _died_before_first_step(report: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """An OOM in step 0: the run records no step, its trace holds every event from its start (nothing
    dropped), and the other run of the same job records ``Optimizer.step`` marks (the job makes them: this
    run died before its first ``step()`` ended). A job that makes no marks leaves the step unknown."""
    dev = _failing_device(report)
    complete = (report.get("capture") or {}).get("trace_complete") is True
    return bool(dev.get("ooms")) and not dev.get("steps") and complete and bool(other.get("step_source"))


def score(
    incident: Mapping[str, Any], applied: Sequence[Change], actual: Actual, incident_step: int | None = None
) -> FollowUp:
    """The changes ``applied`` scored against what the incident predicted for them, given what the next run
    did (``actual``: from its own report in ``compare``, or a rerun's recorded fate); ``incident_step``: the
    incident's OOM step where its report has none (``compare``: step 0, from the follow-up's marks)."""
    applied = tuple(applied)
    dev = _failing_device(incident)
    advised = str(((dev.get("decision") or {}).get("change") or {}).get("id") or "") or None
    incident_step = _oom_step(dev) if _oom_step(dev) is not None else incident_step
    if not dev.get("ooms") and not dev.get("oom"):
        return FollowUp(advised, False, applied, None, None, actual, None, "unknown", _NO_INCIDENT)
    followed = advised is not None and any(same_change(advised, c.id) for c in applied)
    scored = _scored_change(dev, applied, advised)
    predicted = predict(dev, scored) if scored else None
    if not applied:
        return FollowUp(advised, False, applied, None, None, actual, incident_step, "unknown", _NOTHING_SEEN)
    if scored is None and followed:
        text = (
            f"The advised change was made ({_labels(applied)}), but the incident predicted nothing for it; "
            f"what happened: {_what_happened(actual, incident_step)}."
        )
        return FollowUp(advised, True, applied, None, None, actual, incident_step, "unknown", text)
    if scored is None:
        # Not advised; a setting the incident replayed anyway still has its prediction, said beside it.
        other = next((p for p in (_replay_prediction(dev, c) for c in applied) if p is not None), None)
        said = f" (predicted: {other.text})" if other else ""
        text = (
            f"A change the incident did not advise: {_labels(applied)}{said}; "
            f"what happened: {_what_happened(actual, incident_step)}."
        )
        return FollowUp(advised, False, applied, None, other, actual, incident_step, "not_applied", text)
    scored_horizon = score_horizon(predicted, actual, incident_step)
    outcome = _outcome(predicted, actual, incident_step)
    if outcome == "refuted" and scored_horizon is not None and scored_horizon.verdict == "ended_before":
        outcome = "unknown"  # no OOM, but the run stopped before the step it was predicted to die in
    text = _text(scored, predicted, actual, incident_step, outcome) + _horizon_words(scored_horizon)
    # The advised cause's fix, named by the user's answer (eval_no_grad for forward_without_no_grad): counted
    # under the advised id, so the team's record has one row for one change.
    scored_id = advised if advised and same_change(advised, scored.id) else scored.id
    return FollowUp(
        advised, followed, applied, scored_id, predicted, actual, incident_step, outcome, text, scored_horizon
    )


def _horizon_words(score: HorizonScore | None) -> str:
    if score is None:
        return ""
    if score.actual_step is None:
        what = "ran past it without an OOM" if score.verdict == "lived_past" else "stopped before it: not tested"
        return f" Horizon: predicted to die in about step {score.predicted_step}; {score.steps_recorded} steps, {what}."
    verdict = {"on_time": "on time", "earlier": "earlier than predicted", "later": "later than predicted"}
    return (
        f" Horizon: predicted about step {score.predicted_step}, died in step {score.actual_step} "
        f"({score.off_by_steps:+d}; {verdict[score.verdict]}, within {score.tolerance_steps} counts as on time)."
    )


_NO_INCIDENT = "The run it follows did not run out of memory: there was no advice to score."
_NOTHING_SEEN = (
    "No change is seen in the files (allocator settings, optimizer, checkpointing, dtype, autocast, batch, "
    "evaluation) and none was declared: "
    "say what you changed to score the advice."
)


def changes_between(
    incident: Mapping[str, Any], follow_up: Mapping[str, Any], declared: Sequence[str] = ()
) -> tuple[Change, ...]:
    """The changes the files show (settings, optimizer, checkpointing, then the passes' sizes: dtype or autocast,
    batch, evaluation), then the declared ones not seen."""
    seen = list(_setting_changes(incident, follow_up))
    before, after = _failing_device(incident), _failing_device(follow_up)
    seen.extend(_frame_changes(before, after))
    seen.extend(c for c in _size_changes(before, after) if c.id not in {s.id for s in seen})
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
        return _decision_prediction(dev, change)
    answer = _STATE_ANSWERS.get(str(row.get("state")), "unknown")
    if answer == "postpones" and not str(row.get("state_text") or "").startswith("finishes"):
        answer = "unknown"  # the run grows, and the replay could not tell whether even the failing step finishes
    if answer == "unknown":
        # The ranked row of the same change could not tell; the decision's cause (read from the trace) can.
        decided = _decision_prediction(dev, change)
        if decided is not None:
            return decided
    horizon = horizon_of(dev, change, answer)
    text = f"{row.get('title')}: {row.get('state_text')}" + (f"; {horizon.text}" if horizon else "")
    return Prediction(change.id, answer, "ranked", None, text, horizon)


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
    horizon = horizon_of(dev, change, answer)
    text = f"the replay of {change.config}: {_ANSWER_WORDS[answer]}" + (f"; {horizon.text}" if horizon else "")
    return Prediction(change.id, answer, "replay", int(peak) if peak is not None else None, text, horizon)


# ------------------------------------------------------------------ horizons: how long the run lasts


def _growth(dev: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The growing-workload cause's figures (the steps grow: ``growth_per_step_bytes``, ``died_in_step``)."""
    for cause in (dev.get("diagnosis") or {}).get("causes") or []:
        figures = cause.get("figures") or {}
        growing = cause.get("id") == "growing_workload"
        if growing and figures.get("growth_per_step_bytes") and figures.get("died_in_step"):
            return figures  # type: ignore[no-any-return,unused-ignore]
    return None


def _steady_from(dev: Mapping[str, Any]) -> int | None:
    """The step from which the recorded complete steps stop growing (each peak within ``STEADY_SHARE`` of the
    one before); None with fewer than ``STEADY_MIN_STEPS`` complete steps or no two steady ones at the end."""
    peaks = [int(s.get("peak_allocated_bytes") or 0) for s in dev.get("steps") or [] if s.get("complete")]
    if len(peaks) < STEADY_MIN_STEPS:
        return None
    last_growth = max((i for i in range(1, len(peaks)) if peaks[i] > peaks[i - 1] * (1 + STEADY_SHARE)), default=0)
    return last_growth if last_growth <= len(peaks) - 2 else None


def horizon_of(dev: Mapping[str, Any], change: Change, answer: str) -> Horizon | None:
    """How long the run lasts under ``change`` (None where the change runs out in the failing step or
    nothing was predicted): on a growing run an allocator setting postpones the OOM to the step its
    replay's packing reaches with the growth carried forward (``horizon.setting_horizon``), else to
    what a perfectly packed cache reaches; a code change on a growing run cannot tell (what it saves may
    grow too), capping the growth is steady; on a run whose steps do not grow, steady from the step they
    stopped growing."""
    if answer not in ("fixes", "postpones"):
        return None
    growth = _growth(dev)
    if growth is None:
        steady = _steady_from(dev)
        if steady is None:
            return Horizon("cannot_tell", None, None, "too few recorded steps to tell whether the run stays steady")
        return Horizon("steady", steady, "steps", f"the steps do not grow: steady from step {steady}")
    died, rate = int(growth["died_in_step"]), int(growth["growth_per_step_bytes"])
    if change.id in GROWTH_CAUSES:
        return Horizon("steady", None, "cause", "steady once what grows stops growing")
    if change.id not in _SETTINGS:
        return Horizon("cannot_tell", None, None, "the run grows: how many steps a code change buys is not known")
    oom, replay = dev.get("oom") or {}, _replay_of(dev, change.config) if change.config else None
    need, limit = int(oom.get("step_need_bytes") or 0), int(oom.get("limit_bytes") or 0)
    if replay and replay.get("step_completes") is True and replay.get("step_peak_reserved_bytes") and need and limit:
        step = setting_horizon(died, need, limit, rate, int(replay["step_peak_reserved_bytes"]))
        return Horizon("postpones", step, "replay", f"postpones the OOM to about step {step} (its replay's packing)")
    if growth.get("postpone_packed_steps") is not None:
        step = died + int(growth["postpone_packed_steps"])
        text = f"postpones the OOM to step {step} at most (a perfectly packed cache)"
        return Horizon("postpones", step, "packed", text)
    return Horizon("cannot_tell", None, None, "the run grows; no replay of this setting to carry forward")


def horizons(incident: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each change the incident advises (the decision's, then the ranked ones) with what it predicts and for
    how long (``horizon_of``): the incident's page says it before any follow-up comes. Empty without an OOM."""
    dev = _failing_device(incident)
    if not dev.get("ooms") and not dev.get("oom"):
        return []
    first = (dev.get("decision") or {}).get("change") or {}
    candidates: list[tuple[str, str, str | None]] = [(str(first.get("id") or ""), str(first.get("title") or ""), None)]
    for row in dev.get("ranked") or []:
        row_config = str(row.get("config") or "")
        setting = row_config[len(ENV_PREFIX) :] if row_config.startswith(ENV_PREFIX) else None
        candidates.append((str(row.get("id") or ""), str(row.get("title") or ""), setting))
    out: list[dict[str, Any]] = []
    for change_id, title, config in candidates:
        if not change_id or any(item["change"] == change_id for item in out):
            continue
        predicted = predict(dev, Change(change_id, title, "file", config))
        horizon = predicted.horizon if predicted else None
        out.append(
            {
                "change": change_id,
                "title": title,
                "answer": predicted.answer if predicted else "unknown",
                "horizon": asdict(horizon) if horizon else None,
            }
        )
    return out


def score_horizon(predicted: Prediction | None, actual: Actual, incident_step: int | None) -> HorizonScore | None:
    """The follow-up against a ``postpones`` horizon (None where there is none, or the OOM's step is unknown)."""
    horizon = predicted.horizon if predicted else None
    if horizon is None or horizon.kind != "postpones" or horizon.step is None:
        return None
    tolerance = max(NEAR_HORIZON_STEPS, math.ceil(NEAR_HORIZON_SHARE * (incident_step or 0)))
    if not actual.oom:
        verdict = "lived_past" if actual.steps_recorded > horizon.step else "ended_before"
        return HorizonScore(horizon.step, None, actual.steps_recorded, None, tolerance, verdict)
    if actual.oom_step is None:
        return None
    off = actual.oom_step - horizon.step
    verdict = "on_time" if abs(off) <= tolerance else ("earlier" if off < 0 else "later")
    return HorizonScore(horizon.step, actual.oom_step, actual.steps_recorded, off, tolerance, verdict)


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
        change = by_id.get(change_id) or by_id.get(ADVICE_ALIASES.get(change_id, ""))
        if change is not None and predict(dev, change) is not None:
            return change
    return None


def same_change(advised: str, applied: str) -> bool:
    """Whether an applied change id is the advised one (a cause's fix and the answer that names it)."""
    return applied == advised or ADVICE_ALIASES.get(advised) == applied


def _decision_prediction(dev: Mapping[str, Any], change: Change) -> Prediction | None:
    """The decision's own change (a cause's fix, which the ranked table does not list): ``fixes`` where its
    cause explains the OOM (the decision's saving makes the failing request fit), else None."""
    decision = dev.get("decision") or {}
    advised = str((decision.get("change") or {}).get("id") or "")
    if not advised or not same_change(advised, change.id):
        return None
    cause = next((c for c in (dev.get("diagnosis") or {}).get("causes") or [] if c.get("id") == advised), None)
    if cause is None or cause.get("explains_oom") is not True:
        return None
    horizon = horizon_of(dev, Change(advised, change.label, change.source, change.config), "fixes")
    buys = str(decision.get("buys") or "").split(". ")[0]
    text = f"{(decision.get('change') or {}).get('title')}: {buys}" + (f"; {horizon.text}" if horizon else "")
    return Prediction(change.id, "fixes", "decision", None, text, horizon)


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


# ------------------------------------------------------------------ what the files show: the passes' sizes
# Each detector reads ``devices[].signature`` (analysis.phases.pass_figures) and the peak's categories; a
# report without them (stored before issue 33's signature) shows none of these changes.

BATCH_MAX_RATIO = 0.85  # the forward's allocations at most 85% of the incident's: a change, not a seed's noise
QUIET_SPREAD = 1.05  # a run's training passes within 5% (the first sets up: ~2-4% more): fixed shapes
ALIGNED_TOLERANCE = 0.03  # an allocation pair "in the ratio": within 3% of the pass's median ratio
ALIGNED_SHARE = 0.6  # at least 60% of the paired allocations in one ratio: the same ops, in the same order
ALIGNED_MIN_BYTES = 1 << 20  # pairs whose incident allocation is under 1 MiB are left out (scalars, indices)
ALIGNED_MIN_PAIRS = 8
DTYPE_RATIO = (0.4, 0.6)  # parameters at 40-60% of the bytes: a 2-byte dtype for a 4-byte one
KEPT_DROP = 0.5  # an evaluation pass keeping at most half of what the incident's kept
SAME_PASS = (0.85, 1.15)  # the evaluation pass asks for about as much (else the batch changed, not no_grad)


def _signature(dev: Mapping[str, Any]) -> Mapping[str, Any] | None:
    sig = dev.get("signature")
    return sig if isinstance(sig, Mapping) else None


def _parameter_ratio(before: Mapping[str, Any], after: Mapping[str, Any]) -> float | None:
    """The follow-up's parameter bytes over the incident's (the peak's categories); None without both."""
    was = int(((before.get("categories") or {}).get("bytes") or {}).get("parameters") or 0)
    now = int(((after.get("categories") or {}).get("bytes") or {}).get("parameters") or 0)
    return now / was if was >= ALIGNED_MIN_BYTES and now else None


def _dtype_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> Change | None:
    """The model in a 2-byte dtype: its parameters take 40-60% of the bytes. Reliable because nothing else
    in a rerun of one job changes the parameters' bytes but the model (another model is another job) and
    their dtype; autocast leaves them in float32."""
    ratio = _parameter_ratio(before, after)
    if ratio is None or not DTYPE_RATIO[0] <= ratio <= DTYPE_RATIO[1]:
        return None
    return Change("amp", f"the model in a 16-bit dtype (its parameters {ratio:.2f}x the bytes)", "file", None)


def _autocast_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> Change | None:
    """Autocast: torch's own ``torch/amp/autocast_mode.py`` frames in the follow-up's trace and not in the
    incident's (only where both record frames: a trace without frames shows no autocast either way)."""
    was, now = _signature(before), _signature(after)
    if was is None or now is None or was.get("autocast") or not now.get("autocast"):
        return None
    return Change("amp", "mixed precision: torch.autocast (its frames in the trace)", "file", None)


def _pass_ratio(before: Mapping[str, Any], after: Mapping[str, Any]) -> float | None:
    """The one ratio of the follow-up's first forward pass to the incident's, allocation by allocation (the
    median over the pairs of 1 MiB or more), where most pairs share it: the same ops in the same order, each
    asking for that share of the bytes (a batch scales every activation alike). None where the passes do not
    pair up (other ops: autocast's casts, another model) or a pass is missing."""
    first_b, first_a = ((_signature(d) or {}).get("first_pass") or {} for d in (before, after))
    sizes_b, sizes_a = list(first_b.get("sizes") or []), list(first_a.get("sizes") or [])
    pairs = [(b, a) for b, a in zip(sizes_b, sizes_a, strict=False) if b >= ALIGNED_MIN_BYTES and a]
    if len(pairs) < ALIGNED_MIN_PAIRS:
        return None
    ratios = sorted(a / b for b, a in pairs)
    median = ratios[len(ratios) // 2]
    aligned = sum(abs(r - median) <= ALIGNED_TOLERANCE * median for r in ratios)
    return median if aligned >= ALIGNED_SHARE * len(ratios) else None


def _quiet(sig: Mapping[str, Any]) -> bool | None:
    """Whether the run's training passes ask for the same bytes step after step (the first, which sets up,
    left out where three or more were recorded); None with fewer than two."""
    passes = [int(p[0]) for p in sig.get("training_passes") or []]
    passes = passes[1:] if len(passes) >= 3 else passes
    if len(passes) < 2 or min(passes) <= 0:
        return None
    return max(passes) / min(passes) <= QUIET_SPREAD


def _batch_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> Change | None:
    """A smaller batch (or micro-batches) from the step's tensor sizes: the follow-up's first forward pass
    makes the incident's allocations in the same order, each at most ``BATCH_MAX_RATIO`` of its size, in one
    ratio; and the sizes are the workload's, not its data's: each run's passes ask for the same bytes every
    step (a run whose sequence lengths vary per step shows a varying pass: nothing is said, since two seeds'
    first passes differ as much as two batches). A 16-bit dtype or autocast changes the sizes too: then the
    batch is not read. Micro-batches: the follow-up runs ``k`` training passes an optimizer step where the
    incident ran fewer (or died before its first step), each at about 1/k of the incident's."""
    was, now = _signature(before), _signature(after)
    if was is None or now is None or bool(was.get("autocast")) != bool(now.get("autocast")):
        return None
    params = _parameter_ratio(before, after)
    if params is not None and abs(params - 1) > 0.02:
        return None
    ratio = _pass_ratio(before, after)
    quiet = (_quiet(was), _quiet(now))
    if ratio is None or ratio > BATCH_MAX_RATIO or False in quiet or quiet == (None, None):
        return None
    per_step, per_step_before = int(now.get("passes_per_step") or 1), int(was.get("passes_per_step") or 1)
    if per_step > per_step_before and abs(ratio * per_step / per_step_before - 1) <= 1 - BATCH_MAX_RATIO:
        label = f"micro-batches: {per_step} forward/backward passes an optimizer step, each {ratio:.2f}x the incident's"
        return Change("smaller_batch", label, "file", f"accumulation:{per_step}")
    label = f"a smaller batch: each activation {ratio:.2f}x the incident's (batch x{ratio:.2f})"
    return Change("smaller_batch", label, "file", None)


def _eval_kept(sig: Mapping[str, Any]) -> tuple[int, int] | None:
    """(bytes asked, bytes kept at the pass's end) of the evaluation pass that kept the most; None without one."""
    passes = [(int(p[0]), int(p[1])) for p in sig.get("eval_passes") or []]
    return max(passes, key=lambda p: p[1]) if passes else None


def _eval_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> Change | None:
    """An evaluation that no longer keeps its activations: both runs make forward passes that no backward
    follows (analysis.phases), asking for about the same bytes, and the follow-up's keep at most half of
    what the incident's kept live at the pass's end (what ``no_grad`` / ``inference_mode`` frees: the
    graph's saved tensors). Same bytes asked: the same evaluation, not a smaller one."""
    was, now = (_eval_kept(s) if s else None for s in (_signature(before), _signature(after)))
    if was is None or now is None or not was[0] or not was[1]:
        return None
    if not SAME_PASS[0] <= now[0] / was[0] <= SAME_PASS[1] or now[1] > KEPT_DROP * was[1]:
        return None
    mib = 1 << 20
    label = (
        f"the evaluation no longer keeps its activations (each pass keeps {now[1] / mib:.0f} MiB "
        f"where the incident's kept {was[1] / mib:.0f} MiB): no_grad / inference_mode"
    )
    return Change("eval_no_grad", label, "file", None)


def _size_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> Iterator[Change]:
    """The changes the passes' sizes show; one ``amp`` at most (the dtype first: it says more)."""
    dtype = _dtype_change(before, after) or _autocast_change(before, after)
    for change in (dtype, _batch_change(before, after), _eval_change(before, after)):
        if change is not None:
            yield change
