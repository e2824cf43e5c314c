"""scripts/worker_bench.py's non-timing logic: it reads back the worker's own log lines (formatted
here with the format strings in runner.py and tasks.py, so a changed message fails this test) and
splits polled stage samples into per-stage seconds."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("worker_bench", ROOT / "scripts" / "worker_bench.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _format(source: str, start: str) -> str:
    match = re.search(r'"(' + re.escape(start) + r'[^"]*)"', (ROOT / "webapp" / "snapshots" / source).read_text())
    assert match, f"{start!r} not in {source}"
    return match.group(1)


def test_log_figures_and_stage_split() -> None:
    wb = _script()
    child = _format("worker/runner.py", "analysis child exited") % (0, 12.34, 11.9, 2**30, ", warm")
    task = _format("worker/tasks.py", "upload %s: done (") % (7, 13.06)
    older = _format("worker/runner.py", "analysis child exited") % (0, 99.0, 98.0, 2**30, "")
    text = "\n".join([older, "INFO noise", child, task])
    assert wb.log_figures(text) == {"child_rc": 0.0, "child_s": 12.3, "child_cpu_s": 11.9, "task_s": 13.1}
    samples = [(0.4, "queued"), (0.6, "reading"), (2.6, "replaying"), (3.0, "reading"), (3.5, "charting")]
    assert wb.stage_durations(samples, 4.25) == {"queued": 0.2, "reading": 2.5, "replaying": 0.4, "charting": 0.75}
