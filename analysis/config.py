"""Allocator settings and size rules: moved to ``analysis.allocator.config`` (re-exported
here so existing imports keep working)."""

from analysis.allocator.config import *  # noqa: F403
from analysis.allocator.config import (  # noqa: F401  (names a star import skips)
    _parse_divisions,
    _roundup_power2_next_division,
)
from analysis.errors import ConfigError  # noqa: F401
