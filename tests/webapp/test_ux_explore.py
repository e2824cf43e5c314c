"""Digging endpoints (issue 10, item 2): zoom detail from stored columns, the allocator's state at an
event from the recorded replay, one block's stacks; checked against a replay run here."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from django.core.files.storage import default_storage
from django.test import Client

from analysis.allocator.recorded import recorded_replay
from analysis.reader import read_snapshot
from tests.webapp.helpers import FIXTURES, make_upload
from webapp.snapshots.models import Upload

pytestmark = pytest.mark.django_db


@pytest.fixture
def done(alice: Any, alpha: Any) -> Upload:
    from webapp.snapshots.worker.tasks import analyse_upload

    upload = make_upload(alpha, alice, FIXTURES / "gpt_varlen_oom.pickle.gz")
    analyse_upload(upload.id)
    upload.refresh_from_db()
    assert upload.status == Upload.Status.DONE
    return upload


@pytest.fixture(scope="module")
def replay() -> Any:
    snap = read_snapshot(FIXTURES / "gpt_varlen_oom.pickle.gz")
    return recorded_replay(snap, snap.devices[0]), snap


def test_state_at_an_event_is_the_replays(alice_client: Any, done: Upload, replay: Any) -> None:
    rep, _ = replay
    for i in (int(rep.peak_reserved_index), int(rep.peak_allocated_index), 12_345):
        body = alice_client.get(f"/s/{done.code}/state.json?i={i}").json()
        assert body["event"]["index"] == i
        assert body["allocated_bytes"] == int(rep.allocated[i])
        assert body["reserved_bytes"] == int(rep.reserved[i])
        assert body["requested_bytes"] == int(rep.requested[i])
        assert body["largest_free_bytes"] == int(rep.largest_free[i])
        # The blocks add up: segments to reserved, allocated blocks to allocated.
        assert sum(s["size"] for s in body["segments"]) == int(rep.reserved[i])
        live = [b for s in body["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
        assert sum(b["size"] for b in live) == int(rep.allocated[i])
        for seg in body["segments"]:
            assert sum(b["size"] for b in seg["blocks"]) == seg["size"]
    # At the peak of reserved memory the truth file's peak is what the segments hold.
    import json

    truth = json.loads((FIXTURES / "gpt_varlen_oom.truth.json").read_text())["memory_stats"]
    at_peak = alice_client.get(f"/s/{done.code}/state.json?i={int(rep.peak_reserved_index)}").json()
    assert at_peak["reserved_bytes"] == truth["reserved_bytes.all.peak"]


def test_block_stacks(alice_client: Any, done: Upload, replay: Any) -> None:
    rep, snap = replay
    i = int(rep.peak_allocated_index)
    body = alice_client.get(f"/s/{done.code}/state.json?i={i}").json()
    block = next(b for s in body["segments"] for b in s["blocks"] if b.get("alloc_event") is not None)
    info = alice_client.get(f"/s/{done.code}/block.json?alloc={block['alloc_event']}").json()
    trace = snap.devices[0].trace
    k = info["alloc_event"]
    assert info["address"] == block["address"] == hex(int(trace.addr[k]))
    expected = [f.name for f in snap.stacks.frames_of(int(trace.stack[k]))]
    assert [f["name"] for f in info["alloc_frames"]] == expected and expected
    if info["free_event"] is not None:
        assert info["free_event"] > i and int(trace.addr[info["free_event"]]) == int(trace.addr[k])
    bad = alice_client.get(f"/s/{done.code}/block.json?alloc=0")  # event 0 is a segment_alloc
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "explore:not-an-allocation"


def test_zoom_reads_stored_columns_down_to_single_events(alice_client: Any, done: Upload, replay: Any) -> None:
    rep, snap = replay
    name = f"explore/{done.sha256}/0.npz"
    assert default_storage.exists(name)  # stored by the worker at analysis time, before any request
    wide = alice_client.get(f"/s/{done.code}/timeline.json?t0=0&t1={rep.events}&px=100").json()
    assert wide["full_detail"] is False and wide["points"] <= 4 * 100 + 4
    assert max(wide["reserved_bytes"]) == int(rep.peak_reserved)  # min/max per pixel: the peak survives
    narrow = alice_client.get(f"/s/{done.code}/timeline.json?t0=35400&t1=35500&px=1200").json()
    # Every event but the free requests completed at the next event (drawn there, with the same
    # reserved and allocated bytes; in between torch's requested counter lags for one event).
    action = snap.devices[0].trace.action
    fused = {i for i in range(35400, 35501) if action[i] == 1 and action[i + 1] == 2}  # 1, 2: free req/completed
    expected = sorted({i + 1 if i in fused else i for i in range(35400, 35501)})
    assert narrow["full_detail"] is True and narrow["index"] == expected
    assert narrow["elided"] == 101 - len(expected) > 0
    assert narrow["allocated_bytes"] == rep.allocated[expected].tolist()
    assert all(r <= a for r, a in zip(narrow["requested_bytes"], narrow["allocated_bytes"], strict=True))
    assert narrow["what"][narrow["index"].index(35479)].startswith("oom 708.62 MiB")
    assert len(narrow["what"]) == narrow["points"]
    np.testing.assert_array_equal(narrow["requested_bytes"], rep.requested[expected])


def test_bad_parameters_are_clear_errors(alice_client: Any, done: Upload) -> None:
    for query, code in (
        ("i=abc", "explore:bad-param"),
        ("i=999999999", "explore:bad-event"),
        ("", "explore:missing-param"),
    ):
        r = alice_client.get(f"/s/{done.code}/state.json?{query}")
        assert r.status_code == 400 and r.json()["error"]["code"] == code, (query, r.content)
    r = alice_client.get(f"/s/{done.code}/state.json?i=1&device=7")
    assert r.status_code == 404 and r.json()["error"]["code"] == "explore:no-device"


def test_through_a_share_link_and_not_after_revoking(done: Upload, alice: Any) -> None:
    from webapp.snapshots.teams import shares

    token = shares.share_create(done, alice)
    anon = Client()
    r = anon.get(f"/r/{token}/state.json?i=100")
    assert r.status_code == 200 and r["Referrer-Policy"] == "no-referrer"
    assert anon.get(f"/r/{token}/timeline.json?t0=0&t1=50").json()["full_detail"] is True
    assert set(anon.get(f"/r/{token}/charts.json").json()["charts"]) >= {"stacks-0", "whatif-0"}
    shares.share_revoke(done)
    assert anon.get(f"/r/{token}/state.json?i=100").status_code == 404
    assert anon.get(f"/r/{token}/charts.json").status_code == 404


def test_page_embeds_the_first_chart_and_charts_json_the_rest(alice_client: Any, done: Upload) -> None:
    """Issue 10: the report page's HTML holds the timeline (without its hover text) and the empty
    active-memory chart; every other chart and the hover text come from charts.json, whole."""
    import json
    import re

    from webapp.snapshots.pages import payloads

    stored = payloads.report_for(done).charts
    page = alice_client.get(f"/s/{done.code}/").content.decode()
    embedded = dict(re.findall(r'<script id="chart-data-([^"]+)" type="application/json">(.*?)</script>', page, re.S))
    assert sorted(embedded) == ["active-0", "segtime-0", "timeline-0"]  # explore.js fills the empty two
    later = [n for n in stored if n not in embedded]
    assert later and all(f'data-chart="{n}" data-later="1"' in page for n in later)
    body = alice_client.get(f"/s/{done.code}/charts.json").json()
    assert body["charts"] == {n: stored[n] for n in later}
    # The hover text: one entry per plotted point, the chart's own ("alloc 12.00 MiB · ..."), blank in the page.
    timeline = json.loads(embedded["timeline-0"])
    source = next(
        n for n in _walk(stored["timeline-0"]["doc"]) if n.get("attributes", {}).get("name") == "timeline-source"
    )
    columns = dict(source["attributes"]["data"]["entries"])
    assert body["hover"]["timeline-0"] == columns["what"] and len(columns["what"]) > 100
    blank = next(n for n in _walk(timeline["doc"]) if n.get("attributes", {}).get("name") == "timeline-source")
    assert dict(blank["attributes"]["data"]["entries"])["what"] == [""] * len(columns["what"])
    assert len(json.dumps(timeline)) < len(json.dumps(stored["timeline-0"]))


def _walk(node: Any) -> Any:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def test_active_memory_bands_stack_the_replays_live_blocks(alice_client: Any, done: Upload, replay: Any) -> None:
    """Each band is a live allocation; at each sample the stack's height is the requested bytes of the
    replay's allocated blocks there (blocks_at), and bands never overlap."""
    rep, _ = replay
    body = alice_client.get(f"/s/{done.code}/active.json?t0=35000&t1=35300&px=1200").json()
    assert body["samples"] == 301  # a narrow range: every event is a sample
    for event, height in list(zip(body["sample_events"], body["sample_bytes"], strict=True))[::50]:
        state = rep.blocks_at(event)
        live = sum(b.requested_size for s in state.segments for b in s.blocks if b.state == "active_allocated")
        assert height == live, event
    data = body["data"]
    assert len(data["xs"]) == body["bands"] > 0
    assert all(label == "" or isinstance(label, str) for label in data["label"])
    assert any(".py:" in label for label in data["label"])
    # Bands at one sample do not overlap: their [bottom, top) intervals are disjoint.
    at = 35150
    spans = []
    for xs, ys, size in zip(data["xs"], data["ys"], data["size"], strict=True):
        half = len(xs) // 2
        top_x, top_y = xs[:half], ys[:half]
        if not top_x[0] <= at <= top_x[-1]:
            continue  # not alive at that sample
        for k in range(half):
            if top_x[k] <= at and (k + 1 == half or top_x[k + 1] > at):
                spans.append((top_y[k] - size, top_y[k]))
                break
    spans.sort()
    assert len(spans) > 10
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_block_free_stack_with_cpp_frames(alice_client: Any, alice: Any, alpha: Any) -> None:
    """stacks="all", context="all" (big_all_stacks): a block's free stack is its own, C++ frames included."""
    from webapp.snapshots.worker.tasks import analyse_upload

    upload = make_upload(alpha, alice, FIXTURES / "big_all_stacks.pickle.gz")
    analyse_upload(upload.id)
    upload.refresh_from_db()
    snap = read_snapshot(FIXTURES / "big_all_stacks.pickle.gz")
    rep = recorded_replay(snap, snap.devices[0])
    at = int(rep.peak_allocated_index)
    state = alice_client.get(f"/s/{upload.code}/state.json?i={at}").json()
    assert state["free_records_stack"] is True
    block = next(
        b for s in state["segments"] for b in s["blocks"] if b.get("alloc_event") is not None and b.get("free_event")
    )
    info = alice_client.get(f"/s/{upload.code}/block.json?alloc={block['alloc_event']}").json()
    trace = snap.devices[0].trace
    names = [f["name"] for f in info["alloc_frames"]]
    free_names = [f["name"] for f in info["free_frames"]]
    # Every frame of each event's own recorded stack, C++ ones too (the allocator's malloc and free).
    assert names == [f.name for f in snap.stacks.frames_of(int(trace.stack[info["alloc_event"]]))]
    assert free_names == [f.name for f in snap.stacks.frames_of(int(trace.stack[info["free_event"]]))]
    assert any("DeviceCachingAllocator::malloc" in n for n in names)
    assert any("DeviceCachingAllocator::free" in n for n in free_names)


