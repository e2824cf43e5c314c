"""The capture doctor: what a file that reads as a snapshot but cannot fully answer lacks, and the call that fixes it.

It reads the report's own findings (the reader's and the recorded replay's capture warnings, the steps, the
stacks kind) and says what went wrong in the capture, not in the run: no history, history recorded as state
only, a ring buffer (``max_entries``) that dropped the start, history started after the model was built,
events without stacks, ``stacks="all"`` (C++ frames: slow dumps), and nothing at all (no segment, no event:
dumped by a process that never allocated). The findings ride on the report (``capture.doctor``); the report
page, the API and the CLI show them. A file the site cannot use at all (0 bytes) is refused at intake
(``snapshot:format:empty``, whose message names the call).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# What the doctor advises for a whole run when the trace gives no step to size from.
DEFAULT_MAX_ENTRIES = 1_000_000
# A ring sized from the events of one step keeps this many steps (with a quarter more for the model's build).
STEPS_KEPT = 100
RECORD = "torch.cuda.memory._record_memory_history"


@dataclass(frozen=True)
class Finding:
    """One capture problem: the warning code it reads, the problem in one line, the call that avoids it."""

    code: str
    problem: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "problem": self.problem, "fix": self.fix}


def events_per_step(dev: Mapping[str, Any]) -> int | None:
    """The most events one complete step of the trace took (None: no complete step)."""
    counts = [
        int(s["last_event"]) - int(s["first_event"]) + 1
        for s in dev.get("steps") or []
        if s.get("complete") and s.get("first_event") is not None and s.get("last_event") is not None
    ]
    return max(counts) if counts else None


def sized_max_entries(per_step: int | None) -> int:
    """A ring that keeps ``STEPS_KEPT`` steps (and the build), rounded up to a round number."""
    if not per_step:
        return DEFAULT_MAX_ENTRIES
    wanted = max(DEFAULT_MAX_ENTRIES, per_step * STEPS_KEPT * 5 // 4)
    scale: int = 10 ** (len(str(wanted)) - 1)
    return -(-wanted // scale) * scale


def _ring(dev: Mapping[str, Any]) -> Finding:
    n = int(dev.get("events") or 0)
    per_step = events_per_step(dev)
    if per_step is None:
        held = "no whole step"
    elif n < per_step:
        held = f"less than one step of about {per_step:,} events"
    else:
        held = f"about {n / per_step:.1f} steps of {per_step:,} events"
    entries = sized_max_entries(per_step)
    return Finding(
        "trace-truncated",
        f"the ring buffer kept only the last {n:,} events (max_entries={n:,}: {held}): the start, the model's "
        "build and the early steps were dropped, so peaks are lower bounds",
        f"{RECORD}(max_entries={entries:_})"
        + (f" keeps at least {STEPS_KEPT} such steps" if per_step else "")
        + ", or oomscope_client.record(dry_step=train_step) sizes it from one step",
    )


def _by_code(code: str, message: str) -> Finding | None:
    """The findings that follow from a capture warning alone."""
    if code == "no-history":
        return Finding(
            code,
            "no allocation history: only the state at the dump is in the file, so no peak, step or OOM can be shown",
            f"{RECORD}(max_entries={DEFAULT_MAX_ENTRIES:_}) before the model is built, then dump "
            "(or oomscope_client.record())",
        )
    if code == "state-only":
        return Finding(
            code,
            "history was recorded as state only (enabled='state'): the trace has no events to replay",
            f'{RECORD}(enabled="all", max_entries={DEFAULT_MAX_ENTRIES:_})',
        )
    if code == "history-started-late":
        return Finding(
            code,
            "history started after the model was built: "
            + message.split(":")[0]
            + "; they have no stacks and the peaks are lower bounds",
            f"call {RECORD}(...) (or oomscope_client.record()) first, before the model is built or moved to the GPU",
        )
    if code == "no-frames":
        return Finding(
            code,
            "the events carry no stacks (recorded with context=None or 'state'): nothing names the code that allocated",
            f'{RECORD}(context="all", stacks="python")',
        )
    return None


def _empty() -> Finding:
    return Finding(
        "empty-capture",
        "nothing was recorded: no segment and no event, so there is nothing to show (the dump came from a "
        "process that never allocated on the GPU, or before anything was allocated)",
        f"{RECORD}(max_entries={DEFAULT_MAX_ENTRIES:_}) at the start of the process that uses the GPU, and dump "
        "there (oomscope_client.record() and dump_on_oom() do both)",
    )


def _all_stacks(dump_seconds: float | None) -> Finding:
    took = f" (this one took {dump_seconds:.0f} s)" if dump_seconds else ""
    return Finding(
        "stacks-all",
        f"recorded with stacks='all' (C++ frames): a dump takes minutes on a long run{took} and the file is "
        "several times larger, while the verdict needs only the Python frames",
        f'{RECORD}(stacks="python", max_entries={DEFAULT_MAX_ENTRIES:_})',
    )


def findings(
    capture: Mapping[str, Any], devices: Sequence[Mapping[str, Any]], *, dump_seconds: float | None = None
) -> list[Finding]:
    """The capture's problems, each once, in the order a user fixes them."""
    if not devices:
        return [_empty()]
    out: list[Finding] = []
    seen: set[str] = set()
    for warning in capture.get("warnings") or []:
        code = str(warning.get("code") or "")
        message = str(warning.get("message") or "")
        if code in seen or (code == "state-only" and "no-history" in seen):
            continue  # no event at all is no history, not history recorded as state
        if code == "trace-truncated":
            dev = next((d for d in devices if (d.get("events") or 0) > 1), devices[0] if devices else {})
            found: Finding | None = _ring(dev)
        else:
            found = _by_code(code, re.sub(r"^device \d+: ", "", message))
        if found is not None:
            seen.add(code)
            out.append(found)
    if capture.get("stacks") == "all":
        out.append(_all_stacks(dump_seconds))
    return out


def sidecar_dump_seconds(sidecar: Mapping[str, Any] | None) -> float | None:
    """How long the client's dump took (its sidecar's ``dump_seconds``), if it says."""
    value = (sidecar or {}).get("dump_seconds")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
