"""The status page's estimate from this site's measured analysis times (``waiting.py``), on real analyses."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES, make_upload
from webapp.snapshots.models import Upload
from webapp.snapshots.pages import formatting, waiting
from webapp.snapshots.worker.tasks import analyse_upload

pytestmark = pytest.mark.django_db


def test_the_estimate_comes_from_the_analyses_this_site_measured(alice_client: Any, alice: Any, alpha: Any) -> None:
    for case in ("frag_oom", "infer_varbatch", "state_only"):  # small files: they give the base time
        analyse_upload(make_upload(alpha, alice, FIXTURES / f"{case}.pickle.gz").id)
    done = list(Upload.objects.filter(status=Upload.Status.DONE))
    assert len(done) == 3
    took = [(u.finished_at - u.started_at).total_seconds() for u in done]  # type: ignore[operator]
    queued = make_upload(alpha, alice, FIXTURES / "no_context.pickle.gz")
    status = alice_client.get(f"/s/{queued.code}/status.json").json()
    assert status["estimate_basis"] == "measured on this site's last 3 analyses"
    # The base is their median; with no large file measured, the per-MB rate is the fixed one, times this
    # file's few gzipped bytes (on a slow box a median of 1.91 s plus that rounds up to 3, not 2).
    small = statistics.median(took) + formatting.ESTIMATE_S_PER_GZ_MB * waiting.gz_mb(queued)
    assert status["estimate_s"] == max(1, math.ceil(small))
    assert status["waiting_for"] == "Waiting for a worker to take it."


def test_large_files_give_the_rate_per_megabyte(alice: Any, alpha: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    # Three measured analyses: two small (1 s, 3 s) and one of 10 gzipped MB that took 2 + 10 x 1.5 s.
    for size, seconds in ((200_000, 1.0), (300_000, 3.0), (10_000_000, 17.0)):
        row = make_upload(alpha, alice, FIXTURES / "frag_oom.pickle.gz")
        Upload.objects.filter(pk=row.pk).update(
            status=Upload.Status.DONE,
            bytes=size,
            started_at=now - timedelta(seconds=seconds),
            finished_at=now,
        )
    rates = waiting.measured_rates()
    assert (rates.base_s, rates.per_gz_mb_s, rates.samples) == (2.0, 1.5, 3)