def test_answers_come_from_the_workers_store_without_reading_the_snapshot(
    alice_client: Any, done: Upload, replay: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10: the web process only reads the store the worker made; it never reads or replays the
    snapshot. States on both sides of a checkpoint (the store keeps one after every 16,384 events:
    after events 16,383 and 32,767 here) are the replay's, block by block."""
    from analysis.explore import CHECKPOINT_EVERY
    from webapp.snapshots.pages import digging

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the web process read the snapshot")

    import analysis.reader

    monkeypatch.setattr(analysis.reader, "read_snapshot", refuse)
    digging._stores.clear()
    rep, _ = replay
    for i in (-1, CHECKPOINT_EVERY - 1, CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY - 2, rep.events - 1):
        body = alice_client.get(f"/s/{done.code}/state.json?i={i}").json()
        want = rep.blocks_at(i)
        got = [(s["address"], [(b["address"], b["size"], b["state"]) for b in s["blocks"]]) for s in body["segments"]]
        assert got == [
            (hex(s.address), [(hex(b.address), b.size, b.state) for b in s.blocks])
            for s in sorted(want.segments, key=lambda s: s.address)
        ]
        assert body["allocated_bytes"] == want.figures().allocated
    assert alice_client.get(f"/s/{done.code}/timeline.json?t0=0&t1=100&px=100").status_code == 200
    assert alice_client.get(f"/s/{done.code}/active.json?t0=0&t1=1000&px=100").status_code == 200


def test_a_report_without_a_timeline_embeds_its_charts_whole() -> None:
    """A snapshot without history has no timeline to draw first: its charts stay in the page."""
    from webapp.snapshots.pages import chartpage

    charts = {"segments-peak-0": {"doc": {"roots": []}}, "stacks-0": {"doc": {"roots": []}}}
    assert chartpage.first(charts) == charts
    with_timeline = {**charts, "timeline-0": {"doc": {"roots": []}}}
    assert chartpage.first(with_timeline)["stacks-0"] == chartpage.LATER
