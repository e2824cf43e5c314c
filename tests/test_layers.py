"""The layers inside ``analysis/``, as tests: the allocator package never imports upward.

Base modules (the model, its errors, the allocator's configuration and step windows) import nothing
of the analyses; ``analysis.allocator`` imports only itself and the base; every import is counted,
the ones inside functions too (a lazy import is still a dependency), and the allocator package has
none at all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE = frozenset({"analysis.model", "analysis.errors", "analysis.allocator.config", "analysis.steps"})


def imported(path: Path) -> set[str]:
    """Every ``analysis`` module a file imports, at any depth of its code."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return {m for m in out if m == "analysis" or m.startswith("analysis.")}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


ALLOCATOR = sorted((ROOT / "analysis" / "allocator").glob("*.py"))


@pytest.mark.parametrize("path", ALLOCATOR, ids=lambda p: p.name)
def test_the_allocator_package_never_imports_upward(path: Path) -> None:
    upward = {m for m in imported(path) if not m.startswith("analysis.allocator") and m not in BASE}
    assert not upward, f"{module_name(path)} imports {sorted(upward)}: above the allocator package"


@pytest.mark.parametrize("name", sorted(BASE))
def test_base_modules_import_only_the_base(name: str) -> None:
    path = ROOT / (name.replace(".", "/") + ".py")
    above = {m for m in imported(path) if m not in BASE and not m.startswith("analysis.allocator.config")}
    assert not above, f"{name} imports {sorted(above)}"


def lazy_imports(path: Path) -> list[str]:
    """``analysis`` modules a file imports inside a function body."""
    out: list[str] = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("analysis"):
                    out.append(node.module)
    return out


@pytest.mark.parametrize("path", ALLOCATOR, ids=lambda p: p.name)
def test_the_allocator_package_has_no_lazy_imports(path: Path) -> None:
    """What a rule of the model needs is passed down (the recorded replay: ``recording.ReplaySource``
    through ``Requests``), never built behind an import inside a function (issue 17)."""
    assert not lazy_imports(path), f"{module_name(path)} imports {lazy_imports(path)} inside a function"


def test_the_rule_sees_lazy_imports(tmp_path: Path) -> None:
    """The walk must find an import inside a function: a rule that only read the top would pass anything."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from analysis.report import build_report\n")
    assert imported(probe) == {"analysis.report"}
    assert lazy_imports(probe) == ["analysis.report"]
