"""The reference converter: a loaded snapshot's object graph to the columnar model, the schema checked on the way.

Schema checks ride on the conversion, which touches every event anyway: columns are built
with C-level ``map`` passes and checked with ``set(map(type, ...))`` and numpy, not in a
separate generic walk. The converter charges every event, key and frame it would expand
*before* touching them, against the expansion budget (``unpickler.node_budget``: a memo DAG of
a few hundred bytes can stand for 2**60 nodes), and never descends into anything the schema
does not expect; where a value has the wrong type, ``schemacheck.diagnose`` says whether it is
a cycle, too deep or a bomb. Every refusal is a ``SnapshotError`` with a stable code
(docs/reader.md lists them). The compiled reader converts with this class too, its
``convert_trace`` replaced (``fastread._ColumnsConverter``).
"""

from __future__ import annotations

import contextlib
import math
import operator
from itertools import repeat
from typing import Any

import numpy as np

from analysis.errors import LimitError, SchemaError, SnapshotError
from analysis.model import (
    ACTION_CODE,
    BLOCK_STATES,
    DEFAULT_POOL,
    OOM,
    SEGMENT_TYPES,
    AllocatorSettings,
    Annotation,
    Block,
    DeviceData,
    Frame,
    Segment,
    Snapshot,
    StackTable,
    Trace,
    Warning_,
)
from analysis.schemacheck import (
    I64_MAX,
    I64_MIN,
    check_int_range,
    check_stream_count,
    check_trace_columns,
    diagnose,
    is_scalar,
    short_repr,
)
from analysis.unpickler import ReadLimits

_MISSING: Any = object()
_NO_FRAMES: list[Any] = []  # stands for an absent ``frames`` key (len 0, never interned)


def _kind(value: Any) -> str:
    return type(value).__name__


