"""Issue 11: quotas and rate limits, DELETE, input hygiene, idempotency, broker outage, the read paths.

Every upload here is a real fixture (gpt_varlen_oom, 63 KB gzipped); sizes are read from the
file, never copied.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import tenacity
from django.core.files.storage import default_storage
from django.urls import reverse
from django.utils import timezone

from tests.webapp.helpers import FIXTURES, GPT_OOM, bearer, make_upload
from webapp.snapshots.intake import blobs
from webapp.snapshots.intake.forms import NOTE_MAX_CHARS
from webapp.snapshots.models import ApiToken, Report, ShareLink, Upload
from webapp.snapshots.teams import access, membership, shares, tokens
from webapp.snapshots.worker import jobs, tasks

pytestmark = pytest.mark.django_db

SIZE = GPT_OOM.stat().st_size


def post(client: Any, token: str, path: Path = GPT_OOM, headers: dict[str, str] | None = None, **fields: Any) -> Any:
    extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()}
    with open(path, "rb") as fh:
        return client.post("/api/v1/snapshots", {"file": fh, **fields}, **bearer(token), **extra)


def error_of(response: Any) -> str:
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    code: str = response.json()["error"]["code"]
    return code


# --- quotas and rate limits ------------------------------------------------------------------


def test_team_quota_refuses_the_upload_that_would_pass_it(
    client: Any, alice_token: str, alice_client: Any, settings: Any
) -> None:
    settings.TEAM_STORAGE_QUOTA_BYTES = 2 * SIZE + 10  # room for two copies of the file, not three
    assert post(client, alice_token).status_code == 202
    assert post(client, alice_token).status_code == 202
    refused = post(client, alice_token)
    assert refused.status_code == 413 and error_of(refused) == "upload:quota-exceeded"
    assert "quota" in refused.json()["error"]["message"]
    # The page form is held to the same quota.
    with open(GPT_OOM, "rb") as fh:
        page = alice_client.post("/upload/", {"file": fh, "project": "alpha"}, HTTP_ACCEPT="application/json")
    assert page.status_code == 413 and error_of(page) == "upload:quota-exceeded"
    assert Upload.objects.count() == 2
    # Deleting one frees its bytes: the next upload fits again.
    code = Upload.objects.first().code  # type: ignore[union-attr]
    assert client.delete(f"/api/v1/snapshots/{code}", **bearer(alice_token)).status_code == 200
    assert post(client, alice_token).status_code == 202


def test_token_rate_limit_is_429_with_retry_after(client: Any, alice_token: str, settings: Any) -> None:
    settings.UPLOAD_RATE_PER_TOKEN = "2/m"
    assert [post(client, alice_token).status_code for _ in range(2)] == [202, 202]
    limited = post(client, alice_token)
    assert limited.status_code == 429 and error_of(limited) == "upload:rate-limited:token"
    assert 1 <= int(limited["Retry-After"]) <= 60
    assert Upload.objects.count() == 2


def test_user_rate_limit_spans_tokens_and_the_page(
    client: Any, alice: Any, alpha: Any, alice_client: Any, settings: Any
) -> None:
    settings.UPLOAD_RATE_PER_USER = "3/h"
    first, second = (tokens.api_token_create(alice, default_project=alpha) for _ in range(2))
    assert post(client, first).status_code == 202
    assert post(client, second).status_code == 202
    with open(GPT_OOM, "rb") as fh:
        assert alice_client.post("/upload/", {"file": fh, "project": "alpha"}).status_code == 302
    limited = post(client, second)
    assert limited.status_code == 429 and error_of(limited) == "upload:rate-limited:user"
    assert Upload.objects.count() == 3


def test_login_rate_limit_per_username(client: Any, django_user_model: Any, settings: Any) -> None:
    settings.LOGIN_RATE_PER_USERNAME = "3/m"
    django_user_model.objects.create_user("carol-rl", password="pw-carol-123")
    wrong = {"username": "carol-rl", "password": "wrong"}
    statuses = [client.post("/accounts/login/", wrong, REMOTE_ADDR="10.0.0.7").status_code for _ in range(3)]
    assert statuses == [200, 200, 200]  # the form again, with its error
    # Fourth try in the minute: refused without checking the password, even the right one.
    right = {"username": "carol-rl", "password": "pw-carol-123"}
    limited = client.post("/accounts/login/", right, REMOTE_ADDR="10.0.0.8")
    assert limited.status_code == 429 and limited["X-Error-Code"] == "login:rate-limited"
    assert b"Too many sign-in attempts" in limited.content
    assert "_auth_user_id" not in client.session
    as_json = client.post("/accounts/login/", right, HTTP_ACCEPT="application/json", REMOTE_ADDR="10.0.0.9")
    assert as_json.status_code == 429 and error_of(as_json) == "login:rate-limited"


# --- deleting ---------------------------------------------------------------------------------


def test_api_delete_removes_row_report_links_and_file(
    client: Any, alice: Any, alpha: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    upload = make_upload(alpha, alice)
    tasks.analyse_upload(upload.id)
    shares.share_create(upload, alice)
    assert default_storage.exists(upload.blob_name) and Report.objects.filter(upload=upload).exists()
    store = f"explore/{upload.sha256}/0.npz"  # the worker's explore store (webapp/snapshots/pages/digging.py)
    assert default_storage.exists(store)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.delete(f"/api/v1/snapshots/{upload.code}", **bearer(alice_token))
    assert response.status_code == 200 and response.json() == {"id": upload.code, "deleted": True}
    assert not Upload.objects.filter(pk=upload.pk).exists()
    assert not Report.objects.exists() and not ShareLink.objects.exists()
    assert not default_storage.exists(upload.blob_name)
    assert not default_storage.exists(store)
    again = client.delete(f"/api/v1/snapshots/{upload.code}", **bearer(alice_token))
    assert again.status_code == 404 and error_of(again) == "not-found"


def test_delete_keeps_a_file_another_upload_still_uses(
    client: Any, alice: Any, alpha: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    first, second = make_upload(alpha, alice), make_upload(alpha, alice)  # same bytes, one blob
    with django_capture_on_commit_callbacks(execute=True):
        assert client.delete(f"/api/v1/snapshots/{first.code}", **bearer(alice_token)).status_code == 200
    assert default_storage.exists(second.blob_name)
    with django_capture_on_commit_callbacks(execute=True):
        assert client.delete(f"/api/v1/snapshots/{second.code}", **bearer(alice_token)).status_code == 200
    assert not default_storage.exists(second.blob_name)


def test_delete_by_another_team_is_404_and_by_a_plain_member_403(
    client: Any, alice: Any, alpha: Any, bob: Any, bob_token: str
) -> None:
    upload = make_upload(alpha, alice)
    assert client.delete(f"/api/v1/snapshots/{upload.code}", **bearer(bob_token)).status_code == 404
    membership.membership_add(team=alpha.team, user=bob)  # a member, not an owner, not the uploader
    forbidden = client.delete(f"/api/v1/snapshots/{upload.code}", **bearer(bob_token))
    assert forbidden.status_code == 403 and error_of(forbidden) == "forbidden"
    assert Upload.objects.filter(pk=upload.pk).exists()


def test_page_delete_button_posts_with_csrf(alice: Any, alpha: Any, django_capture_on_commit_callbacks: Any) -> None:
    from django.test import Client

    upload = make_upload(alpha, alice)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(alice)
    page = browser.get(reverse("snapshots:detail", args=[upload.code]))
    action = reverse("snapshots:delete", args=[upload.code])
    assert f'action="{action}"' in page.content.decode()
    assert browser.post(action).status_code == 403  # no CSRF token: refused
    assert Upload.objects.filter(pk=upload.pk).exists()
    token = page.cookies["csrftoken"].value
    with django_capture_on_commit_callbacks(execute=True):
        response = browser.post(action, {"csrfmiddlewaretoken": token})
    assert response.status_code == 302 and response["Location"] == reverse("snapshots:history", args=["alpha"])
    assert not Upload.objects.filter(pk=upload.pk).exists()
    assert not default_storage.exists(upload.blob_name)


def test_admin_delete_removes_the_file(
    client: Any, alice: Any, alpha: Any, django_user_model: Any, django_capture_on_commit_callbacks: Any
) -> None:
    upload = make_upload(alpha, alice)
    admin = django_user_model.objects.create_superuser("root", password="pw-root-123")
    client.force_login(admin)
    url = reverse("admin:snapshots_upload_delete", args=[upload.pk])
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url, {"post": "yes"})
    assert response.status_code == 302
    assert not Upload.objects.filter(pk=upload.pk).exists()
    assert not default_storage.exists(upload.blob_name)


def test_failed_uploads_files_are_purged_after_retention(
    alice: Any, alpha: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.FAILED_UPLOAD_RETENTION_SECONDS = 3600
    old = timezone.now() - timedelta(seconds=3601)
    expired = make_upload(alpha, alice, FIXTURES / "frag_oom.pickle.gz", status="failed", finished_at=old)
    recent = make_upload(alpha, alice, FIXTURES / "no_context.pickle.gz", status="failed", finished_at=timezone.now())
    kept_done = make_upload(alpha, alice, FIXTURES / "state_only.pickle.gz", status="done", finished_at=old)
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.purge_failed_uploads() == 1
    assert not default_storage.exists(expired.blob_name)
    assert default_storage.exists(recent.blob_name) and default_storage.exists(kept_done.blob_name)
    expired.refresh_from_db()
    assert expired.blob_name == "" and expired.status == "failed"  # the row and its reason stay
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.purge_failed_uploads() == 0  # nothing left to purge
    from django.conf import settings as live

    assert "snapshots.purge_failed_uploads" in {e["task"] for e in live.CELERY_BEAT_SCHEDULE.values()}


# --- input hygiene ----------------------------------------------------------------------------


@pytest.mark.parametrize("username", ["dot.user@x", "a+b@example.com", "UPPER_case.name", "@.+"])
def test_any_valid_username_gets_a_working_slug(client: Any, django_user_model: Any, username: str) -> None:
    response = client.post(
        "/accounts/signup/", {"username": username, "password1": "Pw-long-enough-1", "password2": "Pw-long-enough-1"}
    )
    assert response.status_code == 302, response.content[:500]
    project = access.visible_projects(django_user_model.objects.get(username=username)).get()
    assert project.slug and all(c.isalnum() or c == "-" for c in project.slug), project.slug
    assert client.get("/").status_code == 200
    assert client.get(reverse("snapshots:history", args=[project.slug])).status_code == 200
    assert client.get("/upload/").status_code == 200


def test_multipart_without_boundary_is_json_400(client: Any, alice_token: str) -> None:
    response = client.generic(
        "POST", "/api/v1/snapshots", b"--x\r\n", content_type="multipart/form-data", **bearer(alice_token)
    )
    assert response.status_code == 400 and error_of(response) == "upload:bad-multipart"


def test_two_files_is_json_400(client: Any, alice_token: str) -> None:
    with open(GPT_OOM, "rb") as a, open(FIXTURES / "frag_oom.pickle.gz", "rb") as b:
        response = client.post("/api/v1/snapshots", {"file": [a, b]}, **bearer(alice_token))
    assert response.status_code == 400 and error_of(response) == "upload:too-many-files"
    assert not Upload.objects.exists()


def test_oversized_text_fields_are_json_413(client: Any, alice_token: str, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    response = post(client, alice_token, note="x" * 20_000)
    assert response.status_code == 413 and error_of(response) == "upload:fields-too-large"


def test_session_api_call_with_unparseable_body_is_json(alice_client: Any) -> None:
    # The CSRF check reads the body first; its parse error must still come back as JSON.
    response = alice_client.generic("POST", "/api/v1/snapshots", b"--x\r\n", content_type="multipart/form-data")
    assert response["Content-Type"].startswith("application/json")
    assert response.status_code in (400, 403)


def test_form_and_api_share_the_note_limit(client: Any, alice_token: str, alice_client: Any) -> None:
    at_limit = post(client, alice_token, note="n" * NOTE_MAX_CHARS)
    assert at_limit.status_code == 202
    assert len(Upload.objects.get(code=at_limit.json()["id"]).note) == 5000
    over = post(client, alice_token, note="n" * (NOTE_MAX_CHARS + 1))
    assert over.status_code == 400 and error_of(over) == "upload:invalid"
    assert over.json()["error"]["message"].startswith("note:")
    with open(GPT_OOM, "rb") as fh:
        page = alice_client.post(
            "/upload/", {"file": fh, "project": "alpha", "note": "n" * 5001}, HTTP_ACCEPT="application/json"
        )
    assert page.status_code == 400 and "note" in page.json()["error"]["message"]
    assert Upload.objects.count() == 1


# --- idempotency and broker outages -------------------------------------------------------------


def test_same_idempotency_key_same_upload(client: Any, alice_token: str, bob_token: str) -> None:
    key = {"Idempotency-Key": "job-17-try"}
    first = post(client, alice_token, headers=key)
    again = post(client, alice_token, headers=key)
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json()["id"] == first.json()["id"] and again["Idempotent-Replayed"] == "true"
    assert Upload.objects.count() == 1
    # Another file under the same key is a conflict, not a silent replay.
    other = post(client, alice_token, FIXTURES / "frag_oom.pickle.gz", headers=key)
    assert other.status_code == 409 and error_of(other) == "upload:idempotency-conflict"
    # Keys are per user: Bob's same key is his own upload.
    bobs = post(client, bob_token, headers=key)
    assert bobs.status_code == 202 and bobs.json()["id"] != first.json()["id"]
    bad = post(client, alice_token, headers={"Idempotency-Key": "x" * 101})
    assert bad.status_code == 400 and error_of(bad) == "upload:bad-idempotency-key"


def test_replay_is_not_refused_by_the_rate_limit(client: Any, alice_token: str, settings: Any) -> None:
    settings.UPLOAD_RATE_PER_TOKEN = "1/m"
    key = {"Idempotency-Key": "retry-after-timeout"}
    assert post(client, alice_token, headers=key).status_code == 202
    assert post(client, alice_token, headers=key).status_code == 200  # a retry, not a new upload
    assert post(client, alice_token).status_code == 429


@pytest.mark.django_db(transaction=True)  # on_commit runs inside the request, as in production
def test_broker_down_answers_queued_publish_pending_and_sweep_sends_it(
    client: Any, alice_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The publish fails as kombu fails when Redis is down (the real outage: make reliability)."""
    from kombu.exceptions import OperationalError

    def broker_down(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(tasks.analyse_upload_task, "apply_async", broker_down)
    response = post(client, alice_token, headers={"Idempotency-Key": "outage-1"})
    retried = post(client, alice_token, headers={"Idempotency-Key": "outage-1"})
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["status"], body["publish"]) == ("queued", "pending")
    assert "queue is unreachable" in body["note"]
    assert retried.json()["id"] == body["id"] and Upload.objects.count() == 1
    row = Upload.objects.get(code=body["id"])
    assert (row.status, row.queued_at) == ("queued", None)  # what the answer said was stored
    published: list[int] = []
    monkeypatch.setattr(tasks.analyse_upload_task, "delay", lambda upload_id: published.append(upload_id))
    assert tasks.sweep_uploads() == 1 and published == [row.id]


