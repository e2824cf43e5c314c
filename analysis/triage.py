"""What a CUDA OOM's text alone says: the message, and ``torch.cuda.memory_summary()`` if there is one.

Most people who ran out of memory have only the exception's message, no snapshot. Its figures
(``analysis.limits.parse_oom_message``) already settle the first question a report answers, from
arithmetic alone: could this request have fitted?

- *room*: what the process could still take when the request failed. Under a per-process cap
  ("N allowed") torch refuses once its reserved memory plus the request passes the cap, so the room
  is ``allowed - reserved``; the device itself has ``free`` left. The smaller of the two is the
  limit that bound (``binding``). The *shortfall* is the request minus that room.
- *fragmentation*: when the request failed, the allocator had already released every cached
  segment it could (``release_cached_blocks``) and retried. What is still reserved but unallocated
  lies inside segments that also hold live tensors: free, but in pieces. If those pieces add up to
  the shortfall, the memory existed and was not in one piece; ``expandable_segments`` lets segments
  grow in place instead.
- *memory outside the process's cache*: other processes on the device ("Process N has X memory
  in use") and this process's memory that PyTorch's cache does not hold (the CUDA context, cuBLAS,
  NCCL, other libraries). They count only when the device, not the cap, was what ran out; then no
  ``PYTORCH_CUDA_ALLOC_CONF`` setting gives that memory back.
- *capacity*: neither covers the shortfall; the program must need less at that moment.

Every figure torch prints is rounded (``Figure`` is the range it stands for), so each verdict says
whether it holds over the whole range (``certain``).

``memory_summary()`` adds what the message lacks: how the free memory splits between the large and
the small pool (small-pool pieces never serve a request above 1 MiB), how many free pieces there are
(so bounds on the largest), the peaks, how many OOMs and cache flushes the process has had, and
whether ``max_split_size_mb`` is set (oversize counts). It is often printed after the exception
unwound and the tensors were freed; the triage compares its current figures with the message's and
uses its current columns only when they are the state at the OOM.

What no text gives, and a snapshot does, is listed in ``SNAPSHOT_ADDS`` with the lines that record one.

Pure: stdlib only (``limits`` is stdlib too). Its rooms: ``memory_summary`` (the summary's parser,
``TriageError``), ``triage_figures`` (the figures worked out once, and the findings that word them);
here, the verdict: the cause, how far to trust it, and the change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from analysis.limits import Figure, OomMessage, OomMessageError, parse_oom_message
from analysis.memory_summary import MemorySummary, parse_memory_summary
from analysis.triage_figures import (
    Arithmetic,
    Finding,
    FreePieces,
    arithmetic,
    covers,
    findings,
    share,
    total_of,
)

SCHEMA = "oomscope.triage/1"

# The verdicts (``Triage.cause``).
OUTSIDE = "outside-process"  # other processes, or this process's memory outside PyTorch's cache
FRAGMENTATION = "fragmentation"  # the cache's free pieces add up to the shortfall
CAPACITY = "capacity"  # the program needed more than there was
UNEXPLAINED = "unexplained"  # the message's own figures show room for the request

RECORD_SNAPSHOT = """import torch

# As early as possible, before the first CUDA allocation, so the trace is complete.
torch.cuda.memory._record_memory_history(max_entries=1_000_000)

try:
    train()
