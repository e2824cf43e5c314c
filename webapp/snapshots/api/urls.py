"""API URLs (namespace ``api``, under ``/api/v1/``; contract.md §3): ninja's routes and documents,
then every other path as a JSON 404 after the same authentication (401 without credentials)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, re_path
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt

from webapp.snapshots.api.auth import not_found, refusal_or_none
from webapp.snapshots.api.site import api

app_name = "api"


@csrf_exempt
@never_cache
def unknown_path(request: HttpRequest, *_args: Any, **_kwargs: Any) -> HttpResponse:
    """Every /api/v1/ path no route names: JSON like every API answer (not Django's HTML 404), after
    the same authentication as the others (401 without credentials, then 404)."""
    return refusal_or_none(api, request) or not_found()


def _routes() -> list[URLPattern | URLResolver]:
    """Ninja's patterns without its bare root (a 404 of its own): ``/api/v1/`` is an unknown path too."""
    patterns, _app, _namespace = api.urls
    return [p for p in patterns if getattr(p, "name", None) != "api-root"]


urlpatterns = [*_routes(), re_path(r"^.*$", unknown_path, name="unknown")]
