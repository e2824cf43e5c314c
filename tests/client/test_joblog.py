"""The verdict in the job log: a real ``dump_on_oom`` in a subprocess prints, in the log of the rank
that died, the headline, the change and the top stacks (``oomscope_client.joblog``).

No torch here: the subprocess runs the client on the torch stand-in of ``conftest.py``, fed with what
the real two-rank DDP job on the H200 recorded (``tests/fixtures/runs/client_job``): the OOM observer
is called with the figures the real one reported, torch's exception carries the real message, and the
client's snapshot seam (``OomDumper.snapshot_source``) hands over the rank's real capture in place of
``torch.cuda.memory._snapshot()``. The block's figures are checked against the report of that capture
with the sidecar the dumper wrote, made here by the analysis library.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from analysis.report import build_report
from tests.client.conftest import CLIENT_DIR, Site

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "fixtures" / "runs" / "client_job"

# The training script: the client's hooks on the torch stand-in, and the rank's real capture.
SCRIPT = """
import gzip, json, os, pickle, sys
root, job, out, mode = sys.argv[1:5]
sys.path.insert(0, root)
from tests.client.conftest import make_fake_torch
if mode != "local":
    sys.path.remove(root)  # the analysis library is not importable on this "training machine"
torch = make_fake_torch()
sys.modules["torch"] = torch
rank = int(os.environ.get("RANK", "0"))
side = json.load(open(f"{job}/rank{rank}.json"))
torch.cuda.memory_stats = lambda device=None: {**side["memory_stats"], "num_ooms": torch.fake_state["num_ooms"]}
import oomscope_client as oc
upload = json.loads(os.environ["JOB_UPLOAD"]) if mode == "site" else None
dumper = oc.dump_on_oom(out, upload=upload)
dumper.snapshot_source = lambda: pickle.loads(gzip.decompress(open(f"{job}/rank{rank}.pickle.gz", "rb").read()))
torch.fake_init()
if side.get("error"):  # this rank's all-reduce lost its peer
    raise RuntimeError(side["error"].removeprefix("RuntimeError: "))
torch.fake_state["num_ooms"] += 1  # torch counts the OOM, then calls the observers
seen = side["observer"]
for observer in torch.fake_state["observers"]:
    observer(seen["device"], seen["alloc_bytes"], seen["allowed_bytes"], seen["device_free_bytes"])
