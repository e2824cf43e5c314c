"""The API's runs (contract.md §3, "Runs"): the same authentication and refusals as every route.

A run is reached through its project: another team's run is the same 404 as a run that does not
exist. Reading needs the ``read`` right; analysing needs ``write``; the gate's settings (pinning a
baseline, the threshold, main branch, webhook and retention; recorded, ``PolicyChange``) and deleting
another member's run need ``manage`` (``access.ROLE_RIGHTS``; issue 36: any member or CI token
could flip the gate's answer). A token limited to one project neither changes the webhook nor reads
its secret; a ``gate`` token changes nothing (``auth.BearerToken``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router

from analysis.regression import threshold_error
from webapp.snapshots import messages
from webapp.snapshots.api import schemas as s
from webapp.snapshots.api.auth import error, not_found
from webapp.snapshots.api.methods import refuse_other_methods
from webapp.snapshots.api.openapi import form_body, responses
from webapp.snapshots.api.projects import project_or_none
from webapp.snapshots.intake.forms import RunPolicyForm, first_error
from webapp.snapshots.models import Run
from webapp.snapshots.runs import runs
from webapp.snapshots.teams import access, membership

router = Router(tags=["runs"])


def _run_or_none(request: HttpRequest, code: str) -> Run | None:
    run = runs.run_for_user(request.user, code)
    if run is not None and not access.token_allows(getattr(request, "api_token", None), run.project):
        return None
    return run


def _forbidden() -> JsonResponse:
    return error(403, "forbidden", messages.RUN_FORBIDDEN)


def run_can_delete(request: HttpRequest, run: Run) -> bool:
    """Team admins, or a member whose uploads are all of the run's."""
    team = run.project.team
    if access.can(request.user, team, "manage"):
        return True
    return access.can(request.user, team, "write") and not run.uploads.exclude(uploaded_by=request.user.pk).exists()


@router.get(
    "/runs/{run_code}",
    url_name="run",
    summary="A run of one or more ranks",
    by_alias=True,
    response=responses({200: s.Run}),
)
def run(request: HttpRequest, run_code: str) -> HttpResponse:
    """The run, its summary and regression, and its ranks' uploads."""
    found = _run_or_none(request, run_code)
    if found is None:
        return not_found()
    return JsonResponse(runs.run_dict(found, request))


@router.delete("/runs/{run_code}", summary="Delete a run", by_alias=True, response=responses({200: s.Deleted}))
def run_delete(request: HttpRequest, run_code: str) -> HttpResponse:
    """The run, its uploads, reports and files go (team admins, or a member whose uploads are all of the run's)."""
    found = _run_or_none(request, run_code)
    if found is None:
        return not_found()
    if not run_can_delete(request, found):
        return _forbidden()
    runs.run_delete(found)
    return JsonResponse({"id": run_code, "deleted": True})


refuse_other_methods(router, "/runs/{run_code}", ("GET", "DELETE"))


@router.post(
    "/runs/{run_code}/analyse",
    url_name="run_analyse",
    summary="Analyse the ranks present now",
    by_alias=True,
    response=responses({202: s.RunAnalysing}),
)
def run_analyse(request: HttpRequest, run_code: str) -> HttpResponse:
    """Analyse the ranks the run has now (one never came): the chord over those present."""
    found = _run_or_none(request, run_code)
    if found is None:
        return not_found()
    if not access.can(request.user, found.project.team, "write"):
        return _forbidden()
    runs.run_analyse_now(found)
    return JsonResponse({"id": run_code, "status": "analysing"}, status=202)


refuse_other_methods(router, "/runs/{run_code}/analyse", ("POST",))


def _baseline(request: HttpRequest, run_code: str, pin: bool) -> HttpResponse:
    found = _run_or_none(request, run_code)
    if found is None:
        return not_found()
    if not access.can(request.user, found.project.team, "manage"):
        return error(403, "forbidden", messages.POLICY_ADMIN_ONLY)
    token = getattr(request, "api_token", None)
    policy = runs.baseline_pin(found.project, found if pin else None, by=request.user, token=token)
    return JsonResponse({"policy": runs.policy_dict(policy, show_secret=token is None or token.project_id is None)})


@router.post(
    "/runs/{run_code}/baseline",
    url_name="run_baseline",
    summary="Pin the run as the baseline",
    by_alias=True,
    response=responses({200: s.PolicyOnly}),
)
def run_baseline_pin(request: HttpRequest, run_code: str) -> HttpResponse:
    """Pin the run as its project's baseline (team admins; recorded)."""
    return _baseline(request, run_code, pin=True)


@router.delete(
    "/runs/{run_code}/baseline",
    summary="Back to the latest run on main",
    by_alias=True,
    response=responses({200: s.PolicyOnly}),
)
def run_baseline_unpin(request: HttpRequest, run_code: str) -> HttpResponse:
    """Back to "the latest run on main" (team admins; recorded)."""
    return _baseline(request, run_code, pin=False)


refuse_other_methods(router, "/runs/{run_code}/baseline", ("POST", "DELETE"))


@router.get(
    "/projects/{slug:slug}/run-list",
    url_name="project_run_list",
    summary="A project's runs, newest first",
    by_alias=True,
    response=responses({200: s.RunList}),
)
def project_run_list(request: HttpRequest, slug: str, branch: str = "", tag: str = "") -> HttpResponse:
    """The project's runs, newest first (``?branch=``, ``?tag=`` filter), with the trend's points."""
    project = project_or_none(request, slug)
    if project is None:
        return not_found()
    rows = list(runs.runs_of(project, branch=branch, tag=tag).select_related("project")[:500])
    return JsonResponse(
        {"project": membership.project_dict(project), "runs": [runs.run_dict(r, request, ranks=False) for r in rows]}
    )


