"""Events out of order (issue 36): refused with ``snapshot:schema:event-order``, never a traceback.

The allocator model follows blocks and segments by address; a trace whose events were swapped,
dropped or repeated made it index past a free list (``IndexError`` in ``_remove``), give back a
segment twice (``KeyError`` in ``_freed``) or free another block than the one named, in the
compiled and the Python loops alike. ``eventorder.check_event_order`` refuses such a trace at the
model's entry. Each attack below is built from a real capture; then a seeded fuzz of swaps, drops
and duplicates of real fixtures' events runs through both readers and both loops and demands a
report or a coded refusal every time (``OOMSCOPE_ORDER_FUZZ_SECONDS``: longer, as ``make
reliability`` runs it; ``OOMSCOPE_ORDER_FUZZ_SEED``: another seed).
"""

from __future__ import annotations

import gzip
import os
import pickle
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from analysis.errors import SnapshotError
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FUZZ_SECONDS = float(os.environ.get("OOMSCOPE_ORDER_FUZZ_SECONDS", "8"))
FUZZ_SEED = int(os.environ.get("OOMSCOPE_ORDER_FUZZ_SEED", "36"))
FUZZ_MAX_CASES = 400 if "OOMSCOPE_ORDER_FUZZ_SECONDS" not in os.environ else 10**9
FUZZ_FILES = [
    "gpu_cuda_graph",
    "gpu_side_stream",
    "gpu_expandable_oom",
    "gpu_maxsplit_oom",
    "gpu_empty_cache",
    "frag_oom",
    "wrapped_ring",
    "gpu_expandable_maxsplit",
]

PATHS = {
    "compiled": {},
    "python": {"OOMSCOPE_REPLAY": "python", "OOMSCOPE_READER": "python"},
}


def _raw(name: str) -> dict[str, Any]:
    with gzip.open(FIXTURES / f"{name}.pickle.gz") as fh:
        data: dict[str, Any] = pickle.load(fh)
    return data


def _with_trace(raw: dict[str, Any], edit: Callable[[list[dict[str, Any]]], None]) -> bytes:
    """The snapshot with its longest trace edited (a copy: the fixture's own stays as read)."""
    traces = [list(t) for t in raw["device_traces"]]
    edit(max(traces, key=len))
    return pickle.dumps({**raw, "device_traces": traces})


def _swap(i: int, j: int) -> Callable[[list[dict[str, Any]]], None]:
    def edit(trace: list[dict[str, Any]]) -> None:
        trace[i], trace[j] = trace[j], trace[i]

    return edit


@pytest.fixture(params=sorted(PATHS))
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    for key in ("OOMSCOPE_REPLAY", "OOMSCOPE_READER"):
        monkeypatch.delenv(key, raising=False)
    for key, value in PATHS[request.param].items():
        monkeypatch.setenv(key, value)
    return str(request.param)


def test_an_alloc_written_before_its_segment_is_refused(path: str) -> None:
    """gpu_cuda_graph events 96/97: a private pool's segment_alloc and the alloc inside it, swapped.
    The alloc then reads as the default pool (torch 2.11 traces carry no pool id: it is read off the
    segment live at the address) and its free as the graph's pool; the expandable what-if indexed past
    a free list (IndexError in ``_remove``)."""
    raw = _raw("gpu_cuda_graph")
    assert [raw["device_traces"][0][k]["action"] for k in (96, 97)] == ["segment_alloc", "alloc"]
    with pytest.raises(SnapshotError) as refused:
        build_report(_with_trace(raw, _swap(96, 97)))
    assert refused.value.code == "snapshot:schema:event-order"
    assert "event 101 (free_requested at 0x7f9b24000000) does not match event 96 (alloc)" in refused.value.message


