"""Hostile values inside an otherwise valid snapshot (issue 22): nested tuples where the reader
hashes (a stream, an action, a pool id, a dict key), deep dicts in frames, streams and pools the
allocator model cannot index, ints past 4,300 digits. Each is built here as pickle bytes (a
million-deep tuple cannot be pickled by ``pickle.dumps``: it recurses) with the code it must get.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from tests.analysis.hostile_cases import snapshot_dict

_MARK = 0x0BC614E  # a BININT that appears once in the pickle, replaced by the hostile value's opcodes
_MARK_OPS = b"J" + _MARK.to_bytes(4, "little")
DEPTH = 1_000_000  # far past the C stack: hashing or comparing it recursively crashes CPython


def nested_tuple_ops(depth: int = DEPTH) -> bytes:
    """Opcodes that push ``((((0,),),),)`` ``depth`` deep: an int, then TUPLE1 ``depth`` times."""
    return b"K\x00" + b"\x85" * depth


def nested_dict_ops(depth: int = DEPTH) -> bytes:
    """Opcodes that push ``{"k": {"k": ... {}}}`` ``depth`` deep."""
    return (b"}X\x01\x00\x00\x00k") * depth + b"}" + b"s" * depth


def _with_ops(edit: Callable[[dict[str, Any], Any], None], ops: bytes, n_events: int = 10, copies: int = 1) -> bytes:
    snap = snapshot_dict(n_events)
    snap["device_traces"][0] = [dict(e) for e in snap["device_traces"][0]]  # each event its own dict
    edit(snap, _MARK)
    body = pickle.dumps(snap, protocol=2)  # no frames: the splice keeps the pickle valid
    assert body.count(_MARK_OPS) == copies
    return body.replace(_MARK_OPS, ops)


def _event(key: str) -> Callable[[dict[str, Any], Any], None]:
    def edit(snap: dict[str, Any], value: Any) -> None:
        snap["device_traces"][0][3][key] = value

    return edit


def _frame_field(key: str) -> Callable[[dict[str, Any], Any], None]:
    def edit(snap: dict[str, Any], value: Any) -> None:
        frame = {"filename": "train.py", "line": 3, "name": "step", key: value}
        for e in snap["device_traces"][0][2:6]:
            e["frames"] = [frame, {"filename": "model.py", "line": 7, "name": "forward"}]

    return edit


def _two_frames_with(key: str) -> Callable[[dict[str, Any], Any], None]:
    """Two events, not neighbours, whose frames lists share their middle frame (so the reader's
    interning compares them with ``==``) and start with distinct frame dicts holding ``key``."""

    def edit(snap: dict[str, Any], value: Any) -> None:
        shared = {"filename": "model.py", "line": 7, "name": "forward"}
        for e in (snap["device_traces"][0][2], snap["device_traces"][0][4]):
            e["frames"] = [{"filename": "train.py", "line": 3, "name": "step", key: value}, shared, shared]

    return edit


def _old_layout_event(key: str) -> Callable[[dict[str, Any], Any], None]:
    """An event of the older layout (no ``time_us``: the reader reads it key by key) with ``key`` set."""

    def edit(snap: dict[str, Any], value: Any) -> None:
        for e in snap["device_traces"][0]:
            e.pop("time_us", None)
        snap["device_traces"][0][3][key] = value

    return edit


def _dict_key(snap: dict[str, Any], value: Any) -> None:
    snap["device_traces"][0][3][value] = 1


def _streams(values: Callable[[int], Any]) -> bytes:
    snap = snapshot_dict(2000)
    for i, e in enumerate(snap["device_traces"][0]):
        snap["device_traces"][0][i] = dict(e, stream=values(i))
    return pickle.dumps(snap, protocol=4)


def _plain(edit: Callable[[dict[str, Any]], None]) -> bytes:
    snap = snapshot_dict(10)
    snap["device_traces"][0] = [dict(e) for e in snap["device_traces"][0]]
    edit(snap)
    return pickle.dumps(snap, protocol=4)


def _many_devices(n: int = 3000) -> bytes:
    """The issue's 22 KB file: one segment on each of ``n`` devices."""
    snap = snapshot_dict(0)
    snap["segments"] = [dict(snap["segments"][0], device=d) for d in range(n)]
    snap["device_traces"] = []
    return pickle.dumps(snap, protocol=4)


