"""Issue 36, items 3 and 4: a run's archive counted rank by rank, fairness that does not make the
waiting team pay for the busy team's queue, and archive expansion charged to the disk guard and the
quota before a byte is unpacked; blobs written whole or not at all, and orphans swept.

Every attack is built here: 1,000 ranks in a small tar.xz, a rank of 5,000 gzip members, a tar.bz2
of a few hundred bytes declaring tens of MB, a disk that fills mid-write."""

from __future__ import annotations

import bz2
import errno
import gzip
import hashlib
import io
import lzma
import os
import pickle
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES, bearer, make_upload
from webapp.snapshots.models import Run, Upload

pytestmark = pytest.mark.django_db

RUNS = FIXTURES / "runs"
RANK0 = (RUNS / "ddp_gloo_rank0.pickle.gz").read_bytes()
RANK1 = (RUNS / "ddp_gloo_rank1.pickle.gz").read_bytes()
TINY = pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=4)


def tar_bytes(members: list[tuple[str, bytes]], mode: str = "w") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode=mode) as archive:  # type: ignore[call-overload]
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def post(client: Any, token: str, body: bytes, name: str, **fields: Any) -> Any:
    upload = io.BytesIO(body)
    upload.name = name
    return client.post("/api/v1/snapshots", {"file": upload, **fields}, **bearer(token))


def blobs(settings: Any) -> list[Path]:
    return [p for p in (Path(settings.MEDIA_ROOT) / "sha256").rglob("*") if p.is_file()]


# --- item 3: each rank counted -----------------------------------------------------------------


def test_a_thousand_ranks_in_a_small_tar_xz_are_a_thousand_uploads_against_the_rates(
    client: Any, alice_token: str
) -> None:
    body = lzma.compress(tar_bytes([(f"rank{r}.pickle", TINY) for r in range(1000)]))
    assert len(body) < 20_000
    answer = post(client, alice_token, body, "ranks.tar.xz")
    # The token's 60 uploads in 10 minutes: refused at intake, from the listing, nothing stored.
    assert answer.status_code == 429, answer.content
    assert answer.json()["error"]["code"] == "upload:rate-limited:token" and answer["Retry-After"]
    assert not Upload.objects.exists() and not Run.objects.exists()


def test_each_rank_spends_the_rate(client: Any, alice_token: str, settings: Any) -> None:
    settings.UPLOAD_RATE_PER_USER = "3/m"
    two = tar_bytes([("rank0.pickle.gz", RANK0), ("rank1.pickle.gz", RANK1)])
    assert post(client, alice_token, two, "two.tar", run="a").status_code == 202
    # Two of the three are spent: a second archive of two ranks passes the rate.
    again = post(client, alice_token, two, "two.tar", run="b")
    assert again.status_code == 429 and again.json()["error"]["code"] == "upload:rate-limited:user"
    assert Upload.objects.count() == 2


def test_each_rank_is_checked_for_the_shapes_refused_at_intake(client: Any, alice_token: str, settings: Any) -> None:
    members = b"".join(gzip.compress(b"") for _ in range(5000)) + gzip.compress(TINY)  # past 4,096 members
    body = tar_bytes([("rank0.pickle.gz", RANK0), ("rank1.pickle.gz", members)], mode="w:gz")
    answer = post(client, alice_token, body, "ranks.tar.gz")
    assert answer.status_code == 422, answer.content
    error = answer.json()["error"]
    assert error["code"] == "snapshot:limit:gzip-members" and error["message"].startswith("rank1.pickle.gz: ")
    assert not Upload.objects.exists() and not blobs(settings)


