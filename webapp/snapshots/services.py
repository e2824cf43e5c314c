"""Everything that reads for a user or writes a row. Views and tasks call only these.

Access rule, in one place: a user sees a project, and the uploads in it, when the user
is a member of the project's team (``visible_projects`` / ``visible_uploads``). Every
lookup by id for a user goes through them, so another team's id is simply "not found".
What a member may do beyond reading depends on the role (``ROLE_RIGHTS``, asked through
``can``): a viewer reads, a member also uploads and shares.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import IntegrityError, OperationalError, transaction
from django.db.models import F, Q, QuerySet
from django.urls import reverse
from django.utils import timezone
from django.utils.text import slugify
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from analysis import readout
from analysis.stored import load, upgrade
from webapp.snapshots import disk, followups, liveness, messages, quota, ratelimits, runarchive, runs
from webapp.snapshots.models import ApiToken, Invitation, Membership, Project, Report, Run, ShareLink, Team, Upload
from webapp.snapshots.ratelimits import LimitExceeded

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User
    from django.core.files.uploadedfile import UploadedFile
    from django.http import HttpRequest

    from webapp.snapshots.intake import Admission

    AnyUser = User | AnonymousUser

log = logging.getLogger(__name__)

API_TOKEN_PREFIX = "oom_"  # noqa: S105 - a public marker, not a secret


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_upload_code() -> str:
    return secrets.token_urlsafe(16)


# --- reading, always through membership -------------------------------------------------


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


def upload_for_share_token(token: str, *, count_use: bool = True) -> Upload | None:
    """The upload behind a live share link (counting the use); None for unknown or revoked links."""
    link = (
        ShareLink.objects.filter(token_hash=token_hash(token), revoked_at__isnull=True)
        .select_related("upload", "upload__project", "upload__project__team")
        .first()
    )
    if link is None:
        return None
    if count_use:
        _count_share_use(link.pk)
    return link.upload


# The read paths' bookkeeping (share-link use count, token last use) is a single UPDATE by primary
# key: atomic with F(), no row read or lock first, and in WAL mode it blocks no reader. It is
# best effort: a write that cannot get the lock in time is logged and skipped, never a failed page.
USAGE_WRITE_INTERVAL = timedelta(minutes=1)


def _count_share_use(link_id: int) -> None:
    try:
        ShareLink.objects.filter(pk=link_id).update(use_count=F("use_count") + 1, last_used_at=timezone.now())
    except OperationalError as exc:
        log.warning("share link %s: use not counted: %s", link_id, exc)


def report_for(upload: Upload) -> Report | None:
    if upload.status != Upload.Status.DONE:
        return None
    return Report.objects.filter(upload=upload).first()


def report_charts(upload: Upload) -> dict[str, Any]:
    """The stored charts of a finished upload, without decoding its report (megabytes on a large trace)."""
    charts = Report.objects.filter(upload=upload).values_list("charts", flat=True).first()
    return charts if isinstance(charts, dict) else {}


# --- teams and projects ------------------------------------------------------------------


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


# What each role may do, in one place. Viewers read; members also upload and share; admins and
# owners also manage the team (members, roles, projects).
ROLE_RIGHTS: dict[str, frozenset[str]] = {
    Membership.Role.VIEWER: frozenset({"read"}),
    Membership.Role.MEMBER: frozenset({"read", "write"}),
    Membership.Role.ADMIN: frozenset({"read", "write", "manage"}),
    Membership.Role.OWNER: frozenset({"read", "write", "manage"}),
}
INVITABLE_ROLES = (Membership.Role.VIEWER, Membership.Role.MEMBER, Membership.Role.ADMIN)


class TeamError(Exception):
    """A refused team change; ``code`` is stable (``team:<reason>``), ``message`` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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


def _free_slug(model: Any, wanted: str) -> str:
    from django.utils.text import slugify

    base = slugify(wanted)[:50] or "project"
    slug, n = base, 1
    while model.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


def team_create_for_user(user: User, name: str) -> Team:
    from webapp.snapshots.forms import clean_line

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
    from webapp.snapshots.forms import clean_line

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


# --- uploads ------------------------------------------------------------------------------


def blob_name_for(sha256: str) -> str:
    return f"sha256/{sha256[:2]}/{sha256}"


def _store_blob(uploaded: UploadedFile[Any], sha256: str) -> str:
    """Content-addressed storage: identical bytes are stored once.

    On a local disk the bytes are written under a temporary name beside the blob and renamed once
    whole, so a write that fails (a full disk) leaves no partial blob under the blob's name (issue
    36: 360 MB of them stayed); a blob reused by this upload has its time renewed, so the orphan
    sweep (``blobs_sweep_orphans``) never takes it between here and the row. Remote storage (S3)
    writes an object whole or not at all."""
    name = blob_name_for(sha256)
    try:
        final = Path(default_storage.path(name))
    except NotImplementedError:  # remote storage
        final = None
    if default_storage.exists(name):
        if final is not None:
            with contextlib.suppress(OSError):
                os.utime(final)
        return name
    uploaded.seek(0)
    if final is None:
        saved = default_storage.save(name, uploaded)
        if saved != name:  # a racing upload of the same bytes won; keep one copy
            default_storage.delete(saved)
        return name
    partial = f"{name}{PARTIAL_SUFFIX}{secrets.token_hex(6)}"
    try:
        saved = default_storage.save(partial, uploaded)
        os.replace(default_storage.path(saved), final)  # a racing upload of the same bytes wrote the same
    except BaseException:
        with contextlib.suppress(OSError):
            default_storage.delete(partial)
        raise
    return name