def test_a_completion_before_its_request_is_refused(path: str) -> None:
    """gpu_maxsplit_oom events 2508/2509: a block's free_completed written before its free_requested
    left a pending free no completion ends (KeyError in ``_freed`` at the next flush)."""
    raw = _raw("gpu_maxsplit_oom")
    pair = [raw["device_traces"][0][k] for k in (2508, 2509)]
    assert [e["action"] for e in pair] == ["free_requested", "free_completed"]
    assert pair[0]["addr"] == pair[1]["addr"]
    with pytest.raises(SnapshotError) as refused:
        build_report(_with_trace(raw, _swap(2508, 2509)))
    assert refused.value.code == "snapshot:schema:event-order"
    assert "event 2508 (free_completed" in refused.value.message


def test_a_segment_allocated_twice_is_refused(path: str) -> None:
    """A repeated segment_alloc made the model place two segments at the recorded address and give
    the address back twice (KeyError in ``_freed``)."""
    raw = _raw("gpu_empty_cache")
    trace = raw["device_traces"][0]
    first = next(k for k, e in enumerate(trace) if e["action"] == "segment_alloc")

    def repeat(events: list[dict[str, Any]]) -> None:
        events.insert(first + 1, events[first])

    with pytest.raises(SnapshotError) as refused:
        build_report(_with_trace(raw, repeat))
    assert refused.value.code == "snapshot:schema:event-order"
    assert f"event {first + 1} (segment_alloc" in refused.value.message


def test_a_swap_of_unrelated_events_is_still_analysed(path: str) -> None:
    """Two neighbours at different addresses that no rule orders (an alloc and another block's free)
    may be written either way round: still a report."""
    raw = _raw("gpu_cuda_graph")
    trace = raw["device_traces"][0]
    assert [trace[k]["action"] for k in (92, 93)] == ["alloc", "free_requested"]
    assert trace[92]["addr"] != trace[93]["addr"]
    report = build_report(_with_trace(raw, _swap(92, 93)))
    assert report["devices"][0]["events"] == len(trace) == 1708


def _mutate(rng: random.Random, trace: list[dict[str, Any]]) -> None:
    """One to five swaps, drops or repeats, of any events or of segment events."""
    kind = rng.choice(["swap", "near", "drop", "repeat", "segment-swap", "segment-drop", "segment-repeat"])
    segments = [k for k, e in enumerate(trace) if e["action"].startswith("segment")] or [0]
    for _ in range(rng.randint(1, 5)):
        i = rng.choice(segments) if kind.startswith("segment") else rng.randrange(len(trace))
        i = min(i, len(trace) - 1)
        if kind in ("swap", "near", "segment-swap"):
            j = rng.randrange(len(trace)) if kind == "swap" else i + rng.randint(-6, 6)
            j = max(0, min(len(trace) - 1, j))
            trace[i], trace[j] = trace[j], trace[i]
        elif kind.endswith("drop"):
            del trace[i]
        else:
            trace.insert(min(len(trace), i + rng.randint(0, 20)), trace[i])


def test_a_fuzz_of_event_order_gives_a_report_or_a_coded_refusal(path: str) -> None:
    """Seeded: the same mutants each run; at least 20, then bounded by FUZZ_SECONDS (and FUZZ_MAX_CASES
    unless it is set)."""
    raws = {name: _raw(name) for name in FUZZ_FILES}
    rng = random.Random(f"{FUZZ_SEED}:{path}")  # noqa: S311 - a seeded fuzz, not a secret
    outcomes: dict[str, int] = {}
    started = time.monotonic()
    cases = 0
    while cases < 20 or (time.monotonic() - started < FUZZ_SECONDS and cases < FUZZ_MAX_CASES):
        cases += 1
        name = rng.choice(FUZZ_FILES)
        data = _with_trace(raws[name], lambda trace: _mutate(rng, trace))
        try:
            build_report(data)
            outcome = "report"
        except SnapshotError as exc:
            outcome = exc.code
        except Exception as exc:  # the finding: anything but a report or a coded refusal
            pytest.fail(f"case {cases} of seed {FUZZ_SEED} ({name}, {path}): {type(exc).__name__}: {exc}")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # The fuzz reaches both ends: mutants the model still analyses and mutants it refuses.
    assert outcomes.get("report", 0) and outcomes.get("snapshot:schema:event-order", 0), outcomes
