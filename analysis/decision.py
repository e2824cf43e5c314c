"""The decision: what to change first, read off a finished device report.

``decide(device_report, capture)`` is a pure function of the report's own keys
(no replay is run here): it picks the verdict, the one change to make, what the
replay says it buys, how sure that is, and the runner-up. The report stores the
result as ``devices[].decision``; the page shows it first. Rules (docs/report.md,
"The decision"):

- With an OOM the change is the first allocator setting whose replay avoids the
  OOM, preferring one whose step is known to complete (``whatif.step_completes``
  true, then unknown, then false); the advisor's order breaks ties. Without such
  a setting, the first suggestion that is not about the capture (a code change).
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
``suggestions[].step_completes``, ``oom.step_need_bytes``) are read with ``.get``
and fall back to ``oom_avoided``. A stored report comes through
``analysis.stored.upgrade`` first (``oom.limit_is_lower_bound`` and the device's
``limit`` of the first reports); ``oom.limit_source`` may still hold an older value
(``device-full``, ``cap-lower-bound``), which ``_LIMIT_WORDS`` words.

Sizes are worded as torch's ``format_size`` prints them (``710.00 MiB``), so a
figure here reads the same as the OOM message the user already has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analysis import readout
from analysis.allocator.config import split_conf
from analysis.oom import named_free_block
from analysis.projection import horizon_is_near, setting_horizon

ENV_PREFIX = "PYTORCH_CUDA_ALLOC_CONF="
# Idle cache worth a headline (the advisor's improvement floor: both a share and bytes).
IDLE_MIN_SHARE = 0.05
IDLE_MIN_BYTES = 64 << 20
# Suggestions that are not a change to the workload or its settings.
_NOT_A_CHANGE = frozenset({"capture_settings"})
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


def decide(device_report: Mapping[str, Any], capture: Mapping[str, Any]) -> dict[str, Any]:
    """``devices[].decision``: ``{headline, change, buys, confidence, runner_up}``."""
    dev = device_report
    oom = dev.get("oom") or None
    summary = dev.get("summary") or {}
    suggestions = [s for s in dev.get("suggestions") or [] if s.get("id") not in _NOT_A_CHANGE]
    whatifs = list(dev.get("whatif") or [])
    recorded_conf = _recorded_conf(capture)

    if oom and "tried_to_allocate_bytes" not in oom:
        # The size torch's message names lives on the OOM's entry of ``ooms``.
        same = [o for o in dev.get("ooms") or [] if o.get("event_index") == oom.get("event_index")]
        if same and same[0].get("tried_to_allocate_bytes"):
            oom = {**oom, "tried_to_allocate_bytes": same[0]["tried_to_allocate_bytes"]}
    if oom:
        ranked = _ranked_for_oom(suggestions, whatifs, [str(r["id"]) for r in dev.get("ranked") or []])
        headline = _oom_headline(oom)
        count = len(dev.get("ooms") or []) or int(oom.get("ooms_in_trace") or 1)
        if count > 1:
            headline = f"The last of {count} OOMs in the trace. {headline}"

    else:
        ranked = _ranked_without_oom(suggestions, whatifs, int(summary.get("peak_reserved_bytes") or 0))
        headline = _idle_headline(dev, capture)
    choice = ranked[0] if ranked else None
    runner = ranked[1] if len(ranked) > 1 else None
    cause = primary_cause(dev)
    allocator_headline = headline
    if oom:
        headline = f"{headline}{_phase_sentence(dev)}"
    if cause is None or cause.get("id") != "cuda_graph_pools":
        headline = f"{headline}{pools_sentence(dev)}"
    horizon = _setting_horizon_first(cause, oom, suggestions, whatifs) if cause is not None and oom else None
    if cause is not None and horizon is not None:
        # A growing run that a free setting carries well past the failing step (its horizon is not near): the
        # setting first, with its horizon; capping what grows is the runner-up (issue 32: talking a user out of
        # the one-line fix that works is the worst kind of wrong answer).
        return _setting_first(dev, capture, cause, horizon, allocator_headline)
    if cause is not None:
        # The program's mistake (analysis.causes) comes first: the allocator's view of the failing
        # request stays beside it, and its best setting becomes the runner-up, worded by the cause.
        pools = pools_sentence(dev) if cause.get("id") != "cuda_graph_pools" else ""
        return {
            "headline": f"{cause['headline']}{_phase_sentence(dev)}{pools}",
            "allocator_headline": allocator_headline,
            "cause": cause["id"],
            "cause_label": str(cause["id"]).replace("_", " "),
            "change": {"id": cause["id"], "line": cause["fix"]["line"], "kind": "code", "title": cause["fix"]["title"]},
            "buys": _cause_buys(cause, oom),
            "confidence": _confidence(dev, capture, None, cause=cause),
            "runner_up": _change(choice, recorded_conf, short=True) if choice else None,
        }
    if oom and choice is not None and device_full_unexplained(oom) and _unproven_on_a_full_device(choice):
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
            "confidence": _confidence(dev, capture, choice),
            "runner_up": _change(choice, recorded_conf, short=True),
        }
    if not oom and choice is not None and not choice.is_setting:
        # No OOM and no free setting lowers the peak: nothing needs to change (issue 35: such runs were
        # pushed checkpointing or an 8-bit optimizer). The cheapest code change, for room, is the runner-up.
        return {
            "headline": headline,
            "change": None,
            "buys": NO_OOM_NOTHING_FREE,
            "confidence": _confidence(dev, capture, None),
            "runner_up": _change(_cheapest(ranked, dev), recorded_conf, short=True),
        }
    change = _change(choice, recorded_conf) if choice else None
    buys = _buys(choice, oom, summary, dev.get("events")) if choice else _nothing_buys(oom)
    return {
        "headline": headline,
        "change": change,
        "buys": buys,
        "confidence": _confidence(dev, capture, choice),
        "runner_up": _change(runner, recorded_conf, short=True) if runner else None,
    }


def _setting_horizon_first(
    cause: Mapping[str, Any],
    oom: Mapping[str, Any],
    suggestions: Sequence[Mapping[str, Any]],
    whatifs: Sequence[Mapping[str, Any]],
) -> tuple[_Choice, int, str] | None:
    """(setting, the step the run dies in under it, "replay" | "packed") where a growing workload's free setting
    carries the run well past the failing step (``projection.horizon_is_near``): by its replay of the failing step
    (its own packing, ``projection.setting_horizon``) where the step was projected, else by the perfectly
    packed estimate; None where that horizon is near (then no setting saves the run) or no setting is free."""
    if cause.get("id") != "growing_workload":
        return None
    figures = cause.get("figures") or {}
    step, rate = int(figures.get("died_in_step") or 0), int(figures.get("growth_per_step_bytes") or 0)
    # The growth took back each setting's "avoids the OOM" (analysis.sizing): its replay's own answer stands here.
    choices = [_Choice(s, _whatif_of(s, whatifs)) for s in suggestions]
    free = [c for c in choices if c.is_setting and (c.whatif or {}).get("oom_avoided") is True]
    need = int(oom.get("step_need_bytes") or 0)
    replayed = [
        (setting_horizon(step, need, int(oom["limit_bytes"]), rate, int(c.whatif["step_peak_reserved_bytes"])), c)
        for c in free
        if c.step_completes is True and need and c.whatif and c.whatif.get("step_peak_reserved_bytes")
    ]
    if replayed and rate > 0:
        dies_at, setting = max(replayed, key=lambda hc: hc[0])  # max() keeps the first of equals
        source = "replay"
    else:
        # No replay of the step: the perfectly packed estimate, which is what expandable_segments approaches.
        packed = [c for c in free if c.step_completes is None and c.suggestion.get("id") == "expandable_segments"]
        if not packed or rate <= 0:
            return None
        dies_at, setting, source = step + int(figures.get("postpone_packed_steps") or 0), packed[0], "packed"
    return None if horizon_is_near(step, dies_at) else (setting, dies_at, source)


def _horizon_sentence(cause: Mapping[str, Any], setting: _Choice, dies_at: int, source: str) -> str:
    figures = cause.get("figures") or {}
    step = figures.get("died_in_step")
    how = (
        f"its replay runs step {step} to its end, and with its packing"
        if source == "replay"
        else "even without a replay of the step, a perfectly packed cache gains that much, and"
    )
    return (
        f"The steps grow (about {format_size(int(figures.get('growth_per_step_bytes') or 0))} a step) and step "
        f"{step} needed more than the limit, but {setting.suggestion.get('id')} costs nothing and carries the run "
        f"on: {how} the run goes on to about step {dies_at} before the growth outgrows the limit. Make that change "
        "first; cap what grows before then (the runner-up)."
    )


def _setting_first(
    dev: Mapping[str, Any],
    capture: Mapping[str, Any],
    cause: Mapping[str, Any],
    horizon: tuple[_Choice, int, str],
    allocator_headline: str,
) -> dict[str, Any]:
    """The decision that makes a growing run's free setting the change, with its horizon."""
    setting, dies_at, source = horizon
    return {
        "headline": f"{_horizon_sentence(cause, setting, dies_at, source)}{_phase_sentence(dev)}{pools_sentence(dev)}",
        "allocator_headline": allocator_headline,
        "change": _change(setting, _recorded_conf(capture)),
        "buys": _horizon_buys(cause, dies_at, source),
        "horizon": {"setting": setting.suggestion.get("id"), "dies_in_step": dies_at, "source": source},
        "confidence": _confidence(dev, capture, setting),
        "runner_up": {"id": cause["id"], "line": cause["fix"]["line"]},  # the short form, as every runner_up
    }


