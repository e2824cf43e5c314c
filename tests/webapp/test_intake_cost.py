"""Issue 22: a cost estimate at intake. One team could fill the analysis queue for everyone; now
each upload's cost (bytes to parse: the file, or the uncompressed size its gzip trailer or zip
directory declares) is stored on the row, and an upload that would take the team's queued cost
past ``ANALYSIS_MAX_QUEUED_COST_PER_TEAM`` is refused at intake with a code.

The files are real fixtures, or a gzip made here whose declared size is its real one.
"""

from __future__ import annotations

import gzip
import io
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES, GPT_OOM, bearer
from webapp.snapshots.intake.cost import estimate_cost
from webapp.snapshots.models import Upload

pytestmark = pytest.mark.django_db


def post(client: Any, token: str, name: str, data: bytes) -> Any:
    fh = io.BytesIO(data)
    fh.name = name
    return client.post("/api/v1/snapshots", {"file": fh}, **bearer(token))


def error_of(response: Any) -> str:
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    code: str = response.json()["error"]["code"]
    return code


@pytest.mark.parametrize("name", ["gpt_varlen_oom.pickle.gz", "frag_oom.pickle.gz", "big_all_stacks.pickle.gz"])
def test_a_gzip_costs_its_declared_uncompressed_size(name: str) -> None:
    data = (FIXTURES / name).read_bytes()
    unpacked = len(gzip.decompress(data))
    cost = estimate_cost(_sized(data))
    assert cost.file_bytes == len(data)
    assert cost.declared_bytes == unpacked % 2**32
    assert cost.cost_bytes == max(len(data), unpacked) == unpacked


def test_a_plain_pickle_and_a_zip_cost_what_they_hold(tmp_path: Path) -> None:
    raw = gzip.decompress(GPT_OOM.read_bytes())
    plain = estimate_cost(_sized(raw))
    assert (plain.declared_bytes, plain.cost_bytes) == (None, len(raw))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", raw)
    zipped = estimate_cost(_sized(buffer.getvalue()))
    assert zipped.declared_bytes == len(raw) and zipped.cost_bytes == len(raw)
    assert zipped.file_bytes == len(buffer.getvalue()) < len(raw)


def _sized(data: bytes) -> io.BytesIO:
    fh = io.BytesIO(data)
    fh.size = len(data)  # type: ignore[attr-defined]
    return fh


def test_an_upload_that_declares_more_than_a_team_may_queue_is_refused(
    client: Any, alice_token: str, alice_client: Any, settings: Any
) -> None:
    """The attack: a small gzip that unpacks to far more than it weighs (a real snapshot's pickle,
    then 64 MiB of zeros: about 320 KB). Refused before it is stored, on the API and the page,
    with no row."""
    bomb = gzip.compress(gzip.decompress(GPT_OOM.read_bytes()) + b"\0" * (64 << 20), compresslevel=9)
    assert len(bomb) < 400_000  # over 200 times smaller than what it declares
    settings.ANALYSIS_MAX_QUEUED_COST_PER_TEAM = 32 << 20
    refused = post(client, alice_token, "zeros.pickle.gz", bomb)
    assert refused.status_code == 413 and error_of(refused) == "upload:too-costly"
    assert "ANALYSIS_MAX_QUEUED_COST_PER_TEAM" in refused.json()["error"]["message"]
    page = alice_client.post("/upload/", {"file": io.BytesIO(bomb), "project": "alpha"}, HTTP_ACCEPT="application/json")
    assert page.status_code == 413 and error_of(page) == "upload:too-costly"
    assert not Upload.objects.exists()


def test_a_team_queues_up_to_its_cost_limit_then_waits(client: Any, alice_token: str, settings: Any) -> None:
    data = GPT_OOM.read_bytes()
    one = len(gzip.decompress(data))
    settings.ANALYSIS_MAX_QUEUED_COST_PER_TEAM = 2 * one + 10  # two queued analyses, not three
    first = post(client, alice_token, "a.pickle.gz", data)
    assert first.status_code == 202 and post(client, alice_token, "b.pickle.gz", data).status_code == 202
    assert sorted(Upload.objects.values_list("estimated_cost", flat=True)) == [one, one]
    refused = post(client, alice_token, "c.pickle.gz", data)
    assert refused.status_code == 429 and error_of(refused) == "upload:queue-full"
    assert refused["Retry-After"] == "60"
    assert Upload.objects.count() == 2
    # One analysis ends: its cost leaves the queue and the next upload is taken.
    Upload.objects.filter(code=first.json()["id"]).update(status=Upload.Status.DONE)
    assert post(client, alice_token, "c.pickle.gz", data).status_code == 202


# --- the structure the estimate sees (issue 22: many devices, many gzip members) ------------------


def _reader_devices(data: bytes) -> int:
    from analysis.reader import ReadLimits, read_snapshot

    return len(read_snapshot(data, limits=ReadLimits(max_devices=10**6, max_gzip_members=10**7)).devices)


