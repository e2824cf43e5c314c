"""``oomscope_client.gate.check`` on each answer the site's regression endpoint gives, from a
loopback server that answers as the site does (the real site: test_gate.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from oomscope_client.gate import EXIT_NO_ANSWER, EXIT_PASS, EXIT_REGRESSION, check, parse_percent, result_json


class Site(BaseHTTPRequestHandler):
    answers: list[tuple[int, dict[str, Any]]] = []
    paths: list[str] = []

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        status, body = type(self).answers.pop(0) if len(type(self).answers) > 1 else type(self).answers[0]
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def site() -> Iterator[tuple[str, type[Site]]]:
    handler = type("S", (Site,), {"answers": [], "paths": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", handler
    server.shutdown()
    server.server_close()


PENDING = {"status": "pending", "run": {"name": "r1"}, "regressed": None, "reason": "not summarised"}
DONE_BAD = {
    "status": "done",
    "run": {"name": "r1", "url": "http://x/run/abc/"},
    "regressed": True,
    "reason": "Memory regression.",
}


def test_waits_while_pending_then_fails_on_a_regression(site: tuple[str, type[Site]]) -> None:
    url, handler = site
    handler.answers = [(200, PENDING), (200, PENDING), (200, DONE_BAD)]
    result = check(url, "tok", "alpha", run="r1", max_regression=2.5, wait=30, poll=0.05)
    assert result.exit_code == EXIT_REGRESSION
    assert result.reason == "Memory regression. http://x/run/abc/"
    assert len(handler.paths) == 3
    assert handler.paths[0] == "/api/v1/projects/alpha/regression?run=r1&max_regression=2.5"


def test_gives_up_after_wait(site: tuple[str, type[Site]]) -> None:
    url, handler = site
    handler.answers = [(200, PENDING)]
    result = check(url, "tok", "alpha", wait=0.2, poll=0.05)
    assert result.exit_code == EXIT_NO_ANSWER and "not summarised within 0.2 s" in result.reason


def test_passes_without_regression_and_reports_refusals(site: tuple[str, type[Site]]) -> None:
    url, handler = site
    handler.answers = [(200, {**DONE_BAD, "regressed": False, "reason": "No memory regression."})]
    assert check(url, "tok", "alpha").exit_code == EXIT_PASS
    handler.answers = [(404, {"error": {"code": "not-found", "message": "Not found."}})]
    refused = check(url, "tok", "nope")
    assert refused.exit_code == EXIT_NO_ANSWER and "HTTP 404: not-found: Not found." in refused.reason
    assert check("ftp://x", "tok", "alpha").exit_code == EXIT_NO_ANSWER


@pytest.mark.parametrize(("text", "value"), [("5%", 5.0), ("2.5", 2.5), (" 10 % ", 10.0)])
def test_percent(text: str, value: float) -> None:
    assert parse_percent(text) == value


def test_the_json_carries_the_figures_beyond_the_noise(site: tuple[str, type[Site]]) -> None:
    """Issue 33: without --max-regression the site judges each figure against the noise it learned; the
    CI step's JSON passes on which figures grew past their tolerance, as the site said them (the figures:
    commit 1 of the real fnoise series against its ten main runs, as tests/analysis/test_noise_real.py and
    scripts/noise_series.py compute them)."""
    grown = {"kind": "stack", "name": "scripts/capture_followups.py:80 _feature_cache", "centre_bytes": 140509184,
             "mad_bytes": 786432, "tolerance_bytes": 4663856, "listed_runs": 10, "run_bytes": 247736832,
             "delta_bytes": 107227648}
    url, handler = site
    body = {**DONE_BAD, "regression": {"tolerance": "noise", "beyond_noise": [grown]}}
    handler.answers = [(200, body)]
    result = check(url, "tok", "alpha", run="r1")
    assert result.exit_code == EXIT_REGRESSION
    assert handler.paths[0] == "/api/v1/projects/alpha/regression?run=r1"  # no threshold: the learned noise
    said = json.loads(result_json(result))
    assert said["tolerance"] == "noise" and said["beyond_noise"] == [grown]
    handler.answers = [(200, {**DONE_BAD, "regressed": False, "reason": "No memory regression."})]
    assert json.loads(result_json(check(url, "tok", "alpha")))["beyond_noise"] == []
