"""Import rules written as tests (Bokeh's tests/codebase style).

- Every ``analysis`` module imports in a fresh interpreter without pulling in Django,
  Celery, Bokeh or torch.
- The package ``webapp.snapshots.pages.charts`` holds the only webapp modules that import bokeh.
- The worker's child process entry point loads no Django or Celery.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN_IN_ANALYSIS = ("django", "celery", "kombu", "bokeh", "torch", "redis")


def modules_of(package: str) -> list[str]:
    base = ROOT / package
    names = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if "migrations" in parts:
            continue
        names.append(".".join(parts))
    return names


def loaded_after_import(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


ANALYSIS_MODULES = modules_of("analysis")


def test_analysis_modules_found() -> None:
    assert {"analysis", "analysis.reader", "analysis.model", "analysis.report"} <= set(ANALYSIS_MODULES)


@pytest.mark.parametrize("module", ANALYSIS_MODULES)
def test_analysis_module_imports_no_framework(module: str) -> None:
    loaded = loaded_after_import(module)
    leaked = sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN_IN_ANALYSIS)
    assert not leaked, f"{module} pulls in {leaked[:5]}"


def test_worker_child_entry_point_loads_no_django_or_celery() -> None:
    loaded = loaded_after_import("webapp.snapshots.worker.child")
    assert not sorted(m for m in loaded if m.split(".")[0] in ("django", "celery", "kombu", "bokeh"))


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


CHARTS = "webapp/snapshots/pages/charts/"


def test_only_the_charts_package_imports_bokeh() -> None:
    importers = sorted(
        path.relative_to(ROOT).as_posix() for path in (ROOT / "webapp").rglob("*.py") if "bokeh" in imports_of(path)
    )
    assert [p for p in importers if not p.startswith(CHARTS)] == []
    assert f"{CHARTS}common.py" in importers  # the walk sees the package's own imports


def test_analysis_source_never_names_a_framework() -> None:
    """The static twin of the subprocess test: also catches imports inside functions."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(imports_of(path) & set(FORBIDDEN_IN_ANALYSIS))
        for path in (ROOT / "analysis").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
