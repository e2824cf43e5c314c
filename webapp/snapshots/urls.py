"""Page URLs (namespace ``snapshots``); the table in docs/architecture.md."""

from __future__ import annotations

from django.urls import path

from webapp.snapshots import views

app_name = "snapshots"

urlpatterns = [
    path("", views.home, name="home"),
    path("upload/", views.upload, name="upload"),
    path("s/<str:code>/", views.detail, name="detail"),
    path("s/<str:code>/status.json", views.status_json, name="status_json"),
    path("s/<str:code>/share/", views.share, name="share"),
    path("r/<str:token>/", views.share_view, name="share_view"),
    path("r/<str:token>/status.json", views.share_status_json, name="share_status_json"),
    path("p/<slug:slug>/", views.history, name="history"),
    path("compare/<str:code_a>/<str:code_b>/", views.compare, name="compare"),
    path("teams/", views.teams, name="teams"),
    path("t/<slug:team>/", views.team, name="team"),
    path("tokens/", views.tokens, name="tokens"),
]