def _many_gzip_members(n: int = 400_000) -> bytes:
    """The issue's 8 MB file: ``n`` empty gzip members, then the snapshot."""
    import gzip

    return gzip.compress(b"", 1) * n + gzip.compress(pickle.dumps(snapshot_dict(10), protocol=4))


HUGE_INT = 7**6000  # 5,071 digits: str() and repr() of it raise ValueError


def build() -> dict[str, tuple[bytes, str]]:
    """``{name: (pickle bytes, the code it must get)}``."""
    return {
        "many_devices": (_many_devices(), "snapshot:limit:devices"),
        "many_gzip_members": (_many_gzip_members(), "snapshot:limit:gzip-members"),
        "stream_nested_tuple": (_with_ops(_event("stream"), nested_tuple_ops()), "snapshot:limit:too-deep"),
        "action_nested_tuple": (_with_ops(_event("action"), nested_tuple_ops()), "snapshot:limit:too-deep"),
        "event_pool_nested_tuple": (_with_ops(_event("pool_id"), nested_tuple_ops()), "snapshot:limit:too-deep"),
        "segment_pool_nested_tuple": (
            _with_ops(lambda s, v: s["segments"][0].update(segment_pool_id=v), nested_tuple_ops()),
            "snapshot:limit:too-deep",
        ),
        "old_layout_compile_context_nested_tuple": (
            _with_ops(_old_layout_event("compile_context"), nested_tuple_ops()),
            "snapshot:limit:too-deep",
        ),
        "dict_key_nested_tuple": (_with_ops(_dict_key, nested_tuple_ops()), "snapshot:limit:too-deep"),
        # Extra keys of a frame are ignored, however deep; comparing two such frames recursed (RecursionError).
        "frame_deep_dict": (_with_ops(_frame_field("locals"), nested_dict_ops(200_000)), "accepted"),
        "two_frames_deep_dicts": (
            _with_ops(_two_frames_with("locals"), nested_dict_ops(200_000), copies=2),
            "accepted",
        ),
        "frame_name_deep_dict": (_with_ops(_frame_field("name"), nested_dict_ops(200_000)), "snapshot:limit:too-deep"),
        "negative_stream": (_streams(lambda i: -1 if i == 5 else 0), "snapshot:schema:inconsistent-trace"),
        "negative_streams_throughout": (_streams(lambda i: -(i // 2) - 1), "accepted"),
        "stream_per_event": (_streams(lambda i: i), "snapshot:limit:streams"),
        "event_pool_is_list": (
            _plain(lambda s: s["device_traces"][0][3].update(pool_id=[1, 2])),
            "snapshot:schema:inconsistent-trace",
        ),
        "segment_pool_is_list": (_plain(lambda s: s["segments"][0].update(segment_pool_id=[0, 0])), "accepted"),
        "frame_line_huge_int": (
            _plain(
                lambda s: s["device_traces"][0][2].update(frames=[{"filename": "a", "line": HUGE_INT, "name": "f"}])
            ),
            "snapshot:schema:int-range",
        ),
        "settings_huge_int": (
            _plain(lambda s: s.update(allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": HUGE_INT})),
            "snapshot:schema:int-range",
        ),
        "settings_nested_huge_int": (
            _plain(lambda s: s.update(allocator_settings={"PYTORCH_CUDA_ALLOC_CONF": "", "x": {"y": HUGE_INT}})),
            "snapshot:schema:int-range",
        ),
    }
