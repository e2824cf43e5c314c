"""The API's uploads (contract.md §3): send a snapshot, read its row and report, share it, say what
it follows. Authentication, refusals and methods as every route (``auth.py``, ``methods.py``).

An upload's walk (docs/architecture.md, "The upload's walk"): the view hands off to the intake once
(every check that needs no project) and to the service once (the project, the quota, the row).
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router

from webapp.snapshots import messages
from webapp.snapshots.api import schemas as s
from webapp.snapshots.api.auth import error, not_found
from webapp.snapshots.api.methods import refuse_other_methods
from webapp.snapshots.api.openapi import form_body, responses
from webapp.snapshots.errors import FieldsInvalid, IdempotencyConflict, LimitExceeded, ProjectRefused
from webapp.snapshots.intake import accept, blobs, intake, store
from webapp.snapshots.intake.forms import ApiUploadFieldsForm, first_error
from webapp.snapshots.models import Run, Upload
from webapp.snapshots.pages import firstanswer, payloads
from webapp.snapshots.runs import followups, runs
from webapp.snapshots.teams import access, shares

router = Router(tags=["uploads"])


def _uploadable_slugs(request: HttpRequest) -> list[str]:
    """The slugs of the projects this caller may upload to: the user's member-or-above projects,
    narrowed to the token's one project when the token is limited to one."""
    token = getattr(request, "api_token", None)
    rows = access.writable_projects(request.user).order_by("slug")
    return [p.slug for p in rows if access.token_allows(token, p)]


def _project_refusal(request: HttpRequest, status: int, code: str, message: str) -> JsonResponse:
    """A refusal about which project to upload to, answered with the projects that would do: a
    ``choices`` list in the body and the same slugs in the sentence, so a person or a client can retry."""
    slugs = _uploadable_slugs(request)
    return error(status, code, f"{message} {messages.upload_choices(slugs)}", choices=slugs)


def upload_or_none(request: HttpRequest, code: str) -> Upload | None:
    upload = access.upload_for_user(request.user, code)
    # A token limited to one project reaches nothing else.
    if upload is not None and not access.token_allows(getattr(request, "api_token", None), upload.project):
        return None
    return upload


def _accepted(request: HttpRequest, upload: Upload) -> JsonResponse:
    """202 for a new upload, 200 for a replay; the body says what the row holds."""
    body = payloads.upload_api_dict(upload, request)
    answer = {k: body[k] for k in ("id", "status", "url", "api_url")} | {"progress": upload.progress}
    headers = {"Location": body["api_url"]}
    if upload.publish_pending:
        answer["publish"] = "pending"
        answer["note"] = messages.PUBLISH_PENDING.format(seconds=int(settings.SWEEP_INTERVAL_SECONDS))
    if upload.replayed:
        headers["Idempotent-Replayed"] = "true"
    return JsonResponse(answer, status=200 if upload.replayed else 202, headers=headers)


UPLOAD_HEADERS = {
    "Location": "the new upload's (or run's) API URL",
    "Idempotent-Replayed": "true when this answers an Idempotency-Key already used",
}


@router.post(
    "/snapshots",
    url_name="snapshots",
    summary="Upload a snapshot (or a run's ranks in one tar or zip)",
    by_alias=True,
    response=responses(
        {202: s.UploadAccepted | s.RunAccepted, 200: s.UploadAccepted},
        400,
        403,
        404,
        409,
        411,
        413,
        422,
        429,
        507,
    ),
    openapi_extra=form_body(s.UploadForm, multipart=True, headers={202: UPLOAD_HEADERS, 200: UPLOAD_HEADERS}),
)
def snapshots(request: HttpRequest) -> HttpResponse:
    """One upload: the intake's checks (``intake.admit``), then the service stores it
    (``accept.upload_admit``). Header ``Idempotency-Key``: the same key again answers 200, the same id."""
    try:
        admission = intake.admit(request, ApiUploadFieldsForm, keyed=True)
        if admission.earlier is not None:
            return _replayed(request, admission)
        made = accept.upload_admit(admission, user=request.user, token=getattr(request, "api_token", None))  # type: ignore[arg-type]
    except FieldsInvalid as invalid:
        field, detail = first_error(invalid.form)
        if field == "oom_message":
            return error(400, "upload:invalid-oom-message", detail)
        return error(400, "upload:invalid", messages.UPLOAD_INVALID_FIELD.format(field=field, detail=detail))
    except ProjectRefused as refused:
        return _project_refusal(request, refused.status, refused.code, refused.message)
    except IdempotencyConflict as conflict:
        message = messages.IDEMPOTENCY_CONFLICT.format(code=conflict.upload.code)
        return error(409, "upload:idempotency-conflict", message)
    if isinstance(made, Run):  # a run's ranks in one tar or zip: one upload per rank, one run
        body = {"run": runs.run_dict(made, request)}
        return JsonResponse(body, status=202, headers={"Location": body["run"]["api_url"]})
    return _accepted(request, made)


