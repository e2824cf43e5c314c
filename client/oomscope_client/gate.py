"""The CI gate: ``python -m oomscope_client check --project P [--run R] --max-regression 5%``.

It asks the site whether the run regressed against the project's baseline
(``GET /api/v1/projects/<P>/regression``), waiting while the run's ranks are still being
analysed, and exits:

- 0: no regression (or nothing to compare with yet: the first run of a project passes);
- 1: a regression (the peak, a stack's or a category's bytes grew beyond the noise the site learned
  from the baseline branch's last runs, or, with ``--max-regression`` (an override) or too few
  runs, the peak grew past the threshold; or the run ran out of memory where the baseline did
  not); the site's one-paragraph reason is printed, naming the figures that grew;
- 2: no answer (the site refused or could not be reached, no such run, or the run was not
  summarised within ``--wait`` seconds).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from oomscope_client.upload import _error_code, _error_text, _json_or_none, _NoRedirect, hint_for

EXIT_PASS = 0
EXIT_REGRESSION = 1
EXIT_NO_ANSWER = 2


class GateError(RuntimeError):
    pass


@dataclass(frozen=True)
class GateResult:
    exit_code: int
    reason: str
    body: dict[str, Any] | None = None


def parse_percent(text: str) -> float:
    """``5%``, ``5`` or ``2.5%`` -> 5.0 / 5.0 / 2.5."""
    value = float(text.strip().rstrip("%"))
    if value < 0:
        raise ValueError("a regression threshold is not negative")
    return value


def _get(url: str, token: str, timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(  # noqa: S310 (check() allows http and https only)
        url,
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json", "User-Agent": "oomscope-client/0.1"},
    )
    opener = urllib.request.build_opener(_NoRedirect())
    try:
        with opener.open(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as e:
        payload = _json_or_none(e.read())
        hint = hint_for(_error_code(payload))
        raise GateError(f"HTTP {e.code}: {_error_text(payload) or e.reason}" + (f" ({hint})" if hint else "")) from None
    except (urllib.error.URLError, OSError) as e:
        raise GateError(f"cannot reach {url}: {getattr(e, 'reason', e)}") from None
    payload = _json_or_none(raw)
    if not isinstance(payload, dict):
        raise GateError(f"the reply is not a JSON object: {raw[:200]!r}")
    return payload


def check(
    url: str,
    token: str,
    project: str,
    *,
    run: str | None = None,
    max_regression: float | None = None,
    wait: float = 900.0,
    poll: float = 5.0,
    timeout: float = 30.0,
) -> GateResult:
    """Ask the site, waiting up to ``wait`` seconds for the run's summary; never raises for the site's answers."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        return GateResult(EXIT_NO_ANSWER, f"the site URL must start with http:// or https://, not {url!r}")
    query: dict[str, str] = {}
    if run:
        query["run"] = run
    if max_regression is not None:
        query["max_regression"] = f"{max_regression:g}"
    endpoint = f"{url.rstrip('/')}/api/v1/projects/{urllib.parse.quote(project)}/regression"
    endpoint += ("?" + urllib.parse.urlencode(query)) if query else ""
    deadline = time.monotonic() + wait
    while True:
        try:
            body = _get(endpoint, token, timeout)
        except GateError as e:
            return GateResult(EXIT_NO_ANSWER, f"oomscope check: no answer: {e}")
        status = body.get("status")
        if status == "no-run":
            return GateResult(EXIT_NO_ANSWER, f"oomscope check: {body.get('reason')}", body)
        if status == "done":
            break
        if time.monotonic() + poll > deadline:
            name = (body.get("run") or {}).get("name")
            return GateResult(EXIT_NO_ANSWER, f"oomscope check: run {name} not summarised within {wait:g} s", body)
        time.sleep(poll)
    run_info = body.get("run") or {}
    link = run_info.get("url") or ""
    reason = f"{body.get('reason')}" + (f" {link}" if link else "")
    return GateResult(EXIT_REGRESSION if body.get("regressed") else EXIT_PASS, reason, body)


def result_json(result: GateResult) -> str:
    """``{"exit_code", "reason", "tolerance", "beyond_noise"}``: the last two from the site's regression
    (``noise`` or ``fixed``; each figure grown past its learned tolerance), for a CI step to read."""
    regression = (result.body or {}).get("regression") or {}
    return json.dumps(
        {
            "exit_code": result.exit_code,
            "reason": result.reason,
            "tolerance": regression.get("tolerance"),
            "beyond_noise": regression.get("beyond_noise") or [],
        },
        indent=1,
    )
