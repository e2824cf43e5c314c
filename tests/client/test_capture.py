"""OomDumper's own logic (lazy attach, one dump per OOM, sidecar, excepthook chain) on conftest's torch stand-in."""

from __future__ import annotations

import gzip
import json
import pickle
import sys

import oomscope_client
import pytest
from oomscope_client.capture import SIDECAR_FORMAT


@pytest.fixture(autouse=True)
def _restore_excepthook():
    saved = sys.excepthook
    yield
    sys.excepthook = saved


def test_observer_attach_waits_for_cuda_init(torch, tmp_path):
    dumper = oomscope_client.dump_on_oom(tmp_path)
    assert not dumper.observer_attached  # attaching now would crash real torch
    assert torch.fake_state["observers"] == []
    torch.fake_init()
    assert dumper.observer_attached
    assert len(torch.fake_state["observers"]) == 1


def test_one_oom_gives_one_dump_with_the_message(torch, tmp_path):
    dumper = oomscope_client.dump_on_oom(tmp_path)
    with pytest.raises(torch.cuda.OutOfMemoryError), dumper:
        torch.fake_fail_allocation(3 << 30)
    snapshots = sorted(tmp_path.glob("*.pickle.gz"))
    sidecars = sorted(tmp_path.glob("*.json"))
    assert [p.name for p in snapshots] == [p.name for p in dumper.paths]
    assert len(snapshots) == 1
    assert len(sidecars) == 1
    snap = pickle.loads(gzip.decompress(snapshots[0].read_bytes()))
    assert snap["device_traces"][0][0]["action"] == "oom"
    side = json.loads(sidecars[0].read_text())
    assert side["format"] == SIDECAR_FORMAT
    assert side["trigger"] == "observer"
    assert side["snapshot"] == snapshots[0].name
    assert side["oom_message"] == f"CUDA out of memory. Tried to allocate {3 << 30} bytes"
    assert side["observer"] == {
        "device": 0,
        "alloc_bytes": 3 << 30,
        "allowed_bytes": 4 << 30,
        "device_free_bytes": 100 << 30,
    }
    assert side["memory_stats"]["num_ooms"] == 1
    assert side["n_trace_events"] == [1]
    assert side["pickle_bytes"] == len(pickle.dumps(snap, protocol=4))


def test_excepthook_dumps_when_the_observer_is_off_and_chains(torch, tmp_path):
    seen = []
    sys.excepthook = lambda *args: seen.append(args[0])
    oomscope_client.dump_on_oom(tmp_path, observer=False, compress=False)
    try:
        torch.fake_fail_allocation(1 << 20)
    except torch.cuda.OutOfMemoryError as e:
        sys.excepthook(type(e), e, e.__traceback__)
    (snapshot,) = tmp_path.glob("*.pickle")
    assert pickle.loads(snapshot.read_bytes())["segments"] == []
    side = json.loads(snapshot.with_suffix(".json").read_text())
    assert side["trigger"] == "exception"
    assert side["observer"] is None
    assert seen == [torch.cuda.OutOfMemoryError]  # the previous hook still prints the error


def test_max_dumps_limits_repeated_ooms_and_other_errors_pass(torch, tmp_path):
    dumper = oomscope_client.dump_on_oom(tmp_path, max_dumps=1)
    for _ in range(3):
        with pytest.raises(torch.cuda.OutOfMemoryError), dumper:
            torch.fake_fail_allocation(1 << 20)
    with pytest.raises(KeyError), dumper:
        raise KeyError("not an OOM")
    assert len(list(tmp_path.glob("*.pickle.gz"))) == 1
    assert len(dumper.paths) == 1


def test_upload_callable_runs_after_the_dump(torch, tmp_path):
    uploaded = []
    dumper = oomscope_client.dump_on_oom(tmp_path, upload=lambda p: uploaded.append(p) or {"id": "abc"})
    with pytest.raises(torch.cuda.OutOfMemoryError), dumper:
        torch.fake_fail_allocation(1 << 20)
    dumper.wait(10)
    assert uploaded == dumper.paths
    side = json.loads(dumper.sidecars[0].read_text())
    assert side["upload"] == {"id": "abc"}


def test_record_passes_options_and_stops_on_exit(torch):
    with oomscope_client.record(max_entries=1234) as rec:
        assert torch.fake_state["history"] == {
            "enabled": "all",
            "context": "all",
            "stacks": "python",
            "max_entries": 1234,
        }
        assert rec.active
    assert torch.fake_state["history"] == {"enabled": None}
    assert not rec.active


def test_the_sidecar_is_never_read_half_written(torch, tmp_path):
    # The upload thread reads the sidecar (_upload_arguments) while the training thread adds the OOM message to
    # it: a full-suite run once read it empty ("the upload failed: Expecting value: line 1 column 1"). Each
    # update replaces the file whole, so a reader that does not take the lock sees the old or the new one.
    import threading

    dumper = oomscope_client.dump_on_oom(tmp_path)
    with pytest.raises(torch.cuda.OutOfMemoryError), dumper:
        torch.fake_fail_allocation(3 << 30)
    sidecar = dumper.sidecars[0]
    stop = threading.Event()

    def keep_updating() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            dumper._update_sidecar(sidecar, {"note": "x" * (n % 5000)})

    writer = threading.Thread(target=keep_updating)
    writer.start()
    try:
        for _ in range(3000):
            assert json.loads(sidecar.read_text())["snapshot"] == dumper.paths[0].name
    finally:
        stop.set()
        writer.join()