# --- concurrency on the default database ------------------------------------------------------


def test_sqlite_runs_wal_with_immediate_transactions(tmp_path: Path) -> None:
    """The site's SQLite settings, opened for real (also when this run's own database is PostgreSQL)."""
    from django.db.backends.sqlite3.base import DatabaseWrapper

    from webapp.settings import database_from_url

    db = database_from_url(f"sqlite:///{tmp_path / 'wal.sqlite3'}")
    assert db["OPTIONS"]["transaction_mode"] == "IMMEDIATE"  # type: ignore[index]
    wrapper = DatabaseWrapper(
        {
            **db,
            "TIME_ZONE": None,
            "CONN_HEALTH_CHECKS": False,
            "CONN_MAX_AGE": 0,
            "AUTOCOMMIT": True,
            "ATOMIC_REQUESTS": False,
        },
        alias="wal-check",
    )
    try:
        with wrapper.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode")
            assert cursor.fetchone()[0] == "wal"
            cursor.execute("PRAGMA synchronous")
            assert cursor.fetchone()[0] == 1  # NORMAL
    finally:
        wrapper.close()


def test_finish_is_retried_on_a_transient_lock(alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import OperationalError

    from webapp.snapshots.models import Report as ReportModel

    upload = make_upload(alpha, alice, status="running")
    real = ReportModel.objects.update_or_create
    calls = {"n": 0}

    def locked_twice(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise OperationalError("database is locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(ReportModel.objects, "update_or_create", locked_twice)
    monkeypatch.setattr(jobs.upload_finish.retry, "wait", tenacity.wait_none())  # no sleeping in tests
    jobs.upload_finish(upload.id, report={"devices": []}, charts={})
    upload.refresh_from_db()
    assert upload.status == "done" and calls["n"] == 3


def test_read_paths_write_at_most_once_a_minute(client: Any, alice: Any, alice_token: str) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    token = ApiToken.objects.get(user=alice)
    assert token.last_used_at is None
    client.get("/api/v1/projects/alpha/runs", **bearer(alice_token))
    token.refresh_from_db()
    first_use = token.last_used_at
    assert first_use is not None
    with CaptureQueriesContext(connection) as queries:
        for _ in range(5):
            assert client.get("/api/v1/projects/alpha/runs", **bearer(alice_token)).status_code == 200
    writes = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert writes == []  # five calls within the minute: no write
    token.refresh_from_db()
    assert token.last_used_at == first_use
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first_use - timedelta(minutes=2))
    client.get("/api/v1/projects/alpha/runs", **bearer(alice_token))
    token.refresh_from_db()
    assert token.last_used_at > first_use  # older than a minute: written again


def test_share_view_survives_a_locked_counter(
    client: Any, alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    upload = make_upload(alpha, alice)
    tasks.analyse_upload(upload.id)
    token = shares.share_create(upload, alice)
    assert client.get(f"/r/{token}/").status_code == 200
    assert ShareLink.objects.get().use_count == 1

    def locked(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("database is locked")

    monkeypatch.setattr("django.db.models.query.QuerySet.update", locked)
    assert client.get(f"/r/{token}/").status_code == 200  # the page, without the count


def test_api_answers_json_503_while_the_database_is_unreachable(
    client: Any, alice_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    def down(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("connection to server at 127.0.0.1, port 5432 failed: Connection refused")

    monkeypatch.setattr(tokens, "api_token_user", down)
    response = client.get("/api/v1/projects/alpha/runs", **bearer(alice_token))
    assert response.status_code == 503 and error_of(response) == "service:database-unavailable"
    assert response["Retry-After"] == "5"


@pytest.mark.django_db(transaction=True)
def test_client_library_retry_with_its_key_makes_no_duplicate(
    live_server: Any, alice_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real client against the real site: every call sends an Idempotency-Key; the same key again
    (a retry after a timeout) returns the first upload."""
    import sys

    from tests.webapp.helpers import ROOT

    monkeypatch.syspath_prepend(str(ROOT / "client"))
    sys.modules.pop("oomscope_client.upload", None)
    from oomscope_client.upload import upload

    monkeypatch.setattr(tasks.analyse_upload_task, "apply_async", lambda *a, **k: None)  # no worker here
    first = upload(GPT_OOM, live_server.url, alice_token, idempotency_key="job-17-attempt")
    again = upload(GPT_OOM, live_server.url, alice_token, idempotency_key="job-17-attempt")
    assert again["id"] == first["id"] and Upload.objects.count() == 1
    fresh = upload(GPT_OOM, live_server.url, alice_token)  # no key given: the client makes one
    row = Upload.objects.get(code=fresh["id"])
    assert row.idempotency_key.startswith("oomscope-") and len(row.idempotency_key) > 20
    assert Upload.objects.count() == 2


def test_2kb_pickle_with_a_4300_digit_int_is_refused_with_its_code(alice: Any, alpha: Any, tmp_path: Path) -> None:
    """The issue's case: repr() of an int past 4,300 digits raises, and the reader's message used it."""
    import pickle
    import sys

    huge = int.from_bytes(b"\xff" * 1800, "little")  # 2**14400 - 1: 4,335 decimal digits, built without str()
    assert huge.bit_length() * 0.30103 > sys.get_int_max_str_digits()
    path = tmp_path / "bigint.pickle"
    path.write_bytes(pickle.dumps({"segments": [{"device": huge}], "device_traces": []}, protocol=4))
    assert path.stat().st_size < 2048
    upload = make_upload(alpha, alice, path)
    tasks.analyse_upload(upload.id)
    upload.refresh_from_db()
    assert (upload.status, upload.error_code) == ("failed", "snapshot:schema:int-range"), upload.error_message
    assert "an int of 14400 bits" in upload.error_message


def test_upload_deleted_during_its_analysis_keeps_no_report(alice: Any, alpha: Any) -> None:
    upload = make_upload(alpha, alice, status="running")
    upload_id = upload.id
    blobs.upload_delete(upload)
    jobs.upload_finish(upload_id, report={"devices": []}, charts={})  # the worker finishing late
    assert not Report.objects.exists() and not Upload.objects.filter(pk=upload_id).exists()
