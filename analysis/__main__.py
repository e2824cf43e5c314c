"""Command line: ``python -m analysis report|whatif``.

Exit status 0 on success; 2 with one line ``error: <code>: <message>`` on
standard error when the file is not a usable snapshot (``SnapshotError``) or a
``--whatif``/``--config`` string cannot be parsed (``ConfigError``), an
``--oom-message`` is not torch's OOM message (``OomMessageError``) or a
``--sidecar`` is not JSON. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analysis.config import AllocatorConfig
from analysis.errors import ConfigError, SnapshotError
from analysis.limits import MAX_MESSAGE_CHARS, OomMessageError, parse_oom_message
from analysis.parallel import default_jobs

EXIT_USER_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        # Validate allocator strings before the (possibly long) analysis.
        for conf in [*getattr(args, "whatif", []), *([args.config] if args.command == "whatif" else [])]:
            AllocatorConfig.parse(conf)
        args.oom_message = _oom_message(args)
        if args.command == "report":
            args.sidecar = _sidecar(args.sidecar_file)
            return _report(args)
        return _whatif(args)
    except SnapshotError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_USER_ERROR
    except ConfigError as exc:
        print(f"error: {ConfigError.code}: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OomMessageError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:
        print(f"error: file:unreadable: {exc.strerror or exc}: {exc.filename}", file=sys.stderr)
        return EXIT_USER_ERROR


def _version() -> str:
    from analysis import fastread

    return f"oomscope analysis 0.1.0; snapshot reader: {fastread.reader_in_use()}"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analysis", description="Explain a CUDA memory snapshot.")
    parser.add_argument("--version", action="version", version=_version(), help="the version and the reader in use")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="the full report (JSON with --json, else a short summary)")
    rep.add_argument("snapshot", type=Path)
    rep.add_argument("--json", dest="json_out", metavar="OUT|-", help="write the report JSON here ('-': stdout)")
    rep.add_argument(
        "--whatif",
        action="append",
        default=[],
        metavar="CONFIG",
        help="a PYTORCH_CUDA_ALLOC_CONF string to replay (repeatable)",
    )
    rep.add_argument("--limit", type=_bytes_arg, metavar="BYTES", help="memory the process was allowed")
    msg = rep.add_mutually_exclusive_group()
    msg.add_argument(
        "--oom-message", metavar="TEXT", help="torch's 'CUDA out of memory' message (gives the real limit)"
    )
    msg.add_argument(
        "--oom-message-file", type=Path, metavar="FILE", help="a file holding that message (a log is fine)"
    )
    rep.add_argument("--sidecar", dest="sidecar_file", type=Path, metavar="FILE", help="the client's sidecar JSON")
    rep.add_argument(
        "--jobs",
        type=_positive_int("a number of processes", "--jobs must be at least 1"),
        default=default_jobs(),
        metavar="N",
        help="child processes for the policy replays, beside the rest of the report (default: CPUs + 1; 1: none)",
    )
    rep.add_argument(
        "--batch-size",
        type=_positive_int("a batch size", "--batch-size must be at least 1"),
        metavar="N",
        help="the failing step's batch size: the batch-fit advice then names a batch, not a fraction",
    )
    wi = sub.add_parser("whatif", help="replay the trace under one allocator configuration")
    wi.add_argument("snapshot", type=Path)
    wi.add_argument("--config", required=True, metavar="CONFIG")
    wi.add_argument("--limit", type=_bytes_arg, metavar="BYTES")
    wmsg = wi.add_mutually_exclusive_group()
    wmsg.add_argument("--oom-message", metavar="TEXT", help="torch's 'CUDA out of memory' message")
    wmsg.add_argument("--oom-message-file", type=Path, metavar="FILE", help="a file holding that message")
    wi.add_argument("--json", dest="json_out", metavar="OUT|-")
    return parser


def _positive_int(what: str, refusal: str) -> Callable[[str], int]:
    """An argparse type: an int above zero, else ``expected <what>`` or ``refusal``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(refusal)
        return value

    return parse


_bytes_arg = _positive_int("a number of bytes", "the limit must be positive")


def _oom_message(args: argparse.Namespace) -> str | None:
    """The message text, checked before the analysis starts."""
    text: str | None = args.oom_message
    if args.oom_message_file is not None:
        with args.oom_message_file.open("rb") as fh:
            raw = fh.read(MAX_MESSAGE_CHARS * 4 + 1)
        text = raw.decode("utf-8", errors="replace")
    if text is None:
        return None
    parse_oom_message(text)  # OomMessageError now rather than after the reading
    return text


