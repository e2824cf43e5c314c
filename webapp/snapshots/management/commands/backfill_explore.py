"""``manage.py backfill_explore [CODE ...]``: queue the explore stores of done uploads that have none.

Uploads analysed before the worker kept explore stores (or whose stores were not kept) answer the
report's zoom, state and block requests with 404 ``explore:no-store``. This queues
``tasks.backfill_explore`` for each (one per distinct file; all of them, or the uploads named by
code): the analysis child makes the stores under its rlimits, never the web process.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from webapp.snapshots import publish
from webapp.snapshots.worker import jobs


class Command(BaseCommand):
    help = "Queue the explore stores of done uploads that have none (all, or the codes given)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("codes", nargs="*", help="upload codes (default: every done upload without stores)")

    def handle(self, *args: Any, **options: Any) -> None:
        ids = jobs.uploads_without_stores(options["codes"] or None)
        for upload_id in ids:
            publish.publish_backfill(upload_id)
        self.stdout.write(f"queued the explore stores of {len(ids)} uploads")
