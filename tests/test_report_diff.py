"""scripts/report_diff.py: the refactor check finds a changed value, a vanished key and an
unplanned added key in real reports, and passes two writes of the same code."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("report_diff", ROOT / "scripts" / "report_diff.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _two_fixtures(tmp_path: Path) -> Path:
    folder = tmp_path / "fixtures"
    folder.mkdir()
    for name in ("frag_oom.pickle.gz", "infer_varbatch.pickle.gz"):
        shutil.copy(FIXTURES / name, folder / name)
    return folder


def _edit(path: Path, change) -> None:  # type: ignore[no-untyped-def]
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        report = json.load(fh)
    change(report)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump(report, fh)


def test_same_code_same_reports_and_every_kind_of_difference_found(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rd = _script()
    folder = _two_fixtures(tmp_path)
    assert rd.write(folder, tmp_path / "a", jobs=1) == 0
    assert rd.write(folder, tmp_path / "b", jobs=1) == 0
    assert rd.compare(tmp_path / "a", tmp_path / "b", [], 8) == 0
    assert "2 reports: 2 the same, 0 changed" in capsys.readouterr().out

    frag = tmp_path / "b" / "frag_oom.pickle.gz.json.gz"
    with gzip.open(frag, "rt", encoding="utf-8") as fh:
        peak = json.load(fh)["devices"][0]["summary"]["peak_reserved_bytes"]
    assert peak > 0  # a real figure from the real file

    _edit(frag, lambda r: r["devices"][0].__setitem__("stage_note", "new"))
    assert rd.compare(tmp_path / "a", tmp_path / "b", [], 8) == 1
    assert "ADDED, not allowed: devices.*.stage_note" in capsys.readouterr().out
    assert rd.compare(tmp_path / "a", tmp_path / "b", ["devices.*.stage_note"], 8) == 0
    assert "added on purpose: devices.*.stage_note (in 1 reports)" in capsys.readouterr().out

    _edit(frag, lambda r: r["devices"][0]["summary"].__setitem__("peak_reserved_bytes", peak + 1))
    assert rd.compare(tmp_path / "a", tmp_path / "b", ["devices.*.stage_note"], 8) == 1
    assert f"devices.0.summary.peak_reserved_bytes: {peak} -> {peak + 1}" in capsys.readouterr().out

    _edit(frag, lambda r: r["devices"][0].pop("decision"))
    assert rd.compare(tmp_path / "a", tmp_path / "b", ["devices.*.stage_note"], 8) == 1
    assert "devices.0.decision (gone)" in capsys.readouterr().out
