"""Stored reports brought to the current shape: the one place that knows how older reports differ.

The worker stores each report as it was built, and a page, the API's summary or the CLI may read
one made long before. ``upgrade(report)`` fills in, in place, what an older report lacks, so that
every reader reads one shape (the schema stays ``oomscope.report/1``: no key changed meaning, only
later ones were added):

- ``devices[].oom`` of the first reports named an inferred limit by its inference alone
  (``limit_source`` ``device-full`` or ``cap-lower-bound``) and had no ``limit_is_lower_bound``,
  ``limit_inference`` or ``limit_kind``: the lower-bound flag and the inference are filled in
  (``limit_source`` keeps its stored value, which the decision's wording still names).
- ``devices[].limit`` (the limit whatever its source) came later: it is made from the OOM's keys.
- ``devices[].decision`` came later still: it is computed (``analysis.decision.decide``, a pure
  function of the device's own keys and the capture section).
- ``devices[].oom.run_verdict`` and ``run_verdict_basis`` (issue 32) came after: computed the same way
  (``analysis.decision.run_verdict``); an older report's ``oom.verdict`` keeps its stored value.

Applied twice, it changes nothing the second time; a report of the current shape passes through
untouched. ``load(report)`` is the one way a reader takes a stored report: upgraded, then read once
into the typed ``analysis.contract.Report`` (no reader goes back to the dict's keys).
"""

from __future__ import annotations

from typing import Any

from analysis import doctor
from analysis.contract import Report
from analysis.decision import decide, run_verdict

# Older ``limit_source`` values that were inferences (before ``limit_inference`` existed).
_INFERENCES = frozenset({"device-full", "cap-lower-bound"})


def upgrade(report: dict[str, Any]) -> dict[str, Any]:
    """``report`` with every key of the current shape that an older report lacks filled in."""
    capture = report.get("capture") or {}
    for dev in report.get("devices") or []:
        if not isinstance(dev, dict):
            continue
        oom = dev.get("oom")
        if isinstance(oom, dict) and oom.get("limit_source") is not None:
            _limit_keys(oom)
            if not dev.get("limit"):
                dev["limit"] = _device_limit(oom)
        if "decision" not in dev:
            dev["decision"] = decide(dev, capture)
        if isinstance(oom, dict) and "run_verdict" not in oom:
            oom.update(run_verdict(dev) or {})
    if isinstance(report.get("capture"), dict) and "doctor" not in capture:
        devices = [d for d in report.get("devices") or [] if isinstance(d, dict)]
        capture["doctor"] = [f.to_dict() for f in doctor.findings(capture, devices)]
    return report


def load(report: dict[str, Any]) -> Report:
    """A stored report, of any age, as the typed contract object (upgraded in place first)."""
    return Report.from_json(upgrade(report))


def _limit_keys(oom: dict[str, Any]) -> None:
    """The limit keys of an OOM from before they existed, from its ``limit_source``."""
    if "limit_is_lower_bound" in oom:
        return
    source = str(oom["limit_source"])
    oom["limit_is_lower_bound"] = source == "cap-lower-bound"
    oom.setdefault("limit_inference", source if source in _INFERENCES else None)


def _device_limit(oom: dict[str, Any]) -> dict[str, Any]:
    """``devices[].limit`` as the report writes it (``Limit.to_json``), from the OOM's limit keys."""
    limit = int(oom["limit_bytes"])
    return {
        "bytes": limit,
        "source": oom["limit_source"],
        "is_lower_bound": bool(oom["limit_is_lower_bound"]),
        "low_bytes": limit,
        "high_bytes": None,
        "inference": oom.get("limit_inference"),
        "kind": oom.get("limit_kind"),
        "note": "",
    }
