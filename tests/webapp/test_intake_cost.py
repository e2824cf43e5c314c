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
from webapp.snapshots.cost import estimate_cost
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
