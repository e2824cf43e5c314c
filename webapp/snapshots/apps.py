"""The snapshots app: uploads, reports, teams and runs (Django app config)."""

from __future__ import annotations

from django.apps import AppConfig


class SnapshotsConfig(AppConfig):
    name = "webapp.snapshots"
    label = "snapshots"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from webapp.snapshots import signals  # noqa: F401  (connects the receivers; models import nothing above them)
