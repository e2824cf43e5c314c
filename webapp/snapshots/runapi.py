"""JSON API of runs (contract.md §3, "Runs"): the same authentication and errors as ``api.py``.

A run is reached through its project: another team's run is the same 404 as a run that does
not exist. Reading needs the ``read`` right; analysing needs ``write``; the gate's settings
(pinning a baseline, the threshold, main branch, webhook and retention; recorded, ``PolicyChange``)
and deleting another member's run need ``manage`` (``access.ROLE_RIGHTS``; issue 36: any member
or CI token could flip the gate's answer). A token limited to one project neither changes the
webhook nor reads its secret; a ``gate`` token changes nothing (``api.api_view``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from analysis.regression import threshold_error
from webapp.snapshots import messages
from webapp.snapshots.api import _error, _not_found, _project_or_none, api_view
from webapp.snapshots.intake.forms import RunPolicyForm, first_error
from webapp.snapshots.models import Run
from webapp.snapshots.runs import runs
from webapp.snapshots.teams import access, membership


def _run_or_none(request: HttpRequest, code: str) -> Run | None:
    run = runs.run_for_user(request.user, code)
    if run is not None and not access.token_allows(getattr(request, "api_token", None), run.project):
        return None
    return run


def _forbidden() -> JsonResponse:
    return _error(403, "forbidden", messages.RUN_FORBIDDEN)


def run_can_delete(request: HttpRequest, run: Run) -> bool:
    """Team admins, or a member whose uploads are all of the run's."""
    team = run.project.team
    if access.can(request.user, team, "manage"):
        return True
    return access.can(request.user, team, "write") and not run.uploads.exclude(uploaded_by=request.user.pk).exists()


@api_view(("GET", "DELETE"))
def run(request: HttpRequest, run_code: str) -> HttpResponse:
    found = _run_or_none(request, run_code)
    if found is None:
        return _not_found()
    if request.method == "DELETE":
        if not run_can_delete(request, found):
            return _forbidden()
        runs.run_delete(found)
        return JsonResponse({"id": run_code, "deleted": True})
    return JsonResponse(runs.run_dict(found, request))


@api_view(("POST",))
def run_analyse(request: HttpRequest, run_code: str) -> HttpResponse:
    """Analyse the ranks the run has now (one never came): the chord over those present."""
    found = _run_or_none(request, run_code)
    if found is None:
        return _not_found()
    if not access.can(request.user, found.project.team, "write"):
        return _forbidden()
    runs.run_analyse_now(found)
    return JsonResponse({"id": run_code, "status": "analysing"}, status=202)


@api_view(("POST", "DELETE"))
def run_baseline(request: HttpRequest, run_code: str) -> HttpResponse:
    """POST pins the run as its project's baseline; DELETE goes back to "the latest run on main"."""
    found = _run_or_none(request, run_code)
    if found is None:
        return _not_found()
    if not access.can(request.user, found.project.team, "manage"):
        return _error(403, "forbidden", messages.POLICY_ADMIN_ONLY)
    token = getattr(request, "api_token", None)
    policy = runs.baseline_pin(found.project, found if request.method == "POST" else None, by=request.user, token=token)
    return JsonResponse({"policy": runs.policy_dict(policy, show_secret=token is None or token.project_id is None)})


@api_view(("GET",))
def project_run_list(request: HttpRequest, slug: str) -> HttpResponse:
    """The project's runs, newest first (``?branch=``, ``?tag=`` filter), with the trend's points."""
    project = _project_or_none(request, slug)
    if project is None:
        return _not_found()
    rows = list(
        runs.runs_of(project, branch=request.GET.get("branch", ""), tag=request.GET.get("tag", "")).select_related(
            "project"
        )[:500]
    )
    return JsonResponse(
        {"project": membership.project_dict(project), "runs": [runs.run_dict(r, request, ranks=False) for r in rows]}
    )


