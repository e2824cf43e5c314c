"""Top-level URLs: the snapshots app (pages + API), accounts, admin, health."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from webapp import accounts, health
from webapp.snapshots.pages import views

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("accounts/login/", accounts.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/signup/", views.signup, name="signup"),
    path("admin/login/", accounts.admin_login, name="admin_login"),  # before the admin's own: rate-limited
    path("admin/", admin.site.urls),
    path("api/v1/", include("webapp.snapshots.api.urls")),
    path("", include("webapp.snapshots.urls")),
]
