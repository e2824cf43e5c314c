"""What the pages and the API read and answer with: a finished upload's stored report and charts,
and the plain dicts of uploads and projects the templates and the API render."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.urls import reverse

from analysis.stored import upgrade
from webapp.snapshots.models import Report, Upload
from webapp.snapshots.runs import followups
from webapp.snapshots.teams.shares import share_active, share_url_of

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User
    from django.http import HttpRequest

    AnyUser = User | AnonymousUser


def report_for(upload: Upload) -> Report | None:
    if upload.status != Upload.Status.DONE:
        return None
    return Report.objects.filter(upload=upload).first()


def report_charts(upload: Upload) -> dict[str, Any]:
    """The stored charts of a finished upload, without decoding its report (megabytes on a large trace)."""
    charts = Report.objects.filter(upload=upload).values_list("charts", flat=True).first()
    return charts if isinstance(charts, dict) else {}


def report_data(report: Report) -> dict[str, Any]:
    """A stored report's JSON in the current shape (``analysis.stored.upgrade``: one stored by an
    older worker gets the keys it lacks), as the API serves it."""
    return upgrade(report.data)


def upload_dict(upload: Upload, request: HttpRequest | None = None) -> dict[str, Any]:
    url = reverse("snapshots:detail", args=[upload.code])
    return {
        "code": upload.code,
        "filename": upload.filename,
        "bytes": upload.bytes,
        "project": upload.project.name,
        "project_slug": upload.project.slug,
        "run": upload.run,
        "tags": list(upload.tags or []),
        "note": upload.note,
        "status": upload.status,
        "progress": upload.progress,
        "stage": upload.stage,
        "error": {"code": upload.error_code, "message": upload.error_message} if upload.error_code else None,
        "created_at": upload.created_at.isoformat(),
        "summary": upload.summary,
        "url": request.build_absolute_uri(url) if request is not None else url,
        # The run it belongs to (issue 19): its page, and whether it regressed against the baseline.
        "run_url": reverse("snapshots:run", args=[upload.run_ref.code])
        if upload.run_ref_id and upload.run_ref
        else None,
        "run_regressed": bool(
            upload.run_ref_id and upload.run_ref and (upload.run_ref.regression or {}).get("regressed")
        ),
        # Follow-ups (issue 33): the incident this upload follows, and the outcome of the comparison.
        "follows_code": upload.follows.code if upload.follows_id and upload.follows else None,
        "followup_outcome": (upload.followup or {}).get("outcome"),
    }


def upload_api_dict(upload: Upload, request: HttpRequest, *, shared: bool | None = None) -> dict[str, Any]:
    if shared is None:
        shared = share_active(upload) is not None
    return {
        "id": upload.code,
        "status": upload.status,
        "progress": upload.progress,
        "stage": upload.stage,
        "error": {"code": upload.error_code, "message": upload.error_message} if upload.error_code else None,
        "url": request.build_absolute_uri(reverse("snapshots:detail", args=[upload.code])),
        "api_url": request.build_absolute_uri(reverse("api:snapshot", args=[upload.code])),
        # The newest live link (its URL is recomputed from its nonce); GET .../share lists them all.
        "share_url": share_url_of(upload, request) if shared else None,
        "shared": shared,
        "project": upload.project.slug,
        "run": upload.run,
        "tags": list(upload.tags or []),
        "filename": upload.filename,
        "bytes": upload.bytes,
        "sha256": upload.sha256,
        "created_at": upload.created_at.isoformat(),
        "summary": upload.summary,
        # Only a follow-up enters followups again: a plain upload's walk enters each module once.
        "follows": followups.follows_dict(upload, request) if upload.follows_id else None,
    }
