"""``POST /api/v1/triage`` (contract.md §3 and §4): the triage from an OOM message (and, optionally,
``torch.cuda.memory_summary()``'s output) alone; nothing is stored. The page is ``triage.page``.

The body is read here, not by ninja: a body over ``MAX_BODY_BYTES`` is refused unread (413), and each
malformed body has its own code (415, 400 ``triage:not-json``, ``oom_message:missing``, ...).
"""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router

from analysis.limits import OomMessageError
from analysis.memory_summary import TriageError
from analysis.triage import triage
from webapp.snapshots.api import schemas as s
from webapp.snapshots.api.auth import error
from webapp.snapshots.api.methods import refuse_other_methods
from webapp.snapshots.api.openapi import json_body, responses
from webapp.snapshots.triage import MAX_BODY_BYTES, ledger_json

router = Router(tags=["triage"])


@router.post(
    "/triage",
    url_name="triage",
    summary="Triage an OOM message alone",
    by_alias=True,
    response=responses({200: s.Triage}, 400, 413, 415),
    openapi_extra=json_body(s.TriageRequest),
)
def triage_message(request: HttpRequest) -> HttpResponse:
    """``{"oom_message": str, "memory_summary": str?}`` -> the triage JSON (``oomscope.triage/1``)."""
    if request.content_type != "application/json":
        return error(415, "triage:not-json", "Send a JSON body (Content-Type: application/json).")
    declared = request.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return error(413, "triage:too-large", f"The body is larger than {MAX_BODY_BYTES:,} bytes.")
    body = request.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        return error(413, "triage:too-large", f"The body is larger than {MAX_BODY_BYTES:,} bytes.")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return error(400, "triage:not-json", "The body is not JSON.")
    if not isinstance(data, dict):
        return error(400, "triage:not-json", 'The body is not a JSON object: send {"oom_message": "..."}.')
    message, summary = data.get("oom_message"), data.get("memory_summary")
    if not isinstance(message, str):
        return error(400, "oom_message:missing", "The field 'oom_message' (a string) is required.")
    if summary is not None and not isinstance(summary, str):
        return error(400, "memory_summary:not-text", "The field 'memory_summary' is a string when given.")
    try:
        result = triage(message, summary or None)
    except (OomMessageError, TriageError) as exc:
        return error(400, exc.code, exc.message)
    return JsonResponse({**result.to_json(), "ledger": ledger_json(result)})


refuse_other_methods(router, "/triage", ("POST",))
