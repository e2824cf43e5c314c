"""The report read for people: what the answer rests on, what each change is known to do.

Pure functions of a finished report's own keys (no replay, no new figure): the site's pages, the
API's summary and the CLI's summary all word a report through this module, so they say the same
thing in the same units. Three questions a reader of the first screen asks, and where the answer
comes from:

- **What does the verdict rest on?** (``basis``) The limit and its source: given with the upload,
  read exactly by the client's observer, read from torch's OOM message (two decimals: a range), or
  inferred from the trace (the device was full, or a lower bound of a per-process cap the snapshot
  does not record). From a lower bound a ``capacity`` verdict may be wrong, and the OOM message
  would settle it: ``message_could_change_verdict``.
- **What does each change do?** (``ranked_rows``) Only what was computed: "finishes the step" where
  the failing step's rest was projected and replayed (``whatif.step_completes`` true), "runs out"
  where the replay failed, "not known" with the reason otherwise. A code change is never replayed:
  its figure is an estimate and says so. The ranked list's own ``step_completes`` is not read for
  settings: it falls back to ``avoids_oom``, a request-level answer (issue 20).
- **How close to the limit does the change leave the run?** (``headroom``) The limit minus the
  replay's peak (over the projected step where there is one); thin when less than the request that
  failed or 5% of the limit.

Sizes are worded by ``size`` (torch's ``format_size``: "710.00 MiB", exact bytes below 1 KiB,
never "0.00 GiB"), changes by ``size_change``, shares by ``share``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from analysis.contract import Device, Ledger, Oom, Ranked, Report, WhatIf, device_of, main_device, oom_of

ENV_PREFIX = "PYTORCH_CUDA_ALLOC_CONF="
# A change leaves thin headroom below this share of the limit (or below the request that failed).
THIN_HEADROOM_SHARE = 0.05

# Short names of a limit's source, for tables (history, compare) and the CLI.
SOURCE_SHORT = {
    "given": "cap given",
    "sidecar": "client observer",
    "oom_message": "OOM message",
    "device-full": "inferred: device full",
    "cap-lower-bound": "inferred lower bound",
}
# Sentences saying where the limit came from, after "Limit X, ...".
SOURCE_SENTENCE = {
    "given": "given with the upload",
    "sidecar": "read exactly by the client's OOM observer (its sidecar)",
    "oom_message": "read from torch's OOM message",
    "device-full": "inferred from the trace: the device itself was full (reserved plus the device's free memory)",
    "cap-lower-bound": (
        "inferred from the trace: the most it shows the per-process cap let through; the snapshot does not record "
        "the cap, so the real one may be higher"
    ),
}


# --- sizes and shares ---------------------------------------------------------------------


def size(n: float | None) -> str:
    """A size as torch's ``format_size`` words it: bytes up to 1 KiB, then KiB, MiB up to 1 GiB
    inclusive, GiB above, two decimals ("743040000" -> "708.62 MiB"); "n/a" for None."""
    if n is None:
        return "n/a"
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    if value <= 1024:
        return f"{sign}{int(value)} bytes"
    if value <= 1 << 20:
        return f"{sign}{value / 1024:.2f} KiB"
    if value <= 1 << 30:
        return f"{sign}{value / (1 << 20):.2f} MiB"
    return f"{sign}{value / (1 << 30):.2f} GiB"


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE_TEXT = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str) -> int:
    """A size as people write it, in bytes: "7516192768", "7GiB", "7.5 GiB", "80GB" (KiB/MiB/GiB/TiB are
    powers of 1024, KB/MB/GB/TB of 1000, case aside). ``ValueError`` for anything else or a size of 0."""
    found = _SIZE_TEXT.fullmatch(text or "")
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is no size: give bytes (7516192768) or a number and a unit (7GiB, 80GB)")
    number = found.group(1)
    whole, _, frac = number.partition(".")
    scale = _SIZE_UNITS[unit]
    # Integers throughout: "7.5GiB" is exact, and no float rounds a byte count.
    value: int = (int(whole) * 10 ** len(frac) + int(frac or 0)) * scale // 10 ** len(frac)
    if value <= 0:
        raise ValueError(f"{text!r} is no size above zero")
    return value


def size_change(delta: float | None) -> str:
    """A change with its sign: "+16.00 MiB", "-210.00 MiB", "no change"."""
    if delta is None:
        return "n/a"
    if delta == 0:
        return "no change"
    return ("+" if delta > 0 else "-") + size(abs(delta))


def size_range(low: float, high: float) -> str:
    """Two ends of a range with three decimals or as many as it takes to tell them apart ("5.995 GiB to 6.005 GiB"),
    both in the unit of the larger end."""
    unit, scale = next(
        ((u, s) for u, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)) if high > s), ("bytes", 1)
    )
    if scale == 1:
        return f"{int(low):,} to {int(high):,} bytes"
    for decimals in range(3, 7):  # two decimals are what torch printed: one more tells the ends apart
        a, b = f"{low / scale:.{decimals}f}", f"{high / scale:.{decimals}f}"
        if a != b:
            break
    return f"{a} {unit} to {b} {unit}"


def share(fraction: float | None) -> str:
    """A fraction in [0, 1] as a percentage that never rounds to a contradiction: "97%", and one
    decimal near the ends ("99.6%", "0.4%") so a share short of all never reads "100%"."""
    if fraction is None:
        return "n/a"
    pct = float(fraction) * 100
    if 0 < pct < 1 or 99 < pct < 100:
        return f"{pct:.1f}%"
    return f"{pct:.0f}%"


# --- what the answer rests on -------------------------------------------------------------


def _source_key(dev: Device) -> str | None:
    """``given|sidecar|oom_message|device-full|cap-lower-bound``, from ``devices[].limit`` (a stored
    report comes through ``analysis.stored.load`` first)."""
    limit = dev.limit
    source = limit.source if limit else None
    if limit is None or source is None:
        return None
    if source == "inferred":
        if limit.inference in ("device-full", "cap-lower-bound"):
            return str(limit.inference)
        return "cap-lower-bound" if limit.is_lower_bound else "device-full"
    return str(source)


def not_projected_reason(oom: Oom | Mapping[str, Any], events: int | None) -> str:
    """Why the rest of the failing step is not known: the projection's own reason, else where the trace
    ends ("the trace ends at the OOM" only where the OOM is its last event; a caught OOM goes on)."""
    oom = oom_of(oom)
    reason = oom.projection.reason if oom.projection else None
    if reason:
        return str(reason)
    at = oom.event_index
    if events and at is not None and int(at) < events - 1:
        return f"the rest of the step was not projected (the OOM is event {int(at):,} of {events:,})"
    return "the trace ends at the OOM"


def _level_text(oom: Oom | None, events: int | None) -> str:
    """The verdict's level in words: for the whole (projected) failing step, or the failing request alone."""
    if oom is None:
        return ""
    if oom.verdict_level == "step":
        step = oom.projection.step if oom.projection else None
        need = oom.step_need_bytes
        return (
            f"for the whole failing step{f' (step {step})' if step is not None else ''}: the rest of the step was "
            f"projected from the steps before it"
            + (f", and it needs {size(need)} with no fragmentation at all" if need else "")
        )
    reason = not_projected_reason(oom, events)
    return f"for the failing request alone; the rest of its step was not projected: {reason}"


