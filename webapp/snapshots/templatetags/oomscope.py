"""Template helpers for the report pages: byte formatting and chart placement.

Formatting only: no figure is derived here, every number comes from the report
dict. ``{% chart charts "timeline" device %}`` places one chart (a slot plus its
``json_item`` in a ``json_script`` element) when the page's ``charts`` has it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from django import template

from webapp.snapshots.pages.formatting import format_bytes, frame_label

register = template.Library()


@register.filter(name="bytes")
def bytes_filter(value: Any) -> str:
    """``1117782016`` -> ``1.04 GiB`` (binary units, as torch's own messages print them)."""
    if value is None or value == "":
        return "n/a"
    try:
        n = float(value)
    except (TypeError, ValueError):
        return str(value)
    return format_bytes(n)


@register.filter
def exact_bytes(value: Any) -> str:
    """``1117782016`` -> ``1,117,782,016 B``: the exact figure, for titles and tables."""
    try:
        return f"{int(value):,} B"
    except (TypeError, ValueError):
        return "n/a"


@register.filter
def thousands(value: Any) -> str:
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return "" if value is None else str(value)


@register.filter
def percent(value: Any) -> str:
    """A share in [0, 1] as ``42.0%``."""
    try:
        return f"{float(value) * 100:.1f}%"
    except (TypeError, ValueError):
        return "n/a"


@register.filter
def seconds(time_us: Any) -> str:
    """Microseconds on the snapshot's clock as seconds (``12.345 s``)."""
    try:
        return f"{int(time_us) / 1e6:,.3f} s"
    except (TypeError, ValueError):
        return "n/a"


@register.filter
def clock(time_us: Any) -> str:
    """A trace timestamp as a UTC time of day (``14:02:31.128``).

    torch stamps events in microseconds since the Unix epoch; a small value is a
    relative clock, shown as seconds.
    """
    try:
        us = int(time_us)
    except (TypeError, ValueError):
        return "n/a"
    if us < 10**12:  # before 1970-01-12: not an epoch time
        return f"{us / 1e6:,.3f} s"
    moment = datetime.fromtimestamp(us / 1e6, tz=UTC)
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


@register.filter
def isotime(value: Any) -> str:
    """An ISO timestamp (``2026-11-29T19:28:03.1+00:00``) as ``2026-11-29 19:28 UTC``."""
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value or "")
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M") + " UTC"


@register.filter
def words(name: Any) -> str:
    """``optimizer_state`` -> ``optimizer state``."""
    return str(name).replace("_", " ")


register.filter("frame_label", frame_label)


@register.filter
def get(mapping: Any, key: Any) -> Any:
    """``mapping[key]`` for a key held in a variable; None when absent."""
    if isinstance(mapping, Mapping):
        return mapping.get(key)
    return None


@register.inclusion_tag("snapshots/_chart.html")
def chart(charts: Any, kind: str, device: Any = None, caption: str = "", heading: str = "") -> dict[str, Any]:
    """One chart slot (after its ``heading``, if any), or nothing when the page has no chart of that name."""
    name = kind if device is None else f"{kind}-{device}"
    item = charts.get(name) if isinstance(charts, Mapping) else None
    return {"name": name, "item": item, "data_id": f"chart-data-{name}", "caption": caption, "heading": heading}


@register.simple_tag
def bokeh_js_url() -> str:
    """The static URL of BokehJS, pinned to the installed bokeh's version (settings.BOKEH_VERSION)."""
    from django.conf import settings
    from django.templatetags.static import static

    return static(f"bokeh/{settings.BOKEH_VERSION}/bokeh.min.js")


@register.simple_tag
def chart_item(charts: Any, kind: str, device: Any = None) -> Any:
    """``{% chart_item charts "timeline" dev.device as tl %}``: the chart's item or None."""
    name = kind if device is None else f"{kind}-{device}"
    return charts.get(name) if isinstance(charts, Mapping) else None


@register.filter
def signed_bytes(value: Any) -> str:
    """A change in bytes with its sign: ``+1.04 GiB``, ``-512 bytes``, ``no change``
    (``analysis.readout.size_change``, the one wording of changes)."""
    from analysis.readout import size_change

    try:
        n = int(value)
    except (TypeError, ValueError):
        return "n/a"
    return size_change(n)
