"""The compiled replay loops: when they run, and their hand-over from the Python loops.

``analysis.allocator._replaycore`` (C, ``analysis/allocator/_replaycore.c``) holds the per-event loops of
the allocator model (``policy._Model.run``) and of the recorded replay
(``recorded._Replayer.run``), each written again statement for statement over the same
Python state (free lists, blocks, dicts keyed by address), calling back into the
Python methods for everything those loops do not inline. The loops pass every number of
the allocator's rules in (``AllocatorConfig.split_rule``, ``fit_limit``'s
``max_split_size`` and ``max_non_split_rounding_size``, ``round_size``), so the rules keep
their one definition in ``analysis.allocator.config``. The Python loops stay the
reference: ``tests/analysis/test_replaycore.py`` runs both on every fixture and on the
captures and demands identical results and report JSON. The recorded replay (``recorded_core``) keeps its
whole state in C instead, every method of ``recorded._Replayer`` that moves it written again there; it calls
back only ``_issue``, ``_meta_of_event`` and a ``round_size`` that does not round plainly.

Which loops run: the compiled ones when the extension is built (``make install``),
unless the environment sets ``OOMSCOPE_REPLAY=python``. ``loops_in_use()`` says which
(``python -m analysis --version``).
"""

from __future__ import annotations

import os
from typing import Any

from analysis.model import (
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
)

try:  # built by `make install` (setup.py build_ext --inplace); absent without a compiler
    from analysis.allocator import _replaycore  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the machine
    _replaycore = None

ENV_VAR = "OOMSCOPE_REPLAY"


def available() -> bool:
    """Whether the compiled loops are built on this machine."""
    return _replaycore is not None


def wanted() -> bool:
    """Whether the replays run the compiled loops (built, and not turned off by ``OOMSCOPE_REPLAY=python``)."""
    return _replaycore is not None and os.environ.get(ENV_VAR, "").strip().lower() != "python"


def loops_in_use() -> str:
    """``compiled`` or ``python``, with the reason when it is the Python one."""
    if not available():
        return "python (the compiled replay loops are not built)"
    if not wanted():
        return f"python ({ENV_VAR}=python)"
    return "compiled (analysis.allocator._replaycore)"


def policy_run(
    model: Any, events: Any, ops: list[int], raddrs: list[int], sizes: list[int], lks: list[int], **rules: Any
) -> list[int]:
    """``policy._Model.run`` in C; ``rules`` are the numbers ``run`` inlines (its own locals) and the
    request codes (``op_alloc``, ``op_free``, ...: ``policy._OP_CODES``; ``requests`` imports the
    recorded replay, which imports this module, so they come from the caller)."""
    failed: list[int] = _replaycore.policy_run(model, events, ops, raddrs, sizes, lks, dict(rules))
    return failed


def recorded_core(act: bytes, addr: Any, size: Any, stream: Any, pool: Any, stops: list[int], **rules: Any) -> Any:
    """``recorded._Replayer``'s state in C, empty, over one device's trace (``act``: the action codes as
    bytes; ``addr``, ``size``: int64 arrays; ``stream``, ``pool``: the trace's columns, read at segment
    events); ``stops``: the events a strict pass never fuses a free across; ``rules`` are the numbers and
    the callables ``run`` uses (its own locals)."""
    params = dict(
        rules,
        alloc=ALLOC,
        free_requested=FREE_REQUESTED,
        free_completed=FREE_COMPLETED,
        seg_alloc=SEGMENT_ALLOC,
        seg_free=SEGMENT_FREE,
        seg_map=SEGMENT_MAP,
        seg_unmap=SEGMENT_UNMAP,
    )
    return _replaycore.recorded_core(act, addr, size, stream, pool, stops, params)