def basis(dev: Device | Mapping[str, Any]) -> dict[str, Any] | None:
    """What a device's verdict rests on, or None where no limit was used (a run without an OOM and
    no limit given).

    ``{limit_bytes, limit_text ("at least 6.93 GiB"), source, source_short, sentence,
    is_lower_bound, range_text, verdict, verdict_level, level_text, verdict_certain,
    message_could_change_verdict, message_would_sharpen}``.
    """
    dev = device_of(dev)
    limit, oom = dev.limit, dev.oom
    source = _source_key(dev)
    limit_bytes = limit.bytes if limit else None
    if limit is None or source is None or limit_bytes is None:
        return None
    lower = bool(limit.is_lower_bound)
    limit_text = f"{'at least ' if lower else ''}{size(limit_bytes)}"
    low, high = limit.low_bytes, limit.high_bytes
    range_text = ""
    if source == "oom_message" and low is not None and high is not None and low < high:
        range_text = f"torch prints two decimals, so the cap is anywhere from {size_range(low, high)}"
    sentence = f"Limit {limit_text}, {SOURCE_SENTENCE.get(source, source)}"
    sentence += f" ({range_text})." if range_text else "."
    verdict = oom.verdict if oom else None
    certain = oom.verdict_certain if oom else None
    # From a lower bound only "capacity" can be wrong (a higher real cap can only make room); the
    # message names the real cap. An exact or device-full limit leaves nothing for it to change.
    could_change = bool(oom) and lower and (certain is False or verdict == "capacity")
    return {
        "limit_bytes": int(limit_bytes),
        "limit_text": limit_text,
        "source": source,
        "source_short": SOURCE_SHORT.get(source, source),
        "sentence": sentence,
        "is_lower_bound": lower,
        "range_text": range_text,
        "verdict": verdict,
        "verdict_level": oom.verdict_level if oom else None,
        "level_text": _level_text(oom, dev.events),
        "verdict_certain": certain,
        "message_could_change_verdict": could_change,
        # A lower bound that cannot flip the verdict still makes every what-if replay at too low a limit.
        "message_would_sharpen": bool(oom) and lower and not could_change,
    }


