"""runner.run_analysis: the analysis child under rlimits, with its policy replays in processes of their own."""

from __future__ import annotations

import json
from pathlib import Path

from webapp.snapshots import runner

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_an_analysis_with_jobs_gives_the_report_of_one_process() -> None:
    path = FIXTURES / "gpt_varlen_oom.pickle.gz"
    limits = runner.limits_for(path, per_byte=6, minimum=1 << 30, maximum=4 << 30, cpu=120, wall=120)
    one = runner.run_analysis(path, limits)
    three = runner.run_analysis(path, runner.Limits(limits.memory_bytes, limits.cpu_seconds, limits.wall_seconds, 3))
    assert limits.jobs == 1
    assert json.dumps(three, sort_keys=True) == json.dumps(one, sort_keys=True)
    assert one["devices"][0]["oom"]["verdict"] == "fragmentation"


def test_the_child_is_told_its_jobs() -> None:
    assert runner._child_env(3)["OOMSCOPE_ANALYSIS_JOBS"] == "3"
