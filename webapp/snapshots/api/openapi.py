"""What the OpenAPI document says beyond ninja's reading of the views: the refusals each route can
answer (every one ``schemas.Error``), the form and JSON bodies the views read themselves, and the
answers' headers.

The views read their bodies themselves (``intake.admit`` refuses an oversize or malformed upload
before reading it, with its own codes; ninja would read the body first and answer its own 422),
so a body is described here from its schema rather than parsed by ninja.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from webapp.snapshots.api import schemas as s

REF_TEMPLATE = "#/components/schemas/{model}"

# Every route may answer these: no or a bad credential (401), a gate token's change, a viewer's
# change or a session change without its CSRF token (403), an object outside the caller's teams
# (404), the database unreachable (503) or the disk full (507).
COMMON_ERRORS = (401, 403, 404, 503, 507)


def responses(success: dict[int, Any], *errors: int) -> dict[int, Any]:
    """``response=`` for a route: its successes, then ``schemas.Error`` for the common refusals and ``errors``."""
    answer: dict[int, Any] = dict(success)
    for status in sorted({*COMMON_ERRORS, *errors}):
        answer.setdefault(status, s.Error)
    return answer


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    assert "$defs" not in schema, f"{model.__name__}: a body's fields are flat"
    return schema


def _headers(headers: dict[int, dict[str, str]] | None) -> dict[int, Any]:
    return {
        status: {"headers": {name: {"description": text, "schema": {"type": "string"}} for name, text in named.items()}}
        for status, named in (headers or {}).items()
    }


# The headers every route's refusals carry (``with_refusal_headers`` adds them to the document).
REFUSAL_HEADERS = {
    401: {"WWW-Authenticate": 'Bearer realm="oomscope"'},
    429: {"Retry-After": "seconds to wait before trying again"},
    503: {"Retry-After": "seconds to wait before trying again"},
    507: {"Retry-After": "seconds to wait before trying again"},
}


# A POST may be refused before its route reads the body: a session's body over the upload cap or
# without a length (413, 411: checked before the CSRF token is read), or one Django cannot parse (400).
BODY_REFUSALS = {400: "Bad Request", 411: "Length Required", 413: "Content Too Large"}
ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}


def with_refusal_headers(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with the refusals every POST may get (``BODY_REFUSALS``), and ``REFUSAL_HEADERS``
    on every operation's answers of those statuses."""
    for operations in document.get("paths", {}).values():
        for method, operation in operations.items():
            answers = operation.setdefault("responses", {})
            if method == "post":
                for status, description in BODY_REFUSALS.items():
                    answers.setdefault(status, {"description": description, "content": ERROR_CONTENT})
            for status, answer in answers.items():
                for name, text in REFUSAL_HEADERS.get(int(status), {}).items():
                    answer.setdefault("headers", {})[name] = {"description": text, "schema": {"type": "string"}}
    return document


def form_body(
    model: type[BaseModel], *, multipart: bool = False, headers: dict[int, dict[str, str]] | None = None
) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads form fields (``request.POST``, ``request.FILES``);
    ``headers``: the names and meanings of headers its answers of each status carry."""
    media = "multipart/form-data" if multipart else "application/x-www-form-urlencoded"
    body = {"requestBody": {"required": True, "content": {media: {"schema": _body_schema(model)}}}}
    return body | ({"responses": _headers(headers)} if headers else {})


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route that reads a JSON body itself."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _body_schema(model)}}}}
