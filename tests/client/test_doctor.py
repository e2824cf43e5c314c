"""The capture doctor in the client (``oomscope_client.doctor``) and ``record(dry_step=...)``, on the torch
stand-in of ``conftest.py`` fed with real captures: the ring buffer sized from one step, the sidecar's account of
how recording was started, the one-line problems before an upload, and a 0-byte dump never sent.
"""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import oomscope_client
import pytest
from oomscope_client import doctor
from oomscope_client.capture import DRY_STEP_MAX_ENTRIES

from analysis import doctor as site_doctor
from analysis.report import build_report
from tests.client.conftest import CLIENT_DIR

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RING = FIXTURES / "wrapped_ring.pickle.gz"


def real_snapshot(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = pickle.loads(gzip.decompress(path.read_bytes()))
    return data


def per_step_of(case: str) -> int | None:
    return site_doctor.events_per_step(build_report(FIXTURES / f"{case}.pickle.gz")["devices"][0])


def test_the_client_sizes_a_ring_as_the_site_advises() -> None:
    measured = [per_step_of(case) for case in ("wrapped_ring", "gpt_varlen_oom", "big_all_stacks")]
    assert measured[0] == 1614 and all(measured)
    for per_step in [*measured, None, 1, 7_999, 8_000, 8_001, 123_457]:
        assert doctor.sized_max_entries(per_step) == site_doctor.sized_max_entries(per_step), per_step
    assert doctor.sized_max_entries(123_457) == 20_000_000  # 123,457 x 100 x 1.25, rounded up


def test_record_sizes_max_entries_from_a_dry_step(torch: Any) -> None:
    per_step = per_step_of("big_all_stacks")
    assert per_step is not None
    trace: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    torch.cuda.memory._record_memory_history = lambda **kw: calls.append(kw)
    torch.cuda.memory._snapshot = lambda: {"segments": [], "device_traces": [trace]}
    rec = oomscope_client.record(dry_step=lambda: trace.extend({"action": "alloc"} for _ in range(per_step)))
    assert [c["max_entries"] for c in calls] == [DRY_STEP_MAX_ENTRIES, site_doctor.sized_max_entries(per_step)]
    assert all("clear_history" not in c for c in calls)  # the dry step's history is kept
    assert rec.events_per_step == per_step and rec.options["max_entries"] == calls[-1]["max_entries"]


def test_a_dump_from_a_ring_too_small_says_so(torch: Any, tmp_path: Path) -> None:
    oomscope_client.record(max_entries=5000)  # what the wrapped_ring capture was recorded with
    dumper = oomscope_client.dump_on_oom(tmp_path, excepthook=False, verdict=False)
    dumper.snapshot_source = lambda: real_snapshot(RING)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.fake_fail_allocation(1 << 20)  # the observer dumps, with the real 5,000-event ring
    sidecar = json.loads(dumper.sidecars[0].read_text())
    assert sidecar["history"]["max_entries"] == 5000 and sidecar["n_trace_events"] == [5000]
    found = doctor.problems(dumper.paths[0], sidecar)
    assert [p.code for p in found] == ["ring-full"] and found[0].usable
    assert found[0].line.startswith("the ring buffer is full (5,000 events = max_entries): it dropped the start")


def test_the_cli_does_not_send_a_0_byte_dump(tmp_path: Path) -> None:
    empty = tmp_path / "oom.pickle.gz"
    empty.write_bytes(b"")
    done = subprocess.run(
        [sys.executable, "-m", "oomscope_client", "upload", str(empty), "--url", "http://127.0.0.1:9", "--token", "t"],
        env={"PYTHONPATH": str(CLIENT_DIR), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"oomscope capture doctor: {empty} is empty (0 bytes): the dump never finished")
    assert "cannot reach" not in done.stderr  # nothing was sent
