"""The capture doctor on the training machine: what a dump lacks, in one line with the call that avoids it.

Said before the dump is uploaded (``python -m oomscope_client upload``) and in the rank's verdict block.
Standard library only: it reads the file's size and the sidecar ``dump_on_oom`` wrote (its ``history``: how
``record()`` started recording; ``n_trace_events``; ``dump_seconds``), never the pickle.
The site's own doctor (``analysis/doctor.py``) reads the snapshot itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RECORD = "torch.cuda.memory._record_memory_history"
# A ring sized from one dry step keeps this many steps and a quarter more, at least DEFAULT_MAX_ENTRIES,
# rounded up: the same rule as analysis.doctor.sized_max_entries (tests/client/test_doctor.py holds them equal).
DEFAULT_MAX_ENTRIES = 1_000_000
STEPS_KEPT = 100
# A dump slower than this with stacks="all" is called out (such dumps take minutes on long runs).
SLOW_DUMP_SECONDS = 10.0


def sized_max_entries(per_step: int | None, steps: int = STEPS_KEPT) -> int:
    if not per_step:
        return DEFAULT_MAX_ENTRIES
    wanted = max(DEFAULT_MAX_ENTRIES, per_step * steps * 5 // 4)
    scale = 10 ** (len(str(wanted)) - 1)
    return -(-wanted // scale) * scale


@dataclass(frozen=True)
class Problem:
    code: str
    line: str  # the problem and the call that avoids it, one line
    usable: bool  # False: uploading it is pointless (the site refuses it too)


def problems(path: str | os.PathLike[str], sidecar: Mapping[str, Any] | None) -> list[Problem]:
    """What is wrong with how this dump was captured, from its size and its sidecar."""
    if os.path.getsize(path) == 0:
        return [
            Problem(
                "empty-file",
                f"{path} is empty (0 bytes): the dump never finished (killed while writing, or the disk was full); "
                f"write it with torch.cuda.memory._dump_snapshot(path) before the process exits, or use "
                "oomscope_client.dump_on_oom() (it writes atomically)",
                usable=False,
            )
        ]
    side = sidecar or {}
    history = side.get("history") if isinstance(side.get("history"), Mapping) else {}
    events = [int(n) for n in side.get("n_trace_events") or [] if isinstance(n, int)]
    out: list[Problem] = []
    if "n_trace_events" in side and not any(events):
        out.append(
            Problem(
                "no-history",
                f"no allocation history in the dump: call {RECORD}(max_entries={DEFAULT_MAX_ENTRIES:_}) "
                "(or oomscope_client.record()) before the model is built",
                usable=True,
            )
        )
    out.extend(_history_problems(history, events, side.get("dump_seconds")))
    return out


def _history_problems(history: Mapping[str, Any], events: list[int], dump_seconds: Any) -> list[Problem]:
    out: list[Problem] = []
    cap = history.get("max_entries")
    if isinstance(cap, int) and events and max(events) >= cap:
        per_step = history.get("events_per_step")
        out.append(
            Problem(
                "ring-full",
                f"the ring buffer is full ({max(events):,} events = max_entries): it dropped the start of the run; "
                f"record(dry_step=train_step) sizes it from one step, or {RECORD}(max_entries="
                f"{sized_max_entries(per_step if isinstance(per_step, int) else None):_})",
                usable=True,
            )
        )
    before = history.get("allocated_before")
    if isinstance(before, int) and before > 0:
        out.append(
            Problem(
                "history-started-late",
                f"recording started with {before:,} bytes already allocated: they have no history or stacks; "
                "call oomscope_client.record() before the model is built or moved to the GPU",
                usable=True,
            )
        )
    slow = isinstance(dump_seconds, (int, float)) and dump_seconds >= SLOW_DUMP_SECONDS
    if history.get("stacks") == "all" and slow:
        out.append(
            Problem(
                "stacks-all",
                f"this dump took {dump_seconds:.0f} s because of stacks='all' (C++ frames); the verdict needs only "
                'the Python frames: record(stacks="python")',
                usable=True,
            )
        )
    return out
