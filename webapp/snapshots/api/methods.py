"""The routes' methods: a method a route does not take is a JSON 405 with ``Allow``, answered
after the same authentication as the route's own (401 first, as before ninja; ninja's own answer
would be a bare 405 before authentication)."""

from __future__ import annotations

import inspect
import re
from typing import Any

from django.http import HttpRequest, JsonResponse
from ninja import Router

from webapp.snapshots import messages
from webapp.snapshots.api.auth import error

ALL_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
PATH_PARAM = re.compile(r"{(?:\w+:)?(\w+)}")


def not_allowed(allowed: tuple[str, ...]) -> JsonResponse:
    """405 ``method-not-allowed``, with ``Allow``."""
    listed = ", ".join(allowed)
    response = error(405, "method-not-allowed", messages.METHOD_NOT_ALLOWED.format(methods=listed))
    response["Allow"] = listed
    return response


def refuse_other_methods(router: Router, path: str, allowed: tuple[str, ...]) -> None:
    """Register, for ``path``, every method outside ``allowed`` as 405 (left out of the OpenAPI document)."""

    def method_not_allowed(request: HttpRequest, **_path: Any) -> JsonResponse:
        return not_allowed(allowed)

    # Ninja reads a view's path parameters from its signature: name them (as text, never checked).
    params = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=HttpRequest)]
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=str) for n in PATH_PARAM.findall(path)]
    method_not_allowed.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    others = [m for m in ALL_METHODS if m not in allowed]
    router.api_operation(others, path, include_in_schema=False)(method_not_allowed)
