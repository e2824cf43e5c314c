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


def _source_key(dev: Mapping[str, Any]) -> str | None:
    """``given|sidecar|oom_message|device-full|cap-lower-bound``, from ``devices[].limit`` (a stored
    report comes through ``analysis.stored.upgrade`` first)."""
    limit = dev.get("limit") or {}
    source = limit.get("source")
    if source is None:
        return None
    if source == "inferred":
        inference = limit.get("inference")
        if inference in ("device-full", "cap-lower-bound"):
            return str(inference)
        return "cap-lower-bound" if limit.get("is_lower_bound") else "device-full"
    return str(source)


def not_projected_reason(oom: Mapping[str, Any], events: int | None) -> str:
    """Why the rest of the failing step is not known: the projection's own reason, else where the trace
    ends ("the trace ends at the OOM" only where the OOM is its last event; a caught OOM goes on)."""
    reason = (oom.get("projection") or {}).get("reason")
    if reason:
        return str(reason)
    at = oom.get("event_index")
    if events and at is not None and int(at) < events - 1:
        return f"the rest of the step was not projected (the OOM is event {int(at):,} of {events:,})"
    return "the trace ends at the OOM"


def basis(dev: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a device's verdict rests on, or None where no limit was used (a run without an OOM and
    no limit given).

    ``{limit_bytes, limit_text ("at least 6.93 GiB"), source, source_short, sentence,
    is_lower_bound, range_text, verdict, verdict_level, level_text, verdict_certain,
    message_could_change_verdict, message_would_sharpen}``.
    """
    limit = dev.get("limit") or {}
    oom = dev.get("oom") or {}
    source = _source_key(dev)
    limit_bytes = limit.get("bytes")
    if source is None or limit_bytes is None:
        return None
    lower = bool(limit.get("is_lower_bound"))
    limit_text = f"{'at least ' if lower else ''}{size(limit_bytes)}"
    low, high = limit.get("low_bytes"), limit.get("high_bytes")
    range_text = ""
    if source == "oom_message" and low is not None and high is not None and low < high:
        range_text = f"torch prints two decimals, so the cap is anywhere from {size_range(low, high)}"
    sentence = f"Limit {limit_text}, {SOURCE_SENTENCE.get(source, source)}"
    sentence += f" ({range_text})." if range_text else "."
    verdict = oom.get("verdict") if oom else None
    level = oom.get("verdict_level") if oom else None
    projection = oom.get("projection") or {}
    if not oom:
        level_text = ""
    elif level == "step":
        step = projection.get("step")
        need = oom.get("step_need_bytes")
        level_text = (
            f"for the whole failing step{f' (step {step})' if step is not None else ''}: the rest of the step was "
            f"projected from the steps before it"
            + (f", and it needs {size(need)} with no fragmentation at all" if need else "")
        )
    else:
        reason = not_projected_reason(oom, dev.get("events"))
        level_text = f"for the failing request alone; the rest of its step was not projected: {reason}"
    certain = oom.get("verdict_certain") if oom else None
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
        "verdict_level": level,
        "level_text": level_text,
        "verdict_certain": certain,
        "message_could_change_verdict": could_change,
        # A lower bound that cannot flip the verdict still makes every what-if replay at too low a limit.
        "message_would_sharpen": bool(oom) and lower and not could_change,
    }


# --- what each change is known to do ------------------------------------------------------


def whatif_for(config: str | None, whatifs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The what-if a suggestion's ``PYTORCH_CUDA_ALLOC_CONF=...`` line replayed, or None."""
    if not config or not config.startswith(ENV_PREFIX):
        return None
    setting = config[len(ENV_PREFIX) :]
    return next((w for w in whatifs if w.get("config") == setting), None)


def _saving(row: Mapping[str, Any], w: Mapping[str, Any] | None, recorded_peak: int) -> tuple[str, str, str]:
    """(text, kind, exact title) of what a change saves at the peak: replayed or estimated."""
    if w is not None:
        delta = recorded_peak - int(w.get("peak_reserved_bytes") or 0)
        title = f"peak reserved {recorded_peak:,} B recorded, {int(w.get('peak_reserved_bytes') or 0):,} B replayed"
        if delta > 0:
            return f"{size(delta)} less (replayed)", "replayed", title
        if delta < 0:
            return f"none: the peak rises by {size(-delta)} (replayed)", "raises", title
        return "none: the same peak (replayed)", "same", title
    estimate = row.get("estimated_saving_bytes")
    if estimate:
        return f"about {size(estimate)} (estimate)", "estimate", f"{int(estimate):,} B, estimated"
    return "not measured", "unknown", ""


