"""Command line: ``python -m oomscope_client upload FILE --url URL --token TOKEN --project P --run R``.

The token may come from ``OOMSCOPE_TOKEN`` and the site from ``OOMSCOPE_URL`` instead, which
keeps the secret out of shell history and process listings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from oomscope_client.upload import UploadError, upload


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m oomscope_client", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("upload", help="post a snapshot file to an oomscope site")
    up.add_argument("file", help="a torch.cuda.memory._dump_snapshot pickle (.pickle or .pickle.gz)")
    up.add_argument("--url", default=os.environ.get("OOMSCOPE_URL"), help="site URL (or $OOMSCOPE_URL)")
    up.add_argument("--token", default=os.environ.get("OOMSCOPE_TOKEN"), help="API token (or $OOMSCOPE_TOKEN)")
    up.add_argument("--project", help="project slug")
    up.add_argument("--run", help="run name")
    up.add_argument("--tags", help="comma-separated tags")
    up.add_argument("--note", help="free text shown with the report")
    up.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
    up.add_argument(
        "--batch-size", type=int, help="the failing step's batch size (the report names the batch that fits)"
    )
    up.add_argument(
        "--oom-message-file",
        help="a file with torch's OOM message (default: the message in the dump's sidecar .json, where there is one)",
    )
    return parser


def sidecar_oom_message(snapshot: str) -> str | None:
    """The OOM message ``dump_on_oom`` wrote beside a dump (NAME.json next to NAME.pickle.gz), if any."""
    base = snapshot.removesuffix(".gz").removesuffix(".pickle")
    try:
        with open(base + ".json", encoding="utf-8") as fh:
            message = json.load(fh).get("oom_message")
    except (OSError, ValueError, AttributeError):
        return None
    return message if isinstance(message, str) and message.strip() else None


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.url or not args.token:
        parser.error("--url and --token are required (or set OOMSCOPE_URL and OOMSCOPE_TOKEN)")
    if not os.path.isfile(args.file):
        parser.error(f"no such file: {args.file}")
    if args.oom_message_file:
        with open(args.oom_message_file, encoding="utf-8") as fh:
            oom_message = fh.read()
    else:
        oom_message = sidecar_oom_message(args.file)
    try:
        result = upload(
            args.file,
            args.url,
            args.token,
            project=args.project,
            run=args.run,
            tags=args.tags,
            note=args.note,
            timeout=args.timeout,
            oom_message=oom_message,
            batch_size=args.batch_size,
        )
    except UploadError as e:
        print(f"oomscope upload failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