except torch.cuda.OutOfMemoryError:
    torch.cuda.memory._dump_snapshot("oom.pickle")
    raise"""

SNAPSHOT_ADDS = (
    "which lines of your code held the memory at the OOM and at the peak (parameters, gradients, optimizer "
    "state, activations, temporaries)",
    "the phase the OOM came in (forward, backward, optimizer step, evaluation without no_grad) and whether "
    "memory grows from step to step (a leak), with the step where the limit is reached",
    "a replay of the whole run under expandable_segments, max_split_size_mb and garbage_collection_threshold: "
    "whether a setting avoids the OOM or only postpones it to a later step",
    "the largest free block and where the free pieces lie, exactly, instead of the bounds the text allows",
)


@dataclass(frozen=True, slots=True)
class Triage:
    """What the text alone answers; ``to_json()`` is the API's body (docs/contract.md)."""

    message: OomMessage
    summary: MemorySummary | None
    summary_timing: str | None  # at-oom | after-oom | other | None (no summary)
    binding: str  # per-process-cap | device
    room: Figure  # what the process could still take under the binding limit
    shortfall: Figure  # the request minus the room
    unallocated: Figure | None  # reserved by PyTorch but unallocated
    usable_unallocated: Figure | None  # of that, what a request of this size can use (large pool, at the OOM)
    other_processes: Figure | None  # every other process on the device, together
    non_pytorch: Figure | None  # this process's memory outside PyTorch's cache
    unaccounted: Figure | None  # in use on the device by no process the message lists
    free_pieces: FreePieces | None
    cause: str
    certain: bool
    confidence: str  # high | low: how far to trust the change
    confidence_reason: str
    headline: str
    change: str
    findings: tuple[Finding, ...]
    alternatives: tuple[str, ...]
    snapshot_adds: tuple[str, ...] = field(default=SNAPSHOT_ADDS)
    record_snapshot: str = RECORD_SNAPSHOT

    def to_json(self) -> dict[str, Any]:
        def fig(f: Figure | None) -> dict[str, Any] | None:
            return None if f is None else f.to_json()

        return {
            "schema": SCHEMA,
            "cause": self.cause,
            "certain": self.certain,
            "confidence": self.confidence,
            "confidence_reason": self.confidence_reason,
            "headline": self.headline,
            "change": self.change,
            "alternatives": list(self.alternatives),
            "findings": [f.to_json() for f in self.findings],
            "binding_limit": self.binding,
            "figures": {
                "tried_to_allocate": fig(self.message.tried),
                "limit": fig(self.message.limit),
                "limit_kind": self.message.limit_kind,
                "room": fig(self.room),
                "shortfall": fig(self.shortfall),
                "unallocated": fig(self.unallocated),
                "usable_unallocated": fig(self.usable_unallocated),
                "other_processes": fig(self.other_processes),
                "non_pytorch": fig(self.non_pytorch),
                "unaccounted": fig(self.unaccounted),
                "free_pieces": None if self.free_pieces is None else self.free_pieces.to_json(),
            },
            "message": self.message.to_json(),
            "summary": None if self.summary is None else self.summary.to_json(),
            "summary_timing": self.summary_timing,
            "snapshot_adds": list(self.snapshot_adds),
            "record_snapshot": self.record_snapshot,
        }


def triage(message_text: str, summary_text: str | None = None) -> Triage:
    """Triage one OOM from its message and, optionally, ``torch.cuda.memory_summary()``'s output.

    ``OomMessageError`` (from ``parse_oom_message``) for a message that is not torch's; ``TriageError``
    for a summary that is not one, or a message without the figures a triage needs.
    """
    message = parse_oom_message(message_text)
    summary = parse_memory_summary(summary_text) if summary_text and summary_text.strip() else None
    a = arithmetic(message, summary)
    outside = total_of([f for _, f in a.outside()])
    # The rules in order: memory outside the process first (when the device bound, no setting of this
    # process's allocator can win it back, whatever its cache looks like), then the cache's own pieces.
    if a.shortfall.high == 0 or message.tried.high <= a.room.low:
        cause, certain = UNEXPLAINED, False
    elif a.binding == "device" and covers(outside, a.shortfall) is not False:
        cause, certain = OUTSIDE, bool(covers(outside, a.shortfall)) and a.binding_certain
    elif covers(a.usable, a.shortfall) is not False:
        cause, certain = FRAGMENTATION, bool(covers(a.usable, a.shortfall))
    else:
        cause, certain = CAPACITY, a.shortfall.low > 0
    confidence, confidence_reason = _confidence(cause, certain)
    headline, change, alternatives = _verdict(cause, a)
    return Triage(
        message=message,
        summary=summary,
        summary_timing=a.timing,
        binding=a.binding,
        room=a.room,
        shortfall=a.shortfall,
        unallocated=a.unallocated,
        usable_unallocated=a.usable,
        other_processes=a.others,
        non_pytorch=a.non_pytorch,
        unaccounted=a.unaccounted,
        free_pieces=a.pieces,
        cause=cause,
        certain=certain,
        confidence=confidence,
        confidence_reason=confidence_reason,
        headline=headline,
        change=change,
        findings=tuple(findings(a)),
        alternatives=tuple(alternatives),
    )


# The bench's real reruns (tests/fixtures/captures/, followups/ and heldout/: families with a default run that
# died with a message and an expandable_segments:True rerun) where this triage says fragmentation: how often the
# rerun finished, died at a later step, or died at the same step. Recomputed from the fixtures by
# tests/analysis/test_triage.py::test_fragmentation_odds_are_the_benchs.
FRAGMENTATION_RERUNS = {"runs": 71, "finished": 20, "died_later": 22, "died_same_step": 29}


