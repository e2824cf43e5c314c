"""The columnar model the reader produces: dtypes, conventions, documented codes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from analysis.model import ACTION_CODE, ACTIONS, DEFAULT_POOL, OOM, SEGMENT_ALLOC, StackTable, Trace
from analysis.reader import read_snapshot

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"


def test_action_codes_are_stable() -> None:
    assert ACTIONS[OOM] == "oom" and ACTIONS[SEGMENT_ALLOC] == "segment_alloc"
    assert [ACTION_CODE[a] for a in ACTIONS] == list(range(len(ACTIONS)))


def test_columns_have_model_dtypes_and_lengths() -> None:
    snap = read_snapshot(FIXTURES / "two_gpu_pipeline.pickle.gz")
    for dev in snap.devices:
        t = dev.trace
        dtypes = {k: getattr(t, k).dtype for k in ("action", "addr", "size", "stream", "time_us", "stack", "pool")}
        assert dtypes == {
            "action": np.int8,
            "addr": np.int64,
            "size": np.int64,
            "stream": np.int32,
            "time_us": np.int64,
            "stack": np.int32,
            "pool": np.int32,
        }
        assert {getattr(t, k).shape for k in dtypes} == {(len(t),)}
        assert t.stream.max() < len(dev.streams)
        assert t.stack.min() >= -1 and t.stack.max() < len(snap.stacks.stacks)
    assert snap.pools[0] == DEFAULT_POOL
    # Times are the snapshot's own monotone-ish clock, never the default 0 on a 2.2+ file.
    assert (snap.devices[0].trace.time_us > 0).all()


def test_stack_table_and_empty_trace() -> None:
    table = StackTable()
    assert table.frames_of(-1) == []
    assert len(Trace.empty()) == 0


def test_every_reader_code_is_documented() -> None:
    # The reader's rooms: the entry point, the unpickler, the converter and its schema checks.
    rooms = ("reader.py", "unpickler.py", "convert.py", "schemacheck.py")
    source = "\n".join((ROOT / "analysis" / name).read_text() for name in rooms)
    doc = (ROOT / "docs" / "reader.md").read_text()
    areas = {"FormatError": "format", "UnsafeError": "unsafe", "LimitError": "limit", "SchemaError": "schema"}
    codes = {
        f"snapshot:{areas[k]}:{r}" for k, r in re.findall(r"(\w+Error)\(\s*\"([a-z0-9-]+)\"", source) if k in areas
    }
    codes |= {f"snapshot:{areas[k]}:{r}" for k, r in re.findall(r", (\w+Error), \"([a-z0-9-]+)\"\)", source)}
    reasons = re.findall(r"reason = \"([a-z-]+)\"", source) + re.findall(r"\"([a-z-]+)\" if key in", source)
    reasons += re.findall(r"else \"([a-z-]+)\"", source)
    codes |= {f"snapshot:schema:{r}" for r in reasons}
    codes |= {"snapshot:schema:wrong-type", "snapshot:schema:root-type", "snapshot:schema:bad-pool-id"}
    assert len(codes) > 25
    missing = sorted(c for c in codes if f"`{c}`" not in doc)
    assert not missing
    warnings = set(re.findall(r"warn_once\(\s*\"([a-z-]+)\"", source))
    assert warnings and not sorted(w for w in warnings if f"`{w}`" not in doc)