def test_the_ranks_costs_together_count_against_the_queued_cost(client: Any, alice_token: str, settings: Any) -> None:
    from webapp.snapshots.intake.cost import estimate_cost

    costs = []
    for data in (RANK0, RANK1):
        path = Path(settings.MEDIA_ROOT).parent / "rank.pickle.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        with path.open("rb") as fh:
            from django.core.files.uploadedfile import UploadedFile

            costs.append(estimate_cost(UploadedFile(fh, name=path.name, size=len(data))).cost_bytes)
    settings.ANALYSIS_MAX_QUEUED_COST_PER_TEAM = max(costs) + 1  # each rank alone fits, both do not
    body = tar_bytes([("rank0.pickle.gz", RANK0), ("rank1.pickle.gz", RANK1)])
    assert len(body) < settings.ANALYSIS_MAX_QUEUED_COST_PER_TEAM  # the archive's own size passed before
    answer = post(client, alice_token, body, "ranks.tar", run="a")
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "upload:too-costly"
    assert not Upload.objects.exists()
    # Room for both ranks once: the second archive finds them queued.
    settings.ANALYSIS_MAX_QUEUED_COST_PER_TEAM = sum(costs) + 1
    assert post(client, alice_token, body, "ranks.tar", run="a").status_code == 202
    again = post(client, alice_token, body, "ranks.tar", run="b")
    assert again.status_code == 429 and again.json()["error"]["code"] == "upload:queue-full"
    assert Upload.objects.count() == 2


