"""The diagnosis bench: does the report's first answer name the program's mistake, and does the real rerun of
the change it names bear it out?

    python3 scripts/diagnosis_bench.py [--dir tests/fixtures/diagnosis] [--jobs 1] [--only PREFIX]

Each family in ``--dir`` (``FAMILY.reruns.json`` beside ``FAMILY_default.pickle.gz`` and its truth) is one
program that died of its own mistake under a memory cap, with the real reruns of its fix and of the allocator
settings (``scripts/capture_diagnosis.py``, docs/captures.md). The report of the default run is judged twice,
with the OOM message (what the client's sidecar sends) and without it (a snapshot alone):

- **right**: the decision names the family's cause, and the fix's real rerun completed the run;
- **wrong**: it names another cause, or its change is an allocator setting whose real rerun died, or the named
  fix's rerun died;
- **unanswered**: no cause named (the allocator's own answer stands), when that answer is not a setting whose
  rerun died.

A family without a mistake in the program (``expected_cause`` null: issue 37's framework runs that need more
than the cap at their batch) is **right** when no cause is named and the first change is one whose real rerun
ran through (``expected_change``), **wrong** when a cause is named or the change's rerun died.

A family may name its own members (issue 33's follow-ups, tests/fixtures/followups): ``change_members`` maps a
change id to the member that reran it (else ``CHANGE_MEMBERS`` / ``SETTING_MEMBERS``), ``fix_member`` the member
that reran the fix (else ``fix``).

Also counted (overclaims): rows of the ranked table that say a setting finishes the step or the run where that
setting's real rerun died in the same step, and suggestions that say a setting avoids the OOM where its real
rerun died.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from analysis.report import build_report  # noqa: E402

SETTING_MEMBERS = {
    "expandable": "expandable_segments",
    "maxsplit128": "max_split_size_mb",
    "gc07": "garbage_collection_threshold",
}
# The framework families (issue 37, ``fw_*``, scripts/capture_frameworks.py) where the program has no mistake
# (``expected_cause`` null: the run needs more than the cap at that batch): the rerun of each change a report
# may name first. ``expected_change`` lists those whose rerun ran through.
CHANGE_MEMBERS = {
    "smaller_batch": "accum",
    "activation_checkpointing": "ckpt",
    "amp": "bf16",
    "expandable_segments": "expandable",
    "max_split_size_mb": "maxsplit128",
}


# The capture scripts write the kind of mistake; where a framework's form of it has a rule of its own, the report
# names that rule's id. scripts/capture_frameworks.py writes "leak" for the Trainer's evaluation keeping every
# batch's logits on the GPU, which analysis/causes/growth.py names eval_outputs_on_gpu (fix: eval_accumulation_steps).
FRAMEWORK_CAUSES = {("hf_eval", "leak"): "eval_outputs_on_gpu"}


def expected_cause(family: dict[str, Any]) -> str | None:
    """The cause id the report should name for ``family`` (None: no mistake in the program, capacity)."""
    cause: str | None = family["expected_cause"]
    return FRAMEWORK_CAUSES.get((family.get("framework", ""), cause), cause) if cause is not None else None


def judge(report: dict[str, Any], family: dict[str, Any]) -> tuple[str, str, list[str]]:
    """(verdict, what the decision named, overclaims) for one family's default report."""
    dev = next(d for d in report["devices"] if d.get("oom"))
    decision = dev["decision"]
    members = family["members"]
    named = decision.get("cause")
    change = decision.get("change") or {}
    overclaims = []
    for row in dev.get("ranked") or []:
        for member, setting in SETTING_MEMBERS.items():
            rerun = members.get(member)
            died_there = bool(rerun) and rerun["died"] and rerun["died_step"] == members["default"]["died_step"]
            claims = row.get("step_completes") is True or row.get("run_completes") is True
            if row["id"] == setting and died_there and claims:
                overclaims.append(f"{setting}: says the step finishes, its rerun died in step {rerun['died_step']}")
    for s in dev.get("suggestions") or []:
        for member, setting in SETTING_MEMBERS.items():
            rerun = members.get(member)
            if s["id"] == setting and rerun and rerun["died"] and s.get("avoids_oom") is True:
                overclaims.append(f"{setting}: a suggestion says it avoids the OOM, its rerun died")
    if change.get("kind") == "env":
        for member, setting in SETTING_MEMBERS.items():
            if change.get("id") == setting and members.get(member, {}).get("died"):
                return "wrong", f"setting {setting} (its rerun died)", overclaims
    expected = expected_cause(family)
    if expected is None:
        return (*_judge_capacity(named, change, family), overclaims)
    if named is None:
        return "unanswered", f"no cause ({change.get('id')})", overclaims
    if named != expected:
        return "wrong", f"{named} (expected {expected})", overclaims
    if members[family.get("fix_member", "fix")]["died"]:
        return "wrong", f"{named}, but the fix's rerun died", overclaims
    return "right", named, overclaims


