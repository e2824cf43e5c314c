"""Many ranks as one run (``analysis/runs.py``, ``python -m analysis report R0 R1 --json``).

The rank files are stand-ins built from real H200 captures of one workload (the GPT of
``docs/captures.md`` under a 75% cap): ``gpt_autocast_c75_default`` died of an OOM at step 3,
``gpt_autocast_c75_expandable`` ran the same steps to the end. They were two single-process runs,
not a two-rank DDP job; real per-rank captures are to be added from a GPU batch.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from analysis.runs import RankInput, failure_kind, rank_from_name, summarise

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"
REPO = Path(__file__).resolve().parents[2]
DIED = CAPTURES / "gpt_autocast_c75_default.pickle.gz"
LIVED = CAPTURES / "gpt_autocast_c75_expandable.pickle.gz"
ALSO_DIED = CAPTURES / "gpt_autocast_c75_roundup4.pickle.gz"
GLOO_PEER_GONE = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500"
)


def truth(path: Path) -> dict[str, int]:
    stats: dict[str, int] = json.loads(path.with_name(path.name.replace(".pickle.gz", ".truth.json")).read_text())[
        "memory_stats"
    ]
    return stats


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "analysis", "report", *args, "--jobs", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ranks")
    shutil.copy(DIED, folder / "rank0.pickle.gz")
    shutil.copy(LIVED, folder / "rank1.pickle.gz")
    return folder


@pytest.fixture(scope="module")
def run_json(two_ranks: Path) -> dict[str, object]:
    out = two_ranks / "run.json"
    proc = cli(str(two_ranks / "rank0.pickle.gz"), str(two_ranks / "rank1.pickle.gz"), "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data: dict[str, object] = json.loads(out.read_text())
    return data


def test_cli_run_report_has_each_rank_peaks_equal_to_the_processes_own(run_json: dict) -> None:
    assert run_json["schema"] == "oomscope.run/1"
    ranks = run_json["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for row, source in zip(ranks, (DIED, LIVED), strict=True):
        stats = truth(source)
        assert row["peak_reserved_bytes"] == stats["reserved_bytes.all.peak"]
        assert row["peak_allocated_bytes"] == stats["allocated_bytes.all.peak"]
        # The per-rank report rides along whole, as a one-file report would be.
        assert row["report"]["schema"] == "oomscope.report/1"
        assert row["report"]["source"]["filename"] == f"rank{row['rank']}.pickle.gz"
    assert [r["failure"] for r in ranks] == ["oom", "none"]


def test_cli_run_names_the_first_oom_rank_and_the_imbalance(run_json: dict) -> None:
    run = run_json["run"]
    assert run["first_oom_rank"] == 0
    assert run["first_oom_reason"].startswith("Out of memory from fragmentation")
    peaks = [truth(DIED)["reserved_bytes.all.peak"], truth(LIVED)["reserved_bytes.all.peak"]]
    assert peaks == [5_341_446_144, 5_249_171_456]
    assert run["imbalance"]["peak_reserved"] == round(max(peaks) / (sum(peaks) / 2), 4) == 1.0087
    assert run["world_size"] == 2 and run["missing_ranks"] == []
    assert run["peak_reserved_bytes"] == max(peaks)


def test_stacks_that_differ_between_ranks_are_listed(run_json: dict) -> None:
    spreads = {s["site"]: s for s in run_json["run"]["differing_stacks"]}
    # The rank that died held two 622 MiB cross-entropy buffers at its peak; the other, one.
    train = spreads["scripts/capture_diff.py:143 _train"]
    assert train["bytes_by_rank"] == {"0": 1_304_577_024, "1": 652_288_512}
    # The backward pass is at the living rank's peak only (the dead one peaked in its forward).
    backward = next(s for site, s in spreads.items() if site.startswith("backward pass"))
    assert backward["absent_on"] == [0]
    # Sites within 10% on both ranks are not differences.
    assert "scripts/capture_diff.py:259 forward" not in spreads


def test_a_rank_whose_collective_failed_is_a_peer_failure(two_ranks: Path, tmp_path: Path) -> None:
    for name in ("rank0.pickle.gz", "rank1.pickle.gz"):
        shutil.copy(two_ranks / name, tmp_path / name)
    (tmp_path / "rank1.json").write_text(json.dumps({"rank": 1, "world_size": 2, "error": GLOO_PEER_GONE}))
    proc = cli(str(tmp_path / "rank1.pickle.gz"), str(tmp_path / "rank0.pickle.gz"), "--json", "-")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["run"]["peer_failed_ranks"] == [1]
    assert data["run"]["first_oom_rank"] == 0
    assert data["ranks"][1]["error"] == GLOO_PEER_GONE
    assert data["run"]["notes"] == []


def test_the_first_oom_follows_the_clock_not_the_rank_number() -> None:
    from analysis.report import build_report

    a, b = build_report(DIED), build_report(ALSO_DIED)
    time_a, time_b = a["devices"][0]["oom"]["time_us"], b["devices"][0]["oom"]["time_us"]
    assert time_a != time_b
    earlier_is_a = time_a < time_b
    # Give the earlier file the higher rank: the summary must still name it.
    run = summarise(
        [RankInput(rank=7 if earlier_is_a else 2, report=a), RankInput(rank=2 if earlier_is_a else 7, report=b)]
    )
    assert run.first_oom_rank == 7
    assert run.to_dict()["run"]["oom_ranks"] == [2, 7]


def test_missing_ranks_are_named(run_json: dict) -> None:
    ranks = [RankInput(rank=r["rank"], report=r["report"]) for r in run_json["ranks"]]
    assert summarise(ranks, world_size=4).missing_ranks == [2, 3]


def test_a_rank_given_twice_exits_2(two_ranks: Path) -> None:
    proc = cli(str(two_ranks / "rank0.pickle.gz"), str(two_ranks / "rank0.pickle.gz"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: run:duplicate-rank:")


@pytest.mark.parametrize(
    ("oom", "error", "kind"),
    [
        (True, None, "oom"),
        (False, None, "none"),
        (False, GLOO_PEER_GONE, "peer"),
        (
            False,
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited",
            "peer",
        ),
        (False, "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE)", "peer"),
        (False, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 624.00 MiB", "oom"),
        (False, "ValueError: bad batch", "error"),
    ],
)
def test_failure_kinds(oom: bool, error: str | None, kind: str) -> None:
    assert failure_kind(oom=oom, error=error) == kind


def test_rank_from_name() -> None:
    assert rank_from_name("oom-host-rank3.pickle.gz") == 3
    assert rank_from_name("job_rank_12.pickle") == 12
    assert rank_from_name("snapshot.pickle") is None


# --- a real two-rank DDP job (scripts/ddp_oom_plain.py on an H200, docs/runs.md) ---------------

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
REAL = [RUNS / "ddp_gloo_rank0.pickle.gz", RUNS / "ddp_gloo_rank1.pickle.gz"]


def sidecar(rank: int) -> dict:
    data: dict = json.loads((RUNS / f"ddp_gloo_rank{rank}.json").read_text())
    return data


def test_a_real_ddp_run_names_the_oom_rank_and_the_rank_its_death_broke() -> None:
    proc = cli(*map(str, REAL), "--json", "-")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    ranks = {r["rank"]: r for r in data["ranks"]}
    for rank in (0, 1):
        stats = sidecar(rank)["memory_stats"]
        assert ranks[rank]["peak_reserved_bytes"] == stats["reserved_bytes.all.peak"]
        assert ranks[rank]["peak_allocated_bytes"] == stats["allocated_bytes.all.peak"]
    assert (ranks[0]["failure"], ranks[1]["failure"]) == ("oom", "peer")
    assert ranks[1]["error"] == sidecar(1)["error"]  # gloo's own words, as rank 1 raised them
    assert "Connection closed by peer" in ranks[1]["error"]
    run = data["run"]
    assert run["first_oom_rank"] == 0 and run["peer_failed_ranks"] == [1] and run["notes"] == []
    # Why rank 0 died is its own report's decision, word for word.
    assert run["first_oom_reason"] == ranks[0]["report"]["devices"][0]["decision"]["headline"]
    assert ranks[0]["verdict"] == "fragmentation"
    peaks = [2_136_997_888, 899_678_208]  # the two processes' own reserved peaks
    assert run["imbalance"]["peak_reserved"] == round(max(peaks) / (sum(peaks) / 2), 4) == 1.4075
    # Rank 0's limit is its sidecar's OOM message ("2.00 GiB allowed"), read beside the snapshot.
    oom = ranks[0]["report"]["devices"][0]["oom"]
    assert (oom["limit_source"], oom["limit_bytes"]) == ("oom_message", 2 * 2**30)


# --- a run against its baseline (analysis/regression.py) -----------------------------------------


def one_rank(path: Path) -> dict:
    from analysis.report import build_report

    return summarise([RankInput(rank=0, report=build_report(path))]).to_dict()


def test_regression_by_peak_growth_alone_follows_the_threshold() -> None:
    from analysis.regression import compare_runs

    # Two runs that both died: no new OOM, so only the peak's growth can make a regression.
    died, also_died = one_rank(DIED), one_rank(ALSO_DIED)
    share = (truth(ALSO_DIED)["reserved_bytes.all.peak"] - truth(DIED)["reserved_bytes.all.peak"]) / truth(DIED)[
        "reserved_bytes.all.peak"
    ]
    assert round(share, 4) == 0.0141  # roundup4 reserved 75,497,472 B more
    strict = compare_runs(died, also_died, max_regression_pct=1.0)
    loose = compare_runs(died, also_died, max_regression_pct=5.0)
    assert (strict.regressed, loose.regressed) == (True, False)
    assert not strict.new_oom and strict.peak[0].delta_bytes == 75_497_472
    assert strict.reason.startswith("Memory regression. Peak reserved memory grew from 4.97 GiB")
    assert loose.reason.startswith("No memory regression.") and "(+1.41%, threshold 5%)" in loose.reason
    assert loose.headline == "peak +1.41%"


def test_a_new_oom_is_a_regression_whatever_the_threshold() -> None:
    from analysis.regression import compare_runs

    result = compare_runs(one_rank(LIVED), one_rank(DIED), max_regression_pct=50.0, baseline_name="base", run_name="x")
    assert result.regressed and result.new_oom
    assert "X ran out of memory (first on rank 0: Out of memory from fragmentation" in result.reason
    assert result.to_dict()["schema"] == "oomscope.regression/1"


@pytest.mark.parametrize("pct", [float("nan"), float("inf"), float("-inf"), -1.0, 1000.5])
def test_a_threshold_that_is_not_a_finite_percentage_is_refused(pct: float) -> None:
    """Issue 36: a NaN or infinite threshold came back in the verdict's JSON as a bare NaN/Infinity."""
    from analysis.regression import compare_runs

    with pytest.raises(ValueError, match="max_regression_pct: "):
        compare_runs(one_rank(DIED), one_rank(ALSO_DIED), max_regression_pct=pct)


