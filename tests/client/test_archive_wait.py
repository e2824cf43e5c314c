"""``python -m oomscope_client upload RUN.tar --wait`` against the real site (gunicorn, a worker, Redis).

An archive's 202 names the run (``{"run": {...}}``), not an upload: the wait follows the run until
every rank is analysed, then prints each rank's verdict, the run's first OOM and its change, and exits
0, or 3 when a rank's analysis failed. The ranks are the client's own dumps of the real two-rank DDP
job (``tests/fixtures/runs/client_job``: rank 0 died of an OOM, rank 1's all-reduce lost its peer).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import CLIENT_DIR, Site
from tests.client.test_upload_site import get_json

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

JOB = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "client_job"


@pytest.fixture
def token(django_user_model: Any) -> str:
    from webapp.snapshots.teams import membership, tokens

    alice = django_user_model.objects.create_user("alice", password="pw-alice-123")
    alpha = membership.project_create(
        team=membership.team_create(name="Team A", slug="team-a", owner=alice), name="Alpha", slug="alpha"
    )
    return tokens.api_token_create(alice, default_project=alpha)


def tar_of(tmp: Path, members: dict[str, bytes]) -> Path:
    path = tmp / "job.tar"
    with tarfile.open(path, "w") as archive:
        for name, data in members.items():
            (tmp / name).write_bytes(data)
            archive.add(tmp / name, arcname=f"job/{name}")
    return path


def job_files() -> dict[str, bytes]:
    return {f"rank{r}{ext}": (JOB / f"rank{r}{ext}").read_bytes() for r in (0, 1) for ext in (".pickle.gz", ".json")}


def upload_wait(site: Site, token: str, path: Path, run: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RANK", "WORLD_SIZE", "SLURM_"))}
    env = {**clean, "PYTHONPATH": str(CLIENT_DIR), "OOMSCOPE_URL": site.url, "OOMSCOPE_TOKEN": token}
    argv = ["upload", str(path), "--project", "alpha", "--run", run, "--wait", "--wait-timeout", "600"]
    return subprocess.run(
        [sys.executable, "-m", "oomscope_client", *argv],
        cwd=path.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_archive_wait_prints_each_ranks_verdict_and_the_runs_change(
    live_site: Site, token: str, tmp_path: Path
) -> None:
    done = upload_wait(live_site, token, tar_of(tmp_path, job_files()), "ddp-wait")
    assert done.returncode == 0, (done.stdout, done.stderr, live_site.logs())
    assert "uploaded: None" not in done.stderr
    run = get_json(f"{live_site.url}/api/v1/projects/alpha/run-list", token)["runs"][0]
    assert run["status"] == "done" and run["first_oom_rank"] == 0
    assert f"uploaded run ddp-wait: {run['url']} (2 ranks, analysing…)" in done.stderr
    whole = get_json(run["api_url"], token)
    ranks = {row["rank"]: get_json(row["api_url"], token)["summary"] for row in whole["uploads"]}
    lines = done.stdout.splitlines()
    # Each rank's own verdict, as the site words it on its report; rank 0's change under it.
    assert lines[0] == f"rank 0: {ranks[0]['headline']}"
    assert lines[1] == f"  change: {ranks[0]['change_line']}"
    assert f"rank 1: {ranks[1]['headline']}" in lines
    # The run: the rank that died first (the sidecar's OOM is rank 0's), with that rank's change.
    assert "CUDA out of memory" in json.loads((JOB / "rank0.json").read_text())["oom_message"]
    assert f"run: rank 0 ran out of memory first: {whole['summary']['run']['first_oom_reason']}" in lines
    assert f"change: {ranks[0]['change_line']}" in lines
    assert lines[-1] == f"report: {run['url']}"


def test_archive_wait_exits_3_when_a_ranks_analysis_failed(live_site: Site, token: str, tmp_path: Path) -> None:
    files = job_files()
    whole = gzip.decompress(files["rank1.pickle.gz"])
    files["rank1.pickle.gz"] = gzip.compress(whole[: len(whole) // 2])  # a pickle cut mid-way: sniffs, then fails
    done = upload_wait(live_site, token, tar_of(tmp_path, files), "ddp-cut")
    assert done.returncode == 3, (done.stdout, done.stderr, live_site.logs())
    run = get_json(f"{live_site.url}/api/v1/projects/alpha/run-list", token)["runs"][0]
    failed = next(row for row in get_json(run["api_url"], token)["uploads"] if row["rank"] == 1)
    assert failed["status"] == "failed"
    error = failed["error"]
    assert f"rank 1: the analysis failed: {error['code']}: {error['message']}" in done.stdout.splitlines()