PARTIAL_SUFFIX = ".partial-"
# A blob no row names is removed once this old (the longest upload request, its archive's ranks
# included, is over by then: gunicorn's timeout is 300 s).
ORPHAN_GRACE_SECONDS = 3 * 3600


def blobs_drop_unnamed(names: list[str]) -> None:
    """Remove the blobs among ``names`` that no upload row names (an archive's ranks stored by a
    transaction that was rolled back)."""
    named = set(Upload.objects.filter(blob_name__in=names).values_list("blob_name", flat=True))
    for name in set(names) - named:
        with contextlib.suppress(OSError):
            default_storage.delete(name)


def blobs_sweep_orphans(older_than_seconds: float = ORPHAN_GRACE_SECONDS) -> list[str]:
    """Remove the files under ``sha256/`` that no upload row names (a write or a transaction that
    failed after the blob was stored, a partial write of a killed process) and the explore stores of
    bytes no row holds, once older than ``older_than_seconds``: never a blob a row names, nor one
    younger (an upload in flight stores its blob before its row). Through the storage API, so S3's
    bucket is swept as the local disk is. Returns the names removed."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    candidates: list[str] = []
    for prefix in _listdir("sha256")[0]:
        candidates += [f"sha256/{prefix}/{f}" for f in _listdir(f"sha256/{prefix}")[1]]
    named = set(Upload.objects.filter(blob_name__in=candidates).values_list("blob_name", flat=True))
    orphans = [(name, Q(blob_name=name)) for name in candidates if name not in named and _older(name, cutoff)]
    stores = {d for d in _listdir("explore")[0] if re.fullmatch(r"[0-9a-f]{64}", d)}
    held = set(Upload.objects.filter(sha256__in=stores).values_list("sha256", flat=True))
    for sha in sorted(stores - held):
        files = [f"explore/{sha}/{f}" for f in _listdir(f"explore/{sha}")[1]]
        if files and all(_older(f, cutoff) for f in files):
            orphans += [(f, Q(sha256=sha)) for f in files]
    removed = []
    for name, naming_row in orphans:
        if Upload.objects.filter(naming_row).exists():  # named since the listing
            continue
        with contextlib.suppress(OSError):
            default_storage.delete(name)
            removed.append(name)
    return removed


def _listdir(path: str) -> tuple[list[str], list[str]]:
    try:
        return default_storage.listdir(path)
    except (FileNotFoundError, NotImplementedError):
        return [], []


def _older(name: str, cutoff: datetime) -> bool:
    try:
        return default_storage.get_modified_time(name) < cutoff
    except (OSError, NotImplementedError):
        return False


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before, by the same user, for different bytes."""

    def __init__(self, upload: Upload) -> None:
        super().__init__(upload.code)
        self.upload = upload


def upload_by_idempotency_key(user: User | None, key: str) -> Upload | None:
    if not key or user is None:
        return None
    return Upload.objects.filter(uploaded_by=user, idempotency_key=key).select_related("project").first()


def upload_replay(existing: Upload, sha256: str) -> Upload:
    """The earlier upload of an Idempotency-Key, marked ``replayed``; ``IdempotencyConflict`` for other bytes."""
    return _replay(existing, sha256)


def _replay(existing: Upload, sha256: str) -> Upload:
    if existing.sha256 != sha256:
        raise IdempotencyConflict(existing)
    existing.replayed = True
    return existing


def upload_create(
    *,
    user: User | None,
    project: Project,
    uploaded: UploadedFile[Any],
    sha256: str,
    fmt: str,
    run: str = "",
    tags: list[str] | None = None,
    note: str = "",
    oom_message: str = "",
    idempotency_key: str = "",
    batch_size: int | None = None,
    cap_bytes: int | None = None,
    run_meta: dict[str, Any] | None = None,
    estimated_cost: int | None = None,
    follows: str = "",
    changed: list[str] | None = None,
) -> Upload:
    """Store the bytes, create the row and queue the analysis once the row is committed.

    With an ``idempotency_key``, a second call by the same user with the same key returns the
    first upload (``replayed`` set) instead of a duplicate, or ``IdempotencyConflict`` when the
    bytes differ. A failed publish leaves the row queued with ``queued_at`` empty (the sweep
    publishes it) and sets ``publish_pending`` on the returned object. ``run_meta`` (rank, world
    size, commit, ...: ``runs.RUN_META_KEYS``) puts the upload into its run (``runs.run_attach``);
    the rank of a run of several ranks is published with the others, as one chord.
    """
    existing = upload_by_idempotency_key(user, idempotency_key)
    if existing is not None:
        return _replay(existing, sha256)
    if estimated_cost is None:  # the intake estimated it already (intake.Admission.cost_bytes)
        from webapp.snapshots.cost import estimate_cost

        estimated_cost = estimate_cost(uploaded).cost_bytes
    blob = _store_blob(uploaded, sha256)
    try:
        with transaction.atomic():
            upload = Upload.objects.create(
                code=new_upload_code(),
                project=project,
                uploaded_by=user,
                filename=(uploaded.name or "snapshot")[:255],
                bytes=uploaded.size or 0,
                estimated_cost=estimated_cost,
                sha256=sha256,
                blob_name=blob,
                format=fmt,
                run=run[:200],
                tags=[t for t in (tags or []) if t][:20],
                note=note,
                oom_message=oom_message,
                batch_size=batch_size,
                cap_bytes=cap_bytes,
                idempotency_key=idempotency_key if user is not None else "",
                queued_at=timezone.now(),
            )
            several_ranks = int((run_meta or {}).get("world_size") or 1) > 1
            followups.link(upload, follows, changed or [], several_ranks=several_ranks)  # issue 33
            if not runs.run_attach(upload, run_meta or {}):
                transaction.on_commit(lambda: _publish(upload))
    except IntegrityError:
        # Two requests with one key raced; the other one's row is the upload.
        existing = upload_by_idempotency_key(user, idempotency_key)
        if existing is None:
            raise
        return _replay(existing, sha256)
    return upload


