"""Pages of runs (the table in docs/architecture.md): a project's runs with their trend, and one
run's decision screen. Login required; another team's project or run is a 404; the changes
(pin a baseline, the regression settings, delete, analyse now) are POSTs with the same rights
as the API (``api/runs.py``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from webapp.snapshots import messages
from webapp.snapshots.api.runs import run_can_delete
from webapp.snapshots.intake.forms import RunPolicyForm, first_error
from webapp.snapshots.runs import runs
from webapp.snapshots.teams import access, membership


@login_required
@require_http_methods(["GET", "POST"])
def project_runs(request: HttpRequest, slug: str) -> HttpResponse:
    """The project's runs newest first, the trend of their peaks (``?branch=``, ``?tag=``), the
    baseline and, for members, the regression settings (POST)."""
    project = access.project_for_user(request.user, slug)
    if project is None:
        raise Http404
    team = project.team
    if request.method == "POST":
        _policy_post(request, project)
        return redirect("snapshots:project_runs", slug=slug)
    branch, tag = request.GET.get("branch", ""), request.GET.get("tag", "")
    rows = list(runs.runs_of(project, branch=branch, tag=tag).select_related("project")[:500])
    every = list(runs.runs_of(project).only("branch", "tags")[:1000])
    policy = runs.policy_for(project)
    manage = access.can(request.user, team, "manage")
    return render(
        request,
        "snapshots/runs.html",
        {
            "project": membership.project_dict(project),
            "runs": [runs.run_dict(r, request, ranks=False) for r in rows],
            "trend": runs.trend(rows),
            "branch": branch,
            "tag": tag,
            "branches": sorted({r.branch for r in every if r.branch}),
            "tags": sorted({t for r in every for t in (r.tags or [])}),
            "policy": runs.policy_dict(policy, show_secret=manage),
            "can_write": access.can(request.user, team, "write"),
            "can_manage": manage,
            "deliveries": runs.webhook_deliveries(project) if manage else [],
            "policy_changes": runs.policy_changes(project, limit=10) if manage else [],
            "site_url_unset": not settings.SITE_URL,
        },
    )


def _policy_post(request: HttpRequest, project: Any) -> None:
    """The settings form, or its "send a test" button: a team admin's (issue 36), recorded."""
    if not access.can(request.user, project.team, "manage"):
        flash.error(request, messages.POLICY_ADMIN_ONLY)
        return
    if request.POST.get("action") == "test-webhook":
        sent = runs.webhook_test(project)
        if sent["delivered"]:
            flash.success(request, messages.WEBHOOK_TEST_SENT.format(status=sent["status"]))
        else:
            flash.error(request, messages.WEBHOOK_TEST_FAILED.format(error=sent["error"]))
        return
    form = RunPolicyForm(request.POST)
    if not form.is_valid():
        field, detail = first_error(form)
        flash.error(request, f"{field}: {detail}")
        return
    policy = runs.policy_update(project, by=request.user, **form.changes())
    flash.success(request, messages.RUN_POLICY_SAVED)
    if policy.webhook_url and not settings.SITE_URL:
        flash.warning(request, messages.WEBHOOK_NO_SITE_URL)


@login_required
@require_http_methods(["GET", "POST"])
def run(request: HttpRequest, run_code: str) -> HttpResponse:
    """One run: its ranks side by side, the first OOM and why, peer failures, the stacks that
    differ, and the comparison with the baseline. POST ``action``: ``pin``, ``unpin``,
    ``analyse`` (the ranks present now), ``delete``."""
    found = runs.run_for_user(request.user, run_code)
    if found is None:
        raise Http404
    team = found.project.team
    if request.method == "POST":
        return _run_action(request, found)
    policy = runs.policy_for(found.project)
    base = runs.baseline_for(found, policy)
    context: dict[str, Any] = {
        "run": runs.run_dict(found, request),
        "baseline": runs.run_dict(base, request, ranks=False) if base else None,
        "is_baseline": policy.baseline_run_id == found.pk,
        "policy": runs.policy_dict(policy, show_secret=False),
        "can_write": access.can(request.user, team, "write"),
        "can_manage": access.can(request.user, team, "manage"),
        "can_delete": run_can_delete(request, found),
    }
    return render(request, "snapshots/run.html", context)


def _run_action(request: HttpRequest, found: Any) -> HttpResponse:
    action = request.POST.get("action")
    slug = found.project.slug
    if action == "delete":
        if not run_can_delete(request, found):
            flash.error(request, messages.RUN_FORBIDDEN)
            return redirect("snapshots:run", run_code=found.code)
        runs.run_delete(found)
        flash.success(request, messages.RUN_DELETED)
        return redirect("snapshots:project_runs", slug=slug)
    if action in ("pin", "unpin") and not access.can(request.user, found.project.team, "manage"):
        flash.error(request, messages.POLICY_ADMIN_ONLY)
    elif not access.can(request.user, found.project.team, "write"):
        flash.error(request, messages.RUN_FORBIDDEN)
    elif action == "pin":
        runs.baseline_pin(found.project, found, by=request.user)
        flash.success(request, messages.RUN_BASELINE_PINNED)
    elif action == "unpin":
        runs.baseline_pin(found.project, None, by=request.user)
        flash.info(request, messages.RUN_BASELINE_UNPINNED)
    elif action == "analyse":
        runs.run_analyse_now(found)
    return redirect("snapshots:run", run_code=found.code)
