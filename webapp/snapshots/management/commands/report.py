"""``python manage.py report SNAPSHOT --html OUT.html``: the site's report as one standalone file.

The page holds the same sections and charts as ``/s/<code>/``, with BokehJS, the
stylesheet and our scripts inlined, so it opens from disk with no server and
makes no outside request (its own CSP meta tag forbids any). Runs the analysis
in this process: meant for a user's own files, not for untrusted uploads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.contrib.staticfiles import finders
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.template.loader import render_to_string


def _static_text(path: str) -> str:
    found = finders.find(path)
    if not found:
        raise CommandError(f"static file {path} is missing")
    return Path(str(found)).read_text(encoding="utf-8")


def _script_safe(source: str) -> str:
    # Inline <script> ends at the first "</script"; code never needs that sequence unescaped.
    return source.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def render_standalone(report: dict[str, Any], charts: dict[str, dict[str, Any]]) -> str:
    """The standalone HTML page of a report and its charts."""
    from webapp.snapshots.pages.charts import inline_bokehjs
    from webapp.snapshots.pages.formatting import report_for_page

    source = report.get("source") or {}
    context = {
        "report": report_for_page(report),
        "charts": charts,
        "standalone": True,
        "shared": True,  # read-only: no links into the site
        "upload": {"filename": source.get("filename", "snapshot"), "bytes": source.get("bytes")},
        "share_url": None,
        "inline_css": _static_text("css/oomscope.css"),
        "inline_bokeh_js": _script_safe(inline_bokehjs()),
        "inline_charts_js": _script_safe(_static_text("js/charts.js")),
        "inline_copy_js": _script_safe(_static_text("js/copy.js")),
    }
    return render_to_string("snapshots/report_standalone.html", context)


class Command(BaseCommand):
    help = "Analyse a snapshot and write its report as a standalone HTML page (no server needed)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("snapshot", help="a torch.cuda.memory._dump_snapshot file (pickle, .gz, zip or JSON)")
        parser.add_argument("--html", required=True, metavar="OUT.html", help="where to write the page")
        parser.add_argument(
            "--whatif",
            action="append",
            default=[],
            metavar="CONFIG",
            help="an extra PYTORCH_CUDA_ALLOC_CONF to replay (repeatable)",
        )
        parser.add_argument(
            "--limit",
            type=int,
            default=None,
            metavar="BYTES",
            help="the memory the process was allowed (default: inferred)",
        )
        parser.add_argument(
            "--jobs",
            type=int,
            default=None,
            metavar="N",
            help="child processes for the policy replays (default: CPUs + 1, as python -m analysis report)",
        )
        parser.add_argument(
            "--report-json",
            default=None,
            metavar="REPORT.json",
            help="render this already computed report instead of analysing SNAPSHOT again",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from analysis.errors import SnapshotError
        from webapp.snapshots.pages.charts import build_charts

        if options["report_json"]:
            report = json.loads(Path(options["report_json"]).read_text(encoding="utf-8"))
        else:
            from analysis.parallel import default_jobs
            from analysis.report import build_report

            jobs = options["jobs"] if options["jobs"] is not None else default_jobs()
            try:
                report = build_report(
                    options["snapshot"], whatif=tuple(options["whatif"]), limit=options["limit"], jobs=max(1, jobs)
                )
            except SnapshotError as error:
                raise CommandError(f"{error.code}: {error}") from error
        page = render_standalone(report, build_charts(report))
        out = Path(options["html"])
        out.write_text(page, encoding="utf-8")
        self.stdout.write(f"wrote {out} ({len(page.encode()):,} bytes)")
