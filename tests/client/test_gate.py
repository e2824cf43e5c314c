"""The CI gate and the client's job metadata against the real site (gunicorn, a worker, Redis).

Runs are uploaded by the client's CLI with the environment torchrun and GitHub Actions set, so
the run name, rank, world size, commit and branch come from there; a run of two ranks goes
through the site's chord. Then ``python -m oomscope_client check`` answers with its exit codes.
Rank files: stand-ins from real H200 captures (tests/analysis/test_runs.py says which).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import CLIENT_DIR, Site
from tests.client.test_upload_site import get_json

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"
DIED = CAPTURES / "gpt_autocast_c75_default.pickle.gz"
LIVED = CAPTURES / "gpt_autocast_c75_expandable.pickle.gz"
GLOO_PEER_GONE = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500"
)
SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def token(django_user_model: Any) -> str:
    from webapp.snapshots.teams import membership, tokens

    alice = django_user_model.objects.create_user("alice", password="pw-alice-123")
    alpha = membership.project_create(
        team=membership.team_create(name="Team A", slug="team-a", owner=alice), name="Alpha", slug="alpha"
    )
    return tokens.api_token_create(alice, default_project=alpha)


def client_cli(site: Site, token: str, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RANK", "WORLD_SIZE", "SLURM_"))}
    full = {**clean, "PYTHONPATH": str(CLIENT_DIR), "OOMSCOPE_URL": site.url, "OOMSCOPE_TOKEN": token, **env}
    return subprocess.run(
        [sys.executable, "-m", "oomscope_client", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )


def upload(site: Site, token: str, path: Path, tmp: Path, *extra: str, **env: str) -> None:
    done = client_cli(site, token, "upload", str(path), "--project", "alpha", *extra, cwd=tmp, **env)
    assert done.returncode == 0, (done.stderr, site.logs())


def gate(site: Site, token: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return client_cli(site, token, "check", "--project", "alpha", "--poll", "0.5", *args, cwd=tmp)


def test_the_gate_passes_fails_and_cannot_tell(live_site: Site, token: str, tmp_path: Path) -> None:
    main = {"GITHUB_SHA": SHA, "GITHUB_REF_NAME": "main"}
    feature = {"GITHUB_SHA": SHA[::-1], "GITHUB_REF_NAME": "feature"}
    upload(live_site, token, LIVED, tmp_path, TORCHELASTIC_RUN_ID="base", **main)
    first = gate(live_site, token, tmp_path, "--run", "base", "--max-regression", "5%")
    assert first.returncode == 0, (first.stdout, first.stderr, live_site.logs())
    assert first.stdout.startswith("No baseline to compare with yet")

    # Two ranks of one torchrun job: rank 0 died of an OOM, rank 1's all-reduce lost its peer.
    error = tmp_path / "rank1-error.txt"
    error.write_text(GLOO_PEER_GONE)
    ddp = {"TORCHELASTIC_RUN_ID": "ddp-7", "WORLD_SIZE": "2", **feature}
    upload(live_site, token, DIED, tmp_path, RANK="0", LOCAL_RANK="0", **ddp)
    upload(live_site, token, LIVED, tmp_path, "--error-file", str(error), RANK="1", LOCAL_RANK="1", **ddp)
    worse = gate(live_site, token, tmp_path, "--run", "ddp-7", "--max-regression", "5%")
    assert worse.returncode == 1, (worse.stdout, worse.stderr, live_site.logs())
    reason = worse.stderr.strip()
    assert reason.startswith("Memory regression. Peak reserved memory grew from 4.89 GiB in baseline base to 4.97 GiB")
    assert "(+1.76%, threshold 5%)" in reason
    assert "Run ddp-7 ran out of memory (first on rank 0: Out of memory from fragmentation" in reason
    assert reason.count("\n") == 0  # one paragraph, the run's link at its end
    assert "/run/" in reason

    runs = get_json(f"{live_site.url}/api/v1/projects/alpha/run-list", token)["runs"]
    ddp_run = next(r for r in runs if r["name"] == "ddp-7")
    assert (ddp_run["commit"], ddp_run["branch"], ddp_run["world_size"], ddp_run["job_id"]) == (
        SHA[::-1],
        "feature",
        2,
        "ddp-7",
    )
    detail = get_json(ddp_run["api_url"], token)
    assert detail["summary"]["run"]["peer_failed_ranks"] == [1]
    assert [u["rank"] for u in detail["uploads"]] == [0, 1]

    upload(live_site, token, LIVED, tmp_path, TORCHELASTIC_RUN_ID="fixed", **feature)
    fixed = gate(live_site, token, tmp_path, "--run", "fixed", "--max-regression", "5%")
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.startswith("No memory regression. Peak reserved memory did not change")

    unknown = gate(live_site, token, tmp_path, "--run", "nope")
    assert unknown.returncode == 2 and "No run named 'nope'" in unknown.stderr
    refused = client_cli(live_site, "oom_not-a-token", "check", "--project", "alpha", cwd=tmp_path)
    assert refused.returncode == 2 and "HTTP 401" in refused.stderr and "auth-invalid-token" in refused.stderr
