"""How figures are worded for people: one place for the charts and the templates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from analysis import readout


def format_bytes(n: float | None) -> str:
    """Sizes worded as torch's own messages word them ("710.00 MiB", "1.04 GiB", "512 bytes"); the one
    rule for the page, the API's summary and the CLI lives in ``analysis.readout.size``."""
    return readout.size(n)


def with_decisions(report: dict[str, Any]) -> dict[str, Any]:
    """Reports stored before ``decision`` existed get it here (a pure function of the report's own keys)."""
    from analysis.decision import decide

    capture = report.get("capture") or {}
    for dev in report.get("devices") or []:
        if isinstance(dev, dict) and "decision" not in dev:
            dev["decision"] = decide(dev, capture)
    return report


def report_for_page(report: dict[str, Any]) -> dict[str, Any]:
    """The report as a page renders it: with its decisions and, per device, ``readout`` (what the
    verdict rests on, each ranked change's state, the headroom: ``analysis.readout``). Templates
    render these and compute nothing."""
    with_decisions(report)
    for dev in report.get("devices") or []:
        if isinstance(dev, dict):
            dev["readout"] = readout.device_readout(dev)
    return report


def event_text(action: str, size: int, label: str) -> str:
    """What happened at a point, for hover: ``alloc 12.00 MiB · linear.py:134 forward ← …``."""
    text = f"{action.replace('_', ' ')} {format_bytes(size)}" if action != "snapshot" else action
    return f"{text} · {label}" if label else text


def frame_label(frame: Any) -> str:
    """``name (dir/file.py:12)`` for a frame dict; C++ frames are their name alone."""
    if not isinstance(frame, Mapping):
        return str(frame)
    name = str(frame.get("name") or "?")
    filename = str(frame.get("filename") or "")
    if not filename or not (filename.endswith(".py") or filename.startswith("<")):
        return name
    short = "/".join(filename.replace("\\", "/").rsplit("/", 2)[-2:])
    return f"{name} ({short}:{frame.get('line', '?')})"
