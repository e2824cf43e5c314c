"""Upload a snapshot to an oomscope site: ``POST /api/v1/snapshots`` (multipart), stdlib only.

The body is streamed from the file in fixed-size chunks with an exact ``Content-Length``, so a
multi-gigabyte snapshot never sits in memory, and no chunked transfer encoding is used (the
Django development server and some proxies reject chunked request bodies).
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import select
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

API_PATH = "/api/v1/snapshots"
# The job's metadata the site takes as fields of an upload (docs/contract.md §3).
META_FIELDS = ("rank", "world_size", "local_rank", "commit", "branch", "host", "torch_version", "job_id", "error")
CHUNK_BYTES = 1 << 16


# What to do about each error code the site's API answers (webapp/snapshots/api/ and
# intake.py); tests/client/test_upload_site.py provokes each on a real running site. A code
# not listed here is still shown with the site's own message.
HINTS = {
    "auth-required": "send an API token (--token or $OOMSCOPE_TOKEN)",
    "auth-invalid-token": "the token is unknown, revoked or expired, or its user was deactivated; "
    "make a new one (python manage.py create_api_token USER)",
    "upload:read-only": "your role in that team (viewer) may only read; ask an admin of the team for the member role",
    "upload:unknown-project": "no project with that slug in your teams; check --project",
    "upload:no-project": "you may upload to several projects; choose one with --project",
    "upload:too-large": "the file is over the site's upload limit; gzip it, or record fewer events "
    "(torch.cuda.memory._record_memory_history(max_entries=...))",
    "upload:invalid": "fix the field named: --run, --tags or --note too long, or --cap not a size (7GiB, 80GB, bytes)",
    "upload:invalid-follows": "--follows names no upload of that project (give a report's code, or none)",
    "upload:not-a-snapshot-json": "that JSON is no memory snapshot (a profiler trace?); upload the file "
    "torch.cuda.memory._dump_snapshot() wrote",
}
# Codes by family: the reader's refusals of files that are not snapshots (analysis/errors.py).
HINT_PREFIXES = {
    "snapshot:format:": "upload the file torch.cuda.memory._dump_snapshot() wrote (.pickle or .pickle.gz)",
}


def hint_for(code: str | None) -> str | None:
    if not code:
        return None
    if code in HINTS:
        return HINTS[code]
    return next((hint for prefix, hint in HINT_PREFIXES.items() if code.startswith(prefix)), None)


class UploadError(RuntimeError):
    """The site refused the upload or could not be reached.

    ``status`` is the HTTP status (None when no response came back), ``payload`` the parsed
    JSON error body when there was one, ``code`` the site's error code from it (for example
    ``auth-invalid-token``, ``upload:too-large``) and ``hint`` what to do about it.
    """

    def __init__(
        self, message: str, *, status: int | None = None, payload: Any = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.payload = payload
        self.code = code
        self.hint = hint_for(code)


def _header_value(text: str) -> str:
    # A quoted-string parameter: CR/LF would end the header and '"' would end the string.
    return text.replace("\r", " ").replace("\n", " ").replace('"', "%22")


class MultipartBody:
    """A ``multipart/form-data`` body of text fields plus one file, read lazily from disk.

    Iterating yields the bytes in order; ``len(body)`` is the exact byte count. It can be
    iterated more than once (each pass reopens the file).
    """

    def __init__(
        self,
        fields: Sequence[tuple[str, str]],
        file_field: str,
        path: str | os.PathLike[str],
        *,
        filename: str | None = None,
        content_type: str = "application/octet-stream",
        boundary: str | None = None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.path = Path(path)
        self.boundary = boundary or "oomscope-" + secrets.token_hex(16)
        self.chunk_bytes = chunk_bytes
        self._file_size = self.path.stat().st_size
        dash = b"--" + self.boundary.encode("ascii")
        head = bytearray()
        for name, value in fields:
            head += dash + b"\r\n"
            head += f'Content-Disposition: form-data; name="{_header_value(name)}"\r\n\r\n'.encode()
            head += value.encode("utf-8") + b"\r\n"
        shown = _header_value(filename or self.path.name)
        head += dash + b"\r\n"
        head += (
            f'Content-Disposition: form-data; name="{_header_value(file_field)}"; filename="{shown}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n"
        ).encode()
        self._head = bytes(head)
        self._tail = b"\r\n" + dash + b"--\r\n"

    @property
    def content_type(self) -> str:
        return f"multipart/form-data; boundary={self.boundary}"

    def __len__(self) -> int:
        return len(self._head) + self._file_size + len(self._tail)

    def __iter__(self) -> Iterator[bytes]:
        yield self._head
        sent = 0
        with self.path.open("rb") as f:
            while chunk := f.read(self.chunk_bytes):
                sent += len(chunk)
                yield chunk
        if sent != self._file_size:
            # The Content-Length already went out; a file that changed size would corrupt the body.
            raise UploadError(f"{self.path} changed size during the upload ({self._file_size} -> {sent} bytes)")
        yield self._tail


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # urllib turns a redirected POST into a GET without the body, which would "succeed"
    # with an HTML page; a redirect is always a wrong URL here (often http -> https).
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise UploadError(f"the server redirected the upload to {newurl}; pass that URL instead", status=code)


class _EarlyAnswer:
    """Stop sending the body once the site has answered (or hung up), and read its answer.

    A site refuses an oversize upload from its Content-Length, before reading the body, and
    closes the connection: the rest of the body then fails with a broken pipe, and urllib
    would report "cannot reach" instead of the site's 413. Like curl, this checks for an
    answer between chunks and stops writing when there is one, so ``getresponse`` reads it.
    """

    _answered = False

    def send(self, data: Any) -> None:
        sock = getattr(self, "sock", None)
        if self._answered:
            return
        if sock is not None and select.select([sock], [], [], 0)[0]:
            self._answered = True  # the site spoke before the body ended: its answer decides
            return
        try:
            super().send(data)  # type: ignore[misc]
        except (BrokenPipeError, ConnectionResetError):
            self._answered = True  # it hung up mid-body; an answer may still be waiting


class _HTTPConnection(_EarlyAnswer, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_EarlyAnswer, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: Any) -> Any:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: Any) -> Any:
        return self.do_open(_HTTPSConnection, req, context=self._context)  # type: ignore[attr-defined]


def api_url(url: str) -> str:
    """The upload endpoint for a site URL (``https://host``) or the endpoint itself.

    Only http and https: urllib would also open ``file:`` and other schemes.
    """
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise UploadError(f"the site URL must start with http:// or https://, not {url!r}")
    base = url.rstrip("/")
    return base if base.endswith(API_PATH) else base + API_PATH


def _content_type_for(path: Path) -> str:
    return "application/gzip" if path.name.endswith(".gz") else "application/octet-stream"


def upload(
    path: str | os.PathLike[str],
    url: str,
    token: str,
    *,
    project: str | None = None,
    run: str | None = None,
    tags: str | Iterable[str] | None = None,
    note: str | None = None,
    filename: str | None = None,
    timeout: float = 600.0,
    idempotency_key: str | None = None,
    oom_message: str | None = None,
    batch_size: int | None = None,
    cap: str | int | None = None,
    meta: Mapping[str, Any] | None = None,
    follows: str | None = None,
    changed: str | Iterable[str] | None = None,
) -> dict[str, Any]:
    """Post one snapshot file; return the site's JSON (``id``, ``status``, ``url``, ``api_url``).

    ``tags``: a comma-separated string or a list. ``oom_message`` (torch's OOM message: the report's real
    limit) and ``batch_size`` (the failing step's batch: the report names the batch that fits) are sent when
    given, and ``cap``: the memory the run was allowed, bytes or a size such as "7GiB" (the site reads it; a
    run without an OOM is then told how close it came).
    ``meta`` is the job's metadata (``rank``, ``world_size``, ``local_rank``, ``commit``, ``branch``,
    ``host``, ``torch_version``, ``job_id``, and ``error``: what a rank died of when it was not an OOM),
    as ``oomscope_client.jobmeta.job_metadata()`` reads it; the uploads of one ``run`` with a
    ``world_size`` above 1 are analysed together as one run of several ranks.
    ``follows``: the code of the OOM report this run is the rerun of (``"none"``: not a follow-up; not
    given: the site takes the last OOM of the same project and run name); ``changed``: what was changed
    since, as change ids (``smaller_batch``, ``amp``, ...; docs/runs.md), comma-separated or a list.
    Every call sends an ``Idempotency-Key`` header (a fresh random one unless given): calling again with
    the same key after a timeout or a broken connection returns the first upload, not a duplicate.
    Raises ``UploadError`` on any HTTP error, redirect or unreachable site.
    """
    key = idempotency_key or new_idempotency_key()
    path = Path(path)
    given = {"project": project, "run": run, "note": note, "oom_message": oom_message or None}
    given |= {
        "follows": follows or None,
        "tags": tags if tags is None or isinstance(tags, str) else ",".join(tags),
        "batch_size": None if batch_size is None else str(int(batch_size)),
        "cap": str(cap).strip() if cap is not None and str(cap).strip() else None,
        "changed": (changed if isinstance(changed, str) else ",".join(changed)) if changed else None,
    }
    fields = _form_fields(given, meta)
    body = MultipartBody(fields, "file", path, filename=filename, content_type=_content_type_for(path))
    request = urllib.request.Request(  # noqa: S310 (api_url allows http and https only)
        api_url(url),
        data=body,
        method="POST",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": body.content_type,
            "Content-Length": str(len(body)),
            "Accept": "application/json",
            "User-Agent": "oomscope-client/0.1",
            "Idempotency-Key": key,
        },
    )
    opener = urllib.request.build_opener(_NoRedirect(), _HTTPHandler(), _HTTPSHandler())
    try:
        with opener.open(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as e:
        raw = e.read()
        payload = _json_or_none(raw)
        code = _error_code(payload)
        detail = _error_text(payload) or raw[:300].decode("utf-8", "replace")
        hint = hint_for(code)
        text = f"upload refused: HTTP {e.code}: {detail}" + (f" ({hint})" if hint else "")
        raise UploadError(text, status=e.code, payload=payload, code=code) from None
    except urllib.error.URLError as e:
        raise UploadError(f"cannot reach {api_url(url)}: {e.reason}") from None
    payload = _json_or_none(raw)
    if not isinstance(payload, dict):
        raise UploadError(f"HTTP {status} but the reply is not a JSON object: {raw[:200]!r}", status=status)
    return payload


def _form_fields(given: Mapping[str, str | None], meta: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The upload's text fields in the order the site's form lists them, the job's metadata after; a field
    that is None is not sent."""
    order = ("project", "run", "tags", "note", "oom_message", "batch_size", "cap", "follows", "changed")
    fields = [(name, str(given[name])) for name in order if given.get(name) is not None]
    for name in META_FIELDS:
        value = (meta or {}).get(name)
        if value is not None and value != "":
            fields.append((name, str(value)))
    return fields


def new_idempotency_key() -> str:
    """A random key for one logical upload (the site keeps up to 100 visible ASCII characters)."""
    return "oomscope-" + secrets.token_urlsafe(24)


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def _error_code(payload: Any) -> str | None:
    error = payload.get("error") if isinstance(payload, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _error_text(payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return None
    error = payload.get("error", payload.get("detail"))
    if isinstance(error, dict):
        code, message = error.get("code"), error.get("message")
        return f"{code}: {message}" if code else str(message)
    return None if error is None else str(error)


# The states an upload ends in (the site's Upload.Status).
FINAL_STATES = ("done", "failed")


def snapshot_status(api_url_of_upload: str, token: str, *, timeout: float = 30.0) -> dict[str, Any]:
    """``GET /api/v1/snapshots/<id>``: the upload's status, error and summary."""
    if urllib.parse.urlsplit(api_url_of_upload).scheme not in ("http", "https"):
        raise UploadError(f"the site URL must start with http:// or https://, not {api_url_of_upload!r}")
    request = urllib.request.Request(  # noqa: S310 (http and https only, checked above)
        api_url_of_upload,
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json", "User-Agent": "oomscope-client/0.1"},
    )
    opener = urllib.request.build_opener(_NoRedirect())
    try:
        with opener.open(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as e:
        payload = _json_or_none(e.read())
        raise UploadError(
            f"status refused: HTTP {e.code}: {_error_text(payload) or ''}",
            status=e.code,
            payload=payload,
            code=_error_code(payload),
        ) from None
    except urllib.error.URLError as e:
        raise UploadError(f"cannot reach {api_url_of_upload}: {e.reason}") from None
    payload = _json_or_none(raw)
    if not isinstance(payload, dict):
        raise UploadError(f"the status reply is not a JSON object: {raw[:200]!r}")
    return payload


def wait_for_analysis(
    api_url_of_upload: str,
    token: str,
    *,
    timeout: float = 1800.0,
    first_poll: float = 1.0,
    longest_poll: float = 10.0,
    clock: Any = None,
    sleep: Any = None,
    final: Sequence[str] = FINAL_STATES,
) -> dict[str, Any]:
    """Poll an upload until its analysis is done or failed (``final``); its last status JSON.

    Polls start at ``first_poll`` seconds and double up to ``longest_poll``. A site that cannot be
    reached for a moment (a restart) is polled again; ``UploadError`` when ``timeout`` passes first.
    """
    import time

    now = clock or time.monotonic
    pause = sleep or time.sleep
    deadline = now() + timeout
    delay = first_poll
    last_error: UploadError | None = None
    while True:
        try:
            body = snapshot_status(api_url_of_upload, token)
            last_error = None
            if body.get("status") in final:
                return body
        except UploadError as e:
            if e.status is not None and e.status < 500:
                raise  # a refusal (a revoked token, a deleted upload) does not go away by waiting
            last_error = e
        if now() + delay > deadline:
            why = f" (last: {last_error})" if last_error else ""
            raise UploadError(f"the analysis did not finish within {timeout:.0f} s{why}")
        pause(delay)
        delay = min(delay * 2, longest_poll)


NO_CHANGE = "no setting or rule found one the figures support"
# The state a run of several ranks ends in (the site's Run.Status): every rank analysed, done or failed.
RUN_FINAL_STATES = ("done",)


def wait_for_run(
    run_api_url: str,
    token: str,
    *,
    timeout: float = 1800.0,
    first_poll: float = 1.0,
    longest_poll: float = 10.0,
) -> dict[str, Any]:
    """Poll a run (``GET /api/v1/runs/<id>``, what an archive's upload answers) until every rank
    is analysed and the run summarised; its last JSON. ``UploadError`` as ``wait_for_analysis``."""
    return wait_for_analysis(
        run_api_url, token, timeout=timeout, first_poll=first_poll, longest_poll=longest_poll, final=RUN_FINAL_STATES
    )


def rank_api_url(run_body: Mapping[str, Any], rank_row: Mapping[str, Any]) -> str:
    """The status URL of one rank of a run: the site's own, or (older sites) beside the run's."""
    given = rank_row.get("api_url")
    if isinstance(given, str) and given:
        return given
    return urllib.parse.urljoin(str(run_body.get("api_url") or ""), f"../snapshots/{rank_row.get('id')}")


def run_verdict_lines(run_body: Mapping[str, Any], rank_bodies: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """A run's verdict: one block per rank (its headline and change, or why it failed), then the run's
    first OOM and the change of the rank that died first, and the run's page."""
    head = (run_body.get("summary") or {}).get("run") or {}
    lines: list[str] = []
    for row in run_body.get("uploads") or []:
        rank = int(row.get("rank") or 0)
        body = rank_bodies.get(rank) or {}
        error = row.get("error") or body.get("error")
        if row.get("status") == "failed" and isinstance(error, Mapping):
            lines.append(f"rank {rank}: the analysis failed: {error.get('code')}: {error.get('message')}")
            continue
        summary = body.get("summary") or {}
        lines.append(f"rank {rank}: {summary.get('headline') or 'no verdict'}")
        if summary.get("change_line"):
            lines.append(f"  change: {summary['change_line']}")
    first = head.get("first_oom_rank")
    if first is not None:
        lines.append(f"run: rank {first} ran out of memory first: {head.get('first_oom_reason')}")
        change = ((rank_bodies.get(int(first)) or {}).get("summary") or {}).get("change_line")
        lines.append(f"change: {change}" if change else f"change: none ({NO_CHANGE})")
    elif head:
        lines.append("run: no rank ran out of memory")
    if head.get("missing_ranks"):
        lines.append("missing ranks: " + ", ".join(str(r) for r in head["missing_ranks"]))
    if run_body.get("url"):
        lines.append(f"report: {run_body['url']}")
    return lines


def verdict_lines(body: dict[str, Any]) -> list[str]:
    """What the report's first screen says, from a finished upload's summary (the site words it)."""
    summary = body.get("summary") or {}
    lines = []
    if summary.get("headline"):
        lines.append(str(summary["headline"]))
    if summary.get("change_line"):
        lines.append(f"change: {summary['change_line']}")
    elif "change_line" in summary:
        lines.append(f"change: none ({NO_CHANGE})")
    if summary.get("edge_of_cap"):
        lines.append(str(summary["edge_of_cap"]))
    if summary.get("limit_text"):
        lines.append(
            f"limit: {summary['limit_text']} ({summary.get('limit_source_short') or summary.get('limit_source')})"
        )
    if summary.get("message_could_change_verdict"):
        lines.append(
            "this verdict could change with torch's OOM message: upload again with --oom-message-file FILE, "
            "or paste it on the report's page"
        )
    if body.get("url"):
        lines.append(f"report: {body['url']}")
    return lines