class ProjectRefused(Exception):
    """No project to upload to: none named and none implied, not one of the caller's, or read-only.
    The API answers it with the projects that would do (``api._project_refusal``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def upload_project(user: AnyUser, token: ApiToken | None, slug: str) -> Project:
    """The project an upload goes to, or ``ProjectRefused``: the one named (``slug``), else the
    token's default, else the only one the caller reaches (a token limited to one project: that
    one); it must be in the token's reach and the user must be allowed to write there."""
    project: Project | None
    if slug:
        project = project_for_user(user, slug)
    elif token is not None and token.default_project is not None:
        project = project_for_user(user, token.default_project.slug)
    else:
        reachable = visible_projects(user)
        if token is not None and token.project_id is not None:
            reachable = reachable.filter(pk=token.project_id)
        candidates = list(reachable[:2])
        if len(candidates) != 1:
            raise ProjectRefused(400, "upload:no-project", messages.UPLOAD_NO_PROJECT)
        project = candidates[0]
    if project is None or not token_allows(token, project):
        raise ProjectRefused(404, "upload:unknown-project", messages.UPLOAD_UNKNOWN_PROJECT.format(slug=slug))
    if not can(user, project.team, "write"):
        raise ProjectRefused(403, "upload:read-only", messages.UPLOAD_READ_ONLY)
    return project


def _check_run_open(project: Project, user: User, run_name: str) -> None:
    """A finished run's ranks are replaced by a team admin only (issue 36: a member or CI token
    re-uploaded a good file under the run's name, and the gate's answer flipped)."""
    if not run_name or can(user, project.team, "manage"):
        return
    if Run.objects.filter(project=project, name=run_name, status=Run.Status.DONE).exists():
        raise LimitExceeded(409, "run:finished", messages.RUN_FINISHED.format(name=run_name))


def upload_admit(admission: Admission, *, user: User, token: ApiToken | None) -> Upload | Run:
    """An upload that passed the intake (``intake.admit``), stored: the checks that need its
    project, then the row (or, for a tar or zip of a run's ranks, the run and its rows).

    In order, each once: the project (``upload_project``), the team's queued analysis cost
    (``quota.check_team_queued_cost``, with the intake's estimate), the team's storage quota (a
    run's archive: on the ranks it holds, in ``runarchive.read_ranks``), the stored bytes and row.
    ``ProjectRefused`` or ``LimitExceeded`` when one refuses; ``IdempotencyConflict`` for a key
    used before with other bytes.
    """
    project = upload_project(user, token, admission.project_slug)
    _check_run_open(project, user, str(admission.fields.get("run") or ""))
    quota.check_team_queued_cost(project.team_id, admission.cost_bytes)
    if admission.fields.get("follows") not in (None, "", followups.NONE):  # refused before the bytes are stored
        followups.incident_for(project, str(admission.fields["follows"]))
    if admission.fmt == runarchive.ARCHIVE:
        return runarchive.create_run(
            user=user,
            project=project,
            archive=admission.uploaded,
            archive_sha256=admission.sha256,
            fields=admission.fields,
            run_meta=admission.run_meta,
            idempotency_key=admission.idempotency_key,
            listing=admission.listing,
        )
    quota.check_team_quota(project.team_id, admission.uploaded.size or 0)
    return upload_create(
        user=user,
        project=project,
        uploaded=admission.uploaded,
        sha256=admission.sha256,
        fmt=admission.fmt,
        **admission.fields,
        idempotency_key=admission.idempotency_key,
        run_meta=admission.run_meta,
        estimated_cost=admission.cost_bytes,
    )


def reanalysis_admit(request: Any, upload: Upload, user: User) -> None:
    """The checks an upload passes, for a re-analysis of ``upload``'s stored bytes (issue 36: 25 of
    them in 1.9 s took a team to 2.9x its quota): the upload rates, the disk guard, the team's queued
    cost with this analysis's estimate, and its storage quota (the new row counts the file's bytes
    again, ``quota.team_usage_bytes``). ``LimitExceeded`` for the first that fails."""
    ratelimits.check_upload_rate(request, user, getattr(request, "api_token", None))
    disk.check_room(upload.bytes)
    quota.check_team_queued_cost(upload.project.team_id, upload.estimated_cost)
    quota.check_team_quota(upload.project.team_id, upload.bytes)


def upload_reanalyse(upload: Upload, user: User, *, oom_message: str) -> Upload:
    """A new upload of the same stored bytes with torch's OOM message (the report's real limit).

    The first one stays as it was (history keeps both, each with its limit's source); the file is
    stored once (content-addressed), so this costs a row and an analysis, no upload.
    """
    with transaction.atomic():
        again = Upload.objects.create(
            code=new_upload_code(),
            project=upload.project,
            uploaded_by=user,
            filename=upload.filename,
            bytes=upload.bytes,
            estimated_cost=upload.estimated_cost,
            sha256=upload.sha256,
            blob_name=upload.blob_name,
            format=upload.format,
            run=upload.run,
            tags=list(upload.tags or []),
            note=upload.note,
            oom_message=oom_message,
            batch_size=upload.batch_size,
            cap_bytes=upload.cap_bytes,
            queued_at=timezone.now(),
        )
        transaction.on_commit(lambda: _publish(again))
    return again


