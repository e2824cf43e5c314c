"""analysis.contract: every report, of the current shape and of the older ones ``stored.upgrade`` reads, read
once into the typed contract object (``stored.load``), each typed field holding what its key holds.

The reports are the real ones of the fixture snapshots; the older shapes are made from them by taking away
what those reports lacked (as tests/analysis/test_stored.py does), then loaded as a page would load them.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from analysis import contract, readout
from analysis.contract import Device, Report, Section
from analysis.report import build_report
from analysis.stored import load, upgrade

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# The top-level fixtures (each a different capture: OOMs of every kind, no OOM, no history, no frames) and
# the diagnosis fixtures' programs under a cap, so what-ifs, ledgers, plateaus and ranked changes all occur.
# (The first six by name of scripts/capture_diagnosis.py's, not issue 37's fw_* that sort among them.)
SNAPSHOTS = (
    sorted(FIXTURES.glob("*.pickle.gz"))
    + [p for p in sorted((FIXTURES / "diagnosis").glob("*_default.pickle.gz")) if not p.name.startswith("fw_")][:6]
)


@pytest.fixture(scope="module")
def reports() -> dict[str, dict[str, Any]]:
    return {path.name: build_report(path, jobs=1) for path in SNAPSHOTS}


def _first_shape(report: dict[str, Any]) -> dict[str, Any]:
    """The oldest stored shape: the inference as ``limit_source``, no limit, decision, run verdict, ledger
    or doctor (what ``stored.upgrade`` fills in, or a reader tolerates missing)."""
    old = copy.deepcopy(report)
    for dev in old["devices"]:
        for key in ("decision", "limit", "ledger", "plateau", "edge_of_cap"):
            dev.pop(key, None)
        oom = dev.get("oom")
        if oom:
            if oom["limit_source"] == "inferred":
                oom["limit_source"] = oom.pop("limit_inference")
                del oom["limit_is_lower_bound"]
            for key in ("limit_kind", "run_verdict", "run_verdict_basis", "request_verdict"):
                oom.pop(key, None)
    del old["capture"]["doctor"]
    return old


def _check(typed: Section, data: Mapping[str, Any], path: str) -> int:
    """Each field of ``typed`` against its key in ``data``; the number of keys compared."""
    compared = 0
    for field in dataclasses.fields(typed):  # type: ignore[arg-type]
        value = getattr(typed, field.name)
        if field.name == "data":
            assert value == data, path
            continue
        names = (field.name, *type(typed).FALLBACK.get(field.name, ()))
        key = next((name for name in names if name in data), field.name)
        stored = data.get(key)
        where = f"{path}.{field.name}"
        if isinstance(value, Section):
            compared += _check(value, stored, where)
        elif isinstance(value, tuple):
            items = [item for item in stored or [] if isinstance(item, Mapping)]
            assert len(value) == len(items), where
            for i, (v, item) in enumerate(zip(value, items, strict=True)):
                assert isinstance(v, Section) or v == item, f"{where}[{i}]"  # a block, kept as stored
                compared += _check(v, item, f"{where}[{i}]") if isinstance(v, Section) else 1
        elif isinstance(value, Mapping) and any(isinstance(v, Section) for v in value.values()):
            assert set(value) == {k for k, v in stored.items() if v}, where  # the segment maps, by moment
            compared += sum(_check(v, stored[k], f"{where}.{k}") for k, v in value.items())
        elif isinstance(value, Mapping):
            assert value == (stored or {}), where
            compared += 1
        elif value is None and not isinstance(stored, Mapping | type(None)):
            raise AssertionError(f"{where}: None for a stored {stored!r}")
        else:
            assert value == (stored or None if isinstance(stored, Mapping) else stored), where
            compared += 1
    return compared


@pytest.mark.parametrize("shape", ["current", "first"])
def test_every_fixture_report_reads_into_the_contract_object_key_for_key(
    reports: dict[str, dict[str, Any]], shape: str
) -> None:
    for name, built in reports.items():
        data = copy.deepcopy(built) if shape == "current" else _first_shape(built)
        typed = load(data)
        assert isinstance(typed, Report) and typed.data == data  # load upgraded ``data`` in place
        assert _check(typed, data, name) > 20
        assert len(typed.devices) == len(data["devices"]) >= 1
        for dev in typed.devices:
            assert dev.limit is None or dev.limit.bytes == (dev.oom.limit_bytes if dev.oom else dev.limit.bytes)
            assert dev.decision is not None and dev.decision.headline  # upgrade decided an old report


def test_an_old_report_reads_as_the_current_one_after_load(reports: dict[str, dict[str, Any]]) -> None:
    """What the old shape lacked and ``stored.upgrade`` computes comes back equal; the run's verdict of a report
    from before issue 32 falls back to its ``verdict`` (``contract.Oom.FALLBACK``)."""
    oom_reports = 0
    for built in reports.values():
        now, old = load(copy.deepcopy(built)), load(_first_shape(built))
        for dev_now, dev_old in zip(now.devices, old.devices, strict=True):
            assert dev_old.summary == dev_now.summary
            # The limit is rebuilt from the OOM's keys (its stored ``limit_source`` kept), and reads the same.
            assert (dev_old.limit is None) == (dev_now.limit is None)
            if dev_old.limit is not None and dev_now.limit is not None:
                assert (dev_old.limit.bytes, dev_old.limit.is_lower_bound) == (
                    dev_now.limit.bytes,
                    dev_now.limit.is_lower_bound,
                )
                assert readout.basis(dev_old) == readout.basis(dev_now)
            assert dev_old.whatif == dev_now.whatif and dev_old.top_stacks == dev_now.top_stacks
            assert dev_old.decision is not None and dev_now.decision is not None
            assert dev_old.decision.change == dev_now.decision.change
            if dev_now.oom is not None:
                oom_reports += 1
                assert dev_old.oom is not None and dev_old.oom.run_verdict is not None
                assert dev_old.oom.limit_is_lower_bound == dev_now.oom.limit_is_lower_bound
    assert oom_reports >= 15


def test_a_report_without_its_data_still_reads(reports: dict[str, dict[str, Any]]) -> None:
    """A torn or hand-made report: no devices, sections of the wrong type, items that are not objects."""
    bare = contract.Report.from_json({"devices": [{"oom": {}, "summary": None, "whatif": [1, {"config": "x"}]}, 3]})
    (dev,) = bare.devices
    assert dev.oom is None and dev.summary.peak_reserved_bytes is None and [w.config for w in dev.whatif] == ["x"]
    assert bare.capture.allocator_settings == {} and bare.source is None
    assert contract.main_device(contract.Report.from_json({})) is None


def test_every_typed_field_is_a_key_the_report_writes(reports: dict[str, dict[str, Any]]) -> None:
    """A typed field is named as its key: each one occurs in the fixture reports (a misspelt field would
    read None everywhere and no reader would notice)."""
    seen: dict[type, set[str]] = {}

    def walk(typed: Section, data: Mapping[str, Any]) -> None:
        seen.setdefault(type(typed), set()).update(data)
        for field in dataclasses.fields(typed):  # type: ignore[arg-type]
            value = getattr(typed, field.name)
            if isinstance(value, Section):
                walk(value, data[field.name])
            elif isinstance(value, tuple):
                items = [i for i in data.get(field.name) or [] if isinstance(i, Mapping)]
                for v, item in zip(value, items, strict=True):
                    if isinstance(v, Section):
                        walk(v, item)
            elif isinstance(value, Mapping):
                for moment, v in value.items():
                    if isinstance(v, Section):
                        walk(v, data[field.name][moment])

    for built in reports.values():
        walk(load(copy.deepcopy(built)), built)
    for cls, keys in seen.items():
        names = {f.name for f in dataclasses.fields(cls)} - {"data"}  # type: ignore[arg-type]
        assert names <= keys, f"{cls.__name__}: {sorted(names - keys)} never in a report"
    assert {Device, contract.Ledger, contract.WhatIf, contract.SegmentMap, contract.Segment, contract.Timeline} <= set(
        seen
    )


def test_the_typed_report_is_read_only(reports: dict[str, dict[str, Any]]) -> None:
    typed = load(copy.deepcopy(next(iter(reports.values()))))
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.devices[0].summary.peak_reserved_bytes = 0  # type: ignore[misc]
    with pytest.raises(TypeError):
        typed.data["devices"] = []  # type: ignore[index]
    assert upgrade(dict(typed.data)) is not None
