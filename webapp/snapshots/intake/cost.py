"""What an upload's analysis will cost, estimated at intake from its size and structure (issue 22).

The reader's work grows with the bytes it parses: the pickle (or JSON) after gunzip or unzip.
That size is known before anything is decompressed: a gzip file's last 4 bytes (ISIZE) declare
its uncompressed size mod 2**32, and a zip's central directory lists each member's size. A lie in
the declaration only lowers the estimate, and the reader's own decompression cap
(``ReadLimits.max_decompressed_bytes``) still bounds what is read.

Some shapes cost more than their bytes, so the head of the content is also scanned, within a
fixed budget (``SCAN_INPUT_BYTES`` of the file, ``SCAN_OUTPUT_BYTES`` of content, ``SCAN_OPS``
pickle opcodes: a few tens of milliseconds whatever the file):

- gzip members are counted (only the last one's ISIZE is in the trailer; 400,000 empty members
  once took 150 s of the queue); more than the reader reads (``ReadLimits.max_gzip_members``)
  is refused here with the reader's code, ``snapshot:limit:gzip-members``;
- the pickle's opcodes are walked without building anything (``pickletools.genops``: no object is
  made, no global looked up, nothing unpickled: the web process never unpickles an upload), to
  count its devices (the segments' ``device`` values and the ``device_traces`` lists) and trace
  events. Every device is replayed and charted (3,000 of them in a 22 KB file took 221 s); more
  than ``ReadLimits.max_devices`` is refused here with ``snapshot:limit:devices``, and each device
  past the first adds ``DEVICE_COST_BYTES`` to the estimate.

A shape the scan does not reach (past its budget) is still refused by the reader, in the analysis
child, with the same code. ``AnalysisCost.check()`` raises the refusal; intake calls it.
"""

from __future__ import annotations

import contextlib
import io
import pickletools
import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any

from analysis.reader import ReadLimits

_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"

SCAN_INPUT_BYTES = 1 << 20  # of the file as uploaded
SCAN_OUTPUT_BYTES = 1 << 20  # of content (after gunzip); also what the opcode walk may read
# Pickle opcodes walked: 1-2 us each (genops decodes each argument), so at most about 0.1 s on the
# project's loaded 2-core box. A real snapshot's segments come first and take more; a small file
# (the many-devices file: 3,000 segments, about 30 opcodes each) is walked whole or far
# enough to see that it passes the device limit.
SCAN_OPS = 50_000
# An analysis parses about 15 MB of pickle a second and spends about 70 ms per device beyond that
# (the issue: 3,000 devices, 221 s; replay and charts are per device): a device costs about 1 MiB.
DEVICE_COST_BYTES = 1 << 20

_LIMITS = ReadLimits()


@dataclass(frozen=True)
class AnalysisCost:
    """An upload's estimated analysis cost: ``cost_bytes`` = max(file, declared or scanned content)
    + ``DEVICE_COST_BYTES`` per device past the first. The shape fields are what the bounded scan saw
    (lower bounds unless ``scan_complete``); None where the format has no such thing or the scan
    could not tell."""

    file_bytes: int
    declared_bytes: int | None  # gzip ISIZE or the zip members' sum; None for a plain file
    cost_bytes: int
    gzip_members: int | None = None
    devices: int | None = None
    events: int | None = None
    scan_complete: bool = False
    refusal: tuple[str, str] | None = None  # (code, detail): a shape the analysis would refuse

    def check(self) -> AnalysisCost:
        """``self``, or ``intake.IntakeError`` (422, the reader's code) for a refused shape."""
        if self.refusal is not None:
            from webapp.snapshots import messages
            from webapp.snapshots.errors import IntakeError

            code, detail = self.refusal
            raise IntakeError(422, code, messages.error_message(code, detail))
        return self


def estimate_cost(uploaded: Any) -> AnalysisCost:
    """The cost of analysing ``uploaded`` (a Django UploadedFile or any seekable binary file with
    ``size``), read from its head, its trailer and a bounded scan of its first bytes; the file's
    position is put back to 0. Kept on the object: intake and the store ask for it once each."""
    cached = getattr(uploaded, "_oomscope_cost", None)
    if isinstance(cached, AnalysisCost):
        return cached
    size = int(getattr(uploaded, "size", 0) or 0)
    uploaded.seek(0)
    head = uploaded.read(4)
    declared: int | None = None
    if head[:2] == _GZIP_MAGIC and size >= 18:  # 10-byte header + 8-byte trailer at least
        uploaded.seek(size - 4)
        declared = struct.unpack("<I", uploaded.read(4))[0]
    elif head == _ZIP_MAGIC:
        declared = _zip_declared_bytes(uploaded)
    uploaded.seek(0)
    shape = _scan(uploaded, head, size)
    uploaded.seek(0)
    content = max(declared or 0, shape.content_bytes if shape.whole else 0)
    devices = shape.devices
    cost = AnalysisCost(
        file_bytes=size,
        declared_bytes=declared,
        cost_bytes=max(size, content) + DEVICE_COST_BYTES * max(0, (devices or 1) - 1),
        gzip_members=shape.members,
        devices=devices,
        events=shape.events,
        scan_complete=shape.complete,
        refusal=shape.refusal(),
    )
    with contextlib.suppress(AttributeError):  # an object without a __dict__: asked twice, scanned twice
        uploaded._oomscope_cost = cost
    return cost


