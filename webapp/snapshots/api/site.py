"""The API itself: one ``NinjaAPI`` with the routers by concern, its authentication and refusals
(``auth.py``), its OpenAPI document (``/api/v1/openapi.json``) and the document's page
(``/api/v1/docs``), whose Swagger UI is served from our own static files (the copy django-ninja
ships), under the site's strict CSP: nothing is loaded from outside the site.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI
from ninja.openapi.docs import DocsBase

from webapp.snapshots.api import projects, runs, triage, uploads
from webapp.snapshots.api.auth import caller_auth, install_error_handlers, refusal_or_none
from webapp.snapshots.api.methods import not_allowed
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


def as_api_document(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The documents are under ``/api/v1/`` and answer as its routes: the same callers (401 JSON
    for none), GET only (405 JSON), never cached."""

    @csrf_exempt
    @never_cache
    @wraps(view)
    def document(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        refused = refusal_or_none(api, request)
        if refused is not None:
            return refused
        if request.method != "GET":
            return not_allowed(("GET",))
        return view(request, *args, **kwargs)

    return document


class OomscopeAPI(NinjaAPI):
    def get_root_path(self, path_params: dict[str, Any]) -> str:
        """``/api/v1/``: where the document lies (ninja's own root route is not kept; ``urls.py``)."""
        return reverse(f"{self.urls_namespace}:openapi-json", kwargs=path_params).removesuffix(
            str(self.openapi_url).lstrip("/")
        )

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
    docs_decorator=as_api_document,
)
install_error_handlers(api)
# Every answer, refusals included, is never cached (as ``never_cache`` on each view before).
api.add_decorator(never_cache, mode="view")
for router in (uploads.router, projects.router, runs.router, triage.router):
    api.add_router("", router)
