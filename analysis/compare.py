"""What changed between two reports, in one sentence and in detail: summary deltas, a stack diff by user-code
site, the settings that differ, and timelines aligned by step. A pure function of two report dicts (no replay).

- Deltas are B - A of the main device of each report (the device that ran out of memory, else the
  largest), with the share of A.
- The stack diff groups each report's listed stacks (``top_stacks`` at the allocated peak, and
  ``churn``) by their site, the first frame of user code (``file.py:line name``; rows without one keep
  their label, e.g. the frame-less backward pass). A site listed in one run only is ``new``/``gone``:
  not among the other run's listed rows (its largest ten), so its bytes there are at most that run's
  "other stacks" row.
- Timelines are aligned by step: an event inside step k at fraction f of its events plots at k + f,
  so two runs whose steps took different numbers of events line up step for step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analysis import contract
from analysis.contract import Capture, Device, Frame, Report, StackRow, device_of, report_of
from analysis.readout import size

SUMMARY_KEYS = (
    ("peak reserved", "peak_reserved_bytes"),
    ("peak allocated", "peak_allocated_bytes"),
    ("peak requested", "peak_requested_bytes"),
    ("reserved at the end", "final_reserved_bytes"),
    ("allocated at the end", "final_allocated_bytes"),
)
OTHER = "other stacks"


def main_device(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The main device's own JSON object, for ``analysis.runs``, which still reads run reports as dicts."""
    device = contract.main_device(report_of(report))
    return device.data if device is not None else None


def _delta(a: float | None, b: float | None) -> dict[str, Any]:
    out: dict[str, Any] = {"a": a, "b": b, "delta": None, "share": None}
    if a is not None and b is not None:
        out["delta"] = b - a
        out["share"] = round((b - a) / a, 4) if a else None
    return out


def site_key(row: StackRow | Mapping[str, Any]) -> str:
    row = row if isinstance(row, StackRow) else StackRow.from_json(row)
    site = row.site
    if isinstance(site, Frame) and site.filename:
        short = "/".join(str(site.filename).replace("\\", "/").rsplit("/", 2)[-2:])
        return f"{short}:{site.line} {site.name}"
    if isinstance(site, str) and site:
        return site  # the report's own wording: "workspace/capture.py:94 forward"
    label = str(row.label or "")
    return OTHER if label.startswith(OTHER) else label or "unknown"


def _by_site(rows: Sequence[StackRow]) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in rows:
        key = site_key(row)
        out[key] = out.get(key, 0) + int(row.bytes or 0)
    return out


def stack_diff(rows_a: Sequence[StackRow], rows_b: Sequence[StackRow]) -> list[dict[str, Any]]:
    """Rows ``{site, a_bytes, b_bytes, delta, change}``, the largest change first; "other stacks" last."""
    a, b = _by_site(rows_a), _by_site(rows_b)
    out: list[dict[str, Any]] = []
    for key in set(a) | set(b):
        va, vb = a.get(key), b.get(key)
        if va is None:
            change = "new"
        elif vb is None:
            change = "gone"
        elif vb > va:
            change = "grew"
        elif vb < va:
            change = "shrank"
        else:
            change = "same"
        out.append({"site": key, "a_bytes": va, "b_bytes": vb, "delta": (vb or 0) - (va or 0), "change": change})
    out.sort(key=lambda r: (r["site"] == OTHER, -abs(int(r["delta"])), str(r["site"])))
    return out