def _confidence(cause: str, certain: bool) -> tuple[str, str]:
    """How far to trust the change the triage names, and why.

    Memory outside the process and capacity are facts of the message's figures: high when the
    rounding cannot change them (on the bench, every capacity verdict's expandable_segments rerun died
    no later). Fragmentation is a fact about one request only: whether the step, and the steps after
    it, fit is not in the text, and on the bench expandable_segments finished fewer than a third of
    such runs (``FRAGMENTATION_RERUNS``). A snapshot's replay tells which.
    """
    if cause == UNEXPLAINED:
        return "low", "The message's figures do not explain the failure."
    if not certain:
        return "low", "The printed figures are rounded, and the verdict flips within their rounding."
    if cause == FRAGMENTATION:
        r = FRAGMENTATION_RERUNS
        return "low", (
            "The message shows one request, not the step or the steps after it. Of "
            f"{r['runs']} real runs whose message showed fragmentation like this, expandable_segments finished "
            f"{r['finished']}, died at a later step in {r['died_later']} and at the same step in "
            f"{r['died_same_step']}: a snapshot's replay tells which this run is."
        )
    if cause == OUTSIDE:
        return "high", "The message names the memory held outside this process's cache."
    return "high", "Even with every free piece joined, the request did not fit: no allocator setting helps."


def _verdict(cause: str, a: Arithmetic) -> tuple[str, str, list[str]]:
    """(headline, the one change, alternatives) for a cause."""
    message, tried, shortfall, usable = a.message, a.message.tried, a.shortfall, a.usable
    limit_text = (
        f"under the {message.allowed.text} cap"
        if a.binding == "per-process-cap" and message.allowed
        else "on the full device"
    )
    if cause == UNEXPLAINED:
        return (
            f"The message's own figures leave {a.room.text} of room {limit_text} for a {tried.text} request: "
            "the text does not say why it failed (another process may have freed memory in between, or the "
            "request was in a CUDA graph's private pool).",
            "Record a snapshot (below): only the trace can show what failed.",
            [],
        )
    if cause == OUTSIDE:
        held = " and ".join(f"{label} ({fig.text})" for label, fig in a.outside())
        return (
            f"The device was full, and the memory is held outside this process's PyTorch cache: {held}. "
            f"The request for {tried.text} was {shortfall.text} short.",
            "Free that memory where it is held (stop or move the other process, or free what the other library "
            "holds); no PYTORCH_CUDA_ALLOC_CONF setting gives it back.",
            [
                "Run on a device of your own (CUDA_VISIBLE_DEVICES), or give each process a cap with "
                "torch.cuda.set_per_process_memory_fraction so they cannot crowd each other out.",
                *(
                    [
                        f"{usable.text} is reserved but unallocated in this process; expandable_segments may get "
                        "past this one request, but the room is what the other memory leaves."
                    ]
                    if covers(usable, shortfall) is not False
                    else []
                ),
            ],
        )
    if cause == FRAGMENTATION:
        return (
            f"Fragmentation at this request: {usable.text} was reserved but unallocated, which covers the "
            f"{shortfall.text} the {tried.text} request lacked {limit_text}, but not in one piece.",
            "Try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments then grow in place and the free "
            "pieces stop being stranded, which gets past this request. If the step needs more than the limit, "
            "or memory grows from step to step, it only postpones the OOM; record a snapshot to know.",
            [
                "max_split_size_mb:N (e.g. 256) keeps large cached blocks from being split for small requests.",
                "Or make the program need less at that moment (below): that works whatever the layout.",
            ],
        )
    alternatives: list[str] = []
    free = message.device_free
    # A higher cap helps only where the device has the shortfall free.
    if a.binding == "per-process-cap" and free is not None and message.allowed is not None and covers(free, shortfall):
        alternatives.append(
            f"Raise the cap (torch.cuda.set_per_process_memory_fraction): the device still had {free.text} "
            f"free, the cap is {message.allowed.text}."
        )
    outside = a.outside() if a.binding == "device" else []
    if outside:
        total = total_of([f for _, f in outside])
        assert total is not None
        alternatives.append(
            f"Memory held outside this process's cache ({total.text}) covers {share(total, shortfall)}: freeing "
            "it would help, but not enough alone."
        )
    return (
        f"Capacity: the {tried.text} request lacked {shortfall.text} {limit_text}, and only {usable.text} "
        "was reserved but unallocated; even in one piece the memory was not there.",
        "The program must need less at that moment: a smaller batch or sequence, torch.no_grad() for evaluation, "
        "mixed precision, activation checkpointing, a fused or foreach=False optimizer step. An allocator setting "
        "does not help.",
        alternatives,
    )


__all__ = [
    "CAPACITY",
    "FRAGMENTATION",
    "OUTSIDE",
    "RECORD_SNAPSHOT",
    "SNAPSHOT_ADDS",
    "UNEXPLAINED",
    "OomMessageError",
    "Triage",
    "triage",
]
