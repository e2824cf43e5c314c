"""Roles inside a team (``access.ROLE_RIGHTS``): a viewer reads; a member also uploads and shares.

Team A has one user of each role (owner alice, admin, member, viewer). Every role reads every
page and API route of the team; only a viewer is refused an upload (API with a slug, through a
token's default project, and with no project at all: 403 ``upload:read-only``; the page does
not offer the project) and share links (create and revoke: API 403 ``share:read-only``, the
page says so), and nothing is written.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages

from tests.webapp.helpers import GPT_OOM, bearer
from webapp.snapshots.intake import store
from webapp.snapshots.models import Membership, ShareLink, Team, Upload
from webapp.snapshots.teams import access, membership, shares, tokens

pytestmark = pytest.mark.django_db

ROLES = ["owner", "admin", "member", "viewer"]


@pytest.fixture
def team(alice: Any, alpha: Any, django_user_model: Any) -> dict[str, Any]:
    team = Team.objects.get(slug="team-a")
    users = {"owner": alice}
    for role in ("admin", "member", "viewer"):
        user = django_user_model.objects.create_user(role, password=f"pw-{role}-123")
        membership.membership_add(team=team, user=user, role=role)
        users[role] = user
    upload = Upload.objects.create(
        code=store.new_upload_code(), project=alpha, uploaded_by=alice, filename="a", bytes=1
    )
    other = Upload.objects.create(code=store.new_upload_code(), project=alpha, uploaded_by=alice, filename="b", bytes=1)
    return {"team": team, "users": users, "upload": upload, "other": other, "project": alpha}


def test_the_role_table() -> None:
    """The rules as the site states them; a change here is a change of policy, on purpose."""
    assert set(access.ROLE_RIGHTS) == set(Membership.Role.values) == set(ROLES)
    assert access.ROLE_RIGHTS["viewer"] == {"read"}
    assert access.ROLE_RIGHTS["member"] == {"read", "write"}
    assert access.ROLE_RIGHTS["admin"] == access.ROLE_RIGHTS["owner"] == {"read", "write", "manage"}


def test_roles_are_stored_as_given(team: dict[str, Any]) -> None:
    roles = dict(Membership.objects.filter(team=team["team"]).values_list("user__username", "role"))
    assert roles == {"alice": "owner", "admin": "admin", "member": "member", "viewer": "viewer"}


@pytest.mark.parametrize("role", ROLES)
def test_every_role_reads_everything_of_the_team(client: Any, team: dict[str, Any], role: str) -> None:
    user = team["users"][role]
    token = tokens.api_token_create(user)
    code, other = team["upload"].code, team["other"].code
    client.force_login(user)
    for url in (f"/s/{code}/", f"/s/{code}/status.json", "/p/alpha/", f"/compare/{code}/{other}/", "/"):
        assert client.get(url).status_code == 200, url
    client.logout()
    for url in (f"/api/v1/snapshots/{code}", "/api/v1/projects/alpha/runs"):
        assert client.get(url, **bearer(token)).status_code == 200, url


def _post_snapshot(client: Any, token: str | None, **fields: Any) -> Any:
    with open(GPT_OOM, "rb") as fh:
        if token is None:
            return client.post("/upload/", {"file": fh, **fields}, headers={"Accept": "application/json"})
        return client.post("/api/v1/snapshots", {"file": fh, **fields}, **bearer(token))


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("how", ["api-slug", "api-default-project", "api-no-project", "page"])
def test_only_a_viewer_is_refused_an_upload(
    client: Any, team: dict[str, Any], role: str, how: str, django_capture_on_commit_callbacks: Any
) -> None:
    user = team["users"][role]
    before = Upload.objects.count()
    with django_capture_on_commit_callbacks() as published:
        if how == "page":
            client.force_login(user)
            response = _post_snapshot(client, None, project="alpha")
        elif how == "api-default-project":
            response = _post_snapshot(client, tokens.api_token_create(user, default_project=team["project"]))
        elif how == "api-no-project":  # alpha is the user's only project
            response = _post_snapshot(client, tokens.api_token_create(user))
        else:
            response = _post_snapshot(client, tokens.api_token_create(user), project="alpha")
    if role == "viewer":
        if how == "page":  # not among the page's choices
            assert response.status_code == 400, response.content
            assert response.json()["error"]["code"] == "upload:invalid"
            assert "project" in response.json()["error"]["message"]
        else:
            assert response.status_code == 403, response.content
            assert response.json()["error"] == {
                "code": "upload:read-only",
                "message": "You can read this project but not upload to it (your role is viewer). "
                "You can upload to no project: ask a team's admin to make you a member, or create a team.",
                "choices": [],  # the viewer may upload nowhere
            }
        assert Upload.objects.count() == before and not published
    else:
        assert response.status_code == 202, response.content
        assert Upload.objects.count() == before + 1 and len(published) == 1
        assert Upload.objects.get(code=response.json()["id"]).uploaded_by == user


def test_the_upload_page_offers_a_viewer_no_read_only_project(client: Any, team: dict[str, Any]) -> None:
    client.force_login(team["users"]["viewer"])
    response = client.get("/upload/")
    assert response.status_code == 200
    assert response.context["form"].fields["project"].choices == []
    client.force_login(team["users"]["member"])
    assert client.get("/upload/").context["form"].fields["project"].choices == [("alpha", "Team A / Alpha")]


def test_a_viewers_page_upload_without_json_is_the_form_again(client: Any, team: dict[str, Any]) -> None:
    client.force_login(team["users"]["viewer"])
    with open(GPT_OOM, "rb") as fh:
        response = client.post("/upload/", {"file": fh, "project": "alpha"})
    assert response.status_code == 400
    assert "project" in response.context["form"].errors
    assert Upload.objects.count() == 2


@pytest.mark.parametrize("role", ROLES)
def test_only_a_viewer_is_refused_share_links(client: Any, team: dict[str, Any], role: str) -> None:
    user = team["users"][role]
    upload = team["upload"]
    token = tokens.api_token_create(user)
    created_api = client.post(f"/api/v1/snapshots/{upload.code}/share", **bearer(token))
    client.force_login(user)
    created_page = client.post(f"/s/{upload.code}/share/", {"action": "create"})
    live = shares.share_create(upload, team["users"]["owner"])  # one live link, made by the owner
    revoked_page = client.post(f"/s/{upload.code}/share/", {"action": "revoke"})
    if role == "viewer":
        assert created_api.status_code == 403
        assert created_api.json()["error"] == {
            "code": "share:read-only",
            "message": "Viewers can read this report but not make or revoke its share links.",
        }
        for response in (created_page, revoked_page):  # back to the report, saying why
            assert response.status_code == 302
            said = [str(m) for m in get_messages(response.wsgi_request)]
            assert "Viewers can read this report but not make or revoke its share links." in said
        revoked_api = client.delete(f"/api/v1/snapshots/{upload.code}/share", **bearer(token))
        assert revoked_api.status_code == 403
        # Only the owner's link exists, and it is still live.
        assert list(ShareLink.objects.values_list("created_by__username", "revoked_at")) == [("alice", None)]
        assert shares.upload_for_share_token(live, count_use=False) == upload
    else:
        assert created_api.status_code == 201
        assert created_page.status_code == 302
        assert revoked_page.status_code == 302
        made = ShareLink.objects.exclude(token_hash=tokens.token_hash(live)).filter(upload=upload, created_by=user)
        assert made.count() == 2  # one by the API, one by the page
        assert shares.upload_for_share_token(live, count_use=False) is None  # revoked by this role
        assert not ShareLink.objects.filter(revoked_at__isnull=True).exists()


def test_a_role_change_takes_effect_on_the_next_request(client: Any, team: dict[str, Any]) -> None:
    member = team["users"]["member"]
    token = tokens.api_token_create(member)
    url = f"/api/v1/snapshots/{team['upload'].code}/share"
    assert client.post(url, **bearer(token)).status_code == 201
    Membership.objects.filter(user=member).update(role="viewer")
    assert client.post(url, **bearer(token)).status_code == 403
    Membership.objects.filter(user=member).update(role="member")
    assert client.post(url, **bearer(token)).status_code == 201


def test_a_stranger_has_no_role_and_no_right(team: dict[str, Any], bob: Any) -> None:
    """Someone outside the team has no role: every right is refused (the views answer 404 before)."""
    assert access.role_of(bob, team["team"]) is None
    for right in ("read", "write", "manage"):
        assert not access.can(bob, team["team"], right)
    assert list(access.writable_projects(bob)) == []
    assert [p.slug for p in access.writable_projects(team["users"]["member"])] == ["alpha"]
    assert list(access.writable_projects(team["users"]["viewer"])) == []


@pytest.mark.parametrize("role", ROLES)
def test_only_a_viewer_is_refused_a_reanalysis_with_the_oom_message(
    client: Any, team: dict[str, Any], role: str
) -> None:
    import json

    from webapp.snapshots import messages

    upload = team["upload"]  # gpt_varlen_oom, with the message torch printed for it
    message = json.loads(GPT_OOM.with_name("gpt_varlen_oom.truth.json").read_text())["oom_message"]
    client.force_login(team["users"][role])
    before = Upload.objects.count()
    response = client.post(f"/s/{upload.code}/message/", {"oom_message": message})
    assert response.status_code == 302
    said = [str(m) for m in get_messages(response.wsgi_request)]
    if role == "viewer":  # back to the report's basis, saying why; nothing queued
        assert response["Location"].endswith(f"/s/{upload.code}/#basis")
        assert said == [messages.REANALYSE_READ_ONLY]
        assert Upload.objects.count() == before
    else:
        assert messages.REANALYSE_READ_ONLY not in said
        assert Upload.objects.count() == before + 1
