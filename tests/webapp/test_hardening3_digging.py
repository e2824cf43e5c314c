"""Issue 36, item 1 (and item 5's two of the same class): no web request does work that grows with
the trace. The attack: a small upload of 20k ``segment_map`` and 100k ``segment_unmap`` events, whose
segment timeline gunicorn computed per request in O(maps x unmaps) (341.6 s of CPU a request)."""

from __future__ import annotations

import gzip
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.webapp.helpers import make_upload

pytestmark = pytest.mark.django_db

PAGE = 2 << 20
BASE = 0x7F0000000000


def _event(action: str, addr: int, size: int, t: int) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []}


def map_unmap_attack(tmp_path: Path, maps: int = 20_000, pieces: int = 5) -> Path:
    """``maps`` ranges of ``pieces`` pages mapped, then each unmapped a page at a time."""
    events = [_event("segment_map", BASE + k * pieces * PAGE, pieces * PAGE, k) for k in range(maps)]
    events += [
        _event("segment_unmap", BASE + (k * pieces + p) * PAGE, PAGE, maps + k * pieces + p)
        for k in range(maps)
        for p in range(pieces)
    ]
    path = tmp_path / "map_unmap.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps({"segments": [], "device_traces": [events]}), 9))
    return path


def many_blocks(tmp_path: Path, blocks: int = 20_000) -> Path:
    """One 1 GiB segment, ``blocks`` 512-byte allocations alive at the end."""
    events = [_event("segment_alloc", BASE, 1 << 30, 0)]
    events += [_event("alloc", BASE + k * 512, 512, k + 1) for k in range(blocks)]
    path = tmp_path / "many_blocks.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps({"segments": [], "device_traces": [events]}), 9))
    return path


def test_segment_timeline_of_20k_maps_and_100k_unmaps_is_read_from_the_store(
    tmp_path: Path, client: Any, alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from analysis import explore
    from webapp.snapshots.pages import digging
    from webapp.snapshots.teams import shares
    from webapp.snapshots.worker.tasks import analyse_upload

    path = map_unmap_attack(tmp_path)
    assert path.stat().st_size < 600_000
    upload = make_upload(alpha, alice, path)
    analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == "done", upload.error_message
    token = shares.share_create(upload, alice)
    digging._stores.clear()

    def no_work_here(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("the segment timeline was computed in the web process")

    monkeypatch.setattr(explore, "segment_lifetimes", no_work_here)
    started = time.thread_time()
    body = client.get(f"/r/{token}/segments.json?t0=0&t1=120000&px=1200").json()
    cpu = time.thread_time() - started
    # Each unmap ends one range (the map's, or what the unmaps before it left of it): 100,000 rows;
    # banded at as many samples as the request's work bound allows (rows x samples).
    assert body["segments"] == 100_000
    assert body["samples"] == digging.BAND_WORK // 100_000
    # The ranges alive after each sampled event add up to the bytes mapped then.
    mapped = [(e + 1) * 5 * PAGE if e < 20_000 else (120_000 - 1 - e) * PAGE for e in body["sample_events"]]
    assert body["sample_bytes"] == mapped and mapped[-1] == 0
    # Reading the stored rows and banding them: well under a second of this thread's CPU, not 341 s.
    assert cpu < 10, cpu


def test_state_answer_is_bounded_and_kept(
    tmp_path: Path, client: Any, alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from analysis.explore import StoredExplorer
    from webapp.snapshots.pages import digging
    from webapp.snapshots.teams import shares
    from webapp.snapshots.worker.tasks import analyse_upload

    upload = make_upload(alpha, alice, many_blocks(tmp_path))
    analyse_upload(upload.id)
    token = shares.share_create(upload, alice)
    digging._stores.clear()
    digging._states.clear()
    answer = client.get(f"/r/{token}/state.json?i=20000")
    body = answer.json()
    assert body["blocks_total"] == 20_001  # 20,000 allocations and the segment's free rest
    assert body["truncated"] is True and body["segments_total"] == 1
    assert sum(len(s["blocks"]) for s in body["segments"]) + len(body["segments"]) == digging.STATE_MAX_ENTRIES
    assert body["allocated_bytes"] == 20_000 * 512
    assert len(answer.content) < 2_000_000  # was every block: 72x the upload per request
    # The same question again is answered from what this process kept: no replay, no listing.
    monkeypatch.setattr(StoredExplorer, "state_at", lambda *_a, **_k: pytest.fail("state computed again"))
    assert client.get(f"/r/{token}/state.json?i=20000").json()["blocks_total"] == 20_001


def test_a_store_past_the_web_limit_is_not_loaded(client: Any, alice: Any, alpha: Any, settings: Any) -> None:
    from tests.webapp.helpers import FIXTURES
    from webapp.snapshots.pages import digging
    from webapp.snapshots.teams import shares
    from webapp.snapshots.worker.tasks import analyse_upload

    upload = make_upload(alpha, alice, FIXTURES / "frag_oom.pickle.gz")
    analyse_upload(upload.id)
    token = shares.share_create(upload, alice)
    digging._stores.clear()
    settings.EXPLORE_MAX_STORE_BYTES = 1000
    answer = client.get(f"/r/{token}/timeline.json?t0=0&t1=100&px=400")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "explore:store-too-large"
    assert not digging._stores
    settings.EXPLORE_MAX_STORE_BYTES = 1 << 30
    assert client.get(f"/r/{token}/timeline.json?t0=0&t1=100&px=400").status_code == 200


def test_the_store_keeps_the_segment_rows(tmp_path: Path) -> None:
    from analysis.explore import store_of_snapshot
    from analysis.reader import read_snapshot

    store = store_of_snapshot(read_snapshot(map_unmap_attack(tmp_path, maps=200)), 0)
    assert store["seg_start"].shape == (1000,)
    assert int(np.sum(store["seg_size"])) == 200 * (5 + 4 + 3 + 2 + 1) * PAGE  # each map and what each unmap left


def test_loads_beyond_the_slots_wait_then_answer_busy(
    client: Any, alice: Any, alpha: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.webapp.helpers import FIXTURES
    from webapp.snapshots.pages import digging
    from webapp.snapshots.teams import shares
    from webapp.snapshots.worker.tasks import analyse_upload

    upload = make_upload(alpha, alice, FIXTURES / "frag_oom.pickle.gz")
    analyse_upload(upload.id)
    token = shares.share_create(upload, alice)
    digging._stores.clear()
    monkeypatch.setattr(digging, "LOAD_WAIT_SECONDS", 0.01)
    held = [digging._load_slots.acquire(timeout=5) for _ in range(digging.STORE_LOADS_AT_ONCE)]
    try:
        answer = client.get(f"/r/{token}/timeline.json?t0=0&t1=100&px=400")
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "explore:busy"
    finally:
        for _ in held:
            digging._load_slots.release()
    assert client.get(f"/r/{token}/timeline.json?t0=0&t1=100&px=400").status_code == 200
