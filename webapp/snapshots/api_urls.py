"""API URLs (namespace ``api``), contract.md §3."""

from __future__ import annotations

from django.urls import path, re_path

from webapp.snapshots import api

app_name = "api"

urlpatterns = [
    path("snapshots", api.snapshots, name="snapshots"),
    path("snapshots/<str:code>", api.snapshot, name="snapshot"),
    path("snapshots/<str:code>/report", api.snapshot_report, name="snapshot_report"),
    path("snapshots/<str:code>/share", api.snapshot_share, name="snapshot_share"),
    path("projects", api.projects, name="projects"),
    path("projects/<slug:slug>/runs", api.project_runs, name="project_runs"),
    # Anything else under /api/v1/ is a JSON 404, as every API answer (was Django's HTML page).
    re_path(r"^.*$", api.unknown_path, name="unknown"),
]
