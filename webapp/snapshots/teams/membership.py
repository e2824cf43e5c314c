"""Teams, projects and members: creating them, invitations and their answers, removing a member, a
new user's personal team. Refusals are ``TeamError`` (a ``UserError``, code ``team:<reason>``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from webapp.snapshots import messages
from webapp.snapshots.errors import TeamError
from webapp.snapshots.models import ApiToken, Invitation, Membership, Project, Team
from webapp.snapshots.teams.access import can, role_of
from webapp.snapshots.usertext import clean_line

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

    AnyUser = User | AnonymousUser


@transaction.atomic
def team_create(*, name: str, slug: str, owner: User) -> Team:
    team = Team.objects.create(name=name, slug=slug)
    Membership.objects.create(team=team, user=owner, role=Membership.Role.OWNER)
    return team


def membership_add(*, team: Team, user: User, role: str = Membership.Role.MEMBER) -> Membership:
    membership, _ = Membership.objects.get_or_create(team=team, user=user, defaults={"role": role})
    return membership


def project_create(*, team: Team, name: str, slug: str) -> Project:
    return Project.objects.create(team=team, name=name, slug=slug)


INVITABLE_ROLES = (Membership.Role.VIEWER, Membership.Role.MEMBER, Membership.Role.ADMIN)


def _free_slug(model: Any, wanted: str) -> str:
    from django.utils.text import slugify

    base = slugify(wanted)[:50] or "project"
    slug, n = base, 1
    while model.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


def team_create_for_user(user: User, name: str) -> Team:
    name = clean_line(name)[:100]
    if not name:
        raise TeamError("team:name-required", messages.TEAM_NAME_REQUIRED)
    # Each team has its own storage quota: a user who could make teams without end had no quota.
    owned = Membership.objects.filter(user=user, role=Membership.Role.OWNER).count()
    if owned >= settings.TEAMS_PER_USER_MAX:
        raise TeamError("team:too-many", messages.TEAM_TOO_MANY.format(limit=settings.TEAMS_PER_USER_MAX))
    return team_create(name=name, slug=_free_slug(Team, name), owner=user)


def project_create_for_user(user: User, team: Team, name: str) -> Project:
    """A new project in ``team`` (admins and owners); its slug is made from the name, unique site-wide."""
    if not can(user, team, "manage"):
        raise TeamError("team:forbidden", messages.TEAM_FORBIDDEN)
    name = clean_line(name)[:100]
    if not name:
        raise TeamError("team:name-required", messages.PROJECT_NAME_REQUIRED)
    return project_create(team=team, name=name, slug=_free_slug(Project, name))


def member_invite(by: User, team: Team, who: str, role: str) -> Membership | Invitation:
    """Invite an existing user, named by username or email, with ``role``; or change a member's role.

    Someone not yet in the team gets an ``Invitation`` they accept or decline (``invitation_answer``):
    nobody is added to a team without their consent. A member's role changes at once (they consented
    when they joined). Inviting again replaces the pending invitation's role."""
    from django.contrib.auth import get_user_model

    if not can(by, team, "manage"):
        raise TeamError("team:forbidden", messages.TEAM_FORBIDDEN)
    if role not in INVITABLE_ROLES:
        raise TeamError("team:bad-role", messages.TEAM_BAD_ROLE.format(role=role))
    who = who.strip()
    users = get_user_model().objects.filter(is_active=True)
    found = users.filter(username__iexact=who).first() if who else None
    if found is None and "@" in who:
        matches = list(users.filter(email__iexact=who)[:2])
        found = matches[0] if len(matches) == 1 else None
    if not who:
        raise TeamError("team:no-such-user", messages.TEAM_NO_SUCH_USER.format(who=who))
    if found is None:
        # The same answer as for an account (issue 36: the form told whether an account or e-mail
        # exists): an invitation that names no account, listed as typed, which nobody can accept.
        invitation, _ = Invitation.objects.update_or_create(
            team=team, user=None, invited_as=who[:254], defaults={"role": role, "invited_by": by}
        )
        return invitation
    membership = Membership.objects.filter(team=team, user=found).first()
    if membership is None:
        invitation, _ = Invitation.objects.update_or_create(
            team=team, user=found, defaults={"role": role, "invited_by": by, "invited_as": who[:254]}
        )
        return invitation
    if membership.role == Membership.Role.OWNER:
        raise TeamError("team:owner", messages.TEAM_OWNER_FIXED)
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def invitation_answer(user: User, invitation_id: int, accept: bool) -> Team:
    """The invitee accepts (becomes a member with the invited role) or declines; only they can."""
    invitation = (
        Invitation.objects.select_for_update().filter(pk=invitation_id, user=user).select_related("team").first()
    )
    if invitation is None:
        raise TeamError("team:no-such-invitation", messages.TEAM_NO_SUCH_INVITATION)
    team = invitation.team
    if accept:
        Membership.objects.get_or_create(team=team, user=user, defaults={"role": invitation.role})
    invitation.delete()
    return team