@api_view(("GET", "POST"))
def project_policy(request: HttpRequest, slug: str) -> HttpResponse:
    """GET the project's baseline and regression settings, its webhook's last deliveries and the
    recorded changes; POST changes them (form fields): a team admin's (issue 36), never through a
    token limited to one project for the webhook (nor does one read its secret)."""
    project = _project_or_none(request, slug)
    if project is None:
        return _not_found()
    token = getattr(request, "api_token", None)
    manage = access.can(request.user, project.team, "manage")
    secret_ok = manage and (token is None or token.project_id is None)
    warnings: list[str] = []
    if request.method == "POST":
        if not manage:
            return _error(403, "forbidden", messages.POLICY_ADMIN_ONLY)
        form = RunPolicyForm(request.POST)
        if not form.is_valid():
            field, detail = first_error(form)
            return _error(400, "policy:invalid", f"{field}: {detail}")
        changes = form.changes()
        if "webhook_url" in changes and not secret_ok:
            return _error(403, "forbidden", messages.WEBHOOK_PROJECT_TOKEN)
        policy = runs.policy_update(project, by=request.user, token=token, **changes)
        if policy.webhook_url and not settings.SITE_URL:
            warnings.append(messages.WEBHOOK_NO_SITE_URL)
    body: dict[str, Any] = {"policy": runs.policy_dict(runs.policy_for(project), show_secret=secret_ok)}
    body["deliveries"] = runs.webhook_deliveries(project)
    body["changes"] = runs.policy_changes(project)
    return JsonResponse(body | ({"warnings": warnings} if warnings else {}))


@api_view(("POST",))
def project_webhook_test(request: HttpRequest, slug: str) -> HttpResponse:
    """Send a test alert to the project's webhook now: ``{"delivered", "status", "error"}`` (an admin's)."""
    project = _project_or_none(request, slug)
    if project is None:
        return _not_found()
    token = getattr(request, "api_token", None)
    if not access.can(request.user, project.team, "manage") or (token is not None and token.project_id):
        return _error(403, "forbidden", messages.POLICY_ADMIN_ONLY)
    return JsonResponse(runs.webhook_test(project))


@api_view(("GET",))
def project_regression(request: HttpRequest, slug: str) -> HttpResponse:
    """The gate's question: did run ``?run=NAME`` (default: the newest) regress against the
    baseline, at ``?max_regression=PCT`` (default: the project's threshold)?

    ``status``: ``no-run`` (none yet), ``pending`` (not summarised yet: ask again), ``done``.
    """
    project = _project_or_none(request, slug)
    if project is None:
        return _not_found()
    name = request.GET.get("run", "")
    found = (runs.runs_of(project).filter(name=name) if name else runs.runs_of(project)).first()
    if found is None:
        reason = messages.RUN_UNKNOWN.format(name=name) if name else messages.RUN_NONE
        return JsonResponse({"status": "no-run", "run": None, "regressed": None, "reason": reason})
    threshold = request.GET.get("max_regression")
    try:
        pct = float(threshold.rstrip("%")) if threshold else None
    except ValueError:
        return _error(400, "policy:invalid", f"max_regression: {threshold!r} is not a percentage")
    refused = threshold_error(pct) if pct is not None else None
    if refused is not None:  # nan, inf, a negative share: never a NaN or Infinity in the answer (issue 36)
        return _error(400, "policy:invalid", f"max_regression: {refused}")
    body = {"status": "pending" if found.status != Run.Status.DONE else "done", "run": runs.run_dict(found, request)}
    if body["status"] == "pending":
        return JsonResponse(body | {"regressed": None, "baseline": None, "reason": messages.RUN_PENDING})
    base = runs.baseline_for(found)
    regression = runs.run_compare(found, max_regression_pct=pct)
    return JsonResponse(
        body
        | {
            "baseline": runs.run_dict(base, request, ranks=False) if base else None,
            "regression": regression.to_dict() if regression else None,
            "regressed": regression.regressed if regression else False,
            "reason": regression.reason if regression else messages.RUN_NO_BASELINE,
        }
    )
