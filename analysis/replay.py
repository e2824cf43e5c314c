"""The recorded replay: moved to ``analysis.allocator.recorded`` (re-exported here so
existing imports keep working)."""

from analysis.allocator.recorded import *  # noqa: F403
from analysis.allocator.recorded import RecordedReplay, recorded_replay  # noqa: F401
