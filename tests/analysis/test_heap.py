"""analysis.heap: a process that keeps freed memory touches its pages once, not once per allocation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Allocate, touch every page of, and free a 64 MiB block twice; print the page faults of each round.
PROBE = """
import json, resource, sys
from analysis.heap import keep_freed_memory
took = keep_freed_memory() if sys.argv[1] == "keep" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def one_round():
    before = faults()
    block = bytearray(64 << 20)
    block[:: 4096] = b"x" * len(range(0, len(block), 4096))
    del block
    rounds.append(faults() - before)
rounds = []
for _ in range(2):
    if sys.argv[2] == "threads":  # each round on a thread of its own (RUSAGE_SELF counts them all)
        import threading
        t = threading.Thread(target=one_round)
        t.start()
        t.join()
    else:
        one_round()
print(json.dumps({"took": took, "rounds": rounds}))
"""


def _probe(mode: str, where: str = "main") -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, where], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_second_round_reuses_the_first_rounds_pages() -> None:
    pages = (64 << 20) // 4096
    plain = _probe("plain")
    kept = _probe("keep")
    assert kept["took"] is True
    first, second = kept["rounds"]  # type: ignore[misc]
    # Without it both rounds fault in every page (the block is mmapped and unmapped each time) ...
    assert all(r >= pages * 0.9 for r in plain["rounds"]), plain  # type: ignore[attr-defined]
    # ... with it the first round does, the second finds them in the heap.
    assert first >= pages * 0.9, kept
    assert second < pages * 0.05, kept


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_thread_reuses_the_pages_another_thread_freed() -> None:
    """The report's policy replays run on threads: their memory comes from the one heap that keeps
    what is freed, not from a fresh arena per thread."""
    pages = (64 << 20) // 4096
    kept = _probe("keep", "threads")
    first, second = kept["rounds"]  # type: ignore[misc]
    assert first >= pages * 0.9, kept
    assert second < pages * 0.05, kept


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_numpy_asks_for_no_huge_pages_once_the_heap_is_kept() -> None:
    probe = (
        "import numpy as np; from analysis.heap import keep_freed_memory; "
        "before = np._core.multiarray._get_madvise_hugepage(); keep_freed_memory(); "
        "print(before, np._core.multiarray._get_madvise_hugepage())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["True", "False"]
