"""What a training process can say of its job without being told: rank, world size, job id, host,
torch version, and the git commit and branch.

The launchers set the rank in the environment: torchrun / torch.distributed.elastic (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``TORCHELASTIC_RUN_ID``), Slurm (``SLURM_PROCID``,
``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_JOB_ID``), Open MPI (``OMPI_COMM_WORLD_*``) and
MPICH/Intel MPI (``PMI_RANK``, ``PMI_SIZE``); the first one present wins, in that order. The
commit and branch come from CI's variables where a CI job runs (GitHub Actions, GitLab CI), else
from ``git`` in the working directory. torch's version is read from the installed package's
metadata, so torch is never imported here. Every key is optional: what cannot be found is left out.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping
from typing import Any

# (key, environment variables in order of preference)
_INTS = (
    ("rank", ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")),
    ("world_size", ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")),
    ("local_rank", ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")),
)
# torchrun sets TORCHELASTIC_RUN_ID to "none" unless --rdzv-id is given: no job id then.
_JOB_IDS = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")
_COMMITS = ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILDKITE_COMMIT", "GIT_COMMIT")
_BRANCHES = ("GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME", "BUILDKITE_BRANCH", "GIT_BRANCH")
GIT_TIMEOUT_SECONDS = 5.0


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = env.get(name, "").strip()
        if value and value.lower() != "none":
            return value
    return None


def _git(args: list[str], cwd: str | None) -> str | None:
    try:
        done = subprocess.run(  # noqa: S603
            ["git", *args],  # noqa: S607 (git from PATH, as a user runs it)
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    out = done.stdout.strip()
    return out if done.returncode == 0 and out else None


def torch_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def job_metadata(env: Mapping[str, str] | None = None, *, cwd: str | None = None, git: bool = True) -> dict[str, Any]:
    """The job's metadata as the upload's fields name them (``rank``, ``world_size``, ``local_rank``,
    ``job_id``, ``host``, ``torch_version``, ``commit``, ``branch``); absent ones are left out."""
    env = os.environ if env is None else env
    meta: dict[str, Any] = {}
    for key, names in _INTS:
        raw = _first(env, names)
        if raw is not None and raw.isdigit():
            meta[key] = int(raw)
    job = _first(env, _JOB_IDS)
    if job:
        meta["job_id"] = job
    meta["host"] = socket.gethostname()
    version = torch_version()
    if version:
        meta["torch_version"] = version
    commit = _first(env, _COMMITS) or (_git(["rev-parse", "HEAD"], cwd) if git else None)
    if commit:
        meta["commit"] = commit
    branch = _first(env, _BRANCHES) or (_git(["rev-parse", "--abbrev-ref", "HEAD"], cwd) if git else None)
    if branch and branch != "HEAD":  # "HEAD": a detached checkout has no branch
        meta["branch"] = branch
    return meta