@pytest.mark.parametrize(
    "name", ["two_gpu_pipeline.pickle.gz", "state_only.pickle.gz", "frag_oom.pickle.gz", "big_all_stacks.pickle.gz"]
)
def test_the_scan_counts_devices_as_the_reader_does(name: str) -> None:
    from webapp.snapshots.intake.cost import DEVICE_COST_BYTES

    data = (FIXTURES / name).read_bytes()
    cost = estimate_cost(_sized(data))
    devices = _reader_devices(data)
    assert cost.devices == devices and cost.gzip_members == 1 and cost.refusal is None
    # Each device past the first costs DEVICE_COST_BYTES more than the bytes to parse.
    assert cost.cost_bytes == len(gzip.decompress(data)) + DEVICE_COST_BYTES * (devices - 1)


def test_concatenated_members_cost_all_their_content_not_the_last_isize() -> None:
    raw = gzip.decompress((FIXTURES / "frag_oom.pickle.gz").read_bytes())
    # The snapshot split over three members: the trailer declares only the last one's 1,000 bytes.
    data = gzip.compress(raw[:5000]) + gzip.compress(raw[5000:-1000]) + gzip.compress(raw[-1000:])
    cost = estimate_cost(_sized(data))
    assert cost.declared_bytes == 1000 and cost.gzip_members == 3
    assert cost.cost_bytes == len(raw)


def _many_devices(n: int, *, by: str) -> bytes:
    """``n`` devices, one segment each (the issue's 22 KB file) or ``n`` empty traces."""
    import pickle

    from tests.analysis.hostile_cases import snapshot_dict

    snap = snapshot_dict(0)
    if by == "segments":
        snap["segments"] = [dict(snap["segments"][0], device=d) for d in range(n)]
        snap["device_traces"] = []
    else:
        snap["device_traces"] = [[] for _ in range(n)]
    return pickle.dumps(snap, protocol=4)


@pytest.mark.parametrize("by", ["segments", "traces"])
def test_more_devices_than_the_reader_reads_are_refused_at_intake(
    client: Any, alice_token: str, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    import pickle
    import time

    import analysis.reader
    from analysis.reader import ReadLimits

    most = ReadLimits().max_devices

    # The web process walks the pickle's opcodes; it never unpickles the upload, nor reads it as a snapshot.
    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the web process unpickled an upload")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(analysis.reader, "read_snapshot", refuse)
    assert post(client, alice_token, "at-limit.pickle", _many_devices(most, by=by)).status_code == 202
    started = time.monotonic()
    refused = post(client, alice_token, "3000.pickle", _many_devices(3000, by=by))
    took = time.monotonic() - started
    assert refused.status_code == 422 and error_of(refused) == "snapshot:limit:devices"
    assert f"at most {most} are read" in refused.json()["error"]["message"]
    assert Upload.objects.count() == 1  # only the one at the limit
    assert took < 5, f"{took:.1f} s"  # before: 221 s of the shared queue (3,000 devices)
    monkeypatch.undo()
    assert _reader_devices(_many_devices(3000, by=by)) == 3000  # what the scan counted is what is there


def test_many_gzip_members_are_refused_at_intake(client: Any, alice_token: str) -> None:
    """The issue's 8 MB file: 400,000 empty gzip members, then a snapshot (about 150 s of the queue
    before). Refused before it is stored; a file at the member limit is taken."""
    import pickle

    from analysis.reader import ReadLimits
    from tests.analysis.hostile_cases import snapshot_dict

    body = gzip.compress(pickle.dumps(snapshot_dict(10), protocol=4))
    most = ReadLimits().max_gzip_members
    at_limit = gzip.compress(b"", 1) * (most - 1) + body
    assert estimate_cost(_sized(at_limit)).gzip_members == most
    assert post(client, alice_token, "members-ok.pickle.gz", at_limit).status_code == 202
    refused = post(client, alice_token, "members.pickle.gz", gzip.compress(b"", 1) * 400_000 + body)
    assert refused.status_code == 422 and error_of(refused) == "snapshot:limit:gzip-members"
    assert Upload.objects.count() == 1


def test_the_scan_is_bounded_whatever_the_file() -> None:
    """A large plain pickle and a 100:1 gzip: the scan reads a fixed head, not the file."""
    import time

    from webapp.snapshots.intake import cost as cost_module

    raw = gzip.decompress((FIXTURES / "big_all_stacks.pickle.gz").read_bytes())  # 30 MB of pickle
    started = time.process_time()
    plain = estimate_cost(_sized(raw))
    took = time.process_time() - started
    assert not plain.scan_complete and plain.devices == 1 and plain.cost_bytes == len(raw)
    assert took < 1.0, f"{took:.2f} s of CPU"  # about 0.06 s here; reading the file would take seconds

    class Counted(io.BytesIO):
        read_bytes = 0

        def read(self, n: int | None = -1) -> bytes:
            out = super().read(n)
            Counted.read_bytes += len(out)
            return out

    counted = Counted(raw)
    counted.size = len(raw)  # type: ignore[attr-defined]
    estimate_cost(counted)
    assert Counted.read_bytes <= cost_module.SCAN_OUTPUT_BYTES + 8
