"""The first answer: an upload's report stored and shown before its charts and digging stores (issue 34).

The analysis child writes the report, then the explore stores, then the charts (``child.py``). The
report is the user's answer (the headline, the decision and the what-ifs it cites, the timeline's
figures) and it is final: the stages after it add charts and stores and change none of its bytes.
So the worker stores it as soon as it exists (``store``, called from ``runner.run_child``'s
``on_report``), in the upload's ``Report`` row with no charts yet, the upload still running; the
page shows it at once and says what is still coming (``parts``); ``jobs.upload_finish`` later
writes the same report with its charts and marks the upload done.

``payloads.report_for`` keeps serving done uploads only: every list, comparison, history and quota
reads finished reports as before. The page, the status poll and the API's report ask ``report_for``
here, which adds the running upload's first answer.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from webapp.snapshots.models import Report, Upload
from webapp.snapshots.pages import waiting

STAGE = "answered"  # the stage a running upload shows once its report is stored
COMING = ("charts", "digging data")  # what a running upload with its first answer still waits for


def store(upload_id: int, report: dict[str, Any]) -> bool:
    """Store ``report`` as the running upload's first answer; False when it is no longer running
    (deleted, failed or finished meanwhile: nothing stored)."""
    with transaction.atomic():
        if not Upload.objects.select_for_update().filter(pk=upload_id, status=Upload.Status.RUNNING).exists():
            return False
        Report.objects.update_or_create(upload_id=upload_id, defaults={"data": report, "charts": {}})
        Upload.objects.filter(pk=upload_id, status=Upload.Status.RUNNING).update(
            stage=STAGE, heartbeat_at=timezone.now()
        )
    return True


def report_for(upload: Upload) -> Report | None:
    """The upload's report: the final one once done, the first answer while it runs, else None."""
    if upload.status not in (Upload.Status.DONE, Upload.Status.RUNNING):
        return None
    return Report.objects.filter(upload=upload).first()


def has_first_answer(upload: Upload) -> bool:
    return upload.status == Upload.Status.RUNNING and Report.objects.filter(upload=upload).exists()


def parts(upload: Upload) -> dict[str, Any]:
    """Which parts of the outcome are ready, what is still coming and about how long it takes (the
    status poll's and the API's ``parts``, ``coming``, ``remaining_s``; docs/contract.md)."""
    done = upload.status == Upload.Status.DONE
    answered = done or has_first_answer(upload)
    coming = [] if done or not answered else list(COMING)
    return {
        "parts": {"report": answered, "charts": done, "stores": done},
        "coming": coming,
        "remaining_s": remaining_s(upload) if coming else None,
    }


def remaining_s(upload: Upload) -> int:
    """Seconds the rest should take: this file's whole estimate (its size at the site's measured
    rates, ``waiting``) less the time it has run, never under one second."""
    estimate = waiting.estimate_s(upload, waiting.measured_rates())
    ran = (timezone.now() - upload.started_at).total_seconds() if upload.started_at else 0.0
    return max(1, int(estimate - ran + 0.999))