# --- what each change is known to do ------------------------------------------------------


def whatif_for(config: str | None, whatifs: Sequence[WhatIf]) -> WhatIf | None:
    """The what-if a suggestion's ``PYTORCH_CUDA_ALLOC_CONF=...`` line replayed, or None."""
    if not config or not config.startswith(ENV_PREFIX):
        return None
    setting = config[len(ENV_PREFIX) :]
    return next((w for w in whatifs if w.config == setting), None)


def _saving(row: Ranked, w: WhatIf | None, recorded_peak: int) -> tuple[str, str, str]:
    """(text, kind, exact title) of what a change saves at the peak: replayed or estimated."""
    if w is not None:
        replayed = int(w.peak_reserved_bytes or 0)
        delta = recorded_peak - replayed
        title = f"peak reserved {recorded_peak:,} B recorded, {replayed:,} B replayed"
        if delta > 0:
            return f"{size(delta)} less (replayed)", "replayed", title
        if delta < 0:
            return f"none: the peak rises by {size(-delta)} (replayed)", "raises", title
        return "none: the same peak (replayed)", "same", title
    estimate = row.estimated_saving_bytes
    if estimate:
        return f"about {size(estimate)} (estimate)", "estimate", f"{int(estimate):,} B, estimated"
    return "not measured", "unknown", ""


def _state(row: Ranked, w: WhatIf | None, oom: Oom | None, events: int | None = None) -> tuple[str, str, str]:
    """(state, short text, why) of what a change does to the failing step; only what was computed."""
    if oom is None:
        return "no-oom", "no OOM to avoid", "the run had no out-of-memory error"
    step = oom.projection.step if oom.projection else None
    in_step = f"step {step}" if step is not None else "the failing step"
    if w is None:
        if row.id == "smaller_batch" and row.step_completes is True:
            return (
                "estimate",
                "should fit, by the batch estimate",
                "the batch that fits is estimated from the failing step's memory by category; no replay ran it",
            )
        return "not-known", "not known", "a change to the workload: nothing replays it, its saving is an estimate"
    if w.step_completes is True:
        return "finishes-step", f"finishes {in_step}", "the replay ran the failing step to its end, its rest projected"
    if w.step_completes is False:
        later = w.oom_projected.allocations_later if w.oom_projected else None
        if w.oom_avoided and later is not None:
            return (
                "runs-out",
                f"runs out later in {in_step}",
                f"the failing request fits, but the replay runs out {later:,} allocation{'s' if later != 1 else ''} "
                "later in the projected rest of the step",
            )
        return "runs-out", f"runs out in {in_step}", "the replay fails in the same step"
    return _state_not_completed(w, oom, events)