def _horizon_buys(cause: Mapping[str, Any], dies_at: int, source: str) -> str:
    basis = "its replay of the failing step" if source == "replay" else "a perfectly packed cache, without a replay"
    return (
        f"Step {(cause.get('figures') or {}).get('died_in_step')} and the steps after it up to about step "
        f"{dies_at - 1} (a horizon from {basis}, with the steps' growth carried forward); the growth goes on, so "
        "cap it before then."
    )


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


def _device_full_sentence(oom: Mapping[str, Any]) -> str:
    free = format_size(int(oom.get("device_free_bytes") or 0))
    reserved = format_size(int(oom.get("reserved_bytes") or 0))
    return (
        f"But the GPU itself was full ({free} free on it) while PyTorch held {reserved}: if the GPU has more memory "
        "than that, the rest was held outside this process's cache (another process, or a library in this one), "
        "and no allocator setting gives that back."
    )


# Private pools worth naming in the headline: this share of what PyTorch reserved (causes' own floor).
POOLS_HEADLINE_SHARE = 0.25


def pools_sentence(dev: Mapping[str, Any]) -> str:
    """ " Private pools held X of the Y PyTorch reserved: ..." where pools hold at least
    ``POOLS_HEADLINE_SHARE`` of reserved memory at the ledger's moment (the OOM, else the reserved peak):
    memory a pool keeps is neither activations nor cache the program can reuse."""
    rows = {r.get("id"): r for r in (dev.get("ledger") or {}).get("rows") or []}
    pools = rows.get("private_pools") or {}
    held = int(pools.get("bytes") or 0)
    reserved = held + sum(int((rows.get(k) or {}).get("bytes") or 0) for k in ("allocated", "cached_free"))
    if not held or held < POOLS_HEADLINE_SHARE * reserved:
        return ""
    parts = sorted(pools.get("parts") or [], key=lambda p: -int(p.get("bytes") or 0))
    largest = parts[0]["label"] if parts else ""
    many = f"{len(parts)} private pools" if len(parts) > 1 else "A private pool"
    biggest = f" (the largest {format_size(int(parts[0]['bytes']))}, {largest})" if len(parts) > 1 else f" ({largest})"
    return (
        f" {many} held {format_size(held)} of the {format_size(reserved)} PyTorch reserved{biggest if parts else ''}:"
        " memory a pool keeps serves only its own graphs or cache, not the program's other tensors."
    )


