"""Step-level what-ifs against real reruns (issue 9, item 3; issue 23, item 3).

    python3 scripts/step_bench.py [CAPTURES_DIR] [FAMILY_PREFIX ...] [--all-bases]

CAPTURES_DIR (default tests/fixtures/captures) holds NAME.pickle.gz + NAME.truth.json pairs as the lead's
scripts/capture_diff.py writes them: a family is one workload, seed and cap; its members differ only
in PYTORCH_CUDA_ALLOC_CONF (`conf`), and `died_step` says in which step each real run died (null: it
did not). From each family's `_default` run that died, the report (with the run's own OOM message)
replays every other member's setting; its `step_completes` must say whether that member's real run
finished the step the default died in. Prints one line per what-if and a summary, split into model
workloads and the random request streams (families `rand_*`), with the request-level `oom_avoided`
for comparison.

``--all-bases``: every member that died is a base too, not only the default (the issue-23 families
where the default survived and a roundup run died). A what-if applies its setting on top of the
base's recorded ones, so the base's own roundup is reset where the member has none
(``roundup_power2_divisions:1`` rounds as the default does); a base whose other settings cannot be
reset that way is skipped.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.allocator.config import AllocatorConfig
from analysis.report import build_report


def conf_from(base_conf: str, member_conf: str) -> str | None:
    """The what-if string that turns the base run's settings into the member's (None: not expressible)."""
    base = AllocatorConfig.parse(base_conf)
    target = AllocatorConfig.parse(member_conf)
    parts = [member_conf] if member_conf else []
    if base.roundup_power2_divisions != AllocatorConfig().roundup_power2_divisions and "roundup" not in member_conf:
        parts.append("roundup_power2_divisions:1")
    conf = ",".join(parts)
    if not conf:
        return None
    got = AllocatorConfig.parse(conf, base=base)
    same = (
        got.expandable_segments == target.expandable_segments
        and got.max_split_size == target.max_split_size
        and got.garbage_collection_threshold == target.garbage_collection_threshold
        # Divisions of 0 and 1 both round to 512 B only.
        and [d if d > 1 else 0 for d in got.roundup_power2_divisions]
        == [d if d > 1 else 0 for d in target.roundup_power2_divisions]
    )
    return conf if same else None


def no_answer_reason(w: dict[str, Any], proj: dict[str, Any]) -> str:
    """Why a what-if gave no step-level answer."""
    if (w.get("caught_ooms") or {}).get("certain") is False:
        return "serves an OOM the program survived: kept and freed at once answer differently"
    if (w.get("placement") or {}).get("certain") is False:
        return "hangs on the order of new segments"
    if w.get("step_completes_range"):
        return "flips inside the limit's range"
    return str(proj.get("reason") or "no projection")


def main(argv: list[str]) -> int:
    all_bases = "--all-bases" in argv
    argv = [a for a in argv if a != "--all-bases"]
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "captures"
    only = argv[1:]
    families: dict[str, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    for p in sorted(root.glob("*.truth.json")):
        truth = json.loads(p.read_text())
        if "family" in truth:
            families[truth["family"]][p.name[: -len(".truth.json")]] = truth
    tally: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for family, members in sorted(families.items()):
        if only and not any(family.startswith(o) for o in only):
            continue
        bases = [n for n, t in members.items() if t.get("died_step") is not None and t.get("oom_message")]
        if not all_bases:
            bases = [n for n in bases if n.endswith("_default")]
        for base in sorted(bases):
            died = members[base]["died_step"]
            base_conf = members[base].get("conf") or ""
            others = {}
            for n, t in members.items():
                if n == base or (t.get("conf") or "") == base_conf:
                    continue
                conf = conf_from(base_conf, t.get("conf") or "")
                if conf is not None:
                    others[n] = (conf, t)
            if not others:
                continue
            report = build_report(
                root / f"{base}.pickle.gz",
                whatif=[conf for conf, _t in others.values()],
                oom_message=members[base]["oom_message"],
                jobs=1,
            )
            dev = next(d for d in report["devices"] if d["oom"])
            proj = dev["oom"].get("projection") or {}
            kind = "random" if family.startswith("rand") else "model"
            for conf, t in others.values():
                w = next(x for x in dev["whatif"] if x["config"] == conf)
                real = t.get("died_step") is None or t["died_step"] > died
                got = w["step_completes"]
                verdict = "none" if got is None else ("right" if got == real else "WRONG")
                tally[kind][verdict] += 1
                tally[kind]["n"] += 1
                tally[kind]["request-level right"] += int(w["oom_avoided"] == real)
                why = "" if got is not None else f"  ({no_answer_reason(w, proj)[:90]})"
                like = f" like step {proj['template_step']}" if proj.get("available") else ""
                print(
                    f"{base:30s} {conf:50s} died {died} rerun died {t.get('died_step')} "
                    f"completes {real!s:5s} step_completes {got!s:5s} oom_avoided {w['oom_avoided']!s:5s} "
                    f"{verdict}{like}{why}"
                )
    for kind, c in tally.items():
        print(
            f"{kind}: {c['n']} what-ifs: step_completes right {c['right']}, wrong {c['WRONG']}, "
            f"no answer {c['none']}; request-level oom_avoided right {c['request-level right']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
