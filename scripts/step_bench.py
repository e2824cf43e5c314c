"""Step-level what-ifs against real reruns (issue 9, item 3).

    python3 scripts/step_bench.py [CAPTURES_DIR] [FAMILY_PREFIX ...]

CAPTURES_DIR (default tests/fixtures/captures) holds NAME.pickle.gz + NAME.truth.json pairs as the lead's
scripts/capture_diff.py writes them: a family is one workload, seed and cap; its members differ only
in PYTORCH_CUDA_ALLOC_CONF (`conf`), and `died_step` says in which step each real run died (null: it
did not). From each family's `_default` run that died, the report (with the run's own OOM message)
replays every other member's setting; its `step_completes` must say whether that member's real run
finished the step the default died in. Prints one line per what-if and a summary, split into model
workloads and the random request streams (families `rand_*`), with the request-level `oom_avoided`
for comparison.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.report import build_report


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "captures"
    only = argv[1:]
    families: dict[str, dict[str, dict]] = collections.defaultdict(dict)
    for p in sorted(root.glob("*.truth.json")):
        truth = json.loads(p.read_text())
        if "family" in truth:
            families[truth["family"]][p.name[: -len(".truth.json")]] = truth
    tally: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for family, members in sorted(families.items()):
        if only and not any(family.startswith(o) for o in only):
            continue
        base = next((n for n in members if n.endswith("_default")), None)
        if base is None or members[base].get("died_step") is None or not members[base].get("oom_message"):
            continue
        died = members[base]["died_step"]
        others = {n: t for n, t in members.items() if n != base and t.get("conf")}
        if not others:
            continue
        report = build_report(
            root / f"{base}.pickle.gz",
            whatif=[t["conf"] for t in others.values()],
            oom_message=members[base]["oom_message"],
            jobs=1,
        )
        dev = next(d for d in report["devices"] if d["oom"])
        kind = "random" if family.startswith("rand") else "model"
        for t in others.values():
            w = next(x for x in dev["whatif"] if x["config"] == t["conf"])
            real = t.get("died_step") is None or t["died_step"] > died
            got = w["step_completes"]
            verdict = "none" if got is None else ("right" if got == real else "WRONG")
            tally[kind][verdict] += 1
            tally[kind]["n"] += 1
            tally[kind]["request-level right"] += int(w["oom_avoided"] == real)
            print(
                f"{base:30s} {t['conf']:50s} died {died} rerun died {t.get('died_step')} "
                f"completes {real!s:5s} step_completes {got!s:5s} oom_avoided {w['oom_avoided']!s:5s} {verdict}"
            )
    for kind, c in tally.items():
        print(
            f"{kind}: {c['n']} what-ifs: step_completes right {c['right']}, wrong {c['WRONG']}, "
            f"no answer {c['none']}; request-level oom_avoided right {c['request-level right']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
