"""The compiled reader (analysis/_snapread.c) against the Python reader, its reference.

- every fixture and capture: the compiled reader reads it by itself (it does not hand it
  over) and the snapshot is identical: every column (values and dtypes), the stack table,
  segments, streams, texts, pools, settings, annotations, warnings;
- every hostile case: the compiled reader gives up on it (it never accepts what the
  reference refuses), so ``read_snapshot`` refuses it with the reference's code and message;
- a seeded fuzz: random byte edits and value edits of real fixtures, each read both ways,
  must give the same snapshot or the same refusal (code and message).
"""

from __future__ import annotations

import gzip
import os
import pickle
import random
import resource
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis import fastread
from analysis.errors import SnapshotError
from analysis.model import Snapshot
from analysis.reader import ReadLimits, read_snapshot
from tests.analysis.hostile_cases import build_cases

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOP = sorted(FIXTURES.glob("*.pickle.gz"))
CAPTURES = sorted((FIXTURES / "captures").glob("*.pickle.gz"))
COLUMNS = ("action", "addr", "size", "stream", "time_us", "stack", "pool")

pytestmark = pytest.mark.skipif(
    not fastread.available(), reason="the compiled reader is not built (make install builds it with a C compiler)"
)


def differences(a: Snapshot, b: Snapshot) -> list[str]:
    """Where two snapshots differ (empty: identical, numpy dtypes included)."""
    out = [
        name
        for name in ("format", "layout", "pools", "annotations", "settings", "warnings")
        if getattr(a, name) != getattr(b, name)
    ]
    if a.stacks.frames != b.stacks.frames:
        out.append("stacks.frames")
    if a.stacks.stacks != b.stacks.stacks:
        out.append("stacks.stacks")
    if len(a.devices) != len(b.devices):
        return [*out, "devices"]
    for x, y in zip(a.devices, b.devices, strict=True):
        for name in ("device", "segments", "streams", "compile_context", "user_metadata"):
            if getattr(x, name) != getattr(y, name):
                out.append(f"device {x.device}: {name}")
        for col in COLUMNS:
            u, v = getattr(x.trace, col), getattr(y.trace, col)
            if u.dtype != v.dtype or not np.array_equal(u, v):
                out.append(f"device {x.device}: trace.{col}")
    return out


def outcome(source: Any, compiled: bool) -> tuple[str, Any]:
    """('ok', snapshot) or ('refused', 'code: message')."""
    try:
        return "ok", read_snapshot(source, compiled=compiled)
    except SnapshotError as exc:
        return "refused", str(exc)


def test_the_compiled_reader_is_the_default_and_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fastread.ENV_VAR, raising=False)
    assert fastread.wanted(None)
    assert fastread.reader_in_use().startswith("compiled")
    assert not fastread.wanted(False)
    monkeypatch.setenv(fastread.ENV_VAR, "python")
    assert not fastread.wanted(None)
    assert fastread.reader_in_use() == f"python ({fastread.ENV_VAR}=python)"
    calls: list[Any] = []
    monkeypatch.setattr(fastread, "read_compiled", lambda *a: calls.append(a))
    snap = read_snapshot(FIXTURES / "state_only.pickle.gz")
    assert calls == [] and snap.format == "pickle.gz"
    monkeypatch.delenv(fastread.ENV_VAR)
    read_snapshot(FIXTURES / "state_only.pickle.gz")
    assert len(calls) == 1  # the spy returned None: the Python reader read it after all


