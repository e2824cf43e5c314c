"""API URLs (namespace ``api``, under ``/api/v1/``; contract.md §3): ninja's routes and documents,
then every other path as a JSON 404 after the same authentication (401 without credentials)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, path, re_path
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from ninja.errors import AuthenticationError

from webapp.snapshots.api.auth import caller_auth, not_found
from webapp.snapshots.api.site import api

app_name = "api"


@csrf_exempt
@never_cache
def unknown_path(request: HttpRequest, *_args: Any, **_kwargs: Any) -> HttpResponse:
    """Every /api/v1/ path no route names: JSON like every API answer (not Django's HTML 404), after
    the same authentication as the others (401 without credentials, then 404)."""
    try:
        if any(check(request) for check in caller_auth()):
            return not_found()
        raise AuthenticationError()
    except Exception as exc:
        return api.on_exception(request, exc)


def _routes() -> list[URLPattern | URLResolver]:
    """Ninja's patterns, its bare root (an HTML-less 404 page of its own) answered as any unknown path."""
    patterns, _app, _namespace = api.urls
    kept: list[URLPattern | URLResolver] = [p for p in patterns if getattr(p, "name", None) != "api-root"]
    return [*kept, path("", unknown_path, name="api-root")]


urlpatterns = [*_routes(), re_path(r"^.*$", unknown_path, name="unknown")]
