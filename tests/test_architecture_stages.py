"""The report's layout, as tests (issue 31): ``analysis/report.py`` only wires the stages of
``analysis/stages/`` (a bounded length and a bounded number of the package's modules imported), and the
stages are a layer: they never import the report, and the analyses below them never import a stage."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "analysis" / "report.py"
STAGES = sorted((ROOT / "analysis" / "stages").glob("*.py"))
# Issue 31: report.py had grown to 1,771 lines importing 20 of the package's modules.
REPORT_MAX_LINES = 600
REPORT_MAX_SIBLING_IMPORTS = 10
# Above the stages: the report that wires them, the package's front door and the command line.
ABOVE_STAGES = {"report.py", "__init__.py", "__main__.py"}


def _is_module(dotted: str, root: Path) -> bool:
    path = root / Path(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def package_modules_imported(path: Path, root: Path = ROOT) -> set[str]:
    """The ``analysis`` modules a file imports, at any depth of its code: ``from analysis.stages import
    outline, whatifs`` is two (each a module), ``from analysis.model import OOM`` one (``analysis.model``);
    a relative import is resolved against the file's package."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if _is_module(full, root) else base)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m.startswith("analysis.")}


def test_report_py_only_wires_the_stages() -> None:
    lines = len(REPORT.read_text().splitlines())
    assert lines <= REPORT_MAX_LINES, f"analysis/report.py has {lines} lines: move the work into a stage"
    imported = package_modules_imported(REPORT)
    assert len(imported) <= REPORT_MAX_SIBLING_IMPORTS, sorted(imported)
    assert all(m.startswith("analysis.stages.") for m in imported), sorted(imported)


def test_the_stages_never_import_the_report() -> None:
    assert len(STAGES) >= 8  # source, outline, what-ifs, attribution, diagnosis, workload, segment maps, ...
    upward = {p.name: m for p in STAGES for m in package_modules_imported(p) if m == "analysis.report"}
    assert upward == {}


def test_the_analyses_below_never_import_a_stage() -> None:
    below = [p for p in sorted((ROOT / "analysis").rglob("*.py")) if "stages" not in p.relative_to(ROOT).parts]
    below = [p for p in below if not (p.parent.name == "analysis" and p.name in ABOVE_STAGES)]
    assert len(below) > 30
    upward = {
        p.relative_to(ROOT).as_posix(): sorted(
            m for m in package_modules_imported(p) if m.startswith("analysis.stages")
        )
        for p in below
    }
    assert {k: v for k, v in upward.items() if v} == {}


def test_the_import_count_sees_each_module_of_a_from_import(tmp_path: Path) -> None:
    for name in ("outline", "whatifs", "serialise"):
        (tmp_path / "analysis" / "stages").mkdir(parents=True, exist_ok=True)
        (tmp_path / "analysis" / "stages" / f"{name}.py").write_text("")
    (tmp_path / "analysis" / "model.py").write_text("OOM = 1\n")
    (tmp_path / "analysis" / "report.py").write_text("")
    probe = tmp_path / "analysis" / "stages" / "probe.py"
    probe.write_text(
        "from analysis.stages import outline, whatifs\nfrom analysis.model import OOM\n"
        "from . import serialise\ndef f():\n    from analysis import report\n"
    )
    assert package_modules_imported(probe, tmp_path) == {
        "analysis.stages.outline",
        "analysis.stages.whatifs",
        "analysis.model",
        "analysis.stages.serialise",
        "analysis.report",
    }


def test_the_stages_results_are_frozen_dataclasses() -> None:
    """Each stage hands the next a frozen result: every dataclass a stage module defines is frozen."""
    found = []
    for path in STAGES:
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            for dec in node.decorator_list:
                call = dec if isinstance(dec, ast.Call) else None
                name = ast.unparse(call.func if call else dec)
                if name == "dataclass":
                    frozen = call is not None and any(
                        k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
                        for k in call.keywords
                    )
                    found.append((f"{path.name}::{node.name}", frozen))
    assert len(found) >= 12  # Outline, Facts, Started, Recorded, Explained, Attribution, WhatIfs, ...
    assert [name for name, frozen in found if not frozen] == []