def _state(
    row: Mapping[str, Any], w: Mapping[str, Any] | None, oom: Mapping[str, Any] | None, events: int | None = None
) -> tuple[str, str, str]:
    """(state, short text, why) of what a change does to the failing step; only what was computed."""
    if not oom:
        return "no-oom", "no OOM to avoid", "the run had no out-of-memory error"
    projection = oom.get("projection") or {}
    step = projection.get("step")
    in_step = f"step {step}" if step is not None else "the failing step"
    if w is None:
        if row.get("id") == "smaller_batch" and row.get("step_completes") is True:
            return (
                "estimate",
                "should fit, by the batch estimate",
                "the batch that fits is estimated from the failing step's memory by category; no replay ran it",
            )
        return "not-known", "not known", "a change to the workload: nothing replays it, its saving is an estimate"
    completes = w.get("step_completes")
    if completes is True:
        return "finishes-step", f"finishes {in_step}", "the replay ran the failing step to its end, its rest projected"
    if completes is False:
        projected = w.get("oom_projected") or {}
        later = projected.get("allocations_later")
        if w.get("oom_avoided") and later is not None:
            return (
                "runs-out",
                f"runs out later in {in_step}",
                f"the failing request fits, but the replay runs out {later:,} allocation{'s' if later != 1 else ''} "
                "later in the projected rest of the step",
            )
        return "runs-out", f"runs out in {in_step}", "the replay fails in the same step"
    if (w.get("caught_ooms") or {}).get("certain") is False:
        return (
            "not-known",
            "not known",
            "it gets memory that an earlier, survived out-of-memory error was refused (the program's fallback "
            "would then not run): the step finishes if that memory is given back at once, not if it is kept",
        )
    if (w.get("oom_request_range") or {}).get("certain") is False:
        return (
            "not-known",
            "not known",
            "the failing request's size is known only to a roundup division, and the step finishes at one end of "
            "that range and not at the other",
        )
    if w.get("step_completes_range"):
        return (
            "not-known",
            "not known",
            "it finishes the step at one end of the OOM message's rounding of the cap and not at the other",
        )
    reason = not_projected_reason(oom, events)
    if w.get("oom_avoided") is False:
        return "runs-out", "runs out at the same request", f"the replay fails at the request that failed; {reason}"
    if w.get("oom_avoided") is True:
        return (
            "not-known",
            "gets past the failing request; the rest of the step is not known",
            f"the step was not projected: {reason}",
        )
    return "not-known", "not known", f"the step was not projected: {reason}"


