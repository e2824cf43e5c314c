"""Teams and projects in the UI (issue 10, item 4): create a project, invite by username or email
with a role, remove; API tokens made in the UI, optionally limited to one project."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from tests.webapp.helpers import GPT_OOM, bearer, make_upload
from webapp.snapshots.models import Invitation, Membership, Project, Upload

pytestmark = pytest.mark.django_db


def role(team: Any, user: Any) -> str | None:
    return Membership.objects.filter(team=team, user=user).values_list("role", flat=True).first()


def invited_and_accepted(admin: Client, team: Any, invitee: Any, who: str, role: str) -> None:
    """An admin invites; the invitee accepts on their Teams page (nobody joins without consent)."""
    admin.post(f"/t/{team.slug}/", {"action": "invite", "who": who, "role": role})
    invitation = Invitation.objects.get(team=team, user=invitee)
    own = Client()
    own.force_login(invitee)
    accepted = own.post("/teams/", {"action": "accept", "invitation": invitation.pk})
    assert accepted.status_code == 302 and accepted["Location"] == f"/t/{team.slug}/"


def upload_via_api(client: Any, token: str, **fields: Any) -> Any:
    with open(GPT_OOM, "rb") as fh:
        return client.post("/api/v1/snapshots", {"file": fh, **fields}, **bearer(token))


def test_admin_creates_a_project_and_invites_with_roles(alice_client: Any, alice: Any, alpha: Any, bob: Any) -> None:
    team = alpha.team
    made = alice_client.post(f"/t/{team.slug}/", {"action": "create_project", "name": "Gamma runs"}, follow=True)
    assert made.status_code == 200
    gamma = Project.objects.get(team=team, name="Gamma runs")
    assert gamma.slug == "gamma-runs"
    assert "Project Gamma runs created (gamma-runs)." in made.content.decode()

    bob.email = "bob@example.com"
    bob.save()
    # By email, as a viewer.
    invited_and_accepted(alice_client, team, bob, "BOB@example.com", "viewer")
    assert role(team, bob) == "viewer"
    viewer = Client()
    viewer.force_login(bob)
    assert viewer.get(f"/p/{alpha.slug}/").status_code == 200  # reads
    upload_page = viewer.get("/upload/")
    assert [slug for slug, _ in upload_page.context["form"].fields["project"].choices] == []  # cannot upload
    done = make_upload(alpha, alice)
    assert viewer.get(f"/s/{done.code}/").status_code == 200
    viewer.post(f"/s/{done.code}/share/", {"action": "create"})
    assert not done.share_links.exists()  # viewers hand out no access

    # By username, promoted to member: now bob uploads.
    alice_client.post(f"/t/{team.slug}/", {"action": "invite", "who": "bob", "role": "member"})
    assert role(team, bob) == "member"
    choices = [slug for slug, _ in viewer.get("/upload/").context["form"].fields["project"].choices]
    assert choices == [alpha.slug, gamma.slug]

    # A member cannot invite or remove others.
    carol = type(bob).objects.create_user("carol")
    viewer.post(f"/t/{team.slug}/", {"action": "invite", "who": "carol", "role": "admin"})
    assert role(team, carol) is None and not Invitation.objects.filter(user=carol).exists()
    # Unknown people get the same answer as an account (issue 36: the form told who has one); nobody joins.
    unknown = alice_client.post(f"/t/{team.slug}/", {"action": "invite", "who": "nobody@x.org"}, follow=True)
    assert "nobody@x.org is invited as member: if an account has that name" in unknown.content.decode()
    assert not Membership.objects.filter(team=team, user__email="nobody@x.org").exists()
    bad_role = alice_client.post(f"/t/{team.slug}/", {"action": "invite", "who": "carol", "role": "owner"}, follow=True)
    assert "Unknown role" in bad_role.content.decode() and role(team, carol) is None
    assert not Invitation.objects.filter(user=carol).exists()

    # The owner cannot be removed; bob can.
    alice_client.post(f"/t/{team.slug}/", {"action": "remove", "username": "alice"})
    assert role(team, alice) == "owner"
    alice_client.post(f"/t/{team.slug}/", {"action": "remove", "username": "bob"})
    assert role(team, bob) is None
    assert viewer.get(f"/p/{alpha.slug}/").status_code == 404


def test_viewer_token_cannot_upload(client: Any, alice_client: Any, alpha: Any, bob: Any) -> None:
    from webapp.snapshots.teams import tokens

    invited_and_accepted(alice_client, alpha.team, bob, "bob", "viewer")
    token = tokens.api_token_create(bob)
    refused = upload_via_api(client, token, project=alpha.slug)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "upload:read-only"
    assert not Upload.objects.exists()


def test_ui_tokens_see_what_the_web_user_sees(client: Any, alice_client: Any, alice: Any, alpha: Any) -> None:
    alice_client.post(f"/t/{alpha.team.slug}/", {"action": "create_project", "name": "Gamma"})
    gamma = Project.objects.get(slug="gamma")
    home = alice_client.get("/").context["teams"]
    web_projects = sorted(p["slug"] for t in home for p in t["projects"])
    assert web_projects == ["alpha", "gamma"]

    def make(**fields: str) -> str:
        page = alice_client.post("/tokens/", {"action": "create", **fields})
        assert page.status_code == 200 and page["Cache-Control"] == "no-store"
        token = page.context["new_token"]
        assert token in page.content.decode()  # shown once, on this response
        return str(token)

    wide = make(name="laptop")
    narrow = make(name="cluster", project="gamma")
    listed = alice_client.get("/tokens/")
    assert token_rows(listed.content.decode()) == [("cluster", "project gamma only"), ("laptop", "all your projects")]
    assert wide not in listed.content.decode() and narrow not in listed.content.decode()

    # The unlimited token's user sees exactly the web user's projects.
    seen = client.get("/api/v1/projects", **bearer(wide)).json()["projects"]
    assert sorted(p["slug"] for p in seen) == web_projects
    # The limited one reaches its project only: reads, and uploads without a project land there.
    assert [p["slug"] for p in client.get("/api/v1/projects", **bearer(narrow)).json()["projects"]] == ["gamma"]
    in_alpha = make_upload(alpha, alice)
    assert client.get(f"/api/v1/snapshots/{in_alpha.code}", **bearer(narrow)).status_code == 404
    assert client.get(f"/api/v1/snapshots/{in_alpha.code}", **bearer(wide)).status_code == 200
    assert client.get("/api/v1/projects/alpha/runs", **bearer(narrow)).status_code == 404
    assert upload_via_api(client, narrow, project="alpha").status_code == 404
    posted = upload_via_api(client, narrow)
    assert posted.status_code == 202
    assert Upload.objects.get(code=posted.json()["id"]).project == gamma

    # Revoked in the UI: 401 at once.
    prefix = narrow[:10]
    alice_client.post("/tokens/", {"action": "revoke", "prefix": prefix})
    assert client.get("/api/v1/projects", **bearer(narrow)).status_code == 401
    # A project that is not yours cannot scope a token.
    assert alice_client.post("/tokens/", {"action": "create", "project": "beta-nope"}).status_code == 400


def token_rows(html: str) -> list[tuple[str, str]]:
    rows = re.findall(
        r'<tr data-prefix="[^"]+" class="live"><td>([^<]*)</td><td class="mono">[^<]*</td>\s*<td>([^<]*)</td>', html
    )
    return [(name, reach) for name, reach in rows]


def test_removing_a_member_revokes_their_tokens_for_that_team(alice_client: Any, alpha: Any, bob: Any) -> None:
    from webapp.snapshots.teams import tokens

    invited_and_accepted(alice_client, alpha.team, bob, "bob", "member")
    token = tokens.api_token_create(bob, project=alpha)
    assert Client().get("/api/v1/projects", **bearer(token)).status_code == 200
    alice_client.post(f"/t/{alpha.team.slug}/", {"action": "remove", "username": "bob"})
    assert Client().get("/api/v1/projects", **bearer(token)).status_code == 401


def test_an_invitee_is_no_member_until_they_accept(alice_client: Any, alice: Any, alpha: Any, bob: Any) -> None:
    """Issue 22: an admin added anyone to a team without their consent. Now an invitation waits;
    until bob accepts he reads none of the team's projects; declining leaves him out."""
    done = make_upload(alpha, alice)
    invited = alice_client.post(
        f"/t/{alpha.team.slug}/", {"action": "invite", "who": "bob", "role": "member"}, follow=True
    )
    assert "bob is invited as member" in invited.content.decode()
    assert role(alpha.team, bob) is None
    # The team's admins see the pending invitation.
    assert re.search(r'<tr data-invited="bob"><td>bob</td><td>member</td><td>alice</td>', invited.content.decode())
    bob_client = Client()
    bob_client.force_login(bob)
    assert bob_client.get(f"/p/{alpha.slug}/").status_code == 404
    assert bob_client.get(f"/s/{done.code}/").status_code == 404
    assert bob_client.get(f"/t/{alpha.team.slug}/").status_code == 404
    assert [slug for slug, _ in bob_client.get("/upload/").context["form"].fields["project"].choices] == []
    from webapp.snapshots.teams import tokens

    token = tokens.api_token_create(bob)
    assert Client().get("/api/v1/projects", **bearer(token)).json()["projects"] == []

    # Declined: gone, still no access, and the admin may invite again.
    invitation = Invitation.objects.get(team=alpha.team, user=bob)
    bob_client.post("/teams/", {"action": "decline", "invitation": invitation.pk})
    assert not Invitation.objects.exists() and role(alpha.team, bob) is None
    assert bob_client.get(f"/p/{alpha.slug}/").status_code == 404

    # Invited again and accepted: a member with the invited role, who reads the report.
    invited_and_accepted(alice_client, alpha.team, bob, "bob", "viewer")
    assert role(alpha.team, bob) == "viewer" and not Invitation.objects.exists()
    assert bob_client.get(f"/s/{done.code}/").status_code == 200


