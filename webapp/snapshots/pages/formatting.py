"""How figures are worded for people: one place for the charts and the templates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from analysis import readout
from analysis.contract import Frame
from analysis.stored import load


def format_bytes(n: float | None) -> str:
    """Sizes worded as torch's own messages word them ("710.00 MiB", "1.04 GiB", "512 bytes"); the one
    rule for the page, the API's summary and the CLI lives in ``analysis.readout.size``."""
    return readout.size(n)


def report_for_page(report: dict[str, Any]) -> dict[str, Any]:
    """The report as a page renders it: with its decisions and, per device, ``readout`` (what the
    verdict rests on, each ranked change's state, the headroom: ``analysis.readout``). Templates
    render these and compute nothing."""
    typed = load(report)  # in the current shape (analysis.stored, in place), then read once, typed
    # ``contract.Report.devices`` are the list's objects, in order: the same ones the templates render.
    rows = [dev for dev in report["devices"] if isinstance(dev, dict)] if typed.devices else []
    for dev, device in zip(rows, typed.devices, strict=True):
        dev["readout"] = readout.device_readout(device)
    return report


# How long an analysis takes, from the file's size: the worker analysed the small fixtures (100-250 KB
# gzipped) in about 2 s with their charts, and huge_all_stacks (21.8 MB gzipped, 460 MB raw) in about
# 35 s (docs/performance.md, test_ux_huge.py; this project's 2-core box). A raw pickle is about 21 times
# its gzipped size.
ESTIMATE_BASE_S = 2.0
ESTIMATE_S_PER_GZ_MB = 1.5
RAW_PER_GZ = 21.0


def analysis_estimate_s(file_bytes: int | None, fmt: str = "") -> int:
    """A rough wait for an upload of this size, in seconds (rounded up to 5 s above 10 s)."""
    mb = float(file_bytes or 0) / 1e6
    gz_mb = mb if fmt.endswith("gz") or fmt in ("torch-zip", "") else mb / RAW_PER_GZ
    seconds = ESTIMATE_BASE_S + ESTIMATE_S_PER_GZ_MB * gz_mb
    return int(seconds) + 1 if seconds <= 10 else int(-(-seconds // 5) * 5)


def duration(seconds: float | None) -> str:
    """``75`` -> ``1 min 15 s``; ``8`` -> ``8 s``."""
    if seconds is None:
        return ""
    whole = max(0, int(seconds))
    return f"{whole // 60} min {whole % 60} s" if whole >= 60 else f"{whole} s"


def event_text(action: str, size: int, label: str) -> str:
    """What happened at a point, for hover: ``alloc 12.00 MiB · linear.py:134 forward ← …``."""
    text = f"{action.replace('_', ' ')} {format_bytes(size)}" if action != "snapshot" else action
    return f"{text} · {label}" if label else text


def frame_label(frame: Any) -> str:
    """``name (dir/file.py:12)`` for a frame (``analysis.contract.Frame``, or a segment map block's frame
    dict); C++ frames are their name alone."""
    if isinstance(frame, Mapping):
        frame = Frame.from_json(frame)
    if not isinstance(frame, Frame):
        return str(frame)
    name = str(frame.name or "?")
    filename = str(frame.filename or "")
    if not filename or not (filename.endswith(".py") or filename.startswith("<")):
        return name
    short = "/".join(filename.replace("\\", "/").rsplit("/", 2)[-2:])
    return f"{name} ({short}:{'?' if frame.line is None else frame.line})"
