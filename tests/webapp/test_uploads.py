"""Upload intake: size caps answer 413 (API and page), obvious non-snapshots are refused at once."""

from __future__ import annotations

import gzip
import hashlib
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tests.webapp.helpers import GPT_OOM, bearer
from webapp.snapshots.models import Upload

pytestmark = pytest.mark.django_db

CAP = 64 * 1024


@pytest.fixture
def small_cap(settings: Any) -> int:
    settings.UPLOAD_MAX_BYTES = CAP
    return CAP


def big_file(size: int) -> SimpleUploadedFile:
    return SimpleUploadedFile("big.pickle", b"\x80\x04" + b"x" * (size - 2))


def test_api_oversize_is_413_json(client: Any, alice_token: str, small_cap: int) -> None:
    response = client.post("/api/v1/snapshots", {"file": big_file(small_cap * 3)}, **bearer(alice_token))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "upload:too-large"
    assert not Upload.objects.exists()


def test_file_dropped_mid_stream_is_413_not_200(client: Any, alice_token: str, small_cap: int) -> None:
    """The declared length passes the first check; the handler stops at the cap while streaming.

    A multipart body whose fields pad the Content-Length below cap+overhead while the
    file alone is over the cap reaches the handler, which drops the file.
    """
    response = client.post("/api/v1/snapshots", {"file": big_file(small_cap + 1)}, **bearer(alice_token))
    assert response.status_code == 413, response.content
    assert response.json()["error"]["code"] == "upload:too-large"
    assert not Upload.objects.exists()


def test_page_oversize_is_413(alice_client: Any, small_cap: int) -> None:
    response = alice_client.post("/upload/", {"file": big_file(small_cap * 3), "project": "alpha"})
    assert response.status_code == 413
    assert response["X-Error-Code"] == "upload:too-large"
    assert not Upload.objects.exists()


def test_page_oversize_is_413_even_without_csrf_token(alice: Any, alpha: Any, small_cap: int) -> None:
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    response = strict.post("/upload/", {"file": big_file(small_cap * 3), "project": "alpha"})
    assert response.status_code == 413


def test_page_upload_without_csrf_is_403(alice: Any, alpha: Any) -> None:
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    with open(GPT_OOM, "rb") as fh:
        response = strict.post("/upload/", {"file": fh, "project": "alpha"})
    assert response.status_code == 403
    assert not Upload.objects.exists()


def test_page_upload_redirects_to_status(alice_client: Any, django_capture_on_commit_callbacks: Any) -> None:
    with open(GPT_OOM, "rb") as fh, django_capture_on_commit_callbacks() as published:
        response = alice_client.post("/upload/", {"file": fh, "project": "alpha", "run": "r1", "tags": "a, b"})
    upload = Upload.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/s/{upload.code}/"
    assert len(published) == 1
    assert (upload.run, upload.tags, upload.status) == ("r1", ["a", "b"], "queued")
    status = alice_client.get(response["Location"])
    assert status.status_code == 200
    assert "snapshots/status.html" in [t.name for t in status.templates]


def test_page_xhr_upload_gets_json(alice_client: Any) -> None:
    with open(GPT_OOM, "rb") as fh:
        response = alice_client.post(
            "/upload/", {"file": fh, "project": "alpha"}, headers={"Accept": "application/json"}
        )
    assert response.status_code == 202
    assert response.json()["status"] == "queued"


