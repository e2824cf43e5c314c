"""Admin: read-mostly views for operators; tokens show only their prefix."""

from __future__ import annotations

from django.contrib import admin

from webapp.snapshots.models import (
    ApiToken,
    Membership,
    Project,
    Run,
    RunPolicy,
    ShareLink,
    Team,
    Upload,
    WebhookDelivery,
)


class MembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Membership
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "slug", "created_at")
    inlines = [MembershipInline]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("slug", "name", "team")


@admin.register(Upload)
class UploadAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("code", "filename", "project", "status", "stage", "attempts", "error_code", "created_at")
    list_filter = ("status",)
    search_fields = ("code", "filename", "sha256", "run")
    readonly_fields = ("code", "sha256", "blob_name", "bytes", "attempts", "task_id", "idempotency_key", "summary")


@admin.register(ShareLink)
class ShareLinkAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("prefix", "upload", "created_by", "created_at", "revoked_at", "use_count")
    exclude = ("token_hash",)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("prefix", "user", "default_project", "created_at", "last_used_at", "revoked_at")
    exclude = ("token_hash",)


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "project", "branch", "commit", "world_size", "status", "created_at")
    list_filter = ("status",)
    search_fields = ("name", "commit", "job_id")
    readonly_fields = ("code", "summary", "regression")


@admin.register(RunPolicy)
class RunPolicyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("project", "baseline", "main_branch", "max_regression_pct", "retention_days")
    exclude = ("webhook_secret",)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("run", "url", "attempts", "status_code", "delivered_at")
