"""The reader on the real fixtures, the round trips between formats, legacy layouts.

The reference for the real files is the trusted fixture itself, loaded with plain
``pickle`` and walked naively event by event (fine for files we made).
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.errors import SnapshotError
from analysis.model import ACTION_CODE, ACTIONS, DEFAULT_POOL, OOM, Frame, Snapshot
from analysis.reader import ReadLimits, read_snapshot, sniff_format

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = sorted(p.name.removesuffix(".pickle.gz") for p in FIXTURES.glob("*.pickle.gz"))


def _raw(case: str) -> bytes:
    return gzip.decompress((FIXTURES / f"{case}.pickle.gz").read_bytes())


def _truth(case: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{case}.truth.json").read_text())


_cache: dict[str, Snapshot] = {}


def _read(case: str) -> Snapshot:
    if case not in _cache:
        _cache[case] = read_snapshot(FIXTURES / f"{case}.pickle.gz")
    return _cache[case]


def _frames(raw: Any) -> list[Frame]:
    return [Frame(f["filename"], f["line"], f["name"]) for f in raw or []]


@pytest.mark.parametrize("case", CASES)
def test_real_fixture_matches_truth_and_reference(case: str) -> None:
    snap = _read(case)
    truth = _truth(case)
    ref = pickle.loads(_raw(case))
    assert snap.format == "pickle.gz"
    assert snap.layout == "modern"

    # One trace per device, as many events as the process recorded.
    counts = {d.device: len(d.trace) for d in snap.devices}
    expected = truth["n_trace_events"]
    assert [counts.get(i, 0) for i in range(len(expected))] == expected

    for dev in snap.devices:
        events = ref["device_traces"][dev.device]
        t = dev.trace
        assert t.action.tolist() == [ACTION_CODE[e["action"]] for e in events]
        assert t.addr.tolist() == [e["addr"] if "addr" in e else e["device_free"] for e in events]
        assert t.size.tolist() == [e["size"] for e in events]
        assert [dev.streams[s] for s in t.stream.tolist()] == [e["stream"] for e in events]
        assert t.time_us.tolist() == [e.get("time_us", 0) for e in events]
        assert [snap.pools[p] for p in t.pool.tolist()] == [tuple(e.get("pool_id") or DEFAULT_POOL) for e in events]
        # Every event's stack resolves to the very frames the file holds.
        for i in range(0, len(events), max(1, len(events) // 2000)):
            assert snap.stacks.frames_of(int(t.stack[i])) == _frames(events[i].get("frames")), i
        assert dev.compile_context == {
            i: e["compile_context"] for i, e in enumerate(events) if e.get("compile_context", "N/A") != "N/A"
        }

        # Final segments: same addresses, sizes, blocks and stacks.
        raw_segs = [s for s in ref["segments"] if s["device"] == dev.device]
        assert len(dev.segments) == len(raw_segs)
        for seg, rs in zip(dev.segments, raw_segs, strict=True):
            assert (seg.address, seg.total_size, seg.allocated_size, seg.active_size, seg.requested_size) == (
                rs["address"],
                rs["total_size"],
                rs["allocated_size"],
                rs["active_size"],
                rs["requested_size"],
            )
            assert dev.streams[seg.stream] == rs["stream"]
            assert snap.pools[seg.pool] == tuple(rs["segment_pool_id"])
            assert seg.is_expandable == rs["is_expandable"]
            assert snap.stacks.frames_of(seg.stack) == _frames(rs.get("frames"))
            assert [(b.address, b.size, b.requested_size, b.state) for b in seg.blocks] == [
                (b["address"], b["size"], b["requested_size"], b["state"]) for b in rs["blocks"]
            ]
            assert [snap.stacks.frames_of(b.stack) for b in seg.blocks] == [
                _frames(b.get("frames")) for b in rs["blocks"]
            ]

    # The process's own figures for the final state (device 0 / per device).
    stats = truth.get("memory_stats_per_device") or [truth["memory_stats"]]
    for ordinal, st in enumerate(stats):
        segs = snap.device(ordinal).segments if any(d.device == ordinal for d in snap.devices) else []
        assert sum(s.total_size for s in segs) == st["reserved_bytes.all.current"]
        assert sum(s.allocated_size for s in segs) == st["allocated_bytes.all.current"]
        assert (
            sum(b.size for s in segs for b in s.blocks if b.state == "active_allocated")
            == st["allocated_bytes.all.current"]
        )

    assert snap.settings.recorded
    assert snap.settings.conf == truth["alloc_conf"]
    assert len(snap.annotations) == len(ref["external_annotations"])


def test_frames_interned_once_and_spot_frame() -> None:
    snap = _read("two_gpu_pipeline")
    frames = snap.stacks.frames
    assert len(set(frames)) == len(frames)
    assert len(set(snap.stacks.stacks)) == len(snap.stacks.stacks)
    last = snap.devices[0].trace.stack[-1]
    ref = pickle.loads(_raw("two_gpu_pipeline"))["device_traces"][0][-1]["frames"]
    assert snap.stacks.frames_of(int(last))[0] == Frame(ref[0]["filename"], ref[0]["line"], ref[0]["name"])
    assert Frame("/workspace/capture.py", ref[0]["line"], "run_case") in frames


def test_two_devices_have_their_own_streams_and_segments() -> None:
    snap = _read("two_gpu_pipeline")
    assert [d.device for d in snap.devices] == [0, 1]
    assert all(s.device == d.device for d in snap.devices for s in d.segments)


def test_private_pool_and_side_stream_fixtures() -> None:
    graph = _read("gpu_cuda_graph")
    ref = pickle.loads(_raw("gpu_cuda_graph"))
    raw_pools = {tuple(s["segment_pool_id"]) for s in ref["segments"]}
    assert raw_pools - {DEFAULT_POOL}, "the fixture should hold a private pool"
    assert {graph.pools[s.pool] for s in graph.devices[0].segments} == raw_pools
    side = _read("gpu_side_stream")
    raw_streams = {e["stream"] for e in pickle.loads(_raw("gpu_side_stream"))["device_traces"][0]}
    assert set(side.devices[0].streams) >= raw_streams
    assert len(raw_streams) > 1


def test_no_context_and_state_only_warnings() -> None:
    assert {w.code for w in _read("no_context").warnings} >= {"no-frames"}
    assert (_read("no_context").devices[0].trace.stack == -1).all()
    assert "state-only" in {w.code for w in _read("state_only").warnings}
    assert not _read("gpt_varlen_oom").warnings


def test_oom_event_keeps_device_free_in_addr() -> None:
    snap = _read("gpt_varlen_oom")
    ref = pickle.loads(_raw("gpt_varlen_oom"))["device_traces"][0]
    (i,) = np.flatnonzero(snap.devices[0].trace.action == OOM)
    assert snap.devices[0].trace.addr[i] == ref[i]["device_free"]


def test_expansion_stays_far_under_budget_on_real_files() -> None:
    # The expansion cap is 8 nodes per byte; real files must sit well below 1: read under a budget of
    # one node per byte, each file still gives every event its truth counts.
    for case in ("big_all_stacks", "gpt_varlen_oom", "two_gpu_pipeline"):
        raw = _raw(case)
        snap = read_snapshot(raw, limits=ReadLimits(nodes_per_byte=1, min_nodes=0))
        truth = json.loads((FIXTURES / f"{case}.truth.json").read_text())
        assert [len(d.trace) for d in snap.devices] == truth["n_trace_events"]
        # ... and the budget is live on these files: 1,000 nodes in all is refused, by that cap.
        with pytest.raises(SnapshotError) as err:
            read_snapshot(raw, limits=ReadLimits(nodes_per_byte=0, min_nodes=1000))
        assert err.value.code == "snapshot:limit:expansion"


# ---------------------------------------------------------------------------
# Round trips between formats
# ---------------------------------------------------------------------------


def _model_key(snap: Snapshot) -> Any:
    out = []
    for d in snap.devices:
        t = d.trace
        out.append(
            (
                d.device,
                [c.tolist() for c in (t.action, t.addr, t.size, t.stream, t.time_us, t.pool)],
                [snap.stacks.frames_of(int(s)) for s in t.stack],
                d.streams,
                [
                    (
                        s.address,
                        s.total_size,
                        s.requested_size,
                        d.streams[s.stream],
                        snap.pools[s.pool],
                        snap.stacks.frames_of(s.stack),
                        [
                            (b.address, b.size, b.requested_size, b.state, snap.stacks.frames_of(b.stack))
                            for b in s.blocks
                        ],
                    )
                    for s in d.segments
                ],
                d.compile_context,
                d.user_metadata,
            )
        )
    return (out, snap.pools, snap.annotations, snap.settings, snap.layout)


def _torch_zip(payload: bytes, folder: str = "archive") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{folder}/data.pkl", payload)
        zf.writestr(f"{folder}/byteorder", "little")
        zf.writestr(f"{folder}/version", "3\n")
    return buf.getvalue()


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "two_gpu_pipeline", "gpu_cuda_graph"])
def test_round_trips_give_equal_models(case: str, tmp_path: Path) -> None:
    raw = _raw(case)
    obj = pickle.loads(raw)
    reference = _model_key(read_snapshot(raw))
    variants: dict[str, tuple[bytes, str]] = {
        "raw": (raw, "pickle"),
        "gzip": (gzip.compress(raw), "pickle.gz"),
        "zip": (_torch_zip(pickle.dumps(obj, protocol=2)), "torch-zip"),
        "json": (json.dumps(_jsonable(obj)).encode(), "json"),
    }
    for proto in (2, 3, 4, 5):
        variants[f"p{proto}"] = (pickle.dumps(obj, protocol=proto), "pickle")
    for name, (data, fmt) in variants.items():
        path = tmp_path / f"snapshot.{name}.bin"  # names never decide the format
        path.write_bytes(data)
        for source in (data, path):
            snap = read_snapshot(source)
            assert snap.format == fmt, name
            assert _model_key(snap) == reference, name


def test_sniff_format() -> None:
    assert sniff_format(b"\x80\x04\x95") == "pickle"
    assert sniff_format(b"\x1f\x8b\x08") == "gzip"
    assert sniff_format(b"PK\x03\x04") == "zip"
    assert sniff_format(b'  {"segments"') == "json"
    for bad, code in (
        (b"", "snapshot:format:empty"),
        (b"<!DOCTYPE html>", "snapshot:format:not-a-snapshot"),
        (b"hello world", "snapshot:format:not-a-snapshot"),
        (b"\x80\x06", "snapshot:format:unsupported-protocol"),
    ):
        with pytest.raises(SnapshotError) as err:
            sniff_format(bad)
        assert err.value.code == code


# ---------------------------------------------------------------------------
# Legacy layouts and optional keys
# ---------------------------------------------------------------------------

F1 = {"filename": "train.py", "line": 10, "name": "forward"}
F2 = {"filename": "model.py", "line": 3, "name": "linear"}


def test_legacy_segment_list_with_history_blocks() -> None:
    # torch 1.13: memory_snapshot() is a bare list; blocks carry history, no address.
    legacy = [
        {
            "device": 0,
            "address": 1 << 20,
            "total_size": 2 << 20,
            "allocated_size": 512,
            "active_size": 512,
            "stream": 0,
            "segment_type": "small",
            "blocks": [
                {
                    "size": 512,
                    "state": "active_allocated",
                    "history": [{"addr": 1 << 20, "real_size": 500, "frames": [F2, F1]}],
                },
                {"size": (2 << 20) - 512, "state": "inactive", "history": []},
            ],
        }
    ]
    snap = read_snapshot(pickle.dumps(legacy, protocol=2))
    assert snap.layout == "segments-only"
    (dev,) = snap.devices
    assert len(dev.trace) == 0
    (seg,) = dev.segments
    assert [(b.address, b.size, b.requested_size) for b in seg.blocks] == [
        (1 << 20, 512, 500),
        ((1 << 20) + 512, (2 << 20) - 512, 0),
    ]
    assert snap.stacks.frames_of(seg.blocks[0].stack) == [
        Frame("model.py", 3, "linear"),
        Frame("train.py", 10, "forward"),
    ]
    assert seg.requested_size == 500
    codes = {w.code for w in snap.warnings}
    assert {"no-history", "legacy-layout", "no-allocator-settings"} <= codes


def test_torch_2_0_history_layout() -> None:
    snap_2_0 = {
        "segments": [
            {
                "device": 0,
                "address": 4096,
                "total_size": 2 << 20,
                "allocated_size": 1024,
                "active_size": 1024,
                "requested_size": 1000,
                "stream": 0,
                "segment_type": "small",
                "blocks": [
                    {
                        "size": 1024,
                        "requested_size": 1000,
                        "state": "active_allocated",
                        "history": [{"addr": 4096, "real_size": 1000, "frames": [F1]}],
                    },
                    {"size": (2 << 20) - 1024, "requested_size": 0, "state": "inactive"},
                ],
            }
        ],
        "device_traces": [
            [
                {"action": "segment_alloc", "addr": 4096, "size": 2 << 20, "stream": 0, "frames": [F1]},
                {"action": "alloc", "addr": 4096, "size": 1000, "stream": 0, "frames": [F1]},
            ]
        ],
    }
    snap = read_snapshot(pickle.dumps(snap_2_0, protocol=2))
    assert snap.layout == "history"
    t = snap.devices[0].trace
    assert [ACTIONS[a] for a in t.action] == ["segment_alloc", "alloc"]
    assert t.time_us.tolist() == [0, 0]
    assert {"no-time", "no-allocator-settings", "legacy-layout"} <= {w.code for w in snap.warnings}
    assert snap.stacks.frames_of(int(t.stack[1])) == [Frame("train.py", 10, "forward")]
    assert snap.devices[0].segments[0].blocks[1].address == 4096 + 1024


def test_all_optional_keys_of_recent_versions() -> None:
    seg = {
        "device": 1,
        "address": 1 << 30,
        "total_size": 1 << 21,
        "allocated_size": 1 << 21,
        "active_size": 1 << 21,
        "requested_size": 1 << 21,
        "stream": 77,
        "segment_type": "large",
        "segment_pool_id": (3, 0),
        "is_expandable": True,
        "frames": [F1],
        "blocks": [
            {
                "address": 1 << 30,
                "size": 1 << 21,
                "requested_size": 1 << 21,
                "state": "active_allocated",
                "frames": [F2, F1],
                "forward_frames": ["fwd\n"],
            }
        ],
    }
    base = {"stream": 77, "time_us": 5, "compile_context": "N/A", "user_metadata": "", "pool_id": (3, 0)}
    events = [
        {"action": "segment_map", "addr": 1 << 30, "size": 1 << 21, **base},
        {
            "action": "alloc",
            "addr": 1 << 30,
            "size": 1 << 21,
            "frames": [F2, F1],
            **base,
            "compile_context": "Torch-Compiled Region: 0/0",
            "user_metadata": "step=3",
        },
        {"action": "oom", "device_free": 123, "size": 1 << 22, "frames": [F2, F1], "forward_frames": ["x"], **base},
    ]
    snap = read_snapshot(
        pickle.dumps(
            {
                "segments": [seg],
                "device_traces": [[], events],
                "allocator_settings": {
                    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                    "expandable_segments": True,
                    "garbage_collection_threshold": 0.5,
                    "roundup_power2_divisions": {"1": 0, "2": 4},
                },
                "external_annotations": [{"name": "ProfilerStep#1", "stage": "START", "device": 1, "time_us": 4}],
            },
            protocol=5,
        )
    )
    assert [d.device for d in snap.devices] == [0, 1]
    dev = snap.device(1)
    assert dev.streams == [77]
    assert snap.pools == [DEFAULT_POOL, (3, 0)]
    assert dev.trace.pool.tolist() == [1, 1, 1]
    assert dev.trace.addr.tolist() == [1 << 30, 1 << 30, 123]
    assert dev.compile_context == {1: "Torch-Compiled Region: 0/0"}
    assert dev.user_metadata == {1: "step=3"}
    assert dev.trace.stack.tolist()[0] == -1  # no frames key: no stack
    assert dev.segments[0].is_expandable and dev.segments[0].pool == 1
    assert snap.settings.conf == "expandable_segments:True"
    assert snap.settings.raw["roundup_power2_divisions"] == {"1": 0, "2": 4}
    assert snap.annotations[0].name == "ProfilerStep#1"
    assert not snap.warnings


def test_empty_snapshot_of_an_uninitialised_allocator() -> None:
    snap = read_snapshot(pickle.dumps({"segments": [], "device_traces": []}))
    assert snap.devices == []
    assert "no-history" in {w.code for w in snap.warnings}


def test_a_zip_without_exactly_one_data_pkl_is_refused_by_name() -> None:
    # A torch.save archive holds one */data.pkl; none, or two, is not a snapshot.
    for members in ((("archive/other.txt", b"hi"),), (("a/data.pkl", b"\x80\x04N."), ("b/data.pkl", b"\x80\x04N."))):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for name, data in members:
                z.writestr(name, data)
        with pytest.raises(SnapshotError) as err:
            read_snapshot(buf.getvalue())
        assert err.value.code == "snapshot:format:zip-without-pickle"
        assert "exactly one */data.pkl" in str(err.value)
