"""The uploader's transport against a recording HTTP server on 127.0.0.1: headers, multipart body, streaming.

This server only records the bytes it receives (which the real site cannot show) and answers
what no oomscope site answers: redirects and a proxy's HTML error page. Every refusal the real
API gives is tested against the running site in test_upload_site.py.
"""

from __future__ import annotations

import email.parser
import email.policy
import hashlib
import json
import os
import subprocess
import sys
import threading
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from oomscope_client.upload import MultipartBody, UploadError, api_url, upload

CLIENT_DIR = Path(__file__).resolve().parents[2] / "client"
TOKEN = "tok_test_0123456789"


class _Recorder(BaseHTTPRequestHandler):
    """Stores what it received; replies as the contract says (202 + id/status/url/api_url)."""

    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        digest, kept, remaining = hashlib.sha256(), bytearray(), length
        while remaining:  # read in pieces, so the server side stays small too
            piece = self.rfile.read(min(remaining, 1 << 16))
            if not piece:
                break
            remaining -= len(piece)
            digest.update(piece)
            if self.server.keep_body:
                kept += piece
        self.server.requests.append(
            {
                "path": self.path,
                "headers": dict(self.headers.items()),
                "body": bytes(kept),
                "length": length,
                "received": length - remaining,
                "sha256": digest.hexdigest(),
            }
        )
        status, payload = self.server.reply
        if status in (301, 302, 307, 308):
            self.send_response(status)
            self.send_header("Location", "https://example.invalid/api/v1/snapshots")
            self.end_headers()
            return
        raw = self.server.reply_raw or json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html" if self.server.reply_raw else "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass


class _Server(ThreadingHTTPServer):
    requests: list[dict]
    reply: tuple[int, object]
    reply_raw: bytes | None
    keep_body: bool


