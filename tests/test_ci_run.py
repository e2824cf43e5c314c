"""CI cannot pass half-run: ``.ci/run`` and the suite under ``CI=true`` (issue 13, item 5).

``.ci/run`` is run for real with stand-ins first on ``PATH`` for what it calls (``pg_isready``,
``pg_ctlcluster``, ``apt-get``, ``make``), so each case decides what is "available" without
touching this machine's PostgreSQL or packages. The skip-to-failure rule of tests/conftest.py
is tried on a one-test file in a child pytest.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CI_RUN = ROOT / ".ci" / "run"


def _stub(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def run_ci(
    tmp_path: Path, *, ci: bool, postgres: bool, chromium: bool
) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    made = tmp_path / "make-called"
    _stub(bin_dir, "pg_isready", "exit 0" if postgres else "exit 2")
    _stub(bin_dir, "pg_ctlcluster", "exit 1")  # starting a cluster fails
    _stub(bin_dir, "apt-get", "exit 100")  # offline: nothing can be installed
    _stub(bin_dir, "make", f'echo "$@ DATABASE_URL=${{DATABASE_URL:-}}" > {made}; exit 0')
    browser = tmp_path / "chromium"
    if chromium:
        _stub(tmp_path, "chromium", "exit 0")
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "DATABASE_URL", "PYTEST_ARGS", "CHROMIUM"}}
    env.update({"PATH": f"{bin_dir}:{env['PATH']}", "CHROMIUM": str(browser), "PG_START_TRIES": "1"})
    if ci:
        env["CI"] = "true"
    result = subprocess.run(["bash", str(CI_RUN)], capture_output=True, text=True, env=env, timeout=60)
    return result, made


def test_ci_fails_without_postgresql(tmp_path: Path) -> None:
    result, made = run_ci(tmp_path, ci=True, postgres=False, chromium=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "CI=true: PostgreSQL is not available on 127.0.0.1:5432; failing" in result.stdout
    assert not made.exists()  # the suite never ran on SQLite


def test_ci_fails_without_chromium(tmp_path: Path) -> None:
    result, made = run_ci(tmp_path, ci=True, postgres=True, chromium=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "CI=true: chromium could not be installed at" in result.stdout
    assert not made.exists()


def test_ci_with_both_runs_the_suite_on_postgresql(tmp_path: Path) -> None:
    result, made = run_ci(tmp_path, ci=True, postgres=True, chromium=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert made.read_text().strip() == "test PYTEST_ARGS=-ra DATABASE_URL=postgres://postgres@127.0.0.1:5432/test"


def test_without_ci_the_local_run_falls_back_and_says_so(tmp_path: Path) -> None:
    result, made = run_ci(tmp_path, ci=False, postgres=False, chromium=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PostgreSQL is not available on 127.0.0.1:5432: the suite runs on SQLite instead" in result.stdout
    assert "the browser test will be skipped" in result.stdout
    assert made.read_text().strip() == "test PYTEST_ARGS=-ra DATABASE_URL="


SKIPPING_TEST = """
import pytest

def test_needs_a_fixture():
    pytest.skip("frag_oom is not among the fixtures")

def test_passes():
    assert 1 + 1 == 2
"""


def child_pytest(tmp_path: Path, env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_child.py").write_text(SKIPPING_TEST)
    env = {k: v for k, v in os.environ.items() if k not in {"CI", "DATABASE_URL"}}
    env.update({"PYTHONPATH": str(ROOT), **env_extra})
    plugins = ["-p", "no:cacheprovider", "-p", "no:django", "-p", "tests.conftest"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *plugins, "-c", os.devnull, "--rootdir", str(tmp_path), "test_child.py"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


@pytest.mark.parametrize("ci", [False, True])
def test_a_skip_is_a_failure_only_under_ci(tmp_path: Path, ci: bool) -> None:
    extra = {"CI": "true", "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/unused"} if ci else {}
    result = child_pytest(tmp_path, extra)
    out = result.stdout + result.stderr
    if ci:
        assert result.returncode == 1, out
        assert "1 failed, 1 passed" in out
        assert "CI=true: a skipped test fails here" in out and "frag_oom is not among the fixtures" in out
    else:
        assert result.returncode == 0, out
        assert "1 passed, 1 skipped" in out


def test_ci_refuses_to_run_on_sqlite(tmp_path: Path) -> None:
    result = child_pytest(tmp_path, {"CI": "true"})
    assert result.returncode == 4, result.stdout + result.stderr  # pytest's usage error
    assert "CI=true: the suite must run on PostgreSQL" in result.stderr
