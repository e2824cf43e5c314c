"""``manage.py sweep_orphan_blobs [--older-than SECONDS]``: remove stored files no upload
names (``blobs.blobs_sweep_orphans``; the beat runs it every ``PURGE_INTERVAL_SECONDS``).

Blobs under ``sha256/`` that no upload row names, and explore stores of bytes no row holds, once
older than the grace (default ``blobs.ORPHAN_GRACE_SECONDS``, 3 h: an upload in flight stores its
blob before its row). A blob a row names is never removed.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from webapp.snapshots.intake import blobs


class Command(BaseCommand):
    help = "Remove stored blobs and explore stores that no upload names (older than the grace)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=float, default=float(blobs.ORPHAN_GRACE_SECONDS))

    def handle(self, *args: Any, **options: Any) -> None:
        removed = blobs.blobs_sweep_orphans(options["older_than"])
        for name in removed:
            self.stdout.write(name)
        self.stdout.write(f"removed {len(removed)} files no upload names")
