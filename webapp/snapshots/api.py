"""JSON API (contract.md §3): ``Authorization: Bearer <token>``, or the browser's session.

Unauthenticated calls get 401; objects outside the caller's teams get 404. Token calls
carry no cookie and so need no CSRF token; session calls that change state do.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt

from webapp.snapshots import messages, services
from webapp.snapshots.forms import split_tags
from webapp.snapshots.intake import IntakeError, check_declared_size, received_file
from webapp.snapshots.models import Project, Upload

View = Callable[..., HttpResponse]


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


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
            header = request.headers.get("Authorization", "")
            if header:
                scheme, _, raw = header.partition(" ")
                found = services.api_token_user(raw.strip()) if scheme.lower() == "bearer" and raw.strip() else None
                if found is None:
                    return _unauthorized()
                request.user, request.api_token = found  # type: ignore[attr-defined]
            elif request.user.is_authenticated:
                request.api_token = None  # type: ignore[attr-defined]
                # A cookie-authenticated change needs the CSRF token (X-CSRFToken header). An
                # oversize upload is refused first: its body, and any token in it, is never read.
                if request.method not in ("GET", "HEAD", "OPTIONS"):
                    if request.method == "POST":
                        try:
                            check_declared_size(request)
                        except IntakeError as err:
                            return JsonResponse(err.as_json(), status=err.status)
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


def _unauthorized() -> JsonResponse:
    response = _error(401, "auth-required", messages.AUTH_REQUIRED)
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


@api_view(("POST",))
def snapshots(request: HttpRequest) -> HttpResponse:
    try:
        check_declared_size(request)
        uploaded, sha256, fmt = received_file(request)
    except IntakeError as err:
        return JsonResponse(err.as_json(), status=err.status)
    slug = (request.POST.get("project") or "").strip()
    token = getattr(request, "api_token", None)
    if slug:
        project = _project_or_none(request, slug)
    elif token is not None and token.default_project_id:
        project = _project_or_none(request, token.default_project.slug)
    else:
        candidates = list(services.visible_projects(request.user)[:2])
        project = candidates[0] if len(candidates) == 1 else None
        if project is None:
            return _error(400, "upload:no-project", messages.UPLOAD_NO_PROJECT)
    if project is None:
        return _error(404, "upload:unknown-project", messages.UPLOAD_UNKNOWN_PROJECT.format(slug=slug))
    if not services.can(request.user, project.team, "write"):
        return _error(403, "upload:read-only", messages.UPLOAD_READ_ONLY)
    upload = services.upload_create(
        user=request.user,  # type: ignore[arg-type]
        project=project,
        uploaded=uploaded,
        sha256=sha256,
        fmt=fmt,
        run=(request.POST.get("run") or "").strip(),
        tags=split_tags(request.POST.get("tags") or ""),
        note=request.POST.get("note") or "",
    )
    body = services.upload_api_dict(upload, request)
    return JsonResponse(
        {k: body[k] for k in ("id", "status", "url", "api_url")} | {"progress": upload.progress},
        status=202,
        headers={"Location": body["api_url"]},
    )


@api_view(("GET",))
def snapshot(request: HttpRequest, code: str) -> HttpResponse:
    upload = _upload_or_none(request, code)
    if upload is None:
        return _not_found()
    return JsonResponse(services.upload_api_dict(upload, request))


@api_view(("GET",))
def snapshot_report(request: HttpRequest, code: str) -> HttpResponse:
    upload = _upload_or_none(request, code)
    if upload is None:
        return _not_found()
    report = services.report_for(upload)
    if report is None:
        return _error(404, "report-not-ready", messages.REPORT_NOT_READY.format(status=upload.status))
    return JsonResponse(report.data)


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