def _flat(settings: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(settings, Mapping):
        out: dict[str, str] = {}
        for k, v in settings.items():
            out.update(_flat(v, f"{prefix}{k}." if isinstance(v, Mapping) else f"{prefix}{k}"))
        return out
    return {prefix.rstrip("."): str(settings)}


def _capture_flat(capture: Capture) -> dict[str, str]:
    """A capture's options and allocator settings as ``{name: value}``, nested settings dotted."""
    flat = {
        "capture stacks": str(capture.stacks),
        "capture has_trace": str(capture.has_trace),
        "capture trace_complete": str(capture.trace_complete),
    }
    return flat | _flat(capture.allocator_settings)


def settings_diff(capture_a: Capture, capture_b: Capture) -> list[dict[str, str]]:
    """Allocator settings and capture options whose values differ, ``{name, a, b}``."""
    flat_a, flat_b = _capture_flat(capture_a), _capture_flat(capture_b)
    return [
        {"name": k, "a": flat_a.get(k, "(absent)"), "b": flat_b.get(k, "(absent)")}
        for k in sorted(set(flat_a) | set(flat_b))
        if flat_a.get(k) != flat_b.get(k)
    ]


def aligned_timeline(dev: Device | Mapping[str, Any]) -> dict[str, list[float]] | None:
    """The device's timeline points that fall inside a step, at x = step + fraction of its events."""
    dev = device_of(dev)
    timeline = dev.timeline
    steps = [s for s in dev.steps if s.first_event is not None and s.last_event is not None]
    if timeline is None or not steps:
        return None
    out: dict[str, list[float]] = {"x": [], "reserved": [], "allocated": []}
    k = 0
    for e, r, a in zip(timeline.index, timeline.reserved_bytes, timeline.allocated_bytes, strict=True):
        while k < len(steps) and e > int(steps[k].last_event or 0):
            k += 1
        if k == len(steps):
            break
        first, last = int(steps[k].first_event or 0), int(steps[k].last_event or 0)
        if e < first:
            continue
        out["x"].append(k + (e - first) / max(1, last - first + 1))
        out["reserved"].append(float(r))
        out["allocated"].append(float(a))
    return out


def compare(report_a: Report | Mapping[str, Any], report_b: Report | Mapping[str, Any]) -> dict[str, Any]:
    """Everything the compare page shows that is not a chart."""
    typed_a, typed_b = report_of(report_a), report_of(report_b)
    dev_a, dev_b = contract.main_device(typed_a), contract.main_device(typed_b)
    if dev_a is None or dev_b is None:
        return {"deltas": [], "stacks_at_peak": [], "churn": [], "settings": []}
    sa, sb = dev_a.summary, dev_b.summary
    deltas = [{"name": name, **_delta(getattr(sa, key), getattr(sb, key))} for name, key in SUMMARY_KEYS]
    deltas.append({"name": "steps", **_delta(len(dev_a.steps), len(dev_b.steps))})
    deltas.append({"name": "trace events", **_delta(dev_a.events, dev_b.events)})
    stacks = stack_diff(
        [r for r in dev_a.top_stacks if r.when == "peak"], [r for r in dev_b.top_stacks if r.when == "peak"]
    )
    settings = settings_diff(typed_a.capture, typed_b.capture)
    return {
        "conclusion": conclusion(dev_a, dev_b, stacks, settings),
        "deltas": deltas,
        "oom": {"a": _run_verdict(dev_a), "b": _run_verdict(dev_b)},
        "stacks_at_peak": stacks,
        "churn": stack_diff(dev_a.churn, dev_b.churn),
        "settings": settings,
    }


def conclusion(
    dev_a: Device,
    dev_b: Device,
    stacks: Sequence[Mapping[str, Any]],
    settings: Sequence[Mapping[str, Any]],
) -> str:
    """The comparison in one sentence: B's peak against A's, who ran out of memory, and the largest change
    by site (or the settings that differ)."""
    a = int(dev_a.summary.peak_reserved_bytes or 0)
    b = int(dev_b.summary.peak_reserved_bytes or 0)
    if b == a:
        peak = f"B peaks at the same {size(b)} reserved as A"
    else:
        share = f" ({abs(b - a) / a:.0%})" if a else ""
        peak = f"B peaks at {size(b)} reserved, {size(abs(b - a))}{share} {'more' if b > a else 'less'} than A"
    ooms = {
        (True, True): "; both ran out of memory",
        (True, False): "; A ran out of memory and B did not",
        (False, True): "; B ran out of memory and A did not",
        (False, False): "",
    }[(dev_a.oom is not None, dev_b.oom is not None)]
    why = ""
    if settings:  # a different setting is the first suspect for a different peak
        why = "; the settings differ: " + ", ".join(str(r["name"]) for r in settings[:3])
    moved = next((r for r in stacks if r["site"] != OTHER and r["change"] != "same"), None)
    if moved is not None and int(moved["delta"] or 0):
        delta = int(moved["delta"])
        why += f"; the largest change at the peak: {moved['site']} ({'+' if delta > 0 else '-'}{size(abs(delta))})"
    return f"{peak}{ooms}{why}."


def _run_verdict(dev: Device) -> str | None:
    """The run's verdict (``oom.run_verdict``; ``contract.Oom`` reads an older report's ``oom.verdict``)."""
    return dev.oom.run_verdict if dev.oom else None
