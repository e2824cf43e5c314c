"""The access rule, in one place: a user sees a project, and the uploads in it, when the user is a
member of the project's team (``visible_projects`` / ``visible_uploads``). Every lookup by id for a
user goes through them, so another team's id is simply "not found". What a member may do beyond
reading depends on the role (``ROLE_RIGHTS``, asked through ``can``): a viewer reads, a member also
uploads and shares; a token may be limited to one project (``token_allows``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.models import QuerySet

from webapp.snapshots.models import ApiToken, Membership, Project, Team, Upload

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

    AnyUser = User | AnonymousUser


def visible_projects(user: AnyUser) -> QuerySet[Project]:
    if not user.is_authenticated:
        return Project.objects.none()
    return Project.objects.filter(team__memberships__user=user).select_related("team")


def visible_uploads(user: AnyUser) -> QuerySet[Upload]:
    if not user.is_authenticated:
        return Upload.objects.none()
    return Upload.objects.filter(project__team__memberships__user=user).select_related(
        "project", "project__team", "run_ref"
    )


def upload_for_user(user: AnyUser, code: str) -> Upload | None:
    return visible_uploads(user).filter(code=code).first()


def project_for_user(user: AnyUser, slug: str) -> Project | None:
    return visible_projects(user).filter(slug=slug).first()


# What each role may do, in one place. Viewers read; members also upload and share; admins and
# owners also manage the team (members, roles, projects).
ROLE_RIGHTS: dict[str, frozenset[str]] = {
    Membership.Role.VIEWER: frozenset({"read"}),
    Membership.Role.MEMBER: frozenset({"read", "write"}),
    Membership.Role.ADMIN: frozenset({"read", "write", "manage"}),
    Membership.Role.OWNER: frozenset({"read", "write", "manage"}),
}


def role_of(user: AnyUser, team: Team) -> str | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.filter(team=team, user=user).values_list("role", flat=True).first()


def can(user: AnyUser, team: Team, right: str) -> bool:
    role = role_of(user, team)
    return role is not None and right in ROLE_RIGHTS.get(role, frozenset())


def visible_teams(user: AnyUser) -> QuerySet[Team]:
    if not user.is_authenticated:
        return Team.objects.none()
    return Team.objects.filter(memberships__user=user).order_by("name")


def team_for_user(user: AnyUser, slug: str) -> Team | None:
    return visible_teams(user).filter(slug=slug).first()


def writable_projects(user: AnyUser) -> QuerySet[Project]:
    """Projects the user may upload into (member or above)."""
    if not user.is_authenticated:
        return Project.objects.none()
    roles = [role for role, rights in ROLE_RIGHTS.items() if "write" in rights]
    return visible_projects(user).filter(team__memberships__user=user, team__memberships__role__in=roles).distinct()


def upload_can_delete(user: AnyUser, upload: Upload) -> bool:
    """The uploader while their role may still write, or anyone who manages the team (ROLE_RIGHTS).

    A viewer who uploaded something before being made a viewer may no longer delete it.
    """
    team = upload.project.team
    if can(user, team, "manage"):
        return True
    return upload.uploaded_by_id == user.pk and can(user, team, "write")


def token_allows(token: ApiToken | None, project: Project | None) -> bool:
    """Whether a request's token may reach ``project`` (a token without a project reaches all its user's)."""
    if project is None:
        return False
    return token is None or token.project_id is None or token.project_id == project.pk
