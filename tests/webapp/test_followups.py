"""Follow-up runs through the API and the pages (issue 33; webapp/snapshots/runs/followups.py): a real OOM
(bert_mlm_c70_default: died at step 1 under a 70% cap) and the real rerun of the same job with
expandable segments (died at step 2), then the rerun of a job that the setting saved (bert_mlm_c85)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES, bearer
from webapp.snapshots.models import Upload
from webapp.snapshots.worker.tasks import analyse_upload

pytestmark = pytest.mark.django_db

CAPTURES = FIXTURES / "captures"


def oom_message(name: str) -> str:
    return str(json.loads((CAPTURES / f"{name}.truth.json").read_text())["oom_message"] or "")


def upload(client: Any, token: str, name: str, **fields: Any) -> Upload:
    """POST a capture with its OOM message (as the client sends it), then analyse it as the worker does."""
    path: Path = CAPTURES / f"{name}.pickle.gz"
    with path.open("rb") as fh:
        response = client.post(
            "/api/v1/snapshots", {"file": fh, "oom_message": oom_message(name), **fields}, **bearer(token)
        )
    assert response.status_code == 202, response.content
    row = Upload.objects.get(code=response.json()["id"])
    analyse_upload(row.id)
    row.refresh_from_db()
    assert row.status == Upload.Status.DONE, row.error_message
    return row


def test_the_next_run_of_the_same_name_follows_the_oom_and_is_scored(client: Any, alice: Any, alice_token: str) -> None:
    incident = upload(client, alice_token, "bert_mlm_c70_default", run="bert-mlm")
    rerun = upload(client, alice_token, "bert_mlm_c70_expandable", run="bert-mlm")
    body = client.get(f"/api/v1/snapshots/{rerun.code}", **bearer(alice_token)).json()
    follows = body["follows"]
    assert follows["code"] == incident.code and follows["source"] == "auto"
    assert follows["advised_change"] == "expandable_segments"
    assert [c["id"] for c in follows["applied"]] == ["expandable_segments"]
    assert follows["predicted"]["answer"] == "fixes"
    assert follows["actual"]["oom"] is True and follows["actual"]["oom_step"] == 2
    assert follows["incident_oom_step"] == 1
    assert follows["outcome"] == "postponed"
    # The incident's page names its follow-up, the follow-up's page its incident; the history both.
    client.force_login(alice)
    page = client.get(f"/s/{incident.code}/").content.decode()
    assert f'Followed by <a href="/s/{rerun.code}/">{rerun.code}</a>' in page and "postponed" in page
    page = client.get(f"/s/{rerun.code}/").content.decode()
    assert f'Follow-up of <a href="/s/{incident.code}/">{incident.code}</a>' in page
    history = client.get("/p/alpha/").content.decode()
    assert f'follow-up of <a href="/s/{incident.code}/">{incident.code}</a>: postponed' in history


def test_the_advice_record_counts_per_change(client: Any, alice: Any, alice_token: str) -> None:
    saved = upload(client, alice_token, "bert_mlm_c85_default", run="c85")
    upload(client, alice_token, "bert_mlm_c85_expandable", run="c85")  # saved: borne out
    c70 = upload(client, alice_token, "bert_mlm_c70_default", run="c70")
    upload(client, alice_token, "bert_mlm_c70_expandable", follows=c70.code)  # given: postponed
    upload(client, alice_token, "bert_mlm_c85_roundup4", follows=saved.code)  # another change: not applied
    record = client.get("/api/v1/projects/alpha/advice", **bearer(alice_token)).json()["changes"]
    rows = {r["change"]: r for r in record}
    expandable = rows["expandable_segments"]
    assert (expandable["advised"], expandable["followed"], expandable["tried"]) == (3, 2, 2)
    assert (expandable["borne_out"], expandable["postponed"], expandable["not_applied"]) == (1, 1, 1)
    client.force_login(alice)
    team = client.get("/t/team-a/").content.decode()
    assert "expandable_segments: advised 3, followed 2, tried 2, borne out 1, postponed 1, not applied 1" in team


def test_follows_none_and_a_declared_change(client: Any, alice_token: str) -> None:
    incident = upload(client, alice_token, "bert_mlm_c70_default", run="same")
    other = upload(client, alice_token, "bert_mlm_c85_default", run="same", follows="none")
    assert other.follows_id is None
    # Later: the user says it follows the incident, and that they halved the batch (the files cannot show it).
    response = client.post(
        f"/api/v1/snapshots/{other.code}/follows",
        {"follows": incident.code, "changed": "smaller_batch"},
        **bearer(alice_token),
    )
    follows = response.json()["follows"]
    assert [(c["id"], c["source"]) for c in follows["applied"]] == [("smaller_batch", "user")]
    assert follows["predicted"]["basis"] == "ranked" and follows["outcome"] == "postponed"


def test_bad_follow_up_fields_are_refused_with_a_code(client: Any, alice_token: str) -> None:
    path = CAPTURES / "bert_mlm_c70_default.pickle.gz"
    with path.open("rb") as fh:
        response = client.post("/api/v1/snapshots", {"file": fh, "follows": "nosuchcode"}, **bearer(alice_token))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "upload:invalid-follows"
    assert not Upload.objects.exists()
    with path.open("rb") as fh:
        response = client.post("/api/v1/snapshots", {"file": fh, "changed": "bogus"}, **bearer(alice_token))
    assert response.status_code == 400 and "changed" in response.json()["error"]["message"]


def test_the_site_record_is_for_staff(client: Any, alice: Any, alice_token: str) -> None:
    response = client.get("/api/v1/advice", **bearer(alice_token))
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    incident = upload(client, alice_token, "bert_mlm_c85_default", run="site")
    upload(client, alice_token, "bert_mlm_c85_expandable", follows=incident.code)
    alice.is_staff = True
    alice.save(update_fields=["is_staff"])
    rows = client.get("/api/v1/advice", **bearer(alice_token)).json()["changes"]
    assert [(r["change"], r["advised"], r["borne_out"]) for r in rows] == [("expandable_segments", 1, 1)]


def test_the_report_page_takes_the_answer(client: Any, alice: Any, alice_token: str) -> None:
    incident = upload(client, alice_token, "bert_mlm_c70_default", run="page")
    rerun = upload(client, alice_token, "bert_mlm_c85_default", run="page")  # the cap changed: not in the files
    assert rerun.follows_id == incident.id and rerun.followup["outcome"] == "unknown"
    client.force_login(alice)
    page = client.get(f"/s/{rerun.code}/").content.decode()
    assert 'name="changed" value="smaller_batch"' in page
    client.post(f"/s/{rerun.code}/follows/", {"changed": ["smaller_batch"]})
    rerun.refresh_from_db()
    assert rerun.changes_declared == ["smaller_batch"] and rerun.followup["outcome"] == "postponed"
    client.post(f"/s/{rerun.code}/follows/", {"follows": "none"})
    rerun.refresh_from_db()
    assert rerun.follows_id is None and rerun.followup is None
    # The same file again is no rerun of itself (nor of the run before it).
    again = upload(client, alice_token, "bert_mlm_c85_default", run="page")
    assert again.follows_id is None


def test_a_batch_read_from_the_files_is_shown_through_the_api_and_the_page(
    client: Any, alice: Any, alice_token: str
) -> None:
    """tests/fixtures/followups (issue 33): the real rerun of a ResNet at half its batch (96 -> 48) under the
    incident's cap; the change comes from the passes' sizes, not from an answer."""
    folder = FIXTURES / "followups"

    def send(name: str, **fields: Any) -> Upload:
        message = str(json.loads((folder / f"{name}.truth.json").read_text())["oom_message"] or "")
        with (folder / f"{name}.pickle.gz").open("rb") as fh:
            response = client.post(
                "/api/v1/snapshots", {"file": fh, "oom_message": message, **fields}, **bearer(alice_token)
            )
        assert response.status_code == 202, response.content
        row = Upload.objects.get(code=response.json()["id"])
        analyse_upload(row.id)
        return row

    incident = send("fres_c60_default", run="resnet")
    rerun = send("fres_c60_batch48", run="resnet")
    follows = client.get(f"/api/v1/snapshots/{rerun.code}", **bearer(alice_token)).json()["follows"]
    assert follows["code"] == incident.code
    assert [(c["id"], c["source"]) for c in follows["applied"]] == [("smaller_batch", "file")]
    assert "0.50x the incident's" in follows["applied"][0]["label"]
    assert follows["actual"]["oom"] is False
    client.force_login(alice)
    page = client.get(f"/s/{rerun.code}/").content.decode()
    assert f'Follow-up of <a href="/s/{incident.code}/">{incident.code}</a>' in page
    assert "a smaller batch: each activation 0.50x the incident&#x27;s" in page
