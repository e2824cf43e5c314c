"""The segment timeline's data (issue 20, item 6: memory_viz's "active cached segment timeline"): the
segments alive at each sampled event add up to the recorded replay's reserved memory there."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from analysis.allocator.recorded import recorded_replay
from analysis.reader import read_snapshot
from tests.webapp.helpers import FIXTURES, make_upload

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "case", ["gpt_varlen_oom", "frag_oom", "gpu_empty_cache", "gpt_varlen_expandable", "wrapped_ring"]
)
def test_segments_alive_add_up_to_reserved_memory(case: str, alice_client: Any, alice: Any, alpha: Any) -> None:
    from webapp.snapshots.worker.tasks import analyse_upload

    upload = make_upload(alpha, alice, FIXTURES / f"{case}.pickle.gz")
    analyse_upload(upload.id)
    snap = read_snapshot(FIXTURES / f"{case}.pickle.gz")
    rep = recorded_replay(snap, snap.devices[0])
    body = alice_client.get(f"/s/{upload.code}/segments.json?t0=0&t1={rep.reserved.shape[0]}&px=1200").json()
    events = np.asarray(body["sample_events"])
    assert body["samples"] > 100 and body["segments"] > 0
    assert body["sample_bytes"] == rep.reserved[events].tolist()
    # Every band is a segment the trace made (cudaMalloc'd ones; an expandable segment's ranges split
    # where parts are unmapped, and a wrapped trace holds segments made before it).
    trace = snap.devices[0].trace
    if case not in ("gpt_varlen_expandable", "wrapped_ring"):
        made = set(np.asarray(trace.size)[np.asarray(trace.action) == 3].tolist())
        assert set(body["data"]["size"]) <= made
    # A narrow window is exact, event by event.
    narrow = alice_client.get(f"/s/{upload.code}/segments.json?t0=100&t1=160&px=1200").json()
    assert narrow["sample_events"] == list(range(100, 161))
    assert narrow["sample_bytes"] == rep.reserved[100:161].tolist()


def test_segment_timeline_through_a_share_link_and_not_after_it_is_revoked(
    client: Any, alice: Any, alpha: Any, bob: Any
) -> None:
    from webapp.snapshots.teams import shares
    from webapp.snapshots.worker.tasks import analyse_upload

    upload = make_upload(alpha, alice, FIXTURES / "frag_oom.pickle.gz")
    analyse_upload(upload.id)
    token = shares.share_create(upload, alice)
    shared = client.get(f"/r/{token}/segments.json?t0=0&t1=100&px=400")
    assert shared.status_code == 200 and shared.json()["segments"] > 0
    client.force_login(bob)  # another team: the member URL is a 404
    assert client.get(f"/s/{upload.code}/segments.json").status_code == 404
    shares.share_revoke(upload)
    assert client.get(f"/r/{token}/segments.json?t0=0&t1=100").status_code == 404
