"""Client tests: put client/ on the path; a torch stand-in; and a real running site to upload to.

The client itself imports neither torch nor Django. ``live_site`` is the site as ``make run``
starts it, on the test database: gunicorn on a loopback port, a real Celery worker, the
session's private Redis (``redis_url`` from tests/webapp/conftest.py).
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.conftest import redis_url  # noqa: F401 - the session's private Redis, as a fixture here

CLIENT_DIR = Path(__file__).resolve().parents[2] / "client"
if str(CLIENT_DIR) not in sys.path:
    sys.path.insert(0, str(CLIENT_DIR))

# The site's upload cap in these tests: above the real fixtures uploaded (gpt_varlen_oom is
# 257,016 bytes), small enough that a file one byte over it is cheap to make.
SITE_CAP = 1 << 20


@dataclass
class Site:
    url: str
    web: Any
    worker: Any
    directory: Path

    def logs(self) -> str:
        return "\n".join(p.read_text()[-3000:] for p in (self.web.log_path, self.worker.log_path))


@pytest.fixture(scope="module")
def live_site(django_db_setup: Any, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:  # noqa: F811
    from tests.webapp import processes

    directory = tmp_path_factory.mktemp("site")
    queue = f"oomscope-client-test-{os.getpid()}"
    env = processes.process_env(
        redis_url=redis_url, media_root=directory / "media", queue=queue, extra={"UPLOAD_MAX_BYTES": str(SITE_CAP)}
    )
    worker = processes.start_logged(processes.celery_worker_argv(queue), env, directory / "worker.log")
    try:
        processes.wait_for_log(worker, b"ready.", "celery worker")
        web, url = processes.start_gunicorn(env, directory / "web.log")
    except BaseException:
        processes.stop(worker)
        raise
    try:
        yield Site(url, web, worker, directory)
    finally:
        processes.stop(web)
        processes.stop(worker)


# --------------------------------------------------------------------------- a torch stand-in
# OomDumper's own logic (lazy attach, one dump per OOM, sidecar) is tested here on a stand-in
# that models only what the dumper relies on: CUDA lazy init running queued calls, the OOM
# counter raised before observers run (as CUDACachingAllocator.cpp does), and a snapshot dict.
# The real thing is exercised on a GPU by scripts/capture_more.py (case gpu_client_oom).


class OutOfMemoryError(RuntimeError):
    pass


def make_fake_torch() -> Any:
    torch = types.ModuleType("torch")
    torch.__version__ = "0.0-fake"
    state: dict[str, Any] = {"initialized": False, "queued": [], "observers": [], "num_ooms": 0, "history": None}
    cuda = types.SimpleNamespace()
    cuda.OutOfMemoryError = OutOfMemoryError
    cuda.is_initialized = lambda: state["initialized"]

    def lazy_call(fn: Any) -> None:
        if state["initialized"]:
            fn()
        else:
            state["queued"].append(fn)

    def init() -> None:
        if not state["initialized"]:
            state["initialized"] = True
            for fn in state["queued"]:
                fn()

    def attach(fn: Any) -> None:
        if not state["initialized"]:
            raise AssertionError("observer attached before CUDA init (crashes real torch)")
        state["observers"].append(fn)

    def fail_allocation(size: int) -> None:
        init()
        state["num_ooms"] += 1
        for obs in state["observers"]:
            obs(0, size, 4 << 30, 100 << 30)
        raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} bytes")

    cuda._lazy_call = lazy_call
    cuda.memory_allocated = lambda device=None: 0
    cuda.current_device = lambda: 0
    cuda.device_count = lambda: 1
    cuda.get_device_name = lambda device=None: "Fake GPU"
    cuda.get_device_properties = lambda device=None: types.SimpleNamespace(total_memory=80 << 30)
    cuda.memory_stats = lambda device=None: {"num_ooms": state["num_ooms"], "reserved_bytes.all.peak": 123}
    cuda.memory = types.SimpleNamespace(
        _snapshot=lambda: {"segments": [], "device_traces": [[{"action": "oom", "size": 1}]]},
        _record_memory_history=lambda **kw: state.__setitem__("history", kw),
    )
    torch.cuda = cuda
    torch._C = types.SimpleNamespace(_cuda_attach_out_of_memory_observer=attach)
    torch.fake_state = state
    torch.fake_init = init
    torch.fake_fail_allocation = fail_allocation
    return torch


@pytest.fixture
def torch(monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = make_fake_torch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    return fake