def _phase_sentence(dev: Mapping[str, Any]) -> str:
    """The sentence "The OOM came in the backward pass; live then, ...": where the OOM came and what each phase held
    (``diagnosis``; empty where the trace has no frames to tell phases by)."""
    diagnosis = dev.get("diagnosis") or {}
    words = diagnosis.get("oom_phase_words")
    if not diagnosis.get("phases_known") or not words:
        return ""
    live = sorted((diagnosis.get("live_by_phase_at_oom") or {}).items(), key=lambda kv: -int(kv[1]))
    held = ", ".join(f"{PHASE_NAMES.get(k, k)} {format_size(int(v))}" for k, v in live[:4] if int(v) > 0)
    return f" The OOM came in {words}" + (f"; live then, by phase: {held}." if held else ".")


# Short names of analysis.phases.PHASES for the headline's list.
PHASE_NAMES = {
    "other": "other code",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "forward_no_backward": "forward without backward",
    "decode": "decoding",
    "graph_capture": "graph capture",
    "data_loading": "data loading",
}


def run_verdict(dev: Mapping[str, Any]) -> dict[str, str] | None:
    """``oom.run_verdict`` and ``oom.run_verdict_basis``: the verdict of the run, which the page, the API's
    summary, the webhook, the client and the history say (``oom.request_verdict`` is the failing request's).

    - ``cause``: a program cause explains the OOM (``diagnosis.primary``): "capacity". No allocator setting
      undoes any cause's mistake: every setting's real rerun of each cause's family died in the same step, or
      (a leak, a growing workload) a few steps later (tests/fixtures/diagnosis), though the one request
      alone may have fitted beside the cache's free blocks;
    - ``step``: the failing step was projected: the step-level verdict (``oom.verdict``);
    - ``request``: else the failing request's."""
    oom = dev.get("oom")
    if not oom:
        return None
    cause, decision = primary_cause(dev), dev.get("decision")
    if cause is not None and (decision is None or decision.get("cause") == cause.get("id")):
        return {"run_verdict": "capacity", "run_verdict_basis": "cause"}
    if oom.get("verdict_level") == "step":
        return {"run_verdict": str(oom.get("verdict")), "run_verdict_basis": "step"}
    return {"run_verdict": str(oom.get("request_verdict") or oom.get("verdict")), "run_verdict_basis": "request"}


