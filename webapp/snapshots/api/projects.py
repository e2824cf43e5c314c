"""The API's projects (contract.md §3): those the caller reaches, a project's history of uploads, and
what the follow-ups showed of each change the reports advised (per project, and site-wide for staff)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router

from webapp.snapshots import messages
from webapp.snapshots.api import schemas as s
from webapp.snapshots.api.auth import error, not_found
from webapp.snapshots.api.methods import refuse_other_methods
from webapp.snapshots.api.openapi import responses
from webapp.snapshots.models import Project, Upload
from webapp.snapshots.pages import payloads
from webapp.snapshots.runs import followups
from webapp.snapshots.teams import access, membership, shares

router = Router(tags=["projects"])


def project_or_none(request: HttpRequest, slug: str) -> Project | None:
    """The project, if the caller's teams and token reach it (else the same 404 as no project)."""
    project = access.project_for_user(request.user, slug)
    if project is not None and not access.token_allows(getattr(request, "api_token", None), project):
        return None
    return project


@router.get(
    "/projects",
    url_name="projects",
    summary="The projects you reach",
    by_alias=True,
    response=responses({200: s.ProjectList}),
)
def projects(request: HttpRequest) -> HttpResponse:
    """The projects the caller reaches: the web user's own list, or the token's one project."""
    token = getattr(request, "api_token", None)
    rows = access.visible_projects(request.user).order_by("team__name", "name")
    return JsonResponse({"projects": [membership.project_dict(p) for p in rows if access.token_allows(token, p)]})


refuse_other_methods(router, "/projects", ("GET",))


@router.get(
    "/projects/{slug:slug}/runs",
    url_name="project_runs",
    summary="A project's uploads, newest first",
    by_alias=True,
    response=responses({200: s.ProjectHistory}),
)
def project_runs(request: HttpRequest, slug: str) -> HttpResponse:
    """The project's history: one row per snapshot, newest first, with its summary figures."""
    project = project_or_none(request, slug)
    if project is None:
        return not_found()
    uploads = list(project.uploads.select_related("project", "project__team")[:1000])
    shared = shares.shared_upload_ids(uploads)
    return JsonResponse(
        {
            "project": membership.project_dict(project),
            "runs": [payloads.upload_api_dict(u, request, shared=u.id in shared) for u in uploads],
        }
    )


refuse_other_methods(router, "/projects/{slug:slug}/runs", ("GET",))


@router.get(
    "/projects/{slug:slug}/advice",
    url_name="project_advice",
    summary="What the follow-ups showed of each advised change",
    by_alias=True,
    response=responses({200: s.ProjectAdvice}),
)
def project_advice(request: HttpRequest, slug: str) -> HttpResponse:
    """Per change id: how often the project's incidents advised it, and what their follow-ups showed."""
    project = project_or_none(request, slug)
    if project is None:
        return not_found()
    rows = followups.record(Upload.objects.filter(project=project))
    return JsonResponse({"project": membership.project_dict(project), "changes": rows})


refuse_other_methods(router, "/projects/{slug:slug}/advice", ("GET",))


@router.get(
    "/advice",
    url_name="site_advice",
    summary="The same over the whole site (staff)",
    by_alias=True,
    response=responses({200: s.SiteAdvice}),
)
def site_advice(request: HttpRequest) -> HttpResponse:
    """The same record over the whole site, for staff (site admins) only."""
    token = getattr(request, "api_token", None)
    if not getattr(request.user, "is_staff", False) or (token is not None and token.project_id is not None):
        return error(403, "forbidden", messages.ADVICE_SITE_FORBIDDEN)
    return JsonResponse({"changes": followups.record(Upload.objects.all())})


refuse_other_methods(router, "/advice", ("GET",))
