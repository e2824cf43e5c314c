"""runner.run_child: the analysis child under rlimits, with its policy replays in processes of their own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from webapp.snapshots.worker import childproc, runner
from webapp.snapshots.worker.child import Job

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_an_analysis_with_jobs_gives_the_report_of_one_process() -> None:
    path = FIXTURES / "gpt_varlen_oom.pickle.gz"
    limits = runner.limits_for(path, per_byte=6, minimum=1 << 30, maximum=4 << 30, cpu=120, wall=120)
    one = runner.run_child(path, limits).report
    three = runner.run_child(
        path, runner.Limits(limits.memory_bytes, limits.cpu_seconds, limits.wall_seconds, 3)
    ).report
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
    assert not [k for k in childproc.child_env() if k.startswith("OOMSCOPE_") and k != "OOMSCOPE_READER"]


def _in_a_fresh_interpreter(code: str) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)


def test_the_child_imports_bokeh_on_a_thread_beside_the_analysis() -> None:
    # bokeh's import (~0.5 s on the worker's box) runs while the analysis does; the child's module
    # itself still loads no bokeh (tests/test_boundaries.py).
    done = _in_a_fresh_interpreter(
        "import sys, threading\n"
        "from webapp.snapshots.worker import child\n"
        "assert 'bokeh' not in sys.modules\n"
        "child._import_charts_beside()\n"
        "[t.join() for t in threading.enumerate() if t.name == 'charts-import']\n"
        "print('webapp.snapshots.pages.charts' in sys.modules, 'bokeh' in sys.modules)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_a_failed_import_beside_the_analysis_is_left_to_the_charts_step() -> None:
    # The memory cap reached during that import: nothing is raised or printed there; _charts imports
    # again and keeps the report without charts when that fails too.
    done = _in_a_fresh_interpreter(
        "import sys, threading\n"
        "class Full:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'webapp.snapshots.pages.charts':\n"
        "            raise MemoryError\n"
        "sys.meta_path.insert(0, Full())\n"
        "from webapp.snapshots.worker import child\n"
        "child._import_charts_beside()\n"
        "[t.join() for t in threading.enumerate() if t.name == 'charts-import']\n"
        "print(child._charts({'devices': []}))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{}"
    assert "charts-import" not in done.stderr


def test_a_broken_charts_import_fails_the_child_loudly() -> None:
    # Not the memory cap: a module of ours that cannot be imported is a broken install, never a report
    # quietly stored without charts (tests/test_import_guards.py; issue 31).
    done = _in_a_fresh_interpreter(
        "import sys\n"
        "from webapp.snapshots.worker import child\n"
        "sys.modules['webapp.snapshots.pages.charts'] = None\n"
        "child._charts({'devices': []})\n"
    )
    assert done.returncode != 0
    assert "ModuleNotFoundError" in done.stderr or "ImportError" in done.stderr
