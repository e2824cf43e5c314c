"""Issue 17, item 4: the explore stores of an upload analysed without them are made by a task that
runs the analysis child under its rlimits (``tasks.backfill_explore``), never in the web process."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.files.storage import default_storage
from django.core.management import call_command

from tests.webapp.helpers import GPT_OOM, make_upload
from webapp.snapshots.intake import blobs
from webapp.snapshots.models import Upload
from webapp.snapshots.pages import digging
from webapp.snapshots.worker.tasks import analyse_upload, backfill_explore

pytestmark = pytest.mark.django_db


def _analysed_without_stores(alice: Any, alpha: Any) -> tuple[Upload, int]:
    """A done upload of gpt_varlen_oom as one analysed before stores existed; the stores' bytes."""
    upload = make_upload(alpha, alice, GPT_OOM)
    analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == Upload.Status.DONE, upload.error_message
    _dirs, files = default_storage.listdir(f"explore/{upload.sha256}")
    size = sum(default_storage.size(f"explore/{upload.sha256}/{name}") for name in files)
    assert files == ["0.npz"] and size > 0
    for name in files:
        default_storage.delete(f"explore/{upload.sha256}/{name}")
    Upload.objects.filter(pk=upload.pk).update(stored_bytes=upload.stored_bytes - size)
    digging._stores.clear()
    return upload, size


def _zoom(client: Any, upload: Upload) -> Any:
    return client.get(f"/s/{upload.code}/timeline.json?t0=0&t1=100&px=100")


def test_the_stores_of_an_upload_analysed_without_them_are_made_by_the_analysis_child(
    alice: Any, alpha: Any, alice_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    upload, size = _analysed_without_stores(alice, alpha)
    other = make_upload(alpha, alice, GPT_OOM)  # the same bytes again: one backfill serves both
    Upload.objects.filter(pk=other.pk).update(status=Upload.Status.DONE)
    counted = Upload.objects.get(pk=upload.pk).stored_bytes
    assert _zoom(alice_client, upload).status_code == 404  # explore:no-store, the web reads nothing
    report = upload.report.data
    queued: list[int] = []
    # The message (publish.publish_backfill, by name, reaches the registered task), not a worker.
    monkeypatch.setattr(backfill_explore, "apply_async", lambda args, kwargs=None, **_: queued.extend(args))
    out = io.StringIO()
    call_command("backfill_explore", stdout=out)
    assert queued == [upload.id] and "queued the explore stores of 1 uploads" in out.getvalue()
    backfill_explore(upload.id)  # what the worker runs
    zoom = _zoom(alice_client, upload)
    assert zoom.status_code == 200, zoom.content
    assert zoom.json()["points"] > 0
    after = Upload.objects.get(pk=upload.pk)
    assert after.stored_bytes == counted + size  # the team's quota counts the stores again
    assert after.status == Upload.Status.DONE and after.report.data == report  # the report stands
    # Done once: the bytes have their stores (the other upload's zoom too), and a second run finds nothing to do.
    assert _zoom(alice_client, other).status_code == 200
    call_command("backfill_explore", stdout=(again := io.StringIO()))
    assert queued == [upload.id] and "of 0 uploads" in again.getvalue()
    backfill_explore(upload.id)
    assert Upload.objects.get(pk=upload.pk).stored_bytes == counted + size


def test_the_backfill_runs_under_the_analysis_limits_and_leaves_the_report_when_refused(
    alice: Any, alpha: Any, alice_client: Any, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    upload, _size = _analysed_without_stores(alice, alpha)
    counted = Upload.objects.get(pk=upload.pk).stored_bytes
    # A CPU limit of 0 s: the child is stopped at once, as the analysis would be (snapshot:limit:time).
    settings.ANALYSIS_CPU_SECONDS = 0
    with caplog.at_level("WARNING", logger="webapp.snapshots.worker.tasks"):
        backfill_explore(upload.id)
    assert "explore stores not made: snapshot:limit:time: analysis used more than 0 s of CPU" in caplog.text
    assert not blobs.has_stores(upload.sha256)
    assert _zoom(alice_client, upload).status_code == 404
    after = Upload.objects.get(pk=upload.pk)
    assert after.status == Upload.Status.DONE and after.stored_bytes == counted and after.report.data
