"""Every OOM of a trace, each explained as the report explains its last one.

The report's ``oom`` object is the last OOM of a device (the one that ended the
run); a trace can hold earlier ones that the program caught and survived
(``frag_oom`` has two). ``list_ooms`` gives all of them, in event order, with the
same keys as ``analysis.oom.explain_oom`` plus ``tried_to_allocate_bytes``: the
size torch's message prints ("Tried to allocate 710.00 MiB"), which is the
rounded allocation size of the request (``AllocatorConfig.allocation_size``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from analysis.allocator.config import AllocatorConfig
from analysis.limits import Limit
from analysis.model import Trace
from analysis.oom import UsableFree, explain_oom, oom_indices
from analysis.timeline import values_at

I64 = npt.NDArray[np.int64]


def tried_to_allocate(cfg: AllocatorConfig, requested: int) -> int:
    """What torch's OOM message names: ``get_allocation_size(round_size(size))``."""
    return int(cfg.allocation_size(cfg.round_size(int(requested))))


def list_ooms(
    trace: Trace,
    columns: Mapping[str, I64],
    *,
    config: AllocatorConfig,
    chosen: Limit,
    step_last_events: I64 | None = None,
    usable: Mapping[int, UsableFree] | None = None,
) -> list[dict[str, Any]]:
    """``devices[].ooms``: one explained OOM per OOM event, oldest first.

    ``config`` is the recorded allocator settings (for the size torch names), ``chosen`` the device's limit
    (the report's ``oom`` uses the same), ``step_last_events`` the steps' last events
    (each OOM's ``step``; None without steps), ``usable`` what each OOM's request could have used, by event
    index (``oom.UsableFree``; an OOM without one keeps ``largest_usable_free_block_bytes`` null).
    """
    cfg = config
    found = oom_indices(trace)
    at = {name: v.tolist() for name, v in values_at(columns, found).items()}
    out = []
    for k, i in enumerate(found.tolist()):
        item = explain_oom(
            trace,
            int(i),
            allocated=at["allocated"][k],
            reserved=at["reserved"][k],
            cached_free=at["cached_free"][k],
            largest_free=at["largest_free"][k],
            all_ooms=int(found.size),
            chosen=chosen,
            usable=None if usable is None else usable.get(int(i)),
        )
        item["ordinal"] = k + 1
        item["step"] = (
            int(np.searchsorted(step_last_events, i, side="left"))
            if step_last_events is not None and len(step_last_events)
            else None
        )
        item["tried_to_allocate_bytes"] = tried_to_allocate(cfg, item["requested_bytes"])
        out.append(item)
    return out
