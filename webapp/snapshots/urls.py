"""Page URLs (namespace ``snapshots``); the table in docs/architecture.md."""

from __future__ import annotations

from django.urls import path

from webapp.snapshots import runviews, triage
from webapp.snapshots.pages import views

app_name = "snapshots"

urlpatterns = [
    path("", views.home, name="home"),
    path("upload/", views.upload, name="upload"),
    path("triage/", triage.page, name="triage"),
    path("s/<str:code>/", views.detail, name="detail"),
    path("s/<str:code>/status.json", views.status_json, name="status_json"),
    path("s/<str:code>/share/", views.share, name="share"),
    path("s/<str:code>/delete/", views.delete, name="delete"),
    path("s/<str:code>/message/", views.reanalyse_with_message, name="reanalyse"),
    path("s/<str:code>/follows/", views.followup_answer, name="followup_answer"),
    path("s/<str:code>/timeline.json", views.explore_json, {"kind": "timeline"}, name="timeline_json"),
    path("s/<str:code>/state.json", views.explore_json, {"kind": "state"}, name="state_json"),
    path("s/<str:code>/active.json", views.explore_json, {"kind": "active"}, name="active_json"),
    path("s/<str:code>/block.json", views.explore_json, {"kind": "block"}, name="block_json"),
    path("s/<str:code>/segments.json", views.explore_json, {"kind": "segments"}, name="segments_json"),
    path("s/<str:code>/events.json", views.explore_json, {"kind": "events"}, name="events_json"),
    path("s/<str:code>/charts.json", views.charts_json, name="charts_json"),
    path("r/<str:token>/", views.share_view, name="share_view"),
    path("r/<str:token>/status.json", views.share_status_json, name="share_status_json"),
    path("r/<str:token>/timeline.json", views.share_explore_json, {"kind": "timeline"}, name="share_timeline_json"),
    path("r/<str:token>/state.json", views.share_explore_json, {"kind": "state"}, name="share_state_json"),
    path("r/<str:token>/active.json", views.share_explore_json, {"kind": "active"}, name="share_active_json"),
    path("r/<str:token>/block.json", views.share_explore_json, {"kind": "block"}, name="share_block_json"),
    path("r/<str:token>/segments.json", views.share_explore_json, {"kind": "segments"}, name="share_segments_json"),
    path("r/<str:token>/events.json", views.share_explore_json, {"kind": "events"}, name="share_events_json"),
    path("r/<str:token>/charts.json", views.share_charts_json, name="share_charts_json"),
    path("p/<slug:slug>/", views.history, name="history"),
    path("compare/<str:code_a>/<str:code_b>/", views.compare, name="compare"),
    path("teams/", views.teams, name="teams"),
    path("t/<slug:team>/", views.team, name="team"),
    path("tokens/", views.tokens, name="tokens"),
    # Runs of many ranks, baselines and regressions (issue 19; runviews.py).
    path("p/<slug:slug>/runs/", runviews.project_runs, name="project_runs"),
    path("run/<str:run_code>/", runviews.run, name="run"),
]