class Converter:
    """A loaded snapshot (its root) to the columnar model: ``Converter(fmt, budget, limits).run(root)``."""

    def __init__(self, fmt: str, budget: int, limits: ReadLimits) -> None:
        self.fmt = fmt
        self.budget = budget
        self.used = 0
        self.limits = limits
        self.table = StackTable()
        self.frame_by_id: dict[int, int] = {}
        self.frame_by_value: dict[tuple[str, int, str], int] = {}
        self.stack_by_fids: dict[tuple[int, ...], int] = {}
        self.stack_nodes: list[int] = []  # per interned stack: the values of its frame dicts
        self.list_cache: dict[int, int] = {}  # id(frames list) -> stack id (graph stays alive meanwhile)
        self.pools: list[tuple[int, int]] = [DEFAULT_POOL]
        self.pool_ids: dict[tuple[int, int], int] = {DEFAULT_POOL: 0}
        self.warnings: list[Warning_] = []
        self.saw_event_frames = False
        self.saw_any_frames = False
        self.missing_requested = False

    # -- budget and diagnosis ------------------------------------------------
    def charge(self, nodes: int) -> None:
        self.used += int(nodes)
        if self.used > self.budget:
            raise LimitError(
                "expansion",
                f"the object graph expands past {self.budget} nodes ({self.limits.nodes_per_byte} per file byte): "
                "a memo bomb, not a snapshot",
            )

    def bad(self, where: str, value: Any, expected: str, reason: str = "wrong-type") -> SnapshotError:
        """The error for a schema violation, unless the value is a bomb or cycle."""
        structural = diagnose(value, self.limits.max_depth, self.budget)
        if structural is not None:
            return structural
        if isinstance(value, float) and not math.isfinite(value):
            return SchemaError("non-finite", f"{where}: {value!r} where {expected} is expected")
        return SchemaError(reason, f"{where}: expected {expected}, got {_kind(value)} {short_repr(value)}")

    # -- driver ---------------------------------------------------------------
    def run(self, root: Any) -> Snapshot:
        if isinstance(root, list):
            layout = "segments-only"
            segments_raw: Any = root
            traces_raw: Any = []
            settings_raw: Any = _MISSING
            annotations_raw: Any = []
            self.charge(1)
        elif isinstance(root, dict):
            self.charge(1 + len(root))
            if "segments" not in root:
                raise SchemaError("missing-key", "the top-level dict has no 'segments' key: not a memory snapshot")
            segments_raw = root["segments"]
            traces_raw = root.get("device_traces", [])
            settings_raw = root.get("allocator_settings", _MISSING)
            annotations_raw = root.get("external_annotations", [])
            layout = "modern"
        else:
            raise self.bad("top level", root, "a dict or a list of segments", "root-type")
        for where, value in (
            ("segments", segments_raw),
            ("device_traces", traces_raw),
            ("external_annotations", annotations_raw),
        ):
            if type(value) is not list:
                raise self.bad(where, value, "a list")
        self.charge(len(segments_raw) + len(traces_raw) + len(annotations_raw))
        for i, t in enumerate(traces_raw):
            if type(t) is not list:
                raise self.bad(f"device_traces[{i}]", t, "a list of events")

        segments_by_device = self.convert_segments(segments_raw)
        if layout == "modern" and self.saw_history:
            layout = "history"
        ordinals = sorted(set(segments_by_device) | set(range(len(traces_raw))))
        devices = []
        for k, dev in enumerate(ordinals):
            # Checked device by device, so that a file whose traces share one huge list is refused
            # for its expansion (what it is) before its count of devices.
            if k == self.limits.max_devices:
                raise LimitError("devices", f"{len(ordinals):,} devices (at most {self.limits.max_devices} are read)")
            events = traces_raw[dev] if dev < len(traces_raw) else []
            trace, streams, cc, um = self.convert_trace(dev, events)
            segs = segments_by_device.get(dev, [])
            finished = [self.finish_segment(s, streams) for s in segs]
            if len(streams) * len(self.pools) > self.limits.max_stream_pools:
                raise LimitError(
                    "streams",
                    f"device {dev}: {len(streams):,} streams x {len(self.pools):,} memory pools (at most "
                    f"{self.limits.max_stream_pools:,} pairs are read)",
                )
            devices.append(DeviceData(dev, trace, finished, streams, cc, um))
        annotations = self.convert_annotations(annotations_raw)
        settings = self.convert_settings(settings_raw)
        self.add_warnings(layout, devices, settings)
        return Snapshot(self.fmt, layout, devices, self.pools, self.table, annotations, settings, self.warnings)

    # -- frames and stacks -----------------------------------------------------
    def frame_id(self, f: Any, where: str) -> int:
        fid = self.frame_by_id.get(id(f))
        if fid is not None:
            return fid
        if type(f) is not dict:
            raise self.bad(where, f, "a frame dict")
        filename, line, name = f.get("filename", _MISSING), f.get("line", _MISSING), f.get("name", _MISSING)
        if filename is _MISSING or line is _MISSING or name is _MISSING:
            raise SchemaError("missing-key", f"{where}: a frame needs filename, line and name")
        if type(filename) is not str or type(name) is not str:
            raise self.bad(where, filename if type(filename) is not str else name, "a str")
        if type(line) is not int:
            raise self.bad(f"{where}.line", line, "an int")
        if line.bit_length() > 64:  # a 4,300-digit line cannot even be printed (issue 22)
            # 64 bits, not int64: torch writes an unknown line as 2**64 - 1 (compiled_train).
            raise SchemaError("int-range", f"{where}.line: {short_repr(line)} does not fit in 64 bits")
        key = (filename, line, name)
        fid = self.frame_by_value.get(key)
        if fid is None:
            fid = self.frame_by_value[key] = len(self.table.frames)
            self.table.frames.append(Frame(filename, line, name))
        self.frame_by_id[id(f)] = fid
        return fid

    def stack_of(self, frames: Any, where: str) -> int:
        """Intern one frames list (slow path: segments, blocks, odd events)."""
        if frames is _NO_FRAMES:
            return -1
        sid = self.list_cache.get(id(frames))
        if sid is not None:
            return sid
        if type(frames) is not list:
            raise self.bad(where, frames, "a list of frames")
        self.charge(len(frames))
        if not frames:
            return -1
        self.saw_any_frames = True
        fids = tuple(self.frame_id(f, f"{where}[{k}]") for k, f in enumerate(frames))
        sid = self.stack_by_fids.get(fids)
        if sid is None:
            sid = self.stack_by_fids[fids] = len(self.table.stacks)
            self.table.stacks.append(fids)
            self.stack_nodes.append(sum(map(len, frames)))  # the frames' values (the list's own refs are charged apart)
        self.list_cache[id(frames)] = sid
        return sid

    def intern_event_stacks(self, frames: list[Any], where: str) -> np.ndarray:
        """Stack ids of one trace's frames lists, fast.

        Real files share frame dicts but not lists (1.6M distinct lists for 124
        stacks in the 460 MB file). Lists are bucketed by (length, id of the
        middle frame) and each is matched against its bucket's representative
        with one C-level ``==``, which short-circuits on identical elements;
        lists that differ from their representative form the next round. A
        representative is always checked and interned by ``stack_of`` first, so
        anything accepted equals a validated list of frame dicts (a list never
        equals a non-list). What is left after a few rounds is interned one by one.
        """
        n = len(frames)
        out = np.full(n, -1, np.int32)
        try:
            lens = np.fromiter(map(len, frames), np.int64, n)
        except TypeError:
            i = next(k for k, f in enumerate(frames) if type(f) is not list)
            raise self.bad(f"{where}[{i}].frames", frames[i], "a list of frames") from None
        self.charge(int(lens.sum()))  # before any comparison: the work below is bounded by it
        idx = np.flatnonzero(lens)
        if idx.size < n and n - idx.size != frames.count(_NO_FRAMES):
            # Some zero-length value is not an (absent or empty) list: a str, dict or tuple.
            i = next(k for k, f in enumerate(frames) if type(f) is not list and not f)
            raise self.bad(f"{where}[{i}].frames", frames[i], "a list of frames")
        if idx.size == 0:
            return out
        self.saw_event_frames = self.saw_any_frames = True
        lists = frames if idx.size == n else list(map(frames.__getitem__, idx.tolist()))
        del frames
        # Neighbouring events often carry equal lists (a free right after its
        # alloc, a loop's repeats: 64% in the 460 MB file). One pass comparing
        # each list with the one before leaves only the heads of such runs to
        # bucket; every other list equals its head, which is checked below.
        run_head = np.ones(len(lists), np.bool_)
        if len(lists) > 1:
            # Deeply nested values, not frames, raise RecursionError: the checks below name the first one.
            with contextlib.suppress(RecursionError):
                run_head[1:] = ~np.fromiter(map(operator.eq, lists[1:], lists[:-1]), np.bool_, len(lists) - 1)
        heads = np.flatnonzero(run_head)
        run_of = np.cumsum(run_head) - 1
        del run_head
        if heads.size < len(lists):
            lists = list(map(lists.__getitem__, heads.tolist()))
            idx = idx[heads]
        m = len(lists)
        sub_lens = lens[idx]
        try:
            middle = np.fromiter(map(id, map(operator.getitem, lists, (sub_lens // 2).tolist())), np.int64, m)
        except (TypeError, KeyError, IndexError):
            middle = np.zeros(m, np.int64)  # a non-list somewhere: the rounds below refuse it
        # One int64 per (middle frame, length) pair: object addresses are below
        # 2**48, so no two pairs share a key unless both lengths pass 255 (that
        # only merges buckets, which == splits again). Buckets are thus made by
        # the file's content, not by where objects happen to sit in memory.
        keys = (middle << 8) | np.minimum(sub_lens, 255)
        del middle
        pending = np.arange(m)
        sids = np.full(m, -1, np.int64)
        for _round in range(8):
            if pending.size == 0:
                break
            _, rep_pos, inverse = np.unique(keys[pending], return_index=True, return_inverse=True)
            inverse = inverse.reshape(-1)
            reps = [lists[int(pending[p])] for p in rep_pos]
            # Interned in the order the trace first uses them (np.unique orders by
            # key, i.e. by address): stack and frame ids are then the same on every read.
            rep_sid = np.zeros(len(reps), np.int64)
            for k in np.argsort(rep_pos, kind="stable").tolist():
                rep_sid[k] = self.stack_of(reps[k], f"{where}[{int(idx[pending[rep_pos[k]]])}].frames")
            members = lists if pending.size == m else list(map(lists.__getitem__, pending.tolist()))
            try:
                same = np.fromiter(
                    map(operator.eq, members, map(reps.__getitem__, inverse.tolist())), np.bool_, pending.size
                )
            except RecursionError:
                # Frames that differ only in deeply nested extra values (a dict a million deep under
                # a key the reader ignores): == recurses into them. Intern these one by one below,
                # by their frames' filename, line and name only (issue 22: was RecursionError).
                break
            sids[pending[same]] = rep_sid[inverse[same]]
            pending = pending[~same]
        for i in pending.tolist():
            sids[i] = self.stack_of(lists[i], f"{where}[{int(idx[i])}].frames")
        out[np.flatnonzero(lens)] = sids[run_of]
        return out

    # -- pools and numbers --------------------------------------------------------
    def pool_of(self, value: Any, where: str) -> int:
        if value is None or value is _MISSING:
            return 0
        if type(value) not in (tuple, list) or len(value) != 2 or any(type(v) is not int for v in value):
            raise self.bad(where, value, "a pool id (a pair of ints)", "bad-pool-id")
        key = (int(value[0]), int(value[1]))
        pid = self.pool_ids.get(key)
        if pid is None:
            if len(self.pools) >= self.limits.max_pools:
                raise LimitError("pools", f"{where}: more than {self.limits.max_pools:,} memory pools")
            pid = self.pool_ids[key] = len(self.pools)
            self.pools.append(key)
        return pid

    def int_field(
        self, d: dict[str, Any], key: str, where: str, *, default: Any = _MISSING, nonneg: bool = False
    ) -> int:
        value = d.get(key, default)
        if value is _MISSING:
            raise SchemaError("missing-key", f"{where}: missing '{key}'")
        if type(value) is not int:
            raise self.bad(f"{where}.{key}", value, "an int")
        if not I64_MIN <= value <= I64_MAX:
            reason = "address-range" if key in ("address", "addr") else "int-range"
            raise SchemaError(reason, f"{where}.{key}: {short_repr(value)} does not fit in int64")
        if nonneg and value < 0:
            reason = "address-range" if key in ("address", "addr") else "negative-size"
            raise SchemaError(reason, f"{where}.{key}: {value} is negative")
        return value

    def choice_field(self, d: dict[str, Any], key: str, where: str, allowed: Any, unknown: str) -> str:
        """A required str field that must be one of ``allowed`` (a segment's type, a block's state); ``unknown``:
        the reason code for any other str."""
        value = d.get(key, _MISSING)
        if value is _MISSING:
            raise SchemaError("missing-key", f"{where}: missing '{key}'")
        if type(value) is not str:
            raise self.bad(f"{where}.{key}", value, "a str")
        if value not in allowed:
            raise SchemaError(unknown, f"{where}.{key}: {short_repr(value)}")
        return value

    def int_column(self, values: list[Any], where: str, key: str, *, nonneg: bool = False) -> np.ndarray:
        """Check a column of Python ints and turn it into int64, fast."""
        n = len(values)
        if not set(map(type, values)) <= {int}:
            i = next(k for k, v in enumerate(values) if type(v) is not int)
            if values[i] is None:
                raise SchemaError("missing-key", f"{where}[{i}]: missing '{key}'")
            raise self.bad(f"{where}[{i}].{key}", values[i], "an int")
        try:
            arr = np.fromiter(values, np.int64, n)
        except OverflowError:
            i = next(k for k, v in enumerate(values) if not I64_MIN <= v <= I64_MAX)
            reason = "address-range" if key in ("address", "addr") else "int-range"
            raise SchemaError(reason, f"{where}[{i}].{key}: {short_repr(values[i])} does not fit in int64") from None
        if nonneg and n and int(arr.min()) < 0:
            i = int(np.flatnonzero(arr < 0)[0])
            reason = "address-range" if key in ("address", "addr") else "negative-size"
            raise SchemaError(reason, f"{where}[{i}].{key}: {values[i]} is negative")
        return arr

    # -- trace ---------------------------------------------------------------------
    def convert_trace(self, dev: int, events: list[Any]) -> tuple[Trace, list[int], dict[int, str], dict[int, str]]:
        """One device's events to columns: one C-level pass per key, checks on the columns."""
        where = f"device_traces[{dev}]"
        n = len(events)
        # One node per event: the work below is a fixed number of look-ups per
        # event (keys are never iterated), plus the frames charged on interning.
        self.charge(n)
        if n == 0:
            return Trace.empty(), [], {}, {}
        get = dict.get
        cols, only_event_keys = _event_columns(events)

        def column(k: int, default: Any = None) -> list[Any]:
            """One key's values; a column from the one-pass extraction is handed over (and freed with it)."""
            if cols is None:
                return list(map(get, events, repeat(_EVENT_KEYS[k]), repeat(default)))
            values = cols[k]
            cols[k] = []
            return values

        try:
            actions_read = column(0)
            # Only strs are looked up: hashing a value hashes it whole, and a tuple nested a
            # million deep crashes CPython's C stack (issue 22), where a type never does.
            if not set(map(type, actions_read)) <= {str}:
                raise TypeError
            action = np.fromiter(map(ACTION_CODE.__getitem__, actions_read), np.int8, n)
        except (KeyError, TypeError):
            if not all(type(e) is dict for e in events):  # dict.get on a non-dict
                i = next(k for k, e in enumerate(events) if type(e) is not dict)
                raise self.bad(f"{where}[{i}]", events[i], "an event dict") from None
            actions = list(map(get, events, repeat("action")))
            i = next(k for k, a in enumerate(actions) if type(a) is not str or a not in ACTION_CODE)
            if actions[i] is None:
                raise SchemaError("missing-key", f"{where}[{i}]: missing 'action'") from None
            if type(actions[i]) is not str:
                raise self.bad(f"{where}[{i}].action", actions[i], "a str") from None
            raise SchemaError(
                "unknown-action", f"{where}[{i}].action: unknown action {short_repr(actions[i])}"
            ) from None

        addrs = column(1)
        for i in np.flatnonzero(action == OOM).tolist():
            # The oom entry has no address; the model keeps its device_free there.
            addrs[i] = events[i].get("device_free")
            if addrs[i] is None:
                raise SchemaError("missing-key", f"{where}[{i}]: an oom event needs 'device_free'")
        addr = self.int_column(addrs, where, "addr", nonneg=True)
        del addrs
        size = self.int_column(column(2), where, "size", nonneg=True)
        stream_values = column(3)
        # Types first: only ints are hashed (a nested tuple would crash the hash, see above).
        if not set(map(type, stream_values)) <= {int}:
            self.int_column(stream_values, where, "stream")  # raises with the event's index
        order = dict.fromkeys(stream_values)  # a few distinct streams, in order of first appearance
        check_stream_count(self.limits, len(order), where)

        times = column(4)
        absent = times.count(None)
        if absent == n:
            time_us = np.zeros(n, np.int64)
            self.no_time = True
        else:
            if absent:
                times = [0 if t is None else t for t in times]
            time_us = self.int_column(times, where, "time_us")
        del times

        stack = self.intern_event_stacks(column(5, _NO_FRAMES), where)
        if self.stack_nodes:
            counts = np.bincount(stack[stack >= 0], minlength=len(self.stack_nodes))
            self.charge(int(counts @ np.asarray(self.stack_nodes, np.int64)))

        pool_values = None if only_event_keys else list(map(get, events, repeat("pool_id")))
        if pool_values is None or pool_values.count(None) == n:
            pool = np.zeros(n, np.int32)
        else:
            pool = self.pool_column(pool_values, where)
        del pool_values

        cc = self.sparse_text(events, "compile_context", "N/A", where, None if cols is None else column(6))
        um = self.sparse_text(events, "user_metadata", "", where, None if cols is None else column(7))

        # Stream ordinals in order of first appearance (dict keeps insertion order).
        streams = list(order)
        if not all(I64_MIN <= v <= I64_MAX for v in streams):
            self.int_column(stream_values, where, "stream")
        if len(streams) == 1:
            stream = np.zeros(n, np.int32)
        else:
            rank = {s: k for k, s in enumerate(streams)}
            stream = np.fromiter(map(rank.__getitem__, stream_values), np.int32, n)
        check_trace_columns(self.limits, action, addr, stream, pool, streams, where)
        trace = Trace(action=action, addr=addr, size=size, stream=stream, time_us=time_us, stack=stack, pool=pool)
        return trace, streams, cc, um

    def pool_column(self, values: list[Any], where: str) -> np.ndarray:
        # Each value is checked to be None or a pair of ints before anything hashes it (a nested
        # tuple would crash the hash); JSON has no tuples, so a list pair is read as one.
        values = [tuple(v) if type(v) is list else v for v in values]
        for i, v in enumerate(values):
            if v is not None and not (type(v) is tuple and len(v) == 2 and type(v[0]) is int and type(v[1]) is int):
                raise self.bad(f"{where}[{i}].pool_id", v, "a pool id (a pair of ints)", "bad-pool-id")
        distinct = dict.fromkeys(values)
        ordinal = {}
        for v in distinct:
            i = values.index(v)
            ordinal[v] = self.pool_of(v, f"{where}[{i}].pool_id")
        return np.fromiter(map(ordinal.__getitem__, values), np.int32, len(values))

    def sparse_text(
        self, events: list[dict[str, Any]], key: str, default: str, where: str, values: list[Any] | None = None
    ) -> dict[int, str]:
        """``{event index: text}`` where ``key`` is not ``default`` (``values``: the column, if already read)."""
        if values is None:
            if _all_default(events, key, default):
                return {}
            values = list(map(dict.get, events, repeat(key), repeat(default)))
        elif _all_default_values(values, default):
            return {}
        out: dict[int, str] = {}
        for i, v in enumerate(values):
            if type(v) is not str:
                raise self.bad(f"{where}[{i}].{key}", v, "a str")
            if v != default:
                out[i] = v
        return out

    # -- segments --------------------------------------------------------------------
    saw_history = False
    no_time = False

    def convert_segments(self, segments: list[Any]) -> dict[int, list[tuple[Any, ...]]]:
        """Check and convert segments; stream ordinals are resolved per device later."""
        by_device: dict[int, list[tuple[Any, ...]]] = {}
        for si, s in enumerate(segments):
            where = f"segments[{si}]"
            if type(s) is not dict:
                raise self.bad(where, s, "a segment dict")
            self.charge(len(s))
            device = self.int_field(s, "device", where, nonneg=True)
            address = self.int_field(s, "address", where, nonneg=True)
            total = self.int_field(s, "total_size", where, nonneg=True)
            allocated = self.int_field(s, "allocated_size", where, nonneg=True)
            active = self.int_field(s, "active_size", where, nonneg=True)
            stream = self.int_field(s, "stream", where)
            seg_type = self.choice_field(s, "segment_type", where, SEGMENT_TYPES, "unknown-segment-type")
            pool = self.pool_of(s.get("segment_pool_id"), f"{where}.segment_pool_id")
            expandable = s.get("is_expandable", False)
            if type(expandable) is not bool:
                raise self.bad(f"{where}.is_expandable", expandable, "a bool")
            seg_stack = self.stack_of(s.get("frames", _NO_FRAMES), f"{where}.frames")
            blocks_raw = s.get("blocks", _MISSING)
            if blocks_raw is _MISSING:
                raise SchemaError("missing-key", f"{where}: missing 'blocks'")
            if type(blocks_raw) is not list:
                raise self.bad(f"{where}.blocks", blocks_raw, "a list of blocks")
            self.charge(len(blocks_raw))
            blocks = []
            offset = address
            requested_sum = 0
            for bi, b in enumerate(blocks_raw):
                block = self.convert_block(b, f"{where}.blocks[{bi}]", offset)
                offset = block.address + block.size
                if block.state != "inactive":
                    requested_sum += block.requested_size
                blocks.append(block)
            if offset - address != total:
                self.warn_once("segment-blocks-mismatch", f"{where}: block sizes do not add up to total_size")
            requested = s.get("requested_size", _MISSING)
            if requested is _MISSING:
                requested = requested_sum
            else:
                requested = self.int_field(s, "requested_size", where, nonneg=True)
            record = (
                device,
                address,
                total,
                allocated,
                active,
                requested,
                stream,
                seg_type,
                pool,
                expandable,
                tuple(blocks),
                seg_stack,
            )
            by_device.setdefault(device, []).append(record)
        return by_device

    def convert_block(self, b: Any, where: str, offset: int) -> Block:
        if type(b) is not dict:
            raise self.bad(where, b, "a block dict")
        self.charge(len(b))
        size = self.int_field(b, "size", where, nonneg=True)
        state = self.choice_field(b, "state", where, BLOCK_STATES, "unknown-state")
        address = self.int_field(b, "address", where, default=offset, nonneg=True)
        frames = b.get("frames", _NO_FRAMES)
        requested: Any = b.get("requested_size", _MISSING)
        history = b.get("history", _MISSING)
        if history is not _MISSING:
            # torch 1.13-2.0: history[0] is the current allocation (addr, real_size, frames).
            self.saw_history = True
            if type(history) is not list:
                raise self.bad(f"{where}.history", history, "a list")
            self.charge(len(history))
            if history:
                h0 = history[0]
                if type(h0) is not dict:
                    raise self.bad(f"{where}.history[0]", h0, "a dict")
                if frames is _NO_FRAMES:
                    frames = h0.get("frames", _NO_FRAMES)
                if requested is _MISSING and state != "inactive":
                    requested = self.int_field(h0, "real_size", f"{where}.history[0]", nonneg=True)
        if requested is _MISSING:
            # torch <= 1.12 blocks carry only size and state.
            requested = size if state != "inactive" else 0
            self.missing_requested = True
        else:
            requested = self.int_field({"requested_size": requested}, "requested_size", where, nonneg=True)
        return Block(address, size, requested, state, self.stack_of(frames, f"{where}.frames"))

    def finish_segment(self, rec: tuple[Any, ...], streams: list[int]) -> Segment:
        device, address, total, allocated, active, requested, stream, seg_type, pool, expandable, blocks, stack = rec
        try:
            ordinal = streams.index(stream)
        except ValueError:
            ordinal = len(streams)
            streams.append(stream)
        return Segment(
            device, address, total, allocated, active, requested, ordinal, seg_type, pool, expandable, blocks, stack
        )

    # -- annotations and settings -------------------------------------------------------
    def convert_annotations(self, raw: list[Any]) -> list[Annotation]:
        # One inline test of what every valid annotation passes: thousands of them, each two method calls and a
        # formatted string, were 0.015 s of the read. Any other goes through the checks in order (``int_field``
        # and the place's name), for the same refusal in the same words. The budget is charged here as
        # ``charge`` charges it (``charge`` raises where the sum passes it), and each Annotation is made by
        # its slots' setters (the frozen dataclass's __init__ costs twice as much: ~3 ms for 6,000).
        out: list[Annotation] = []
        append, new = out.append, object.__new__
        set_name, set_stage, set_device, set_time = _ANNOTATION_SETTERS
        used, budget = self.used, self.budget
        for i, a in enumerate(raw):
            if type(a) is not dict:
                self.used = used
                raise self.bad(f"external_annotations[{i}]", a, "an annotation dict")
            if used + len(a) > budget:
                self.used = used
                self.charge(len(a))  # raises
            used += len(a)
            name, stage = a.get("name", _MISSING), a.get("stage", _MISSING)
            device, time_us = a.get("device", 0), a.get("time_us", 0)
            if not (
                type(name) is str
                and type(stage) is str
                and type(device) is int
                and type(time_us) is int
                and 0 <= device <= I64_MAX
                and I64_MIN <= time_us <= I64_MAX
            ):
                self.used = used
                where = f"external_annotations[{i}]"
                if name is _MISSING or stage is _MISSING:
                    raise SchemaError("missing-key", f"{where}: needs 'name' and 'stage'")
                if type(name) is not str or type(stage) is not str:
                    raise self.bad(where, name if type(name) is not str else stage, "a str")
                device = self.int_field(a, "device", where, default=0, nonneg=True)
                time_us = self.int_field(a, "time_us", where, default=0)
            x = new(Annotation)
            set_name(x, name), set_stage(x, stage), set_device(x, device), set_time(x, time_us)
            append(x)
        self.used = used
        return out

    def convert_settings(self, raw: Any) -> AllocatorSettings:
        if raw is _MISSING:
            return AllocatorSettings(False, "", {})
        if type(raw) is not dict:
            raise self.bad("allocator_settings", raw, "a dict")
        self.charge(len(raw))
        clean: dict[str, Any] = {}
        for key, value in raw.items():
            where = f"allocator_settings.{short_repr(key)}"
            if type(key) is not str:
                raise self.bad(where, key, "a str key")
            if type(value) is dict:
                self.charge(len(value))
                for k2, v2 in value.items():
                    if type(k2) is not str or not is_scalar(v2):
                        raise self.bad(f"{where}.{short_repr(k2)}", v2, "a scalar")
                    check_int_range(v2, f"{where}.{short_repr(k2)}")
                clean[key] = dict(value)
            elif is_scalar(value):
                check_int_range(value, where)
                clean[key] = value
            else:
                raise self.bad(where, value, "a scalar or a dict of scalars")
        conf = clean.get("PYTORCH_CUDA_ALLOC_CONF", clean.get("PYTORCH_ALLOC_CONF", ""))
        if type(conf) is not str:
            raise self.bad("allocator_settings.PYTORCH_CUDA_ALLOC_CONF", conf, "a str")
        return AllocatorSettings(True, conf, clean)

    # -- warnings ---------------------------------------------------------------------------
    def warn_once(self, code: str, message: str) -> None:
        if all(w.code != code for w in self.warnings):
            self.warnings.append(Warning_(code, message))

    def add_warnings(self, layout: str, devices: list[DeviceData], settings: AllocatorSettings) -> None:
        n_events = sum(len(d.trace) for d in devices)
        if n_events == 0:
            self.warn_once(
                "no-history",
                "the snapshot holds no trace events (history was not recorded): only the final state can be shown",
            )
        elif all(len(d.trace) <= 1 for d in devices):
            self.warn_once("state-only", "the trace holds at most one event per device (recorded with enabled='state')")
        if n_events and not self.saw_event_frames:
            self.warn_once("no-frames", "trace events carry no stacks (recorded with context=None or 'state')")
        if not self.saw_any_frames and not (n_events and self.saw_event_frames):
            self.warn_once("no-stacks", "no stack is recorded anywhere in the snapshot")
        if n_events and self.no_time:
            self.warn_once("no-time", "events carry no time_us (torch < 2.2): times are event indices only")
        if not settings.recorded:
            self.warn_once("no-allocator-settings", "allocator_settings absent (torch < 2.3): defaults are assumed")
        if self.missing_requested:
            self.warn_once("no-requested-size", "blocks lack requested_size (torch < 2.0): block sizes stand in")
        if layout != "modern":
            self.warn_once("legacy-layout", f"legacy snapshot layout '{layout}'")


# Annotation's fields' setters (its slots), in the order of its fields: ``convert_annotations`` makes them with
# these, as the dataclass's __init__ would.
_ANNOTATION_SETTERS = tuple(getattr(Annotation, f).__set__ for f in ("name", "stage", "device", "time_us"))
assert tuple(Annotation.__dataclass_fields__) == ("name", "stage", "device", "time_us")

# The keys of a torch >= 2.3 trace event, read in one pass by ``_event_columns``.
_EVENT_KEYS = ("action", "addr", "size", "stream", "time_us", "frames", "compile_context", "user_metadata")
_COLUMN_CHUNK = 4096  # events per step: the step's tuples stay in cache while they are split into columns


def _event_columns(events: list[Any]) -> tuple[list[list[Any]] | None, bool]:
    """The values of every ``_EVENT_KEYS`` key of every event, one list per key, or
    None when some event is not a dict or lacks one of the keys (older torch, a
    damaged file: the per-key path then reads it and says what is wrong); and
    whether no event has any other key (no ``pool_id`` to look for then).

    Each event dict is visited once rather than once per key: the dicts are
    scattered over the whole loaded graph, so visiting them is what costs (about
    0.6 s less on 2.4M events than eight passes with ``dict.get``).
    """
    pick = operator.itemgetter(*_EVENT_KEYS)
    cols: list[list[Any]] = [[] for _ in _EVENT_KEYS]
    widest = 0
    try:
        for lo in range(0, len(events), _COLUMN_CHUNK):
            chunk = events[lo : lo + _COLUMN_CHUNK]
            # Only a dict can be indexed by a str key among what the unpickler builds.
            for col, values in zip(cols, zip(*map(pick, chunk), strict=False), strict=True):
                col.extend(values)
            widest = max(widest, *map(len, chunk))  # the dicts are in cache now: cheap
    except (KeyError, TypeError):
        return None, False
    return cols, widest == len(_EVENT_KEYS)


def _all_default_values(values: list[Any], default: Any) -> bool:
    """``_all_default`` on a column already read (a str default: only a str equals it,
    and ``count`` compares by identity first, so no value is hashed)."""
    assert type(default) is str
    return values.count(default) == len(values)


def _all_default(events: list[dict[str, Any]], key: str, default: Any) -> bool:
    """Whether every event lacks ``key`` or holds ``default`` there. Nothing is hashed: ``count``
    compares by identity, then ``==``, which a nested tuple answers at once against a str
    (a set of the values hashed them, and a tuple nested a million deep crashed the hash)."""
    values = list(map(dict.get, events, repeat(key), repeat(default)))
    return values.count(default) == len(values) and set(map(type, values)) <= {type(default)}