def _zip_declared_bytes(uploaded: Any) -> int | None:
    """The sum of the members' uncompressed sizes from the central directory (not decompressed)."""
    try:
        uploaded.seek(0)
        with zipfile.ZipFile(uploaded) as archive:
            return sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None  # the reader refuses a broken zip with its own code


@dataclass
class _Shape:
    members: int | None = None
    content_bytes: int = 0  # of content seen
    whole: bool = False  # the whole file was read and decompressed: content_bytes is its content
    complete: bool = False  # and its whole pickle was walked: the counts are exact
    devices: int | None = None
    events: int | None = None

    def refusal(self) -> tuple[str, str] | None:
        if self.members is not None and self.members > _LIMITS.max_gzip_members:
            return (
                "snapshot:limit:gzip-members",
                f"the gzip file has more than {_LIMITS.max_gzip_members:,} members (torch writes one)",
            )
        if self.devices is not None and self.devices > _LIMITS.max_devices:
            return (
                "snapshot:limit:devices",
                f"at least {self.devices:,} devices (at most {_LIMITS.max_devices} are read)",
            )
        return None


def _scan(uploaded: Any, head: bytes, size: int) -> _Shape:
    """The bounded scan: gzip members, then the pickle's opcodes in the content's head."""
    shape = _Shape()
    if head[:2] == _GZIP_MAGIC:
        content, shape.members, whole = _gunzip_head(uploaded.read(SCAN_INPUT_BYTES), size)
    elif head == _ZIP_MAGIC:
        content, whole = _unzip_head(uploaded)
    else:
        content = uploaded.read(SCAN_OUTPUT_BYTES + 1)
        whole = len(content) <= SCAN_OUTPUT_BYTES
        content = content[:SCAN_OUTPUT_BYTES]
    shape.content_bytes, shape.whole = len(content), whole
    if content[:1] == b"\x80" and shape.refusal() is None:
        finished = _walk_pickle(content, shape)
        shape.complete = whole and finished
    return shape


def _gunzip_head(data: bytes, size: int) -> tuple[bytes, int, bool]:
    """(the content's head, the members counted, whether the whole file was read) from the first
    ``SCAN_INPUT_BYTES`` of a gzip file. Linear in its members, as the reader: the input is handed
    to zlib in pieces that start small after each member (zlib copies what follows a member)."""
    out: list[bytes] = []
    kept = 0
    view = memoryview(data)
    pos = members = 0
    while pos < len(view) and members <= _LIMITS.max_gzip_members:
        if view[pos : pos + 2] != _GZIP_MAGIC:
            break  # trailing bytes: the reader says what they are
        members += 1
        dec = zlib.decompressobj(wbits=31)
        piece = 64
        try:
            while not dec.eof and pos < len(view):
                chunk = dec.decompress(view[pos : pos + piece], max(1, SCAN_OUTPUT_BYTES - kept))
                pos += min(piece, len(view) - pos) - len(dec.unconsumed_tail) - len(dec.unused_data)
                piece = min(2 * piece, 1 << 20)
                out.append(chunk)
                kept += len(chunk)
                if kept >= SCAN_OUTPUT_BYTES:
                    return b"".join(out)[:SCAN_OUTPUT_BYTES], members, False
        except zlib.error:
            break  # damaged: the reader refuses it with its code
        if not dec.eof:
            break
    whole = len(data) == size and pos >= size
    return b"".join(out), members, whole


def _unzip_head(uploaded: Any) -> tuple[bytes, bool]:
    """The head of a torch.save archive's ``data.pkl``, read through the zip's own bounded reader."""
    try:
        with zipfile.ZipFile(uploaded) as archive:
            names = [i for i in archive.infolist() if i.filename.endswith("data.pkl")]
            if len(names) != 1:
                return b"", False
            with archive.open(names[0]) as member:
                content = member.read(SCAN_OUTPUT_BYTES + 1)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError, zlib.error):
        return b"", False
    return content[:SCAN_OUTPUT_BYTES], len(content) <= SCAN_OUTPUT_BYTES


class _List:
    __slots__ = ("items", "traces")

    def __init__(self, items: int = 0, traces: bool = False) -> None:
        self.items, self.traces = items, traces


class _Dict:
    __slots__ = ("device", "segment")

    def __init__(self) -> None:
        self.device: int | None = None
        self.segment = False


