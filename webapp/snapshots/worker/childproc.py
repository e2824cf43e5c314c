"""What every analysis child starts with, cold (``runner``) or spare (``warmchild``): where it runs, its
environment and its tie to the worker. One module both import, so neither imports the other."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def _load_prctl() -> Callable[[int, int], int] | None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl  # type: ignore[no-any-return,unused-ignore]
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _load_prctl()  # looked up once, before any fork
_PR_SET_PDEATHSIG = 1


def detach() -> None:
    """In the child between fork and exec: its own session, and killed with the worker that started it
    (a killed worker takes its analysis with it instead of leaving an orphan running)."""
    os.setsid()
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def child_env() -> dict[str, str]:
    """The child's environment: the worker's, without its secrets, and no job in it (that is the
    job file's, ``child.Job``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "REDIS_", "SECRET_", "STORAGE_"))}
    env["PYTHONPATH"] = str(REPO_ROOT)
    # One BLAS thread: thread stacks count against RLIMIT_AS and the work is not BLAS-bound.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    return env
