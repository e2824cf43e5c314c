"""A real two-rank DDP job's dumps, made by the client's own hooks on the H200 (scripts/ddp_oom.py:
``oomscope_client.record`` + ``dump_on_oom`` in each rank, gloo, one GPU, 2 GiB caps), uploaded by the
client's CLI to the real site (gunicorn, a worker, Redis) and analysed there as one run.

The GPU machine reaches no site, so the job's upload step runs here, on the files the job wrote
(tests/fixtures/runs/client_job: each rank's snapshot and the sidecar its hook wrote beside it). The
rank, world size and job id come from those sidecars, as the client's upload reads them.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import Site
from tests.client.test_gate import client_cli, token  # noqa: F401 (the token fixture)
from tests.client.test_upload_site import get_json

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

JOB = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "client_job"


def test_the_client_jobs_ranks_become_one_run(live_site: Site, token: str, tmp_path: Path) -> None:  # noqa: F811
    sidecars = {r: json.loads((JOB / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert sidecars[0]["oom_message"] and sidecars[1]["oom_message"] is None
    assert "Connection closed by peer" in sidecars[1]["error"]  # the hook dumped the peer's failure too
    for rank in (0, 1):
        # The dump and its sidecar side by side, as the hook wrote them.
        for suffix in (".pickle.gz", ".json"):
            shutil.copy(JOB / f"rank{rank}{suffix}", tmp_path / f"rank{rank}{suffix}")
        done = client_cli(
            live_site, token, "upload", str(tmp_path / f"rank{rank}.pickle.gz"), "--project", "alpha", cwd=tmp_path
        )
        assert done.returncode == 0, (done.stdout, done.stderr, live_site.logs())
    runs = get_json(f"{live_site.url}/api/v1/projects/alpha/run-list", token)["runs"]
    run: dict[str, Any] = next(r for r in runs if r["name"] == sidecars[0]["job"]["job_id"])
    assert run["world_size"] == 2
    deadline = time.monotonic() + 300
    detail = get_json(run["api_url"], token)
    while not (detail.get("summary") or {}).get("run") and time.monotonic() < deadline:
        time.sleep(1)  # the chord: both ranks analysed, then the run's summary
        detail = get_json(run["api_url"], token)
    summary = detail["summary"]["run"]
    assert summary["first_oom_rank"] == 0
    assert summary["peer_failed_ranks"] == [1]
    assert [u["rank"] for u in detail["uploads"]] == [0, 1]