def test_version_names_the_reader_in_use(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from analysis.__main__ import main

    monkeypatch.delenv(fastread.ENV_VAR, raising=False)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert "snapshot reader: compiled (analysis._snapread)" in " ".join(capsys.readouterr().out.split())
    # Where the extension is not built (no compiler at install time), the Python reader reads everything.
    monkeypatch.setattr(fastread, "_snapread", None)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert "snapshot reader: python (the compiled reader is not built)" in " ".join(capsys.readouterr().out.split())
    assert not fastread.wanted(True)
    assert read_snapshot(FIXTURES / "state_only.pickle.gz").format == "pickle.gz"


@pytest.mark.parametrize("path", TOP + CAPTURES, ids=lambda p: p.name.removesuffix(".pickle.gz"))
def test_every_fixture_reads_identically_through_the_compiled_reader(path: Path) -> None:
    compiled = fastread.read_compiled(path, ReadLimits())
    assert compiled is not None, f"the compiled reader gave up at _snapread.c:{fastread.give_up_line()}"
    reference = read_snapshot(path, compiled=False)
    assert differences(compiled, reference) == []
    assert sum(len(d.trace) for d in compiled.devices) == sum(len(d.trace) for d in reference.devices)


@pytest.mark.parametrize("path", TOP, ids=lambda p: p.name.removesuffix(".pickle.gz"))
def test_the_raw_pickle_reads_identically_from_bytes(path: Path) -> None:
    raw = gzip.decompress(path.read_bytes())
    compiled = fastread.read_compiled(raw, ReadLimits())
    assert compiled is not None and compiled.format == "pickle"
    assert differences(compiled, read_snapshot(raw, compiled=False)) == []


def test_the_big_fixture_has_the_stacks_the_reference_interns() -> None:
    """A real figure: big_all_stacks' stack table, per-event stacks included, from the C bucketing rounds."""
    snap = read_snapshot(FIXTURES / "big_all_stacks.pickle.gz", compiled=True)
    ref = read_snapshot(FIXTURES / "big_all_stacks.pickle.gz", compiled=False)
    assert len(snap.stacks.stacks) == len(ref.stacks.stacks) > 50
    assert len(snap.stacks.frames) == len(ref.stacks.frames)
    stack = snap.devices[0].trace.stack
    assert np.array_equal(stack, ref.devices[0].trace.stack) and (stack >= 0).sum() > 100_000


def _variant(name: str) -> Any:
    """Real snapshots edited into shapes other writers produce (no fixture has them all)."""
    snap = pickle.loads(_raw("frag_oom"))  # our own fixture
    events = snap["device_traces"][0]
    # Pools and streams are drawn per address: a free names its block's stream and pool (the readers
    # refuse a trace whose free names another, issue 22).
    nth: dict[int, int] = {}  # each address's rank of first appearance

    def per_address(e: dict[str, Any]) -> int:
        return nth.setdefault(e.get("addr", 0), len(nth)) % 4

    if name == "pool-ids":  # CUDA-graph pools on events: tuples, lists, None, the default pool
        for e in events:
            e["pool_id"] = [(1, 7), [2, 9], None, (0, 0)][per_address(e)]
    elif name == "texts":  # compile contexts and user metadata that are not the defaults
        for i, e in enumerate(events[::7]):
            e["compile_context"] = f"graph {i % 3} ü"
            e["user_metadata"] = f"step={i}"
    elif name == "no-time":  # torch < 2.2: no time_us anywhere
        for e in events:
            e.pop("time_us")
    elif name == "some-times-none":  # time_us None counts as absent (0)
        for e in events[::3]:
            e["time_us"] = None
    elif name == "no-frames-some":  # absent and empty frames lists among real ones
        for i, e in enumerate(events):
            if i % 5 == 0:
                e.pop("frames", None)
            elif i % 5 == 1:
                e["frames"] = []
    elif name == "unknown-keys":  # a later torch's extra keys, never looked at
        for e in events[::2]:
            e["future"] = {"nested": [1, 2.5, None]}
        snap["future_root"] = [1, 2, 3]
    elif name == "many-streams":
        for e in events:
            e["stream"] = [0, 1, 2**62, 7][per_address(e)]
    return snap


VARIANTS = ["pool-ids", "texts", "no-time", "some-times-none", "no-frames-some", "unknown-keys", "many-streams"]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("name", VARIANTS)
def test_other_shapes_and_protocols_read_identically_by_the_compiled_reader(name: str, protocol: int) -> None:
    """What other writers and protocols produce: read by the compiled reader itself, identical to the reference."""
    data = pickle.dumps(_variant(name), protocol=protocol)
    compiled = fastread.read_compiled(data, ReadLimits())
    assert compiled is not None, f"gave up at _snapread.c:{fastread.give_up_line()}"
    assert differences(compiled, read_snapshot(data, compiled=False)) == []
    device = compiled.devices[0]
    seen = {  # the edit is visible in the snapshot (so the comparison covered it)
        "pool-ids": (1, 7) in compiled.pools and (2, 9) in compiled.pools and int(device.trace.pool.max()) > 0,
        "texts": any(t.startswith("graph 1 ü") for t in device.compile_context.values()) and bool(device.user_metadata),
        "no-time": any(w.code == "no-time" for w in compiled.warnings),
        "some-times-none": int(device.trace.time_us[0]) == 0 and int(device.trace.time_us[1]) > 0,
        "no-frames-some": int(device.trace.stack[0]) == -1 and int(device.trace.stack[1]) == -1,
        "unknown-keys": len(device.trace) > 0,
        "many-streams": sorted(device.streams) == [0, 1, 7, 2**62],
    }
    assert seen[name]


@pytest.mark.parametrize(
    "edit",
    ["negative-stream", "tuple-in-tuple", "deep-unknown-key", "int-past-uint64"],
)
def test_odd_but_readable_values_go_to_the_reference(edit: str) -> None:
    """Values no torch writes, which the reference reads today (and may come to refuse): the compiled
    reader leaves them to it, so a new refusal there needs no change here."""
    snap = _variant("texts")
    event = snap["device_traces"][0][3]
    if edit == "negative-stream":
        event["stream"] = -1
    elif edit == "tuple-in-tuple":
        snap["segments"][0]["future"] = ((1, 2), 3)
    elif edit == "deep-unknown-key":
        deep: Any = 1
        for _ in range(14):
            deep = {"d": deep}
        event["future"] = deep
    else:
        event["future"] = 2**64
    data = pickle.dumps(snap, protocol=4)
    assert fastread.read_compiled(data, ReadLimits()) is None
    assert fastread.give_up_line() > 0
    (c_kind, c_value), (p_kind, p_value) = outcome(data, True), outcome(data, False)
    assert c_kind == p_kind  # read today; whatever the reference comes to say, both say it
    assert differences(c_value, p_value) == [] if c_kind == "ok" else c_value == p_value


EVENT_WALKS = [
    "deep-value",
    "deep-memo-value",
    "oom-device-free",
    "shared-event",
    "event-elsewhere",
    "frames-itself",
    "bad-after-list",
    "frames-elsewhere",
    "frames-holding-itself",
]


@pytest.mark.parametrize("edit", EVENT_WALKS)
def test_event_dicts_the_fast_walk_hands_back_read_as_the_reference_reads_them(edit: str) -> None:
    """An event dict is read by a walk of its own (``event_fast``), without a container; on what it does not
    take it hands the pairs read so far back to the general loop, which must go on as if it had read them
    itself: the snapshot (or the refusal) is the reference's."""
    snap = _variant("texts")
    events = snap["device_traces"][0]
    event = events[3]
    readable = True  # the compiled reader reads it by itself
    if edit == "deep-value":  # a list the walk does not take (read the general way, from its first item)
        event["filename"] = [[[1]]]
    elif edit == "deep-memo-value":  # a GET of a value nested deeper than a frames list: handed back whole
        deep = [[[1]]]
        snap["segments"][0]["future"] = deep  # pickled first: the event GETs it
        event["filename"] = deep
    elif edit == "oom-device-free":  # device_free: set by the general loop
        events.append({**events[-1], "action": "oom", "device_free": 1024, "frames": []})
    elif edit == "shared-event":  # the same dict twice in the trace (a GET of an event read without a container)
        events.append(event)
        readable = False
    elif edit == "event-elsewhere":  # an event dict outside a trace
        snap["extra"] = [event]
        readable = False
    elif edit == "frames-itself":  # a value that is the dict itself (a GET of its memo entry, not yet made)
        event["frames"] = event
        readable = False
    elif edit == "frames-elsewhere":  # an event's frames list (read without a container) outside the trace too
        snap["extra"] = event["frames"]
        readable = False
    elif edit == "frames-holding-itself":  # a frames list whose items GET it (before its memo entry is made)
        event["frames"].append(event["frames"])
        readable = False
    else:  # a value the walk does not take, after a frames list it took
        event["size"] = 2.5
        readable = False
    data = pickle.dumps(snap, protocol=4)
    compiled = fastread.read_compiled(data, ReadLimits())
    assert (compiled is not None) == readable, f"_snapread.c:{fastread.give_up_line()}"
    (c_kind, c_value), (p_kind, p_value) = outcome(data, True), outcome(data, False)
    assert c_kind == p_kind
    assert differences(c_value, p_value) == [] if c_kind == "ok" else c_value == p_value


PAIR_SHAPES = [
    "int-widths",
    "negative-times",
    "negative-size",
    "time-none",
    "key-order",
    "action-text",
    "shared-texts",
    "frames-shared-and-empty",
    "new-streams",
    "texts",
]


def _pair_shapes(edit: str, pad: int) -> Any:
    """frag_oom's events with each pair's value in the shapes a writer may give it (``edit``); ``pad`` bytes of
    a root text first, so that the protocol's frames end at other places in the events."""
    snap = _variant("texts") if edit == "texts" else pickle.loads(_raw("frag_oom"))
    events = snap["device_traces"][0]
    rank: dict[int, int] = {}  # each address's rank of first appearance: the same address stays the same
    widths = [1, 300, 70_000, 2**31 + 5, 2**40 + 7, 2**55 + 3, 2**62 + 9]  # BININT1 to LONG1 of 8 bytes

    def same_per_address(e: dict[str, Any], values: list[Any]) -> Any:
        return values[rank.setdefault(e.get("addr", 0), len(rank)) % len(values)]

    na, empty = "N/A", ""
    for i, e in enumerate(events):
        if edit == "int-widths":
            e["addr"] = same_per_address(e, widths) + 4096 * rank[e.get("addr", 0)] if "addr" in e else 0
            e["size"] = [0, 200, 4000, 100_000, 2**33, 2**62][i % 6]
            e["time_us"] = widths[i % len(widths)] + i
        elif edit == "negative-times" and i % 7 == 5:
            e["time_us"] = -(2 ** (i % 62))
        elif edit == "negative-size" and i == 905:
            e["size"] = -(2**33)
        elif edit == "time-none" and i % 3 == 0:
            e["time_us"] = None
        elif edit == "key-order":
            items = list(e.items())
            e.clear()
            e.update(reversed(items) if i % 2 else items[1:] + items[:1])
        elif edit == "action-text" and i == 700:
            e["action"] = "addr"  # a known string that is no action
        elif edit == "shared-texts":  # one str object each: GETs of the memo instead of N/A MEMOIZE each time
            e["compile_context"], e["user_metadata"] = na, empty
        elif edit == "frames-shared-and-empty" and i:
            if i % 4 == 1:
                e["frames"] = events[i - 1].get("frames", [])
            elif i % 4 == 2:
                e["frames"] = []
        elif edit == "new-streams":
            e["stream"] = same_per_address(e, [0, 1, 300, 2**40])
    snap["a_pad"] = "x" * pad
    return snap


@pytest.mark.parametrize("protocol_pad", [(4, 0), (4, 1), (4, 2), (4, 3), (4, 5), (4, 8), (4, 13), (2, 0)])
@pytest.mark.parametrize("edit", PAIR_SHAPES)
def test_each_pair_shape_reads_as_the_reference(edit: str, protocol_pad: tuple[int, int]) -> None:
    """An event's pairs in torch's shapes are read by a walk of their own (``ev_pairs_fast``), any other by the
    general way of ``event_fast``, and a pair too near its frame's end too: every value shape of every key,
    at several places of the frames' ends, gives the reference's snapshot (or its refusal)."""
    protocol, pad = protocol_pad
    data = pickle.dumps(_pair_shapes(edit, pad), protocol=protocol)
    (c_kind, c_value), (p_kind, p_value) = outcome(data, True), outcome(data, False)
    assert c_kind == p_kind, (c_value, p_value)
    if c_kind == "refused":
        assert c_value == p_value
        return
    assert differences(c_value, p_value) == []
    compiled = fastread.read_compiled(data, ReadLimits())
    assert compiled is not None, f"gave up at _snapread.c:{fastread.give_up_line()}"


def _rewritten_memo_pickle() -> bytes:
    """Events whose frames lists are the same bytes (GETs of the same memo entries), with one of those
    entries overwritten before the last one (BINPUT of another frame dict): no pickler writes that, the
    unpickler honours it, so the last list holds the other frame (the compiled reader must not take
    the list for the one it read before from the same bytes)."""
    import itertools
    import pickletools

    f1, f2, f3 = ({"filename": f"{n}.py", "line": i, "name": n} for i, n in enumerate(("a", "b", "c"), 1))
    event: dict[str, Any] = {"action": "alloc", "size": 512, "stream": 0, "time_us": 1}
    # the first list pickles the frame dicts themselves; the next ones GET them
    events = [{**event, "addr": 512 * k, "frames": [f1, f3]} for k in (1, 2, 3)]
    data = pickle.dumps({"extra": f2, "segments": [], "device_traces": [events]}, protocol=2)
    memo_of: dict[int, int] = {}  # position of an EMPTY_DICT -> its memo id (the BINPUT after it)
    dicts: list[int] = []
    for (op, _arg, pos), (nxt, arg, _) in itertools.pairwise(pickletools.genops(data)):
        if op.name == "EMPTY_DICT" and nxt.name == "BINPUT" and pos is not None and isinstance(arg, int):
            memo_of[pos] = arg
            dicts.append(pos)
    # dict order: root, extra (f2), event 1, f1, f3, event 2, event 3
    f2_id, f1_id, last = memo_of[dicts[1]], memo_of[dicts[3]], dicts[6]
    patch = bytes([ord("h"), f2_id, ord("q"), f1_id, ord("0")])  # BINGET f2, BINPUT over f1's entry, POP
    return data[:last] + patch + data[last:]


def test_a_rewritten_memo_entry_is_read_as_the_unpickler_reads_it() -> None:
    data = _rewritten_memo_pickle()
    snap = read_snapshot(data, compiled=False)
    frames = snap.stacks.frames
    names = [[frames[f].name for f in snap.stacks.stacks[s]] for s in snap.devices[0].trace.stack]
    assert names == [["a", "c"], ["a", "c"], ["b", "c"]]  # the last list reads the rewritten entry
    compiled = fastread.read_compiled(data, ReadLimits())
    assert compiled is not None, f"gave up at _snapread.c:{fastread.give_up_line()}"
    assert differences(compiled, snap) == []


def _long_lists_rewritten_pickle() -> tuple[bytes, list[str]]:
    """Five events with the same long frames list (the reader's guess of the span finds it from the third
    on), one of its frame entries overwritten before the last (as in _rewritten_memo_pickle); and the
    frame names the last event's list holds as the unpickler reads it."""
    import itertools
    import pickletools

    frames = [{"filename": f"{i}.py", "line": i, "name": f"n{i}"} for i in range(30)]
    other = {"filename": "o.py", "line": 99, "name": "other"}
    event: dict[str, Any] = {"action": "alloc", "size": 512, "stream": 0, "time_us": 1}
    events = [{**event, "addr": 512 * k, "frames": list(frames)} for k in range(1, 6)]
    data = pickle.dumps({"extra": other, "segments": [], "device_traces": [events]}, protocol=2)
    memo_of: dict[int, int] = {}  # position of an EMPTY_DICT -> its memo id (the PUT after it)
    dicts: list[int] = []
    for (op, _arg, pos), (nxt, arg, _) in itertools.pairwise(pickletools.genops(data)):
        if op.name == "EMPTY_DICT" and nxt.name in ("BINPUT", "LONG_BINPUT") and pos is not None:
            assert isinstance(arg, int)
            memo_of[pos] = arg
            dicts.append(pos)
    # dict order: root, extra, event 1, its 30 frames, events 2-5
    other_id, f3_id, last = memo_of[dicts[1]], memo_of[dicts[3 + 3]], dicts[-1]
    patch = b"h" + bytes([other_id]) + b"r" + f3_id.to_bytes(4, "little") + b"0"  # BINGET, LONG_BINPUT, POP
    names = [f["name"] for f in frames]
    names[3] = "other"
    return data[:last] + patch + data[last:], names


def test_a_rewritten_memo_entry_is_not_guessed_past() -> None:
    """The span guessed from the lists before is not taken once a memo entry was overwritten: the last list
    holds the other frame."""
    data, last_names = _long_lists_rewritten_pickle()
    snap = read_snapshot(data, compiled=False)
    frames = snap.stacks.frames
    names = [[frames[f].name for f in snap.stacks.stacks[s]] for s in snap.devices[0].trace.stack]
    assert names[-1] == last_names and names[0] != last_names
    compiled = fastread.read_compiled(data, ReadLimits())
    assert compiled is not None, f"gave up at _snapread.c:{fastread.give_up_line()}"
    assert differences(compiled, snap) == []


def test_frames_lists_alike_where_the_guess_looks_read_as_the_reference() -> None:
    """Frames lists that share the bytes the reader's guess of a span is keyed by (its first 16 and bytes
    32-47) and the list before them, and differ after those (at their end, or by one frame more): each is
    read as itself, not as the one guessed."""
    frames = [{"filename": f"f{i}.py", "line": i, "name": f"fn{i}"} for i in range(300)]
    base = [frames[j] for j in range(260, 280)]  # GETs of 5 bytes: ids past 255
    a = [frames[j] for j in range(280, 300)]
    lists = [base, [*base[:-1], frames[0]], [*base, frames[1]], base[:12], [*base[:12], frames[2]]]
    order = [i for k in range(40) for i in (0, 1 + k % 4, 0, 1 + (k * 3) % 4)]
    events: list[dict[str, Any]] = []
    for k, li in enumerate(order):
        for fl in (a, lists[li]):  # the same list before each
            events.append({"action": "alloc", "addr": 512 * (len(events) + 1), "size": 512, "stream": 0, "time_us": k})
            events[-1]["frames"] = list(fl)  # a new list: its GETs, not a GET of it
    data = pickle.dumps({"extra": frames, "segments": [], "device_traces": [events]}, protocol=4)
    compiled = fastread.read_compiled(data, ReadLimits())
    assert compiled is not None, f"gave up at _snapread.c:{fastread.give_up_line()}"
    assert differences(compiled, read_snapshot(data, compiled=False)) == []
    stacks = compiled.stacks
    names = [[stacks.frames[f].name for f in stacks.stacks[s]] for s in compiled.devices[0].trace.stack]
    assert names == [[f["name"] for f in fl] for li in order for fl in (a, lists[li])]


def test_frames_lists_past_the_span_pool_read_as_the_reference() -> None:
    """More distinct frames lists than the reader's pool of their bytes holds (64 KiB; later ones are
    compared with their bytes in the file): each list met again, early and late ones, interleaved,
    reads as the reference reads it."""
    frames = [{"filename": f"f{i}.py", "line": i, "name": f"fn{i}"} for i in range(400)]
    rng = random.Random(7)  # noqa: S311 - reproducible lists
    # 500 distinct lists of 40 GETs (~200 bytes of GETs each: ~100 KB, past the pool)
    lists = [[frames[j] for j in rng.sample(range(400), 40)] for _ in range(500)]
    events: list[dict[str, Any]] = []
    order = list(range(500)) + [rng.randrange(500) for _ in range(3000)]
    for k, li in enumerate(order):
        events.append(
            {
                "action": "alloc",
                "addr": 512 * (k + 1),
                "size": 512,
                "stream": 0,
                "time_us": k,
                "frames": list(lists[li]),
            }
        )  # a new list: its GETs, not a GET of it
    data = pickle.dumps({"segments": [], "device_traces": [events]}, protocol=4)
    compiled = fastread.read_compiled(data, ReadLimits())
    assert compiled is not None, f"gave up at _snapread.c:{fastread.give_up_line()}"
    ref = read_snapshot(data, compiled=False)
    assert differences(compiled, ref) == []
    stacks = compiled.stacks
    names = [[stacks.frames[f].name for f in stacks.stacks[s]] for s in compiled.devices[0].trace.stack]
    assert names == [[f["name"] for f in lists[li]] for li in order]


@pytest.mark.parametrize("seed", range(4))
def test_frames_lists_that_share_their_buckets_intern_as_the_reference(seed: int) -> None:
    """The bucketing rounds on the reader's sequences: lists that share their middle frame dict and length
    but not their content (a bucket, then the next round's, and more), lists alike in content but made of
    other dicts (one class, several sequences), each met again in runs and out of order: the stack table
    and every event's stack interned in the reference's order."""
    rng = random.Random(seed)  # noqa: S311 - reproducible lists
    content = [(f"f{i % 7}.py", i % 5, f"fn{i % 3}") for i in range(12)]
    # two dicts of each content: lists of the one or the other are one class, two sequences
    dicts = [{"filename": f, "line": ln, "name": nm} for f, ln, nm in content for _ in range(2)]
    middle = dicts[0]
    lists: list[list[dict[str, Any]]] = []
    for _ in range(60):
        k = rng.choice((3, 5))
        fl = [rng.choice(dicts) for _ in range(k)]
        fl[k // 2] = middle if rng.random() < 0.7 else rng.choice(dicts)  # most in one bucket per length
        lists.append(fl)
    order = [rng.randrange(len(lists)) for _ in range(400)]
    order = [li for li in order for _ in range(rng.choice((1, 1, 2, 3)))]  # runs of the same list
    events = [
        {"action": "alloc", "addr": 512 * (k + 1), "size": 512, "stream": 0, "time_us": k, "frames": list(lists[li])}
        for k, li in enumerate(order)
    ]
    events[rng.randrange(len(events))]["frames"] = []  # an event without frames amid the runs
    data = pickle.dumps({"extra": dicts, "segments": [], "device_traces": [events]}, protocol=4)
    compiled = fastread.read_compiled(data, ReadLimits())
    assert compiled is not None, f"gave up at _snapread.c:{fastread.give_up_line()}"
    assert differences(compiled, read_snapshot(data, compiled=False)) == []


@pytest.mark.parametrize("tail", [[2**40], [2**40, 3], [{"x": 1}], [[]]])
def test_a_trace_list_of_events_then_something_else_goes_to_the_reference(tail: list[Any]) -> None:
    """A trace list holds its events as a first record and a count: what follows them in a later batch of the
    pickler (APPEND or APPENDS after 1000 events) is given up on, and the reference says what it is."""
    snap = _variant("texts")
    events = snap["device_traces"][0]
    while len(events) < 1000:
        events.extend(dict(e) for e in events[: 1000 - len(events)])
    events.extend(tail)
    data = pickle.dumps(snap, protocol=4)
    assert fastread.read_compiled(data, ReadLimits()) is None
    (c_kind, c_value), (p_kind, p_value) = outcome(data, True), outcome(data, False)
    assert (c_kind, c_value if c_kind == "refused" else None) == (p_kind, p_value if p_kind == "refused" else None)


HOSTILE = build_cases(Path("/nonexistent/canary"))  # the payloads never run here: nothing is unpickled by pickle


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_compiled_reader_gives_every_hostile_case_to_the_reference(name: str) -> None:
    """It never accepts what the reference refuses: it gives up (the reference then refuses,
    with the code the hostile suite checks, tests/analysis/test_hostile.py)."""
    case = HOSTILE[name]
    limits = ReadLimits(**case.limits)
    assert fastread.read_compiled(case.data, limits) is None


@cache
def _raw(name: str) -> bytes:
    return gzip.decompress((FIXTURES / f"{name}.pickle.gz").read_bytes())


FUZZ_SEEDS = ["state_only", "frag_oom", "gpu_cuda_graph", "gpu_side_stream", "gpu_roundup_list", "no_context"]
# make test: 20 s of the same seeded cases; a longer hunt: OOMSCOPE_READER_FUZZ_SECONDS=600 OOMSCOPE_READER_FUZZ_SEED=7
FUZZ_SECONDS = float(os.environ.get("OOMSCOPE_READER_FUZZ_SECONDS", "20"))
FUZZ_SEED = int(os.environ.get("OOMSCOPE_READER_FUZZ_SEED", "21"))
FUZZ_MAX_CASES = 3000 if "OOMSCOPE_READER_FUZZ_SECONDS" not in os.environ else 10**9


@pytest.fixture
def address_space_cap() -> Iterator[None]:
    """RLIMIT_AS = this process's size + 2 GiB while the fuzz runs, as the hostile suite does: a mutant can
    ask CPython's unpickler (the reference) for a memo of 2**32 entries, which it then fills. Under the cap
    that is a MemoryError (``snapshot:limit:memory``) instead of the machine's OOM killer."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    status = Path("/proc/self/status").read_text().splitlines()
    size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
    cap = size + (2 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_fuzz_both_readers_agree_on_mutated_real_snapshots(address_space_cap: None) -> None:
    """Seeded: the same mutants each run; bounded by FUZZ_SECONDS (and 3000 cases unless it is set)."""
    from tests.webapp.test_hardening_fuzz import mutate, mutate_tree

    rng = random.Random(FUZZ_SEED)  # noqa: S311 - reproducible mutations
    started = time.monotonic()
    seen = {"ok": 0, "refused": 0}
    cases = 0
    while time.monotonic() - started < FUZZ_SECONDS and cases < FUZZ_MAX_CASES:
        name = rng.choice(FUZZ_SEEDS)
        seed = rng.getrandbits(32)
        steps = rng.randint(1, 6)
        kind = rng.choice(("bytes", "gzip", "tree"))
        mrng = random.Random(seed)  # noqa: S311
        if kind == "tree":
            data, done = mutate_tree(_raw(name), mrng, steps)
        else:
            data, done = mutate(gzip.compress(_raw(name), 1) if kind == "gzip" else _raw(name), mrng, steps)
        (c_kind, c_value), (p_kind, p_value) = outcome(data, True), outcome(data, False)
        where = f"{name} seed={seed} steps={steps} {kind}: {done}"
        assert c_kind == p_kind, f"{where}: compiled {c_kind} {c_value if c_kind == 'refused' else ''}, python {p_kind}"
        if c_kind == "ok":
            assert differences(c_value, p_value) == [], where
        else:
            assert c_value == p_value, where
        seen[c_kind] += 1
        cases += 1
    # Both outcomes were exercised (a fuzz that only ever refuses compares no columns).
    assert seen["ok"] > 10 and seen["refused"] > 10, seen


_DIGEST = """
import hashlib, sys
from analysis import fastread
from analysis.reader import read_snapshot
h = hashlib.sha256()
for path in sys.argv[1:]:
    snap = read_snapshot(path)
    for dev in snap.devices:
        for name in ("action", "addr", "size", "stream", "time_us", "stack"):
            h.update(getattr(dev.trace, name).tobytes())
print(fastread.inflater(), h.hexdigest())
"""


def test_libdeflate_and_zlib_inflate_the_same_columns() -> None:
    # libdeflate (where the machine has libdeflate.so.0) inflates one-member files that fit the caps; zlib
    # everything else. OOMSCOPE_NO_LIBDEFLATE, read when the module loads, keeps zlib for all: the columns
    # must not depend on which inflated them. Mutated .gz files go through both in the fuzz above.
    import subprocess
    import sys

    files = [str(FIXTURES / f"{n}.pickle.gz") for n in ("big_all_stacks", "frag_oom", "gpu_cuda_graph")]
    runs = {}
    for env in ({}, {"OOMSCOPE_NO_LIBDEFLATE": "1"}):
        out = subprocess.run(
            [sys.executable, "-c", _DIGEST, *files],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout.split()
        runs["zlib only" if env else "default"] = out
    assert runs["zlib only"][0] == "zlib"
    assert runs["default"][0] in ("libdeflate", "zlib")
    assert runs["default"][1] == runs["zlib only"][1]


@pytest.mark.parametrize("suffix", [".pickle", ".pickle.gz"])
def test_pages_made_present_ahead_change_no_column(suffix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The reader's helper thread makes the pages of its arrays (and of the gunzip's output) present
    # ahead of the parse (analysis/_snapread.c, "the prefaulter"), for inputs of 16 MiB and more: the
    # big fixture is 28 MiB raw. It writes no byte: the snapshot is the same with and without it, and
    # the same as the Python reader's.
    from analysis import _snapread  # type: ignore[attr-defined]

    gz = (FIXTURES / "big_all_stacks.pickle.gz").read_bytes()
    data = gz if suffix == ".pickle.gz" else gzip.decompress(gz)
    assert len(gzip.decompress(gz)) >= 16 << 20
    monkeypatch.delenv("OOMSCOPE_NO_PREFAULT", raising=False)
    # How much it made depends on when the helper got a CPU (on a loaded box, maybe not before a
    # 30 ms parse ended): a few tries for it to have run at all.
    for _ in range(5):
        ahead = read_snapshot(data, compiled=True)
        if _snapread.prefaulted() > 0:
            break
    assert _snapread.prefaulted() > 0
    monkeypatch.setenv("OOMSCOPE_NO_PREFAULT", "1")
    faulted = read_snapshot(data, compiled=True)
    assert _snapread.prefaulted() == 0
    assert differences(ahead, faulted) == []
    assert differences(ahead, read_snapshot(data, compiled=False)) == []