def _publish(upload: Upload) -> None:
    """Send the analysis message; on a broker outage mark the row for the sweep instead of failing."""
    from webapp.snapshots.tasks import analyse_upload_task

    try:
        analyse_upload_task.apply_async((upload.id,), retry_policy=settings.CELERY_TASK_PUBLISH_RETRY_POLICY)
    except Exception as exc:
        log.warning("upload %s: publish failed (%s); the sweep will publish it", upload.id, exc)
        upload.publish_pending = True
        Upload.objects.filter(pk=upload.pk, status=Upload.Status.QUEUED).update(queued_at=None)


def _release_key(upload_id: int, task_id: str) -> str:
    return f"oomscope:claim-released:{upload_id}:{task_id}"


def claim_release(upload_id: int, task_id: str) -> None:
    """Note that this run of the upload is over although its row could not say so (its final
    write failed): ``_runs_it_still`` then no longer protects the claim. Best effort, in the cache
    (Redis: every process sees it); without it the claim is protected for the task's time limit."""
    from django.core.cache import cache

    try:
        cache.set(_release_key(upload_id, task_id), 1, timeout=int(settings.CELERY_TASK_TIME_LIMIT) + 60)
    except Exception as exc:
        log.warning("upload %s: claim release not noted: %s", upload_id, exc)


def _released(upload_id: int, task_id: str) -> bool:
    from django.core.cache import cache

    try:
        return bool(cache.get(_release_key(upload_id, task_id)))
    except Exception:
        return False


def _runs_it_still(claimed_by: str, started_at: datetime | None, upload_id: int = 0, task_id: str = "") -> bool:
    """The claiming process provably lives and may still be on this upload.

    A pool process outlives its task and takes the next one, so a live claimant alone does not
    prove it: past the task's hard time limit (Celery kills the process there) it is surely
    done with this upload, whatever the row says (e.g. its final write failed); and a run that
    noted its release (``claim_release``: its final write failed) is over at once.
    """
    if liveness.alive(claimed_by) is not True:
        return False
    if upload_id and _released(upload_id, task_id):
        return False
    limit = timedelta(seconds=float(settings.CELERY_TASK_TIME_LIMIT))
    return started_at is not None and started_at > timezone.now() - limit


def upload_should_yield(upload_id: int) -> bool:
    """Whether this queued upload should let another team's go first.

    True when its team already runs ``ANALYSIS_TEAM_CONCURRENCY`` analyses and an upload of
    another team is queued (and published): a team's uploads then never hold every worker slot
    while another team waits. Alone in the queue, a team uses every slot.
    """
    team_id = (
        Upload.objects.filter(pk=upload_id, status=Upload.Status.QUEUED)
        .values_list("project__team_id", flat=True)
        .first()
    )
    if team_id is None:
        return False  # gone, done or running: the claim says so
    running = Upload.objects.filter(status=Upload.Status.RUNNING, project__team_id=team_id).count()
    if running < settings.ANALYSIS_TEAM_CONCURRENCY:
        return False
    waiting = Upload.objects.filter(status=Upload.Status.QUEUED, queued_at__isnull=False).exclude(
        project__team_id=team_id
    )
    if not waiting.exists():
        return False
    # Re-published now: the sweep's stale-queued clock starts again.
    Upload.objects.filter(pk=upload_id, status=Upload.Status.QUEUED).update(queued_at=timezone.now())
    return True


def upload_claim_for_another_team(upload_id: int, claimant: str = "") -> Upload | None:
    """Claim, for the slot that defers ``upload_id``, the queued upload that should go before it: of
    another team, the least busy first (fewest running analyses), then the oldest; None when none
    could be claimed (another slot took them). The deferral then costs the deferred team a place in
    the queue, not the waiting team a wait behind every message the busy team queued (issue 36: an
    archive's 1,000 ranks each slept 0.5 s before another team's upload was reached)."""
    team_id = Upload.objects.filter(pk=upload_id).values_list("project__team_id", flat=True).first()
    if team_id is None:
        return None
    running: dict[int, int] = {}
    for team in Upload.objects.filter(status=Upload.Status.RUNNING).values_list("project__team_id", flat=True):
        running[team] = running.get(team, 0) + 1
    waiting = list(
        Upload.objects.filter(status=Upload.Status.QUEUED, queued_at__isnull=False)
        .exclude(project__team_id=team_id)
        .order_by("created_at", "pk")
        .values_list("pk", "project__team_id")[:SCHEDULER_LOOKS_AT]
    )
    waiting.sort(key=lambda row: running.get(row[1], 0))  # stable: the oldest first within a load
    for other_id, _team in waiting:
        claimed = upload_claim(other_id, task_id=None, claimant=claimant)
        if claimed is not None:
            return claimed
    return None


# The queued uploads of other teams the scheduler compares (the oldest ones).
SCHEDULER_LOOKS_AT = 50


