"""The triage from the error text alone, on the real messages and memory summaries of the captures.

Every ``*.truth.json`` under tests/fixtures/ holds the OOM message its run printed (or null), the
``torch.cuda.memory_summary()`` and the ``memory_stats()`` the same process read at the same moment,
and the cap it set: each figure the triage reads from the text is checked against those numbers.
tests/fixtures/triage/ holds runs without a cap (a full device, another process's memory), which the
bench's captures lack (scripts/capture_triage.py).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from analysis.__main__ import main
from analysis.limits import MAX_MESSAGE_CHARS, OomMessageError
from analysis.memory_summary import MAX_SUMMARY_CHARS, TriageError, parse_memory_summary
from analysis.triage import (
    CAPACITY,
    FRAGMENTATION,
    FRAGMENTATION_RERUNS,
    OUTSIDE,
    RECORD_SNAPSHOT,
    triage,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRUTHS = sorted(FIXTURES.glob("**/*.truth.json"))
GiB, MiB = 2**30, 2**20


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def name(path: Path) -> str:
    return str(path.relative_to(FIXTURES)).removesuffix(".truth.json")


WITH_MESSAGE = [p for p in TRUTHS if load(p).get("oom_message")]
# Issue 37's framework captures (diagnosis/fw_*, scripts/capture_frameworks.py) record memory_stats at the OOM but no
# memory_summary() text: their triage reads the message alone.
WITH_SUMMARY = [p for p in TRUTHS if "memory_summary" in load(p)]
TRIAGE_CAPTURES = FIXTURES / "triage"


def summary_stats(t: dict[str, Any]) -> dict[str, Any]:
    """The memory_stats read at the moment the summary was printed (gpu_client_oom's summary is the
    one after the exception unwound; its memory_stats are the client's at the dump)."""
    stats: dict[str, Any] = t.get("memory_stats_after_unwind") or t["memory_stats"]
    return stats


def cap_of(t: dict[str, Any]) -> int | None:
    if t.get("cap_bytes"):
        return int(t["cap_bytes"])
    cap_gib = (t.get("kwargs") or {}).get("cap_gib")
    return int(cap_gib * GiB) if cap_gib else None


def test_the_fixtures_are_there() -> None:
    # 592 bench messages (all under a cap, 576 listing other processes) + the uncapped captures.
    assert len(TRUTHS) >= 760 and len(WITH_MESSAGE) >= 592
    assert any("Process " in load(p)["oom_message"] for p in WITH_MESSAGE)
    assert any("allowed" not in load(p)["oom_message"] for p in WITH_MESSAGE), "no device-full message"
    # Only the framework captures lack the summary text (a new capture script that drops it shows up here).
    assert {name(p) for p in TRUTHS if p not in WITH_SUMMARY} == {
        f"diagnosis/fw_{f}_default" for f in ("accel", "hf_eval", "hf_train", "pl_auto", "pl_manual")
    }


# ------------------------------------------------------------------ memory_summary()


@pytest.mark.parametrize("path", WITH_SUMMARY, ids=name)
def test_every_summary_figure_holds_the_processs_own_memory_stats(path: Path) -> None:
    t = load(path)
    stats = summary_stats(t)
    summary = parse_memory_summary(t["memory_summary"])
    # All 11 rows: 9 with three pools, 2 without, 4 columns each.
    assert len(summary.figures) == (9 * 3 + 2) * 4
    assert not summary.abbreviated and summary.device == 0
    for key, fig in summary.figures.items():
        assert fig.low <= stats[key] <= fig.high, (key, stats[key], fig)
    assert summary.num_ooms == stats["num_ooms"]
    assert summary.num_alloc_retries == stats["num_alloc_retries"]


def test_an_abbreviated_summary_has_no_pools_and_the_same_totals() -> None:
    t = load(TRIAGE_CAPTURES / "triage_device_full.truth.json")
    short = parse_memory_summary(t["memory_summary_abbreviated"])
    full = parse_memory_summary(t["memory_summary"])
    assert short.abbreviated and not full.abbreviated
    assert not any("_pool." in k for k in short.figures)
    for key, fig in short.figures.items():
        assert fig == full.figures[key]
        assert fig.low <= t["memory_stats"][key] <= fig.high


def test_a_summary_inside_a_log_is_found_and_the_first_table_read() -> None:
    t = load(FIXTURES / "frag_oom.truth.json")
    other = load(TRIAGE_CAPTURES / "triage_device_full.truth.json")
    text = "step 12 loss 2.31\n" + t["memory_summary"] + "\n" + other["memory_summary"] + "\nTraceback ..."
    summary = parse_memory_summary(text)
    assert summary == parse_memory_summary(t["memory_summary"])


def test_a_summary_logged_by_every_rank_with_a_prefix_reads_the_same() -> None:
    t = load(TRIAGE_CAPTURES / "triage_device_full.truth.json")
    logged = "\n".join(f"[rank0]:[W1202 05:11:02] {line}" for line in t["memory_summary"].splitlines())
    assert parse_memory_summary(logged) == parse_memory_summary(t["memory_summary"])


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "memory_summary:empty"),
        ("   \n", "memory_summary:empty"),
        ("| Allocated memory | 1 B | 1 B | 1 B | 1 B |", "memory_summary:unrecognised"),
        ("x" * (MAX_SUMMARY_CHARS + 1), "memory_summary:too-long"),
    ],
)
def test_what_is_not_a_summary_is_refused_with_a_code(text: str, code: str) -> None:
    with pytest.raises(TriageError) as err:
        parse_memory_summary(text)
    assert err.value.code == code


