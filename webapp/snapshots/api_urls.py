"""API URLs (namespace ``api``), contract.md §3."""

from __future__ import annotations

from django.urls import path, re_path

from webapp.snapshots import api, runapi, triage

app_name = "api"

urlpatterns = [
    path("snapshots", api.snapshots, name="snapshots"),
    path("snapshots/<str:code>", api.snapshot, name="snapshot"),
    path("snapshots/<str:code>/report", api.snapshot_report, name="snapshot_report"),
    path("snapshots/<str:code>/share", api.snapshot_share, name="snapshot_share"),
    path("snapshots/<str:code>/follows", api.snapshot_follows, name="snapshot_follows"),
    path("projects", api.projects, name="projects"),
    path("projects/<slug:slug>/advice", api.project_advice, name="project_advice"),
    path("advice", api.site_advice, name="site_advice"),
    path("projects/<slug:slug>/runs", api.project_runs, name="project_runs"),
    path("triage", triage.api, name="triage"),
    # Runs of many ranks, baselines and regressions (issue 19; runapi.py).
    path("runs/<str:run_code>", runapi.run, name="run"),
    path("runs/<str:run_code>/analyse", runapi.run_analyse, name="run_analyse"),
    path("runs/<str:run_code>/baseline", runapi.run_baseline, name="run_baseline"),
    path("projects/<slug:slug>/run-list", runapi.project_run_list, name="project_run_list"),
    path("projects/<slug:slug>/policy", runapi.project_policy, name="project_policy"),
    path("projects/<slug:slug>/webhook/test", runapi.project_webhook_test, name="project_webhook_test"),
    path("projects/<slug:slug>/regression", runapi.project_regression, name="project_regression"),
    # Anything else under /api/v1/ is a JSON 404, as every API answer (was Django's HTML page).
    re_path(r"^.*$", api.unknown_path, name="unknown"),
]