_OTHER = object()  # any value the walk does not need to know
_SEGMENT_KEYS = frozenset({"blocks", "total_size", "segment_type"})
_STRING_OPS = frozenset(
    {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
)
_INT_OPS = frozenset({"BININT", "BININT1", "BININT2", "INT", "LONG", "LONG1", "LONG4"})


def _walk_pickle(content: bytes, shape: _Shape) -> bool:
    """Walk the pickle's opcodes (at most ``SCAN_OPS``) on a stack of placeholders: strings and
    small ints as themselves, lists and dicts as counters, anything else as one opaque value. Sets
    ``shape.devices`` and ``shape.events``; True when the walk reached STOP.

    One loop over the opcodes, the common ones handled inline: a call per opcode would cost real
    time on the 50,000 of a scan (the rare ones and the setitems go to helpers)."""
    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[int, Any] = {}
    segments: list[_Dict] = []
    traces: list[_List] = []
    events = 0
    finished = False
    try:
        for n, (op, arg, _pos) in enumerate(pickletools.genops(io.BytesIO(content))):
            if n >= SCAN_OPS:
                break
            name = op.name
            if name in _STRING_OPS:
                stack.append(arg if isinstance(arg, str) and len(arg) <= 32 else _OTHER)
            elif name in _INT_OPS:
                stack.append(arg if isinstance(arg, int) and -(2**31) <= arg < 2**31 else _OTHER)
            elif name == "EMPTY_LIST":
                stack.append(_List(traces=bool(stack) and stack[-1] == "device_traces"))
                if stack[-1].traces:
                    traces.append(stack[-1])
            elif name == "EMPTY_DICT":
                stack.append(_Dict())
            elif name == "MARK":
                marks.append(len(stack))
            elif name == "APPEND":
                stack.pop()
                if stack and isinstance(stack[-1], _List):
                    stack[-1].items += 1
            elif name == "APPENDS":
                items = _pop_mark(stack, marks)
                if stack and isinstance(stack[-1], _List):
                    stack[-1].items += len(items)
            elif name == "SETITEM":
                value, key = stack.pop(), stack.pop()
                events += _set_items(stack[-1] if stack else None, [key, value], segments)
            elif name == "SETITEMS":
                items = _pop_mark(stack, marks)
                events += _set_items(stack[-1] if stack else None, items, segments)
            elif name == "DICT":
                d = _Dict()
                events += _set_items(d, _pop_mark(stack, marks), segments)
                stack.append(d)
            elif name == "LIST":
                stack.append(_List(len(_pop_mark(stack, marks))))
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(arg or 0)] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo.get(int(arg or 0), _OTHER))
            elif name == "STOP":
                finished = True
                break
            else:
                _other_opcode(op, stack, marks)
    except (ValueError, IndexError, KeyError, TypeError, EOFError, struct.error):
        pass  # the head ends mid-opcode, or the pickle is broken: the reader says what it is
    shape.devices = _devices_seen(segments, traces)
    shape.events = events
    return finished


def _pop_mark(stack: list[Any], marks: list[int]) -> list[Any]:
    """The items above the last MARK, taken off the stack (all of it where no MARK is open)."""
    at = marks.pop() if marks else 0
    items = stack[at:]
    del stack[at:]
    return items


def _set_items(target: Any, items: list[Any], segments: list[_Dict]) -> int:
    """Key/value pairs stored into ``target``: a dict placeholder learns its ``device`` and whether
    it is a segment (kept in ``segments``). The trace events among them: each has an ``action``."""
    events = 0
    for key, value in zip(items[::2], items[1::2], strict=False):
        if key == "action":
            events += 1
        if isinstance(target, _Dict):
            if key == "device" and type(value) is int:
                target.device = value
            elif key in _SEGMENT_KEYS and not target.segment:
                target.segment = True
                segments.append(target)
    return events


def _other_opcode(op: pickletools.OpcodeInfo, stack: list[Any], marks: list[int]) -> None:
    """Any opcode the walk has no rule for: its stack effect, by pickletools' own table, its
    results as opaque values."""
    if pickletools.markobject in op.stack_before:
        _pop_mark(stack, marks)
        before = [s for s in op.stack_before if s not in (pickletools.markobject, pickletools.stackslice)]
    else:
        before = op.stack_before
    if before:
        del stack[-len(before) :]
    stack.extend(_OTHER for s in op.stack_after if s is not pickletools.markobject)
    if pickletools.markobject in op.stack_after:
        marks.append(len(stack))


def _devices_seen(segments: list[_Dict], traces: list[_List]) -> int | None:
    """The device ordinals the walk saw: the segments' ``device`` values and one per trace list
    (the longest ``device_traces`` list seen); None where it saw neither."""
    ordinals = {s.device for s in segments if s.device is not None}
    trace_lists = max((t.items for t in traces), default=0)
    ordinals |= set(range(trace_lists))
    return len(ordinals) if (segments or traces) else None
