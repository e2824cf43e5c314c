"""The device's limit and its last OOM explained, read off the recorded replay.

``explain(...) -> Explained``: the limit (``outline.chosen_limit``), the last OOM explained
(``oom.explain_oom``), what each explained OOM's request could use (``oom.UsableFree``), and a warning
when the pasted OOM message cannot be this trace's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.allocator.config import AllocatorConfig
from analysis.allocator.recorded import RecordedReplay
from analysis.limits import Limit, OomMessage
from analysis.model import Snapshot
from analysis.oom import UsableFree, explain_oom, flush_window_start
from analysis.stages.outline import Facts, chosen_limit
from analysis.stages.replays import Recorded
from analysis.timeline import values_at


@dataclass(frozen=True)
class Explained:
    """The device's limit and, with an OOM, what the last one shows (``oom.explain_oom``)."""

    limit: Limit | None  # the known limit, else the trace's with an OOM, else None
    oom: dict[str, Any] | None
    usable: dict[int, UsableFree]  # what each explained OOM's request could use


def explain(
    snapshot: Snapshot,
    facts: Facts,
    recorded: Recorded,
    message: OomMessage | None,
    warnings: list[tuple[str, str]],
) -> Explained:
    """The limit and the last OOM explained; a warning into ``warnings`` where the message cannot be it."""
    replay, cols, trace = recorded.replay, recorded.cols, facts.dev.trace
    usable = {k: _usable_free(facts, replay, k) for k in facts.explained}
    chosen = chosen_limit(snapshot, facts)
    if facts.oom_index is None:
        return Explained(chosen, None, usable)
    i = facts.oom_index
    assert chosen is not None  # with an OOM, the trace bounds the limit
    at = {k: int(v[0]) for k, v in values_at(cols, np.array([i])).items()}
    oom = explain_oom(
        trace,
        i,
        allocated=at["allocated"],
        reserved=at["reserved"],
        cached_free=at["cached_free"],
        largest_free=at["largest_free"],
        chosen=chosen,
        all_ooms=int(facts.ooms.size),
        usable=usable.get(i),
    )
    # The process's memory outside PyTorch's cache, as the message printed it (sizing's GPU fit).
    oom["non_pytorch_bytes"] = (
        message.non_pytorch.value if message is not None and message.non_pytorch is not None else None
    )
    if message is not None:
        mismatch = _message_mismatch(message, oom, facts.recorded_cfg)
        if mismatch is not None:
            warnings.append(mismatch)
    return Explained(chosen, oom, usable)


def _usable_free(facts: Facts, replay: RecordedReplay, index: int) -> UsableFree:
    """What the OOM request at ``index`` could have used (``oom.UsableFree``)."""
    trace = facts.dev.trace
    before = replay.blocks_at(flush_window_start(trace, index) - 1)
    return UsableFree(trace, index, before, replay.blocks_at(index), facts.recorded_cfg)


def _message_mismatch(message: OomMessage, oom: dict[str, Any], cfg: AllocatorConfig) -> tuple[str, str] | None:
    """A warning when the pasted message cannot be this trace's last OOM."""
    wanted = cfg.allocation_size(int(oom["requested_bytes"]))
    problems = []
    if not message.tried.low <= wanted <= message.tried.high and not (
        message.tried.low <= int(oom["requested_bytes"]) <= message.tried.high
    ):
        problems.append(f"it tried to allocate {message.tried.text}, the trace's last OOM {wanted:,} bytes")
    if message.allocated is not None and not (
        message.allocated.low <= int(oom["allocated_bytes"]) <= message.allocated.high
    ):
        problems.append(f"it shows {message.allocated.text} allocated, the trace {int(oom['allocated_bytes']):,} bytes")
    if not problems:
        return None
    return (
        "oom-message-mismatch",
        "the OOM message does not match the trace's last OOM (" + "; ".join(problems) + "): it may come "
        "from another run or another OOM; its limit is used all the same",
    )
