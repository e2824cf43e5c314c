"""Safe snapshot reader: sniff the container, unpickle with no globals, convert.

Nothing in a file can run code here: the unpickler is the C one with
``find_class`` and ``persistent_load`` refusing everything, so no opcode can
reach a callable (REDUCE, BUILD, NEWOBJ, ... then fail on plain data). What a
hostile file can still do is cost time and memory, so every stage is capped by
``ReadLimits`` (passed by the caller, never read from settings):

- the input size, the decompressed size and the compression ratio (gzip is
  streamed through ``zlib.decompressobj`` with ``max_length``; zip members are
  read in chunks);
- the expanded size of the object graph (a memo DAG of a few hundred bytes can
  stand for 2**60 nodes): the converter charges every event, key and frame it
  would expand *before* touching them, against ``nodes_per_byte`` x file bytes;
- nesting depth and cycles, measured only where the schema was violated (the
  converter never descends into anything the schema does not expect, so a deep
  or cyclic structure elsewhere is never walked).

This module is the entry point (``read_snapshot``) and the order of the stages;
each stage is a room of its own: ``unpickler`` (the caps, the containers and
the restricted unpickler: the only code that unpickles), ``convert`` (the
reference converter, which checks the schema as it builds the model's columns)
and ``schemacheck`` (the checks both readers make on a device's columns, and the
diagnosis of an unexpected value). ``fastread`` is the compiled reader, tried
first. Every refusal is a ``SnapshotError`` with a stable code (docs/reader.md
lists them).
"""

from __future__ import annotations

import gc
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager

from analysis import fastread
from analysis.convert import Converter
from analysis.errors import FormatError, LimitError
from analysis.model import Snapshot
from analysis.unpickler import (
    PEEK,
    ReadLimits,
    gunzip,
    node_budget,
    parse_json,
    sniff_format,
    unpickle,
    unpickle_file,
    unzip,
)

__all__ = ["ReadLimits", "read_snapshot", "sniff_format"]


def read_snapshot(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview | fastread.MappedFile,
    *,
    limits: ReadLimits = ReadLimits(),  # noqa: B008 - frozen: one shared default is safe
    compiled: bool | None = None,
) -> Snapshot:
    """Read a snapshot file (path), its bytes, or the file mapped (``fastread.mapped_file``: the
    caller reads the same bytes beside, as the report's hash) into the columnar model.

    Raises ``SnapshotError`` (with a stable ``.code``) for anything that is not a
    usable snapshot; nothing in the file is ever executed.

    ``compiled``: try the compiled reader first (``analysis.fastread``; None: unless
    ``OOMSCOPE_READER=python``). It returns the same snapshot or hands the file to
    the code below, which is the reference and gives every refusal.
    """
    if isinstance(source, fastread.MappedFile):  # mapped by the caller, who reads its bytes too
        if fastread.wanted(compiled):
            snapshot = fastread.read_compiled(source.data, limits)
            if snapshot is not None:
                return snapshot
        source, compiled = source.path, False  # the rest is the Python reader's, from the file
    if fastread.wanted(compiled):
        snapshot = fastread.read_compiled(source, limits)
        if snapshot is not None:
            return snapshot
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = source if isinstance(source, bytes) else bytes(source)
        if len(data) > limits.max_input_bytes:
            raise LimitError("file-size", f"the input exceeds {limits.max_input_bytes} bytes")
        return _read_buffer(data, limits)
    # A BufferedReader of our buffer size, spelled out (what open(..., buffering=PEEK) builds).
    with io.BufferedReader(io.FileIO(os.fspath(source), "r"), PEEK) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limits.max_input_bytes:
            raise LimitError("file-size", f"the file is {size} bytes, over the {limits.max_input_bytes} byte limit")
        if sniff_format(f.peek(16)[:16]) == "pickle":
            # The common large case: unpickle from the file, never holding its bytes.
            with _gc_paused():
                obj = unpickle_file(f, size)
                snapshot = Converter("pickle", node_budget(size, limits), limits).run(obj)
                del obj  # free the graph while collections are still off
            return snapshot
        data = f.read(size)  # never read(cap): a buffered read preallocates what it is asked for
    return _read_buffer(data, limits)


def _read_buffer(raw: bytes, limits: ReadLimits) -> Snapshot:
    container = sniff_format(raw[:16])
    fmt = {"pickle": "pickle", "gzip": "pickle.gz", "zip": "torch-zip", "json": "json"}[container]
    if container == "gzip":
        raw = gunzip(raw, limits)
        inner = sniff_format(raw[:16])
        if inner == "json":
            fmt = "json"
        elif inner != "pickle":
            raise FormatError("not-a-snapshot", f"the gzip holds a {inner}, not a pickle")
    elif container == "zip":
        raw = unzip(raw, limits)
        if sniff_format(raw[:16]) != "pickle":
            raise FormatError("not-a-snapshot", "the archive's data.pkl is not a pickle")
    budget = node_budget(len(raw), limits)
    with _gc_paused():
        obj = parse_json(raw) if fmt == "json" else unpickle(raw)
        del raw  # the bytes and the graph together are the peak; keep only the graph
        snapshot = Converter(fmt, budget, limits).run(obj)
        del obj
    return snapshot


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The loaded graph is acyclic data: collections would only rescan it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
