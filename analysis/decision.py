"""The decision: what to change first, read off a finished device report.

``decide(result, capture)`` is a pure function of one device's figures, typed
(``analysis.decision_input.DecisionInput``: read once from the device's contract entry
by ``DecisionInput.of``; no replay is run here): it picks the verdict, the one change to make, what the
replay says it buys, how sure that is, and the runner-up. The report stores the
result as ``devices[].decision``; the page shows it first. Rules (docs/report.md,
"The decision"):

- With an OOM the change is the first allocator setting whose replay avoids the
  OOM, preferring one whose step is known to complete (``whatif.step_completes``
  true, then unknown, then false); the advisor's order breaks ties. Without such
  a setting, the first suggestion that is not about the capture (a code change).
- A growing workload (``growing_workload`` the primary cause) whose free setting carries the run well past the
  failing step (``horizon.horizon_is_near``: its replay of the grown steps, ``whatif[].grown_horizon``, else the
  failing step's packing carried forward) gets that setting first, with its horizon, and the cap second; "no
  setting saves it" only where every horizon is near.
- Without an OOM the headline is the idle cache over the reserved peak's plateau
  (``devices[].plateau``: the least reserved minus allocated while reserved memory
  held its peak, and when); "wasted" only where even that least stayed above the
  advisor's floor. A stored report without ``plateau`` reads the first event at
  the peak (the timeline keeps it exactly). The change is the allocator setting
  whose replay lowers peak reserved memory the most, when it lowers it at all.
- Private pools that hold a large share of reserved memory at the ledger's moment
  are named as pools in the headline, by what made them (``devices[].ledger``).
- What the change buys is always the replay's figures (never an estimate) for a
  setting; a code change carries the advisor's estimate, said to be one.

Keys another part of the report may add (``whatif[].step_completes``,
``suggestions[].step_completes``, ``oom.step_need_bytes``) may be missing: the
reading (``decision_input.py``, the one place that reads the entry) says what stands
in for each, and ``oom_avoided`` stands in for ``step_completes``. A stored report comes through
``analysis.stored.upgrade`` first (``oom.limit_is_lower_bound`` and the device's
``limit`` of the first reports); ``oom.limit_source`` may still hold an older value
(``device-full``, ``cap-lower-bound``), which ``_LIMIT_WORDS`` words.

Sizes are worded as torch's ``format_size`` prints them (``710.00 MiB``), so a
figure here reads the same as the OOM message the user already has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analysis import readout
from analysis.allocator.config import split_conf
from analysis.decision_input import CauseFacts, DecisionInput, GrownFacts, OomFacts, oom_facts, primary_cause
from analysis.horizon import horizon_is_near, setting_horizon
from analysis.oom import named_free_block

ENV_PREFIX = "PYTORCH_CUDA_ALLOC_CONF="
# Idle cache worth a headline (the advisor's improvement floor: both a share and bytes).
IDLE_MIN_SHARE = 0.05
IDLE_MIN_BYTES = 64 << 20
# How each ``oom.limit_source`` is said (older and newer values).
_LIMIT_WORDS = {
    "oom_message": "read from the OOM message",
    "sidecar": "read from the client's sidecar",
    "inferred": "inferred from the trace",
    "device-full": "the device's memory (inferred: reserved plus the device's free memory)",
    "cap-lower-bound": "the most the trace shows the cap allowed (inferred: a per-process cap the snapshot does not "
    "record)",
}


def format_size(size: int | float) -> str:
    """torch's ``format_size`` (c10/cuda/CUDACachingAllocator.cpp), one definition for the whole report:
    ``analysis.readout.size`` (``743040000`` -> ``708.62 MiB``)."""
    return readout.size(size)


# ------------------------------------------------------------------ deciding


def decide(result: DecisionInput | Mapping[str, Any], capture: Mapping[str, Any]) -> dict[str, Any]:
    """``devices[].decision``: ``{headline, change, buys, confidence, runner_up}``. ``result``: the device's
    figures (``DecisionInput``); a contract entry (a stored report's) is read first."""
    inp = result if isinstance(result, DecisionInput) else DecisionInput.of(result)
    oom, cause = inp.oom, inp.cause
    recorded_conf = _recorded_conf(capture)
    if oom:
        ranked = _ranked_for_oom(inp.suggestions, inp.whatifs, inp.ranked_ids)
        count = inp.ooms_listed or oom.ooms_in_trace
        headline = _caught_before(count) + _oom_headline(oom) + _no_setting_sentence(oom, inp.whatifs)
    else:
        ranked = _ranked_without_oom(inp.suggestions, inp.whatifs, inp.peak_reserved)
        headline = _idle_headline(inp, capture)
    choice = ranked[0] if ranked else None
    runner = ranked[1] if len(ranked) > 1 else None
    allocator_headline = headline
    if oom:
        headline = f"{headline}{inp.phase_sentence}"
    if cause is None or cause.id != "cuda_graph_pools":
        headline = f"{headline}{inp.pools_sentence}"
    horizon = _setting_horizon_first(cause, oom, inp.suggestions, inp.whatifs) if cause is not None and oom else None
    if cause is not None and horizon is not None:
        # A growing run that a free setting carries well past the failing step (its horizon is not near): the
        # setting first, with its horizon; capping what grows is the runner-up (issue 32: talking a user out of
        # the one-line fix that works is the worst kind of wrong answer).
        return _setting_first(inp, capture, cause, horizon, allocator_headline)
    if cause is not None:
        # The program's mistake (analysis.causes) comes first: the allocator's view of the failing
        # request stays beside it, and its best setting becomes the runner-up, worded by the cause.
        pools = inp.pools_sentence if cause.id != "cuda_graph_pools" else ""
        return {
            "headline": f"{cause.headline}{inp.phase_sentence}{pools}",
            "allocator_headline": allocator_headline,
            "cause": cause.id,
            "cause_label": cause.id.replace("_", " "),
            "change": {"id": cause.id, "line": cause.fix_line, "kind": "code", "title": cause.fix_title},
            "buys": _cause_buys(cause, oom),
            "confidence": _confidence(inp, capture, None, cause=cause),
            "runner_up": _change(choice, recorded_conf, short=True) if choice else None,
        }
    if oom and choice is not None and oom.device_full_unexplained and _unproven_on_a_full_device(choice):
        # The GPU itself was full and nothing says who held the rest of it: a setting that only gets past
        # the request is not the first thing to try (round 3's device-full runs died under every setting),
        # nor a code change sized against the device's free memory then (another process may hold the rest:
        # issue 32's run that another process filled read "cap what grows").
        return {
            "headline": f"{headline} {_device_full_sentence(oom)}",
            "change": dict(CHECK_THE_DEVICE),
            "buys": (
                "Not measured: the snapshot does not record the GPU's size or who else held it. The OOM message does "
                "(its 'Process N has ...' and 'Including non-PyTorch memory' lines): give it with the snapshot."
            ),
            "confidence": _confidence(inp, capture, choice),
            "runner_up": _change(choice, recorded_conf, short=True),
        }
    if not oom and choice is not None and not choice.is_setting:
        # No OOM and no free setting lowers the peak: nothing needs to change (issue 35: such runs were
        # pushed checkpointing or an 8-bit optimizer). The cheapest code change, for room, is the runner-up.
        return {
            "headline": headline,
            "change": None,
            "buys": NO_OOM_NOTHING_FREE,
            "confidence": _confidence(inp, capture, None),
            "runner_up": _change(_cheapest(ranked, inp.ranked_ids), recorded_conf, short=True),
        }
    change = _change(choice, recorded_conf) if choice else None
    buys = _buys(choice, oom, inp.peak_reserved, inp.events) if choice else _nothing_buys(oom)
    return {
        "headline": headline,
        "change": change,
        "buys": buys,
        "confidence": _confidence(inp, capture, choice),
        "runner_up": _change(runner, recorded_conf, short=True) if runner else None,
    }


@dataclass(frozen=True)
class _Horizon:
    """Where a growing run dies under a free setting: ``dies_at`` (None: past every grown step replayed, at
    least ``reaches``), and from what: "grown" (its replay of the grown steps, ``whatif[].grown_horizon``),
    "replay" (its replay of the failing step, packing carried forward) or "packed" (a perfectly packed cache)."""

    setting: _Choice
    dies_at: int | None
    reaches: int
    source: str
    steps_replayed: int = 0

    def to_json(self) -> dict[str, Any]:
        out = {"setting": self.setting.id, "dies_in_step": self.dies_at, "source": self.source}
        return out | ({"steps_replayed": self.steps_replayed} if self.source == "grown" else {})


def _setting_horizon_first(
    cause: CauseFacts,
    oom: OomFacts,
    suggestions: Sequence[Mapping[str, Any]],
    whatifs: Sequence[Mapping[str, Any]],
) -> _Horizon | None:
    """A growing workload's free setting and its horizon, where the setting carries the run well past the failing
    step (``horizon.horizon_is_near``); None where the farthest horizon is near (then no setting saves the
    run) or no setting is free. A setting's horizon is its replay of the grown steps where the report has one
    (``whatif[].grown_horizon``), else its replay of the failing step with its packing carried forward
    (``horizon.setting_horizon``, reports made before the grown replay), else, without a replay of the step,
    the perfectly packed estimate for ``expandable_segments``."""
    if cause.id != "growing_workload":
        return None
    step, rate = int(cause.died_in_step or 0), cause.growth_per_step
    # The growth took back each setting's "avoids the OOM" (analysis.sizing): its replay's own answer stands here.
    choices = [_Choice(s, _whatif_of(s, whatifs)) for s in suggestions]
    free = [c for c in choices if c.is_setting and c.whatif_avoids_oom]
    horizons = [h for h in (_replayed_horizon(c, step, oom, rate) for c in free) if h is not None]
    if horizons:
        horizon = max(horizons, key=lambda h: h.reaches)  # max() keeps the first of equals
    else:
        # No replay of the step: the perfectly packed estimate, which is what expandable_segments approaches.
        packed = [c for c in free if c.step_completes is None and c.id == "expandable_segments"]
        if not packed or rate <= 0:
            return None
        dies_at = step + cause.postpone_packed_steps
        horizon = _Horizon(packed[0], dies_at, dies_at, "packed")
    return None if horizon_is_near(step, horizon.reaches) else horizon


def _replayed_horizon(choice: _Choice, step: int, oom: OomFacts, rate: int) -> _Horizon | None:
    """A setting's horizon from its replays: the grown steps', else the failing step's packing carried forward."""
    grown = GrownFacts.of(choice.whatif)
    if grown is not None:
        return _Horizon(choice, grown.dies_in_step, grown.reaches, "grown", grown.steps_replayed)
    need = oom.step_need
    if choice.step_completes is not True or not need or not choice.step_peak_reserved or rate <= 0:
        return None
    dies_at = setting_horizon(step, need, oom.limit, rate, choice.step_peak_reserved)
    return _Horizon(choice, dies_at, dies_at, "replay")


def _horizon_sentence(cause: CauseFacts, horizon: _Horizon) -> str:
    step = cause.died_in_step
    how = {
        "grown": f"its replay of step {step} and of {horizon.steps_replayed} steps grown after it, with its own "
        "packing of each, shows",
        "replay": f"its replay runs step {step} to its end, and with its packing",
        "packed": "even without a replay of the step, a perfectly packed cache gains that much, and",
    }[horizon.source]
    until = (
        f"the run goes on to about step {horizon.dies_at} before the growth outgrows the limit"
        if horizon.dies_at is not None
        else f"the run goes on past step {horizon.reaches - 1}, the last replayed, and the growth outgrows the limit "
        "only later"
    )
    return (
        f"The steps grow (about {format_size(cause.growth_per_step)} a step) and step "
        f"{step} needed more than the limit, but {horizon.setting.id} costs nothing and carries the run "
        f"on: {how} {until}. Make that change first; cap what grows before then (the runner-up)."
    )


def _setting_first(
    inp: DecisionInput,
    capture: Mapping[str, Any],
    cause: CauseFacts,
    horizon: _Horizon,
    allocator_headline: str,
) -> dict[str, Any]:
    """The decision that makes a growing run's free setting the change, with its horizon."""
    sentence = _horizon_sentence(cause, horizon)
    return {
        "headline": f"{sentence}{inp.phase_sentence}{inp.pools_sentence}",
        "allocator_headline": allocator_headline,
        "change": _change(horizon.setting, _recorded_conf(capture)),
        "buys": _horizon_buys(cause, horizon),
        "horizon": horizon.to_json(),
        "confidence": _confidence(inp, capture, horizon.setting),
        "runner_up": {"id": cause.id, "line": cause.fix_line},  # the short form, as every runner_up
    }


def _horizon_buys(cause: CauseFacts, horizon: _Horizon) -> str:
    basis = {
        "grown": "its replay of the grown steps",
        "replay": "its replay of the failing step, with the steps' growth carried forward",
        "packed": "a perfectly packed cache, without a replay, with the steps' growth carried forward",
    }[horizon.source]
    if horizon.dies_at is None:
        reach = f"every step its replay grew, up to step {horizon.reaches - 1} at least"
    else:
        reach = f"the steps after it up to about step {horizon.dies_at - 1}"
    return f"Step {cause.died_in_step} and {reach} (a horizon from {basis}); the growth goes on, so cap it before then."


def _unproven_on_a_full_device(choice: _Choice) -> bool:
    """Whether a change does not stand on its own where the device filled up and no message says of what:
    all but a setting whose replay runs the whole failing step."""
    return not choice.is_setting or choice.step_completes is not True


CHECK_THE_DEVICE = {
    "id": "check_device",
    "line": "nvidia-smi --query-compute-apps=pid,used_memory --format=csv",
    "kind": "check",
    "title": "First see what else holds the GPU",
}


def device_full_unexplained(oom: Mapping[str, Any]) -> bool:
    """The device itself ran out (no per-process cap) and no OOM message says what held the rest."""
    return oom.get("limit_kind") == "device-full" and oom.get("limit_source") == "inferred"


def _device_full_sentence(oom: OomFacts) -> str:
    free = format_size(oom.device_free)
    reserved = format_size(oom.reserved)
    return (
        f"But the GPU itself was full ({free} free on it) while PyTorch held {reserved}: if the GPU has more memory "
        "than that, the rest was held outside this process's cache (another process, or a library in this one), "
        "and no allocator setting gives that back."
    )


def run_verdict(dev: Mapping[str, Any]) -> dict[str, str] | None:
    """``oom.run_verdict`` and ``oom.run_verdict_basis``: the verdict of the run, which the page, the API's
    summary, the webhook, the client and the history say (``oom.request_verdict`` is the failing request's).

    - ``cause``: a program cause explains the OOM (``diagnosis.primary``): "capacity". No allocator setting
      undoes any cause's mistake: every setting's real rerun of each cause's family died in the same step, or
      (a leak, a growing workload) a few steps later (tests/fixtures/diagnosis), though the one request
      alone may have fitted beside the cache's free blocks;
    - ``step``: the failing step was projected: the step-level verdict (``oom.verdict``);
    - ``request``: else the failing request's."""
    oom = oom_facts(dev)
    if oom is None:
        return None
    cause, decision = primary_cause(dev), dev.get("decision")
    if cause is not None and (decision is None or decision.get("cause") == cause.get("id")):
        return {"run_verdict": "capacity", "run_verdict_basis": "cause"}
    if oom.verdict_level == "step":
        return {"run_verdict": str(oom.verdict), "run_verdict_basis": "step"}
    return {"run_verdict": str(oom.request_verdict or oom.verdict), "run_verdict_basis": "request"}


def _cause_buys(cause: CauseFacts, oom: OomFacts | None) -> str:
    """What the cause's fix is worth, from its own arithmetic (never a replay: the program changes)."""
    saving = cause.saving
    fits = cause.fits_after_fix
    if saving is None:
        text = "Not measured from the trace: the program itself changes."
    else:
        text = f"About {format_size(int(saving))} less at the failing point (arithmetic on the trace, not a replay)"
        if fits is True and oom:
            text += ": the failing request then fits within the limit."
        elif fits is False and oom:
            text += ": not enough alone; the failing request would still not fit."
        else:
            text += "."
    return f"{text} Allocator settings: {cause.settings}."


# ------------------------------------------------------------------ choosing


class _Choice:
    """A suggestion and the what-if replay of its setting (None for a code change)."""

    def __init__(self, suggestion: Mapping[str, Any], whatif: Mapping[str, Any] | None) -> None:
        self.suggestion = suggestion
        self.whatif = whatif

    @property
    def id(self) -> Any:
        return self.suggestion.get("id")

    @property
    def whatif_avoids_oom(self) -> bool:
        """The replay of the setting avoided the OOM (its own answer, whatever a cause took back)."""
        return self.whatif is not None and self.whatif.get("oom_avoided") is True

    @property
    def whatif_peak_reserved(self) -> int:
        return int(self.whatif.get("peak_reserved_bytes") or 0) if self.whatif else 0

    @property
    def step_peak_reserved(self) -> int:
        """The replay's peak reserved memory over the failing step (0: not replayed)."""
        return int(self.whatif.get("step_peak_reserved_bytes") or 0) if self.whatif else 0

    @property
    def is_setting(self) -> bool:
        return str(self.suggestion.get("config") or "").startswith(ENV_PREFIX)

    @property
    def step_completes(self) -> bool | None:
        for source in (self.whatif or {}, self.suggestion):
            value = source.get("step_completes")
            if value is not None:
                return bool(value)
        return None

    @property
    def avoids_oom(self) -> bool | None:
        value = self.suggestion.get("avoids_oom")
        if value is None and self.whatif is not None:
            value = self.whatif.get("oom_avoided")
        return None if value is None else bool(value)


def _whatif_of(suggestion: Mapping[str, Any], whatifs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The replay behind a setting's suggestion: same config string, else same setting id."""
    config = str(suggestion.get("config") or "")
    if not config.startswith(ENV_PREFIX):
        return None
    conf = config[len(ENV_PREFIX) :]
    for w in whatifs:
        if w.get("config") == conf:
            return w
    for w in whatifs:
        if w.get("setting") == suggestion.get("id"):
            return w
    return None


def _ranked_for_oom(
    suggestions: Sequence[Mapping[str, Any]], whatifs: Sequence[Mapping[str, Any]], ranked_ids: Sequence[str] = ()
) -> list[_Choice]:
    """Settings whose replay gets past the OOM, and every code change; in ``analysis.sizing``'s ranked
    order where the report has one (what lets the failing step finish first, cheapest first: issue 12),
    else settings first, those whose step completes ahead."""
    choices = [_Choice(s, _whatif_of(s, whatifs)) for s in suggestions]
    settings = [c for c in choices if c.is_setting and c.avoids_oom is True]
    order = {True: 0, None: 1, False: 2}
    # sorted() is stable: the advisor's order breaks ties.
    settings.sort(key=lambda c: order[c.step_completes])
    others = [c for c in choices if not c.is_setting]
    kept = settings + others
    if ranked_ids:
        position = {sid: k for k, sid in enumerate(ranked_ids)}
        kept.sort(key=lambda c: position.get(str(c.id), len(position)))
    return kept


def _ranked_without_oom(
    suggestions: Sequence[Mapping[str, Any]], whatifs: Sequence[Mapping[str, Any]], recorded_peak: int
) -> list[_Choice]:
    choices = [_Choice(s, _whatif_of(s, whatifs)) for s in suggestions]
    settings = [c for c in choices if c.is_setting and c.whatif is not None and c.whatif_peak_reserved < recorded_peak]
    settings.sort(key=lambda c: c.whatif_peak_reserved)
    others = [c for c in choices if not c.is_setting]
    return settings + others


NO_OOM_NOTHING_FREE = (
    "Nothing needs to change: the run did not run out of memory, and no allocator setting lowers its peak in "
    "the replay. For room to grow (a larger batch, longer sequences), the runner-up is the cheapest code "
    "change that frees memory, at a cost in speed, numerics or state."
)


def _cheapest(ranked: Sequence[_Choice], ranked_ids: Sequence[str]) -> _Choice:
    """Of the code changes, the first in the ranked table's order (cheapest first), else the advisor's first."""
    position = {sid: k for k, sid in enumerate(ranked_ids)}
    return min(ranked, key=lambda c: position.get(str(c.suggestion.get("id")), len(position)))


def _recorded_conf(capture: Mapping[str, Any]) -> str:
    settings = capture.get("allocator_settings") or {}
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF") if isinstance(settings, Mapping) else None
    return str(conf or "").strip()


def _merged_line(config: str, recorded_conf: str) -> str:
    """The env line to copy: the recorded settings kept as written, the new one added (the replay ran so)."""
    new = config[len(ENV_PREFIX) :]
    new_keys = {part.key for part in split_conf(new, strict=False)}
    kept = [part.text for part in split_conf(recorded_conf, strict=False) if part.key not in new_keys]
    return ENV_PREFIX + ",".join([*kept, new])


def _change(choice: _Choice, recorded_conf: str, *, short: bool = False) -> dict[str, Any]:
    s = choice.suggestion
    config = str(s.get("config") or "")
    if choice.is_setting:
        out: dict[str, Any] = {"id": s.get("id"), "line": _merged_line(config, recorded_conf)}
        kind = "env"
    else:
        out = {"id": s.get("id"), "line": config or str(s.get("title") or "")}
        kind = "code"
    if not short:
        out["kind"] = kind
        out["title"] = s.get("title")
    return out


# ------------------------------------------------------------------ wording


def _oom_headline(oom: OomFacts) -> str:
    tried = format_size(oom.tried)
    allocated = format_size(oom.allocated)
    lower = oom.limit_is_lower_bound
    limit_text = f"{'at least ' if lower else ''}{format_size(oom.limit)}"
    if oom.verdict == "fragmentation":
        block, named = named_free_block(oom.raw)
        return (
            f"Out of memory from fragmentation, not capacity: the {tried} request would have fit beside the "
            f"{allocated} allocated within the limit of {limit_text}, and the cache held "
            f"{format_size(oom.cached_free)} free, but {named} was {format_size(block)}."
        )
    if oom.verdict_certain is False or lower:
        # Against a lower bound of the cap: the real cap may be higher, so this is no proof of capacity.
        return (
            f"Out of memory from capacity, as far as the trace shows: the {tried} request on top of the {allocated} "
            f"allocated is more than the limit of {limit_text} (a lower bound: the real cap may be higher, and the "
            "OOM message says what it was); if it is not higher, no allocator setting makes it fit."
        )
    return (
        f"Out of memory from capacity: the {tried} request on top of the {allocated} allocated is more than the "
        f"limit of {limit_text}; no allocator setting makes it fit, the workload must hold less at that point."
    )


def _caught_before(count: int) -> str:
    """The earlier OOMs of the trace were caught (it goes on after each): not what ended the run (issue 33's
    ResNet: cuDNN catches its own OOMs while it tries convolution algorithms, 32 in one step)."""
    if count <= 1:
        return ""
    caught = "the one before it was" if count == 2 else f"the {count - 1} before it were"
    return (
        f"The last of {count} OOMs in the trace. {caught.capitalize()} caught and the run went on (by the program "
        "or a library: cuDNN catches its own while it tries convolution algorithms): this one ended it. "
    )


def _no_setting_sentence(oom: OomFacts, whatifs: Sequence[Mapping[str, Any]]) -> str:
    """Fragmentation at the failing request that no setting's replay got past: said at once, so that a change to
    the workload under a "fragmentation" headline does not read as a contradiction (issue 33's ResNet: the holes
    lay between the forward's own activations; every setting's real rerun died too)."""
    tried = [w for w in whatifs if w.get("origin") != "user"]
    if oom.verdict != "fragmentation" or not tried or any(w.get("oom_avoided") is not False for w in tried):
        return ""
    return (
        f" No allocator setting got past it in the replay ({len(tried)} tried): the free memory lay between blocks "
        "the workload still held, so the workload must hold less at that point."
    )


def _idle_headline(inp: DecisionInput, capture: Mapping[str, Any]) -> str:
    text = _idle_sentence(inp)
    if capture.get("has_trace") and capture.get("trace_complete"):
        return text
    # A state-only dump or a wrapped trace cannot show an OOM that happened before what it holds.
    why = "the trace is incomplete" if capture.get("has_trace") else "the snapshot holds no allocation history"
    return text.replace("No out-of-memory error", f"No OOM recorded ({why}, so an earlier one would not show)", 1)


def _where(at: int) -> str:
    return "before the first recorded event" if at < 0 else f"event {at:,}"


def _idle_sentence(inp: DecisionInput) -> str:
    final_idle = inp.final_reserved - inp.final_allocated
    if inp.plateau:
        return _plateau_sentence(inp.plateau, final_idle)
    at_peak = inp.idle_at_peak
    if at_peak is None:
        reserved = inp.final_reserved
        return (
            f"No out-of-memory error; at the dump {format_size(final_idle)} of the {format_size(reserved)} reserved "
            "held no live block (idle cache)."
        )
    at, reserved, idle = at_peak
    share = idle / reserved if reserved else 0.0
    if idle >= IDLE_MIN_BYTES and share >= IDLE_MIN_SHARE:
        return (
            f"No out-of-memory error, but memory is wasted: at the reserved peak ({_where(at)}) "
            f"{format_size(idle)} of the {format_size(reserved)} reserved held no live block ({share:.0%} idle "
            f"cache); at the end {format_size(final_idle)} is idle."
        )
    return (
        f"No out-of-memory error and little waste: at the reserved peak ({_where(at)}) {format_size(idle)} of the "
        f"{format_size(reserved)} reserved was idle cache ({share:.0%})."
    )


def plateau_wasted(plateau: Mapping[str, Any]) -> bool:
    """Idle above the advisor's floor at every event that held the reserved peak."""
    least, reserved = int(plateau["least_idle_bytes"]), int(plateau["reserved_bytes"])
    return least >= IDLE_MIN_BYTES and least >= IDLE_MIN_SHARE * reserved


def _plateau_sentence(plateau: Mapping[str, Any], final_idle: int) -> str:
    reserved, least = int(plateau["reserved_bytes"]), int(plateau["least_idle_bytes"])
    first, last, at = (
        int(plateau["first_event_index"]),
        int(plateau["last_event_index"]),
        int(plateau["least_idle_event_index"]),
    )
    span = f"{_where(first)}" if first == last else f"from {_where(first)} to {_where(last)}"
    share = least / reserved if reserved else 0.0
    if plateau_wasted(plateau):
        return (
            f"No out-of-memory error, but memory is wasted: while reserved memory held its peak of "
            f"{format_size(reserved)} ({span}), at least {format_size(least)} of it held no live block "
            f"({share:.0%} idle cache even at its fullest, {_where(at)}); at the end {format_size(final_idle)} is idle."
        )
    return (
        f"No out-of-memory error and little waste: reserved memory peaked at {format_size(reserved)} ({span}) and "
        f"was used: at {_where(at)} only {format_size(least)} of it was idle cache ({share:.0%})."
    )


def _buys(choice: _Choice, oom: OomFacts | None, recorded_peak: int, events: int | None = None) -> str:
    s, w = choice.suggestion, choice.whatif
    if choice.is_setting and w is not None:
        conf = str(w.get("config"))
        peak = choice.whatif_peak_reserved
        peak_text = f"peak reserved {format_size(recorded_peak)} → {format_size(peak)}"
        if oom:
            tried, at = format_size(oom.tried), oom.event_index
            if choice.avoids_oom:
                text = f"In the replay under {conf} the {tried} request at event {at:,} fits: the OOM is gone"
            else:
                text = f"In the replay under {conf} the {tried} request at event {at:,} still fails"
            completes = choice.step_completes
            if completes is True:
                text += ", and the step completes"
            elif completes is False:
                need = oom.step_need
                more = f" (it needs {format_size(need)})" if need else ""
                text += f", but the rest of the step still runs out of memory{more}"
            elif choice.avoids_oom:
                why = readout.not_projected_reason(oom.raw, events)
                text += f"; whether the rest of the step fits is not known ({why})"
            return f"{text}; {peak_text}."
        saved = recorded_peak - peak
        return f"In the replay under {conf}: {peak_text} ({format_size(saved)} less)."
    saving = int(s.get("estimated_saving_bytes") or 0)
    if saving > 0:
        # A first step's split (analysis.sizing) claims the failing point only: the trace ends inside that step.
        rest = (
            " Whether the rest of the step then fits is not known: the trace holds it only up to the failing point."
            if "step_completes" in s and s["step_completes"] is None
            else ""
        )
        return (
            f"An estimate, not a replay (the workload itself changes): about {format_size(saving)} less memory "
            f"at that point.{rest}"
        )
    return "Not measured: the workload itself changes, so no replay can say."


def _nothing_buys(oom: OomFacts | None) -> str:
    if oom:
        return "No allocator setting avoided the OOM in the replay, and no rule found a change the figures support."
    return "Nothing to change: no setting lowered peak reserved memory in the replay."


def _confidence(
    inp: DecisionInput,
    capture: Mapping[str, Any],
    choice: _Choice | None,
    *,
    cause: CauseFacts | None = None,
) -> dict[str, Any]:
    oom, exact = inp.oom, inp.replay_exact
    completes = choice.step_completes if choice is not None and choice.whatif is not None else None
    out: dict[str, Any] = {
        "replay_exact": exact,
        "trace_complete": bool(capture.get("trace_complete")),
        # Whether the replay followed the step past the recorded OOM (the trace ends there).
        "step_projected": completes is not None or (oom is not None and oom.projected),
        "limit_source": oom.limit_source if oom else None,
        "limit_is_lower_bound": oom.limit_is_lower_bound if oom else None,
    }
    parts = []
    if cause is not None:
        parts.append(
            "the cause is read from the trace (its stack frames, phases and step ends"
            + (", and the OOM message" if cause.id == "outside_memory" else "")
            + "); its saving is arithmetic, not a replay"
        )
    if exact is True:
        parts.append(
            f"the model replays the recorded run exactly ({inp.segment_events_reproduced:,} of "
            f"{inp.segment_events_recorded:,} segment events)"
        )
    elif exact is False:
        parts.append("the model does not replay the recorded run exactly, so its what-ifs are approximate")
    elif inp.replay_shown:
        parts.append("the trace has no segment events to check the model against, so its what-ifs are unchecked")
    if not out["trace_complete"]:
        parts.append("the trace is incomplete, so peaks are lower bounds")
    if oom:
        parts.append("the step was projected past the OOM" if out["step_projected"] else "the step was not projected")
        src = out["limit_source"]
        where = _LIMIT_WORDS.get(str(src), f"inferred ({src})")
        lower = "at least " if out["limit_is_lower_bound"] else ""
        parts.append(f"the limit is {lower}{where}" if src != "given" else "the limit was given (--limit)")
    out["text"] = ("Confidence: " + "; ".join(parts) + ".") if parts else ""
    return out