def invitation_cancel(by: User, team: Team, username: str) -> None:
    """An admin withdraws a pending invitation."""
    if not can(by, team, "manage"):
        raise TeamError("team:forbidden", messages.TEAM_FORBIDDEN)
    deleted, _ = (
        Invitation.objects.filter(team=team)
        .filter(Q(invited_as=username) | Q(invited_as="", user__username=username))
        .delete()
    )
    if not deleted:
        raise TeamError("team:no-such-invitation", messages.TEAM_NO_SUCH_INVITATION)


def invitations_for(user: AnyUser) -> list[dict[str, Any]]:
    """The invitations waiting for ``user``, with what tells look-alike teams apart: the team's
    slug (unique site-wide) and who invited them, beside the team's name."""
    if not user.is_authenticated:
        return []
    rows = Invitation.objects.filter(user_id=user.pk).select_related("team", "invited_by").order_by("created_at")
    return [
        {
            "id": row.pk,
            "team_name": row.team.name,
            "team_slug": row.team.slug,
            "invited_by": row.invited_by.get_username(),
            "role": row.role,
        }
        for row in rows
    ]


def member_remove(by: User, team: Team, username: str) -> None:
    """Remove a member (admins and owners; anyone may leave). The owner stays."""
    membership = Membership.objects.filter(team=team, user__username=username).select_related("user").first()
    if membership is None:
        raise TeamError("team:no-such-member", messages.TEAM_NO_SUCH_USER.format(who=username))
    if membership.user_id != by.pk and not can(by, team, "manage"):
        raise TeamError("team:forbidden", messages.TEAM_FORBIDDEN)
    if membership.role == Membership.Role.OWNER:
        raise TeamError("team:owner", messages.TEAM_OWNER_FIXED)
    membership.delete()
    # A token limited to one of this team's projects is of no use to its user any more.
    ApiToken.objects.filter(user_id=membership.user_id, project__team=team, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )


def team_dict(team: Team, user: AnyUser) -> dict[str, Any]:
    members = Membership.objects.filter(team=team).select_related("user").order_by("user__username")
    role = role_of(user, team)
    return {
        "name": team.name,
        "slug": team.slug,
        "role": role,
        "can_manage": can(user, team, "manage"),
        "members": [{"username": m.user.get_username(), "email": m.user.email, "role": m.role} for m in members],
        # Pending invitations are the admins' business only.
        "invitations": [
            {
                "username": i.invited_as or (i.user.get_username() if i.user else ""),
                "role": i.role,
                "invited_by": i.invited_by.get_username(),
            }
            for i in team.invitations.select_related("user", "invited_by").order_by("invited_as", "user__username")
        ]
        if can(user, team, "manage")
        else [],
        "projects": [project_dict(p) for p in team.projects.order_by("name")],
    }


@transaction.atomic
def personal_team_create(user: User) -> Project:
    """Sign-up gives each user a team and a first project, so uploading works at once."""
    # Any valid username ("dot.user@x", "a+b") becomes a URL slug ([-a-z0-9]); slugify drops
    # the rest, so separators become hyphens first.
    base = slugify(re.sub(r"[._@+\s]+", "-", user.get_username()))[:40].strip("-") or "user"
    slug = base
    n = 1
    while Team.objects.filter(slug=slug).exists() or Project.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    team = team_create(name=f"{user.get_username()}'s team", slug=slug, owner=user)
    return project_create(team=team, name="Default", slug=slug)


def project_dict(project: Project) -> dict[str, Any]:
    return {"slug": project.slug, "name": project.name, "team": project.team.name}
