"""How figures are worded for people: one place for the charts and the templates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float | None) -> str:
    """Binary units with two decimals past KiB ("1.04 GiB"): the wording of torch's own OOM message."""
    if n is None:
        return "n/a"
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    unit = 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{sign}{int(value)} B"
    return f"{sign}{value:.2f} {_UNITS[unit]}"


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