refuse_other_methods(router, "/snapshots", ("POST",))


def _replayed(request: HttpRequest, admission: intake.Admission) -> HttpResponse:
    """A retry under an Idempotency-Key already used: the earlier upload, or 409 for other bytes.

    Counted by its own rate (not the upload rates, so a client retrying after a timeout gets its
    answer); its text fields are not validated or parsed again (the earlier upload's stand).
    """
    assert admission.earlier is not None
    if upload_or_none(request, admission.earlier.code) is None:  # its project is out of this caller's reach now
        return error(409, "upload:idempotency-conflict", messages.IDEMPOTENCY_CONFLICT.format(code="-"))
    try:
        upload = store.upload_replay(admission.earlier, admission.sha256)
    except IdempotencyConflict as conflict:
        message = messages.IDEMPOTENCY_CONFLICT.format(code=conflict.upload.code)
        return error(409, "upload:idempotency-conflict", message)
    return _accepted(request, upload)


@router.get(
    "/snapshots/{code}",
    url_name="snapshot",
    summary="An upload's status and summary",
    by_alias=True,
    response=responses({200: s.Upload}),
)
def snapshot(request: HttpRequest, code: str) -> HttpResponse:
    """One upload's row: its status while it is analysed, then its summary."""
    upload = upload_or_none(request, code)
    if upload is None:
        return not_found()
    # ``parts``: which of the outcome's parts are ready (the report before the charts: issue 34).
    return JsonResponse(payloads.upload_api_dict(upload, request) | firstanswer.parts(upload))


@router.delete("/snapshots/{code}", summary="Delete an upload", by_alias=True, response=responses({200: s.Deleted}))
def snapshot_delete(request: HttpRequest, code: str) -> HttpResponse:
    """The row, its report, share links and file go (the uploader or a team admin; else 403 forbidden)."""
    upload = upload_or_none(request, code)
    if upload is None:
        return not_found()
    if not access.upload_can_delete(request.user, upload):
        return error(403, "forbidden", messages.DELETE_FORBIDDEN)
    blobs.upload_delete(upload)
    return JsonResponse({"id": code, "deleted": True})


refuse_other_methods(router, "/snapshots/{code}", ("GET", "DELETE"))


@router.get(
    "/snapshots/{code}/report",
    url_name="snapshot_report",
    summary="An upload's report JSON",
    by_alias=True,
    response=responses({200: s.Report}),
)
def snapshot_report(request: HttpRequest, code: str) -> HttpResponse:
    """The report JSON (contract.md §2); 404 ``report-not-ready`` until it is stored (issue 34: the final
    report is stored before the charts and digging data, which change none of it; ``firstanswer.py``)."""
    upload = upload_or_none(request, code)
    if upload is None:
        return not_found()
    report = firstanswer.report_for(upload)
    if report is None:
        return error(404, "report-not-ready", messages.REPORT_NOT_READY.format(status=upload.status))
    return JsonResponse(payloads.report_data(report))


refuse_other_methods(router, "/snapshots/{code}/report", ("GET",))


def _shareable(request: HttpRequest, code: str) -> Upload | JsonResponse:
    """The upload, if the caller may hand out access to it: links are for members and above."""
    upload = upload_or_none(request, code)
    if upload is None:
        return not_found()
    if not access.can(request.user, upload.project.team, "write"):
        return error(403, "share:read-only", messages.SHARE_READ_ONLY)
    return upload


