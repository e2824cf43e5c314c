"""One tar or zip of a run's per-rank snapshots, through the API and the upload form, made into the
run's uploads and analysed as the run's chord would (``runarchive.py``); and the archive's refusals.

The ranks are the real two-rank DDP job of ``tests/fixtures/runs`` (rank 0 died of an OOM, rank 1's
all-reduce then lost its peer), once as the torch-only capture (``ddp_gloo_rank*``) and once as the
client's own dumps (``client_job/rank*``), each snapshot with its sidecar.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES, bearer
from webapp.snapshots.models import Run, Upload
from webapp.snapshots.worker import runtasks

pytestmark = pytest.mark.django_db

RUNS = FIXTURES / "runs"
GLOO = [RUNS / f"ddp_gloo_rank{r}{ext}" for r in (0, 1) for ext in (".pickle.gz", ".json")]
CLIENT = [RUNS / "client_job" / f"rank{r}{ext}" for r in (0, 1) for ext in (".pickle.gz", ".json")]


def peaks(files: list[Path]) -> list[int]:
    """Each rank's peak reserved bytes as its own process counted them (the sidecar's memory_stats)."""
    sidecars = [p for p in files if p.suffix == ".json"]
    return [json.loads(p.read_text())["memory_stats"]["reserved_bytes.all.peak"] for p in sidecars]


def tar_of(files: list[Path], folder: str = "job") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for path in files:
            archive.add(path, arcname=f"{folder}/{path.name}")
    return out.getvalue()


def zip_of(files: list[Path]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for path in files:
            archive.write(path, arcname=path.name)
    return out.getvalue()


def post_api(client: Any, token: str, body: bytes, name: str, key: str = "", **fields: Any) -> Any:
    upload = io.BytesIO(body)
    upload.name = name
    extra = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post("/api/v1/snapshots", {"file": upload, **fields}, **bearer(token), **extra)


def summarised(run: Run) -> dict[str, Any]:
    """Each rank as ``analyse_rank`` runs it, then the summary: what the chord does on a worker."""
    for upload in run.uploads.order_by("rank"):
        assert runtasks.analyse_rank(upload.id) == upload.id
    assert runtasks.summarise_run(run.id) == "done"
    summary = Run.objects.get(pk=run.pk).summary
    assert isinstance(summary, dict)
    return summary


def assert_the_ddp_run(run: Run, summary: dict[str, Any]) -> None:
    head = summary["run"]
    assert run.world_size == 2 and head["world_size"] == 2
    assert head["first_oom_rank"] == 0 and head["peer_failed_ranks"] == [1]
    ranks = {u.rank: u for u in run.uploads.all()}
    assert set(ranks) == {0, 1} and all(u.status == Upload.Status.DONE for u in ranks.values())
    assert "Connection closed by peer" in ranks[1].meta["error"]
    assert "CUDA out of memory" in ranks[0].oom_message and not ranks[1].oom_message


@pytest.mark.parametrize(("files", "make", "name"), [(GLOO, tar_of, "job.tar.gz"), (CLIENT, zip_of, "job.zip")])
def test_an_archive_through_the_api_is_one_run_of_its_ranks(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any, files: list[Path], make: Any, name: str
) -> None:
    with django_capture_on_commit_callbacks() as published:
        response = post_api(client, alice_token, make(files), name, run="ddp-archive", commit="c0ffee")
    assert response.status_code == 202, response.content
    body = response.json()["run"]
    assert body["name"] == "ddp-archive" and body["world_size"] == 2 and body["commit"] == "c0ffee"
    assert [u["rank"] for u in body["uploads"]] == [0, 1]
    assert len(published) == 1, "the run's chord is published once, after both ranks committed"
    run = Run.objects.get(code=body["id"])
    assert response["Location"].endswith(f"/api/v1/runs/{run.code}")
    summary = summarised(run)
    assert_the_ddp_run(run, summary)
    assert [r["peak_reserved_bytes"] for r in summary["ranks"]] == peaks(files)
    # The per-rank report keeps working, with rank 0's real limit from its sidecar's OOM message.
    rank0 = run.uploads.get(rank=0)
    report = client.get(f"/api/v1/snapshots/{rank0.code}/report", **bearer(alice_token)).json()
    assert report["devices"][0]["oom"]["limit_bytes"] == 2 * 2**30


def test_an_archive_through_the_upload_form_redirects_to_its_run(
    alice_client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    form = alice_client.get("/upload/").content.decode()
    assert "one tar or zip of a run's per-rank snapshots" in form and ".tar,.tgz" in form
    upload = io.BytesIO(tar_of(CLIENT, folder="client_job"))
    upload.name = "client_job.tar.gz"
    with django_capture_on_commit_callbacks() as published:
        response = alice_client.post("/upload/", {"file": upload, "project": "alpha", "branch": "main"})
    assert response.status_code == 302, response.content
    run = Run.objects.get()
    assert response["Location"] == f"/run/{run.code}/" and len(published) == 1
    assert run.name.startswith("client_job-") and run.branch == "main" and run.job_id == "ddp-oom-h200"
    assert_the_ddp_run(run, summarised(run))
    page = alice_client.get(f"/run/{run.code}/").content.decode()
    assert "Rank 0 ran out of memory first" in page and "Rank 1 failed because a peer died" in page


def tar_with(*entries: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for info, data in entries:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, None


RANK0 = (RUNS / "ddp_gloo_rank0.pickle.gz").read_bytes()
RANK1 = (RUNS / "ddp_gloo_rank1.pickle.gz").read_bytes()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (tar_with(member("rank0.pickle.gz", RANK0), member("../rank1.pickle.gz", RANK1)), "upload:archive-unsafe-path"),
        (tar_with(member("/etc/rank1.pickle.gz", RANK1)), "upload:archive-unsafe-path"),
        (tar_with(member("rank0.pickle.gz", RANK0), link("rank1.pickle.gz", "/etc/passwd")), "upload:archive-link"),
        (
            tar_with(*[member(f"rank{r}.log", b"step\n") for r in range(9)], member("rank0.pickle.gz", RANK0)),
            "upload:archive-too-many-members",
        ),
        (tar_with(member("rank0.pickle.gz", RANK0), member("more.tar.gz", tar_of(GLOO))), "upload:archive-nested"),
        (tar_with(member("rank0.pickle.gz", RANK0), member("rank1.pickle", zip_of(GLOO))), "upload:archive-nested"),
        (
            tar_with(member("rank0.pickle.gz", RANK0), member("rank1.pickle.gz", b"<html>not a snapshot</html>")),
            "upload:archive-not-a-snapshot",
        ),
        (tar_with(member("notes.txt", b"hello")), "upload:archive-empty"),
        (
            tar_with(member("a/rank0.pickle.gz", RANK0), member("b/rank0.pickle.gz", RANK1)),
            "upload:archive-duplicate-member",
        ),
    ],
    ids=["traversal", "absolute", "link", "too-many", "nested-name", "nested-content", "not-snapshot", "empty", "dup"],
)
def test_a_hostile_archive_is_refused_and_nothing_is_stored(
    client: Any, alice_token: str, settings: Any, body: bytes, code: str
) -> None:
    settings.RUN_ARCHIVE_MAX_MEMBERS = 8
    response = post_api(client, alice_token, body, "ranks.tar", run="hostile")
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    assert not Upload.objects.exists() and not Run.objects.exists()
    assert not list(Path(settings.MEDIA_ROOT).rglob("*.pickle*"))


def test_the_unpacked_size_is_capped_by_the_upload_limit(client: Any, alice_token: str, settings: Any) -> None:
    raw = gzip.decompress(RANK0)  # the pickle deflates well, so the archive is far smaller than it
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("rank0.pickle", raw)
    body = out.getvalue()
    settings.UPLOAD_MAX_BYTES = len(body) + 1024  # the archive itself fits; its rank does not
    assert len(raw) > settings.UPLOAD_MAX_BYTES
    response = post_api(client, alice_token, body, "ranks.zip")
    assert response.status_code == 422 and response.json()["error"]["code"] == "upload:archive-too-large"
    assert not Upload.objects.exists()


def test_a_tar_bomb_is_refused_at_its_header(client: Any, alice_token: str) -> None:
    """A member whose header declares 64 GiB: refused from the listing, before a byte of it is read
    (the gzip stream ends at the header: listing on would have to inflate the member to skip it)."""
    info = tarfile.TarInfo("rank0.pickle")
    info.size = 64 << 30
    response = post_api(client, alice_token, gzip.compress(info.tobuf()), "bomb.tar.gz")
    assert response.status_code == 422 and response.json()["error"]["code"] == "upload:archive-too-large"


def test_the_form_shows_an_archive_refusal(alice_client: Any) -> None:
    upload = io.BytesIO(tar_with(member("rank0.pickle.gz", RANK0), link("rank1.pickle.gz", "rank0.pickle.gz")))
    upload.name = "ranks.tar"
    response = alice_client.post("/upload/", {"file": upload, "project": "alpha"})
    assert response.status_code == 422
    assert "holds a link" in response.content.decode()
    assert not Upload.objects.exists()


def test_the_team_quota_counts_every_rank_of_the_archive(client: Any, alice_token: str, settings: Any) -> None:
    settings.TEAM_STORAGE_QUOTA_BYTES = len(RANK0) + len(RANK1) - 1  # one rank fits, both do not
    response = post_api(client, alice_token, tar_of(GLOO), "job.tar.gz")
    assert response.status_code == 413 and response.json()["error"]["code"] == "upload:quota-exceeded"
    assert not Upload.objects.exists() and not Run.objects.exists()


def test_a_retried_archive_replays_its_ranks(
    client: Any, alice_token: str, django_capture_on_commit_callbacks: Any
) -> None:
    body = zip_of(GLOO)
    with django_capture_on_commit_callbacks():
        first = post_api(client, alice_token, body, "job.zip", key="job-42")
    with django_capture_on_commit_callbacks() as published:
        again = post_api(client, alice_token, body, "job.zip", key="job-42")
    assert first.status_code == again.status_code == 202
    assert first.json()["run"]["id"] == again.json()["run"]["id"] and published == []
    assert Upload.objects.count() == 2
