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

from analysis.allocator import recorded as recorded_mod
from analysis.allocator.requests import Requests
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# Two devices; the GC threshold's limit bound and a wrapped trace's starting state each read the
# recorded replay inside the policy replays (they built it again, up to 13 times, before issue 17).
CASES = ["two_gpu_pipeline.pickle.gz", "gpu_gc_threshold.pickle.gz", "wrapped_ring.pickle.gz"]


def _count_constructions(monkeypatch: pytest.MonkeyPatch, log: Path) -> None:
    replayer_init = recorded_mod._Replayer.__init__
    requests_init = Requests.__init__

    def replayer(self: Any, device: Any, cfg: Any) -> None:
        with log.open("a") as fh:
            fh.write(f"replay {device.device} {os.getpid()}\n")
        replayer_init(self, device, cfg)

    def requests(self: Any, *args: Any, **kwargs: Any) -> None:
        requests_init(self, *args, **kwargs)
        with log.open("a") as fh:
            fh.write(f"requests {self.source.device.device} {os.getpid()}\n")

    monkeypatch.setattr(recorded_mod._Replayer, "__init__", replayer)
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
    from analysis.allocator.requests import reads_recorded_state
    from analysis.reader import read_snapshot

    snapshot = read_snapshot(path)
    for dev in (d for d in snapshot.devices if len(d.trace)):
        source = ReplaySource(snapshot, dev)
        build_requests(snapshot, dev, source)
        assert reads_recorded_state(dev) or not source.built