def upload_claim(upload_id: int, task_id: str | None = None, claimant: str = "") -> Upload | None:
    """QUEUED -> RUNNING with one conditional UPDATE; None when another worker owns the row.

    The attempt is counted and committed before any work, so a file that kills its
    worker is stopped after ``ANALYSIS_MAX_ATTEMPTS`` tries instead of looping.
    ``claimant`` is the claiming process (``liveness.identity()``), kept in ``claimed_by``.
    A RUNNING row is claimed again only by the message that claimed it (same ``task_id``),
    and only when the process that claimed it is not provably alive: that message comes back
    when its pool process died (``reject_on_worker_lost``), after the visibility timeout, or
    when kombu restored it on a broker connection loss while the first run still goes on (that
    run is left to finish; a second one would only repeat it).
    """
    now = timezone.now()
    claimable = Q(status=Upload.Status.QUEUED)
    if task_id:
        previous = (
            Upload.objects.filter(pk=upload_id, status=Upload.Status.RUNNING, task_id=task_id)
            .values_list("claimed_by", "started_at")
            .first()
        )
        if previous is not None:
            if _runs_it_still(*previous, upload_id=upload_id, task_id=task_id):
                log.warning(
                    "upload %s: message %s redelivered while its first run is alive; left to it", upload_id, task_id
                )
            else:
                claimable |= Q(status=Upload.Status.RUNNING, task_id=task_id, claimed_by=previous[0])
    with transaction.atomic():
        claimed = Upload.objects.filter(claimable, pk=upload_id).update(
            task_id=task_id or "",
            claimed_by=claimant[:200],
            status=Upload.Status.RUNNING,
            attempts=F("attempts") + 1,
            started_at=now,
            heartbeat_at=now,
            stage="reading",
            progress=0,
        )
    if claimed != 1:
        return None
    return Upload.objects.select_related("project").get(pk=upload_id)


def upload_set_progress(upload_id: int, stage: str | None, progress: int | None) -> None:
    """Record the stage reached (and the heartbeat the sweep watches)."""
    fields: dict[str, Any] = {"heartbeat_at": timezone.now()}
    if stage:
        fields["stage"] = stage[:20]
    if progress is not None:
        fields["progress"] = max(0, min(100, int(progress)))
    Upload.objects.filter(pk=upload_id, status=Upload.Status.RUNNING).update(**fields)


def report_data(report: Report) -> dict[str, Any]:
    """A stored report's JSON in the current shape (``analysis.stored.upgrade``: one stored by an
    older worker gets the keys it lacks), as the API serves it."""
    return upgrade(report.data)


def summary_from_report(report: dict[str, Any]) -> dict[str, Any]:
    """The few figures kept on the row for lists, history and the API (``analysis.readout.row_summary``), of
    ``report`` in the current shape and read once, typed (``analysis.stored.load``; upgraded in place)."""
    return readout.row_summary(load(report))


# The finish step writes megabytes of report JSON once per upload; losing the analysis to a
# transient lock (SQLite's "database is locked", PostgreSQL's deadlock/serialization or a
# dropped connection, all OperationalError) would throw minutes of work away. Bounded: 5 tries over about 15 s, then the
# error propagates (worker:internal). The transaction is whole or absent, so retrying is safe.
db_write_retry = retry(
    retry=retry_if_exception_type(OperationalError),
    stop=stop_after_attempt(5),
    wait=wait_random_exponential(multiplier=0.5, max=8),
    reraise=True,
    before_sleep=lambda state: log.warning(
        "database write retried (attempt %d): %s",
        state.attempt_number,
        state.outcome.exception() if state.outcome else "",
    ),
)


@db_write_retry
def upload_finish(upload_id: int, *, report: dict[str, Any], charts: dict[str, Any], stored_bytes: int = 0) -> bool:
    """Store the outcome; False when the upload was deleted during its analysis (nothing stored).

    ``stored_bytes``: what the analysis added to the disk (report, charts, explore stores), which
    the team's quota counts from now on.
    """
    with transaction.atomic():
        # Locked (PostgreSQL) / under the IMMEDIATE write lock (SQLite), so a DELETE cannot slip
        # in between: an upload deleted while it was analysed keeps no orphan report.
        if not Upload.objects.select_for_update().filter(pk=upload_id).exists():
            log.info("upload %s: deleted during its analysis; report dropped", upload_id)
            return False
        Report.objects.update_or_create(upload_id=upload_id, defaults={"data": report, "charts": charts})
        source = report.get("source") or {}
        Upload.objects.filter(pk=upload_id).update(
            status=Upload.Status.DONE,
            stage="done",
            progress=100,
            summary=summary_from_report(report),
            format=str(source.get("format") or "")[:20] or F("format"),
            error_code="",
            error_message="",
            finished_at=timezone.now(),
            stored_bytes=max(0, int(stored_bytes)),
        )
    runs.upload_settled(upload_id)
    followups.settle(upload_id)
    return True


@db_write_retry
def uploads_without_stores(codes: list[str] | None = None) -> list[int]:
    """Done uploads whose bytes have no explore store (analysed before stores existed, or their
    stores not kept): one upload per distinct file, oldest first; ``codes`` narrows to those."""
    from webapp.snapshots.digging import has_stores

    rows = Upload.objects.filter(status=Upload.Status.DONE).exclude(blob_name="").order_by("id")
    if codes is not None:
        rows = rows.filter(code__in=codes)
    seen: set[str] = set()
    out: list[int] = []
    for upload_id, sha256 in rows.values_list("id", "sha256"):
        if sha256 in seen:
            continue
        seen.add(sha256)
        if not has_stores(sha256):
            out.append(upload_id)
    return out


def upload_for_stores(upload_id: int) -> Upload | None:
    """The done upload ``upload_id`` while its bytes have no explore store yet, else None."""
    from webapp.snapshots.digging import has_stores

    upload = (
        Upload.objects.filter(pk=upload_id, status=Upload.Status.DONE)
        .exclude(blob_name="")
        .select_related("project")
        .first()
    )
    if upload is None or has_stores(upload.sha256):
        return None
    return upload


