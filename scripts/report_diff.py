"""Report JSON before and after a change, over every snapshot in tests/fixtures.

A refactor must not change what a user reads. This script writes the contract report
(``analysis.report.build_report``, the same call the worker and the CLI make) of every
snapshot under a folder, then compares two such sets key by key:

    python3 scripts/report_diff.py write var/report-before            # on the old commit
    python3 scripts/report_diff.py write var/report-after             # on the new one
    python3 scripts/report_diff.py compare var/report-before var/report-after \
        [--added devices.*.decision.stage ...]

``compare`` prints every path whose value changed or vanished, and every key that only
the new set has; it exits 1 on a change, a vanished key, or an added key that no
``--added`` pattern (fnmatch over the dotted path, list indices as ``*``) allows.
Keys added on purpose are named on the command line, so the note that closes a change can
quote the command.
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT_SUFFIXES = (".pickle", ".pickle.gz", ".pkl", ".pkl.gz")


def snapshot_files(folder: Path) -> list[Path]:
    """Every snapshot under ``folder``, sorted, as the benches find them."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(SNAPSHOT_SUFFIXES))


def out_name(folder: Path, path: Path) -> str:
    return str(path.relative_to(folder)).replace("/", "__") + ".json.gz"


def _report_one(args: tuple[str, str, int]) -> tuple[str, str | None]:
    """One report, written gzipped; the error text where the report raised (that is compared too)."""
    sys.path.insert(0, str(ROOT))
    from analysis.report import build_report

    path, out, report_jobs = args
    try:
        report: Any = build_report(path, jobs=report_jobs)
    except Exception as exc:  # a refusal is part of the answer: compare it as such
        report = {"error": f"{type(exc).__name__}: {exc}"}
    with gzip.open(out, "wt", encoding="utf-8") as fh:
        json.dump(report, fh, sort_keys=True)
    return path, report.get("error") if isinstance(report, dict) else None


def write(folder: Path, out: Path, jobs: int, report_jobs: int = 1) -> int:
    out.mkdir(parents=True, exist_ok=True)
    files = snapshot_files(folder)
    work = [(str(p), str(out / out_name(folder, p)), report_jobs) for p in files]
    started = time.monotonic()
    errors = 0
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_report_one, work, chunksize=4))
    else:
        results = [_report_one(item) for item in work]
    for path, error in results:
        if error:
            errors += 1
            print(f"refused {path}: {error}")
    print(f"{len(files)} reports written to {out} in {time.monotonic() - started:.0f} s ({errors} refusals)")
    return 0


def diff(before: Any, after: Any, path: str = "") -> tuple[list[str], list[str]]:
    """(changed or vanished paths, added paths) between two JSON values."""
    changed: list[str] = []
    added: list[str] = []
    if isinstance(before, dict) and isinstance(after, dict):
        for key in before:
            sub = f"{path}.{key}" if path else str(key)
            if key not in after:
                changed.append(f"{sub} (gone)")
            else:
                c, a = diff(before[key], after[key], sub)
                changed += c
                added += a
        added += [f"{path}.{key}" if path else str(key) for key in after if key not in before]
    elif isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            changed.append(f"{path} (length {len(before)} -> {len(after)})")
        for i, (b, a) in enumerate(zip(before, after, strict=False)):
            c, ad = diff(b, a, f"{path}.{i}")
            changed += c
            added += ad
    elif before != after or type(before) is not type(after):
        changed.append(f"{path}: {_short(before)} -> {_short(after)}")
    return changed, added


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _pattern_of(path: str) -> str:
    """The dotted path with list indices as ``*`` (how ``--added`` patterns are written)."""
    return ".".join("*" if part.isdigit() else part for part in path.split("."))


def compare(before_dir: Path, after_dir: Path, allowed: list[str], show: int) -> int:
    names = sorted(p.name for p in before_dir.glob("*.json.gz"))
    missing = [n for n in names if not (after_dir / n).exists()]
    differing = 0
    unallowed_added: dict[str, int] = {}
    allowed_added: dict[str, int] = {}
    for name in names:
        if name in missing:
            continue
        with gzip.open(before_dir / name, "rt", encoding="utf-8") as fh:
            before = json.load(fh)
        with gzip.open(after_dir / name, "rt", encoding="utf-8") as fh:
            after = json.load(fh)
        changed, added = diff(before, after)
        for key in {_pattern_of(a) for a in added}:
            bucket = allowed_added if any(fnmatch.fnmatchcase(key, pat) for pat in allowed) else unallowed_added
            bucket[key] = bucket.get(key, 0) + 1
        if changed:
            differing += 1
            print(f"{name}: {len(changed)} changed")
            for line in changed[:show]:
                print(f"    {line}")
    for key, count in sorted(allowed_added.items()):
        print(f"added on purpose: {key} (in {count} reports)")
    for key, count in sorted(unallowed_added.items()):
        print(f"ADDED, not allowed: {key} (in {count} reports)")
    for name in missing:
        print(f"missing in {after_dir}: {name}")
    same = len(names) - len(missing) - differing
    print(f"{len(names)} reports: {same} the same, {differing} changed, {len(missing)} missing, "
          f"{len(unallowed_added)} added keys not allowed")
    return 1 if differing or missing or unallowed_added else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write the report of every snapshot under --fixtures into OUT")
    w.add_argument("out", type=Path)
    w.add_argument("--fixtures", type=Path, default=ROOT / "tests" / "fixtures")
    w.add_argument("--jobs", type=int, default=2)
    w.add_argument(
        "--report-jobs", type=int, default=1, help="build_report's own jobs (its policy replays side by side)"
    )
    c = sub.add_parser("compare", help="compare two folders that `write` made")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--added", action="append", default=[], metavar="PATTERN",
                   help="a dotted key path (fnmatch, list indices as *) added on purpose")
    c.add_argument("--show", type=int, default=8, help="changed paths printed per report")
    args = parser.parse_args(argv)
    if args.command == "write":
        return write(args.fixtures, args.out, args.jobs, args.report_jobs)
    return compare(args.before, args.after, args.added, args.show)


if __name__ == "__main__":
    sys.exit(main())
