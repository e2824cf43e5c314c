"""``python -m analysis``: exit codes, the error line, the JSON on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.__main__ import main
from tests.analysis.test_report import CONTRACT_DEVICE_KEYS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "analysis", *args], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )


def test_report_json_to_stdout_parses_and_has_every_contract_key() -> None:
    proc = run_cli(
        "report", str(FIXTURES / "frag_oom.pickle.gz"), "--json", "-", "--whatif", "expandable_segments:True"
    )
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["schema"] == "oomscope.report/1"
    assert set(rep) >= {"schema", "source", "capture", "devices"}
    dev = rep["devices"][0]
    assert set(dev) >= CONTRACT_DEVICE_KEYS
    assert dev["oom"]["verdict"] == "fragmentation"
    assert rep["source"]["filename"] == "frag_oom.pickle.gz"


def test_not_a_snapshot_exits_2_with_one_error_line(tmp_path: Path) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("these are not the bytes you are looking for\n")
    proc = run_cli("report", str(junk))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: snapshot:")
    code = lines[0].split(": ", 2)[1]
    assert code.count(":") == 2  # snapshot:<area>:<reason>
    assert proc.stdout == ""


def test_bad_whatif_config_exits_2_with_config_code() -> None:
    proc = run_cli("report", str(FIXTURES / "frag_oom.pickle.gz"), "--whatif", "max_split_size_mb:banana")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: config:invalid: ")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_whatif_command_json_and_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "w.json"
    assert (
        main(
            [
                "whatif",
                str(FIXTURES / "gpt_varlen_oom.pickle.gz"),
                "--config",
                "expandable_segments:True",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    item = result["devices"][0]["whatif"]
    assert item["config"] == "expandable_segments:True"
    # The real run with expandable_segments got past the recorded OOM (gpt_varlen_expandable).
    assert item["oom_avoided"] is True
    truth = json.loads((FIXTURES / "gpt_varlen_oom.truth.json").read_text())
    assert result["devices"][0]["recorded_peak_reserved_bytes"] == truth["memory_stats"]["reserved_bytes.all.peak"]
    assert main(["whatif", str(FIXTURES / "gpt_varlen_oom.pickle.gz"), "--config", "expandable_segments:True"]) == 0
    assert "OOM avoided" in capsys.readouterr().out


def test_human_summary_names_the_verdict_and_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(FIXTURES / "gpt_varlen_oom.pickle.gz")]) == 0
    text = capsys.readouterr().out
    assert "FRAGMENTATION" in text
    assert "suggest [smaller_batch]" in text  # not expandable_segments: its real rerun died 4 steps later


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope.pickle")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_limit_flag_sets_the_oom_limit(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    # The cap PyTorch's OOM message names: "7.00 GiB allowed".
    assert "7.00 GiB allowed" in json.loads((FIXTURES / "gpt_varlen_oom.truth.json").read_text())["oom_message"]
    seven_gib = str(7 * 2**30)
    assert main(["report", str(FIXTURES / "gpt_varlen_oom.pickle.gz"), "--limit", seven_gib, "--json", str(out)]) == 0
    oom = json.loads(out.read_text())["devices"][0]["oom"]
    assert oom["limit_bytes"] == 7 * 2**30
    assert oom["limit_source"] == "given"
    # From the message: 5.51 GiB allocated + 710 MiB (0.69 GiB) requested = 6.20 GiB <= 7.00 GiB.
    assert oom["verdict"] == "fragmentation"
    assert oom["shortfall_bytes"] == 0
    # headroom = 7 GiB - reserved at the OOM (memory_stats' current: no segment changed after it).
    stats = json.loads((FIXTURES / "gpt_varlen_oom.truth.json").read_text())["memory_stats"]
    assert oom["headroom_bytes"] == 7 * 2**30 - stats["reserved_bytes.all.current"]


def test_jobs_flag_changes_processes_not_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = str(FIXTURES / "two_gpu_pipeline.pickle.gz")
    one, three = tmp_path / "1.json", tmp_path / "3.json"
    assert main(["report", snapshot, "--jobs", "1", "--json", str(one), "--whatif", "max_split_size_mb:64"]) == 0
    assert main(["report", snapshot, "--jobs", "3", "--json", str(three), "--whatif", "max_split_size_mb:64"]) == 0
    assert json.loads(three.read_text()) == json.loads(one.read_text())
    with pytest.raises(SystemExit) as refused:
        main(["report", snapshot, "--jobs", "0"])
    assert refused.value.code == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err


def test_oom_message_flags_give_the_real_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truth = json.loads((FIXTURES / "gpt_varlen_oom.truth.json").read_text())
    snapshot = str(FIXTURES / "gpt_varlen_oom.pickle.gz")
    msg_file = tmp_path / "log.txt"
    msg_file.write_text(
        "step 23 ...\nTraceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: " + truth["oom_message"]
    )
    out = tmp_path / "r.json"
    assert main(["report", snapshot, "--oom-message-file", str(msg_file), "--json", str(out)]) == 0
    dev = json.loads(out.read_text())["devices"][0]
    assert dev["oom"]["limit_source"] == "oom_message" and dev["oom"]["limit_bytes"] == 7 * 2**30
    assert main(["report", snapshot, "--oom-message", truth["oom_message"]]) == 0
    text = capsys.readouterr().out
    assert "limit 7.00 GiB (oom_message)" in text and "two decimals" in text


def test_a_text_that_is_no_oom_message_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = str(FIXTURES / "gpt_varlen_oom.pickle.gz")
    assert main(["report", snapshot, "--oom-message", "RuntimeError: CUDA error: an illegal memory access"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: oom_message:unrecognised: ") and len(err.strip().splitlines()) == 1


def test_inferred_limit_is_shown_as_a_lower_bound(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(FIXTURES / "gpt_varlen_expandable.pickle.gz")]) == 0
    text = capsys.readouterr().out
    # Recorded under expandable segments: the most a check let through, 7,230,980,096 B (6.73 GiB;
    # the peak reserved 7,220,494,336 B is not itself a bound there), below the run's 7 GiB cap.
    assert "limit at least 6.73 GiB (inferred)" in text


def test_whatif_command_answers_at_step_level(capsys: pytest.CaptureFixture[str]) -> None:
    # gpu_grow_oom's real expandable_segments run died in the same step (gpu_expandable_oom).
    snapshot = str(FIXTURES / "gpu_grow_oom.pickle.gz")
    assert main(["whatif", snapshot, "--config", "expandable_segments:True", "--json", "-"]) == 0
    item = json.loads(capsys.readouterr().out)["devices"][0]["whatif"]
    assert item["oom_avoided"] is True and item["step_completes"] is False
    assert item["oom_projected"]["allocation"] == 22


def _run_cli_env(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "analysis", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize("reader", ["compiled", "python"])
def test_a_tuple_nested_a_million_deep_as_a_dict_key_is_refused_not_a_segfault(tmp_path: Path, reader: str) -> None:
    """Issue 36: the C unpickler hashes a dict key as it builds the dict, and CPython hashes a tuple
    recursively with no depth check; a key ``((...(),),)`` a million deep (one byte a level:
    EMPTY_TUPLE then TUPLE1 a million times) overflowed the C stack: exit -11 in both readers."""
    deep = tmp_path / "deep.pickle"
    deep.write_bytes(b"\x80\x04}" + b"\x8c\x08segments]s" + b")" + b"\x85" * 1_000_000 + b"K\x01s.")
    proc = _run_cli_env({"OOMSCOPE_READER": "python" if reader == "python" else ""}, "report", str(deep))
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.startswith("error: snapshot:limit:too-deep: ")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert proc.stdout == ""


def test_the_command_line_runs_under_the_sites_memory_cap_and_a_flag_lifts_it(tmp_path: Path) -> None:
    """A BINBYTES8 that claims 4 GiB: the unpickler allocates the claim before reading. Under the
    cap the site's child has (1 GiB + 6 bytes per byte here) that is ``snapshot:limit:memory``; with
    ``--no-limits`` the allocation succeeds and the read fails as truncated (as it did before the cap)."""
    claim = tmp_path / "claim.pickle"
    claim.write_bytes(b"\x80\x04\x8e" + (4 << 30).to_bytes(8, "little") + b"abc.")
    capped = run_cli("report", str(claim))
    assert capped.returncode == 2
    assert capped.stderr.startswith("error: snapshot:limit:memory: ")
    lifted = run_cli("report", str(claim), "--no-limits")
    assert lifted.returncode == 2
    assert lifted.stderr.startswith("error: snapshot:format:truncated: ")


def test_the_memory_cap_follows_the_sites_formula(tmp_path: Path) -> None:
    from analysis.__main__ import memory_cap

    plain = tmp_path / "a.pickle"
    plain.write_bytes(b"x" * 1000)
    gz = FIXTURES / "frag_oom.pickle.gz"
    unpacked = int.from_bytes(gz.read_bytes()[-4:], "little")
    assert unpacked > gz.stat().st_size
    assert memory_cap([plain]) == (1 << 30) + 6 * 1000
    assert memory_cap([plain, gz]) == (1 << 30) + 6 * (1000 + unpacked)
    assert memory_cap([tmp_path / "missing"]) == 1 << 30