@router.get(
    "/snapshots/{code}/share",
    url_name="snapshot_share",
    summary="An upload's share links",
    by_alias=True,
    response=responses({200: s.ShareList}),
)
def share_list(request: HttpRequest, code: str) -> HttpResponse:
    """The upload's share links, newest first."""
    upload = _shareable(request, code)
    if isinstance(upload, JsonResponse):
        return upload
    links = shares.share_links(upload, request)
    return JsonResponse({"share_url": shares.share_url_of(upload, request), "links": links})


@router.post(
    "/snapshots/{code}/share",
    summary="Make a share link",
    by_alias=True,
    response=responses({201: s.ShareMade}),
    openapi_extra=form_body(s.ShareForm),
)
def share_create(request: HttpRequest, code: str) -> HttpResponse:
    """A new link (optional field ``name``); the upload's other links stay live."""
    upload = _shareable(request, code)
    if isinstance(upload, JsonResponse):
        return upload
    token = shares.share_create(upload, request.user, request.POST.get("name") or "")  # type: ignore[arg-type]
    link = shares.share_url(request, token)
    made = next(item for item in shares.share_links(upload, request) if item["url"] == link)
    return JsonResponse(
        {"share_url": link, "markdown": shares.markdown_snippet(upload, link), "link": made},
        status=201,
    )


@router.delete(
    "/snapshots/{code}/share", summary="Revoke share links", by_alias=True, response=responses({200: s.ShareRevoked})
)
def share_revoke(request: HttpRequest, code: str, key: str = "") -> HttpResponse:
    """Revoke every live link, or with ``?key=`` that one (404 ``share:unknown-link`` if it is not live)."""
    upload = _shareable(request, code)
    if isinstance(upload, JsonResponse):
        return upload
    revoked = shares.share_revoke(upload, key or None)
    if key and revoked == 0:
        return error(404, "share:unknown-link", messages.SHARE_UNKNOWN)
    return JsonResponse({"share_url": shares.share_url_of(upload, request), "revoked": revoked})


refuse_other_methods(router, "/snapshots/{code}/share", ("GET", "POST", "DELETE"))


def _follows_answer(request: HttpRequest, upload: Upload) -> JsonResponse:
    return JsonResponse(
        {
            "id": upload.code,
            "follows": followups.follows_dict(upload, request),
            "followed_by": followups.followed_by(upload),
        }
    )


@router.get(
    "/snapshots/{code}/follows",
    url_name="snapshot_follows",
    summary="What an upload follows, and what follows it",
    by_alias=True,
    response=responses({200: s.FollowsAnswer}),
)
def follows_read(request: HttpRequest, code: str) -> HttpResponse:
    """Follow-ups (issue 33): the incident this upload follows and those that follow it."""
    upload = upload_or_none(request, code)
    if upload is None:
        return not_found()
    return _follows_answer(request, upload)


@router.post(
    "/snapshots/{code}/follows",
    summary="Say what an upload follows and what changed",
    by_alias=True,
    response=responses({200: s.FollowsAnswer}, 400),
    openapi_extra=form_body(s.FollowsForm),
)
def follows_declare(request: HttpRequest, code: str) -> HttpResponse:
    """``follows`` (a code, or ``none``) and/or ``changed`` (change ids): the user's answer, scored
    again (the uploader or a team admin)."""
    upload = upload_or_none(request, code)
    if upload is None:
        return not_found()
    if not access.upload_can_delete(request.user, upload):
        return error(403, "forbidden", messages.FOLLOWS_FORBIDDEN)
    follows = request.POST.get("follows")
    changed = request.POST.getlist("changed") if "changed" in request.POST else None
    try:
        upload = followups.declare(
            upload,
            follows.strip() if follows is not None else None,
            followups.parse_changes(changed) if changed is not None else None,
        )
    except LimitExceeded as err:
        return error(err.status, err.code, err.message, choices=list(followups.DECLARABLE))
    return _follows_answer(request, upload)


refuse_other_methods(router, "/snapshots/{code}/follows", ("GET", "POST"))
