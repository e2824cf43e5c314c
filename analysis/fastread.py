"""The compiled reader's Python side: when to use it, and its hand-over to the reference.

``analysis._snapread`` (C, ``analysis/_snapread.c``) walks a snapshot pickle's
opcodes (gunzipping it with zlib first) into trace columns and interned frames
lists, without building the trace's Python objects. It never refuses a file:
it returns ``None`` for anything it does not understand completely, and
``read_compiled`` then returns ``None`` too, so ``read_snapshot`` reads the
file with the Python reader, whose refusal (code and message) is the one the
user sees. What the C side does accept is converted here by the reference
converter itself (``convert.Converter``): segments, blocks, annotations and
settings are small Python objects it checks with its own code, and only
``convert_trace`` is replaced, by one that takes the columns and asks
``stack_of`` for the stacks in the order the reference's bucketing would.

Which reader runs: the compiled one when the extension is built, unless the
caller passes ``compiled=False`` to ``read_snapshot`` or the environment sets
``OOMSCOPE_READER=python``. ``reader_in_use()`` says which (``--version``).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysis.convert import Converter  # the reference converter
from analysis.errors import SnapshotError
from analysis.model import Snapshot, Trace
from analysis.schemacheck import check_trace_columns
from analysis.unpickler import ReadLimits, node_budget, sniff_format

try:  # built by `make install` (setup.py build_ext --inplace); absent without a compiler
    from analysis import _snapread  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the machine
    _snapread = None

ENV_VAR = "OOMSCOPE_READER"


def available() -> bool:
    """Whether the compiled reader is built on this machine."""
    return _snapread is not None


def wanted(compiled: bool | None) -> bool:
    """Whether ``read_snapshot`` tries the compiled reader first (``compiled`` None: the environment decides)."""
    if compiled is None:
        compiled = os.environ.get(ENV_VAR, "").strip().lower() != "python"
    return compiled and available()


def inflater() -> str:
    """What inflates a ``.gz`` for the compiled reader: ``libdeflate`` where the machine has its library
    (``OOMSCOPE_NO_LIBDEFLATE`` set: never), else ``zlib``; ``zlib (Python)`` without the compiled reader."""
    if _snapread is None or not wanted(None):
        return "zlib (Python)"
    name: str = _snapread.inflater()
    return name


def reader_in_use() -> str:
    """``compiled`` or ``python``, with the reason when it is the Python one."""
    if not available():
        return "python (the compiled reader is not built)"
    if not wanted(None):
        return f"python ({ENV_VAR}=python)"
    return "compiled (analysis._snapread)"


def read_compiled(source: Any, limits: ReadLimits) -> Snapshot | None:
    """The snapshot through the compiled reader, or None to leave the file to the Python reader.

    ``source`` is a path, the file's bytes, or its mapping (``mapped_file``), ``limits`` a
    ``ReadLimits``.
    """
    if isinstance(source, (bytes, bytearray, memoryview, mmap.mmap)):
        parsed, container = _parse(source, limits)
    else:
        with mapped_file(Path(source), limits) as mapped:
            if mapped is None:
                return None  # the Python reader raises the same OSError, or reads what does not map
            parsed, container = _parse(mapped.data, limits)
    if parsed is None:
        return None
    raw_len, root, frame_values, classes = parsed
    fmt = "pickle.gz" if container == "gzip" else "pickle"
    converter = _ColumnsConverter(fmt, node_budget(raw_len, limits), limits, frame_values, classes)
    try:
        snapshot: Snapshot = converter.run(root)
        return snapshot
    except SnapshotError:
        return None  # the reference refuses it: let it say so, from the file


# Not MAP_POPULATE: its page-table walk over the whole file ran on the reading thread before the parse
# began (0.02 s for 460 MB); unpopulated, the first reader of a page maps it, and in a report that is
# mostly the hash thread, which runs ahead of the parse (docs/performance.md).
_MAP_FLAGS = mmap.MAP_PRIVATE


@dataclass(frozen=True)
class MappedFile:
    """A snapshot file and its mapped bytes (``mapped_file``): what ``read_snapshot`` reads with the
    compiled reader, else from ``path`` with the Python reader."""

    path: Path
    data: mmap.mmap


@contextlib.contextmanager
def mapped_file(path: Path, limits: ReadLimits) -> Iterator[MappedFile | None]:
    """The file's pages mapped read-only for the compiled parse (and for any other reader of the
    same bytes, as the report's hash): None where it cannot be read so (it does not open, is
    empty, is past ``limits.max_input_bytes``, or does not map).

    Mapped, not copied: the parse reads each byte once, and the page cache's pages need no
    zeroing (a read() into a new bytes object does). One mapping for every reader: a second one
    would count the file's pages twice in the process's resident size."""
    fh: Any = None
    mapped = None
    try:
        fh = open(os.fspath(path), "rb", buffering=0)  # noqa: SIM115 - closed below, after the caller's block
        size = os.fstat(fh.fileno()).st_size
        if 0 < size <= limits.max_input_bytes:
            mapped = mmap.mmap(fh.fileno(), size, flags=_MAP_FLAGS, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        mapped = None
    try:
        yield MappedFile(path, mapped) if mapped is not None else None
    finally:
        if mapped is not None:
            mapped.close()
        if fh is not None:
            fh.close()


def _parse(data: Any, limits: ReadLimits) -> tuple[Any, str]:
    """The C parse of a pickle or gzip in ``data`` (a buffer): its tuple or None, and the container."""
    if len(data) > limits.max_input_bytes:
        return None, ""
    try:
        container = sniff_format(bytes(data[:16]))
    except SnapshotError:
        return None, ""
    if container not in ("pickle", "gzip"):
        return None, container  # zip and JSON: the Python reader (small, rare)
    parsed = _snapread.parse(
        data,
        container == "gzip",
        limits.max_decompressed_bytes,
        limits.max_ratio,
        limits.ratio_grace_bytes,
        limits.nodes_per_byte,
        limits.min_nodes,
    )
    return parsed, container


class _ColumnsConverter(Converter):
    """The reference converter, with the trace read from the compiled reader's columns."""

    def __init__(
        self,
        fmt: str,
        budget: int,
        limits: ReadLimits,
        frame_values: list[tuple[str, int, str]],
        classes: list[Any],
    ) -> None:
        super().__init__(fmt, budget, limits)
        self.frame_values = frame_values
        self.classes = classes
        self.proxies: dict[int, list[dict[str, Any]]] = {}
        self.frame_dicts: dict[int, dict[str, Any]] = {}

    def proxy(self, cls: int) -> list[dict[str, Any]]:
        """One frames list of a content class, built from shared frame dicts (as the file shares them)."""
        out = self.proxies.get(cls)
        if out is None:
            out = []
            for fv in self.classes[cls]:
                d = self.frame_dicts.get(fv)
                if d is None:
                    filename, line, name = self.frame_values[fv]
                    d = self.frame_dicts[fv] = {"filename": filename, "line": line, "name": name}
                out.append(d)
            self.proxies[cls] = out
        return out

    def convert_trace(self, dev: int, events: list[Any]) -> tuple[Trace, list[int], dict[int, str], dict[int, str]]:
        if not (len(events) == 1 and type(events[0]) is tuple):
            return super().convert_trace(dev, events)  # an empty trace
        n, action_b, addr_b, size_b, stream_b, time_b, absent_time, cls_b, sum_lens, order = events[0][:10]
        cc, um, pool_b, pools, streams, counts_b = events[0][10:]
        where = f"device_traces[{dev}]"
        # At least what the reference charges: the events, the frame references, and (bounded by
        # the references again) the frames lists it would intern; the stacks' values are charged below.
        self.charge(n + 2 * sum_lens)
        action = np.frombuffer(action_b, np.int8)
        addr = np.frombuffer(addr_b, np.int64)
        size = np.frombuffer(size_b, np.int64)
        if absent_time == n:
            time_us = np.zeros(n, np.int64)
            self.no_time = True
        else:
            time_us = np.frombuffer(time_b, np.int64)
        if order:
            # The reference's bucketing rounds ask stack_of for the classes in this order (the C side
            # replays them); asking in the same order interns the same frame and stack ids.
            self.saw_event_frames = self.saw_any_frames = True
            sid_of = np.full(len(self.classes) + 1, -1, np.int32)  # the last one stands for "no frames"
            for c in order:
                sid_of[c] = self.stack_of(self.proxy(c), where)
            # sid_of[cls], written over the classes where the C side wrote them (numpy's take would copy
            # them into a new array); remap refuses (and changes nothing) only values past the table.
            cls = np.frombuffer(cls_b, np.int32)
            stack = cls if _snapread.remap(cls_b, sid_of) else sid_of[cls]
            if self.stack_nodes:
                # Each event charges its stack's nodes: counted per content class (one class, one stack).
                counts = np.frombuffer(counts_b, np.int64)
                self.charge(sum(int(counts[c]) * self.stack_nodes[sid_of[c]] for c in order if sid_of[c] >= 0))
        else:
            stack = np.full(n, -1, np.int32)
        if not pools:  # no pool id in the trace: the C side wrote ordinal 0 into every event's place
            pool = np.frombuffer(pool_b, np.int32)
        else:
            ordinals = np.asarray([self.pool_of(k, where) for k in pools] + [0], np.int32)
            pool = ordinals[np.frombuffer(pool_b, np.int32)]  # -1 (no pool id) takes the trailing 0
        # Stream ordinals in order of first appearance (the C side numbered them as it met them).
        stream = np.frombuffer(stream_b, np.int32)
        # The reference's checks on the columns (issue 22), from their one definition in schemacheck.py.
        check_trace_columns(self.limits, action, addr, stream, pool, streams, where, first_off_lane=first_free_off_lane)
        trace = Trace(action=action, addr=addr, size=size, stream=stream, time_us=time_us, stack=stack, pool=pool)
        return trace, streams, dict(cc), dict(um)


def give_up_line() -> int:
    """The line of ``_snapread.c`` where the last compiled read gave up (0: it did not), for tests and debugging."""
    return int(_snapread.give_up_line()) if _snapread is not None else 0


def first_free_off_lane(action: Any, addr: Any, stream: Any, pool: Any) -> tuple[int, ...] | None:
    """``schemacheck._check_frees_match_their_blocks`` in one compiled pass (``_snapread.free_lanes``: a map of
    each address's last block event, where the reference sorts every block event by address): ``()``
    where every free names its block's stream and pool, else the pair the reference names, ``(cur,
    prev)``; None where the extension is not built (the reference answers)."""
    if _snapread is None:
        return None
    found: tuple[int, ...] = _snapread.free_lanes(
        np.ascontiguousarray(action, np.int8),
        np.ascontiguousarray(addr, np.int64),
        np.ascontiguousarray(stream, np.int32),
        np.ascontiguousarray(pool, np.int32),
    )
    return found
