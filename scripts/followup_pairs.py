"""Every (default that died, member of the same family) pair of ``tests/fixtures/captures`` scored as a
follow-up (``analysis.followup.compare``): the figures docs/runs.md quotes ("Over every ... pair").

A family is the capture's name up to its cap (``bert_mlm_c85_default`` -> ``bert_mlm_c85``,
``densenet_c80_exp_gc`` -> ``densenet_c80``: same job, same cap); its ``default`` member, where it ran out of
memory, is the incident,
each other member a follow-up. The OOM message of each truth file is given as the client would send it.

    nice .venv/bin/python scripts/followup_pairs.py [--jobs N] [--dir DIR] [--pairs]

``--dir`` scores another directory of captures (``tests/fixtures/followups``: the reruns of one change each,
issue 33); ``--pairs`` prints each pair with the changes the files show (``change ids: labels``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CAPTURES = ROOT / "tests" / "fixtures" / "captures"
_FAMILY = re.compile(r"^(.*?_(?:c\d+|nocap))_")


def _report(folder: Path, name: str) -> dict:
    from analysis.report import build_report

    truth = json.loads((folder / f"{name}.truth.json").read_text())
    return build_report(folder / f"{name}.pickle.gz", oom_message=truth.get("oom_message") or None)


def _family(folder: Path, incident: str, members: list[str]) -> list[tuple[str, str, str, str | None, str | None, str]]:
    from analysis.followup import compare

    base = _report(folder, incident)
    out = []
    for member in members:
        result = compare(base, _report(folder, member))
        answer = result.predicted.answer if result.predicted else None
        horizon = result.horizon.verdict if result.horizon else None
        seen = "; ".join(f"{c.id}: {c.label}" for c in result.applied)
        out.append((incident, member, result.outcome, answer, horizon, seen))
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=CAPTURES, help="the captures to pair (default: %(default)s)")
    parser.add_argument("--pairs", action="store_true", help="print each pair and the changes the files show")
    args = parser.parse_args()
    folder = args.dir.resolve()
    names = sorted(p.name[: -len(".pickle.gz")] for p in folder.glob("*.pickle.gz"))
    families: dict[str, list[str]] = {}
    for name in names:
        found = _FAMILY.match(name)
        if found:
            families.setdefault(found.group(1), []).append(name)
    work = []
    for family, members in sorted(families.items()):
        default = f"{family}_default"
        if default not in members:
            continue
        truth = json.loads((folder / f"{default}.truth.json").read_text())
        if truth.get("died_step") is None and not truth.get("died"):
            continue
        work.append((default, [m for m in members if m != default]))
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for found in pool.map(_family, [folder] * len(work), *zip(*work, strict=True)):
            rows.extend(found)
    outcomes = Counter(r[2] for r in rows)
    settled = ("fixes", "runs_out", "postpones")
    definite = Counter((r[3], r[2]) for r in rows if r[3] in settled and r[2] != "not_applied")
    print(json.dumps({"pairs": len(rows), "incidents": len(work), "outcomes": dict(outcomes),
                      "definite": {f"{a} -> {o}": n for (a, o), n in sorted(definite.items())},
                      "horizons": dict(Counter(r[4] for r in rows if r[4]))}, indent=1))
    print(json.dumps({"changes_seen": dict(Counter(c.split(":")[0] for r in rows for c in r[5].split("; ") if c))}))
    for row in rows:
        if args.pairs:
            print(f"{row[1]}: {row[2]} (predicted {row[3]}); seen: {row[5] or 'nothing'}")
        elif row[2] == "refuted":
            print("refuted:", row[:5])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
