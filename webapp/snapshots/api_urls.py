"""API URLs (namespace ``api``), contract.md §3."""

from __future__ import annotations

from django.urls import path

from webapp.snapshots import api, triage

app_name = "api"

urlpatterns = [
    path("snapshots", api.snapshots, name="snapshots"),
    path("snapshots/<str:code>", api.snapshot, name="snapshot"),
    path("snapshots/<str:code>/report", api.snapshot_report, name="snapshot_report"),
    path("snapshots/<str:code>/share", api.snapshot_share, name="snapshot_share"),
    path("projects", api.projects, name="projects"),
    path("projects/<slug:slug>/runs", api.project_runs, name="project_runs"),
    path("triage", triage.api, name="triage"),
]
