"""Hostile inputs: each refused with its own code, fast, in bounded memory, running nothing.

Every case runs in its own child process (forked from one runner that has
already imported the reader, so a case costs milliseconds, not an interpreter
start) under RLIMIT_AS = the runner's size + 1 GiB and an alarm. Each is read
both from a path and from bytes (the two unpickling routes), through the default
reader (the compiled one where it is built) and the Python reader: same code,
same message. Payloads try to
create a canary file; it must never exist.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.analysis.hostile_cases import Case, F, _Evil, build_cases, snapshot_dict

ROOT = Path(__file__).resolve().parents[2]
HEADROOM = 1 << 30  # address space a case may add to the runner's
ALARM_S = 30  # a case that hangs is killed (and fails); each must finish within MAX_SECONDS
MAX_SECONDS = 10.0

RUNNER = r"""
import json, os, resource, signal, sys, time
sys.path.insert(0, {root!r})
from analysis.errors import SnapshotError
from analysis.reader import ReadLimits, read_snapshot

def vm_size():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

def run(path, limits):
    cap = vm_size() + {headroom}
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    signal.alarm({alarm})
    out = {{}}
    # The default reader (the compiled one where it is built) and the Python reader, its reference.
    for how in ("path", "bytes", "path/python", "bytes/python"):
        t0 = time.perf_counter()
        try:
            source = path if how.startswith("path") else open(path, "rb").read()
            read_snapshot(source, limits=ReadLimits(**limits), compiled=None if "/" not in how else False)
            out[how] = ["accepted", time.perf_counter() - t0, ""]
        except SnapshotError as exc:
            out[how] = [exc.code, time.perf_counter() - t0, exc.message]
        except BaseException as exc:
            out[how] = ["escaped " + type(exc).__name__ + ": " + str(exc)[:200], time.perf_counter() - t0, ""]
    return out

for line in sys.stdin:
    name, path, limits = json.loads(line)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            result = run(path, limits)
        except BaseException as exc:
            result = {{"crash": repr(exc)}}
        os.write(w, json.dumps(result).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    result = json.loads(data) if data else {{"crash": "child died, wait status %d" % status}}
    print(json.dumps([name, result]), flush=True)
"""

# Built once at import (collection needs the names); the canary lives in a fresh directory.
WORK = Path(tempfile.mkdtemp(prefix="oomscope-hostile-"))
CANARY = WORK / "canary"
CASES = build_cases(CANARY)
CASE_NAMES = sorted(CASES)


@pytest.fixture(scope="module")
def hostile() -> tuple[dict[str, Case], dict[str, dict[str, Any]], Path]:
    lines = []
    for name, case in CASES.items():
        path = WORK / f"{name}.bin"  # the name never tells the format
        path.write_bytes(case.data)
        lines.append(json.dumps([name, str(path), case.limits]))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    script = RUNNER.format(root=str(ROOT), headroom=HEADROOM, alarm=ALARM_S)
    proc = subprocess.run(
        [sys.executable, "-c", script],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=ALARM_S * 4 + 60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = dict(json.loads(line) for line in proc.stdout.splitlines())
    return CASES, results, CANARY


@pytest.mark.parametrize("name", CASE_NAMES)
def test_hostile_input_refused_with_its_code(name: str, hostile: Any) -> None:
    cases, results, canary = hostile
    result = results[name]
    assert "crash" not in result, result.get("crash")
    expected = cases[name].code
    for how in ("path", "bytes", "path/python", "bytes/python"):
        code, seconds, _message = result[how]
        assert code == expected, f"{how}: {code}"
        assert seconds < MAX_SECONDS, f"{how} took {seconds:.1f}s"
    # The compiled reader refuses nothing itself: the refusal, message included, is the reference's.
    assert result["path"][2] == result["path/python"][2]
    assert result["bytes"][2] == result["bytes/python"][2]
    assert not canary.exists(), "a payload ran"


def test_no_payload_ran(hostile: Any) -> None:
    assert len(hostile[1]) == len(CASES)
    assert not hostile[2].exists()


def test_canary_payload_is_live(tmp_path: Path) -> None:
    """The payloads are real: plain pickle.loads runs them (in a child process)."""
    canary = tmp_path / "canary"
    payload = pickle.dumps(_Evil(f"touch {canary}"), protocol=4)
    subprocess.run(
        [sys.executable, "-c", "import pickle,sys; pickle.loads(sys.stdin.buffer.read())"],
        input=payload,
        check=True,
        timeout=30,
    )
    assert canary.exists()
    snap = snapshot_dict(200)
    snap["device_traces"][0][150]["frames"] = [F, {"filename": "x.py", "line": 2, "name": _Evil(f"touch {canary}")}]
    nested = pickle.dumps(snap, protocol=2)
    canary.unlink()
    subprocess.run(
        [sys.executable, "-c", "import pickle,sys; pickle.loads(sys.stdin.buffer.read())"],
        input=nested,
        check=True,
        timeout=30,
    )
    assert canary.exists()
