"""Issue 20, item 6: JSON that is no memory snapshot is refused at intake (before it is stored or
queued), while the JSON form torch's viewer reads still uploads and analyses to the same figures."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES, bearer
from webapp.snapshots.intake.jsonsniff import foreign_json
from webapp.snapshots.models import Upload
from webapp.snapshots.worker.tasks import analyse_upload

pytestmark = pytest.mark.django_db

FRAG = FIXTURES / "frag_oom.pickle.gz"
FRAG_TRUTH = json.loads((FIXTURES / "frag_oom.truth.json").read_text())


def json_form(path: Path) -> bytes:
    """A fixture in the JSON form memory_viz reads: the same dict, tuples (pool ids) as lists."""
    snapshot = pickle.loads(gzip.decompress(path.read_bytes()))  # our own fixture, not an upload
    return json.dumps(snapshot).encode()


def post_bytes(client: Any, token: str, tmp_path: Path, name: str, data: bytes) -> Any:
    path = tmp_path / name
    path.write_bytes(data)
    with open(path, "rb") as fh:
        return client.post("/api/v1/snapshots", {"file": fh}, **bearer(token))


def test_the_json_form_of_a_real_snapshot_uploads_and_analyses_to_its_figures(
    client: Any, alice_token: str, tmp_path: Path, django_capture_on_commit_callbacks: Any
) -> None:
    data = json_form(FRAG)
    assert len(data) > 4096  # the sniff sees only the head: 'segments' opens and runs past it
    for name, body in (("frag.json", data), ("frag.json.gz", gzip.compress(data))):
        with django_capture_on_commit_callbacks() as published:
            response = post_bytes(client, alice_token, tmp_path, name, body)
        assert response.status_code == 202, response.content
        assert len(published) == 1
        upload = Upload.objects.get(code=response.json()["id"])
        analyse_upload(upload.id)
        upload.refresh_from_db()
        assert upload.status == "done", (upload.error_code, upload.error_message)
        summary = upload.summary
        assert summary["peak_reserved_bytes"] == FRAG_TRUTH["memory_stats"]["reserved_bytes.all.peak"]
        assert summary["oom"] is True


CHROME_TRACE = {
    "schemaVersion": 1,
    "traceEvents": [{"name": "aten::mm", "ph": "X", "ts": 1, "dur": 5, "pid": 0, "tid": 0}] * 200,
}
HOSTILE = {
    "object-of-a-number": b'{"a": 1}',
    "empty-object": b"{}",
    "list-of-numbers": b"[1, 2, 3]",
    "empty-list": b"  []",
    "chrome-trace": json.dumps(CHROME_TRACE).encode(),
    "chrome-trace-list": json.dumps(CHROME_TRACE["traceEvents"]).encode(),
    "segments-nowhere-long": json.dumps({"config": "x" * 100, "data": list(range(3000))}).encode(),
}


@pytest.mark.parametrize("gzipped", [False, True])
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_json_that_is_no_snapshot_is_refused_before_it_is_stored(
    client: Any, alice_token: str, tmp_path: Path, name: str, gzipped: bool, django_capture_on_commit_callbacks: Any
) -> None:
    body = gzip.compress(HOSTILE[name]) if gzipped else HOSTILE[name]
    with django_capture_on_commit_callbacks() as published:
        response = post_bytes(client, alice_token, tmp_path, "x.json", body)
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["code"] == "upload:not-a-snapshot-json"
    assert error["message"].startswith("This JSON is not a memory snapshot.")
    assert not Upload.objects.exists() and not published


def test_the_page_form_refuses_it_too(alice_client: Any, tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_bytes(HOSTILE["chrome-trace"])
    with open(path, "rb") as fh:
        response = alice_client.post(
            "/upload/", {"file": fh, "project": "alpha"}, headers={"Accept": "application/json"}
        )
    assert response.status_code == 422, response.content
    assert response.json()["error"]["code"] == "upload:not-a-snapshot-json"
    assert not Upload.objects.exists()


def test_the_sniff_reads_keys_only_as_far_as_the_head_goes() -> None:
    real = json_form(FRAG)[:4096]
    assert foreign_json(real) is None
    # A legacy bare list of segments (torch <= 1.13) is a snapshot's shape.
    segments = json.dumps(json.loads(json_form(FRAG))["segments"]).encode()
    assert foreign_json(segments[:4096]) is None
    # A head that ends inside its first key cannot tell: the reader decides.
    assert foreign_json(b'{"' + b"k" * 5000) is None
    assert "traceEvents" in (foreign_json(HOSTILE["chrome-trace"][:4096]) or "")
    assert "without a 'segments' key" in (foreign_json(b'{"device_traces": []}') or "")