def _state_not_completed(w: WhatIf, oom: Oom, events: int | None) -> tuple[str, str, str]:
    """``_state`` of a replayed setting whose step-level answer is not known (``step_completes`` null)."""
    if w.caught_ooms is not None and w.caught_ooms.certain is False:
        return (
            "not-known",
            "not known",
            "it gets memory that an earlier, survived out-of-memory error was refused (the program's fallback "
            "would then not run): the step finishes if that memory is given back at once, not if it is kept",
        )
    if w.oom_request_range is not None and w.oom_request_range.certain is False:
        return (
            "not-known",
            "not known",
            "the failing request's size is known only to a roundup division, and the step finishes at one end of "
            "that range and not at the other",
        )
    if w.step_completes_range:
        return (
            "not-known",
            "not known",
            "it finishes the step at one end of the OOM message's rounding of the cap and not at the other",
        )
    reason = not_projected_reason(oom, events)
    if w.oom_avoided is False:
        return "runs-out", "runs out at the same request", f"the replay fails at the request that failed; {reason}"
    if w.oom_avoided is True:
        return (
            "not-known",
            "gets past the failing request; the rest of the step is not known",
            f"the step was not projected: {reason}",
        )
    return "not-known", "not known", f"the step was not projected: {reason}"


def ranked_rows(dev: Device | Mapping[str, Any]) -> list[dict[str, Any]]:
    """``dev["ranked"]`` as the page shows it: each change with its saving (replayed or estimated)
    and its state (``finishes-step``, ``runs-out``, ``postpones`` (the step, not the run: ``ranked[].
    run_completes`` false), ``estimate``, ``not-known``, ``no-oom``)."""
    dev = device_of(dev)
    recorded_peak = int(dev.summary.peak_reserved_bytes or 0)
    oom = dev.oom
    rows = []
    for row in dev.ranked:
        w = whatif_for(row.config, dev.whatif)
        saving_text, saving_kind, saving_title = _saving(row, w, recorded_peak)
        state, state_text, why = _state(row, w, oom, dev.events)
        if row.run_completes is False and oom and state != "runs-out":
            # (A replay that already runs out in the failing step says more than the run's growth.)
            # The run's memory grows step after step (the report's cause): getting past the failing step
            # only postpones the OOM; the report says by how much in ``run_note``.
            state = "postpones"
            state_text = f"{state_text}, not the run" if state_text.startswith("finishes") else state_text
            why = str(row.run_note or "the run's memory grows step after step: the OOM comes back later")
        rows.append(
            {
                "id": row.id,
                "title": row.title,
                "config": row.config,
                "cost_words": row.cost_words,
                "saving_text": saving_text,
                "saving_kind": saving_kind,
                "saving_title": saving_title,
                "state": state,
                "state_text": state_text,
                "why": why,
            }
        )
    return rows


def _headroom_sentence(w: WhatIf, peak: int, room: int, request: int, thin: bool, limit_text: str) -> str:
    over = "the projected step" if w.step_peak_reserved_bytes else "the replay"
    if room < 0:
        return f"Under {w.config} {over} peaks at {size(peak)}, {size(-room)} above the limit of {limit_text}."
    return f"Under {w.config} {over} peaks at {size(peak)}: {size(room)} below the limit of {limit_text}" + (
        f", less than the {size(request)} request that failed; a longer sequence, a larger batch or a later "
        "step can still run out."
        if thin and room < request
        else (", under 5% of it: little room for a step that asks for more." if thin else ".")
    )