def _judge_capacity(named: str | None, change: dict[str, Any], family: dict[str, Any]) -> tuple[str, str]:
    """A family without a program mistake: right when no cause is named and the first change is one whose real
    rerun ran through; wrong when a cause is named or the change's rerun died; else unanswered."""
    if named is not None:
        return "wrong", f"{named} (no mistake: capacity)"
    cid = change.get("id")
    if cid in (family.get("expected_change") or []):
        return "right", f"capacity, {cid}"
    rerun = family["members"].get({**CHANGE_MEMBERS, **family.get("change_members", {})}.get(str(cid), ""))
    if rerun is not None and rerun["died"]:
        return "wrong", f"{cid} (its rerun died)"
    return "unanswered", f"capacity, {cid}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=REPO / "tests" / "fixtures" / "diagnosis")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--only", default="", help="families whose name starts so (fw_: the framework captures)")
    args = ap.parse_args()
    families = sorted(args.dir.glob(f"{args.only}*.reruns.json"))
    totals: Counter[tuple[str, str]] = Counter()
    per_cause: dict[str, Counter[str]] = {}
    overclaim_count = 0
    print(f"{'family':16s} {'cause':26s} {'with the OOM message':44s} without it")
    for fam_path in families:
        family = json.loads(fam_path.read_text())
        name = family["family"]
        snap = args.dir / f"{name}_default.pickle.gz"
        truth = json.loads((args.dir / f"{name}_default.truth.json").read_text())
        cells = []
        for mode, message in (("message", truth.get("oom_message")), ("snapshot", None)):
            report = build_report(snap, jobs=args.jobs, oom_message=message)
            verdict, what, overclaims = judge(report, family)
            totals[(mode, verdict)] += 1
            per_cause.setdefault(expected_cause(family) or "capacity", Counter())[f"{mode}:{verdict}"] += 1
            overclaim_count += len(overclaims)
            cells.append(f"{verdict}: {what}"[:44])
            for o in overclaims:
                print(f"    overclaim ({mode}): {o}")
        print(f"{name:16s} {expected_cause(family) or 'capacity':26s} {cells[0]:44s} {cells[1]}")
    print()
    print(f"{'cause':26s} with the message (right/wrong/unanswered)   snapshot alone")
    for cause, c in sorted(per_cause.items()):
        a = "/".join(str(c[f"message:{v}"]) for v in ("right", "wrong", "unanswered"))
        b = "/".join(str(c[f"snapshot:{v}"]) for v in ("right", "wrong", "unanswered"))
        print(f"{cause:26s} {a:44s} {b}")
    for mode in ("message", "snapshot"):
        r, w, u = (totals[(mode, v)] for v in ("right", "wrong", "unanswered"))
        print(f"{mode:9s}: {r} right, {w} wrong, {u} unanswered of {r + w + u}")
    print(f"overclaims (a setting said to finish the step or avoid the OOM, its rerun died): {overclaim_count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