def test_a_deferral_runs_the_waiting_team_now_instead_of_sleeping(
    alice: Any, alpha: Any, bob: Any, beta: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Team A runs one analysis and has 50 queued (an archive's ranks); team B's one upload is queued
    behind them. The first of A's messages a slot takes runs B's upload at once, and goes to the back."""
    from django.utils import timezone

    from webapp.snapshots.worker import tasks

    small = FIXTURES / "frag_oom.pickle.gz"
    running = make_upload(alpha, alice, small)
    Upload.objects.filter(pk=running.pk).update(status=Upload.Status.RUNNING, started_at=timezone.now())
    queued_a = [make_upload(alpha, alice, small, queued_at=timezone.now()) for _ in range(50)]
    waiting_b = make_upload(beta, bob, small, queued_at=timezone.now())
    republished: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks.analyse_upload_task, "apply_async", lambda *a, **_k: republished.append(a))
    monkeypatch.setattr(time, "sleep", lambda _s: pytest.fail("a deferral slept"))
    tasks.analyse_upload(queued_a[0].id)
    assert Upload.objects.get(pk=waiting_b.pk).status == Upload.Status.DONE
    assert Upload.objects.get(pk=queued_a[0].pk).status == Upload.Status.QUEUED
    assert republished == [((queued_a[0].id,), {"deferred": 1})]
    # With nobody else waiting, A's own upload runs.
    tasks.analyse_upload(queued_a[0].id, deferred=1)
    assert Upload.objects.get(pk=queued_a[0].pk).status == Upload.Status.DONE


# --- item 4: expansion charged before unpacking; blobs whole or not at all; orphans swept --------


def declaring(megabytes: int) -> bytes:
    """A tar.bz2 of a few hundred bytes whose one rank unpacks to ``megabytes`` MB (a pickle, then zeros)."""
    data = TINY + bytes(megabytes * 1_000_000 - len(TINY))
    return bz2.compress(tar_bytes([("rank0.pickle", data)]), 9)


@pytest.fixture
def no_unpacking(monkeypatch: pytest.MonkeyPatch) -> None:
    from webapp.snapshots.intake import runarchive

    monkeypatch.setattr(runarchive, "unpack_ranks", lambda *_a, **_k: pytest.fail("unpacked before the checks"))


def test_the_disk_guard_is_charged_with_the_declared_sizes(
    client: Any, alice_token: str, settings: Any, monkeypatch: pytest.MonkeyPatch, no_unpacking: None
) -> None:
    from webapp.snapshots.intake import disk

    body = declaring(30)
    assert len(body) < 1000
    monkeypatch.setattr(disk, "free_bytes", lambda: settings.DISK_MIN_FREE_BYTES + 40_000_000)
    answer = post(client, alice_token, body, "bomb.tar.bz2")
    assert answer.status_code == 507 and answer.json()["error"]["code"] == "upload:disk-full"
    assert not Upload.objects.exists() and not blobs(settings)


def test_the_quota_is_charged_with_the_declared_sizes(
    client: Any, alice_token: str, settings: Any, no_unpacking: None
) -> None:
    settings.TEAM_STORAGE_QUOTA_BYTES = 20_000_000
    answer = post(client, alice_token, declaring(30), "bomb.tar.bz2")
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "upload:quota-exceeded"
    assert not blobs(settings)


def _disk_fills_mid_write() -> Any:
    """An uploaded file whose second chunk finds the disk full."""
    from django.core.files.uploadedfile import UploadedFile

    class DiskFills(UploadedFile):
        def chunks(self, chunk_size: int | None = None) -> Any:
            yield TINY + bytes(1 << 20)
            raise OSError(errno.ENOSPC, "No space left on device")

    return DiskFills(io.BytesIO(b""), name="big.pickle", size=2 << 20)


def test_a_blob_is_written_whole_or_not_at_all(settings: Any) -> None:
    from webapp.snapshots.intake import blobs as blob_store

    with pytest.raises(OSError, match="No space left"):
        blob_store.store_blob(_disk_fills_mid_write(), "ab" * 32)
    assert blobs(settings) == []  # neither the blob's name nor its partial file


def test_an_archive_that_fails_midway_leaves_none_of_its_blobs(
    client: Any, alice_token: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from webapp.snapshots.intake import blobs as blob_store

    real = blob_store.store_blob
    calls: list[str] = []

    def second_fills_the_disk(uploaded: Any, sha256: str) -> str:
        calls.append(sha256)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(uploaded, sha256)

    monkeypatch.setattr(blob_store, "store_blob", second_fills_the_disk)
    answer = post(client, alice_token, tar_bytes([("rank0.pickle.gz", RANK0), ("rank1.pickle.gz", RANK1)]), "r.tar")
    assert answer.status_code == 507 and answer.json()["error"]["code"] == "upload:disk-full"
    assert len(calls) == 2 and not Upload.objects.exists()
    assert blobs(settings) == []  # rank 0's blob, stored before rank 1 failed, went with the rollback


def _aged(path: Path, data: bytes, hours: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    past = time.time() - hours * 3600
    os.utime(path, (past, past))
    return path


def test_the_orphan_sweep_removes_only_old_files_no_row_names(alice: Any, alpha: Any, settings: Any) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.core.management import call_command

    from webapp.snapshots.intake import blobs as blob_store

    media = Path(settings.MEDIA_ROOT)
    named = make_upload(alpha, alice, FIXTURES / "frag_oom.pickle.gz")
    named_path = media / named.blob_name
    past = time.time() - 10 * 3600
    os.utime(named_path, (past, past))
    orphan = _aged(media / "sha256" / "cd" / ("cd" * 32), b"partial", 4)
    partial = _aged(media / "sha256" / "ef" / (("ef" * 32) + ".partial-0a1b2c"), b"half", 4)
    young = _aged(media / "sha256" / "12" / ("12" * 32), b"in flight", 0.1)
    store = _aged(media / "explore" / ("34" * 32) / "0.npz", b"store", 4)
    kept_store = _aged(media / "explore" / named.sha256 / "0.npz", b"store", 4)
    out = io.StringIO()
    call_command("sweep_orphan_blobs", stdout=out)
    assert not orphan.exists() and not partial.exists() and not store.exists()
    assert named_path.exists() and young.exists() and kept_store.exists()
    assert "removed 3 files" in out.getvalue()
    # An old orphan that an upload in flight reuses (its row not made yet) has its time renewed.
    data = (FIXTURES / "gpu_empty_cache.pickle.gz").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    reused = _aged(media / blob_store.blob_name_for(sha), data, 4)
    blob_store.store_blob(SimpleUploadedFile("again.pickle.gz", data), sha)
    call_command("sweep_orphan_blobs", stdout=io.StringIO())
    assert reused.exists()
