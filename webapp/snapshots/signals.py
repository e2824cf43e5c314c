"""The app's signal receivers, connected once the app is ready (``SnapshotsConfig.ready``).

Kept out of ``models.py`` so that the models import nothing above them (tests/test_layers.py): a
receiver that removes a file (``intake.blobs``) would make the ground floor import a floor above it.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver

from webapp.snapshots.intake.blobs import upload_delete_blob_if_unused
from webapp.snapshots.models import Upload


@receiver(post_delete, sender=Upload, dispatch_uid="upload-delete-blob")
def _delete_blob_after_row(sender: Any, instance: Upload, **_kwargs: Any) -> None:
    """Every way a row goes (API, page, admin, a project's cascade) takes its file, after commit."""
    transaction.on_commit(lambda: upload_delete_blob_if_unused(instance))
