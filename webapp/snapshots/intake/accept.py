"""The checks of an upload that need its project, then the stored row (``upload_admit``, after
``intake.admit``: docs/architecture.md, "The upload's walk"); the same checks for a re-analysis of
stored bytes (``reanalysis_admit``, ``upload_reanalyse``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from webapp.snapshots import messages
from webapp.snapshots.errors import LimitExceeded, ProjectRefused
from webapp.snapshots.intake import disk, quota, ratelimits, runarchive
from webapp.snapshots.intake.store import new_upload_code, publish_analysis, upload_create
from webapp.snapshots.models import ApiToken, Project, Run, Upload
from webapp.snapshots.runs import followups
from webapp.snapshots.teams.access import can, project_for_user, token_allows, visible_projects

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

    from webapp.snapshots.intake.intake import Admission

    AnyUser = User | AnonymousUser


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
        transaction.on_commit(lambda: publish_analysis(again))
    return again