refuse_other_methods(router, "/projects/{slug:slug}/run-list", ("GET",))


def _policy_answer(project: Any, secret_ok: bool, warnings: list[str]) -> JsonResponse:
    body: dict[str, Any] = {"policy": runs.policy_dict(runs.policy_for(project), show_secret=secret_ok)}
    body["deliveries"] = runs.webhook_deliveries(project)
    body["changes"] = runs.policy_changes(project)
    return JsonResponse(body | ({"warnings": warnings} if warnings else {}))


def _secret_ok(request: HttpRequest, manage: bool) -> bool:
    """Only a team admin reads the webhook's secret, and never through a token of one project."""
    token = getattr(request, "api_token", None)
    return manage and (token is None or token.project_id is None)


@router.get(
    "/projects/{slug:slug}/policy",
    url_name="project_policy",
    summary="The regression gate's settings",
    by_alias=True,
    response=responses({200: s.PolicyAnswer}),
)
def project_policy(request: HttpRequest, slug: str) -> HttpResponse:
    """The project's baseline and regression settings, its webhook's last deliveries and the recorded changes."""
    project = project_or_none(request, slug)
    if project is None:
        return not_found()
    manage = access.can(request.user, project.team, "manage")
    return _policy_answer(project, _secret_ok(request, manage), [])


@router.post(
    "/projects/{slug:slug}/policy",
    summary="Change the regression gate's settings",
    by_alias=True,
    response=responses({200: s.PolicyAnswer}, 400),
    openapi_extra=form_body(s.PolicyForm),
)
def project_policy_change(request: HttpRequest, slug: str) -> HttpResponse:
    """Change the settings (form fields): a team admin's (issue 36), never through a token limited to
    one project for the webhook; each change recorded."""
    project = project_or_none(request, slug)
    if project is None:
        return not_found()
    manage = access.can(request.user, project.team, "manage")
    if not manage:
        return error(403, "forbidden", messages.POLICY_ADMIN_ONLY)
    secret_ok = _secret_ok(request, manage)
    form = RunPolicyForm(request.POST)
    if not form.is_valid():
        field, detail = first_error(form)
        return error(400, "policy:invalid", f"{field}: {detail}")
    changes = form.changes()
    if "webhook_url" in changes and not secret_ok:
        return error(403, "forbidden", messages.WEBHOOK_PROJECT_TOKEN)
    token = getattr(request, "api_token", None)
    policy = runs.policy_update(project, by=request.user, token=token, **changes)
    warnings = [messages.WEBHOOK_NO_SITE_URL] if policy.webhook_url and not settings.SITE_URL else []
    return _policy_answer(project, secret_ok, warnings)


refuse_other_methods(router, "/projects/{slug:slug}/policy", ("GET", "POST"))


@router.post(
    "/projects/{slug:slug}/webhook/test",
    url_name="project_webhook_test",
    summary="Send a test alert to the webhook",
    by_alias=True,
    response=responses({200: s.WebhookTest}),
)
def project_webhook_test(request: HttpRequest, slug: str) -> HttpResponse:
    """Send a signed test alert to the project's webhook now (an admin's)."""
    project = project_or_none(request, slug)
    if project is None:
        return not_found()
    token = getattr(request, "api_token", None)
    if not access.can(request.user, project.team, "manage") or (token is not None and token.project_id):
        return error(403, "forbidden", messages.POLICY_ADMIN_ONLY)
    return JsonResponse(runs.webhook_test(project))


refuse_other_methods(router, "/projects/{slug:slug}/webhook/test", ("POST",))


def _threshold(text: str | None) -> float | JsonResponse | None:
    """``?max_regression=PCT`` (a trailing % allowed): None for the project's, or a 400 refusal."""
    try:
        pct = float(text.rstrip("%")) if text else None
    except ValueError:
        return error(400, "policy:invalid", f"max_regression: {text!r} is not a percentage")
    refused = threshold_error(pct) if pct is not None else None
    if refused is not None:  # nan, inf, a negative share: never a NaN or Infinity in the answer (issue 36)
        return error(400, "policy:invalid", f"max_regression: {refused}")
    return pct


@router.get(
    "/projects/{slug:slug}/regression",
    url_name="project_regression",
    summary="Did a run regress against the baseline?",
    by_alias=True,
    response=responses({200: s.RegressionAnswer}, 400),
)
def project_regression(
    request: HttpRequest, slug: str, run: str = "", max_regression: str | None = None
) -> HttpResponse:
    """The gate's question: did run ``?run=NAME`` (default: the newest) regress against the baseline,
    at ``?max_regression=PCT`` (default: the project's threshold)? ``status``: ``no-run`` (none yet),
    ``pending`` (not summarised yet: ask again), ``done``."""
    project = project_or_none(request, slug)
    if project is None:
        return not_found()
    found = (runs.runs_of(project).filter(name=run) if run else runs.runs_of(project)).first()
    if found is None:
        reason = messages.RUN_UNKNOWN.format(name=run) if run else messages.RUN_NONE
        return JsonResponse({"status": "no-run", "run": None, "regressed": None, "reason": reason})
    pct = _threshold(max_regression)
    if isinstance(pct, JsonResponse):
        return pct
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


refuse_other_methods(router, "/projects/{slug:slug}/regression", ("GET",))
