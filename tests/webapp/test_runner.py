"""runner.run_analysis: the analysis child under rlimits, with its policy replays in processes of their own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from webapp.snapshots import runner
from webapp.snapshots.child import Job

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_an_analysis_with_jobs_gives_the_report_of_one_process() -> None:
    path = FIXTURES / "gpt_varlen_oom.pickle.gz"
    limits = runner.limits_for(path, per_byte=6, minimum=1 << 30, maximum=4 << 30, cpu=120, wall=120)
    one = runner.run_analysis(path, limits)
    three = runner.run_analysis(path, runner.Limits(limits.memory_bytes, limits.cpu_seconds, limits.wall_seconds, 3))
    assert limits.jobs == 1
    assert json.dumps(three, sort_keys=True) == json.dumps(one, sort_keys=True)
    assert one["devices"][0]["oom"]["verdict"] == "fragmentation"


def test_the_child_is_told_its_job_in_one_file_that_refuses_an_unknown_setting(tmp_path: Path) -> None:
    job = Job(
        snapshot="/s/snapshot.pickle",
        report="/t/report.json",
        filename="oom.pickle",
        jobs=3,
        oom_message="CUDA out of memory. Tried to allocate 2.00 MiB.\nline two",
        batch_size=8,
        cap_bytes=7 << 30,
        explore_dir="/t/explore",
        charts="/t/charts.json",
    )
    path = tmp_path / "job.json"
    job.write(path)
    assert Job.read(path) == job
    assert json.loads(path.read_text())["jobs"] == 3
    path.write_text(json.dumps({**json.loads(path.read_text()), "threads": 4}))
    with pytest.raises(ValueError, match="threads"):
        Job.read(path)
    # Nothing of the job is left to the environment.
    assert not [k for k in runner._child_env() if k.startswith("OOMSCOPE_") and k != "OOMSCOPE_READER"]
