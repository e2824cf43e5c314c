"""The HTTP API of contract.md §3, on the real gpt_varlen_oom fixture."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.urls import reverse

from tests.webapp.helpers import FIXTURES, GPT_OOM, bearer
from webapp.snapshots.models import ApiToken, ShareLink, Upload
from webapp.snapshots.teams.tokens import token_hash
from webapp.snapshots.worker.tasks import analyse_upload

pytestmark = pytest.mark.django_db

TRUTH = json.loads((FIXTURES / "gpt_varlen_oom.truth.json").read_text())


def post_snapshot(client: Any, token: str, path: Any = GPT_OOM, **fields: Any) -> Any:
    with open(path, "rb") as fh:
        return client.post("/api/v1/snapshots", {"file": fh, **fields}, **bearer(token))


def test_round_trip_upload_report_share_revoke(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks() as published:
        response = post_snapshot(client, alice_token, run="job-17", tags="gpt,varlen")
    assert response.status_code == 202, response.content
    body = response.json()
    assert set(body) >= {"id", "status", "url", "api_url"}
    assert body["status"] == "queued"
    assert len(published) == 1  # the task is published only once the row is committed
    upload = Upload.objects.get(code=body["id"])
    assert upload.sha256 and upload.blob_name == f"sha256/{upload.sha256[:2]}/{upload.sha256}"
    assert upload.tags == ["gpt", "varlen"]

    # Not done yet: the report is 404.
    assert client.get(f"/api/v1/snapshots/{body['id']}/report", **bearer(alice_token)).status_code == 404

    analyse_upload(upload.id)  # what the worker runs

    status = client.get(body["api_url"], **bearer(alice_token)).json()
    assert status["status"] == "done", status
    assert status["error"] is None
    assert status["progress"] == 100
    assert status["run"] == "job-17"
    stats = TRUTH["memory_stats"]
    assert status["summary"]["peak_reserved_bytes"] == stats["reserved_bytes.all.peak"]
    assert status["summary"]["peak_allocated_bytes"] == stats["allocated_bytes.all.peak"]
    assert status["summary"]["oom"] is True

    report = client.get(f"/api/v1/snapshots/{body['id']}/report", **bearer(alice_token)).json()
    assert report["schema"] == "oomscope.report/1"
    assert report["source"]["filename"] == GPT_OOM.name
    device = report["devices"][0]
    assert device["summary"]["peak_reserved_bytes"] == stats["reserved_bytes.all.peak"]
    assert device["summary"]["peak_allocated_bytes"] == stats["allocated_bytes.all.peak"]
    assert device["summary"]["peak_requested_bytes"] == stats["requested_bytes.all.peak"]

    shared = client.post(f"/api/v1/snapshots/{body['id']}/share", **bearer(alice_token))
    assert shared.status_code == 201
    share_url = shared.json()["share_url"]
    token = share_url.rstrip("/").rsplit("/", 1)[-1]
    assert len(token) >= 43  # token_urlsafe(32)
    assert ShareLink.objects.filter(token_hash=token_hash(token)).exists()
    assert not ShareLink.objects.filter(token_hash=token).exists()  # only the hash is stored

    client.logout()
    page = client.get(share_url)
    assert page.status_code == 200
    assert page["Referrer-Policy"] == "no-referrer"
    assert "no-store" in page["Cache-Control"]
    assert "noindex" in page["X-Robots-Tag"]

    assert client.delete(f"/api/v1/snapshots/{body['id']}/share", **bearer(alice_token)).status_code == 200
    assert client.get(share_url).status_code == 404


def test_runs_lists_the_project_newest_first(client: Any, alice_token: str) -> None:
    first = post_snapshot(client, alice_token, run="first").json()["id"]
    second = post_snapshot(client, alice_token, run="second").json()["id"]
    runs = client.get("/api/v1/projects/alpha/runs", **bearer(alice_token)).json()["runs"]
    assert [r["id"] for r in runs] == [second, first]
    # Identical bytes are stored once.
    assert Upload.objects.get(code=first).blob_name == Upload.objects.get(code=second).blob_name


def test_upload_ids_are_unguessable_strings(client: Any, alice_token: str) -> None:
    code = post_snapshot(client, alice_token).json()["id"]
    upload = Upload.objects.get(code=code)
    assert not code.isdigit() and len(code) >= 20
    assert reverse("api:snapshot", args=[code]).endswith("/" + code)
    # The database id is no address.
    assert client.get(reverse("api:snapshot", args=[str(upload.pk)]), **bearer(alice_token)).status_code == 404


def test_unknown_token_is_401_and_token_stored_hashed(client: Any, alice_token: str) -> None:
    assert client.get("/api/v1/projects/alpha/runs", **bearer("oom_nope")).status_code == 401
    response = client.get("/api/v1/projects/alpha/runs")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    row = ApiToken.objects.get()
    assert row.token_hash == token_hash(alice_token) and alice_token not in (row.token_hash, row.prefix)


def test_upload_to_other_teams_project_is_404(client: Any, alice_token: str, beta: Any) -> None:
    response = post_snapshot(client, alice_token, project="beta")
    assert response.status_code == 404
    assert not Upload.objects.exists()


def test_session_api_post_needs_csrf(alice: Any, alpha: Any) -> None:
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    with open(GPT_OOM, "rb") as fh:
        response = strict.post("/api/v1/snapshots", {"file": fh})
    assert response.status_code == 403
    assert not Upload.objects.exists()


def test_create_api_token_command(db: Any, capsys: Any) -> None:
    from django.core.management import call_command

    call_command("create_api_token", "carol", "--create-user", "--team", "ml", "--project", "llama")
    token = capsys.readouterr().out.strip()
    row = ApiToken.objects.select_related("default_project__team").get(token_hash=token_hash(token))
    assert row.user.username == "carol"
    assert row.default_project.slug == "llama" and row.default_project.team.slug == "ml"
    assert row.user.memberships.filter(team__slug="ml").exists()


def test_oom_message_field_gives_the_report_the_real_limit(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    # gpt_varlen_oom ran under a 7 GiB cap; the snapshot alone only shows its 6.93 GiB peak.
    with django_capture_on_commit_callbacks():
        response = post_snapshot(client, alice_token, oom_message=TRUTH["oom_message"])
    assert response.status_code == 202, response.content
    upload = Upload.objects.get(code=response.json()["id"])
    assert upload.oom_message == TRUTH["oom_message"]
    analyse_upload(upload.id)
    report = client.get(f"/api/v1/snapshots/{upload.code}/report", **bearer(alice_token)).json()
    oom = report["devices"][0]["oom"]
    assert oom["limit_source"] == "oom_message" and oom["limit_bytes"] == 7 * 2**30


def test_a_field_that_is_no_oom_message_is_refused(client: Any, alice_token: str) -> None:
    response = post_snapshot(client, alice_token, oom_message="Segmentation fault (core dumped)")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "upload:invalid-oom-message"
    assert not Upload.objects.exists()


def test_batch_size_field_turns_the_batch_fit_into_a_batch(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    # grow_gpt2_default: batch 4 ran (step 3), batch 5 died (step 4); sent with the upload, the batch size
    # goes through the worker's child to the report, which names the batch that fits and the accumulation.
    truth = json.loads((FIXTURES / "grow_gpt2_default.truth.json").read_text())
    last_ran, failing = truth["workload_log"][-1]["batch"], truth["kwargs"]["batch"][0] + truth["died_step"]
    with django_capture_on_commit_callbacks():
        response = post_snapshot(client, alice_token, FIXTURES / "grow_gpt2_default.pickle.gz", batch_size=failing)
    assert response.status_code == 202, response.content
    upload = Upload.objects.get(code=response.json()["id"])
    assert upload.batch_size == failing == 5
    analyse_upload(upload.id)
    report = client.get(f"/api/v1/snapshots/{upload.code}/report", **bearer(alice_token)).json()
    fit = report["devices"][0]["batch_fit"]
    assert fit["batch_size"] == failing
    assert last_ran <= fit["fitting_batch"] < failing
    assert fit["accumulation_steps"] * fit["micro_batch"] >= failing


@pytest.mark.parametrize("value", ["0", "-3", "four", "1000000001"])
def test_a_batch_size_that_is_no_positive_count_is_refused(client: Any, alice_token: str, value: str) -> None:
    response = post_snapshot(client, alice_token, batch_size=value)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "upload:invalid"
    assert "batch_size" in response.json()["error"]["message"]
    assert not Upload.objects.exists()


@pytest.fixture
def gamma(alice: Any, bob: Any) -> Any:
    """Bob's team ``team-c`` with project ``gamma``, where Alice is a member: Alice has two projects."""
    from webapp.snapshots.teams import membership

    team = membership.team_create(name="Team C", slug="team-c", owner=bob)
    membership.membership_add(team=team, user=alice, role="member")
    return membership.project_create(team=team, name="Gamma", slug="gamma")


