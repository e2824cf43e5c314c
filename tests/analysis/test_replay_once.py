"""One recorded replay and one request stream per device, whatever reads them (issue 17).

The report builds each device's recorded replay once (``allocator.recording.ReplaySource``) and its
requests once (``build_requests``) and hands both to every policy replay: the check, each what-if,
the limit's GC bound, a partial trace's starting state. The counts are taken where the objects are
made (``_Replayer``, the engine behind every ``recorded_replay``; ``Requests``), so a new call site
anywhere cannot escape them, and in forked children too (each construction appends a line to a
file), so a what-if that rebuilt its own in a child of the pool fails as well.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from analysis.allocator import replayer as replayer_mod
from analysis.allocator.requests import Requests
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Two devices; the GC threshold's limit bound and a wrapped trace's starting state each read the
# recorded replay inside the policy replays (they built it again, up to 13 times, before issue 17).
CASES = ["two_gpu_pipeline.pickle.gz", "gpu_gc_threshold.pickle.gz", "wrapped_ring.pickle.gz"]


def _count_constructions(monkeypatch: pytest.MonkeyPatch, log: Path) -> None:
    replayer_init = replayer_mod._Replayer.__init__
    requests_init = Requests.__init__

    def replayer(self: Any, device: Any, cfg: Any) -> None:
        with log.open("a") as fh:
            fh.write(f"replay {device.device} {os.getpid()}\n")
        replayer_init(self, device, cfg)

    def requests(self: Any, *args: Any, **kwargs: Any) -> None:
        requests_init(self, *args, **kwargs)
        with log.open("a") as fh:
            fh.write(f"requests {self.source.device.device} {os.getpid()}\n")

    monkeypatch.setattr(replayer_mod._Replayer, "__init__", replayer)
    monkeypatch.setattr(Requests, "__init__", requests)


def _counts(log: Path) -> Counter[tuple[str, int]]:
    rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return Counter((kind, int(device)) for kind, device, _pid in rows)


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("name", CASES)
def test_one_recorded_replay_and_one_request_stream_per_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, jobs: int
) -> None:
    log = tmp_path / "built.txt"
    _count_constructions(monkeypatch, log)
    report = build_report(FIXTURES / name, jobs=jobs)
    devices = [d["device"] for d in report["devices"] if d["events"]]
    assert devices, "the fixture has no trace to replay"
    assert len(report["devices"][0]["whatif"]) >= 3  # several policy replays did read the requests
    expected = Counter({(kind, d): 1 for d in devices for kind in ("replay", "requests")})
    assert _counts(log) == expected


def test_the_counter_sees_a_second_replay(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The count must catch a rebuild: a what-if called without the report's requests builds both again."""
    from analysis.allocator import whatif
    from analysis.reader import read_snapshot

    log = tmp_path / "built.txt"
    snapshot = read_snapshot(FIXTURES / "wrapped_ring.pickle.gz")
    _count_constructions(monkeypatch, log)
    build_report(FIXTURES / "wrapped_ring.pickle.gz", jobs=1)
    whatif(snapshot, snapshot.devices[0], "expandable_segments:True")
    assert _counts(log)[("replay", snapshot.devices[0].device)] == 2


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.pickle.gz")), ids=lambda p: p.name)
def test_requests_read_the_recorded_replay_only_where_reads_recorded_state_says_they_may(path: Path) -> None:
    """The report builds a trace's requests before it knows which states the recorded replay keeps
    only where ``reads_recorded_state`` is False: a trace whose requests did build it then would
    have it built without those states, and each read later would replay the trace again."""
    from analysis.allocator import ReplaySource, build_requests
    from analysis.allocator.bursts import reads_recorded_state
    from analysis.reader import read_snapshot

    snapshot = read_snapshot(path)
    for dev in (d for d in snapshot.devices if len(d.trace)):
        source = ReplaySource(snapshot, dev)
        build_requests(snapshot, dev, source)
        assert reads_recorded_state(dev) or not source.built


def _count_partial_replays(monkeypatch: pytest.MonkeyPatch, log: Path) -> None:
    """Every event ``blocks_at`` replays again (``_Replayer.state_after``: from the last index
    asked for when the calls come in order, else from the start), one line per call."""
    state_after = replayer_mod._Replayer.state_after

    def counted(self: Any, index: int) -> Any:
        resumed = self.demand_pos is not None and index + 1 >= self.demand_pos
        events = index + 1 - (self.demand_pos if resumed else 0) if index >= 0 else 0
        with log.open("a") as fh:
            fh.write(f"{self.n} {events}\n")
        return state_after(self, index)

    monkeypatch.setattr(replayer_mod._Replayer, "state_after", counted)


# The GC's bound of the limit read a state of the recorded replay at every new segment, and the
# cache probe of build_requests' flushes a state at each ambiguous flush, each state not kept replayed
# again: on densenet_c90_gc07 (33,688 events) 404 partial replays, 59,375 events. The bound reads a
# column of the one pass now (RecordedReplay.whole_free_segments), and the probe's states are kept
# by that pass (_CacheProbe.expect): none.
@pytest.mark.parametrize(
    "name", ["gpu_gc_threshold.pickle.gz", "captures/densenet_c90_gc07.pickle.gz", "wrapped_ring.pickle.gz"]
)
def test_no_state_is_replayed_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> None:
    log = tmp_path / "partial.txt"
    _count_partial_replays(monkeypatch, log)
    report = build_report(FIXTURES / name, jobs=1)
    assert any(d["events"] for d in report["devices"])
    rows = [tuple(map(int, line.split())) for line in log.read_text().splitlines()] if log.exists() else []
    assert sum(events for _n, events in rows) == 0, rows[:5]


def test_the_counter_sees_a_partial_replay(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from analysis.allocator.recorded import recorded_replay
    from analysis.reader import read_snapshot

    snapshot = read_snapshot(FIXTURES / "gpu_gc_threshold.pickle.gz")
    replay = recorded_replay(snapshot, snapshot.devices[0])
    log = tmp_path / "partial.txt"
    _count_partial_replays(monkeypatch, log)
    replay.blocks_at(1000)  # not kept: replayed from the start up to it
    assert log.read_text().split() == [str(replay.events), "1001"]


@pytest.mark.parametrize("name", ["gpu_gc_threshold.pickle.gz", "captures/densenet_c75_gc07.pickle.gz"])
def test_the_whole_free_column_is_what_the_states_show(name: str) -> None:
    """``whole_free_segments`` (read by the GC's bound of the limit) against the states themselves."""
    from analysis.allocator.recorded import recorded_replay
    from analysis.model import INACTIVE
    from analysis.reader import read_snapshot

    snapshot = read_snapshot(FIXTURES / name)
    dev = snapshot.devices[0]
    replay = recorded_replay(snapshot, dev)
    seen = set()
    for i in range(-1, replay.events, max(1, replay.events // 500)):
        state = replay.blocks_at(i)
        want = sum(
            1
            for seg in state.segments
            if seg.pool == 0
            and seg.segment_type == "large"
            and not seg.is_expandable
            and len(seg.blocks) == 1
            and seg.blocks[0].state == INACTIVE
        )
        assert replay.whole_free_segments(i) == want, f"event {i}"
        seen.add(want)
    assert len(seen) > 1  # the column moves on these traces
