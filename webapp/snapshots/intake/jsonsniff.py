"""Whether the first bytes of a JSON upload can be a memory snapshot, before it is stored or queued.

The reader accepts JSON in the two shapes torch's viewer reads (docs/reader.md): an object with a
``segments`` key (torch >= 2.0, beside ``device_traces``, ``allocator_settings``,
``external_annotations``) or a bare list of segment objects (``torch.cuda.memory_snapshot()``,
torch <= 1.13). Any other JSON (``{"a": 1}``, a list of numbers, a Chrome trace's ``traceEvents``)
used to be stored, queued and then failed in the worker; it is refused here at once.

Only the head is seen (``uploads.SNIFF_BYTES``), and a snapshot's first value is megabytes long, so
the check walks the top-level keys the head holds: a snapshot key among them accepts; keys that are
all foreign, or an object that closes without ``segments``, refuse. A head that ends before its first
key is read accepts (the reader decides). A real snapshot written with a foreign key first whose value
overruns the head would be refused; torch's writers put ``segments`` first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

SNAPSHOT_KEYS = frozenset({"segments", "device_traces", "allocator_settings", "external_annotations"})
# The keys of one segment in torch's snapshots (1.13 to 2.x); a list whose first object has none is
# no list of segments.
SEGMENT_KEYS = frozenset(
    {
        "device",
        "address",
        "total_size",
        "allocated_size",
        "active_size",
        "requested_size",
        "stream",
        "segment_type",
        "segment_pool_id",
        "is_expandable",
        "frames",
        "blocks",
    }
)
_DECODER = json.JSONDecoder()
_SPACE = " \t\r\n"


@dataclass(frozen=True)
class ObjectKeys:
    """The keys of one JSON object that the head holds, and whether the object closed within it."""

    keys: tuple[str, ...]
    closed: bool


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at


def object_keys(text: str, at: int) -> ObjectKeys:
    """The keys of the object opening at ``text[at] == "{"``, as far as ``text`` goes."""
    keys: list[str] = []
    at = _skip_space(text, at + 1)
    if text[at : at + 1] == "}":
        return ObjectKeys((), closed=True)
    while at < len(text):
        try:
            key, at = _DECODER.raw_decode(text, at)
        except ValueError:  # the key runs past the head (or is not JSON: the reader will say)
            break
        if not isinstance(key, str):
            break
        keys.append(key)
        at = _skip_space(text, at)
        if text[at : at + 1] != ":":
            break
        try:
            _value, at = _DECODER.raw_decode(text, _skip_space(text, at + 1))
        except ValueError:  # the value runs past the head
            break
        at = _skip_space(text, at)
        if text[at : at + 1] == "}":
            return ObjectKeys(tuple(keys), closed=True)
        if text[at : at + 1] != ",":
            break
        at = _skip_space(text, at + 1)
    return ObjectKeys(tuple(keys), closed=False)


def foreign_json(head: bytes) -> str | None:
    """Why a JSON head is no memory snapshot, or None when it may be one (the reader decides the rest)."""
    text = head.removeprefix(b"\xef\xbb\xbf").decode("utf-8", errors="replace")
    at = _skip_space(text, 0)
    opening = text[at : at + 1]
    if opening == "{":
        found = object_keys(text, at)
        if "segments" in found.keys or (not found.closed and SNAPSHOT_KEYS & set(found.keys)):
            return None
        if found.closed:
            named = ", ".join(found.keys[:5]) or "none"
            return f"a JSON object without a 'segments' key (its keys: {named})"
        if found.keys:
            return f"a JSON object whose keys are not a snapshot's (it starts with {', '.join(found.keys[:5])})"
        return None
    if opening == "[":
        first = _skip_space(text, at + 1)
        if text[first : first + 1] == "]":
            return "an empty JSON list"
        if first >= len(text):
            return None
        if text[first : first + 1] != "{":
            return "a JSON list of values, not of segment objects"
        found = object_keys(text, first)
        if SEGMENT_KEYS & set(found.keys) or (not found.keys and not found.closed):
            return None
        return f"a JSON list whose first object is no segment (its keys: {', '.join(found.keys[:5]) or 'none'})"
    return None
