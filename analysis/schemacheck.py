"""The schema's refusals that stand apart from the conversion: a device's trace columns, an unexpected value.

Both readers (the reference converter, ``convert.Converter``, and the compiled one,
``fastread``) check a device's converted columns with ``check_trace_columns``: the count of
streams, and every free naming its block's stream and pool. Where the schema meets a value of
the wrong type, ``diagnose`` looks at it (bounded, iterative) and names a cycle, a nesting too
deep or an expansion past the budget instead of the type. ``short_repr`` renders a hostile value
for a message without ever raising; the int64 range of the model's columns is ``I64_MIN`` ..
``I64_MAX``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.errors import LimitError, SchemaError, SnapshotError
from analysis.model import ACTIONS, ALLOC, FREE_COMPLETED, FREE_REQUESTED

if TYPE_CHECKING:
    from analysis.unpickler import ReadLimits

I64_MAX = (1 << 63) - 1
I64_MIN = -(1 << 63)


def diagnose(value: Any, max_depth: int, budget: int) -> SnapshotError | None:
    """Bounded iterative look at an unexpected container: cycle, depth (past ``max_depth``), expansion
    (past ``budget`` nodes); None where it is none of these (the refusal is then the type's)."""
    if not isinstance(value, (list, tuple, dict)):
        return None
    limit = max_depth
    expanded: dict[int, int] = {}  # id -> expanded node count (DAG dynamic programming)
    on_path: set[int] = set()
    visits = 0
    stack: list[tuple[Any, Iterator[Any] | None]] = [(value, None)]
    while stack:
        node, children = stack[-1]
        if children is None:
            on_path.add(id(node))
            if len(stack) > limit:
                return LimitError("too-deep", f"the data nests deeper than {limit} levels")
            items = node.values() if isinstance(node, dict) else node
            stack[-1] = (node, iter(items))
            continue
        for child in children:
            if isinstance(child, (list, tuple, dict)):
                cid = id(child)
                if cid in on_path:
                    return SchemaError("cycle", "the data contains a reference cycle")
                if cid not in expanded:
                    visits += 1
                    if visits > budget:
                        return LimitError("expansion", "the object graph is too large")
                    stack.append((child, None))
                    break
        else:
            stack.pop()
            on_path.discard(id(node))
            items = node.values() if isinstance(node, dict) else node
            total = 1
            for child in items:
                total += expanded.get(id(child), 1) if isinstance(child, (list, tuple, dict)) else 1
            expanded[id(node)] = total
            if total > budget:
                return LimitError(
                    "expansion", f"the object graph expands past {budget} nodes: a memo bomb, not a snapshot"
                )
    return None


def check_stream_count(limits: ReadLimits, count: int, where: str) -> None:
    if count > limits.max_streams:
        raise LimitError("streams", f"{where}: {count:,} distinct streams (at most {limits.max_streams:,} are read)")


def check_trace_columns(
    limits: ReadLimits,
    action: np.ndarray,
    addr: np.ndarray,
    stream: np.ndarray,
    pool: np.ndarray,
    streams: list[int],
    where: str,
    first_off_lane: Callable[..., tuple[int, ...] | None] | None = None,
) -> None:
    """The checks on a device's converted columns, for both readers (the compiled one reads the columns
    itself and calls this): the count of streams, and every free naming its block's stream and pool.
    ``first_off_lane(action, addr, stream, pool)``: the compiled reader's one pass for the second
    (``fastread.first_free_off_lane``: ``()``, the wrong pair ``(cur, prev)``, or None to leave it to
    the sort below, the reference)."""
    check_stream_count(limits, len(streams), where)
    if len(streams) > 1 or pool.any():
        found = first_off_lane(action, addr, stream, pool) if first_off_lane is not None else None
        if found is None:
            _check_frees_match_their_blocks(action, addr, stream, pool, streams, where)
        elif found:
            _refuse_free_off_lane(action, addr, stream, pool, streams, where, *found)


def _check_frees_match_their_blocks(
    action: np.ndarray, addr: np.ndarray, stream: np.ndarray, pool: np.ndarray, streams: list[int], where: str
) -> None:
    """A free names the stream and pool of the block it frees (torch writes the block's own).

    The allocator models keep a free list per (pool, stream) and put a freed block back on the
    list its free names: a free on another stream or pool than its allocation made them index
    past their lists (issue 22: a negative stream, a stream per event, a list as pool id, all
    ``IndexError``). Checked where the trace holds the allocation: each free against the event
    before it at its address. Only traces with several streams or pools pay for the sort.
    """
    blocks = np.flatnonzero((action == ALLOC) | (action == FREE_REQUESTED) | (action == FREE_COMPLETED))
    if blocks.size < 2:
        return
    order = blocks[np.argsort(addr[blocks], kind="stable")]
    prev, cur = order[:-1], order[1:]
    follows = (addr[cur] == addr[prev]) & (action[cur] != ALLOC) & (action[prev] != FREE_COMPLETED)
    wrong = follows & ((stream[cur] != stream[prev]) | (pool[cur] != pool[prev]))
    if not wrong.any():
        return
    k = int(np.flatnonzero(wrong)[0])
    _refuse_free_off_lane(action, addr, stream, pool, streams, where, int(cur[k]), int(prev[k]))


def _refuse_free_off_lane(
    action: np.ndarray,
    addr: np.ndarray,
    stream: np.ndarray,
    pool: np.ndarray,
    streams: list[int],
    where: str,
    i: int,
    j: int,
) -> None:
    """The ``inconsistent-trace`` refusal of event ``i``, a free on another stream or pool than event ``j``."""
    raise SchemaError(
        "inconsistent-trace",
        f"{where}[{i}]: a {ACTIONS[int(action[i])]} of the block at {int(addr[i]):#x} names stream "
        f"{short_repr(streams[int(stream[i])])}, pool #{int(pool[i])}, but event {j} that it follows names stream "
        f"{short_repr(streams[int(stream[j])])}, pool #{int(pool[j])}",
    )


def check_int_range(value: Any, where: str) -> None:
    """Ints a report prints must fit int64: past 4,300 digits ``str`` itself raises (issue 22)."""
    if type(value) is int and not I64_MIN <= value <= I64_MAX:
        raise SchemaError("int-range", f"{where}: {short_repr(value)} does not fit in int64")


def is_scalar(v: Any) -> bool:
    if type(v) is float:
        return math.isfinite(v)
    return v is None or type(v) in (str, int, bool)


def short_repr(value: Any) -> str:
    """A bounded, never-raising rendering of a hostile value for an error message.

    ``repr`` of an int past ``sys.get_int_max_str_digits()`` (4300 digits) raises ValueError,
    and a 2 KB pickle can hold one; such ints are described by their size instead, and any
    other repr failure falls back to the type name, so a message never turns into a crash.
    """
    if isinstance(value, (list, tuple, dict)):
        return f"(a {type(value).__name__} of {len(value)})"
    if type(value) is int and value.bit_length() > 200:  # ~60 digits: more would be cut anyway
        return f"(an int of {value.bit_length()} bits)"
    try:
        text = repr(value)
    except Exception:
        return f"(a {type(value).__name__})"
    return text if len(text) <= 60 else text[:57] + "..."
