"""The capture doctor at intake: a 0-byte file is refused with the call that would have written it, and a
real capture that reads but cannot answer fully (a wrapped ring, state only) is analysed with the doctor's line
on its report, in the API's JSON and on the page (``analysis/doctor.py``, ``_report_body.html``)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.utils.html import escape

from tests.webapp.helpers import FIXTURES, bearer, make_upload
from webapp.snapshots.worker.tasks import analyse_upload

pytestmark = pytest.mark.django_db


def test_a_0_byte_file_is_refused_with_what_to_do(client: Any, alice_token: str) -> None:
    empty = io.BytesIO(b"")
    empty.name = "oom.pickle.gz"
    response = client.post("/api/v1/snapshots", {"file": empty, "project": "alpha"}, **bearer(alice_token))
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "snapshot:format:empty"
    assert error["message"].startswith("The file is empty (0 bytes): the dump never finished")
    assert "torch.cuda.memory._dump_snapshot(path)" in error["message"]


@pytest.mark.parametrize(
    ("case", "code", "fix"),
    [
        ("wrapped_ring", "trace-truncated", "torch.cuda.memory._record_memory_history(max_entries=1_000_000)"),
        ("state_only", "state-only", 'torch.cuda.memory._record_memory_history(enabled="all", max_entries=1_000_000)'),
    ],
)
def test_a_usable_capture_carries_the_doctors_line(
    alice_client: Any, alice_token: str, alice: Any, alpha: Any, case: str, code: str, fix: str
) -> None:
    upload = make_upload(alpha, alice, FIXTURES / f"{case}.pickle.gz")
    analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == "done", upload.error_message
    report = alice_client.get(f"/api/v1/snapshots/{upload.code}/report", **bearer(alice_token)).json()
    (finding,) = [f for f in report["capture"]["doctor"] if f["code"] == code]
    assert finding["fix"].startswith(fix)
    page = alice_client.get(f"/s/{upload.code}/").content.decode()
    assert 'aria-label="How this file was captured"' in page
    assert f'data-code="{code}"' in page and escape(finding["fix"]) in page
