"""Command line: ``python -m analysis report|whatif|triage``.

``report`` takes one snapshot, or several (one per rank of a distributed job: the run's
report, ``analysis/runs.py``), or a tar or zip of them (``analysis/rankfiles.py``).

``python -m analysis report|whatif`` runs the command in a forked child under the memory cap the
site's analysis child has (``RLIMIT_AS``: 1 GiB + 6 bytes per byte of the inputs' unpacked size, at
most 8 GiB; ``--no-limits`` lifts it), with ``faulthandler`` writing to a file the parent reads: a
crash inside the reader (a tuple nested a million deep as a dict key overflows the C stack when the
unpickler hashes it, in both readers) is refused as ``snapshot:limit:too-deep``, and running out of
the cap as ``snapshot:limit:memory``. ``main()`` itself (called in-process) runs uncapped.

Exit status 0 on success; 2 with one line ``error: <code>: <message>`` on
standard error when the file is not a usable snapshot (``SnapshotError``) or a
``--whatif``/``--config`` string cannot be parsed (``ConfigError``), an
``--oom-message`` is not torch's OOM message (``OomMessageError``) or a
``--sidecar`` is not JSON, rank files cannot make one run (``RunInputError``), or, for
``triage``, its summary is not ``memory_summary()``'s (``TriageError``). Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import resource
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analysis.allocator.config import AllocatorConfig
from analysis.errors import ConfigError, SnapshotError
from analysis.heap import keep_freed_memory
from analysis.limits import MAX_MESSAGE_CHARS, OomMessageError, parse_oom_message
from analysis.parallel import default_jobs
from analysis.rankfiles import rank_paths
from analysis.runs import RunInputError

EXIT_USER_ERROR = 2

# The site's analysis child runs under these by default (webapp/settings.py ANALYSIS_MEMORY_*); the
# command line takes the same, so a file it reads costs what it would cost there.
MEMORY_MIN_BYTES = 1 << 30
MEMORY_PER_BYTE = 6
MEMORY_MAX_BYTES = 8 << 30


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return _run(args)


def capped_main(argv: list[str] | None = None) -> int:
    """The command line's entry: ``main`` in a forked child under the memory cap (module docstring)."""
    args = _parser().parse_args(argv)
    if args.command == "triage" or args.no_limits:
        return _run(args)
    cap = memory_cap(args.snapshots if args.command == "report" else [args.snapshot])
    with tempfile.TemporaryFile() as crash_log:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child; its exit status is what the tests read
            code = 1
            try:
                faulthandler.enable(file=crash_log)
                resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
                args.memory_cap = cap
                code = _run(args)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        crash_log.seek(0)
        crash = crash_log.read(64 * 1024).decode("utf-8", errors="replace")
    return _child_status(status, crash)


def _child_status(status: int, crash: str) -> int:
    """The exit status for the capped child's wait ``status``; a crash in the reader is the file's depth."""
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    sig = os.WTERMSIG(status)
    if sig == signal.SIGSEGV and 'reader.py", line' in crash:
        print(
            "error: snapshot:limit:too-deep: the file nests too deeply to be read (a value nested so deep that "
            "hashing it overflowed the stack)",
            file=sys.stderr,
        )
        return EXIT_USER_ERROR
    sys.stderr.write(crash)
    return 128 + sig


def memory_cap(paths: list[Path]) -> int:
    """``RLIMIT_AS`` for the inputs: the site's formula (``webapp.snapshots.worker.runner.limits_for``) on the
    sum of their unpacked sizes (a gzip's trailer: what the reader will see)."""
    total = 0
    for path in paths:
        try:
            size = path.stat().st_size
            with path.open("rb") as fh:
                isize = 0
                if fh.read(2) == b"\x1f\x8b" and size >= 18:
                    fh.seek(-4, os.SEEK_END)
                    isize = int.from_bytes(fh.read(4), "little")
            total += max(size, isize)
        except OSError:
            continue  # the command says so itself, with its code
    return min(MEMORY_MAX_BYTES, MEMORY_MIN_BYTES + MEMORY_PER_BYTE * total)