def test_upload_page_context(alice_client: Any, settings: Any) -> None:
    response = alice_client.get("/upload/")
    assert response.status_code == 200
    assert response.context["max_upload_bytes"] == settings.UPLOAD_MAX_BYTES
    assert response.context["projects"] == [{"slug": "alpha", "name": "Alpha", "team": "Team A"}]
    assert set(response.context["form"].fields) == {
        "file",
        "project",
        "run",
        "tags",
        "note",
        "oom_message",
        "batch_size",
        "cap",  # the memory the run was allowed (issue 20)
        "follows",  # the incident this run follows, and what changed (issue 33)
        "changed",
        # the job (issue 19; forms.JOB_FIELDS)
        "rank",
        "world_size",
        "local_rank",
        "commit",
        "branch",
        "host",
        "torch_version",
        "job_id",
        "error",
    }


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b"", "snapshot:format:empty"),
        (b"<!doctype html><html><body>Sign in</body></html>", "snapshot:format:html"),
        (b"PK\x05\x06" + b"\0" * 18, "snapshot:format:not-a-snapshot"),
        (b"just some text\n", "snapshot:format:not-a-snapshot"),
        (gzip.compress(b"<html></html>"), "snapshot:format:not-a-snapshot"),
    ],
)
def test_obvious_non_snapshots_refused_at_once(
    client: Any, alice_token: str, content: bytes, code: str, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks() as published:
        response = client.post(
            "/api/v1/snapshots", {"file": SimpleUploadedFile("x.pickle", content)}, **bearer(alice_token)
        )
    assert response.status_code == 422, response.content
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"]
    assert not Upload.objects.exists() and not published  # nothing is queued for unpickling


def test_missing_file_is_400(client: Any, alice_token: str) -> None:
    response = client.post("/api/v1/snapshots", {"run": "x"}, **bearer(alice_token))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "upload:no-file"


def test_hostile_filename_is_display_only(client: Any, alice_token: str, settings: Any) -> None:
    data = GPT_OOM.read_bytes()
    name = "../../etc/\u202epasswd<script>.pickle.gz"
    response = client.post("/api/v1/snapshots", {"file": SimpleUploadedFile(name, data)}, **bearer(alice_token))
    assert response.status_code == 202
    upload = Upload.objects.get()
    assert upload.blob_name.startswith("sha256/") and ".." not in upload.blob_name
    stored = list((settings.MEDIA_ROOT / "sha256").rglob("*"))
    assert [p.name for p in stored if p.is_file()] == [upload.sha256]


def test_upload_is_streamed_to_a_temp_file() -> None:
    """Our handler never keeps an upload in memory, whatever its size."""
    from webapp.snapshots.intake.uploads import CappedHashingUploadHandler

    handler = CappedHashingUploadHandler()
    handler.new_file("file", "a.pickle", "application/octet-stream", 10)
    handler.receive_data_chunk(b"\x80\x04" + b"a" * 8, 0)
    uploaded = handler.file_complete(10)
    assert hasattr(uploaded, "temporary_file_path")
    assert uploaded.sha256 == hashlib.sha256(b"\x80\x04" + b"a" * 8).hexdigest()
    assert uploaded.head.startswith(b"\x80\x04")
    uploaded.close()


def test_page_xhr_invalid_form_gets_json_error(alice_client: Any) -> None:
    with open(GPT_OOM, "rb") as fh:
        response = alice_client.post(
            "/upload/", {"file": fh, "project": "nope"}, headers={"X-Requested-With": "XMLHttpRequest"}
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "upload:invalid"
    assert isinstance(error["message"], str) and "project" in error["message"]
    assert not Upload.objects.exists()


@pytest.mark.parametrize("size_over_cap", [False, True])
def test_temp_files_are_removed_after_the_request(
    client: Any,
    alice_token: str,
    settings: Any,
    tmp_path: Any,
    size_over_cap: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from webapp.snapshots.intake import blobs

    temp_dir = tmp_path / "upload-tmp"
    temp_dir.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(temp_dir)
    seen: list[str] = []
    store = blobs.store_blob
    monkeypatch.setattr(
        blobs,
        "store_blob",
        lambda uploaded, sha: (seen.append(uploaded.temporary_file_path()), store(uploaded, sha))[1],
    )
    if size_over_cap:
        settings.UPLOAD_MAX_BYTES = CAP
        response = client.post("/api/v1/snapshots", {"file": big_file(CAP + 1)}, **bearer(alice_token))
        assert response.status_code == 413
    else:
        with open(GPT_OOM, "rb") as fh:
            response = client.post("/api/v1/snapshots", {"file": fh}, **bearer(alice_token))
        assert response.status_code == 202
        assert len(seen) == 1 and seen[0].startswith(str(temp_dir))  # it was streamed there
    response.close()
    assert list(temp_dir.iterdir()) == []


def test_chunked_body_without_length_is_411(client: Any, alice_token: str) -> None:
    response = client.generic(
        "POST",
        "/api/v1/snapshots",
        b"",
        content_type="multipart/form-data; boundary=x",
        HTTP_TRANSFER_ENCODING="chunked",
        CONTENT_LENGTH="",
        **bearer(alice_token),
    )
    assert response.status_code == 411
    assert response.json()["error"]["code"] == "upload:length-required"


# --- limits at their boundaries: the cap, and the run / tags / note fields ------------------


@pytest.mark.parametrize("how", ["api", "page"])
def test_a_file_of_exactly_the_cap_is_accepted_and_one_byte_more_refused(
    client: Any, alice: Any, alice_token: str, small_cap: int, how: str
) -> None:
    def post(size: int) -> Any:
        data = {"file": big_file(size), "project": "alpha"}
        if how == "api":
            return client.post("/api/v1/snapshots", data, **bearer(alice_token))
        client.force_login(alice)
        return client.post("/upload/", data, headers={"Accept": "application/json"})

    at_cap = post(small_cap)
    assert at_cap.status_code == 202, at_cap.content
    assert Upload.objects.get().bytes == small_cap == 64 * 1024
    over = post(small_cap + 1)
    assert over.status_code == 413, over.content
    assert over.json()["error"]["code"] == "upload:too-large"
    assert over.json()["error"]["message"] == "The file is larger than the 64.0 KiB upload limit."
    assert Upload.objects.count() == 1


def test_the_declared_length_check_allows_the_cap_plus_the_multipart_overhead(small_cap: int) -> None:
    """Before reading a byte, a body up to cap + MULTIPART_OVERHEAD passes; one byte more is refused."""
    from django.test import RequestFactory

    from webapp.snapshots.intake.intake import content_length_over_cap
    from webapp.snapshots.intake.uploads import MULTIPART_OVERHEAD

    limit = small_cap + MULTIPART_OVERHEAD  # 64 KiB + 64 KiB = 131072 bytes
    factory = RequestFactory()
    assert not content_length_over_cap(factory.post("/", CONTENT_LENGTH=str(limit)))
    assert content_length_over_cap(factory.post("/", CONTENT_LENGTH=str(limit + 1)))
    assert not content_length_over_cap(factory.post("/", CONTENT_LENGTH="not-a-number"))


def test_a_declared_body_one_byte_over_is_refused_unread(client: Any, alice_token: str, small_cap: int) -> None:
    from webapp.snapshots.intake.uploads import MULTIPART_OVERHEAD

    response = client.generic(
        "POST",
        "/api/v1/snapshots",
        b"",
        content_type="multipart/form-data; boundary=x",
        CONTENT_LENGTH=str(small_cap + MULTIPART_OVERHEAD + 1),
        **bearer(alice_token),
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "upload:too-large"


# (field, the longest accepted value). The limits are forms.py's, shared by the page and the API.
FIELD_LIMITS = [("run", 200), ("tags", 500), ("note", 5000)]


def test_the_field_limits_are_one_definition() -> None:
    from webapp.snapshots.intake.forms import ApiUploadFieldsForm, UploadForm

    page = UploadForm(project_choices=[])
    api = ApiUploadFieldsForm()
    for field, limit in FIELD_LIMITS:
        assert page.fields[field].max_length == api.fields[field].max_length == limit, field


def _text(field: str, length: int) -> str:
    # Tags: comma-separated short tags, so the raw length is what is measured.
    return ("ab," * length)[:length] if field == "tags" else "x" * length


@pytest.mark.parametrize(("field", "limit"), FIELD_LIMITS)
@pytest.mark.parametrize("how", ["api", "page"])
def test_text_fields_at_their_limit_are_kept_and_one_more_is_refused(
    client: Any, alice: Any, alice_token: str, field: str, limit: int, how: str
) -> None:
    def post(value: str) -> Any:
        with open(GPT_OOM, "rb") as fh:
            data = {"file": fh, "project": "alpha", field: value}
            if how == "api":
                return client.post("/api/v1/snapshots", data, **bearer(alice_token))
            client.force_login(alice)
            return client.post("/upload/", data, headers={"Accept": "application/json"})

    at_limit = post(_text(field, limit))
    assert at_limit.status_code == 202, at_limit.content
    stored = Upload.objects.get()
    if field == "tags":
        # 500 characters of "ab," hold 167 tags ("ab" x 166, then "ab"); the row keeps the first 20.
        assert stored.tags == ["ab"] * 20
    else:
        assert getattr(stored, field) == "x" * limit
    over = post(_text(field, limit + 1))
    assert over.status_code == 400, over.content
    error = over.json()["error"]
    assert error["code"] == "upload:invalid"
    assert error["message"].startswith(f"{field}:") and str(limit) in error["message"]
    assert Upload.objects.count() == 1


def test_tags_are_split_trimmed_and_cut_at_50_characters(client: Any, alice_token: str) -> None:
    tags = " a ; b,," + "t" * 51 + ", " + "u" * 50
    with open(GPT_OOM, "rb") as fh:
        response = client.post("/api/v1/snapshots", {"file": fh, "tags": tags}, **bearer(alice_token))
    assert response.status_code == 202
    assert Upload.objects.get().tags == ["a", "b", "t" * 50, "u" * 50]


def _handler() -> Any:
    """The upload handler as Django drives it, on a bare request, one file begun."""
    from django.test import RequestFactory

    from webapp.snapshots.intake.uploads import CappedHashingUploadHandler

    handler = CappedHashingUploadHandler(RequestFactory().post("/"))
    handler.new_file("file", "x.pickle", "application/octet-stream", None, None)
    return handler


def test_the_sniffed_head_is_the_files_first_bytes_whatever_the_chunks() -> None:
    # Chunks of 10, 4,000 and 200 bytes: the head is the first SNIFF_BYTES (4,096) bytes of their
    # concatenation, 10 + 4,000 + 86 of the third, not the last chunk's slice nor more than 4,096.
    from webapp.snapshots.intake.uploads import SNIFF_BYTES

    chunks = [b"a" * 10, b"b" * 4000, bytes(range(200))]
    handler = _handler()
    for c in chunks:
        handler.receive_data_chunk(c, 0)
    uploaded = handler.file_complete(sum(map(len, chunks)))
    whole = b"".join(chunks)
    assert uploaded.head == whole[:SNIFF_BYTES] and len(uploaded.head) == 4096
    assert uploaded.sha256 == hashlib.sha256(whole).hexdigest()


def test_a_body_past_the_cap_stops_reading_at_once() -> None:
    # The chunk that passes the cap raises StopUpload(connection_reset=True): Django then stops
    # reading the body instead of draining the rest of a many-GB upload (connection_reset=False would
    # read it all to the end first).
    from django.core.files.uploadhandler import StopUpload
    from django.test import override_settings

    with override_settings(UPLOAD_MAX_BYTES=100):
        handler = _handler()
        handler.receive_data_chunk(b"x" * 100, 0)  # exactly the cap: kept
        with pytest.raises(StopUpload) as stop:
            handler.receive_data_chunk(b"x", 100)
    assert stop.value.connection_reset is True
    assert handler.request.upload_too_large is True
