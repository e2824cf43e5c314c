"""A follow-up of a run of several ranks (issue 33, item 1): the real two-rank DDP job of
``tests/fixtures/runs`` (rank 0 ran out of memory under a 2 GiB cap, rank 1's all-reduce then lost its
peer) and the same job run again with the client (``tests/fixtures/runs/client_job``: rank 0 died again,
rank 1's collective failed), uploaded rank by rank with ``follows`` naming the incident run's rank 1
(the peer that failed): the run is scored once, on its first OOM rank, against the incident run's
first OOM rank, and each rank carries the outcome. The answer "a smaller batch" is the test's own (the
job did not change), to have something scored."""

from __future__ import annotations

import json
from typing import Any

import pytest

from analysis.followup import compare
from analysis.stored import upgrade
from tests.webapp.helpers import FIXTURES, bearer
from webapp.snapshots.models import Report, Run, Upload
from webapp.snapshots.worker import runtasks

pytestmark = pytest.mark.django_db

RUNS = FIXTURES / "runs"
INCIDENT = [(RUNS / f"ddp_gloo_rank{r}.pickle.gz", RUNS / f"ddp_gloo_rank{r}.json") for r in (0, 1)]
RERUN = [(RUNS / "client_job" / f"rank{r}.pickle.gz", RUNS / "client_job" / f"rank{r}.json") for r in (0, 1)]


def _post_run(client: Any, token: str, capture: Any, name: str, files: list, **extra: Any) -> Run:
    for rank, (path, side) in enumerate(files):
        sidecar = json.loads(side.read_text())
        fields = {"run": name, "rank": rank, "world_size": 2, "branch": "main", **extra}
        if sidecar.get("oom_message"):
            fields["oom_message"] = sidecar["oom_message"]
        if sidecar.get("error"):
            fields["error"] = sidecar["error"]
        with capture(), path.open("rb") as fh:
            response = client.post("/api/v1/snapshots", {"file": fh, **fields}, **bearer(token))
        assert response.status_code == 202, response.content
    run = Run.objects.get(name=name)
    for upload in run.uploads.order_by("rank"):
        assert runtasks.analyse_rank(upload.id) == upload.id
    assert runtasks.summarise_run(run.id) == "done"
    run.refresh_from_db()
    return run


def test_a_ddp_rerun_is_scored_on_its_first_oom_against_the_incidents(
    client: Any, alice: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    capture = django_capture_on_commit_callbacks
    incident = _post_run(client, alice_token, capture, "ddp-1", INCIDENT)
    assert incident.summary["run"]["first_oom_rank"] == 0
    peer = incident.uploads.get(rank=1)
    rerun = _post_run(client, alice_token, capture, "ddp-2", RERUN, follows=peer.code, changed="smaller_batch")
    assert rerun.summary["run"]["first_oom_rank"] == 0

    rank0, rank1 = rerun.uploads.get(rank=0), rerun.uploads.get(rank=1)
    assert rank0.follows_id == rank1.follows_id == peer.pk and rank0.follows_source == "given"
    # Scored once, on the rerun's rank 0 against the incident's rank 0 (its first OOM), not the peer named.
    dead = incident.uploads.get(rank=0)
    reports = {u: upgrade(Report.objects.get(upload=u).data) for u in (dead, rank0)}
    expected = json.loads(json.dumps(compare(reports[dead], reports[rank0], ["smaller_batch"]).to_dict()))
    assert rank0.followup == expected, rank0.followup["text"]
    # The job did not change (the same script, the same batch): the test's answer "a smaller batch" was
    # predicted to fit, and the rerun died in the same step, 20: refuted, as a wrong answer should be.
    assert (rank0.followup["outcome"], rank0.followup["actual"]["oom_step"], rank0.followup["incident_oom_step"]) == (
        "refuted", 20, 20
    )
    assert rank0.followup["applied"][0]["id"] == "smaller_batch"
    assert rank0.followup["incident_oom_step"] == reports[dead]["devices"][0]["ooms"][0]["step"]
    # The other rank carries the outcome, and says where it was scored; the record counts the run once.
    assert rank1.followup["outcome"] == rank0.followup["outcome"] and rank1.followup["scored_on"] == rank0.code
    record = client.get("/api/v1/projects/alpha/advice", **bearer(alice_token)).json()["changes"]
    advised = rank0.followup["advised_change"]
    assert sum(row["advised"] for row in record if row["change"] == advised) == 1

    body = client.get(f"/api/v1/snapshots/{rank0.code}", **bearer(alice_token)).json()["follows"]
    assert body["code"] == peer.code and body["outcome"] == rank0.followup["outcome"]
    # The answer, changed later on rank 0's page or the API, scores the run again.
    again = client.post(f"/api/v1/snapshots/{rank0.code}/follows", {"changed": "other"}, **bearer(alice_token))
    assert again.status_code == 200, again.content
    assert Upload.objects.get(pk=rank0.pk).followup["outcome"] in ("not_applied", "unknown")
