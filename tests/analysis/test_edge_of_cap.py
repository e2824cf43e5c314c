"""Issue 20, item 3: a cap given for a run without an OOM, and "at the edge of the cap" as a finding.

infer_varbatch is a real inference run with no OOM (its process's own reserved peak is in the truth file);
gpt_varlen_oom is a real OOM run under a 7 GiB cap.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.readout import EDGE_OF_CAP_SHARE, edge_of_cap, parse_size
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
INFER = FIXTURES / "infer_varbatch.pickle.gz"
PEAK = json.loads((FIXTURES / "infer_varbatch.truth.json").read_text())["memory_stats"]["reserved_bytes.all.peak"]


def test_a_cap_just_above_the_peak_is_given_and_flagged_at_the_edge() -> None:
    cap = PEAK + PEAK // 50  # 2% above the run's own reserved peak
    dev = build_report(INFER, limit=cap)["devices"][0]
    assert dev["oom"] is None
    assert dev["limit"]["source"] == "given" and dev["limit"]["bytes"] == cap
    edge = dev["edge_of_cap"]
    assert edge["limit_bytes"] == cap and edge["peak_reserved_bytes"] == PEAK
    assert edge["headroom_bytes"] == cap - PEAK
    assert edge["share"] == pytest.approx(PEAK / cap)
    assert edge["source"] == "given"
    assert edge["sentence"].startswith("At the edge of the cap: no OOM, but reserved memory peaked at 31.44 GiB, 98%")


def test_room_to_spare_or_no_cap_is_no_finding() -> None:
    roomy = build_report(INFER, limit=int(PEAK / (1 - EDGE_OF_CAP_SHARE)) + 2**20)["devices"][0]
    assert roomy["limit"]["source"] == "given" and roomy["edge_of_cap"] is None
    assert build_report(INFER)["devices"][0]["edge_of_cap"] is None  # no cap known: nothing to be near


def test_a_cap_below_the_peak_says_the_run_did_not_run_under_it() -> None:
    edge = build_report(INFER, limit=PEAK - 3 * 2**29)["devices"][0]["edge_of_cap"]
    assert edge["headroom_bytes"] == -3 * 2**29
    assert "1.50 GiB above the cap of 29.94 GiB (cap given)" in edge["sentence"]


def test_an_oom_run_is_no_edge_finding() -> None:
    truth = json.loads((FIXTURES / "gpt_varlen_oom.truth.json").read_text())
    dev = build_report(FIXTURES / "gpt_varlen_oom.pickle.gz", oom_message=truth["oom_message"])["devices"][0]
    assert dev["oom"] is not None and dev["edge_of_cap"] is None
    # The pure function on the same figures without the OOM would flag it (peak 6.93 of 7 GiB):
    assert edge_of_cap({**dev, "oom": None})["share"] == pytest.approx(
        dev["summary"]["peak_reserved_bytes"] / (7 * 2**30)
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7516192768", 7 * 2**30),
        ("7GiB", 7 * 2**30),
        (" 7.5 gib ", 15 * 2**29),
        ("80GB", 80 * 10**9),
        ("1.25MiB", 1310720),
    ],
)
def test_parse_size_reads_what_people_write(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "0", "0GiB", "-1", "7XB", "1e9", "GiB", "7 GiB extra"])
def test_parse_size_refuses_what_is_no_size(text: str) -> None:
    with pytest.raises(ValueError, match="is no size"):
        parse_size(text)
