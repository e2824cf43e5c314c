"""The recorded replay and the requests, built once per device and handed to every policy replay.

``start(...) -> Started`` starts the replays that need nothing more (the check; the what-ifs of a trace
without an OOM) at once; ``record(...) -> Recorded`` builds the one recorded replay (``allocator.recording``)
and the requests, and starts the rest. ``running(jobs, explore)`` holds the pool the replays run on.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis import explore as explore_mod
from analysis.allocator import ReplaySource, Requests, build_requests, needs_recorded_state, replay_check
from analysis.allocator import compiled as compiled_loops
from analysis.allocator.bursts import reads_recorded_state
from analysis.allocator.config import AllocatorConfig
from analysis.allocator.recorded import RecordedReplay
from analysis.model import Snapshot
from analysis.parallel import Pending, Pool
from analysis.stacks import StackCatalog
from analysis.stages.outline import Facts, Outline
from analysis.stages.whatifs import Planned, submit_whatifs
from analysis.timeline import Columns, columns_of

# Who takes each device's explore store (``explore.ExploreSink``): the report's caller names it here.
Sink = explore_mod.ExploreSink
LaterSink = explore_mod.ExploreLater
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Started:
    """What starts before the trace's facts are read (``start``)."""

    source: ReplaySource  # the recorded replay, built on its first need
    requests: Requests | None  # None: no events, or they wait for record (as the replays do)
    check: Pending | None
    planned: list[Planned] | None  # the what-ifs, where they could start


@dataclass(frozen=True)
class Recorded:
    """The recorded replay and its columns, and the requests every policy replay is fed."""

    replay: RecordedReplay
    requests: Requests | None  # None: no events
    cols: Columns  # the replay's columns, some read at a few events only (timeline.values_at)


def start(
    snapshot: Snapshot, outline: Outline, pool: Pool, user_whatifs: list[str], warnings: list[tuple[str, str]]
) -> Started:
    """The device's requests and the replays that need nothing more, started at once: the check,
    and the what-ifs of a trace without an OOM (no failing step to project), where neither the
    requests nor they read the recorded replay (``reads_recorded_state``, ``needs_recorded_state``).
    On a second CPU they run while the trace's facts are found and the recorded replay runs (the
    engine holds no GIL). Else they wait for ``record``, so that the recorded replay, built once,
    keeps the states the facts name."""
    dev, recorded_cfg = outline.dev, outline.recorded_cfg
    source = ReplaySource(snapshot, dev)
    if not outline.n:
        return Started(source, None, pool.submit(lambda: empty_replay_check(snapshot)), None)
    if reads_recorded_state(dev) or needs_recorded_state(dev, recorded_cfg):
        return Started(source, None, None, None)
    requests = build_requests(snapshot, dev, source)
    check = pool.submit(lambda: replay_check(snapshot, dev, requests=requests))
    planned = None
    if outline.oom_index is None:
        planned = submit_whatifs(pool, snapshot, outline, None, requests, user_whatifs, outline.known_limit, warnings)
    return Started(source, requests, check, planned)


def record(
    snapshot: Snapshot,
    facts: Facts,
    started: Started,
    pool: Pool,
    user_whatifs: list[str],
    warnings: list[tuple[str, str]],
) -> tuple[Recorded, Pending, list[Planned] | None]:
    """The recorded replay and the requests, each built once and handed to every replay.

    The policy replays start before the recorded replay when nothing they need comes from it
    (``allocator.needs_recorded_state``: else it is built first, so that no forked child builds
    its own): the check and the what-ifs (already started, then: ``start``); the what-ifs
    unless their limit is the one an OOM shows (then they start once the OOM is explained)."""
    dev, source, requests = facts.dev, started.source, started.requests
    source.keep(facts.keep)
    if requests is None and facts.n:
        requests = build_requests(snapshot, dev, source)
    if needs_recorded_state(dev, facts.recorded_cfg):
        source.get()
    check = started.check or pool.submit(lambda: replay_check(snapshot, dev, requests=requests))
    planned = started.planned
    if planned is None and (facts.oom_index is None or facts.known_limit is not None):
        planned = submit_whatifs(
            pool, snapshot, facts, facts.projection, requests, user_whatifs, facts.known_limit, warnings
        )
    replay = source.get()
    return Recorded(replay, requests, columns_of(replay)), check, planned


def empty_replay_check(snapshot: Snapshot) -> dict[str, Any]:
    cfg = AllocatorConfig.from_settings(snapshot.settings.raw, snapshot.settings.conf)
    return {
        "recorded_config": cfg.to_conf(),
        "segment_events_recorded": 0,
        "segment_events_reproduced": 0,
        "exact": True,
    }


@dataclass(frozen=True)
class Runner:
    """Where one report's policy replays run (``parallel.Pool``), and who takes each device's explore store."""

    pool: Pool
    explore: Sink | None
    later: LaterSink | None = None  # takes a function that makes the store, called after the report

    @property
    def keeps_checkpoints(self) -> bool:
        """Whether the recorded replay keeps the explore store's states (some sink takes a store)."""
        return self.explore is not None or self.later is not None


@contextmanager
def running(jobs: int, explore: Sink | None, later: LaterSink | None = None) -> Iterator[Runner]:
    """The pool for one report, the cyclic GC off meanwhile: the replays allocate millions of
    short-lived objects and create no cycles worth collecting, so its passes are pure overhead.
    The compiled policy engine serves its requests without the GIL: threads then run the replays
    side by side at none of a fork's costs (``analysis.parallel``); the Python loops need processes."""
    was_enabled = gc.isenabled()
    gc.disable()
    pool = Pool(jobs, threads=compiled_loops.wanted())
    try:
        yield Runner(pool, explore, later)
    finally:
        pool.close()
        if was_enabled:
            gc.enable()


def explore_into(runner: Runner, snapshot: Snapshot, facts: Facts, catalog: StackCatalog, recorded: Recorded) -> None:
    """The device's explore store (``explore.explore_store``), made from this report's own recorded replay
    (its checkpoints kept by the same pass), handed to the report's sink where there is one; to a
    ``later`` sink, the function that makes it (it holds the replay until called)."""
    dev = facts.dev
    if runner.explore is not None:
        runner.explore(dev.device, explore_mod.explore_store(snapshot, dev, catalog, recorded.replay, facts.lifetimes))
    if runner.later is not None:
        replay, lifetimes = recorded.replay, facts.lifetimes
        runner.later(dev.device, lambda: explore_mod.explore_store(snapshot, dev, catalog, replay, lifetimes))