@pytest.fixture
def server():
    srv = _Server(("127.0.0.1", 0), _Recorder)
    srv.requests = []
    srv.keep_body = True
    srv.reply_raw = None
    srv.reply = (
        202,
        {"id": "k3J9x", "status": "queued", "url": "/s/k3J9x/", "api_url": "/api/v1/snapshots/k3J9x"},
    )
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _base(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def _parts(headers: dict, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """Parse multipart/form-data with the stdlib email parser (independent of our encoder)."""
    head = f"Content-Type: {headers['Content-Type']}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    assert message.is_multipart()
    parts = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        parts[name] = (part.get_filename(), part.get_payload(decode=True))
    return parts


@pytest.fixture
def snapshot_file(tmp_path):
    # bytes that look like multipart syntax must pass through untouched
    data = os.urandom(200_000) + b"\r\n--oomscope-fake\r\n\r\n" + os.urandom(1000) + b"--\r\n"
    path = tmp_path / "oom-rank0.pickle.gz"
    path.write_bytes(data)
    return path


def test_posts_multipart_with_bearer_token_and_fields(server, snapshot_file):
    result = upload(
        snapshot_file,
        _base(server),
        TOKEN,
        project="llm-pretrain",
        run="run-42",
        tags=["h200", "bf16"],
        note="OOM at step 23 ✓",
    )
    assert result == server.reply[1]
    (req,) = server.requests
    assert req["path"] == "/api/v1/snapshots"
    assert req["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert "Transfer-Encoding" not in req["headers"]  # Content-Length, never chunked
    assert req["received"] == req["length"] == len(req["body"])
    parts = _parts(req["headers"], req["body"])
    assert set(parts) == {"project", "run", "tags", "note", "file"}
    assert parts["project"] == (None, b"llm-pretrain")
    assert parts["run"] == (None, b"run-42")
    assert parts["tags"] == (None, b"h200,bf16")
    assert parts["note"] == (None, "OOM at step 23 ✓".encode())
    assert parts["file"] == ("oom-rank0.pickle.gz", snapshot_file.read_bytes())


def test_optional_fields_are_left_out(server, snapshot_file):
    upload(snapshot_file, _base(server) + "/api/v1/snapshots/", TOKEN)
    (req,) = server.requests
    assert req["path"] == "/api/v1/snapshots"
    assert set(_parts(req["headers"], req["body"])) == {"file"}


def test_body_length_is_exact_and_file_is_streamed_in_chunks(snapshot_file):
    body = MultipartBody([("project", "p")], "file", snapshot_file, chunk_bytes=4096)
    pieces = list(body)
    assert sum(map(len, pieces)) == len(body)
    file_pieces = pieces[1:-1]
    assert max(map(len, file_pieces)) == 4096
    assert b"".join(file_pieces) == snapshot_file.read_bytes()
    assert list(body) == pieces  # a second pass (a retry) gives the same bytes


def test_large_upload_does_not_hold_the_file_in_memory(server, tmp_path):
    big = tmp_path / "big.pickle"
    size = 24 << 20
    with big.open("wb") as f:
        for _ in range(size >> 20):
            f.write(os.urandom(1 << 20))
    server.keep_body = False
    tracemalloc.start()
    try:
        upload(big, _base(server), TOKEN, project="p")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    (req,) = server.requests
    assert req["received"] == req["length"] > size
    assert peak < 4 << 20, f"peak Python allocation {peak} bytes for a {size}-byte file"


def test_a_non_json_error_page_is_reported_with_its_text(server, snapshot_file):
    """A proxy in front of the site (nginx, a load balancer) answers HTML: no code, its text shown."""
    server.reply = (502, None)
    server.reply_raw = b"<html><body>502 Bad Gateway</body></html>"
    with pytest.raises(UploadError) as info:
        upload(snapshot_file, _base(server), TOKEN)
    assert (info.value.status, info.value.code, info.value.payload, info.value.hint) == (502, None, None, None)
    assert str(info.value) == "upload refused: HTTP 502: <html><body>502 Bad Gateway</body></html>"


def test_redirect_is_an_error_not_a_silent_get(server, snapshot_file):
    server.reply = (302, None)
    with pytest.raises(UploadError, match=r"redirected the upload to https://example\.invalid"):
        upload(snapshot_file, _base(server), TOKEN)
    assert len(server.requests) == 1


def test_unreachable_site_raises_upload_error(snapshot_file):
    with pytest.raises(UploadError, match="cannot reach"):
        upload(snapshot_file, "http://127.0.0.1:9", TOKEN, timeout=5)


def test_api_url_accepts_site_or_endpoint_over_http_only():
    with pytest.raises(UploadError, match="http:// or https://"):
        api_url("file:///etc/passwd")
    assert api_url("https://oomscope.example") == "https://oomscope.example/api/v1/snapshots"
    assert api_url("https://oomscope.example/") == "https://oomscope.example/api/v1/snapshots"
    assert api_url("https://x.example/api/v1/snapshots") == "https://x.example/api/v1/snapshots"


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("OOMSCOPE_")}
    full_env = {**inherited, "PYTHONPATH": str(CLIENT_DIR), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "oomscope_client", *args], capture_output=True, text=True, env=full_env, timeout=60
    )


def test_cli_upload_prints_the_json(server, snapshot_file):
    r = _cli("upload", str(snapshot_file), "--url", _base(server), "--token", TOKEN, "--project", "p1", "--run", "r1")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == server.reply[1]
    parts = _parts(server.requests[0]["headers"], server.requests[0]["body"])
    assert parts["project"] == (None, b"p1")
    assert parts["run"] == (None, b"r1")


def test_cli_takes_token_and_site_from_environment(server, snapshot_file):
    r = _cli("upload", str(snapshot_file), env={"OOMSCOPE_TOKEN": "envtok", "OOMSCOPE_URL": _base(server)})
    assert r.returncode == 0, r.stderr
    assert server.requests[0]["headers"]["Authorization"] == "Bearer envtok"


def test_cli_without_token_is_a_usage_error(snapshot_file):
    r = _cli("upload", str(snapshot_file), "--url", "http://127.0.0.1:9")
    assert r.returncode == 2
    assert "--token" in r.stderr


def test_package_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any 'import torch' now fails
        "import oomscope_client, oomscope_client.upload, oomscope_client.__main__\n"
        "assert 'django' not in sys.modules\n"
        "try:\n"
        "    oomscope_client.record()\n"
        "except ImportError as e:\n"
        "    print('needs torch:', e)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(CLIENT_DIR)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "needs torch: oomscope_client: this function needs PyTorch" in r.stdout


def test_oom_message_and_batch_size_are_sent(server, snapshot_file):
    upload(
        snapshot_file,
        _base(server),
        TOKEN,
        oom_message="CUDA out of memory. Tried to allocate 2.00 MiB.",
        batch_size=96,
    )
    parts = _parts(server.requests[0]["headers"], server.requests[0]["body"])
    assert parts["oom_message"] == (None, b"CUDA out of memory. Tried to allocate 2.00 MiB.")
    assert parts["batch_size"] == (None, b"96")


def test_cli_sends_the_sidecars_oom_message_and_the_batch_size(server, snapshot_file):
    # dump_on_oom writes NAME.json beside NAME.pickle.gz; its oom_message is torch's text
    sidecar = snapshot_file.with_name(snapshot_file.name.removesuffix(".pickle.gz") + ".json")
    sidecar.write_text(json.dumps({"oom_message": "CUDA out of memory. Tried to allocate 84.00 MiB."}))
    r = _cli("upload", str(snapshot_file), "--url", _base(server), "--token", TOKEN, "--batch-size", "32")
    assert r.returncode == 0, r.stderr
    parts = _parts(server.requests[0]["headers"], server.requests[0]["body"])
    assert parts["oom_message"] == (None, b"CUDA out of memory. Tried to allocate 84.00 MiB.")
    assert parts["batch_size"] == (None, b"32")
