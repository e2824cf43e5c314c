"""One row per allocator setting, one row per cause: a new one is picked up everywhere with nothing else changed.

A fake setting row (it turns expandable segments on under another key) is added to the settings table; the
report's own what-ifs, the advisor, the ranked table, the GPU fit, the decision's env line and the conf round
trip must all show it, and the rest of the report must stay what it was. A fake cause row does the same for
the cause rules: its growth and its "a smaller batch does not help" act through the row alone.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from analysis import causes, sizing
from analysis.allocator import config
from analysis.allocator.config import AllocatorConfig, Setting, setting_of, split_conf, whatif_candidates
from analysis.causes import CauseRule
from analysis.causes.base import Cause, CauseInput
from analysis.errors import ConfigError
from analysis.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KEY = "oomscope_fake_expandable"


def _read_fake(cfg: AllocatorConfig, value: str) -> AllocatorConfig:
    if value != "True":
        raise ConfigError(f"{KEY} expects True, got {value!r}")
    return replace(cfg, expandable_segments=True, other=(*cfg.other, (KEY, value)))


def _fake_conf(cfg: AllocatorConfig) -> str | None:
    return next((f"{k}:{v}" for k, v in cfg.other if k == KEY), None)


FAKE = Setting(
    key=KEY,
    read=_read_fake,
    to_conf=_fake_conf,
    title="Turn on the fake setting",
    reason="the fake row's own reason",
    cost="none",
    whatifs=(f"{KEY}:True",),
    whatif_order=-1,
)


@pytest.fixture
def with_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    # First in the table: its suggestion wins the tie with expandable_segments (the same replay).
    monkeypatch.setattr(config, "SETTINGS", (FAKE, *config.SETTINGS))


def _report(name: str) -> dict[str, Any]:
    dev: dict[str, Any] = build_report(FIXTURES / f"{name}.pickle.gz")["devices"][0]
    return dev


def _without(items: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [i for i in items if i.get("id", i.get("setting")) != key]


@pytest.mark.usefixtures("with_fake")
def test_a_new_setting_row_is_parsed_written_back_and_offered() -> None:
    cfg = AllocatorConfig.parse(f"max_split_size_mb:256,{KEY}:True")
    assert cfg.expandable_segments and cfg.max_split_size == 256 << 20
    # The table's order: the fake row is first, then expandable_segments (which it turned on).
    assert cfg.to_conf() == f"{KEY}:True,expandable_segments:True,max_split_size_mb:256"
    assert AllocatorConfig.parse(cfg.to_conf()) == cfg
    with pytest.raises(ConfigError, match=KEY):
        AllocatorConfig.parse(f"{KEY}:False")
    assert setting_of(f"{KEY}:True") == KEY
    assert [(p.key, p.value) for p in split_conf(f"{KEY}:True,roundup_power2_divisions:[1:4,>:8]")] == [
        (KEY, "True"),
        ("roundup_power2_divisions", "[1:4,>:8]"),
    ]
    assert whatif_candidates(AllocatorConfig(), capped=False, at_most=2) == [
        (KEY, f"{KEY}:True"),
        ("expandable_segments", "expandable_segments:True"),
    ]
    # Already set: neither it nor expandable_segments (which it set) is tried again.
    assert [k for k, _ in whatif_candidates(cfg, capped=True, at_most=99)] == [
        "garbage_collection_threshold",
        "roundup_power2_divisions",
    ]


def test_the_report_picks_up_a_new_setting_row_and_nothing_else_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    # gpu_roundup: recorded under roundup_power2_divisions:4, and expandable_segments is the decision's change.
    before = _report("gpu_roundup")
    monkeypatch.setattr(config, "SETTINGS", (FAKE, *config.SETTINGS))
    after = _report("gpu_roundup")

    fake_w = next(w for w in after["whatif"] if w["setting"] == KEY)
    expandable_w = next(w for w in after["whatif"] if w["setting"] == "expandable_segments")
    assert (fake_w["config"], fake_w["origin"]) == (f"{KEY}:True", "auto")
    assert fake_w["peak_reserved_bytes"] == expandable_w["peak_reserved_bytes"]
    fake_s = next(s for s in after["suggestions"] if s["id"] == KEY)
    assert fake_s["title"] == FAKE.title and fake_s["evidence"].endswith(f"({FAKE.reason}).")
    assert fake_s["config"] == f"PYTORCH_CUDA_ALLOC_CONF={KEY}:True"
    row = next(r for r in after["ranked"] if r["id"] == KEY)
    assert (row["cost"], row["cost_words"]) == ("none", sizing.COSTS["none"][1])
    if after["oom"] is None:
        assert f"{KEY}:True" in {r["config"] for r in after["gpu_fit"]["settings"]}
    change = after["decision"]["change"]
    assert before["decision"]["change"]["id"] == "expandable_segments"
    # The recorded setting kept as written, the new one added: through the one conf parser.
    assert (change["id"], change["kind"]) == (KEY, "env")
    assert change["line"] == f"PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4,{KEY}:True"

    # Everything else is what it was.
    assert _without(after["whatif"], KEY) == before["whatif"]
    assert _without(after["suggestions"], KEY) == before["suggestions"]
    assert _without(after["ranked"], KEY) == before["ranked"]
    for key in ("summary", "oom", "diagnosis", "batch_fit", "replay"):
        assert after.get(key) == before.get(key), key


def test_a_row_tried_at_several_values_lists_its_best_with_the_others_as_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    # The report folds a setting it tries at several values into one item, as it does with
    # max_split_size_mb: that reads the row (its what-ifs), not the setting's name.
    many = replace(FAKE, whatifs=(f"{KEY}:True", "expandable_segments:True,max_split_size_mb:256"))
    monkeypatch.setattr(config, "SETTINGS", (many, *config.SETTINGS))
    after = _report("gpu_roundup")
    fake = [w for w in after["whatif"] if w["setting"] == KEY]
    assert len(fake) == 1
    assert [t["config"] for t in fake[0]["tried"]] == list(many.whatifs)
    split = next(w for w in after["whatif"] if w["setting"] == "max_split_size_mb")
    assert len(split["tried"]) >= 2


def test_a_setting_row_without_a_cost_or_with_an_unknown_one_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match="cost"):
        Setting(key=KEY, read=_read_fake, to_conf=_fake_conf, title="t", reason="r")  # type: ignore[call-arg]
    monkeypatch.setattr(config, "SETTINGS", (replace(FAKE, cost="cheap"), *config.SETTINGS))
    with pytest.raises(ValueError, match=f"{KEY}: 'cheap'"):
        sizing._check_costs()


def _fake_cause(inp: CauseInput) -> Cause | None:
    if inp.oom_index is None:
        return None
    return Cause(
        title="A fake cause",
        phase="other",
        explains_oom=True,
        headline="The fake cause's headline.",
        evidence="none",
        fix_title="Fix the fake cause",
        fix_line="fake()",
        saving_bytes=None,
        fits_after_fix=None,
        settings="the fake cause grows: settings only postpone the OOM",
    )


FAKE_CAUSE = CauseRule(
    id="fake_cause",
    find=_fake_cause,
    cost="the fake cost",
    phase="backward",
    grows=True,
    smaller_batch_helps=False,
)


def test_a_new_cause_row_acts_through_its_row_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # rand_s10_c40_roundup4: no cause found; smaller_batch and settings that avoid the OOM are suggested.
    name = "captures/rand_s10_c40_roundup4"
    before = _report(name)
    assert before["diagnosis"]["primary"] is None
    assert "smaller_batch" in {s["id"] for s in before["suggestions"]}
    assert any(s["avoids_oom"] is True and s["id"] != "smaller_batch" for s in before["suggestions"])
    monkeypatch.setattr(causes, "RULES", (FAKE_CAUSE, *causes.RULES))
    after = _report(name)

    cause = after["diagnosis"]["causes"][0]
    assert after["diagnosis"]["primary"] == "fake_cause"
    # The row's cost and fixed phase, not the function's.
    assert (cause["id"], cause["cost"], cause["phase"]) == ("fake_cause", "the fake cost", "backward")
    # Not of the batch: no smaller-batch advice beside it.
    assert "smaller_batch" not in {s["id"] for s in after["suggestions"]}
    # It grows: no setting still claims to avoid the OOM, and the ranked settings say the run dies later.
    settings = [s for s in after["suggestions"] if str(s["config"]).startswith("PYTORCH_CUDA_ALLOC_CONF=")]
    assert settings and all(s["avoids_oom"] is False for s in settings)
    none_rows = [r for r in after["ranked"] if r["cost"] == "none"]
    assert none_rows and all(r["run_completes"] is False and r["run_note"] == cause["settings"] for r in none_rows)
    assert after["decision"]["cause"] == "fake_cause"
    assert after["decision"]["change"]["line"] == "fake()"


def test_a_cause_row_with_an_unknown_phase_fails() -> None:
    with pytest.raises(ValueError, match="phase 'lunch'"):
        replace(FAKE_CAUSE, phase="lunch")
