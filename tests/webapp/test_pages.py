"""Pages: the contract's context keys, share links by page action, headers and CSP, sign-up."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES, make_upload
from webapp.snapshots.models import Membership, Upload
from webapp.snapshots.worker.tasks import analyse_upload

pytestmark = pytest.mark.django_db

FRAG = FIXTURES / "frag_oom.pickle.gz"
UPLOAD_KEYS = {
    "code",
    "filename",
    "bytes",
    "project",
    "project_slug",
    "run",
    "tags",
    "note",
    "status",
    "progress",
    "stage",
    "error",
    "created_at",
    "summary",
    "url",
    "run_url",  # the upload's run page, or None (issue 19)
    "run_regressed",
    "follows_code",  # the incident this upload follows, or None (issue 33)
    "followup_outcome",
}


@pytest.fixture
def done_upload(alice: Any, alpha: Any) -> Upload:
    upload = make_upload(alpha, alice, FRAG, run="nightly-1")
    analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == "done", upload.error_message
    return upload


def csp_of(response: Any) -> dict[str, str]:
    header = response["Content-Security-Policy"]
    return {part.split()[0]: part for part in (p.strip() for p in header.split(";")) if part}


def test_detail_of_done_upload_renders_report_with_contract_context(alice_client: Any, done_upload: Upload) -> None:
    response = alice_client.get(f"/s/{done_upload.code}/")
    assert response.status_code == 200
    assert "snapshots/report.html" in [t.name for t in response.templates]
    ctx = response.context
    assert set(ctx["upload"]) == UPLOAD_KEYS
    device_summary = ctx["report"]["devices"][0]["summary"]
    assert ctx["upload"]["summary"]["peak_reserved_bytes"] == device_summary["peak_reserved_bytes"]
    assert ctx["shared"] is False and ctx["share_url"] is None
    assert ctx["charts"] and all(isinstance(v, dict) for v in ctx["charts"].values())
    assert "frag_oom.pickle.gz" in ctx["markdown_snippet"]
    csp = csp_of(response)
    nonce = re.search(r"'nonce-([^']+)'", csp["script-src"]).group(1)
    assert "unsafe-eval" not in response["Content-Security-Policy"]
    assert csp["img-src"] == "img-src 'self' data:" and csp["connect-src"] == "connect-src 'self'"
    tags = re.findall(r"<script\b[^>]*>", response.content.decode())
    # Every script that executes carries the nonce (JSON data blocks do not execute).
    executable = [t for t in tags if 'type="application/json"' not in t]
    assert executable and all(f'nonce="{nonce}"' in t for t in executable), executable


def test_share_by_page_action_then_revoke(client: Any, alice: Any, done_upload: Upload) -> None:
    client.force_login(alice)
    created = client.post(f"/s/{done_upload.code}/share/", {"action": "create"})
    assert created.status_code == 302
    ctx = client.get(f"/s/{done_upload.code}/").context
    share_url = ctx["share_url"]
    assert share_url and "/r/" in share_url
    assert share_url in ctx["markdown_snippet"]

    client.logout()
    shared = client.get(share_url)
    assert shared.status_code == 200
    assert shared.context["shared"] is True
    assert shared["Referrer-Policy"] == "no-referrer"
    assert shared["Cache-Control"] == "private, no-store"
    assert "noindex" in shared["X-Robots-Tag"]
    assert "unsafe-eval" not in shared["Content-Security-Policy"]
    body = shared.content.decode()
    assert 'action="/s/' not in body  # read-only: no share/revoke forms
    assert not re.search(r"https?://(?!testserver)", re.sub(r'value="[^"]*"', "", body))  # no third-party origin
    # The link reaches this report only.
    assert client.get(f"/s/{done_upload.code}/").status_code == 302
    assert client.get(f"/api/v1/snapshots/{done_upload.code}").status_code == 401

    client.force_login(alice)
    client.post(f"/s/{done_upload.code}/share/", {"action": "revoke"})
    client.logout()
    gone = client.get(share_url)
    assert gone.status_code == 404
    assert gone["Referrer-Policy"] == "no-referrer"
    assert client.get("/r/" + "x" * 43 + "/").status_code == 404


def test_status_page_and_json_while_queued(alice_client: Any, alice: Any, alpha: Any) -> None:
    upload = make_upload(alpha, alice, FRAG)
    page = alice_client.get(f"/s/{upload.code}/")
    assert "snapshots/status.html" in [t.name for t in page.templates]
    assert page.context["report"] is None
    status = alice_client.get(f"/s/{upload.code}/status.json").json()
    elapsed = status.pop("elapsed_s")
    assert status == {
        "status": "queued",
        "progress": 0,
        "stage": "",
        "error": None,
        "estimate_s": 3,  # the fixed rates: no analysis finished on this site yet
        "estimate_basis": "fixed rates",
        "waiting_for": "Waiting for a worker to take it.",
        "ranks": None,
        # issue 34: nothing stored yet, nothing said to be coming
        "parts": {"report": False, "charts": False, "stores": False},
        "coming": [],
        "remaining_s": None,
    }
    assert 0 <= elapsed < 60  # seconds since the upload row was made, a moment ago


def test_failed_upload_status_shows_code_and_message(alice_client: Any, alice: Any, alpha: Any, tmp_path: Any) -> None:
    path = tmp_path / "notes.pickle"
    path.write_bytes(b"\x80\x04K\x01.")  # a valid pickle of the integer 1: not a snapshot
    upload = make_upload(alpha, alice, path)
    analyse_upload(upload.id)
    status = alice_client.get(f"/s/{upload.code}/status.json").json()
    assert status["status"] == "failed"
    assert status["error"]["code"].startswith("snapshot:")
    assert status["error"]["message"]


def test_history_and_compare(alice_client: Any, alice: Any, alpha: Any, done_upload: Upload) -> None:
    other = make_upload(alpha, alice, FRAG, run="nightly-2")
    analyse_upload(other.id)
    history = alice_client.get("/p/alpha/")
    assert history.status_code == 200
    assert history.context["project"] == {"slug": "alpha", "name": "Alpha", "team": "Team A"}
    assert [r["run"] for r in history.context["rows"]] == ["nightly-2", "nightly-1"]
    # The history's rows add the follow-ups of each incident and the outcome in words (issue 33).
    assert all(set(r) == UPLOAD_KEYS | {"followed_by", "followup_words"} for r in history.context["rows"])
    assert all(r["followed_by"] == [] and r["followup_words"] == "not scored yet" for r in history.context["rows"])
    assert history.context["chart"] is not None

    compare = alice_client.get(f"/compare/{done_upload.code}/{other.code}/")
    assert compare.status_code == 200
    assert compare.context["a"]["upload"]["code"] == done_upload.code
    assert compare.context["b"]["report"].schema == "oomscope.report/1"  # typed: analysis.contract.Report
    other.refresh_from_db()
    assert compare.context["b"]["device"].summary.peak_reserved_bytes == other.summary["peak_reserved_bytes"]


def test_home_lists_teams_and_recent(alice_client: Any, done_upload: Upload) -> None:
    response = alice_client.get("/")
    assert response.context["teams"] == [
        {"name": "Team A", "slug": "team-a", "projects": [{"slug": "alpha", "name": "Alpha", "team": "Team A"}]}
    ]
    assert [u["code"] for u in response.context["recent"]] == [done_upload.code]


def test_signup_creates_a_team_and_logs_in(client: Any, django_user_model: Any) -> None:
    response = client.post(
        "/accounts/signup/",
        {"username": "dora", "password1": "a-long-pass-phrase-9", "password2": "a-long-pass-phrase-9"},
    )
    assert response.status_code == 302
    user = django_user_model.objects.get(username="dora")
    membership = Membership.objects.select_related("team").get(user=user)
    assert membership.role == "owner" and membership.team.projects.count() == 1
    assert client.get("/").status_code == 200


def test_login_page_renders(client: Any) -> None:
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert "form" in response.context


def test_share_link_to_unfinished_upload_polls_through_the_link(client: Any, alice: Any, alpha: Any) -> None:
    from webapp.snapshots.teams import shares

    upload = make_upload(alpha, alice, FRAG)
    token = shares.share_create(upload, alice)
    page = client.get(f"/r/{token}/")
    assert page.status_code == 200
    assert "snapshots/status.html" in [t.name for t in page.templates]
    assert page.context["status_url"] == f"/r/{token}/status.json"
    poll = client.get(page.context["status_url"])
    assert poll.json()["status"] == "queued"
    assert poll["Referrer-Policy"] == "no-referrer"
    analyse_upload(upload.id)
    assert client.get(f"/r/{token}/status.json").json()["status"] == "done"
    shares.share_revoke(upload)
    assert client.get(f"/r/{token}/status.json").status_code == 404


def test_several_named_share_links_each_revocable(
    client: Any, alice: Any, django_user_model: Any, done_upload: Upload
) -> None:
    """Issue 10: a second link no longer kills the first; the team sees every link, with its uses."""
    from django.contrib.sessions.models import Session
    from django.test import Client

    from webapp.snapshots.models import ShareLink
    from webapp.snapshots.teams import membership

    client.force_login(alice)
    client.post(f"/s/{done_upload.code}/share/", {"action": "create", "name": "ticket ML-1"})
    first = client.get(f"/s/{done_upload.code}/").context["share_url"]
    token = first.rstrip("/").rsplit("/", 1)[-1]
    # The raw token is in no database row (sessions and links included), only its hash.
    assert all(token not in str(s.get_decoded()) for s in Session.objects.all())
    assert not ShareLink.objects.filter(nonce=token).exists() and not ShareLink.objects.filter(key=token).exists()
    # A teammate sees the link and makes a second one: both stay live.
    carol = django_user_model.objects.create_user("carol")
    membership.membership_add(team=done_upload.project.team, user=carol)
    teammate = Client()
    teammate.force_login(carol)
    assert teammate.get(f"/s/{done_upload.code}/").context["share_url"] == first
    teammate.post(f"/s/{done_upload.code}/share/", {"action": "create", "name": "slack #infra"})
    links = client.get(f"/s/{done_upload.code}/").context["share_links"]
    assert [(link["name"], link["created_by"], link["active"]) for link in links] == [
        ("slack #infra", "carol", True),
        ("ticket ML-1", "alice", True),
    ]
    second = links[0]["url"]
    assert links[1]["url"] == first and second != first
    # Each use is counted on its own link.
    for _ in range(3):
        assert Client().get(first).status_code == 200
    assert Client().get(second).status_code == 200
    links = client.get(f"/s/{done_upload.code}/").context["share_links"]
    assert [link["use_count"] for link in links] == [1, 3]
    # Revoking one leaves the other working.
    client.post(f"/s/{done_upload.code}/share/", {"action": "revoke", "key": links[1]["key"]})
    assert Client().get(first).status_code == 404
    assert Client().get(second).status_code == 200
    page = client.get(f"/s/{done_upload.code}/")
    assert [link["active"] for link in page.context["share_links"]] == [True, False]
    assert page.context["share_url"] == second
    body = page.content.decode()
    assert "ticket ML-1" in body and "slack #infra" in body and "revoked" in body
