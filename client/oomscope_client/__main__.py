"""Command line: ``python -m oomscope_client upload FILE --project P --run R [--wait]``,
and the CI gate ``python -m oomscope_client check --project P [--run R] --max-regression 5%``.

The site comes from ``--url`` or ``OOMSCOPE_URL``; the token from ``OOMSCOPE_TOKEN``, or a file named by
``--token-file`` or ``OOMSCOPE_TOKEN_FILE`` (``--token`` still works, but puts the secret in shell history
and process listings). ``--wait`` follows the analysis and prints the report's verdict and its change
(for an archive of a run's ranks: each rank's verdict, then the run's first OOM and its change); exit
status 0 when the report is done, 1 when the upload was refused, 3 when the analysis failed, 4 when it did
not finish in time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from oomscope_client.upload import UploadError, upload, verdict_lines, wait_for_analysis


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m oomscope_client", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("upload", help="post a snapshot file to an oomscope site")
    up.add_argument("file", help="a torch.cuda.memory._dump_snapshot pickle (.pickle or .pickle.gz)")
    up.add_argument("--url", default=os.environ.get("OOMSCOPE_URL"), help="site URL (or $OOMSCOPE_URL)")
    up.add_argument("--token", help="API token (better: $OOMSCOPE_TOKEN or --token-file; a flag shows in `ps`)")
    up.add_argument(
        "--token-file",
        default=os.environ.get("OOMSCOPE_TOKEN_FILE"),
        help="a file holding the API token (or $OOMSCOPE_TOKEN_FILE)",
    )
    up.add_argument("--wait", action="store_true", help="follow the analysis and print the verdict and the change")
    up.add_argument(
        "--wait-timeout", type=float, default=1800.0, help="seconds to wait for the analysis (default 1800)"
    )
    up.add_argument("--project", help="project slug")
    up.add_argument("--run", help="run name")
    up.add_argument(
        "--follows",
        metavar="CODE",
        help="the OOM report this run is the rerun of, or 'none' (default: the last OOM of the same --run)",
    )
    up.add_argument(
        "--changed",
        metavar="IDS",
        help="what you changed since, comma-separated: smaller_batch, amp, activation_checkpointing, "
        "optimizer_state, growing_workload, shape_bucketing, eval_no_grad, other (settings are read from the file)",
    )
    up.add_argument("--tags", help="comma-separated tags")
    up.add_argument("--note", help="free text shown with the report")
    up.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    up.add_argument(
        "--batch-size", type=int, help="the failing step's batch size (the report names the batch that fits)"
    )
    up.add_argument(
        "--cap",
        metavar="BYTES",
        help="the memory the run was allowed (7GiB, 80GB or bytes), for a run without an OOM too: the report's limit, "
        "and it says when the peak came within 5%% of it",
    )
    up.add_argument(
        "--oom-message-file",
        help="a file with torch's OOM message (default: the message in the dump's sidecar .json, where there is one)",
    )
    job = up.add_argument_group(
        "the job (default: read from torchrun's, Slurm's or MPI's environment, git and the dump's sidecar)"
    )
    job.add_argument("--rank", type=int, help="this process's rank ($RANK, $SLURM_PROCID)")
    job.add_argument("--world-size", type=int, help="the run's number of ranks ($WORLD_SIZE, $SLURM_NTASKS)")
    job.add_argument("--commit", help="the git commit (default: $GITHUB_SHA, $CI_COMMIT_SHA, git rev-parse HEAD)")
    job.add_argument("--branch", help="the git branch")
    job.add_argument("--job-id", help="the launcher's job id ($TORCHELASTIC_RUN_ID, $SLURM_JOB_ID); the default run")
    job.add_argument("--error-file", help="a file with the error this rank died of, when it was not an OOM")
    job.add_argument("--no-job-meta", action="store_true", help="send only what is given here")

    gate = commands.add_parser("check", help="CI gate: exit 1 when the run regressed against the project's baseline")
    gate.add_argument("--url", default=os.environ.get("OOMSCOPE_URL"), help="site URL (or $OOMSCOPE_URL)")
    gate.add_argument("--token", help="API token (better: $OOMSCOPE_TOKEN or --token-file; a flag shows in `ps`)")
    gate.add_argument(
        "--token-file",
        default=os.environ.get("OOMSCOPE_TOKEN_FILE"),
        help="a file holding the API token (or $OOMSCOPE_TOKEN_FILE)",
    )
    gate.add_argument("--project", required=True, help="project slug")
    gate.add_argument("--run", help="run name (default: the project's newest run)")
    gate.add_argument(
        "--max-regression",
        type=_percent,
        help="an override: fail only when the peak grows by more than this, e.g. 5%% (default: each figure "
        "against the noise the site learned from the baseline branch's runs, else the project's threshold)",
    )
    gate.add_argument("--wait", type=float, default=900.0, help="seconds to wait for the run's analysis (default 900)")
    gate.add_argument("--poll", type=float, default=5.0, help=argparse.SUPPRESS)
    gate.add_argument("--json", action="store_true", help="print the exit code and reason as JSON")
    return parser


def _percent(text: str) -> float:
    from oomscope_client.gate import parse_percent

    try:
        return parse_percent(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage such as 5%, got {text!r}") from None


def sidecar_of(snapshot: str) -> dict[str, object]:
    """The sidecar ``dump_on_oom`` wrote beside a dump (NAME.json next to NAME.pickle.gz); {} if none."""
    base = snapshot.removesuffix(".gz").removesuffix(".pickle")
    try:
        with open(base + ".json", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def sidecar_oom_message(snapshot: str) -> str | None:
    """The OOM message ``dump_on_oom`` wrote beside a dump, if any."""
    message = sidecar_of(snapshot).get("oom_message")
    return message if isinstance(message, str) and message.strip() else None


def job_meta(args: argparse.Namespace) -> dict[str, object]:
    """The job's metadata: the environment and git (unless --no-job-meta), then the dump's sidecar,
    then the flags, each over the one before."""
    from oomscope_client.jobmeta import job_metadata

    meta: dict[str, object] = {} if args.no_job_meta else job_metadata()
    sidecar = sidecar_of(args.file)
    if not args.no_job_meta:
        recorded = sidecar.get("job")
        meta.update(recorded if isinstance(recorded, dict) else {})
        meta.update({k: sidecar[k] for k in ("rank", "world_size", "error") if sidecar.get(k) is not None})
    flags = {
        "rank": args.rank,
        "world_size": args.world_size,
        "commit": args.commit,
        "branch": args.branch,
        "job_id": args.job_id,
    }
    meta.update({k: v for k, v in flags.items() if v is not None})
    if args.error_file:
        with open(args.error_file, encoding="utf-8") as fh:
            meta["error"] = fh.read()
    return meta


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from oomscope_client.gate import check, result_json

    token = _token(args, parser)
    if not args.url or not token:
        parser.error("--url and a token are required ($OOMSCOPE_URL; $OOMSCOPE_TOKEN or $OOMSCOPE_TOKEN_FILE)")
    result = check(
        args.url,
        token,
        args.project,
        run=args.run,
        max_regression=args.max_regression,
        wait=args.wait,
        poll=args.poll,
    )
    print(result_json(result) if args.json else result.reason, file=sys.stdout if result.exit_code == 0 else sys.stderr)
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "check":
        return _check(parser, args)
    token = _token(args, parser)
    if not args.url or not token:
        parser.error(
            "the site and a token are required: --url or $OOMSCOPE_URL, and $OOMSCOPE_TOKEN, "
            "--token-file or $OOMSCOPE_TOKEN_FILE"
        )
    if not os.path.isfile(args.file):
        parser.error(f"no such file: {args.file}")
    if not _capture_doctor(args.file):
        return 1
    oom_message: str | None
    if args.oom_message_file:
        with open(args.oom_message_file, encoding="utf-8") as fh:
            oom_message = fh.read()
    else:
        oom_message = sidecar_oom_message(args.file)  # None when the dump has no sidecar
    meta = job_meta(args)
    run = args.run or meta.get("job_id")
    try:
        result = upload(
            args.file,
            args.url,
            token,
            project=args.project,
            run=str(run) if run else None,
            tags=args.tags,
            note=args.note,
            timeout=args.timeout,
            oom_message=oom_message,
            batch_size=args.batch_size,
            cap=args.cap,
            meta=meta,
            follows=args.follows,
            changed=args.changed,
        )
    except UploadError as e:
        print(f"oomscope upload failed: {e}", file=sys.stderr)
        return 1
    if not args.wait:
        print(json.dumps(result, indent=1))
        return 0
    return _wait(result, token, args.wait_timeout)


def _capture_doctor(path: str) -> bool:
    """Say what is wrong with how the dump was captured (one line each); False when it is not worth sending."""
    from oomscope_client.doctor import problems

    found = problems(path, sidecar_of(path))
    for problem in found:
        print(f"oomscope capture doctor: {problem.line}", file=sys.stderr)
    return all(problem.usable for problem in found)


def _token(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str | None:
    """--token, else the token file (--token-file, $OOMSCOPE_TOKEN_FILE), else $OOMSCOPE_TOKEN."""
    if args.token:
        return str(args.token)
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as fh:
                text = fh.read().strip()
        except OSError as e:
            parser.error(f"cannot read the token file {args.token_file}: {e.strerror}")
        if not text:
            parser.error(f"the token file {args.token_file} is empty")
        return text
    return os.environ.get("OOMSCOPE_TOKEN") or None


def _wait(result: dict[str, object], token: str, timeout: float) -> int:
    """Follow the analysis; print the verdict and the change (or why it failed)."""
    if isinstance(result.get("run"), dict):  # an archive of a run's ranks: its 202 names the run
        return _wait_run(result["run"], token, timeout)  # type: ignore[arg-type]
    api_url = str(result.get("api_url") or "")
    print(f"uploaded: {result.get('url')} (analysing…)", file=sys.stderr)
    try:
        body = wait_for_analysis(api_url, token, timeout=timeout)
    except UploadError as e:
        print(f"oomscope: {e}", file=sys.stderr)
        return 4 if e.status is None else 1
    if body.get("status") == "failed":
        error = body.get("error") or {}
        print(f"oomscope: the analysis failed: {error.get('code')}: {error.get('message')}", file=sys.stderr)
        print(f"report: {body.get('url')}", file=sys.stderr)
        return 3
    for line in verdict_lines(body):
        print(line)
    return 0


def _wait_run(run: dict[str, object], token: str, timeout: float) -> int:
    """Follow a run's ranks until the run is summarised; print each rank's verdict and the run's change.
    Exit 3 when a rank's analysis failed, 4 when the run did not finish in time, 1 on a refusal."""
    from oomscope_client.upload import rank_api_url, run_verdict_lines, snapshot_status, wait_for_run

    ranks = run.get("world_size") or len(run.get("uploads") or [])  # type: ignore[arg-type]
    print(f"uploaded run {run.get('name')}: {run.get('url')} ({ranks} ranks, analysing…)", file=sys.stderr)
    try:
        body = wait_for_run(str(run.get("api_url") or ""), token, timeout=timeout)
        rank_bodies = {
            int(row.get("rank") or 0): snapshot_status(rank_api_url(body, row), token)
            for row in body.get("uploads") or []
        }
    except UploadError as e:
        print(f"oomscope: {e}", file=sys.stderr)
        return 4 if e.status is None else 1
    for line in run_verdict_lines(body, rank_bodies):
        print(line)
    failed = [row for row in body.get("uploads") or [] if row.get("status") == "failed"]
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
