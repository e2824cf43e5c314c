"""The report JSON on the real fixtures: contract keys, figures against the truth files."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import sys
import threading
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from analysis import fastread, parallel
from analysis.errors import ConfigError
from analysis.reader import ReadLimits
from analysis.report import build_report
from analysis.stages import replays as replays_stage
from analysis.stages import source as source_stage
from analysis.stages.segment_maps import SEGMENT_MAP_MAX_BLOCKS, SEGMENT_MAP_MAX_SEGMENTS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
COMPLETE = [
    "gpt_varlen_oom",
    "frag_oom",
    "infer_varbatch",
    "gpt_varlen_expandable",
    "no_context",
    "two_gpu_pipeline",
    "compiled_train",
]
INCOMPLETE = ["wrapped_ring", "state_only"]

CONTRACT_DEVICE_KEYS = {
    "device",
    "events",
    "summary",
    "oom",
    "steps",
    "timeline",
    "top_stacks",
    "whatif",
    "replay",
    "suggestions",
}
SUMMARY_KEYS = {
    "peak_reserved_bytes",
    "peak_allocated_bytes",
    "peak_requested_bytes",
    "final_reserved_bytes",
    "final_allocated_bytes",
    "peak_is_lower_bound",
}
OOM_KEYS = {
    "event_index",
    "time_us",
    "requested_bytes",
    "device_free_bytes",
    "reserved_bytes",
    "allocated_bytes",
    "cached_free_bytes",
    "largest_free_block_bytes",
    "largest_usable_free_block_bytes",
    "limit_bytes",
    "verdict",
}


@cache
def report(case: str) -> dict[str, Any]:
    return build_report(FIXTURES / f"{case}.pickle.gz")


def truth(case: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{case}.truth.json").read_text())


def stats_of(case: str, device: int) -> dict[str, int]:
    t = truth(case)
    return (t.get("memory_stats_per_device") or [t["memory_stats"]])[device]


@pytest.mark.parametrize("case", COMPLETE + INCOMPLETE)
def test_report_has_every_contract_key_and_is_plain_json(case: str) -> None:
    rep = report(case)
    assert rep["schema"] == "oomscope.report/1"
    assert set(rep["source"]) >= {"filename", "bytes", "sha256", "format"}
    assert rep["source"]["format"] == "pickle.gz"
    assert set(rep["capture"]) >= {
        "has_trace",
        "trace_complete",
        "has_frames",
        "stacks",
        "allocator_settings",
        "warnings",
    }
    for dev in rep["devices"]:
        assert set(dev) >= CONTRACT_DEVICE_KEYS
        assert set(dev["summary"]) >= SUMMARY_KEYS
        if dev["oom"] is not None:
            assert set(dev["oom"]) >= OOM_KEYS
        for row in dev["steps"]:
            assert set(row) >= {
                "index",
                "start_us",
                "end_us",
                "peak_allocated_bytes",
                "peak_reserved_bytes",
                "reserved_end_bytes",
            }
        for row in dev["top_stacks"]:
            assert set(row) >= {"when", "bytes", "count", "frames"}
            assert row["when"] in ("peak", "oom", "end")
        for item in dev["whatif"]:
            assert set(item) >= {"config", "peak_reserved_bytes", "oom_avoided", "steps"}
        assert set(dev["replay"]) >= {
            "recorded_config",
            "segment_events_recorded",
            "segment_events_reproduced",
            "exact",
        }
        for s in dev["suggestions"]:
            assert set(s) >= {"id", "title", "config", "evidence", "estimated_saving_bytes"}
    # Strict JSON: no NaN, no tuples or numpy scalars sneaking through.
    assert json.loads(json.dumps(rep, allow_nan=False)) == rep


@pytest.mark.parametrize("case", COMPLETE)
def test_summary_equals_the_process_own_memory_stats(case: str) -> None:
    rep = report(case)
    assert rep["capture"]["trace_complete"] is True
    for dev in rep["devices"]:
        ms = stats_of(case, dev["device"])
        s = dev["summary"]
        assert s["peak_reserved_bytes"] == ms["reserved_bytes.all.peak"]
        assert s["peak_allocated_bytes"] == ms["allocated_bytes.all.peak"]
        assert s["peak_requested_bytes"] == ms["requested_bytes.all.peak"]
        assert s["final_reserved_bytes"] == ms["reserved_bytes.all.current"]
        assert s["final_allocated_bytes"] == ms["allocated_bytes.all.current"]
        assert s["peak_is_lower_bound"] is False


@pytest.mark.parametrize("case", INCOMPLETE)
def test_incomplete_traces_say_so_and_give_lower_bounds(case: str) -> None:
    rep = report(case)
    assert rep["capture"]["trace_complete"] is False
    codes = {w["code"] for w in rep["capture"]["warnings"]}
    assert codes & {"trace-truncated", "history-started-late", "state-only", "no-history"}
    ms = stats_of(case, 0)
    s = rep["devices"][0]["summary"]
    assert s["peak_is_lower_bound"] is True
    assert s["peak_reserved_bytes"] <= ms["reserved_bytes.all.peak"]
    assert s["peak_allocated_bytes"] <= ms["allocated_bytes.all.peak"]
    # The final state is always complete.
    assert s["final_reserved_bytes"] == ms["reserved_bytes.all.current"]
    # What-ifs of part of the history are never turned into allocator advice.
    ids = {x["id"] for x in rep["devices"][0]["suggestions"]}
    assert not ids & {"expandable_segments", "max_split_size_mb", "roundup_power2_divisions"}
    assert "capture_settings" in ids


def test_capture_describes_how_history_was_recorded() -> None:
    assert report("gpt_varlen_oom")["capture"]["stacks"] == truth("gpt_varlen_oom")["stacks"] == "python"
    assert report("no_context")["capture"]["has_frames"] is False
    assert report("no_context")["capture"]["stacks"] == "none"
    assert report("state_only")["capture"]["has_trace"] is False
    assert report("gpt_varlen_expandable")["capture"]["allocator_settings"]["expandable_segments"] is True


def test_two_devices_get_one_entry_each_with_their_own_figures() -> None:
    rep = report("two_gpu_pipeline")
    assert [d["device"] for d in rep["devices"]] == [0, 1]
    t = truth("two_gpu_pipeline")
    assert [d["events"] for d in rep["devices"]] == t["n_trace_events"]
    # Device 1 has no step marks of its own: the process's steps apply to it too.
    for dev in rep["devices"]:
        log = [row["reserved"][dev["device"]] for row in t["workload_log"]]
        assert [s["reserved_end_bytes"] for s in dev["steps"]] == log


def test_report_from_bytes_matches_report_from_path() -> None:
    path = FIXTURES / "frag_oom.pickle.gz"
    data = path.read_bytes()
    rep = build_report(data, filename="x.pickle.gz")
    assert rep["source"] == {
        "filename": "x.pickle.gz",
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "format": "pickle.gz",
    }
    raw = build_report(gzip.decompress(data))
    assert raw["source"]["format"] == "pickle"
    assert raw["devices"][0]["summary"] == report("frag_oom")["devices"][0]["summary"]


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "gpu_side_stream", "wrapped_ring"])
def test_the_same_file_always_gives_the_same_report(case: str) -> None:
    # Stack and group ids once followed object addresses; a second read (other addresses) differed.
    keep = [bytearray(4096) for _ in range(1000)]  # move the next read's objects elsewhere
    again = build_report(FIXTURES / f"{case}.pickle.gz")
    del keep
    assert json.dumps(again, sort_keys=True) == json.dumps(report(case), sort_keys=True)


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "two_gpu_pipeline", "gpu_empty_cache"])
def test_policy_replays_in_child_processes_give_the_serial_report(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _side_by_side_gives_the_serial_report(case, monkeypatch, threads=False)


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "two_gpu_pipeline", "gpu_empty_cache", "gpu_gc_threshold"])
def test_policy_replays_in_threads_give_the_serial_report(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The threads take turns between any two bytecodes, so that a state two of them share without
    # a lock shows (gpu_gc_threshold: the GC's limit bound replays the recorded trace again).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _side_by_side_gives_the_serial_report(case, monkeypatch, threads=True)
    finally:
        sys.setswitchinterval(interval)


def _side_by_side_gives_the_serial_report(case: str, monkeypatch: pytest.MonkeyPatch, *, threads: bool) -> None:
    pools: list[parallel.Pool] = []

    class Recording(parallel.Pool):
        def __init__(self, jobs: int, *, threads: bool = False) -> None:
            super().__init__(jobs, threads=use_threads)
            self.tasks: list[parallel.Pending] = []
            pools.append(self)

        def submit(self, fn: Any) -> parallel.Pending:
            self.tasks.append(super().submit(fn))
            return self.tasks[-1]

    use_threads = threads
    monkeypatch.setattr(replays_stage, "Pool", Recording)
    whatifs = ("expandable_segments:True", "max_split_size_mb:256")
    serial = build_report(FIXTURES / f"{case}.pickle.gz", whatif=whatifs)
    assert pools and not any(t.forked or t.threaded for p in pools for t in p.tasks)
    pools.clear()
    beside = build_report(FIXTURES / f"{case}.pickle.gz", whatif=whatifs, jobs=3)
    tasks = [t for p in pools for t in p.tasks]
    # One check per device plus each distinct what-if config (and, on threads, each mirror replay),
    # every one from a child; on threads, a task nobody had taken up yet runs in the thread asking.
    assert len(tasks) >= 3
    if threads:
        assert any(t.threaded for t in tasks) and not any(t.forked for t in tasks)
        assert len(tasks) > 3, "the mirror replays ran as tasks of their own"
    else:
        assert all(t.forked for t in tasks)
    assert json.dumps(beside, sort_keys=True) == json.dumps(serial, sort_keys=True)
    assert serial["devices"][0]["whatif"], "the comparison covers what-if items"


def test_progress_reports_stages_in_order_with_fractions_in_range() -> None:
    seen: list[tuple[str, float]] = []
    build_report(FIXTURES / "two_gpu_pipeline.pickle.gz", progress=lambda s, f: seen.append((s, f)))
    stages = [s for s, _ in seen]
    assert stages[0] == "reading" and stages[-1] == "analysing"
    assert {"reading", "replaying", "analysing"} <= set(stages)
    assert all(0.0 <= f <= 1.0 for _, f in seen)


def test_whatif_candidates_never_repeat_a_recorded_setting_and_include_user_configs() -> None:
    rep = build_report(FIXTURES / "gpt_varlen_expandable.pickle.gz", whatif=("max_split_size_mb:300",))
    configs = [w["config"] for w in rep["devices"][0]["whatif"]]
    assert not any(c.startswith("expandable_segments") for c in configs)
    assert "max_split_size_mb:300" in configs
    user = next(w for w in rep["devices"][0]["whatif"] if w["config"] == "max_split_size_mb:300")
    assert user["origin"] == "user"
    # The recorded run logged 27 steps (its truth's workload_log) and then failed: every step is predicted.
    logged = len(truth("gpt_varlen_expandable")["workload_log"])
    assert len(user["steps"]) == len(rep["devices"][0]["steps"]) == logged == 27
    auto = report("gpt_varlen_oom")["devices"][0]["whatif"]
    settings = {w["setting"] for w in auto if w["origin"] == "auto"}
    assert {"expandable_segments", "max_split_size_mb", "roundup_power2_divisions"} <= settings
    # The run died at a per-process cap, so the GC threshold is tried too.
    assert "garbage_collection_threshold" in settings
    split = next(w for w in auto if w["setting"] == "max_split_size_mb")
    assert len(split["tried"]) >= 2
    assert split["peak_reserved_bytes"] == min(
        t["peak_reserved_bytes"] for t in split["tried"] if t["oom_avoided"] == split["oom_avoided"]
    )


def test_gc_threshold_is_not_tried_without_a_cap() -> None:
    settings = {w["setting"] for w in report("infer_varbatch")["devices"][0]["whatif"]}
    assert "garbage_collection_threshold" not in settings
    assert "expandable_segments" in settings


def test_bad_whatif_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        build_report(FIXTURES / "frag_oom.pickle.gz", whatif=("max_split_size_mb:banana",))


def test_replay_check_reproduces_the_recorded_segments() -> None:
    check = report("gpt_varlen_oom")["devices"][0]["replay"]
    assert check["exact"] is True
    # The process's own counters: num_device_alloc cudaMallocs + num_device_free cudaFrees (105 + 24).
    stats = truth("gpt_varlen_oom")["memory_stats"]
    recorded = stats["num_device_alloc"] + stats["num_device_free"]
    assert check["segment_events_recorded"] == check["segment_events_reproduced"] == recorded


@pytest.mark.parametrize("case", ["gpt_varlen_oom", "frag_oom", "infer_varbatch"])
def test_segment_maps_are_bounded_and_add_up(case: str) -> None:
    dev = report(case)["devices"][0]
    for when, smap in dev["segment_maps"].items():
        at = dev["summary"]["peak_reserved_event_index"] if when == "reserved_peak" else dev["moments"][when]
        assert smap["event_index"] == at
        assert len(smap["segments"]) <= SEGMENT_MAP_MAX_SEGMENTS
        total = 0
        allocated = 0
        for seg in smap["segments"]:
            assert isinstance(seg["address"], str) and seg["address"].startswith("0x")
            assert len(seg["blocks"]) <= SEGMENT_MAP_MAX_BLOCKS
            assert sum(b["size"] for b in seg["blocks"]) == seg["size"]
            offsets = [b["offset"] for b in seg["blocks"]]
            assert offsets == sorted(offsets) and offsets[0] == 0
            total += seg["size"]
            allocated += seg["allocated_bytes"]
        if smap["segments_shown"] == smap["segments_total"]:
            idx = smap["event_index"]
            tl = dev["timeline"]
            at = tl["index"].index(idx)
            assert total == tl["reserved_bytes"][at]
            assert allocated == tl["allocated_bytes"][at]


def test_churn_adds_up_to_every_request_and_names_the_optimizer() -> None:
    from analysis.model import ALLOC
    from analysis.reader import read_snapshot

    trace = read_snapshot(FIXTURES / "gpt_varlen_oom.pickle.gz").devices[0].trace
    churn = report("gpt_varlen_oom")["devices"][0]["churn"]
    assert sum(r["bytes"] for r in churn) == int(trace.size[trace.action == ALLOC].sum())
    assert sum(r["count"] for r in churn) == int((trace.action == ALLOC).sum())
    # After the frame-less backward, the multi-tensor Adam step allocates the most over the run.
    assert any("_multi_tensor_adam" in r["label"] for r in churn[:3])


def test_leaks_are_the_end_state_with_a_series_per_step() -> None:
    dev = report("gpt_varlen_oom")["devices"][0]
    leaks = dev["leaks"]
    assert sum(r["bytes"] for r in leaks) == dev["summary"]["final_allocated_bytes"]
    logged = len(truth("gpt_varlen_oom")["workload_log"])  # 23 steps
    for row in leaks:
        assert row["steps"] == len(dev["steps"]) == logged
        assert len(row["series_requested_bytes"]) == logged


def test_a_user_whatif_equal_to_a_candidate_is_listed_once_as_the_users() -> None:
    rep = build_report(
        FIXTURES / "gpt_varlen_oom.pickle.gz", whatif=("max_split_size_mb:256", "expandable_segments:True")
    )
    items = rep["devices"][0]["whatif"]
    configs = [w["config"] for w in items]
    assert len(configs) == len(set(configs))
    by_config = {w["config"]: w for w in items}
    assert by_config["max_split_size_mb:256"]["origin"] == "user"
    assert by_config["expandable_segments:True"]["origin"] == "user"
    # The report's own max_split_size_mb candidates still compete without the user's value.
    auto_split = [w for w in items if w["setting"] == "max_split_size_mb" and w["origin"] == "auto"]
    assert len(auto_split) == 1
    assert "max_split_size_mb:256" not in [t["config"] for t in auto_split[0]["tried"]]


def test_every_oom_of_the_trace_is_listed() -> None:
    # frag_oom fills its 4 GiB cap until the first OOM (caught by the program), then hits a second.
    dev = report("frag_oom")["devices"][0]
    ooms = dev["ooms"]
    assert [o["event_index"] for o in ooms] == [745, 1311]
    assert ooms[-1]["event_index"] == dev["oom"]["event_index"]
    assert ooms[-1]["requested_bytes"] == dev["oom"]["requested_bytes"]
    assert dev["oom"]["ooms_in_trace"] == len(ooms)
    # The memory_stats of the process count both.
    assert truth("frag_oom")["memory_stats"]["num_ooms"] == 2
    for o in ooms:
        assert o["allocated_bytes"] <= o["reserved_bytes"]
        assert o["step"] is None  # frag_oom has no step annotations
    # A run that died inside step 13 lists its OOM in step 13.
    assert [o["step"] for o in report("gpu_grow_oom")["devices"][0]["ooms"]] == [13]


def test_without_a_message_the_limit_is_labelled_a_lower_bound() -> None:
    dev = report("gpt_varlen_oom")["devices"][0]
    assert dev["limit"]["source"] == "inferred" and dev["limit"]["is_lower_bound"] is True
    assert dev["limit"]["bytes"] == dev["summary"]["peak_reserved_bytes"] == dev["oom"]["limit_bytes"]
    assert "at least" in dev["oom"]["explanation"]
    # Devices without an OOM and without a given limit have none to show.
    assert report("infer_varbatch")["devices"][0]["limit"] is None


def test_the_source_hash_is_the_files_sha256_read_in_slices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = FIXTURES / "frag_oom.pickle.gz"
    data = path.read_bytes()
    assert source_stage.source_info(path, None) == {
        "filename": "frag_oom.pickle.gz",
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "format": None,
    }
    # Past one slice, read or from the reader's mapping of the file, and an empty file.
    big = tmp_path / "big.bin"
    big.write_bytes(data * (source_stage._HASH_SLICE // len(data) + 2))
    want = hashlib.sha256(big.read_bytes()).hexdigest()
    assert source_stage.source_info(big, "b")["sha256"] == want
    monkeypatch.setattr(source_stage, "_MAPPED_SLICE", source_stage._HASH_SLICE // 3)  # several slices of it
    with fastread.mapped_file(big, ReadLimits()) as mapped:
        assert mapped is not None
        hashed = source_stage.source_info(big, "b", mapped.data)
    assert (hashed["sha256"], hashed["bytes"]) == (want, big.stat().st_size)
    empty = tmp_path / "empty.pickle"
    empty.write_bytes(b"")
    assert source_stage.source_info(empty, None)["sha256"] == hashlib.sha256(b"").hexdigest()
    assert source_stage.source_info(empty, None)["bytes"] == 0


@pytest.mark.parametrize("hash_later", [True, False])
def test_a_hash_taken_beside_the_read_is_the_files_and_closes_its_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hash_later: bool
) -> None:
    # The report's hash goes on after the read where nothing forks (issue 34): it is the file's either
    # way, and its thread closes the mapping it shared with the compiled reader once both are done.
    # Small slices, so that the file is many of them and the pages are let go slice by slice.
    monkeypatch.setattr(source_stage, "_MAPPED_SLICE", 4096)
    monkeypatch.setattr(source_stage, "_HASH_SLICE", 4096)
    path = tmp_path / "gpt.pickle"
    path.write_bytes(gzip.decompress((FIXTURES / "gpt_varlen_expandable.pickle.gz").read_bytes()))
    src = source_stage.read(path, None, hash_later=hash_later)
    hashing = src._hash
    if not hash_later:
        assert not hashing._thread.is_alive()  # joined before read returns: a caller may fork next
    section = src.section()
    assert section == {
        "filename": "gpt.pickle",
        "bytes": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "format": "pickle",
    }
    assert src.size == path.stat().st_size
    assert not hashing._thread.is_alive()
    if fastread.wanted(None):
        assert hashing._mapped is not None and hashing._mapped.closed


def test_a_refused_file_stops_the_hash_beside_it(tmp_path: Path) -> None:
    from analysis.errors import SnapshotError

    evil = tmp_path / "evil.pickle"
    evil.write_bytes(b"\x80\x04cos\nsystem\n(S'true'\ntR." * 2000)
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(SnapshotError):
        source_stage.read(evil, None, hash_later=True)
    assert {t.ident for t in threading.enumerate()} <= before  # the hash thread was joined


def test_no_thread_for_the_hash_leaves_no_mapping_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Where no thread can start (an address-space limit), the read fails as before and the file's
    # mapping, already handed to the hash, is closed by the caller.
    if not fastread.wanted(None):
        pytest.skip("no compiled reader: nothing is mapped")
    path = tmp_path / "frag.pickle"
    path.write_bytes(gzip.decompress((FIXTURES / "frag_oom.pickle.gz").read_bytes()))
    mapped: list[Any] = []
    real = fastread.mapped_file

    def recording(p: Path, limits: ReadLimits) -> Any:
        with real(p, limits) as m:
            mapped.append(m)
            yield m

    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(fastread, "mapped_file", contextlib.contextmanager(recording))
    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(RuntimeError):
        source_stage.read(path, None, hash_later=True)
    assert len(mapped) == 1 and mapped[0].data.closed


class _Mapping:
    """What ``_let_go_of`` asks of a mapping: its length, and the ranges it lets go."""

    def __init__(self, size: int) -> None:
        self.size, self.calls = size, []

    def __len__(self) -> int:
        return self.size

    def madvise(self, option: int, start: int, length: int) -> None:
        self.calls.append((option, start, length))


def test_only_pages_wholly_hashed_are_let_go() -> None:
    import mmap

    page = mmap.PAGESIZE
    m = _Mapping(10 * page + 100)
    source_stage._let_go_of(m, 0, 3 * page + 5)  # type: ignore[arg-type]
    source_stage._let_go_of(m, 3 * page + 5, 4 * page)  # type: ignore[arg-type]  # no whole page
    source_stage._let_go_of(m, 4 * page, 10 * page + 100)  # type: ignore[arg-type]  # the file's end: its last part-page too
    assert m.calls == [
        (mmap.MADV_DONTNEED, 0, 3 * page),
        (mmap.MADV_DONTNEED, 4 * page, 6 * page + 100),
    ]


def test_a_mapping_let_go_reads_the_same_bytes(tmp_path: Path) -> None:
    # MADV_DONTNEED on the read-only file mapping drops its pages, not the file's bytes: read again,
    # they come back from the page cache (the hash that outlives the read reads such pages).
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 40000)
    with fastread.mapped_file(path, ReadLimits()) as mapped:
        assert mapped is not None
        first = hashlib.sha256(mapped.data).hexdigest()
        source_stage._let_go_of(mapped.data, 0, len(mapped.data))
        assert hashlib.sha256(mapped.data).hexdigest() == first == hashlib.sha256(path.read_bytes()).hexdigest()


def test_files_the_compiled_reader_leaves_are_read_or_refused_as_the_reader_does(tmp_path: Path) -> None:
    # build_report maps the file once for the compiled reader and the hash (stages.source.read); a file
    # that reader leaves goes to the Python reader, from the path: a JSON snapshot is read, a
    # hostile pickle refused with the reader's own code, and the hash is the file's either way.
    import pickle

    from analysis.errors import SnapshotError
    from analysis.reader import read_snapshot

    raw = gzip.decompress((FIXTURES / "frag_oom.pickle.gz").read_bytes())
    obj = pickle.loads(raw)
    as_json = tmp_path / "frag.json"
    as_json.write_text(json.dumps(obj, default=list))
    rep = build_report(as_json)
    assert rep["source"]["format"] == "json"
    assert rep["source"]["sha256"] == hashlib.sha256(as_json.read_bytes()).hexdigest()
    assert rep["devices"][0]["summary"] == report("frag_oom")["devices"][0]["summary"]
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(b"\x80\x04cos\nsystem\n(S'true'\ntR.")
    with pytest.raises(SnapshotError) as from_report:
        build_report(evil)
    with pytest.raises(SnapshotError) as from_reader:
        read_snapshot(evil, compiled=False)
    assert (from_report.value.code, str(from_report.value)) == (from_reader.value.code, str(from_reader.value))
    empty = tmp_path / "empty.pickle"
    empty.write_bytes(b"")
    with pytest.raises(SnapshotError) as nothing:
        build_report(empty)
    with pytest.raises(SnapshotError) as nothing_read:
        read_snapshot(empty)
    assert nothing.value.code == nothing_read.value.code