def _run(args: argparse.Namespace) -> int:
    if args.command == "triage":
        return _triage(args)
    try:
        # Validate allocator strings before the (possibly long) analysis.
        for conf in [*getattr(args, "whatif", []), *([args.config] if args.command == "whatif" else [])]:
            AllocatorConfig.parse(conf)
        args.oom_message = _oom_message(args)
        if args.command == "report":
            with tempfile.TemporaryDirectory(prefix="oomscope-ranks-") as scratch:
                args.snapshots, unpacked = rank_paths(args.snapshots, Path(scratch))
                if len(args.snapshots) > 1 or unpacked:
                    if args.sidecar_file is not None:
                        raise RunInputError(
                            "sidecar-per-rank",
                            "--sidecar names one file; with several ranks the NAME.json beside each snapshot is read",
                        )
                    return _run_report(args)
            args.snapshot = args.snapshots[0]
            args.sidecar = _sidecar(args.sidecar_file)
            return _report(args)
        return _whatif(args)
    except SnapshotError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_USER_ERROR
    except ConfigError as exc:
        print(f"error: {ConfigError.code}: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except (OomMessageError, RunInputError) as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:
        print(f"error: file:unreadable: {exc.strerror or exc}: {exc.filename}", file=sys.stderr)
        return EXIT_USER_ERROR
    except MemoryError:
        cap = getattr(args, "memory_cap", None)
        where = f"the command line's cap of {cap:,} bytes (--no-limits lifts it)" if cap else "what the process may use"
        print(f"error: snapshot:limit:memory: the analysis needed more memory than {where}", file=sys.stderr)
        return EXIT_USER_ERROR


def _version() -> str:
    from analysis import fastread
    from analysis.allocator import compiled

    return (
        f"oomscope analysis 0.1.0; snapshot reader: {fastread.reader_in_use()}; gunzip: {fastread.inflater()};"
        f" replay loops: {compiled.loops_in_use()}"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m analysis", description="Explain a CUDA memory snapshot.")
    parser.add_argument(
        "--version", action="version", version=_version(), help="the version, the reader and the replay loops in use"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="the full report (JSON with --json, else a short summary)")
    rep.add_argument(
        "snapshots",
        type=Path,
        nargs="+",
        metavar="SNAPSHOT",
        help="a snapshot; several (one per rank) give the run's report (ranks[] and run)",
    )
    rep.add_argument("--json", dest="json_out", metavar="OUT|-", help="write the report JSON here ('-': stdout)")
    _no_limits_flag(rep)
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
        help="policy replays at once, beside the rest of the report: threads with the compiled loops, child "
        "processes with the Python ones (default: CPUs + 1; 1: none)",
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
    _no_limits_flag(wi)
    tri = sub.add_parser("triage", help="what the OOM message (and memory_summary()) alone say, without a snapshot")
    tri.add_argument(
        "--message-file", type=Path, required=True, metavar="FILE", help="torch's OOM message (a log is fine)"
    )
    tri.add_argument(
        "--summary-file", type=Path, metavar="FILE", help="the output of torch.cuda.memory_summary() (optional)"
    )
    tri.add_argument("--json", dest="json_out", metavar="OUT|-", help="write the triage JSON here ('-': stdout)")
    return parser


def _no_limits_flag(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--no-limits",
        action="store_true",
        help="run without the memory cap the site's analysis child has (1 GiB + 6 bytes per unpacked byte, "
        "at most 8 GiB) and without the crash guard",
    )


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


def _bounded_text(path: Path, max_chars: int) -> str:
    """A file's text, read no further than a parser would accept (it refuses what is longer)."""
    with path.open("rb") as fh:
        raw = fh.read(max_chars * 4 + 1)
    return raw.decode("utf-8", errors="replace")


def _triage(args: argparse.Namespace) -> int:
    from analysis.memory_summary import MAX_SUMMARY_CHARS, TriageError
    from analysis.triage import triage

    try:
        message = _bounded_text(args.message_file, MAX_MESSAGE_CHARS)
        summary = _bounded_text(args.summary_file, MAX_SUMMARY_CHARS) if args.summary_file else None
        result = triage(message, summary)
    except (OomMessageError, TriageError) as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:
        print(f"error: file:unreadable: {exc.strerror or exc}: {exc.filename}", file=sys.stderr)
        return EXIT_USER_ERROR
    if args.json_out:
        _write_json(result.to_json(), args.json_out)
    else:
        print(triage_text(result.to_json()))
    return 0


def triage_text(data: dict[str, Any]) -> str:
    """The triage for a terminal: the verdict, the change, the evidence, what a snapshot adds."""
    lines = [
        data["headline"],
        f"change: {data['change']}",
        f"confidence: {data['confidence']}: {data['confidence_reason']}",
    ]
    lines += [f"  also: {alt}" for alt in data["alternatives"]]
    lines += [f"  - {f['text']}" for f in data["findings"]]
    lines.append("a snapshot would add:")
    lines += [f"  - {item}" for item in data["snapshot_adds"]]
    lines.append("record one:")
    lines += [f"    {line}" if line else "" for line in data["record_snapshot"].splitlines()]
    return "\n".join(lines)


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


def sidecar_beside(snapshot: Path) -> dict[str, Any] | None:
    """The client's sidecar written beside a dump (``NAME.json`` next to ``NAME.pickle.gz``), if any."""
    name = snapshot.name.removesuffix(".gz").removesuffix(".pickle")
    path = snapshot.with_name(name + ".json")
    return _sidecar(path) if path.is_file() and path != snapshot else None


def _run_report(args: argparse.Namespace) -> int:
    """One report per rank, then the run's summary; written as ``oomscope.run/1``."""
    from analysis.report import build_report
    from analysis.runs import RankInput, rank_from_name, summarise

    items: list[RankInput] = []
    reports: dict[int, dict[str, Any]] = {}
    world_size: int | None = None
    for position, snapshot in enumerate(args.snapshots):
        sidecar = sidecar_beside(snapshot)
        rank = _sidecar_int(sidecar, "rank")
        rank = rank if rank is not None else rank_from_name(snapshot.name)
        rank = rank if rank is not None else position
        if rank in reports:
            raise RunInputError("duplicate-rank", f"{snapshot}: rank {rank} is given twice")
        world_size = world_size or _sidecar_int(sidecar, "world_size")
        report = build_report(
            snapshot,
            whatif=tuple(args.whatif),
            limit=args.limit,
            filename=snapshot.name,
            jobs=args.jobs,
            oom_message=args.oom_message,
            sidecar=sidecar,
            batch_size=args.batch_size,
        )
        error = (sidecar or {}).get("error") or (sidecar or {}).get("oom_message")
        items.append(RankInput(rank=rank, report=report, error=error if isinstance(error, str) else None))
        reports[rank] = report
    run = summarise(items, world_size=world_size or len(items)).to_dict()
    for row in run["ranks"]:
        row["report"] = reports[row["rank"]]
    if args.json_out:
        _write_json(run, args.json_out)
    else:
        print(run_text(run))
    return 0


def _sidecar_int(sidecar: dict[str, Any] | None, key: str) -> int | None:
    value = (sidecar or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def run_text(run: dict[str, Any]) -> str:
    """The run in a few lines: each rank's peak and fate, the first OOM, the imbalance."""
    head = run["run"]
    lines = [f"run of {head['ranks_reported']} ranks (world size {head['world_size']})"]
    for row in run["ranks"]:
        fate = {"oom": "OUT OF MEMORY", "peer": "failed: a peer died", "error": "failed", "none": "no error"}
        lines.append(
            f"  rank {row['rank']}: peak reserved {gib(row['peak_reserved_bytes'])}, "
            f"allocated {gib(row['peak_allocated_bytes'])}; {fate[row['failure']]}"
            + (f" ({row['error'][:120]})" if row["error"] and row["failure"] != "oom" else "")
        )
    if head["first_oom_rank"] is not None:
        lines.append(f"first OOM: rank {head['first_oom_rank']}: {head['first_oom_reason']}")
    imbalance = head["imbalance"]["peak_reserved"]
    if imbalance is not None:
        lines.append(f"imbalance (max / mean peak reserved): {imbalance:.3f}")
    for spread in head["differing_stacks"][:5]:
        lines.append(f"  differs: {spread['site']} {spread['bytes_by_rank']}")
    lines.extend(f"note: {note}" for note in head["notes"])
    return "\n".join(lines)


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
    """A size in the one wording the page and the API's summary use (``analysis.readout.size``)."""
    from analysis.readout import size

    return size(n)


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
    for f in cap.get("doctor") or []:
        lines.append(f"  capture doctor: {f['problem']}; next time: {f['fix']}")
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
        lines.extend(_decision_lines(dev))
        for row in dev["top_stacks"][:3]:
            lines.append(f"  {row['when']:>4} {gib(row['bytes']):>11}  {row.get('label', '')}")
        for sug in dev["suggestions"][:3]:
            lines.append(f"  suggest [{sug['id']}] {sug['title']}: {sug['evidence']}")
    return "\n".join(lines)


def _decision_lines(dev: dict[str, Any]) -> list[str]:
    """The decision as the report page's first screen says it (analysis/readout.py)."""
    from analysis.readout import basis, headroom

    decision = dev.get("decision") or {}
    if not decision:
        return []
    lines = [f"  verdict: {decision.get('headline')}"]
    change = decision.get("change")
    lines.append(f"  change: {change['line']}" if change else "  change: none")
    lines.append(f"  buys: {decision.get('buys')}")
    room = headroom(dev)
    if room and room["thin"]:
        lines.append(f"  thin headroom: {room['sentence']}")
    b = basis(dev)
    if b:
        level = f" The verdict is {b['level_text']}." if b["level_text"] else ""
        lines.append(f"  rests on: {b['sentence']}{level}")
        if b["message_could_change_verdict"]:
            lines.append("  this verdict could change with torch's OOM message: give it with --oom-message-file FILE")
    return lines


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
    # A command-line run is one analysis and exits: its stages reuse each other's freed pages (analysis.heap).
    keep_freed_memory()
    sys.exit(capped_main())