def primary_cause(dev: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The cause the diagnosis names first (``devices[].diagnosis.primary``), or None."""
    diagnosis = dev.get("diagnosis") or {}
    primary = diagnosis.get("primary")
    for c in diagnosis.get("causes") or []:
        if c.get("id") == primary:
            return c  # type: ignore[no-any-return]
    return None


def _cause_buys(cause: Mapping[str, Any], oom: Mapping[str, Any] | None) -> str:
    """What the cause's fix is worth, from its own arithmetic (never a replay: the program changes)."""
    saving = cause.get("saving_bytes")
    fits = cause.get("fits_after_fix")
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
    return f"{text} Allocator settings: {cause.get('settings')}."


# ------------------------------------------------------------------ choosing


class _Choice:
    """A suggestion and the what-if replay of its setting (None for a code change)."""

    def __init__(self, suggestion: Mapping[str, Any], whatif: Mapping[str, Any] | None) -> None:
        self.suggestion = suggestion
        self.whatif = whatif

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
    suggestions: list[Mapping[str, Any]], whatifs: list[Mapping[str, Any]], ranked_ids: Sequence[str] = ()
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
        kept.sort(key=lambda c: position.get(str(c.suggestion.get("id")), len(position)))
    return kept


def _ranked_without_oom(
    suggestions: list[Mapping[str, Any]], whatifs: list[Mapping[str, Any]], recorded_peak: int
) -> list[_Choice]:
    choices = [_Choice(s, _whatif_of(s, whatifs)) for s in suggestions]
    settings = [
        c
        for c in choices
        if c.is_setting and c.whatif is not None and int(c.whatif.get("peak_reserved_bytes") or 0) < recorded_peak
    ]
    settings.sort(key=lambda c: int(c.whatif.get("peak_reserved_bytes") or 0) if c.whatif else 0)
    others = [c for c in choices if not c.is_setting]
    return settings + others


NO_OOM_NOTHING_FREE = (
    "Nothing needs to change: the run did not run out of memory, and no allocator setting lowers its peak in "
    "the replay. For room to grow (a larger batch, longer sequences), the runner-up is the cheapest code "
    "change that frees memory, at a cost in speed, numerics or state."
)


def _cheapest(ranked: Sequence[_Choice], dev: Mapping[str, Any]) -> _Choice:
    """Of the code changes, the first in the ranked table's order (cheapest first), else the advisor's first."""
    position = {str(r.get("id")): k for k, r in enumerate(dev.get("ranked") or [])}
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


def _oom_headline(oom: Mapping[str, Any]) -> str:
    tried = format_size(int(oom.get("tried_to_allocate_bytes") or oom.get("requested_bytes") or 0))
    allocated = format_size(int(oom.get("allocated_bytes") or 0))
    limit = int(oom.get("limit_bytes") or 0)
    lower = _limit_is_lower_bound(oom)
    limit_text = f"{'at least ' if lower else ''}{format_size(limit)}"
    if oom.get("verdict") == "fragmentation":
        block, named = named_free_block(oom)
        return (
            f"Out of memory from fragmentation, not capacity: the {tried} request would have fit beside the "
            f"{allocated} allocated within the limit of {limit_text}, and the cache held "
            f"{format_size(int(oom.get('cached_free_bytes') or 0))} free, but {named} was {format_size(block)}."
        )
    if oom.get("verdict_certain") is False or lower:
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


def idle_at_reserved_peak(dev: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(event index, reserved, idle = reserved - allocated) at the reserved peak, from the timeline,
    which keeps the peak events exactly; None without a timeline."""
    timeline = dev.get("timeline") or None
    summary = dev.get("summary") or {}
    if not timeline:
        return None
    index = list(timeline.get("index") or [])
    at = int(summary.get("peak_reserved_event_index", -2))
    if at == -1 and "initial_reserved_bytes" in summary and at not in index:
        # The peak is the state before the first recorded event (stored reports without that point).
        reserved = int(summary["initial_reserved_bytes"])
        return at, reserved, reserved - int(summary.get("initial_allocated_bytes") or 0)
    if at not in index:
        return None
    k = index.index(at)
    reserved = int(timeline["reserved_bytes"][k])
    allocated = int(timeline["allocated_bytes"][k])
    return at, reserved, reserved - allocated


def _idle_headline(dev: Mapping[str, Any], capture: Mapping[str, Any]) -> str:
    text = _idle_sentence(dev)
    if capture.get("has_trace") and capture.get("trace_complete"):
        return text
    # A state-only dump or a wrapped trace cannot show an OOM that happened before what it holds.
    why = "the trace is incomplete" if capture.get("has_trace") else "the snapshot holds no allocation history"
    return text.replace("No out-of-memory error", f"No OOM recorded ({why}, so an earlier one would not show)", 1)


def _where(at: int) -> str:
    return "before the first recorded event" if at < 0 else f"event {at:,}"


def _idle_sentence(dev: Mapping[str, Any]) -> str:
    summary = dev.get("summary") or {}
    final_idle = int(summary.get("final_reserved_bytes") or 0) - int(summary.get("final_allocated_bytes") or 0)
    plateau = dev.get("plateau") or None
    if plateau:
        return _plateau_sentence(plateau, final_idle)
    at_peak = idle_at_reserved_peak(dev)
    if at_peak is None:
        reserved = int(summary.get("final_reserved_bytes") or 0)
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


def _buys(choice: _Choice, oom: Mapping[str, Any] | None, summary: Mapping[str, Any], events: int | None = None) -> str:
    s, w = choice.suggestion, choice.whatif
    recorded_peak = int(summary.get("peak_reserved_bytes") or 0)
    if choice.is_setting and w is not None:
        conf = str(w.get("config"))
        peak = int(w.get("peak_reserved_bytes") or 0)
        peak_text = f"peak reserved {format_size(recorded_peak)} → {format_size(peak)}"
        if oom:
            tried = format_size(int(oom.get("tried_to_allocate_bytes") or oom.get("requested_bytes") or 0))
            at = int(oom.get("event_index") or 0)
            if choice.avoids_oom:
                text = f"In the replay under {conf} the {tried} request at event {at:,} fits: the OOM is gone"
            else:
                text = f"In the replay under {conf} the {tried} request at event {at:,} still fails"
            completes = choice.step_completes
            if completes is True:
                text += ", and the step completes"
            elif completes is False:
                need = oom.get("step_need_bytes")
                more = f" (it needs {format_size(int(need))})" if need else ""
                text += f", but the rest of the step still runs out of memory{more}"
            elif choice.avoids_oom:
                text += (
                    f"; whether the rest of the step fits is not known ({readout.not_projected_reason(oom, events)})"
                )
            return f"{text}; {peak_text}."
        saved = recorded_peak - peak
        return f"In the replay under {conf}: {peak_text} ({format_size(saved)} less)."
    saving = int(s.get("estimated_saving_bytes") or 0)
    if saving > 0:
        return (
            f"An estimate, not a replay (the workload itself changes): about {format_size(saving)} less memory "
            "at that point."
        )
    return "Not measured: the workload itself changes, so no replay can say."


def _nothing_buys(oom: Mapping[str, Any] | None) -> str:
    if oom:
        return "No allocator setting avoided the OOM in the replay, and no rule found a change the figures support."
    return "Nothing to change: no setting lowered peak reserved memory in the replay."


def _limit_is_lower_bound(oom: Mapping[str, Any]) -> bool:
    return bool(oom.get("limit_is_lower_bound"))  # a stored report comes through analysis.stored.upgrade


def _confidence(
    dev: Mapping[str, Any],
    capture: Mapping[str, Any],
    choice: _Choice | None,
    *,
    cause: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    oom = dev.get("oom") or None
    replay = dev.get("replay") or {}
    exact = replay.get("exact")
    if replay.get("segment_events_recorded") == 0:
        exact = None  # "0 of 0 segment events": nothing to check the model against
    completes = choice.step_completes if choice is not None and choice.whatif is not None else None
    projection = (oom or {}).get("projection") or {}
    out: dict[str, Any] = {
        "replay_exact": None if exact is None else bool(exact),
        "trace_complete": bool(capture.get("trace_complete")),
        # Whether the replay followed the step past the recorded OOM (the trace ends there).
        "step_projected": completes is not None or bool(projection.get("available")),
        "limit_source": oom.get("limit_source") if oom else None,
        "limit_is_lower_bound": _limit_is_lower_bound(oom) if oom else None,
    }
    parts = []
    if cause is not None:
        parts.append(
            "the cause is read from the trace (its stack frames, phases and step ends"
            + (", and the OOM message" if cause.get("id") == "outside_memory" else "")
            + "); its saving is arithmetic, not a replay"
        )
    if exact is True:
        parts.append(
            f"the model replays the recorded run exactly ({replay.get('segment_events_reproduced', 0):,} of "
            f"{replay.get('segment_events_recorded', 0):,} segment events)"
        )
    elif exact is False:
        parts.append("the model does not replay the recorded run exactly, so its what-ifs are approximate")
    elif replay:
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
