"""Reading the data back out of a Bokeh ``json_item`` (for tests of the ``pages/charts/`` package).

Bokeh serialises numpy columns as ``{"type": "ndarray", "array": {"type": "bytes",
"data": <base64, gzip-compressed>}, "dtype": ..., "order": ...}`` and maps as
``{"type": "map", "entries": [[key, value], ...]}``; these helpers undo both so a
test can compare a chart's numbers with the report's.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from typing import Any

import numpy as np


def decode(value: Any) -> Any:
    """A serialised column as a numpy array (or the plain list it already is)."""
    if isinstance(value, dict) and value.get("type") == "ndarray":
        array = value["array"]
        raw = base64.b64decode(array["data"]) if isinstance(array, dict) else bytes(array)
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        dtype = np.dtype(value["dtype"]).newbyteorder("<" if value.get("order", "little") == "little" else ">")
        return np.frombuffer(raw, dtype=dtype).reshape(value.get("shape") or -1)
    if isinstance(value, dict) and value.get("type") == "map":
        return {k: decode(v) for k, v in value["entries"]}
    return value


def objects(item: dict[str, Any], name: str | None = None) -> Iterator[dict[str, Any]]:
    """Every serialised Bokeh model in the item, optionally only those of one class name."""
    stack: list[Any] = [item["doc"]]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "object" and (name is None or node.get("name") == name):
                yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def sources(item: dict[str, Any]) -> list[dict[str, Any]]:
    """The data of every ColumnDataSource in the item, columns decoded."""
    out = []
    for obj in objects(item, "ColumnDataSource"):
        data = obj.get("attributes", {}).get("data")
        if data is not None:
            out.append(decode(data))
    return out


def source_with(item: dict[str, Any], *columns: str) -> dict[str, Any]:
    """The first ColumnDataSource holding all of ``columns``."""
    for data in sources(item):
        if all(c in data for c in columns):
            return data
    raise AssertionError(f"no source with columns {columns}")


def figure_count(item: dict[str, Any]) -> int:
    return sum(1 for _ in objects(item, "Figure"))


def size(item: dict[str, Any]) -> int:
    return len(json.dumps(item, separators=(",", ":")))
