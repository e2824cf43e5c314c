"""Hostile inputs: each refused with its own code, fast, in bounded memory, running nothing.

Every case runs in a child process under RLIMIT_AS = 1 GiB and a timeout, and is
read both from a path and from bytes (the two unpickling paths). Payloads try to
create a canary file; it must never exist.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.analysis.hostile_cases import F, Case, _Evil, build_cases, snapshot_dict

ROOT = Path(__file__).resolve().parents[2]
MEMORY_CAP = 1 << 30
TIMEOUT_S = 60  # generous for a loaded CI box; each case must finish within seconds (asserted below)
MAX_SECONDS = 10.0

CHILD = r"""
import json, os, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
sys.path.insert(0, {root!r})
from analysis.errors import SnapshotError
from analysis.reader import ReadLimits, read_snapshot
path, limits = sys.argv[1], ReadLimits(**json.loads(sys.argv[2]))
out = {{}}
for how in ("path", "bytes"):
    source = path if how == "path" else open(path, "rb").read()
    t0 = time.perf_counter()
    try:
        read_snapshot(source, limits=limits)
        out[how] = ["accepted", time.perf_counter() - t0]
    except SnapshotError as exc:
        out[how] = [exc.code, time.perf_counter() - t0]
    except BaseException as exc:
        out[how] = ["escaped " + type(exc).__name__ + ": " + str(exc)[:200], time.perf_counter() - t0]
print("RESULT " + json.dumps(out))
"""


def _run_case(path: Path, case: Case) -> dict[str, Any]:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    script = CHILD.format(cap=MEMORY_CAP, root=str(ROOT))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", script, str(path), json.dumps(case.limits)],
        capture_output=True, text=True, timeout=TIMEOUT_S, env=env, check=False,
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"crash": f"exit {proc.returncode}: {proc.stderr[-1500:]}", "wall": time.perf_counter() - t0}
    return json.loads(line[7:]) | {"wall": time.perf_counter() - t0}


# Built once at import (collection needs the names); the canary lives in a fresh directory.
WORK = Path(tempfile.mkdtemp(prefix="oomscope-hostile-"))
CANARY = WORK / "canary"
CASES = build_cases(CANARY)
CASE_NAMES = sorted(CASES)


@pytest.fixture(scope="module")
def hostile() -> tuple[dict[str, Case], dict[str, dict[str, Any]], Path]:
    work, canary, cases = WORK, CANARY, CASES
    paths = {}
    for name, case in cases.items():
        paths[name] = work / f"{name}.bin"  # the name never tells the format
        paths[name].write_bytes(case.data)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(_run_case, paths[name], case) for name, case in cases.items()}
        results = {name: f.result() for name, f in futures.items()}
    return cases, results, canary


@pytest.mark.parametrize("name", CASE_NAMES)
def test_hostile_input_refused_with_its_code(name: str, hostile: Any) -> None:
    cases, results, canary = hostile
    result = results[name]
    assert "crash" not in result, result.get("crash")
    expected = cases[name].code
    for how in ("path", "bytes"):
        code, seconds = result[how]
        assert code == expected, f"{how}: {code}"
        assert seconds < MAX_SECONDS, f"{how} took {seconds:.1f}s"
    assert not canary.exists(), "a payload ran"


def test_no_payload_ran(hostile: Any) -> None:
    assert not hostile[2].exists()


def test_canary_payload_is_live(tmp_path: Path) -> None:
    """The payloads are real: plain pickle.loads runs them (in a child process)."""
    canary = tmp_path / "canary"
    payload = pickle.dumps(_Evil(f"touch {canary}"), protocol=4)
    subprocess.run([sys.executable, "-c", "import pickle,sys; pickle.loads(sys.stdin.buffer.read())"],
                   input=payload, check=True, timeout=30)
    assert canary.exists()
    snap = snapshot_dict(200)
    snap["device_traces"][0][150]["frames"] = [F, {"filename": "x.py", "line": 2, "name": _Evil(f"touch {canary}")}]
    nested = pickle.dumps(snap, protocol=2)
    canary.unlink()
    subprocess.run([sys.executable, "-c", "import pickle,sys; pickle.loads(sys.stdin.buffer.read())"],
                   input=nested, check=True, timeout=30)
    assert canary.exists()