def test_the_verdicts_json_is_strict_json_at_the_edges() -> None:
    """Threshold 0 and 1000 pass; a peak of 0 bytes in the baseline has no share (None), never inf."""
    from analysis.regression import compare_runs

    died, also_died = one_rank(DIED), one_rank(ALSO_DIED)
    empty = {**died, "run": {**died["run"], "peak_reserved_bytes": 0, "peak_allocated_bytes": 0}}
    for base, pct in ((died, 0.0), (died, 1000.0), (empty, 5.0)):
        verdict = compare_runs(base, also_died, max_regression_pct=pct).to_dict()
        text = json.dumps(verdict, allow_nan=False)  # raises on NaN or Infinity
        assert json.loads(text)["max_regression_pct"] == pct
    assert compare_runs(empty, also_died, max_regression_pct=5.0).peak[0].share is None


# --- the ranks as one archive (analysis/rankfiles.py) -------------------------------------------


def pack_tar(target: Path, extra: list[tarfile.TarInfo] | None = None) -> Path:
    with tarfile.open(target, "w:gz") as archive:
        for path in [*REAL, RUNS / "ddp_gloo_rank0.json", RUNS / "ddp_gloo_rank1.json"]:
            archive.add(path, arcname=f"job-991/{path.name}")
        for info in extra or []:
            archive.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return target