def test_hostile_summaries_parse_in_linear_time() -> None:
    real = load(FIXTURES / "frag_oom.truth.json")["memory_summary"]
    header = real.split("| Allocated memory")[0]
    cases = [
        header + "|" * (MAX_SUMMARY_CHARS - len(header)),
        header + ("| Allocated memory |" + " 9" * 20 + "|\n") * ((MAX_SUMMARY_CHARS - len(header)) // 62),
        header + ("|" + " " * 30 + "|" + "1" * 30 + " MiB|\n") * ((MAX_SUMMARY_CHARS - len(header)) // 70),
        (real * (MAX_SUMMARY_CHARS // len(real)))[:MAX_SUMMARY_CHARS],
    ]
    outcomes = []
    for text in cases:
        assert len(text) <= MAX_SUMMARY_CHARS
        start = time.perf_counter()
        try:
            parse_memory_summary(text)
            outcomes.append("parsed")
        except TriageError as exc:
            outcomes.append(exc.code)
        assert time.perf_counter() - start < 0.5
    # Rows of the wrong width are skipped, so only the repeated real table is a summary (its first copy).
    assert outcomes == ["memory_summary:unrecognised"] * 3 + ["parsed"]


# ------------------------------------------------------------------ the triage on every real message


@pytest.mark.parametrize("path", WITH_MESSAGE, ids=name)
def test_triage_figures_agree_with_the_runs_own_stats_and_cap(path: Path) -> None:
    t = load(path)
    result = triage(t["oom_message"], t.get("memory_summary"))
    stats = t["memory_stats"]
    msg = result.message
    assert msg.reserved is not None and msg.allocated is not None and result.unallocated is not None
    reserved = stats["reserved_bytes.all.current"]
    # Reserved memory outlives the exception's unwinding (freed tensors go back to the cache): the
    # process's own reading equals allocated + reserved-but-unallocated as the message printed them.
    assert result.unallocated.low + msg.allocated.low <= reserved <= result.unallocated.high + msg.allocated.high
    at_oom = msg.allocated.low <= stats["allocated_bytes.all.current"] <= msg.allocated.high
    if at_oom:  # stats read inside the failing allocation or the except block, tensors alive
        assert result.unallocated.low <= reserved - stats["allocated_bytes.all.current"] <= result.unallocated.high
    # The summary's timing, judged from the text alone, is the truth's.
    own = summary_stats(t)
    if "memory_summary" in t:
        assert result.summary_timing == (
            "at-oom" if msg.allocated.low <= own["allocated_bytes.all.current"] <= msg.allocated.high else "after-oom"
        )
    cap = cap_of(t)
    if cap is not None:
        assert msg.allowed is not None and msg.allowed.low <= cap <= msg.allowed.high
        if result.binding == "per-process-cap":
            # Room is never negative: with expandable_segments reserved memory can pass the cap by a
            # page (rand_s5_c25_exp_roundup: 2 MiB over), and then there is none.
            assert result.room.low <= max(0, cap - reserved) <= result.room.high
    if msg.allowed is None:
        assert result.binding == "device" and msg.limit_kind == "device-full"
    assert result.binding in ("device", "per-process-cap")
    # The request failed, so it did not fit in the room under the binding limit.
    assert msg.tried.high > result.room.low
    # Memory outside PyTorch's cache in these runs: the CUDA context and kernels, 0.3-1 GiB on the H200, plus
    # the raw buffer a diagnosis run held outside PyTorch on purpose (its truth's "outside").
    held = int((t.get("outside") or {}).get("hog_bytes") or 0)
    assert result.non_pytorch is not None and 0.3 * GiB < result.non_pytorch.value - held < GiB
    # The JSON is plain and complete.
    data = json.loads(json.dumps(result.to_json()))
    assert data["cause"] in (OUTSIDE, FRAGMENTATION, CAPACITY, "unexplained")
    assert data["record_snapshot"] == RECORD_SNAPSHOT


def test_the_record_lines_are_torchs_own_calls() -> None:
    assert "torch.cuda.memory._record_memory_history(max_entries=" in RECORD_SNAPSHOT
    assert 'torch.cuda.memory._dump_snapshot("oom.pickle")' in RECORD_SNAPSHOT
    assert "except torch.cuda.OutOfMemoryError:" in RECORD_SNAPSHOT


def test_a_bench_message_under_a_cap_with_other_processes_blames_the_cap_not_them() -> None:
    # bert_mlm_c70_default: 604 MiB asked under a 7.27 GiB cap; another capture (pid 5185, 7.41 GiB)
    # ran on the device beside it, which had 124.96 GiB free: the cap bound, the other process did not.
    t = load(FIXTURES / "captures" / "bert_mlm_c70_default.truth.json")
    result = triage(t["oom_message"], t["memory_summary"])
    assert result.binding == "per-process-cap"
    assert [pid for pid, _ in result.message.other_processes] == [5185]
    assert result.other_processes is not None and result.other_processes.text == "7.41 GiB"
    assert result.cause == FRAGMENTATION  # 606.39 MiB reserved but unallocated, 12.31 MiB short
    assert result.shortfall.text == "12.31 MiB" and result.unallocated is not None
    assert result.unallocated.text == "606.39 MiB"
    keys = [f.key for f in result.findings]
    assert "other-processes" in keys
    other = next(f for f in result.findings if f.key == "other-processes")
    assert "do not count against this process's cap" in other.text


def families() -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for path in TRUTHS:
        t = load(path)
        # A family's runs by allocator setting: the default run and its settings' reruns (a member that changed
        # the program under the default setting, tests/fixtures/followups' batch8 or amp, is no setting's run).
        if "family" in t and (t["conf"] or str(t.get("name", "_default")).endswith("_default")):
            out[t["family"]][t["conf"]] = t
    return out


def test_capacity_verdicts_are_borne_out_by_every_real_rerun() -> None:
    # Where the message alone says capacity, no allocator setting finished the run: every rerun of the
    # family (expandable_segments, max_split_size_mb, garbage_collection_threshold, roundup) died too.
    judged = 0
    for runs in families().values():
        default = runs.get("")
        if not default or not default.get("oom_message"):
            continue
        if triage(default["oom_message"]).cause != CAPACITY or len(runs) < 2:
            continue  # (a family kept with its default run alone, as the diagnosis fixtures are, has no rerun here)
        judged += 1
        for conf, rerun in runs.items():
            assert rerun["died_step"] is not None, (default["family"], conf)
    assert judged == 16  # 14 in captures/, fgpt_c60 and fgpt_c80 in followups/


def test_fragmentation_odds_are_the_benchs() -> None:
    # The figures the fragmentation verdict quotes: its expandable_segments reruns on the bench.
    outcome: Counter[str] = Counter()
    for runs in families().values():
        default, rerun = runs.get(""), runs.get("expandable_segments:True")
        if not default or not default.get("oom_message") or rerun is None:
            continue
        result = triage(default["oom_message"])
        if result.cause != FRAGMENTATION or not result.certain:
            continue
        if rerun["died_step"] is None:
            outcome["finished"] += 1
        elif rerun["died_step"] > default["died_step"]:
            outcome["died_later"] += 1
        else:
            outcome["died_same_step"] += 1
    assert {"runs": sum(outcome.values()), **outcome} == FRAGMENTATION_RERUNS
    result = triage(load(FIXTURES / "frag_oom.truth.json")["oom_message"])
    assert result.confidence == "low"
    assert f"expandable_segments finished {FRAGMENTATION_RERUNS['finished']}" in result.confidence_reason


# ------------------------------------------------------------------ without a cap (tests/fixtures/triage/)


def test_a_full_device_fragmented_into_pieces() -> None:
    # No cap, alone on the device: each 1 GiB segment holds a 600 MiB tensor and a 424 MiB free piece.
    t = load(TRIAGE_CAPTURES / "triage_device_full.truth.json")
    message = t["oom_message"]
    assert "allowed" not in message and "Process " not in message
    result = triage(message, t["memory_summary"])
    stats = t["memory_stats"]
    msg = result.message
    assert msg.limit_kind == "device-full" and result.binding == "device"
    assert msg.total_capacity is not None and msg.total_capacity.low <= t["total_memory"] <= msg.total_capacity.high
    assert result.summary_timing == "at-oom"
    # The large pool's free pieces, as the summary gives them, hold the truth's own.
    free = t["large_free_blocks"]
    assert result.usable_unallocated is not None
    assert result.usable_unallocated.low <= free["bytes"] <= result.usable_unallocated.high
    assert result.usable_unallocated.low <= stats["inactive_split_bytes.large_pool.current"]
    pieces = result.free_pieces
    assert pieces is not None and pieces.count.low <= free["count"] <= pieces.count.high
    assert pieces.largest_at_least <= free["largest"] <= pieces.largest_at_most
    assert free["count"] == t["kept_tensors"]  # one free piece beside each tensor kept
    assert result.cause == FRAGMENTATION and result.certain
    assert "expandable_segments:True" in result.change


def test_another_process_holding_the_device_is_named_and_no_setting_is_advised() -> None:
    t = load(TRIAGE_CAPTURES / "triage_other_process.truth.json")
    result = triage(t["oom_message"], t["memory_summary"])
    holder = t["holder"]
    assert "allowed" not in t["oom_message"]
    assert result.binding == "device"
    assert [pid for pid, _ in result.message.other_processes] == [holder["pid"]]
    # NVML counts the holder's tensor and its CUDA context: at least what torch reserved there.
    assert result.other_processes is not None and result.other_processes.high >= holder["reserved_bytes"]
    assert result.cause == OUTSIDE and result.certain and result.confidence == "high"
    assert "no PYTORCH_CUDA_ALLOC_CONF setting gives it back" in result.change
    assert "another process" in result.headline


def test_a_cap_that_was_not_reached_because_the_device_filled_first() -> None:
    t = load(TRIAGE_CAPTURES / "triage_other_process_cap.truth.json")
    result = triage(t["oom_message"], t["memory_summary"])
    msg = result.message
    assert msg.allowed is not None and msg.allowed.low <= t["cap_bytes"] <= msg.allowed.high
    assert result.binding == "device"  # reserved stayed under the 60 GiB cap; the device was full
    assert msg.reserved is not None and msg.reserved.high < t["cap_bytes"]
    assert result.cause == OUTSIDE
    assert "(the cap of" in result.findings[0].text and "was not reached" in result.findings[0].text


def test_on_the_uncapped_captures_every_byte_of_the_device_is_accounted_for() -> None:
    # capacity = free + this process + the listed others, to the message's rounding: nothing unaccounted.
    for path in sorted(TRIAGE_CAPTURES.glob("*.truth.json")):
        result = triage(load(path)["oom_message"])
        assert result.unaccounted is not None and result.unaccounted.low == 0, path.name
        assert result.unaccounted.high < 64 * MiB
        assert "unaccounted" not in [f.key for f in result.findings]


def test_raising_the_cap_is_offered_only_where_the_device_had_the_shortfall_free() -> None:
    # Every capacity verdict on the bench bound at its cap with over 100 GiB of the H200 free.
    for path in WITH_MESSAGE:
        result = triage(load(path)["oom_message"])
        if result.cause != CAPACITY:
            continue
        free = result.message.device_free
        assert result.binding == "per-process-cap" and free is not None
        offered = any(alt.startswith("Raise the cap") for alt in result.alternatives)
        assert offered == (free.low >= result.shortfall.high), path.name


# torch < 2.1's layout (the message test_limits.py reads): no process list and no non-PyTorch figure;
# of the 7.93 GiB device, 47.06 MiB were free and PyTorch had reserved 188 MiB, so 7.70 GiB were held
# outside PyTorch's cache, by whom that layout does not say.
OLD_LAYOUT = (
    "CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total capacity; 130.35 MiB already "
    "allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch)"
)


def test_the_old_layout_is_triaged_with_what_it_has() -> None:
    result = triage(OLD_LAYOUT)
    assert result.binding == "device" and result.message.process_in_use is None
    assert result.unaccounted is not None and result.unaccounted.text == "7.70 GiB"
    assert result.unallocated is not None and result.unallocated.text == "57.65 MiB"
    # 36 MiB asked with 47.06 MiB free: the figures leave room, so the text cannot say why it failed.
    assert result.cause == "unexplained" and result.confidence == "low" and not result.certain
    keys = [f.key for f in result.findings]
    assert "unaccounted" in keys and "other-processes" not in keys and "non-pytorch" not in keys
    assert "fits in that room" in result.findings[keys.index("request")].text


# ------------------------------------------------------------------ refusals and the command line


def test_a_text_that_is_not_an_oom_message_is_refused_by_the_shared_parser() -> None:
    with pytest.raises(OomMessageError) as err:
        triage("RuntimeError: CUDA error: device-side assert triggered")
    assert err.value.code == "oom_message:unrecognised"
    with pytest.raises(OomMessageError) as err:
        triage("x" * (MAX_MESSAGE_CHARS + 1))
    assert err.value.code == "oom_message:too-long"


def test_a_bad_summary_beside_a_good_message_is_refused() -> None:
    t = load(FIXTURES / "frag_oom.truth.json")
    with pytest.raises(TriageError) as err:
        triage(t["oom_message"], "not a summary")
    assert err.value.code == "memory_summary:unrecognised"


def test_cli_triage_prints_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = load(TRIAGE_CAPTURES / "triage_other_process.truth.json")
    message, summary, out = tmp_path / "oom.txt", tmp_path / "summary.txt", tmp_path / "triage.json"
    message.write_text("Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: " + t["oom_message"])
    summary.write_text(t["memory_summary"])
    assert main(["triage", "--message-file", str(message), "--summary-file", str(summary)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("The device was full")
    assert "torch.cuda.memory._record_memory_history(max_entries=1_000_000)" in printed
    assert main(["triage", "--message-file", str(message), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["schema"] == "oomscope.triage/1" and data["cause"] == OUTSIDE and data["summary"] is None
    tried = re.search(r"Tried to allocate ([\d.]+ \w+)", t["oom_message"])
    assert tried is not None and data["figures"]["tried_to_allocate"]["text"] == tried.group(1)


def test_cli_triage_refuses_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("no message here")
    assert main(["triage", "--message-file", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("error: oom_message:unrecognised:")
    good = tmp_path / "good.txt"
    good.write_text(load(FIXTURES / "frag_oom.truth.json")["oom_message"])
    assert main(["triage", "--message-file", str(good), "--summary-file", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("error: memory_summary:unrecognised:")
    assert main(["triage", "--message-file", str(tmp_path / "missing.txt")]) == 2
    assert capsys.readouterr().err.startswith("error: file:unreadable:")
