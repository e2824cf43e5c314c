"""Errors a user can act on, each with a stable code.

A ``SnapshotError`` means "this file is not a usable snapshot"; its ``code``
reads ``snapshot:<area>:<reason>`` and never changes once published (the web
app stores it and the CLI prints it). Anything else escaping ``analysis`` is a
bug.
"""

from __future__ import annotations


class SnapshotError(ValueError):
    """Base of every refusal of an input file."""

    area = "input"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    @property
    def code(self) -> str:
        return f"snapshot:{self.area}:{self.reason}"

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class FormatError(SnapshotError):
    """Not a snapshot container we read (not pickle/gzip/zip/json, truncated, ...)."""

    area = "format"


class UnsafeError(SnapshotError):
    """The pickle asks for something that could run code (globals, reduce, ...)."""

    area = "unsafe"


class LimitError(SnapshotError):
    """A cap on size, depth or expansion was exceeded."""

    area = "limit"


class SchemaError(SnapshotError):
    """The data loaded but is not shaped like a snapshot."""

    area = "schema"


class ConfigError(ValueError):
    """An allocator configuration string (``--whatif``) that cannot be parsed."""

    code = "config:invalid"
