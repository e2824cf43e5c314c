"""oomscope's analysis library: read CUDA memory snapshots safely and explain them.

Pure Python + numpy: never imports Django, Celery, Bokeh or torch.
"""

from __future__ import annotations

from analysis.allocator.config import AllocatorConfig
from analysis.errors import ConfigError, SnapshotError
from analysis.model import Snapshot
from analysis.report import build_report, build_whatif
from analysis.timeline import timeline_window

__all__ = [
    "AllocatorConfig",
    "ConfigError",
    "Snapshot",
    "SnapshotError",
    "build_report",
    "build_whatif",
    "timeline_window",
]