def ranked_rows(dev: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``dev["ranked"]`` as the page shows it: each change with its saving (replayed or estimated)
    and its state (``finishes-step``, ``runs-out``, ``postpones`` (the step, not the run: ``ranked[].
    run_completes`` false), ``estimate``, ``not-known``, ``no-oom``)."""
    whatifs = dev.get("whatif") or []
    recorded_peak = int((dev.get("summary") or {}).get("peak_reserved_bytes") or 0)
    oom = dev.get("oom") or None
    rows = []
    for row in dev.get("ranked") or []:
        w = whatif_for(row.get("config"), whatifs)
        saving_text, saving_kind, saving_title = _saving(row, w, recorded_peak)
        state, state_text, why = _state(row, w, oom, dev.get("events"))
        if row.get("run_completes") is False and oom and state != "runs-out":
            # (A replay that already runs out in the failing step says more than the run's growth.)
            # The run's memory grows step after step (the report's cause): getting past the failing step
            # only postpones the OOM; the report says by how much in ``run_note``.
            state = "postpones"
            state_text = f"{state_text}, not the run" if state_text.startswith("finishes") else state_text
            why = str(row.get("run_note") or "the run's memory grows step after step: the OOM comes back later")
        rows.append(
            {
                "id": row.get("id"),
                "title": row.get("title"),
                "config": row.get("config"),
                "cost_words": row.get("cost_words"),
                "saving_text": saving_text,
                "saving_kind": saving_kind,
                "saving_title": saving_title,
                "state": state,
                "state_text": state_text,
                "why": why,
            }
        )
    return rows


def headroom(dev: Mapping[str, Any]) -> dict[str, Any] | None:
    """How far below the limit the decision's change leaves the run, for a setting that was replayed
    with an OOM: ``{bytes, text, thin, sentence}``; None otherwise."""
    oom = dev.get("oom") or None
    change = (dev.get("decision") or {}).get("change") or {}
    if not oom or change.get("kind") != "env":
        return None
    suggestion = next((s for s in dev.get("suggestions") or [] if s.get("id") == change.get("id")), None)
    w = whatif_for((suggestion or {}).get("config"), dev.get("whatif") or [])
    if w is None:
        return None
    limit_bytes = int(w.get("limit_bytes") or oom.get("limit_bytes") or 0)
    if not limit_bytes:
        return None
    peak = int(w.get("step_peak_reserved_bytes") or w.get("peak_reserved_bytes") or 0)
    room = limit_bytes - peak
    # The size torch's message names (the request rounded to its allocation), as the headline says it.
    last = (dev.get("ooms") or [{}])[-1]
    request = int(last.get("tried_to_allocate_bytes") or oom.get("requested_bytes") or 0)
    thin = room < max(request, THIN_HEADROOM_SHARE * limit_bytes)
    lower = bool(oom.get("limit_is_lower_bound"))
    limit_text = f"{'at least ' if lower else ''}{size(limit_bytes)}"
    over = "the projected step" if w.get("step_peak_reserved_bytes") else "the replay"
    if room < 0:
        sentence = (
            f"Under {w.get('config')} {over} peaks at {size(peak)}, {size(-room)} above the limit of {limit_text}."
        )
    else:
        sentence = (
            f"Under {w.get('config')} {over} peaks at {size(peak)}: {size(room)} below the limit of {limit_text}"
            + (
                f", less than the {size(request)} request that failed; a longer sequence, a larger batch or a later "
                "step can still run out."
                if thin and room < request
                else (", under 5% of it: little room for a step that asks for more." if thin else ".")
            )
        )
    return {"bytes": room, "text": size(room), "thin": thin, "sentence": sentence}


# A run without an OOM whose reserved peak came this close to its cap is one longer sequence, larger
# batch or fragmented step from running out (issue 20: an MoE run at 99.9% of its cap read "no OOM").
EDGE_OF_CAP_SHARE = 0.05


def edge_of_cap(dev: Mapping[str, Any]) -> dict[str, Any] | None:
    """A run that did not run out of memory but peaked within ``EDGE_OF_CAP_SHARE`` of a known cap (one
    given with the upload, or read from an OOM message or the client's sidecar):
    ``{limit_bytes, peak_reserved_bytes, headroom_bytes, share, source, sentence}``; None otherwise
    (an OOM run, no cap known, or room to spare). A peak above the cap (headroom below zero) is kept:
    the run did not run under the cap that was given."""
    if dev.get("oom"):
        return None
    limit = dev.get("limit") or {}
    source = _source_key(dev)
    limit_bytes = int(limit.get("bytes") or 0)
    peak = int((dev.get("summary") or {}).get("peak_reserved_bytes") or 0)
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


def ledger_view(dev: Mapping[str, Any]) -> dict[str, Any] | None:
    """``devices[].ledger`` as the page's one bar: each row with bytes worth drawing, its share of the device
    (of what the trace knows, without the device's size), its words; None for a report without a ledger.
    ``{moment_text, total_bytes, total_text, complete, sentence, note, segments: [{id, label, bytes, text,
    share_text, percent, source, source_text, parts: [{label, text}]}]}``."""
    ledger = dev.get("ledger") or None
    rows = [r for r in (ledger or {}).get("rows") or [] if int(r.get("bytes") or 0) > 0]
    if not ledger or not rows:
        return None
    total = ledger.get("total_bytes")
    whole = int(total) if total else sum(int(r["bytes"]) for r in rows)
    at = ledger.get("event_index")
    where = "" if at is None else (" (before the first recorded event)" if int(at) < 0 else f" (event {int(at):,})")
    moment = f"at the OOM{where}" if ledger.get("moment") == "oom" else f"at the reserved peak{where}"
    segments = [
        {
            "id": r["id"],
            "label": r["label"],
            "short": LEDGER_SHORT.get(str(r["id"]), str(r["label"])),
            "bytes": int(r["bytes"]),
            "text": size(int(r["bytes"])),
            "share_text": share(int(r["bytes"]) / whole),
            "percent": f"{100 * int(r['bytes']) / whole:.3f}",
            "source": r.get("source", ""),
            "source_text": LEDGER_SOURCE_WORDS.get(str(r.get("source")), str(r.get("source"))),
            "parts": [{"label": p["label"], "text": size(int(p["bytes"]))} for p in r.get("parts") or []],
        }
        for r in rows
    ]
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
        "note": ledger.get("note") or "",
        "segments": segments,
    }


def device_readout(dev: Mapping[str, Any]) -> dict[str, Any]:
    """Everything above for one device: ``{basis, ranked, headroom, ledger, runner_up_note}``."""
    rows = ranked_rows(dev)
    return {
        "basis": basis(dev),
        "ranked": rows,
        "headroom": headroom(dev),
        "ledger": ledger_view(dev),
        "runner_up_note": runner_up_note(dev, rows),
    }


def runner_up_note(dev: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The qualifier the first screen's runner-up needs: where its replay also runs out in the failing step
    (or only postpones the OOM), or only gets past the failing request with the rest of the step unknown
    (issue 35: eval_bert's runner-up, whose real rerun died in the same step, stood unqualified), what the
    ranked table says of it; None where nothing qualifies it (an estimate, a step that finishes)."""
    runner = (dev.get("decision") or {}).get("runner_up") or {}
    row = next((r for r in rows if runner.get("id") is not None and r.get("id") == runner.get("id")), None)
    if row is not None and row.get("state") == "not-known":
        return f"it only {row.get('state_text')}, since {row.get('why')}"
    if row is None or row.get("state") not in ("runs-out", "postpones"):
        return None
    return f"{row.get('state_text')}: {row.get('why')}"


def main_device(devices: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The device a one-line summary speaks of: the OOM device, else the largest peak."""
    if not devices:
        return None

    def weight(d: Mapping[str, Any]) -> tuple[int, int]:
        return (1 if d.get("oom") else 0, int((d.get("summary") or {}).get("peak_reserved_bytes") or 0))

    return max(devices, key=weight)


def run_facts(dev: Mapping[str, Any]) -> dict[str, Any]:
    """The few keys a run's row carries (history, compare, the API's summary): the limit, its
    source, the verdict and its level, and the decision's change."""
    b = basis(dev)
    decision = dev.get("decision") or {}
    change = decision.get("change") or {}
    oom = dev.get("oom") or {}
    return {
        "limit_bytes": b["limit_bytes"] if b else None,
        "limit_text": b["limit_text"] if b else None,
        "limit_source": b["source"] if b else None,
        "limit_source_short": b["source_short"] if b else None,
        "limit_is_lower_bound": b["is_lower_bound"] if b else None,
        "verdict_level": b["verdict_level"] if b else None,
        "verdict_certain": b["verdict_certain"] if b else None,
        "message_could_change_verdict": b["message_could_change_verdict"] if b else False,
        # The run's verdict is the one a row says (analysis.decision.run_verdict); the request's keeps its name.
        "verdict": oom.get("run_verdict", oom.get("verdict")) if oom else None,
        "request_verdict": oom.get("request_verdict", oom.get("verdict")) if oom else None,
        # What the run's verdict rests on (cause | step | request): history says "the program's cause" for
        # the first (issue 35: "capacity, the request alone" where the request alone was fragmentation).
        "verdict_basis": oom.get("run_verdict_basis") if oom else None,
        "headline": decision.get("headline"),
        "change_id": change.get("id"),
        "change_title": change.get("title"),
        "change_line": change.get("line"),
        # A run without an OOM that peaked within 5% of its cap (edge_of_cap): the sentence, else None.
        "edge_of_cap": (dev.get("edge_of_cap") or {}).get("sentence"),
        # The whole device at the OOM (else the reserved peak), rows without their parts; None before issue 32.
        "ledger": _ledger_summary(dev.get("ledger")),
    }


def _ledger_summary(ledger: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not ledger:
        return None
    return {
        "moment": ledger.get("moment"),
        "event_index": ledger.get("event_index"),
        "total_bytes": ledger.get("total_bytes"),
        "rows": [{k: r.get(k) for k in ("id", "label", "bytes", "source")} for r in ledger.get("rows") or []],
    }
