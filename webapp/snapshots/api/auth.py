"""Who calls the JSON API, and its refusals as JSON (contract.md §3).

``Authorization: Bearer <token>``, else the browser's session. Unauthenticated calls get 401; a
token that is unknown, revoked or expired 401 ``auth-invalid-token``; a ``gate`` token changes
nothing (403 ``token:read-only``). Token calls carry no cookie and so need no CSRF token; session
calls that change state do (403 ``csrf``), after an oversize upload is refused unread. Every refusal,
and every failure a client can retry (the database down, the disk full), is the JSON error body,
never Django's HTML page; ``install_error_handlers`` puts these on the ``NinjaAPI``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, ValidationError
from ninja.security import APIKeyCookie
from ninja.security.http import HttpAuthBase

from webapp.snapshots import messages
from webapp.snapshots.errors import ApiRefusal, LimitExceeded
from webapp.snapshots.intake import disk
from webapp.snapshots.intake.intake import PARSE_ERRORS, check_declared_size, disk_full, parse_error
from webapp.snapshots.teams import tokens

log = logging.getLogger(__name__)

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def error(status: int, code: str, message: str, *, choices: list[str] | None = None) -> JsonResponse:
    """``{"error": {"code", "message"}}`` (with ``choices`` where the caller can pick one)."""
    body: dict[str, Any] = {"code": code, "message": message}
    if choices is not None:
        body["choices"] = choices
    return JsonResponse({"error": body}, status=status)


def not_found() -> JsonResponse:
    return error(404, "not-found", messages.NOT_FOUND)


def limit_error(err: LimitExceeded) -> JsonResponse:
    """The intake's and the limits' refusals: their code, and ``Retry-After`` where waiting helps."""
    return JsonResponse(err.as_json(), status=err.status, headers=err.headers())


UNAUTHORIZED_HEADERS = {"WWW-Authenticate": 'Bearer realm="oomscope"'}


def _csrf_ok(request: HttpRequest) -> bool:
    def accept(_request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    check = CsrfViewMiddleware(accept)
    return check.process_view(request, accept, (), {}) is None


class BearerToken(HttpAuthBase):
    """``Authorization: Bearer <token>`` (``manage.py create_api_token``, or the tokens page)."""

    openapi_scheme = "bearer"

    def __call__(self, request: HttpRequest) -> AbstractBaseUser | None:
        header = request.headers.get("Authorization", "")
        if not header:
            return None  # the session's turn
        scheme, _, raw = header.partition(" ")
        found = tokens.api_token_user(raw.strip()) if scheme.lower() == "bearer" and raw.strip() else None
        if found is None:
            raise ApiRefusal(401, "auth-invalid-token", messages.BAD_API_KEY, UNAUTHORIZED_HEADERS)
        request.user, request.api_token = found  # type: ignore[attr-defined]
        if found[1].scope == "gate" and request.method not in SAFE_METHODS:
            raise ApiRefusal(403, "token:read-only", messages.TOKEN_READ_ONLY)
        return found[0]


class Session(APIKeyCookie):
    """The browser's login session; a change needs the CSRF token (``X-CSRFToken``)."""

    param_name = "sessionid"

    def __init__(self) -> None:
        super().__init__(csrf=False)  # checked below, after the size guard, with our own refusal

    def __call__(self, request: HttpRequest) -> AbstractBaseUser | None:
        if not request.user.is_authenticated:
            return None  # 401 auth-required (``AuthenticationError``)
        request.api_token = None  # type: ignore[attr-defined]
        if request.method not in SAFE_METHODS:
            if request.method == "POST":
                # An oversize upload is refused first: its body, and any token in it, is never read.
                check_declared_size(request)
            if not _csrf_ok(request):
                raise ApiRefusal(403, "csrf", messages.CSRF_FAILED)
        return request.user

    def authenticate(self, request: HttpRequest, key: str | None) -> Any:  # pragma: no cover - __call__ decides
        return None


def caller_auth() -> list[Any]:
    """The API's authentication, in order: a Bearer token, else the session."""
    return [BearerToken(), Session()]


def refusal_or_none(api: NinjaAPI, request: HttpRequest) -> HttpResponse | None:
    """The routes' authentication for a view that is not a ninja operation (the documents, unknown
    paths): None for a caller let in, else the refusal the routes would answer."""
    try:
        if any(check(request) for check in caller_auth()):
            return None
        raise AuthenticationError()
    except Exception as exc:
        return api.on_exception(request, exc)


def install_error_handlers(api: NinjaAPI) -> None:
    """Answer every refusal and retryable failure as the JSON error body (was ``api.api_view``'s)."""
    api.add_exception_handler(ApiRefusal, _refusal)
    api.add_exception_handler(AuthenticationError, _unauthenticated)
    api.add_exception_handler(LimitExceeded, _limit)
    for parse in PARSE_ERRORS:  # a body Django could not parse: JSON, not its HTML 400
        api.add_exception_handler(parse, _unparsed)
    api.add_exception_handler(OSError, _os_error)
    api.add_exception_handler(OperationalError, _database_error)
    api.add_exception_handler(InterfaceError, _database_error)
    api.add_exception_handler(Http404, _not_found)
    api.add_exception_handler(ValidationError, _invalid_params)
    api.add_exception_handler(Exception, _unexpected)


def _refusal(_request: HttpRequest, exc: Any) -> HttpResponse:
    response = error(exc.status, exc.code, exc.message)
    for name, value in exc.extra_headers.items():
        response[name] = value
    return response


def _limit(_request: HttpRequest, exc: Any) -> HttpResponse:
    return limit_error(exc)


def _unparsed(_request: HttpRequest, exc: Any) -> HttpResponse:
    return limit_error(parse_error(exc))


def _not_found(_request: HttpRequest, _exc: Any) -> HttpResponse:
    return not_found()


def _unauthenticated(_request: HttpRequest, _exc: Any) -> HttpResponse:
    return _refusal(_request, ApiRefusal(401, "auth-required", messages.AUTH_REQUIRED, UNAUTHORIZED_HEADERS))


def _os_error(_request: HttpRequest, exc: Any) -> HttpResponse:
    if not disk.is_full(exc):
        raise exc
    # A write that failed for lack of space (the guard's reserve already used up): a JSON 507 with
    # its code, not an HTML 500.
    log.warning("api: disk full: %s", exc)
    return limit_error(disk_full())


def _database_error(_request: HttpRequest, exc: Any) -> HttpResponse:
    if disk.database_full(exc):
        log.warning("api: database disk full: %s", exc)
        return limit_error(disk_full())
    # The database is unreachable (restarting, failing over): a JSON 503 a client can retry (with
    # the same Idempotency-Key), not Django's HTML 500.
    log.warning("api: database unavailable: %s", exc)
    response = error(503, "service:database-unavailable", messages.DATABASE_UNAVAILABLE)
    response["Retry-After"] = "5"
    return response


def _invalid_params(_request: HttpRequest, exc: Any) -> HttpResponse:
    """Ninja's own parameter check (never reached by the routes' text parameters): our body, not its 422."""
    first = exc.errors[0] if exc.errors else {}
    where = ".".join(str(part) for part in first.get("loc", ()))
    return error(400, "request:invalid", f"{where}: {first.get('msg', 'invalid')}")


def _unexpected(_request: HttpRequest, exc: Any) -> HttpResponse:
    """Anything else is a bug: raised, as a plain Django view's (ninja would answer a text 500 in DEBUG)."""
    raise exc
