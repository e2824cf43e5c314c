"""Workers that share no disk: the run's chord on two worker processes, files on an S3-compatible
server (moto's server mode, a real HTTP S3 endpoint on loopback, not a mock of boto).

The site (this process) stores the uploads in the bucket through django-storages, as
``STORAGE_S3_*`` configures it; each worker has a MEDIA_ROOT of its own that must stay empty,
so the only way a worker can read a rank's file is the bucket. Deleting the run takes its
objects out of the bucket.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import bearer
from tests.webapp.test_runs_chord import (  # chord_backend: the fixture, used by name
    chord_backend,  # noqa: F401
    peaks,
    run_the_chord,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

BUCKET = "oomscope-test"
CREDENTIALS = {"access_key": "testing", "secret_key": "testing"}  # moto accepts any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def s3_server(tmp_path: Path) -> Iterator[str]:
    pytest.importorskip("moto", reason="moto (requirements-dev.txt) runs the S3-compatible server")
    port = free_port()
    log = (tmp_path / "moto.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto server did not start: {(tmp_path / 'moto.log').read_text()[-2000:]}")
            time.sleep(0.1)
    try:
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def s3_client(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=CREDENTIALS["access_key"],
        aws_secret_access_key=CREDENTIALS["secret_key"],
    )


@pytest.fixture
def s3_storage(s3_server: str, settings: Any) -> str:
    s3_client(s3_server).create_bucket(Bucket=BUCKET)
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": BUCKET,
                "endpoint_url": s3_server,
                "region_name": "us-east-1",
                **CREDENTIALS,
                "file_overwrite": True,
                "default_acl": None,
            },
        },
    }
    return s3_server


def keys(endpoint: str) -> list[str]:
    listed = s3_client(endpoint).list_objects_v2(Bucket=BUCKET)
    return sorted(item["Key"] for item in listed.get("Contents", []))


@pytest.mark.usefixtures("chord_backend")
def test_the_chord_on_two_workers_reads_and_writes_only_the_shared_bucket(
    client: Any,
    alice_token: str,
    start_worker: Any,
    s3_storage: str,
    tmp_path: Path,
) -> None:
    env = {
        "STORAGE_S3_BUCKET": BUCKET,
        "STORAGE_S3_ENDPOINT_URL": s3_storage,
        "STORAGE_S3_REGION": "us-east-1",
        "STORAGE_S3_ACCESS_KEY": CREDENTIALS["access_key"],
        "STORAGE_S3_SECRET_KEY": CREDENTIALS["secret_key"],
    }
    disks = [tmp_path / "worker-a-disk", tmp_path / "worker-b-disk"]
    workers = [start_worker({**env, "MEDIA_ROOT": str(disk)}) for disk in disks]
    body = run_the_chord(client, alice_token, workers)

    head = body["summary"]["run"]
    assert head["first_oom_rank"] == 0 and head["peer_failed_ranks"] == [1]
    assert [r["peak_reserved_bytes"] for r in body["summary"]["ranks"]] == peaks()
    stored = keys(s3_storage)
    blobs = [k for k in stored if k.startswith("sha256/")]
    assert len(blobs) == 2  # the two ranks' files, put there by the site
    assert any(k.startswith("explore/") for k in stored)  # the workers' explore stores went there too
    for disk in disks:  # and nothing went to a worker's own disk
        assert not disk.exists() or not any(p.is_file() for p in disk.rglob("*"))

    response = client.delete(f"/api/v1/runs/{body['id']}", **bearer(alice_token))
    assert response.json()["deleted"] is True
    assert keys(s3_storage) == []
