"""Keep freed memory inside a process that runs one analysis: later stages reuse the pages earlier ones touched.

A report allocates and frees columns of millions of rows stage after stage (the read's event columns,
the replays' outputs, the sorts and masks of the analyses). glibc's malloc serves each block of 128 KiB
to 32 MiB and more with its own ``mmap`` and unmaps it when it is freed, so the next stage's arrays come
from fresh pages, and every fresh 4 KiB page is a page fault. On the 2-core VM this project is measured
on, a fault costs about 3 us: the one-process report on the 460 MB benchmark took ~200k faults after
its read, 1.1-1.5 s of system time, as much as the replays' CPU (docs/performance.md, "Pages").

``keep_freed_memory`` makes this process's malloc serve every block from its heap and keep what is freed
there (up to 2 GiB at the heap's top) for the next allocation, as a long-running allocator would. Every
thread allocates from that one heap too (one arena): the report's policy replays run on threads
(``analysis.parallel``), and glibc would give each thread an arena of its own, mapped fresh and trimmed
with ``madvise`` as it shrinks; in a process with threads on several CPUs each trim interrupts the
others to flush their TLBs. On the 460 MB benchmark one arena halved the report's system time
(0.7-1.0 s to 0.3-0.5 s) and took its wall time from 1.3-1.7 s to 1.05-1.2 s. Only
for a process that runs one analysis and exits (the CLI, the worker's child): its memory goes back to the
system when it exits, and the peak it reaches is not raised (the next arrays take the freed pages; the
bench's peak figures check it). The library itself never calls it: a process that imports ``analysis``
for anything else keeps its allocator as it was.

It also tells numpy not to ask for transparent huge pages for its arrays (numpy asks for arrays of 4 MiB and
more): with the heap kept, most arrays land on pages already touched, and a fresh one on this VM costs more
as one 2 MiB page than as 512 small ones (the host backs it at first touch). Five interleaved pairs of
first-run reports on the 460 MB benchmark: 1.07-1.15 s wall without them, 1.13-1.22 s with them (system
time 0.38-0.46 s against 0.47-0.55 s).
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

# glibc's mallopt parameters (malloc.h): a negative number names each.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
KEEP_AT_TOP = 2**31 - 1  # bytes: mallopt takes an int; freed memory at the heap's top beyond this goes back


def keep_freed_memory() -> bool:
    """Serve every block from the heap and keep freed memory there; whether this malloc took it
    (False off glibc, e.g. macOS or musl, where the process's allocator is left as it was)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # Both or neither: without mmap, a heap that trims would hand back and fault in the same pages.
    kept = mallopt(M_TRIM_THRESHOLD, KEEP_AT_TOP) == 1 and mallopt(M_MMAP_MAX, 0) == 1
    if kept:
        _no_huge_pages_for_arrays()
    return bool(kept and mallopt(M_ARENA_MAX, 1) == 1)


def _no_huge_pages_for_arrays() -> None:
    """numpy's own switch (a private one, present since numpy 1.20; left alone where it is not)."""
    setter = getattr(getattr(getattr(np, "_core", None), "multiarray", None), "_set_madvise_hugepage", None)
    if setter is not None:
        setter(False)
