"""Issue 36 items 5-6 in the web tier: each finding as the attack's shape, refused.

Uploads are real fixtures (gpt_varlen_oom, its own OOM message from its ``.truth.json``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.webapp.helpers import GPT_OOM, make_upload
from webapp.snapshots.models import Upload

pytestmark = pytest.mark.django_db

OOM_MESSAGE = json.loads(GPT_OOM.with_name("gpt_varlen_oom.truth.json").read_text())["oom_message"]


def _flashes(response: Any) -> list[str]:
    return [str(m) for m in response.wsgi_request._messages]


# --- re-analysis with a pasted OOM message -----------------------------------------------------


def _reanalyse(client: Any, upload: Upload) -> Any:
    return client.post(f"/s/{upload.code}/message/", {"oom_message": OOM_MESSAGE})


def test_reanalysis_is_held_to_the_upload_rate(alice_client: Any, alice: Any, alpha: Any, settings: Any) -> None:
    """Issue 36: 25 re-analysis posts in 1.9 s, none counted. Now each is an upload to the rates."""
    settings.UPLOAD_RATE_PER_USER = "3/h"
    upload = make_upload(alpha, alice)
    for _ in range(3):
        assert _reanalyse(alice_client, upload).status_code == 302
    assert Upload.objects.count() == 4
    refused = _reanalyse(alice_client, upload)
    assert refused.status_code == 302 and refused["Location"].endswith(f"/s/{upload.code}/#basis")
    assert Upload.objects.count() == 4
    assert any("upload" in text.lower() for text in _flashes(refused))


def test_reanalysis_is_held_to_the_quota_the_queued_cost_and_the_disk(
    alice_client: Any, alice: Any, alpha: Any, settings: Any
) -> None:
    upload = make_upload(alpha, alice, estimated_cost=1000)
    size = upload.bytes
    # The quota: room for the file twice, not three times (the re-analysis row counts it again).
    settings.TEAM_STORAGE_QUOTA_BYTES = 2 * size + 10
    assert _reanalyse(alice_client, upload).status_code == 302
    assert Upload.objects.count() == 2
    quota = _reanalyse(alice_client, upload)
    assert Upload.objects.count() == 2
    assert any("quota" in text for text in _flashes(quota))
    settings.TEAM_STORAGE_QUOTA_BYTES = 100 * size
    # The team's queued cost: the first re-analysis (cost 1000) still queued, room for no other.
    settings.ANALYSIS_MAX_QUEUED_COST_PER_TEAM = 1500
    _reanalyse(alice_client, upload)
    assert Upload.objects.count() == 2
    settings.ANALYSIS_MAX_QUEUED_COST_PER_TEAM = 10**12
    # The disk guard: a reserve larger than the disk.
    settings.DISK_MIN_FREE_BYTES = 1 << 62
    full = _reanalyse(alice_client, upload)
    assert Upload.objects.count() == 2
    assert full.status_code == 302 and _flashes(full)
    settings.DISK_MIN_FREE_BYTES = 0
    assert _reanalyse(alice_client, upload).status_code == 302
    assert Upload.objects.count() == 3
