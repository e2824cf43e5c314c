"""Upload to answer in a real browser, on a live site (issue 34).

Starts the site as `make run` does (scripts/reliability.py's Site: scripts/run.sh with its own
port, Redis, SQLite database and var dir), signs in with Debian's Chromium (Playwright), and for
each file and run: opens the upload page, chooses the file, clicks "Upload and analyse" and waits,
on the page's state, for

  first_s   the decision's headline on the page (the first answer: the report stored, charts still
            coming, or the whole report when it came first)
  whole_s   the whole report: no "still coming" notice, and charts.js done drawing the page's charts

both from the click. Prints one JSON line per run (and the load average before and after), then
the medians per file. With ``--trace`` each run's line also holds ``trace``: the page's own requests
and loads from the click (``[seconds, what, path]``: the upload's POST sent and answered, the
report page's GET and load, each status poll, the reload into the first answer, the charts'
fetches), which with the worker's log (``var/reliability/page-bench/log/worker.log``) breaks the
first answer into its parts (docs/performance.md, 2026-12-05 16:20).

    .venv/bin/python scripts/page_bench.py ../shared/snapshots/huge_all_stacks.pickle.gz \\
        tests/fixtures/gpt_varlen_oom.pickle.gz --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reliability import Site

USER, PASSWORD = "pagebench", "page-bench-password-1"
FIRST = "() => !!document.querySelector('section.decision .headline')"
WHOLE = (
    "() => !!document.querySelector('section.decision .headline')"
    " && !document.querySelector('[data-first-answer]')"
    " && document.body.dataset.chartsDrawn !== undefined"
)
FAILED = "() => !!document.querySelector('.badge.failed')"


def _holds(page: Any, predicate: str) -> bool:
    from playwright.sync_api import Error

    try:
        return bool(page.evaluate(predicate))
    except Error:  # the page navigated (the upload's redirect, status.js's reload) mid-call
        return False


class _Trace:
    """The page's requests, answers and loads, in seconds from ``start`` (static files left out)."""

    def __init__(self, page: Any, site_url: str) -> None:
        self.site_url = site_url
        self.events: list[tuple[float, str, str]] = []
        self.started = time.monotonic()
        page.on("request", lambda r: self._add("sent " + r.method, r.url))
        page.on("requestfinished", lambda r: self._add("answered " + r.method, r.url))
        page.on("load", lambda p: self._add("loaded", p.url))

    def _add(self, what: str, url: str) -> None:
        if "/static/" not in url:
            self.events.append((time.monotonic(), what, url.replace(self.site_url, "")))

    def start(self) -> None:
        self.events.clear()
        self.started = time.monotonic()

    def lines(self) -> list[list[Any]]:
        return [[round(t - self.started, 3), what, url] for t, what, url in self.events if t >= self.started]


def one_run(page: Any, site: Site, path: Path, timeout: float, trace: _Trace | None = None) -> dict[str, Any]:
    page.goto(site.url + "/upload/")
    page.set_input_files("input[type=file]", str(path))
    load_before = os.getloadavg()
    started = time.monotonic()
    if trace is not None:
        trace.start()
    page.click("form[data-upload] button[type=submit]")
    first = whole = None
    deadline = started + timeout
    while time.monotonic() < deadline:
        now = time.monotonic() - started
        if first is None and _holds(page, FIRST):
            first = now
        if first is not None and _holds(page, WHOLE):
            whole = now
            break
        if _holds(page, FAILED):
            break
        time.sleep(0.02)
    result = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "first_s": round(first, 2) if first is not None else None,
        "whole_s": round(whole, 2) if whole is not None else None,
        "url": page.url,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    if trace is not None:
        result["trace"] = trace.lines()
    return result


def _sign_in(page: Any, site: Site) -> None:
    page.goto(site.url + "/accounts/login/")
    page.fill("input[name=username]", USER)
    page.fill("input[name=password]", PASSWORD)
    page.click("main form button[type=submit]")
    page.wait_for_load_state()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshots", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the site's processes")
    parser.add_argument("--trace", action="store_true", help="each run's page requests and loads from the click")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    site = Site("page-bench", None, 600)
    site.env.update(dict(item.split("=", 1) for item in args.env))
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        site.start()
        site.manage("create_api_token", USER, "--create-user", "--team", "pb", "--project", "bench")
        site.manage(
            "shell",
            "-c",
            f"from django.contrib.auth.models import User; u = User.objects.get(username={USER!r}); "
            f"u.set_password({PASSWORD!r}); u.save()",
        )
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox"])
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            _sign_in(page, site)
            trace = _Trace(page, site.url) if args.trace else None
            for path in args.snapshots:
                for i in range(args.repeat):
                    result = one_run(page, site, path, args.timeout, trace)
                    results.setdefault(path.name, []).append(result)
                    print(json.dumps({"run": i + 1, **result}), flush=True)
            browser.close()
    finally:
        site.stop()
    for name, runs in results.items():
        firsts = [r["first_s"] for r in runs if r["first_s"] is not None]
        wholes = [r["whole_s"] for r in runs if r["whole_s"] is not None]
        print(
            json.dumps(
                {
                    "file": name,
                    "median_first_s": statistics.median(firsts) if firsts else None,
                    "median_whole_s": statistics.median(wholes) if wholes else None,
                    "runs": len(runs),
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