def _sidecar(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OomMessageError("sidecar-unreadable", f"{path}: not a JSON sidecar ({exc})") from None
    if not isinstance(data, dict):
        raise OomMessageError("sidecar-unreadable", f"{path}: not a JSON object")
    return data


def _report(args: argparse.Namespace) -> int:
    from analysis.report import build_report

    report = build_report(
        args.snapshot,
        whatif=tuple(args.whatif),
        limit=args.limit,
        filename=args.snapshot.name,
        jobs=args.jobs,
        oom_message=args.oom_message,
        sidecar=args.sidecar,
        batch_size=args.batch_size,
    )
    if args.json_out:
        _write_json(report, args.json_out)
    else:
        print(summary_text(report))
    return 0


def _whatif(args: argparse.Namespace) -> int:
    from analysis.report import build_whatif

    result = build_whatif(
        args.snapshot, args.config, limit=args.limit, filename=args.snapshot.name, oom_message=args.oom_message
    )
    if args.json_out:
        _write_json(result, args.json_out)
    else:
        print(whatif_text(result))
    return 0


def _write_json(data: Any, out: str) -> None:
    text = json.dumps(data, separators=(",", ":"))
    if out == "-":
        sys.stdout.write(text + "\n")
    else:
        Path(out).write_text(text + "\n", encoding="utf-8")


def gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.2f} GiB"


def summary_text(report: dict[str, Any]) -> str:
    """A few lines a person reads in a terminal."""
    lines = [f"{report['source']['filename']} ({report['source']['format']}, {report['source']['bytes']:,} bytes)"]
    cap = report["capture"]
    lines.append(
        f"capture: stacks={cap['stacks']}, trace {'complete' if cap['trace_complete'] else 'INCOMPLETE'}"
        + (f", settings {cap['allocator_settings'].get('PYTORCH_CUDA_ALLOC_CONF') or 'default'}")
    )
    for w in cap["warnings"]:
        lines.append(f"  warning {w['code']}: {w['message']}")
    for dev in report["devices"]:
        s = dev["summary"]
        bound = " (lower bounds)" if s["peak_is_lower_bound"] else ""
        lines.append(
            f"device {dev['device']}: {dev['events']:,} events; peak reserved {gib(s['peak_reserved_bytes'])}, "
            f"allocated {gib(s['peak_allocated_bytes'])}, requested {gib(s['peak_requested_bytes'])}{bound}"
        )
        oom = dev["oom"]
        if oom:
            at_least = "at least " if oom.get("limit_is_lower_bound") else ""
            lines.append(
                f"  OOM at event {oom['event_index']}: asked {gib(oom['requested_bytes'])} with "
                f"{gib(oom['allocated_bytes'])} allocated, {gib(oom['cached_free_bytes'])} cached free "
                f"(largest usable block {gib(oom.get('largest_usable_free_block_bytes') or 0)}, of all "
                f"{gib(oom['largest_free_block_bytes'])}), limit {at_least}{gib(oom['limit_bytes'])} "
                f"({oom.get('limit_source')}): {oom['verdict'].upper()}"
                + ("" if oom.get("verdict_certain", True) else " (not certain: the limit is a lower bound)")
                + (
                    f" (step {oom['projection']['step']} needs {gib(oom['step_need_bytes'])})"
                    if oom.get("step_need_bytes")
                    else ""
                )
            )
        if dev.get("limit"):
            lines.append(f"  {dev['limit']['note']}")
        for row in dev["top_stacks"][:3]:
            lines.append(f"  {row['when']:>4} {gib(row['bytes']):>11}  {row.get('label', '')}")
        for sug in dev["suggestions"][:3]:
            lines.append(f"  suggest [{sug['id']}] {sug['title']}: {sug['evidence']}")
    return "\n".join(lines)


def whatif_text(result: dict[str, Any]) -> str:
    lines = [f"{result['source']['filename']}: what if {result['config']!r}"]
    for dev in result["devices"]:
        w = dev["whatif"]
        avoided = {True: "OOM avoided", False: "still OOMs", None: "no OOM recorded"}[w["oom_avoided"]]
        step = w.get("step_completes")
        if step is True:
            avoided = "OOM avoided: the failing step runs to its end"
        elif step is False:
            avoided = (
                "the failing request fits, but " if w["oom_avoided"] else ""
            ) + "the step still runs out of memory"
        lines.append(
            f"device {dev['device']}: peak reserved {gib(w['peak_reserved_bytes'])} "
            f"(recorded {gib(dev['recorded_peak_reserved_bytes'])}); {avoided}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