def upload_add_stored_bytes(upload_id: int, size: int) -> None:
    """Count ``size`` more bytes kept for the upload (its explore stores, made after its analysis)."""
    if size > 0:
        Upload.objects.filter(pk=upload_id).update(stored_bytes=F("stored_bytes") + int(size))


def upload_fail(upload_id: int, code: str, detail: str = "") -> None:
    Upload.objects.filter(pk=upload_id).exclude(status=Upload.Status.DONE).update(
        status=Upload.Status.FAILED,
        stage="failed",
        error_code=code[:80],
        error_message=messages.error_message(code, detail),
        finished_at=timezone.now(),
    )
    runs.upload_settled(upload_id)


def uploads_requeue_stale(exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """Uploads to publish again: stale RUNNING rows go back to QUEUED; old QUEUED rows are re-sent.

    Covers a worker killed mid-analysis (its heartbeat stops), a message lost between
    commit and publish, and a broker that lost its queue. Rows past the attempt limit are
    failed here instead of looping. A RUNNING row whose claiming process provably still runs
    (``liveness``), within the task's hard time limit, is left to it however old its heartbeat;
    ``exclude``: uploads whose result is parked (``tasks.store_parked_results``), not to run again.
    """
    now = timezone.now()
    stale_running = now - timedelta(seconds=settings.SWEEP_STALE_RUNNING_SECONDS)
    stale_queued = now - timedelta(seconds=settings.SWEEP_STALE_QUEUED_SECONDS)
    ids: list[int] = []
    for upload in (
        Upload.objects.filter(
            Q(status=Upload.Status.RUNNING, heartbeat_at__lt=stale_running)
            | Q(status=Upload.Status.QUEUED, queued_at__lt=stale_queued)
            # publish failed at upload time (broker down): send it at the next sweep
            | Q(status=Upload.Status.QUEUED, queued_at__isnull=True)
        )
        .exclude(pk__in=list(exclude))
        .only("id", "status", "attempts", "claimed_by", "started_at", "task_id")
    ):
        if upload.status == Upload.Status.RUNNING and _runs_it_still(
            upload.claimed_by, upload.started_at, upload.id, upload.task_id
        ):
            continue  # a quiet heartbeat, but its process runs it: never run it twice
        if upload.status == Upload.Status.RUNNING and upload.attempts >= settings.ANALYSIS_MAX_ATTEMPTS:
            upload_fail(upload.id, "worker:killed-repeatedly")
            continue
        moved = Upload.objects.filter(pk=upload.pk, status=upload.status).update(
            status=Upload.Status.QUEUED, queued_at=now, stage="", progress=0
        )
        if moved == 1:
            ids.append(upload.id)
    return ids


def uploads_requeue_dead_claims() -> list[int]:
    """RUNNING uploads whose claiming process is provably gone: back to QUEUED now, to publish.

    Run when a worker starts (``worker_ready``): after its main process was killed, the upload it
    was analysing would otherwise wait for the sweep's stale heartbeat. Only claims judged dead
    by ``liveness.alive`` (this machine, this pid namespace) are taken; a live one, or one made
    elsewhere, is left alone. The next claim counts as an attempt; at the limit the row fails.
    """
    now = timezone.now()
    ids: list[int] = []
    running = Upload.objects.filter(status=Upload.Status.RUNNING).exclude(claimed_by="")
    for upload in running.only("id", "attempts", "claimed_by"):
        if liveness.alive(upload.claimed_by) is not False:
            continue
        if upload.attempts >= settings.ANALYSIS_MAX_ATTEMPTS:
            upload_fail(upload.id, "worker:killed-repeatedly")
            continue
        moved = Upload.objects.filter(pk=upload.pk, status=Upload.Status.RUNNING, claimed_by=upload.claimed_by).update(
            status=Upload.Status.QUEUED, queued_at=now, stage="", progress=0
        )
        if moved == 1:
            ids.append(upload.id)
    return ids


def upload_delete_blob_if_unused(upload: Upload) -> bool:
    """Remove the stored file unless another upload row still holds the same bytes."""
    if not upload.blob_name:
        return False
    if Upload.objects.filter(blob_name=upload.blob_name).exclude(pk=upload.pk).exists():
        return False
    default_storage.delete(upload.blob_name)
    if upload.sha256 and not Upload.objects.filter(sha256=upload.sha256).exclude(pk=upload.pk).exists():
        _delete_explore_stores(upload.sha256)
    return True


def explore_stores_drop_if_unused(sha256: str) -> None:
    """The explore stores of these bytes, unless an upload row still holds them (a delete that came
    while the worker was writing them: the row's receiver found nothing to remove then)."""
    if not Upload.objects.filter(sha256=sha256).exists():
        _delete_explore_stores(sha256)


def _delete_explore_stores(sha256: str) -> None:
    """The worker's explore stores of these bytes (``explore/<sha256>/<device>.npz``)."""
    folder = f"explore/{sha256}"
    try:
        _dirs, files = default_storage.listdir(folder)
    except (FileNotFoundError, NotImplementedError):
        return
    for name in files:
        default_storage.delete(f"{folder}/{name}")


def upload_can_delete(user: AnyUser, upload: Upload) -> bool:
    """The uploader while their role may still write, or anyone who manages the team (ROLE_RIGHTS).

    A viewer who uploaded something before being made a viewer may no longer delete it.
    """
    team = upload.project.team
    if can(user, team, "manage"):
        return True
    return upload.uploaded_by_id == user.pk and can(user, team, "write")


def upload_delete(upload: Upload) -> None:
    """Delete the upload, its report and share links (cascade) and, after commit, its file.

    The file goes through the ``post_delete`` receiver in ``models.py``, so the admin and a
    project's cascade remove files the same way.
    """
    upload.delete()


def uploads_purge_failed() -> int:
    """Remove the files of uploads that failed more than ``FAILED_UPLOAD_RETENTION_SECONDS`` ago.

    The rows stay (history shows the failure and its reason); ``blob_name`` becomes empty so
    the quota no longer counts them. Returns the number of rows whose file was let go.
    """
    cutoff = timezone.now() - timedelta(seconds=settings.FAILED_UPLOAD_RETENTION_SECONDS)
    purged = 0
    for upload in Upload.objects.filter(status=Upload.Status.FAILED, finished_at__lt=cutoff).exclude(blob_name=""):
        with transaction.atomic():
            if Upload.objects.filter(pk=upload.pk, blob_name=upload.blob_name).update(blob_name="") != 1:
                continue
            holder = Upload(pk=upload.pk, blob_name=upload.blob_name)
            transaction.on_commit(lambda holder=holder: upload_delete_blob_if_unused(holder))  # type: ignore[misc]
        purged += 1
    return purged


# --- share links --------------------------------------------------------------------------

SHARE_TOKEN_SALT = "oomscope.share-link"  # noqa: S105 - an HMAC salt name, not a secret


def share_token(nonce: str) -> str:
    """A link's token: HMAC(SECRET_KEY, nonce), URL-safe. Stored nowhere; recomputed to show the URL."""
    import base64

    from django.utils.crypto import salted_hmac

    digest = salted_hmac(SHARE_TOKEN_SALT, nonce, algorithm="sha256").digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@transaction.atomic
def share_create(upload: Upload, user: User | None, name: str = "") -> str:
    """A new read-only link (the upload's other links stay live); returns the token."""
    nonce = secrets.token_urlsafe(24)
    token = share_token(nonce)
    ShareLink.objects.create(
        upload=upload,
        token_hash=token_hash(token),
        prefix=token[:6],
        key=secrets.token_urlsafe(9)[:12],
        name=(name or "").strip()[:100],
        nonce=nonce,
        created_by=user,
    )
    return token


def share_revoke(upload: Upload, key: str | None = None) -> int:
    """Revoke one live link (by ``key``) or, without a key, every live link of the upload."""
    links = ShareLink.objects.filter(upload=upload, revoked_at__isnull=True)
    if key is not None:
        links = links.filter(key=key)
    return links.update(revoked_at=timezone.now())


def share_active(upload: Upload) -> ShareLink | None:
    """The newest live link, if any."""
    return ShareLink.objects.filter(upload=upload, revoked_at__isnull=True).order_by("-created_at", "-id").first()


def share_link_url(request: HttpRequest | None, link: ShareLink) -> str | None:
    """The link's URL, recomputed from its nonce; None for a link made before nonces existed."""
    if not link.nonce:
        return None
    path = reverse("snapshots:share_view", args=[share_token(link.nonce)])
    return request.build_absolute_uri(path) if request is not None else path


def share_links(upload: Upload, request: HttpRequest | None, *, revoked: bool = True) -> list[dict[str, Any]]:
    """The upload's links, newest first: what the page lists and ``GET .../share`` returns."""
    links = ShareLink.objects.filter(upload=upload).select_related("created_by").order_by("-created_at", "-id")
    if not revoked:
        links = links.filter(revoked_at__isnull=True)
    return [
        {
            "key": link.key,
            "name": link.name,
            "url": share_link_url(request, link) if link.revoked_at is None else None,
            "active": link.revoked_at is None,
            "created_at": link.created_at.isoformat(),
            "created_by": link.created_by.get_username() if link.created_by else None,
            "use_count": link.use_count,
            "last_used_at": link.last_used_at.isoformat() if link.last_used_at else None,
            "revoked_at": link.revoked_at.isoformat() if link.revoked_at else None,
        }
        for link in links
    ]


def share_url_of(upload: Upload, request: HttpRequest | None) -> str | None:
    """The newest live link's URL that can be shown (None when nothing is shared)."""
    for link in ShareLink.objects.filter(upload=upload, revoked_at__isnull=True).order_by("-created_at", "-id"):
        url = share_link_url(request, link)
        if url:
            return url
    return None


# --- API tokens ---------------------------------------------------------------------------


def api_token_create(
    user: User,
    default_project: Project | None = None,
    *,
    project: Project | None = None,
    name: str = "",
    expires_at: datetime | None = None,
    scope: str = "full",
) -> str:
    """A new token for ``user`` (shown once: only its hash is kept). With ``project`` it reaches
    that project only, and uploads go there by default; with ``expires_at`` it stops working then;
    ``scope`` "gate": it only reads (a CI job asking the regression gate)."""
    if scope not in ("full", "gate"):
        raise ValueError(f"token scope {scope!r}: full or gate")
    token = API_TOKEN_PREFIX + secrets.token_urlsafe(32)
    ApiToken.objects.create(
        user=user,
        token_hash=token_hash(token),
        prefix=token[:10],
        default_project=project or default_project,
        project=project,
        name=name.strip()[:100],
        expires_at=expires_at,
        scope=scope,
    )
    return token


def api_token_user(raw: str) -> tuple[User, ApiToken] | None:
    """The live token's user: None for an unknown, revoked or expired token or an inactive user."""
    token = (
        ApiToken.objects.filter(token_hash=token_hash(raw), revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))
        .select_related("user", "default_project", "project")
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    # At most one write a minute per token: every API call would otherwise write the database.
    if token.last_used_at is None or now - token.last_used_at > USAGE_WRITE_INTERVAL:
        try:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        except OperationalError as exc:
            log.warning("api token %s: last use not recorded: %s", token.prefix, exc)
    return token.user, token


def token_allows(token: ApiToken | None, project: Project | None) -> bool:
    """Whether a request's token may reach ``project`` (a token without a project reaches all its user's)."""
    if project is None:
        return False
    return token is None or token.project_id is None or token.project_id == project.pk


def api_tokens_of(user: User) -> list[dict[str, Any]]:
    rows = ApiToken.objects.filter(user=user).select_related("project").order_by("-created_at", "-id")
    return [
        {
            "prefix": t.prefix,
            "name": t.name,
            "project": t.project.slug if t.project else None,
            "scope": t.scope,
            "created_at": t.created_at.isoformat(),
            "last_used_at": t.last_used_at.isoformat() if t.last_used_at else None,
            "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
            "active": t.revoked_at is None,
        }
        for t in rows
    ]


def api_token_revoke(user: User, prefix: str) -> int:
    return ApiToken.objects.filter(user=user, prefix=prefix, revoked_at__isnull=True).update(revoked_at=timezone.now())


# --- plain dicts for templates and the API ------------------------------------------------


def upload_dict(upload: Upload, request: HttpRequest | None = None) -> dict[str, Any]:
    url = reverse("snapshots:detail", args=[upload.code])
    return {
        "code": upload.code,
        "filename": upload.filename,
        "bytes": upload.bytes,
        "project": upload.project.name,
        "project_slug": upload.project.slug,
        "run": upload.run,
        "tags": list(upload.tags or []),
        "note": upload.note,
        "status": upload.status,
        "progress": upload.progress,
        "stage": upload.stage,
        "error": {"code": upload.error_code, "message": upload.error_message} if upload.error_code else None,
        "created_at": upload.created_at.isoformat(),
        "summary": upload.summary,
        "url": request.build_absolute_uri(url) if request is not None else url,
        # The run it belongs to (issue 19): its page, and whether it regressed against the baseline.
        "run_url": reverse("snapshots:run", args=[upload.run_ref.code])
        if upload.run_ref_id and upload.run_ref
        else None,
        "run_regressed": bool(
            upload.run_ref_id and upload.run_ref and (upload.run_ref.regression or {}).get("regressed")
        ),
        # Follow-ups (issue 33): the incident this upload follows, and the outcome of the comparison.
        "follows_code": upload.follows.code if upload.follows_id and upload.follows else None,
        "followup_outcome": (upload.followup or {}).get("outcome"),
    }


def project_dict(project: Project) -> dict[str, Any]:
    return {"slug": project.slug, "name": project.name, "team": project.team.name}


def share_url(request: HttpRequest, token: str) -> str:
    return request.build_absolute_uri(reverse("snapshots:share_view", args=[token]))


def markdown_snippet(upload: Upload, link: str | None) -> str:
    """One Markdown line to paste in an issue: the headline figures and the link."""
    s = upload.summary or {}
    parts = [f"**{upload.filename}**"]
    if upload.run:
        parts.append(f"run `{upload.run}`")
    if "peak_reserved_bytes" in s:
        parts.append(f"peak reserved {readout.size(int(s['peak_reserved_bytes']))}")
    if "peak_allocated_bytes" in s:
        parts.append(f"peak allocated {readout.size(int(s['peak_allocated_bytes']))}")
    if s.get("oom"):
        limit = f", limit {s['limit_text']} ({s['limit_source_short']})" if s.get("limit_text") else ""
        parts.append(f"OOM ({s.get('verdict') or 'unknown'}{limit})")
    line = " · ".join(parts)
    return f"{line} — [memory report]({link})" if link else line


def shared_upload_ids(uploads: list[Upload]) -> set[int]:
    """Ids among ``uploads`` with a live share link, in one query (for lists)."""
    return set(
        ShareLink.objects.filter(upload__in=uploads, revoked_at__isnull=True).values_list("upload_id", flat=True)
    )


def upload_api_dict(upload: Upload, request: HttpRequest, *, shared: bool | None = None) -> dict[str, Any]:
    if shared is None:
        shared = share_active(upload) is not None
    return {
        "id": upload.code,
        "status": upload.status,
        "progress": upload.progress,
        "stage": upload.stage,
        "error": {"code": upload.error_code, "message": upload.error_message} if upload.error_code else None,
        "url": request.build_absolute_uri(reverse("snapshots:detail", args=[upload.code])),
        "api_url": request.build_absolute_uri(reverse("api:snapshot", args=[upload.code])),
        # The newest live link (its URL is recomputed from its nonce); GET .../share lists them all.
        "share_url": share_url_of(upload, request) if shared else None,
        "shared": shared,
        "project": upload.project.slug,
        "run": upload.run,
        "tags": list(upload.tags or []),
        "filename": upload.filename,
        "bytes": upload.bytes,
        "sha256": upload.sha256,
        "created_at": upload.created_at.isoformat(),
        "summary": upload.summary,
        # Only a follow-up enters followups again: a plain upload's walk enters each module once.
        "follows": followups.follows_dict(upload, request) if upload.follows_id else None,
    }