def test_a_user_of_two_projects_is_told_both_when_no_project_is_named(
    client: Any, alice: Any, alpha: Any, gamma: Any, beta: Any
) -> None:
    from webapp.snapshots.teams import tokens

    token = tokens.api_token_create(alice)  # no default project: the upload must name one
    response = post_snapshot(client, token)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "upload:no-project"
    assert error["choices"] == ["alpha", "gamma"]  # beta is Bob's alone: not a choice
    assert error["message"].startswith("Choose a project to upload to. Projects you can upload to: alpha, gamma")
    unknown = post_snapshot(client, token, project="beta").json()["error"]
    assert unknown["code"] == "upload:unknown-project" and unknown["choices"] == ["alpha", "gamma"]
    assert "No project 'beta'" in unknown["message"] and "alpha, gamma" in unknown["message"]
    assert not Upload.objects.exists()


def test_a_token_limited_to_one_project_lists_that_project_only(
    client: Any, alice: Any, alpha: Any, gamma: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from webapp.snapshots.teams import tokens

    token = tokens.api_token_create(alice, project=gamma)
    refused = post_snapshot(client, token, project="alpha")  # Alice's own project, out of this token's reach
    assert refused.status_code == 404
    error = refused.json()["error"]
    assert error["code"] == "upload:unknown-project" and error["choices"] == ["gamma"]
    assert "Projects you can upload to: gamma " in error["message"]
    assert not Upload.objects.exists()
    # Named nowhere, the upload goes to the token's one project rather than asking which.
    with django_capture_on_commit_callbacks():
        accepted = post_snapshot(client, token)
    assert accepted.status_code == 202, accepted.content
    assert Upload.objects.get(code=accepted.json()["id"]).project == gamma


def test_a_viewer_is_told_there_is_no_project_to_upload_to(client: Any, bob: Any, alpha: Any) -> None:
    from webapp.snapshots.teams import membership, tokens

    membership.membership_add(team=alpha.team, user=bob, role="viewer")
    response = post_snapshot(client, tokens.api_token_create(bob), project="alpha")
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "upload:read-only" and error["choices"] == []
    assert "You can upload to no project" in error["message"]


def test_a_cap_given_for_a_run_without_an_oom_is_its_limit_and_the_page_says_it_was_at_the_edge(
    client: Any, alice: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    # infer_varbatch never ran out: its own reserved peak (truth file) is 31.44 GiB; a 32 GiB cap is 1.7% above.
    peak = json.loads((FIXTURES / "infer_varbatch.truth.json").read_text())["memory_stats"]["reserved_bytes.all.peak"]
    with django_capture_on_commit_callbacks():
        response = post_snapshot(client, alice_token, FIXTURES / "infer_varbatch.pickle.gz", cap="32GiB")
    assert response.status_code == 202, response.content
    upload = Upload.objects.get(code=response.json()["id"])
    assert upload.cap_bytes == 32 * 2**30
    analyse_upload(upload.id)  # the worker's path: runner -> child -> build_report(limit=...)
    device = client.get(f"/api/v1/snapshots/{upload.code}/report", **bearer(alice_token)).json()["devices"][0]
    assert device["oom"] is None
    assert device["limit"]["source"] == "given" and device["limit"]["bytes"] == 32 * 2**30
    edge = device["edge_of_cap"]
    assert edge["peak_reserved_bytes"] == peak and edge["headroom_bytes"] == 32 * 2**30 - peak
    client.force_login(alice)
    page = client.get(f"/s/{upload.code}/").content.decode()
    assert 'class="edge-of-cap notice"' in page
    assert "At the edge of the cap: no OOM, but reserved memory peaked at 31.44 GiB, 98% of the cap of 32.00 GiB" in (
        page
    )
    # Analysed again (with an OOM message, from the page), the new upload keeps the cap it was given.
    from webapp.snapshots.intake import accept

    with django_capture_on_commit_callbacks():
        again = accept.upload_reanalyse(upload, alice, oom_message=TRUTH["oom_message"])
    assert again.pk != upload.pk and again.cap_bytes == 32 * 2**30


@pytest.mark.parametrize("value", ["7XB", "0", "-1GiB", "2PiB", "2000TiB"])
def test_a_cap_that_is_no_size_is_refused(client: Any, alice_token: str, value: str) -> None:
    response = post_snapshot(client, alice_token, cap=value)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "upload:invalid" and error["message"].startswith("cap: ")
    assert not Upload.objects.exists()


def test_the_upload_page_takes_a_cap_too(alice_client: Any, django_capture_on_commit_callbacks: Any) -> None:
    with open(FIXTURES / "infer_varbatch.pickle.gz", "rb") as fh, django_capture_on_commit_callbacks():
        response = alice_client.post(
            "/upload/", {"file": fh, "project": "alpha", "cap": "7.5 GiB"}, headers={"Accept": "application/json"}
        )
    assert response.status_code in (200, 202), response.content
    assert Upload.objects.get().cap_bytes == 15 * 2**29
    page = alice_client.get("/upload/").content.decode()
    assert 'name="cap"' in page and "Memory cap" in page
