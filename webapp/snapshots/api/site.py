"""The API itself: one ``NinjaAPI`` with the routers by concern, its authentication and refusals
(``auth.py``), its OpenAPI document (``/api/v1/openapi.json``) and the document's page
(``/api/v1/docs``), whose Swagger UI is served from our own static files (the copy django-ninja
ships), under the site's strict CSP: nothing is loaded from outside the site.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from ninja import NinjaAPI
from ninja.openapi.docs import DocsBase

from webapp.snapshots.api import projects, runs, triage, uploads
from webapp.snapshots.api.auth import caller_auth, install_error_handlers
from webapp.snapshots.api.openapi import with_refusal_headers

DESCRIPTION = (
    "oomscope's JSON API (docs/contract.md §3). Authenticate with `Authorization: Bearer <token>` "
    "(the tokens page, or `manage.py create_api_token`), or the browser's session with its CSRF token "
    '(`X-CSRFToken`) for a change. Every refusal is `{"error": {"code", "message"}}`.'
)


class OurSwagger(DocsBase):
    """Swagger UI from our static files, started by our script (no inline script: the CSP has none)."""

    def render_page(self, request: HttpRequest, api: NinjaAPI, **kwargs: Any) -> HttpResponse:
        context = {"api": api, "openapi_url": reverse(f"{api.urls_namespace}:openapi-json", kwargs=kwargs)}
        return render(request, "api/docs.html", context)


class OomscopeAPI(NinjaAPI):
    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: Any = None) -> Any:
        """Ninja's document, with the headers the refusals carry (``Retry-After``, ``WWW-Authenticate``)."""
        document = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        return with_refusal_headers(document)


api = OomscopeAPI(
    title="oomscope",
    version="1",
    description=DESCRIPTION,
    urls_namespace="api",
    auth=caller_auth(),
    docs=OurSwagger(),
    docs_url="/docs",
    openapi_url="/openapi.json",
)
install_error_handlers(api)
# Every answer, refusals included, is never cached (as ``never_cache`` on each view before).
api.add_decorator(never_cache, mode="view")
for router in (uploads.router, projects.router, runs.router, triage.router):
    api.add_router("", router)
