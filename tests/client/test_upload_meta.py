"""The job's metadata goes with an upload as form fields; the Idempotency-Key stays the client's own."""

from __future__ import annotations

from oomscope_client.upload import upload

from tests.client.test_upload import TOKEN, _base, _parts, server, snapshot_file  # noqa: F401 (fixtures)


def test_job_metadata_is_sent_as_fields(server, snapshot_file):  # noqa: F811
    meta = {"rank": 1, "world_size": 2, "commit": "a1b2c3", "branch": "main", "job_id": "ddp-7", "error": "gloo: peer"}
    upload(snapshot_file, _base(server), TOKEN, run="ddp-7", meta=meta, idempotency_key="oomscope-fixed-key-1")
    (req,) = server.requests
    parts = _parts(req["headers"], req["body"])
    assert {k: parts[k][1] for k in meta} == {k: str(v).encode() for k, v in meta.items()}
    # The metadata loop once overwrote the key with its last field name ("error"): every upload
    # of one user then shared one key and the site refused the second as a conflict.
    assert req["headers"]["Idempotency-Key"] == "oomscope-fixed-key-1"


def test_two_uploads_send_two_keys(server, snapshot_file):  # noqa: F811
    for rank in (0, 1):
        upload(snapshot_file, _base(server), TOKEN, meta={"rank": rank, "world_size": 2})
    keys = [r["headers"]["Idempotency-Key"] for r in server.requests]
    assert len(set(keys)) == 2 and all(k.startswith("oomscope-") for k in keys)