def test_only_the_invitee_answers_an_invitation(alice_client: Any, alpha: Any, bob: Any) -> None:
    alice_client.post(f"/t/{alpha.team.slug}/", {"action": "invite", "who": "bob", "role": "admin"})
    invitation = Invitation.objects.get(team=alpha.team, user=bob)
    mallory = type(bob).objects.create_user("mallory")
    other = Client()
    other.force_login(mallory)
    refused = other.post("/teams/", {"action": "accept", "invitation": invitation.pk}, follow=True)
    assert "That invitation is not there any more" in refused.content.decode()
    assert role(alpha.team, mallory) is None and role(alpha.team, bob) is None
    assert Invitation.objects.filter(pk=invitation.pk).exists()
    # Nor does the inviter accept on bob's behalf.
    alice_client.post("/teams/", {"action": "accept", "invitation": invitation.pk})
    assert role(alpha.team, bob) is None
    # An admin withdraws it; bob's accept then does nothing.
    alice_client.post(f"/t/{alpha.team.slug}/", {"action": "cancel_invitation", "username": "bob"})
    bob_client = Client()
    bob_client.force_login(bob)
    bob_client.post("/teams/", {"action": "accept", "invitation": invitation.pk})
    assert role(alpha.team, bob) is None


def test_a_look_alike_team_shows_its_address_and_inviter(alice_client: Any, alpha: Any, bob: Any) -> None:
    """Issue 22: an invitation under a look-alike name. bob's Teams page shows, beside each
    invited team's name, its unique slug and who invited him, so two 'Alpha' teams differ."""
    mallory = type(bob).objects.create_user("mallory")
    mallory_client = Client()
    mallory_client.force_login(mallory)
    mallory_client.post("/teams/", {"name": alpha.team.name})
    fake = Membership.objects.get(user=mallory, role="owner").team
    assert fake.name == alpha.team.name and fake.slug != alpha.team.slug
    alice_client.post(f"/t/{alpha.team.slug}/", {"action": "invite", "who": "bob", "role": "member"})
    mallory_client.post(f"/t/{fake.slug}/", {"action": "invite", "who": "bob", "role": "member"})
    bob_client = Client()
    bob_client.force_login(bob)
    html = bob_client.get("/teams/").content.decode()
    rows = re.findall(
        r'<tr data-invitation="\d+"><td>([^<]*)</td><td class="mono">([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>', html
    )
    assert rows == [(alpha.team.name, alpha.team.slug, "alice", "member"), (fake.name, fake.slug, "mallory", "member")]