def headroom(dev: Device | Mapping[str, Any]) -> dict[str, Any] | None:
    """How far below the limit the decision's change leaves the run, for a setting that was replayed
    with an OOM: ``{bytes, text, thin, sentence}``; None otherwise."""
    dev = device_of(dev)
    oom = dev.oom
    change = dev.decision.change if dev.decision else None
    if oom is None or change is None or change.kind != "env":
        return None
    suggestion = next((s for s in dev.suggestions if s.id == change.id), None)
    w = whatif_for(suggestion.config if suggestion else None, dev.whatif)
    if w is None:
        return None
    limit_bytes = int(w.limit_bytes or oom.limit_bytes or 0)
    if not limit_bytes:
        return None
    peak = int(w.step_peak_reserved_bytes or w.peak_reserved_bytes or 0)
    room = limit_bytes - peak
    # The size torch's message names (the request rounded to its allocation), as the headline says it.
    last = dev.ooms[-1].tried_to_allocate_bytes if dev.ooms else None
    request = int(last or oom.requested_bytes or 0)
    thin = room < max(request, THIN_HEADROOM_SHARE * limit_bytes)
    limit_text = f"{'at least ' if oom.limit_is_lower_bound else ''}{size(limit_bytes)}"
    sentence = _headroom_sentence(w, peak, room, request, thin, limit_text)
    return {"bytes": room, "text": size(room), "thin": thin, "sentence": sentence}


# A run without an OOM whose reserved peak came this close to its cap is one longer sequence, larger
# batch or fragmented step from running out (issue 20: an MoE run at 99.9% of its cap read "no OOM").
EDGE_OF_CAP_SHARE = 0.05


def edge_of_cap(dev: Device | Mapping[str, Any]) -> dict[str, Any] | None:
    """A run that did not run out of memory but peaked within ``EDGE_OF_CAP_SHARE`` of a known cap (one
    given with the upload, or read from an OOM message or the client's sidecar):
    ``{limit_bytes, peak_reserved_bytes, headroom_bytes, share, source, sentence}``; None otherwise
    (an OOM run, no cap known, or room to spare). A peak above the cap (headroom below zero) is kept:
    the run did not run under the cap that was given. Of a device still a dict (the report as it is
    built) only the sections read here are typed: the whole entry's were 0.03 s of the 460 MB report."""
    if not isinstance(dev, Device):
        dev = device_of({key: dev[key] for key in ("oom", "limit", "summary") if key in dev})
    if dev.oom:
        return None
    source = _source_key(dev)
    limit_bytes = int((dev.limit.bytes if dev.limit else None) or 0)
    peak = int(dev.summary.peak_reserved_bytes or 0)
    if source not in ("given", "sidecar", "oom_message") or limit_bytes <= 0 or not peak:
        return None
    room = limit_bytes - peak
    if room > EDGE_OF_CAP_SHARE * limit_bytes:
        return None
    share_of_cap = peak / limit_bytes
    cap_text = f"the cap of {size(limit_bytes)} ({SOURCE_SHORT.get(source, source)})"
    if room < 0:
        sentence = (
            f"No OOM, yet reserved memory peaked at {size(peak)}, {size(-room)} above {cap_text}: "
            "this run did not run under that cap."
        )
    else:
        sentence = (
            f"At the edge of the cap: no OOM, but reserved memory peaked at {size(peak)}, {share(share_of_cap)} of "
            f"{cap_text}, {size(room)} to spare. A longer sequence, a larger batch or more fragmentation "
            "can run out."
        )
    return {
        "limit_bytes": limit_bytes,
        "peak_reserved_bytes": peak,
        "headroom_bytes": room,
        "share": share_of_cap,
        "source": source,
        "sentence": sentence,
    }