def test_a_tar_or_zip_of_the_ranks_is_the_same_run(tmp_path: Path) -> None:
    separate = json.loads(cli(*map(str, REAL), "--json", "-").stdout)
    tar = pack_tar(tmp_path / "job.tar.gz")
    with zipfile.ZipFile(tmp_path / "job.zip", "w") as archive:
        for path in [*REAL, RUNS / "ddp_gloo_rank0.json", RUNS / "ddp_gloo_rank1.json"]:
            archive.write(path, arcname=path.name)
    for packed in (tar, tmp_path / "job.zip"):
        proc = cli(str(packed), "--json", "-")
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert data["run"] == separate["run"]  # sidecars inside the archive were read too
        assert [r["peak_reserved_bytes"] for r in data["ranks"]] == [
            r["peak_reserved_bytes"] for r in separate["ranks"]
        ]


def test_an_archive_member_cannot_write_outside_and_links_are_skipped(tmp_path: Path) -> None:
    from analysis.rankfiles import unpack_ranks

    escape = tarfile.TarInfo("../../escaped.pickle")
    escape.size = 10
    link = tarfile.TarInfo("rank9.pickle.gz")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    tar = pack_tar(tmp_path / "job.tar.gz", [escape, link])
    into = tmp_path / "scratch" / "0"
    members = unpack_ranks(tar, into)
    assert members is not None
    assert sorted(p.name for p in members) == sorted(
        [
            "escaped.pickle",
            "ddp_gloo_rank0.pickle.gz",
            "ddp_gloo_rank1.pickle.gz",
            "ddp_gloo_rank0.json",
            "ddp_gloo_rank1.json",
        ]
    )
    assert all(p.parent == into for p in members)
    assert not (tmp_path / "escaped.pickle").exists() and not (tmp_path.parent / "escaped.pickle").exists()


def test_a_torch_save_zip_is_a_snapshot_not_an_archive(tmp_path: Path) -> None:
    from analysis.rankfiles import unpack_ranks

    with zipfile.ZipFile(tmp_path / "snap.pt", "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("archive/version", "3\n")
    assert unpack_ranks(tmp_path / "snap.pt", tmp_path / "scratch") is None
    assert unpack_ranks(DIED, tmp_path / "scratch") is None  # a gzipped pickle: no archive either
