"""JSON API (contract.md §3): ``Authorization: Bearer <token>``, or the browser's session.

Unauthenticated calls get 401; objects outside the caller's teams get 404. Token calls
carry no cookie and so need no CSRF token; session calls that change state do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt

from webapp.snapshots import disk, firstanswer, followups, intake, messages, runs, services
from webapp.snapshots.forms import ApiUploadFieldsForm, first_error
from webapp.snapshots.intake import PARSE_ERRORS, check_declared_size, disk_full, parse_error
from webapp.snapshots.models import Project, Run, Upload
from webapp.snapshots.ratelimits import LimitExceeded

View = Callable[..., HttpResponse]
log = logging.getLogger(__name__)


def _error(status: int, code: str, message: str, *, choices: list[str] | None = None) -> JsonResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if choices is not None:
        body["choices"] = choices
    return JsonResponse({"error": body}, status=status)


def _uploadable_slugs(request: HttpRequest) -> list[str]:
    """The slugs of the projects this caller may upload to: the user's member-or-above projects,
    narrowed to the token's one project when the token is limited to one."""
    token = getattr(request, "api_token", None)
    rows = services.writable_projects(request.user).order_by("slug")
    return [p.slug for p in rows if services.token_allows(token, p)]


def _project_refusal(request: HttpRequest, status: int, code: str, message: str) -> JsonResponse:
    """A refusal about which project to upload to, answered with the projects that would do: a
    ``choices`` list in the body and the same slugs in the sentence, so a person or a client can retry."""
    slugs = _uploadable_slugs(request)
    return _error(status, code, f"{message} {messages.upload_choices(slugs)}", choices=slugs)


def _intake_error(err: LimitExceeded) -> JsonResponse:
    return JsonResponse(err.as_json(), status=err.status, headers=err.headers())


def _not_found() -> JsonResponse:
    return _error(404, "not-found", messages.NOT_FOUND)