# How each ledger row's source is said (``analysis.ledger``).
LEDGER_SOURCE_WORDS = {
    "trace": "from the trace",
    "message": "from the OOM message",
    "summary": "from memory_summary()",
    "inferred": "inferred",
}
# The bar's key is short (the first screen is small); the bar's label and each segment's title say it in full.
LEDGER_SHORT = {
    "allocated": "PyTorch: live tensors",
    "cached_free": "PyTorch: cached, unallocated",
    "private_pools": "private pools",
    "non_pytorch": "this process, outside PyTorch",
    "other_processes": "other processes",
    "free": "free",
}


def ledger_view(dev: Device | Mapping[str, Any]) -> dict[str, Any] | None:
    """``devices[].ledger`` as the page's one bar: each row with bytes worth drawing, its share of the device
    (of what the trace knows, without the device's size), its words; None for a report without a ledger.
    ``{moment_text, total_bytes, total_text, complete, sentence, note, segments: [{id, label, bytes, text,
    share_text, percent, source, source_text, parts: [{label, text}]}]}``."""
    ledger = device_of(dev).ledger
    rows = [r for r in (ledger.rows if ledger else ()) if int(r.bytes or 0) > 0]
    if ledger is None or not rows:
        return None
    total = ledger.total_bytes
    whole = int(total) if total else sum(int(r.bytes or 0) for r in rows)
    segments = [
        {
            "id": r.id,
            "label": r.label,
            "short": LEDGER_SHORT.get(str(r.id), str(r.label)),
            "bytes": int(r.bytes or 0),
            "text": size(int(r.bytes or 0)),
            "share_text": share(int(r.bytes or 0) / whole),
            "percent": f"{100 * int(r.bytes or 0) / whole:.3f}",
            "source": "" if r.source is None else r.source,
            "source_text": LEDGER_SOURCE_WORDS.get(str(r.source), str(r.source)),
            "parts": [{"label": p.label, "text": size(int(p.bytes or 0))} for p in r.parts],
        }
        for r in rows
    ]
    moment = _ledger_moment(ledger)
    listed = "; ".join(f"{g['label']} {g['text']} ({g['share_text']})" for g in segments)
    if total:
        sentence = f"Where the GPU's {size(whole)} went {moment}: {listed}."
    else:
        sentence = (
            f"What the trace shows of the GPU {moment} ({size(whole)}; the device's size is not known): {listed}."
        )
    return {
        "moment_text": moment,
        "total_bytes": total,
        "total_text": size(whole),
        "complete": bool(total),
        "sentence": sentence,
        "note": ledger.note or "",
        "segments": segments,
    }


def _ledger_moment(ledger: Ledger) -> str:
    """When the ledger was taken, in words: "at the OOM (event 1,234)", "at the reserved peak"."""
    at = ledger.event_index
    where = "" if at is None else (" (before the first recorded event)" if int(at) < 0 else f" (event {int(at):,})")
    return f"at the OOM{where}" if ledger.moment == "oom" else f"at the reserved peak{where}"


def device_readout(dev: Device | Mapping[str, Any]) -> dict[str, Any]:
    """Everything above for one device: ``{basis, ranked, headroom, ledger, runner_up_note}``."""
    dev = device_of(dev)
    rows = ranked_rows(dev)
    return {
        "basis": basis(dev),
        "ranked": rows,
        "headroom": headroom(dev),
        "ledger": ledger_view(dev),
        "runner_up_note": runner_up_note(dev, rows),
    }


