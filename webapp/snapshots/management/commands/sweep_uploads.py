"""``manage.py sweep_uploads``: re-queue stuck uploads now (beat runs the same task every minute)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Re-queue uploads stuck in running (stale heartbeat) or queued (never picked up)."

    def handle(self, *args: Any, **options: Any) -> None:
        from webapp.snapshots.worker.tasks import sweep_uploads

        count = sweep_uploads()
        self.stdout.write(f"re-queued {count} upload(s)")
