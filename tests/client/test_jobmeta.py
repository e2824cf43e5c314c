"""The job's metadata the client reads: the launchers' environment, CI's variables, git."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from oomscope_client.jobmeta import job_metadata

from tests.client.test_upload import TOKEN, _base, _parts, server  # noqa: F401 (the recording server fixture)

TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "ddp-42"}
SLURM = {"SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3", "SLURM_JOB_ID": "991"}


def test_torchrun_environment() -> None:
    meta = job_metadata(TORCHRUN, git=False)
    assert (meta["rank"], meta["world_size"], meta["local_rank"], meta["job_id"]) == (1, 2, 1, "ddp-42")
    assert meta["host"]


def test_slurm_environment_and_torchrun_first() -> None:
    assert {k: job_metadata(SLURM, git=False)[k] for k in ("rank", "world_size", "job_id")} == {
        "rank": 3,
        "world_size": 8,
        "job_id": "991",
    }
    # torchrun inside an allocation: its RANK is the process's, Slurm's is the task's.
    both = job_metadata({**SLURM, **TORCHRUN}, git=False)
    assert (both["rank"], both["job_id"]) == (1, "ddp-42")


def test_torchruns_none_run_id_is_no_job_id() -> None:
    meta = job_metadata({"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "none"}, git=False)
    assert "job_id" not in meta


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q", "-b", "feature/mem")
    (tmp_path / "train.py").write_text("print('hi')\n")
    git(tmp_path, "add", "train.py")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "first")
    return tmp_path


def test_commit_and_branch_from_git(repo: Path) -> None:
    meta = job_metadata({}, cwd=str(repo))
    assert meta["commit"] == git(repo, "rev-parse", "HEAD") and len(meta["commit"]) == 40
    assert meta["branch"] == "feature/mem"


def test_ci_variables_win_over_git(repo: Path) -> None:
    meta = job_metadata({"GITHUB_SHA": "c0ffee" * 6 + "c0ff", "GITHUB_REF_NAME": "main"}, cwd=str(repo))
    assert (meta["commit"], meta["branch"]) == ("c0ffee" * 6 + "c0ff", "main")


def test_no_git_repository_leaves_commit_out(tmp_path: Path) -> None:
    meta = job_metadata({}, cwd=str(tmp_path))
    assert "commit" not in meta and "branch" not in meta


def test_a_peer_failure_dumps_with_its_error_and_rank(torch: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """In a job of two ranks, the rank whose all-reduce failed dumps too, its error in the sidecar."""
    import oomscope_client as oc

    for key, value in TORCHRUN.items():
        monkeypatch.setenv(key, value)
    dumper = oc.dump_on_oom(tmp_path, observer=False, excepthook=False)
    torch.fake_init()
    gloo = RuntimeError(
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500"
    )
    path = dumper.handle_exception(gloo)
    assert path is not None and path.exists()
    sidecar = json.loads(dumper.sidecars[-1].read_text())
    assert sidecar["trigger"] == "error"
    assert (
        sidecar["error"].startswith("RuntimeError: [../third_party/gloo")
        and "Connection closed by peer" in sidecar["error"]
    )
    assert (sidecar["rank"], sidecar["world_size"], sidecar["job"]["job_id"]) == (1, 2, "ddp-42")


def test_a_single_process_does_not_dump_on_other_errors(torch: Any, tmp_path: Path, monkeypatch: Any) -> None:
    import oomscope_client as oc

    for key in TORCHRUN:
        monkeypatch.delenv(key, raising=False)
    dumper = oc.dump_on_oom(tmp_path, observer=False, excepthook=False)
    torch.fake_init()
    assert dumper.handle_exception(ValueError("bad batch")) is None
    assert not list(tmp_path.iterdir())


def test_the_dumpers_upload_carries_the_job_and_the_error(
    torch: Any,
    tmp_path: Path,
    monkeypatch: Any,
    server: Any,  # noqa: F811
) -> None:
    """What a rank of a torchrun job sends by itself: its run (the job id), rank, world size, error."""
    import oomscope_client as oc

    for key, value in TORCHRUN.items():
        monkeypatch.setenv(key, value)
    spec = {"url": _base(server), "token": TOKEN, "project": "llm"}
    dumper = oc.dump_on_oom(tmp_path, upload=spec, observer=False, excepthook=False)
    torch.fake_init()
    dumper.handle_exception(RuntimeError("[gloo/transport/tcp/pair.cc:547] Connection closed by peer [127.0.0.1]:1"))
    dumper.wait(30)
    (req,) = server.requests
    parts = {name: value for name, (_file, value) in _parts(req["headers"], req["body"]).items() if name != "file"}
    assert parts["run"] == b"ddp-42" and parts["project"] == b"llm"
    assert (parts["rank"], parts["world_size"], parts["local_rank"], parts["job_id"]) == (b"1", b"2", b"1", b"ddp-42")
    assert parts["error"].startswith(b"RuntimeError: [gloo/transport/tcp/pair.cc:547] Connection closed by peer")
    assert json.loads(dumper.sidecars[-1].read_text())["upload"] == server.reply[1]