def _csrf_ok(request: HttpRequest) -> bool:
    def accept(_request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    check = CsrfViewMiddleware(accept)
    return check.process_view(request, accept, (), {}) is None


def api_view(methods: tuple[str, ...]) -> Callable[[View], View]:
    """Authenticate (Bearer token, else session), restrict methods, answer errors in JSON."""

    def decorate(view: View) -> View:
        @csrf_exempt
        @never_cache
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                return checked(request, *args, **kwargs)
            except LimitExceeded as err:  # the intake's refusals, and a limit's (rates, quota, disk)
                return _intake_error(err)
            except PARSE_ERRORS as exc:  # a body Django could not parse: JSON, not its HTML 400
                return _intake_error(parse_error(exc))
            except OSError as exc:
                if not disk.is_full(exc):
                    raise
                # A write that failed for lack of space (the guard's reserve already used up):
                # a JSON 507 with its code, not an HTML 500.
                log.warning("api: disk full: %s", exc)
                return _intake_error(disk_full())
            except (OperationalError, InterfaceError) as exc:
                if disk.database_full(exc):
                    log.warning("api: database disk full: %s", exc)
                    return _intake_error(disk_full())
                # The database is unreachable (restarting, failing over): a JSON 503 a client can
                # retry (with the same Idempotency-Key), not Django's HTML 500.
                log.warning("api: database unavailable: %s", exc)
                response = _error(503, "service:database-unavailable", messages.DATABASE_UNAVAILABLE)
                response["Retry-After"] = "5"
                return response

        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            header = request.headers.get("Authorization", "")
            if header:
                scheme, _, raw = header.partition(" ")
                found = services.api_token_user(raw.strip()) if scheme.lower() == "bearer" and raw.strip() else None
                if found is None:
                    return _unauthorized("auth-invalid-token", messages.BAD_API_KEY)
                request.user, request.api_token = found  # type: ignore[attr-defined]
                if found[1].scope == "gate" and request.method not in ("GET", "HEAD", "OPTIONS"):
                    return _error(403, "token:read-only", messages.TOKEN_READ_ONLY)
            elif request.user.is_authenticated:
                request.api_token = None  # type: ignore[attr-defined]
                # A cookie-authenticated change needs the CSRF token (X-CSRFToken header). An
                # oversize upload is refused first: its body, and any token in it, is never read.
                if request.method not in ("GET", "HEAD", "OPTIONS"):
                    if request.method == "POST":
                        check_declared_size(request)
                    if not _csrf_ok(request):
                        return _error(403, "csrf", messages.CSRF_FAILED)
            else:
                return _unauthorized()
            if request.method not in methods:
                response = _error(
                    405, "method-not-allowed", messages.METHOD_NOT_ALLOWED.format(methods=", ".join(methods))
                )
                response["Allow"] = ", ".join(methods)
                return response
            return view(request, *args, **kwargs)

        return wrapper

    return decorate


def _unauthorized(code: str = "auth-required", message: str = messages.AUTH_REQUIRED) -> JsonResponse:
    response = _error(401, code, message)
    response["WWW-Authenticate"] = 'Bearer realm="oomscope"'
    return response


def _upload_or_none(request: HttpRequest, code: str) -> Upload | None:
    upload = services.upload_for_user(request.user, code)
    # A token limited to one project reaches nothing else.
    if upload is not None and not services.token_allows(getattr(request, "api_token", None), upload.project):
        return None
    return upload


def _project_or_none(request: HttpRequest, slug: str) -> Project | None:
    project = services.project_for_user(request.user, slug)
    if project is not None and not services.token_allows(getattr(request, "api_token", None), project):
        return None
    return project


def _accepted(request: HttpRequest, upload: Upload) -> JsonResponse:
    """202 for a new upload, 200 for a replay; the body says what the row holds."""
    body = services.upload_api_dict(upload, request)
    answer = {k: body[k] for k in ("id", "status", "url", "api_url")} | {"progress": upload.progress}
    headers = {"Location": body["api_url"]}
    if upload.publish_pending:
        answer["publish"] = "pending"
        answer["note"] = messages.PUBLISH_PENDING.format(seconds=_sweep_within())
    if upload.replayed:
        headers["Idempotent-Replayed"] = "true"
    return JsonResponse(answer, status=200 if upload.replayed else 202, headers=headers)


def _sweep_within() -> int:
    from django.conf import settings

    return int(settings.SWEEP_INTERVAL_SECONDS)


@api_view(("POST",))
def snapshots(request: HttpRequest) -> HttpResponse:
    """One upload: the intake's checks (``intake.admit``), then the service stores it
    (``services.upload_admit``); docs/architecture.md, "The upload's walk"."""
    try:
        admission = intake.admit(request, ApiUploadFieldsForm, keyed=True)
        if admission.earlier is not None:
            return _replayed(request, admission)
        made = services.upload_admit(admission, user=request.user, token=getattr(request, "api_token", None))  # type: ignore[arg-type]
    except intake.FieldsInvalid as invalid:
        field, detail = first_error(invalid.form)
        if field == "oom_message":
            return _error(400, "upload:invalid-oom-message", detail)
        return _error(400, "upload:invalid", messages.UPLOAD_INVALID_FIELD.format(field=field, detail=detail))
    except services.ProjectRefused as refused:
        return _project_refusal(request, refused.status, refused.code, refused.message)
    except services.IdempotencyConflict as conflict:
        message = messages.IDEMPOTENCY_CONFLICT.format(code=conflict.upload.code)
        return _error(409, "upload:idempotency-conflict", message)
    if isinstance(made, Run):  # a run's ranks in one tar or zip: one upload per rank, one run
        body = {"run": runs.run_dict(made, request)}
        return JsonResponse(body, status=202, headers={"Location": body["run"]["api_url"]})
    return _accepted(request, made)


def _replayed(request: HttpRequest, admission: intake.Admission) -> HttpResponse:
    """A retry under an Idempotency-Key already used: the earlier upload, or 409 for other bytes.

    Counted by its own rate (not the upload rates, so a client retrying after a timeout gets its
    answer); its text fields are not validated or parsed again (the earlier upload's stand).
    """
    assert admission.earlier is not None
    if _upload_or_none(request, admission.earlier.code) is None:  # its project is out of this caller's reach now
        return _error(409, "upload:idempotency-conflict", messages.IDEMPOTENCY_CONFLICT.format(code="-"))
    try:
        upload = services.upload_replay(admission.earlier, admission.sha256)
    except services.IdempotencyConflict as conflict:
        message = messages.IDEMPOTENCY_CONFLICT.format(code=conflict.upload.code)
        return _error(409, "upload:idempotency-conflict", message)
    return _accepted(request, upload)


@api_view(("GET", "DELETE"))
def snapshot(request: HttpRequest, code: str) -> HttpResponse:
    upload = _upload_or_none(request, code)
    if upload is None:
        return _not_found()
    if request.method == "DELETE":
        if not services.upload_can_delete(request.user, upload):
            return _error(403, "forbidden", messages.DELETE_FORBIDDEN)
        services.upload_delete(upload)
        return JsonResponse({"id": code, "deleted": True})
    # ``parts``: which of the outcome's parts are ready (the report before the charts: issue 34).
    return JsonResponse(services.upload_api_dict(upload, request) | firstanswer.parts(upload))


@api_view(("GET",))
def snapshot_report(request: HttpRequest, code: str) -> HttpResponse:
    upload = _upload_or_none(request, code)
    if upload is None:
        return _not_found()
    # The final report, also while the upload still runs once it is stored (``parts.report``): its
    # charts and digging data come after and change none of it (firstanswer.py).
    report = firstanswer.report_for(upload)
    if report is None:
        return _error(404, "report-not-ready", messages.REPORT_NOT_READY.format(status=upload.status))
    return JsonResponse(services.report_data(report))


@api_view(("GET", "POST", "DELETE"))
def snapshot_share(request: HttpRequest, code: str) -> HttpResponse:
    """GET lists the links; POST (optional ``name``) adds one; DELETE revokes one (``?key=``) or all."""
    upload = _upload_or_none(request, code)
    if upload is None:
        return _not_found()
    # Viewers read the report but hand out no access: links are for members and above.
    if not services.can(request.user, upload.project.team, "write"):
        return _error(403, "share:read-only", messages.SHARE_READ_ONLY)
    if request.method == "GET":
        links = services.share_links(upload, request)
        return JsonResponse({"share_url": services.share_url_of(upload, request), "links": links})
    if request.method == "DELETE":
        key = request.GET.get("key") or None
        revoked = services.share_revoke(upload, key)
        if key is not None and revoked == 0:
            return _error(404, "share:unknown-link", messages.SHARE_UNKNOWN)
        return JsonResponse({"share_url": services.share_url_of(upload, request), "revoked": revoked})
    token = services.share_create(upload, request.user, request.POST.get("name") or "")  # type: ignore[arg-type]
    link = services.share_url(request, token)
    made = next(item for item in services.share_links(upload, request) if item["url"] == link)
    return JsonResponse(
        {"share_url": link, "markdown": services.markdown_snippet(upload, link), "link": made},
        status=201,
    )


@api_view(("GET",))
def projects(request: HttpRequest) -> HttpResponse:
    """The projects the caller reaches: the web user's own list, or the token's one project."""
    token = getattr(request, "api_token", None)
    rows = services.visible_projects(request.user).order_by("team__name", "name")
    return JsonResponse({"projects": [services.project_dict(p) for p in rows if services.token_allows(token, p)]})


@api_view(("GET",))
def project_runs(request: HttpRequest, slug: str) -> HttpResponse:
    project = _project_or_none(request, slug)
    if project is None:
        return _not_found()
    uploads = list(project.uploads.select_related("project", "project__team")[:1000])
    shared = services.shared_upload_ids(uploads)
    return JsonResponse(
        {
            "project": services.project_dict(project),
            "runs": [services.upload_api_dict(u, request, shared=u.id in shared) for u in uploads],
        }
    )


@api_view(("GET", "POST"))
def snapshot_follows(request: HttpRequest, code: str) -> HttpResponse:
    """Follow-ups (issue 33): GET the incident this upload follows and those that follow it; POST
    ``follows`` (a code, or ``none``) and/or ``changed`` (change ids): the user's answer, scored again."""
    upload = _upload_or_none(request, code)
    if upload is None:
        return _not_found()
    if request.method == "POST":
        if not services.upload_can_delete(request.user, upload):
            return _error(403, "forbidden", messages.FOLLOWS_FORBIDDEN)
        follows = request.POST.get("follows")
        changed = request.POST.getlist("changed") if "changed" in request.POST else None
        try:
            upload = followups.declare(
                upload,
                follows.strip() if follows is not None else None,
                followups.parse_changes(changed) if changed is not None else None,
            )
        except LimitExceeded as err:
            return _error(err.status, err.code, err.message, choices=list(followups.DECLARABLE))
    return JsonResponse(
        {
            "id": upload.code,
            "follows": followups.follows_dict(upload, request),
            "followed_by": followups.followed_by(upload),
        }
    )


@api_view(("GET",))
def project_advice(request: HttpRequest, slug: str) -> HttpResponse:
    """Per change id: how often the project's incidents advised it, and what their follow-ups showed."""
    project = _project_or_none(request, slug)
    if project is None:
        return _not_found()
    rows = followups.record(Upload.objects.filter(project=project))
    return JsonResponse({"project": services.project_dict(project), "changes": rows})


@api_view(("GET",))
def site_advice(request: HttpRequest) -> HttpResponse:
    """The same record over the whole site, for staff (site admins) only."""
    token = getattr(request, "api_token", None)
    if not getattr(request.user, "is_staff", False) or (token is not None and token.project_id is not None):
        return _error(403, "forbidden", messages.ADVICE_SITE_FORBIDDEN)
    return JsonResponse({"changes": followups.record(Upload.objects.all())})


@api_view(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
def unknown_path(request: HttpRequest) -> HttpResponse:
    """Every /api/v1/ path no route names: JSON like every API answer (was Django's HTML 404), after
    the same authentication as the others (401 without credentials, then 404)."""
    return _not_found()
