"""Shared test helpers: where the real fixtures live; under ``CI=true``, no skipped test passes.

A test skips when something it needs is missing (chromium, playwright, a fixture file). On a
laptop that is friendly; in CI it would let the suite pass half-run. With ``CI=true`` every
skip is reported as a failure, with the skip's own reason, and the database must be
PostgreSQL (``.ci/run`` starts one and sets ``DATABASE_URL``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def ci_strict() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


def pytest_sessionstart(session: pytest.Session) -> None:
    if ci_strict() and not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise pytest.UsageError(
            "CI=true: the suite must run on PostgreSQL (DATABASE_URL=postgres://...); "
            f"DATABASE_URL is {os.environ.get('DATABASE_URL')!r}. Run .ci/run, or unset CI for a local run on SQLite."
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    report = yield
    if ci_strict() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (
            f"CI=true: a skipped test fails here, because CI must not pass half-run. Skip reason: {reason}"
        )
    return report


# Opt-in suites are not collected unless asked for (rather than skipped: under CI=true a skip fails the run).
collect_ignore = [] if os.environ.get("OOMSCOPE_HUGE") == "1" else ["webapp/test_ux_huge.py"]
