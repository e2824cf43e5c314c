"""The first answer (firstanswer.py, issue 34): the report stored and shown while the charts and stores come."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils.html import escape

from tests.webapp.helpers import FIXTURES, bearer, make_upload
from webapp.snapshots.models import Report, Upload
from webapp.snapshots.pages import firstanswer
from webapp.snapshots.worker import jobs, runner, tasks

pytestmark = pytest.mark.django_db

GPT_OOM = FIXTURES / "gpt_varlen_oom.pickle.gz"


def _report() -> dict[str, Any]:
    limits = runner.limits_for(GPT_OOM, per_byte=6, minimum=1 << 30, maximum=4 << 30, cpu=120, wall=120)
    return runner.run_child(GPT_OOM, limits).report


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return _report()


def _running(alpha: Any, alice: Any) -> Upload:
    from django.utils import timezone

    return make_upload(alpha, alice, GPT_OOM, status=Upload.Status.RUNNING, started_at=timezone.now(), attempts=1)


def test_the_worker_stores_the_report_while_the_upload_still_runs(
    alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, bool, str]] = []
    real = firstanswer.store

    def store(upload_id: int, report: dict[str, Any]) -> bool:
        stored = real(upload_id, report)
        row = Upload.objects.get(pk=upload_id)
        seen.append((row.status, Report.objects.filter(upload_id=upload_id, charts={}).exists(), row.stage))
        return stored

    monkeypatch.setattr(firstanswer, "store", store)
    upload = make_upload(alpha, alice, GPT_OOM)
    tasks.analyse_upload(upload.id)
    upload.refresh_from_db()
    assert seen == [(Upload.Status.RUNNING, True, firstanswer.STAGE)]
    assert upload.status == Upload.Status.DONE
    final = Report.objects.get(upload=upload)
    assert "timeline-0" in final.charts  # the charts came after, into the same row
    assert final.data["devices"][0]["oom"]["verdict"] == "fragmentation"


def test_a_first_answer_is_on_the_page_with_what_is_still_coming(
    alice_client: Any, alice: Any, alpha: Any, report: dict[str, Any]
) -> None:
    upload = _running(alpha, alice)
    status = alice_client.get(f"/s/{upload.code}/status.json").json()
    assert status["parts"] == {"report": False, "charts": False, "stores": False}
    assert status["coming"] == [] and status["remaining_s"] is None
    assert firstanswer.store(upload.id, report)
    status = alice_client.get(f"/s/{upload.code}/status.json").json()
    assert status["status"] == "running" and status["stage"] == "answered"
    assert status["parts"] == {"report": True, "charts": False, "stores": False}
    assert status["coming"] == ["charts", "digging data"]
    assert isinstance(status["remaining_s"], int) and status["remaining_s"] >= 1
    page = alice_client.get(f"/s/{upload.code}/").content.decode()
    headline = report["devices"][0]["decision"]["headline"]
    assert 'data-first-answer="1"' in page and "Still coming" in page
    assert 'class="decision"' in page and escape(headline) in page
    assert 'data-chart="timeline-0"' not in page  # no chart until they come
    assert "js/status.js" in page


def test_the_api_serves_the_first_answer_and_says_which_parts_are_ready(
    client: Any, alice_token: str, alice: Any, alpha: Any, report: dict[str, Any]
) -> None:
    upload = _running(alpha, alice)
    assert client.get(f"/api/v1/snapshots/{upload.code}/report", **bearer(alice_token)).status_code == 404
    firstanswer.store(upload.id, report)
    body = client.get(f"/api/v1/snapshots/{upload.code}", **bearer(alice_token)).json()
    assert body["status"] == "running" and body["parts"]["report"] and not body["parts"]["charts"]
    served = client.get(f"/api/v1/snapshots/{upload.code}/report", **bearer(alice_token))
    assert served.status_code == 200
    assert served.json()["devices"][0]["decision"] == report["devices"][0]["decision"]
    jobs.upload_finish(upload.id, report=report, charts={"x": {}})
    body = client.get(f"/api/v1/snapshots/{upload.code}", **bearer(alice_token)).json()
    assert body["status"] == "done" and body["parts"] == {"report": True, "charts": True, "stores": True}
    assert body["coming"] == [] and body["remaining_s"] is None


def test_a_first_answer_of_an_upload_that_failed_after_it_is_not_shown(
    alice_client: Any, alice: Any, alpha: Any, report: dict[str, Any]
) -> None:
    upload = _running(alpha, alice)
    firstanswer.store(upload.id, report)
    jobs.upload_fail(upload.id, "worker:internal")
    page = alice_client.get(f"/s/{upload.code}/").content.decode()
    assert 'class="decision"' not in page and "failed" in page
    assert alice_client.get(f"/s/{upload.code}/status.json").json()["parts"]["report"] is False


def test_no_first_answer_is_stored_for_an_upload_not_running(alice: Any, alpha: Any, report: dict[str, Any]) -> None:
    upload = make_upload(alpha, alice, GPT_OOM)  # queued: not claimed by this worker
    assert firstanswer.store(upload.id, report) is False
    assert not Report.objects.filter(upload=upload).exists()


def test_a_first_answer_that_cannot_be_written_leaves_the_upload_to_its_final_write(
    alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    def full(upload_id: int, report: dict[str, Any]) -> bool:
        raise OperationalError("database or disk is full")

    monkeypatch.setattr(firstanswer, "store", full)
    upload = make_upload(alpha, alice, GPT_OOM)
    tasks.analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == Upload.Status.DONE, upload.error_message
    assert Report.objects.get(upload=upload).data["devices"][0]["oom"]["verdict"] == "fragmentation"
