"""A report stored by an older worker reads as a current one on the page and through the API (issue 17):
both go through ``analysis.stored.upgrade``."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES, bearer, make_upload

pytestmark = pytest.mark.django_db


def _first_shape(report: dict[str, Any]) -> dict[str, Any]:
    """What the first workers stored: the inference as ``limit_source``, no other limit key, no decision."""
    old = copy.deepcopy(report)
    for dev in old["devices"]:
        oom = dev["oom"]
        oom["limit_source"] = oom.pop("limit_inference")
        del oom["limit_is_lower_bound"], oom["limit_kind"], dev["limit"], dev["decision"]
    return old


def test_an_old_stored_report_is_served_and_shown_in_the_current_shape(
    client: Any, alice: Any, alpha: Any, alice_token: str
) -> None:
    from webapp.snapshots.models import Report
    from webapp.snapshots.worker.tasks import analyse_upload

    upload = make_upload(alpha, alice, FIXTURES / "gpu_grow_oom.pickle.gz")
    analyse_upload(upload.id)
    row = Report.objects.get(upload=upload)
    current = row.data
    row.data = _first_shape(current)
    row.save(update_fields=["data"])

    served = client.get(f"/api/v1/snapshots/{upload.code}/report", **bearer(alice_token)).json()
    dev, now = served["devices"][0], current["devices"][0]
    assert dev["decision"]["change"] == now["decision"]["change"]
    assert dev["decision"]["headline"] == now["decision"]["headline"]
    assert dev["limit"]["bytes"] == now["limit"]["bytes"]
    assert dev["oom"]["limit_is_lower_bound"] is True
    assert "decision" not in Report.objects.get(upload=upload).data["devices"][0]  # the stored row is kept as it was

    client.force_login(alice)
    page = client.get(f"/s/{upload.code}/")
    assert page.status_code == 200
    assert now["decision"]["headline"] in page.content.decode()
