"""The gate's noise model on the real repeat runs of ``tests/fixtures/followups`` (issue 33).

    nice .venv/bin/python scripts/noise_series.py [fseries|fnoise ...]   # both without arguments

For each series: the model learned from its ten main runs (``learn``), each main run judged against
the other nine (leave one out: the noise gate and the fixed 5% on the total, against the newest of
the nine), then each commit K judged against all ten: the total peak reserved against its noise band
and against the fixed 5% (the gate's baseline: the newest main run), the leaking stack
(``_feature_cache``) against its band (or, where no main run lists it, against the most a stack
no main run listed can have held), and what the gate names. Every figure from the ordinary pipeline
(``build_report``, ``summarise``, ``compare_runs``); docs/runs.md quotes the output.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analysis.noise import PEAK, NoiseModel, Spread, learn, measures  # noqa: E402
from analysis.regression import compare_runs  # noqa: E402
from analysis.report import build_report  # noqa: E402
from analysis.runs import RankInput, summarise  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "followups"
FIXED_PCT = 5.0
LEAK_SITE = "_feature_cache"


def summary(name: str) -> dict[str, Any]:
    path = FIXTURES / f"{name}.pickle.gz"
    return summarise([RankInput(rank=0, report=build_report(path.read_bytes(), filename=path.name))]).to_dict()


def mib(n: float) -> str:
    return f"{n / 2**20:,.2f} MiB"


def band(spread: Spread) -> str:
    return f"{mib(spread.centre_bytes)} +- {mib(spread.tolerance_bytes)}"


def verdict_words(model: NoiseModel, baseline: dict[str, Any], run: dict[str, Any]) -> tuple[str, str]:
    noise = compare_runs(baseline, run, max_regression_pct=FIXED_PCT, noise=model)
    fixed = compare_runs(baseline, run, max_regression_pct=FIXED_PCT)
    named = ", ".join(
        e.spread.name if e.spread.kind == "peak" else f"{e.spread.kind} {e.spread.name}" for e in noise.beyond_noise
    )
    share = fixed.peak[0].share or 0.0
    return (
        f"{'REGRESSION' if noise.regressed else 'green'}{' (' + named + ')' if named else ''}",
        f"{'REGRESSION' if fixed.regressed else 'green'} ({share * 100:+.1f}%)",
    )


def series(family: str) -> None:
    mains = [summary(f"{family}_main_s{s:02d}") for s in range(10)]
    model = learn([("main", s) for s in mains])
    assert model is not None
    peak = model.spread("peak", PEAK)
    assert peak is not None
    print(f"== {family}: learned from {model.runs} main runs")
    print(f"   peak reserved {band(peak)} (fixed 5% of the centre: {mib(peak.centre_bytes * FIXED_PCT / 100)})")
    print("-- each main run against the other nine: noise gate | fixed 5% on the total")
    for seed in range(10):
        rest = [("main", s) for i, s in enumerate(mains) if i != seed]
        loo = learn(rest)
        assert loo is not None
        noise, fixed = verdict_words(loo, rest[-1][1], mains[seed])
        print(f"   s{seed:02d}  peak {mib(measures(mains[seed])[('peak', PEAK)]):>14}  {noise} | {fixed}")
    print("-- commit K against all ten (baseline: s09)")
    for k in range(1, 7):
        run = summary(f"{family}_c{k}_s1{k}")
        figures = measures(run)
        label, held = next((n, v) for (kind, n), v in figures.items() if kind == "stack" and n.endswith(LEAK_SITE))
        own = model.spread("stack", label)
        spread = own or model.unlisted
        assert spread is not None
        total = figures[("peak", PEAK)]
        total_word = "BEYOND" if total - peak.centre_bytes > peak.tolerance_bytes else "within"
        stack_word = "BEYOND" if held - spread.centre_bytes > spread.tolerance_bytes else "within"
        where = "its band" if own else "no main run lists it; the cutoff's band"
        noise, fixed = verdict_words(model, mains[-1], run)
        print(f"   c{k}: total {mib(total)} {total_word} its noise | fixed 5%: {fixed}")
        print(f"       stack {mib(held)} vs {band(spread)} ({where}): {stack_word}")
        print(f"       gate: {noise}")


def main(argv: list[str]) -> int:
    for family in argv or ["fseries", "fnoise"]:
        series(family)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