raise torch.cuda.OutOfMemoryError(side["oom_message"])
"""


def run_job(tmp: Path, mode: str, *, rank: int | None, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_"))}
    ranks = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"} if rank is not None else {}
    return subprocess.run(
        [sys.executable, str(script), str(ROOT), str(JOB), str(tmp / "dumps"), mode],
        cwd=tmp,
        env={**clean, "PYTHONPATH": str(CLIENT_DIR), "TORCHELASTIC_RUN_ID": "job-log", **ranks, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def block_of(stderr: str, mark: str) -> list[str]:
    """The lines of the one block marked so, without the mark."""
    lines = [line.removeprefix(mark + " ") for line in stderr.splitlines() if line.startswith(mark + " ")]
    assert lines and lines[0].startswith("==== ") and lines[-1].startswith("==== end"), stderr
    return lines


def report_of(tmp: Path) -> tuple[Path, dict[str, Any]]:
    """The report the analysis library makes of the dump and the sidecar the dumper wrote."""
    (dump,) = (tmp / "dumps").glob("*.pickle.gz")
    sidecar = json.loads(dump.with_name(dump.name.removesuffix(".pickle.gz") + ".json").read_text())
    return dump, build_report(dump, filename=dump.name, sidecar=sidecar, oom_message=sidecar["oom_message"])


def expected_top(report: dict[str, Any], when: str) -> list[tuple[int, str]]:
    dev = next(d for d in report["devices"] if d["oom"]) if when == "oom" else report["devices"][0]
    return [(row["bytes"], row["label"]) for row in dev["top_stacks"] if row["when"] == when][:3]


def test_the_rank_that_died_prints_its_verdict_with_the_library(tmp_path: Path) -> None:
    from oomscope_client.joblog import size

    done = run_job(tmp_path, "local", rank=0)
    assert done.returncode == 1 and "OutOfMemoryError: CUDA out of memory" in done.stderr  # the OOM still surfaces
    block = block_of(done.stderr, "oomscope[rank 0]:")
    assert block[0] == "==== rank 0 of 2 (local rank 0, host " + os.uname().nodename + "): CUDA out of memory ===="
    dump, report = report_of(tmp_path)
    dev = next(d for d in report["devices"] if d["oom"])
    # The limit is the real one the observer reported (2 GiB cap), not the device's 139.80 GiB.
    assert dev["oom"]["limit_bytes"] == 2 << 30
    assert block[1] == dev["decision"]["headline"]
    assert block[2] == f"change: {dev['decision']['change']['line']}"
    assert block[3] == "top stacks at the OOM:"
    top = expected_top(report, "oom")
    assert len(top) == 3 and [line.split("  ", 1)[1].strip() for line in block[4:7]] == [
        f"{size(b)}  {label}" for b, label in top
    ]
    assert block[7] == f"analysed here by the oomscope library; the dump: {dump}"


def test_a_peer_rank_prints_its_own_block_and_how_it_died(tmp_path: Path) -> None:
    done = run_job(tmp_path, "local", rank=1)
    assert done.returncode == 1
    block = block_of(done.stderr, "oomscope[rank 1]:")
    assert block[0].startswith("==== rank 1 of 2 (local rank 1, host ")
    assert block[0].endswith(
        "): died of RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] "
        "Connection closed by peer [127.0.0.1]:54473 ===="
    )
    (dump,) = (tmp_path / "dumps").glob("*.pickle.gz")
    local = build_report(dump, filename=dump.name)
    dev = local["devices"][0]
    assert dev["oom"] is None and block[1] == dev["decision"]["headline"]
    assert block[3] == "top stacks at the peak:"


def test_without_the_library_or_a_site_it_says_how_to_get_the_verdict(tmp_path: Path) -> None:
    done = run_job(tmp_path, "none", rank=None)
    assert done.returncode == 1
    block = block_of(done.stderr, "oomscope:")
    assert block[0] == "==== this process (host " + os.uname().nodename + "): CUDA out of memory ===="
    (dump,) = (tmp_path / "dumps").glob("*.pickle.gz")
    assert block[1].startswith("no verdict here: the oomscope analysis library is not importable")
    assert block[2] == f"get it with: python -m analysis report {dump}   (from the oomscope repository)"


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_without_the_library_the_site_gives_the_verdict(
    live_site: Site, django_user_model: Any, tmp_path: Path
) -> None:
    from webapp.snapshots.teams import membership, tokens

    alice = django_user_model.objects.create_user("alice", password="pw-alice-123")
    alpha = membership.project_create(
        team=membership.team_create(name="Team A", slug="team-a", owner=alice), name="Alpha", slug="alpha"
    )
    token = tokens.api_token_create(alice, default_project=alpha)
    spec = {"url": live_site.url, "token": token, "project": "alpha", "run": "job-log-site", "wait": 300}
    done = run_job(tmp_path, "site", rank=None, JOB_UPLOAD=json.dumps(spec))
    assert done.returncode == 1, done.stderr
    block = block_of(done.stderr, "oomscope:")
    _, report = report_of(tmp_path)
    dev = next(d for d in report["devices"] if d["oom"])
    # The site's report of the uploaded dump says what the library says here.
    assert block[1] == dev["decision"]["headline"], live_site.logs()
    assert block[2] == f"change: {dev['decision']['change']['line']}"
    sidecar = json.loads(next((tmp_path / "dumps").glob("*.json")).read_text())
    assert block[-2] == f"report: {sidecar['upload']['url']}"


def test_the_blocks_sizes_are_worded_as_the_reports() -> None:
    from oomscope_client.joblog import size

    from analysis.readout import size as report_size

    report = build_report(JOB / "rank0.pickle.gz")
    figures = [row["bytes"] for dev in report["devices"] for row in dev["top_stacks"]]
    figures += [0, 1, 1024, 1025, 1 << 20, (1 << 20) + 1, 1 << 30, (1 << 30) + 1, -(3 << 29)]
    assert [size(n) for n in figures] == [report_size(n) for n in figures]
