"""The client's ``upload --wait`` against the site (issue 20): the token from a file or the environment,
never the command line; the verdict and the change printed; a failed analysis exits non-zero.

The site is ``live_server`` (the test's own process); the client runs in a thread, and the test plays the
worker by running the task function on the upload the client made.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.webapp.helpers import FIXTURES

CLIENT = Path(__file__).resolve().parents[2] / "client"


@pytest.fixture
def client_main(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(CLIENT))
    from oomscope_client.__main__ import main

    return main


def _run_client(main: Any, argv: list[str]) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    result: dict[str, Any] = {}

    def run() -> None:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            result["rc"] = main(argv)

    thread = threading.Thread(target=run)
    thread.start()
    result["thread"] = thread
    result["out"], result["err"] = out, err
    return result


def _play_worker(run: dict[str, Any], sha256_of: Path) -> Any:
    """Wait for the client's upload row, analyse it, and wait for the client to finish."""
    import hashlib

    from webapp.snapshots.models import Upload
    from webapp.snapshots.worker.tasks import analyse_upload

    sha = hashlib.sha256(sha256_of.read_bytes()).hexdigest()
    deadline = time.monotonic() + 60
    while not Upload.objects.filter(sha256=sha).exists():
        assert time.monotonic() < deadline and run["thread"].is_alive(), run["err"].getvalue()
        time.sleep(0.1)
    upload = Upload.objects.get(sha256=sha)
    analyse_upload(upload.id)
    run["thread"].join(60)
    assert not run["thread"].is_alive()
    upload.refresh_from_db()
    return upload


def test_upload_wait_prints_the_verdict_and_the_change(
    transactional_db: Any,
    alice: Any,
    alpha: Any,
    alice_token: str,
    live_server: Any,
    client_main: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from webapp.snapshots.models import Report

    token_file = tmp_path / "token"
    token_file.write_text(alice_token + "\n")
    monkeypatch.delenv("OOMSCOPE_TOKEN", raising=False)
    monkeypatch.setenv("OOMSCOPE_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("OOMSCOPE_URL", live_server.url)
    snapshot = FIXTURES / "gpt_varlen_oom.pickle.gz"
    argv = ["upload", str(snapshot), "--project", alpha.slug, "--run", "from-the-client", "--wait"]
    assert alice_token not in " ".join(argv)
    run = _run_client(client_main, argv)
    upload = _play_worker(run, snapshot)
    decision = Report.objects.get(upload=upload).data["devices"][0]["decision"]
    out = run["out"].getvalue().splitlines()
    assert run["rc"] == 0, run["err"].getvalue()
    assert out[0] == decision["headline"]
    # gpt_varlen_oom's steps keep growing: the change is to cap the growth (its expandable rerun died later).
    assert out[1] == f"change: {decision['change']['line']}"
    assert decision["cause"] == "growing_workload" and out[1].startswith("change: max_len = ")
    assert out[2].startswith("limit: at least 6.93 GiB (inferred lower bound)")
    assert out[-1] == f"report: {live_server.url}/s/{upload.code}/"


def test_upload_wait_exits_3_when_the_analysis_fails(
    transactional_db: Any,
    alice: Any,
    alpha: Any,
    alice_token: str,
    live_server: Any,
    client_main: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OOMSCOPE_TOKEN", alice_token)
    monkeypatch.delenv("OOMSCOPE_TOKEN_FILE", raising=False)
    # A valid pickle that is no snapshot: accepted at upload, refused by the worker's reader.
    bad = tmp_path / "notes.pickle"
    bad.write_bytes(b"\x80\x04K\x01.")
    run = _run_client(client_main, ["upload", str(bad), "--url", live_server.url, "--project", alpha.slug, "--wait"])
    upload = _play_worker(run, bad)
    assert upload.status == "failed"
    assert run["rc"] == 3
    err = run["err"].getvalue()
    assert f"the analysis failed: {upload.error_code}: " in err and run["out"].getvalue() == ""
