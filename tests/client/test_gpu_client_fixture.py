"""The client's real OOM dump (fixture gpu_client_oom, made on an H200) agrees with itself and the reader.

The snapshot is the file oomscope_client.dump_on_oom wrote from the allocator's OOM observer; the
sidecar it wrote beside it is kept in the truth file under ``client.sidecar``.
"""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import pytest

from analysis.reader import read_snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def case():
    truth = json.loads((FIXTURES / "gpu_client_oom.truth.json").read_text())
    raw = gzip.decompress((FIXTURES / "gpu_client_oom.pickle.gz").read_bytes())
    return truth, truth["client"]["sidecar"], pickle.loads(raw), len(raw)


def test_dump_came_from_the_observer_with_the_message_filled_in(case):
    truth, sidecar, _, _ = case
    assert truth["client"]["observer_attached"] is True
    assert sidecar["trigger"] == "observer"
    assert sidecar["oom_message"] == truth["oom_message"]
    assert sidecar["oom_message"].startswith("CUDA out of memory. Tried to allocate 84.00 MiB.")
    # the observer reports the per-process cap (3 GiB here), which the snapshot itself lacks
    assert sidecar["observer"]["allowed_bytes"] == 3 << 30
    assert "3.00 GiB allowed" in sidecar["oom_message"]
    assert sidecar["observer"]["alloc_bytes"] == 84 << 20


def test_sidecar_describes_the_snapshot_it_sits_beside(case):
    _, sidecar, snap, raw_len = case
    trace = snap["device_traces"][0]
    assert sidecar["n_trace_events"] == [len(trace)] == [2829]
    assert sidecar["snapshot_keys"] == sorted(snap)
    assert sidecar["pickle_bytes"] == raw_len
    # taken inside the failing allocation: the live blocks are exactly the allocator's count
    live = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    assert live == sidecar["memory_stats"]["allocated_bytes.all.current"] == 3_079_013_376
    reserved = sum(s["total_size"] for s in snap["segments"])
    assert reserved == sidecar["memory_stats"]["reserved_bytes.all.current"]
    assert trace[-1]["action"] == "oom"
    assert sidecar["memory_stats"]["num_ooms"] == 1


def test_the_reader_loads_the_client_dump(case):
    _, sidecar, _, _ = case
    model = read_snapshot(FIXTURES / "gpu_client_oom.pickle.gz")
    assert len(model.devices) == 1
    assert len(model.devices[0].trace) == sidecar["n_trace_events"][0]
    assert sum(s.total_size for s in model.devices[0].segments) == sidecar["memory_stats"]["reserved_bytes.all.current"]