def runner_up_note(dev: Device | Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The qualifier the first screen's runner-up needs: where its replay also runs out in the failing step
    (or only postpones the OOM), or only gets past the failing request with the rest of the step unknown
    (issue 35: eval_bert's runner-up, whose real rerun died in the same step, stood unqualified), what the
    ranked table says of it; None where nothing qualifies it (an estimate, a step that finishes)."""
    decision = device_of(dev).decision
    runner = decision.runner_up if decision else None
    if runner is None or runner.id is None:
        return None
    row = next((r for r in rows if r["id"] == runner.id), None)
    if row is not None and row["state"] == "not-known":
        return f"it only {row['state_text']}, since {row['why']}"
    if row is None or row["state"] not in ("runs-out", "postpones"):
        return None
    return f"{row['state_text']}: {row['why']}"


def run_facts(dev: Device | Mapping[str, Any]) -> dict[str, Any]:
    """The few keys a run's row carries (history, compare, the API's summary): the limit, its
    source, the verdict and its level, and the decision's change."""
    dev = device_of(dev)
    b = basis(dev)
    decision, oom = dev.decision, dev.oom
    change = decision.change if decision else None
    return {
        "limit_bytes": b["limit_bytes"] if b else None,
        "limit_text": b["limit_text"] if b else None,
        "limit_source": b["source"] if b else None,
        "limit_source_short": b["source_short"] if b else None,
        "limit_is_lower_bound": b["is_lower_bound"] if b else None,
        "verdict_level": b["verdict_level"] if b else None,
        "verdict_certain": b["verdict_certain"] if b else None,
        "message_could_change_verdict": b["message_could_change_verdict"] if b else False,
        # The run's verdict is the one a row says (analysis.decision.run_verdict); the request's keeps its name
        # (contract.Oom reads an older report's ``verdict`` for both).
        "verdict": oom.run_verdict if oom else None,
        "request_verdict": oom.request_verdict if oom else None,
        # What the run's verdict rests on (cause | step | request): history says "the program's cause" for
        # the first (issue 35: "capacity, the request alone" where the request alone was fragmentation).
        "verdict_basis": oom.run_verdict_basis if oom else None,
        "headline": decision.headline if decision else None,
        "change_id": change.id if change else None,
        "change_title": change.title if change else None,
        "change_line": change.line if change else None,
        # A run without an OOM that peaked within 5% of its cap (edge_of_cap): the sentence, else None.
        "edge_of_cap": dev.edge_of_cap.sentence if dev.edge_of_cap else None,
        # The whole device at the OOM (else the reserved peak), rows without their parts; None before issue 32.
        "ledger": _ledger_summary(dev.ledger),
    }


def _ledger_summary(ledger: Ledger | None) -> dict[str, Any] | None:
    if ledger is None:
        return None
    return {
        "moment": ledger.moment,
        "event_index": ledger.event_index,
        "total_bytes": ledger.total_bytes,
        "rows": [{"id": r.id, "label": r.label, "bytes": r.bytes, "source": r.source} for r in ledger.rows],
    }


# The summary figures a row keeps (``Upload.summary``: lists, history, the API's summary), of the main device.
ROW_SUMMARY_KEYS = (
    "peak_reserved_bytes",
    "peak_allocated_bytes",
    "peak_requested_bytes",
    "final_reserved_bytes",
    "final_allocated_bytes",
    "peak_is_lower_bound",
)


def row_summary(report: Report) -> dict[str, Any]:
    """The few figures kept on an upload's row for lists, history and the API: the main device's (the OOM one,
    else the largest peak) summary, its verdict and suggestions, and ``run_facts`` (what the first screen says)."""
    summary: dict[str, Any] = {"devices": len(report.devices)}
    main = main_device(report)
    if main is None:
        return summary
    for key in ROW_SUMMARY_KEYS:
        value = getattr(main.summary, key)
        if value is not None:  # (every report has them all; an older row without one keeps none)
            summary[key] = value
    summary["device"] = main.device
    summary["events"] = main.events
    summary["oom"] = main.oom is not None
    summary["verdict"] = main.oom.verdict if main.oom else None
    summary["suggestions"] = len(main.suggestions)
    # What the report's decision says (the page's first screen), so the API, history and compare say
    # the same: the limit and its source, the verdict's level, the change.
    facts = run_facts(main)
    summary.update(facts)
    summary["top_suggestion"] = facts["change_title"]
    return summary
