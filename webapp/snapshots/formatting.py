"""How figures are worded for people: one place for the charts and the templates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from analysis.decision import format_size


def format_bytes(n: float | None) -> str:
    """Sizes worded as torch's own messages word them (``format_size``: "710.00 MiB", "1.04 GiB",
    "512 bytes"); the one rule lives in ``analysis.decision.format_size``."""
    if n is None:
        return "n/a"
    return format_size(n)


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
