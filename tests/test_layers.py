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


# -- webapp/ and client/ (issue 31 item 5) ---------------------------------------------------------
#
# What they found when they were written down, held as known lists that may only shrink: the web
# side's layout is issue 31 item 4's (a split into layers), and each entry fixed leaves its list.
WEB_PACKAGES = ("webapp", "client/oomscope_client")
# models.py imports nothing above it (its signal receiver went to signals.py); the list may not grow.
KNOWN_UPWARD_FROM_MODELS: set[str] = set()
# One import circle of 7 modules (the services hub and everything that calls it and that it calls); 11
# before models.py's receiver moved to signals.py.
KNOWN_CIRCLE = {
    f"webapp.snapshots.{m}"
    for m in [
        "cost",
        "intake",
        "runarchive",
        "runs",
        "runtasks",
        "services",
        "tasks",
    ]
}


def web_module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts = parts[1:] if parts[0] == "client" else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def web_imports(path: Path) -> set[str]:
    """Every module name a web or client file imports, at any depth, relative imports resolved; a
    ``from package import name`` counts ``package.name`` too (it may be a module)."""
    name = web_module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def web_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of webapp/ and the client it imports."""
    files = {
        web_module_name(p): p
        for package in WEB_PACKAGES
        for p in sorted((root / package).rglob("*.py"))
        if "migrations" not in p.parts
    }
    # A module's own package is imported before it anyway: no edge back up to it.
    return {
        name: {m for m in web_imports(path) & set(files) if not name.startswith(m + ".")} - {name}
        for name, path in files.items()
    }


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import circles: strongly connected parts of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while not part or w != v:
                w = stack.pop()
                part.add(w)
            if len(part) > 1:
                out.append(part)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_client_imports_only_itself_the_standard_library_and_torch() -> None:
    """And the analysis library in one place: the job log's verdict where the repository is installed
    beside the client (``joblog.py``, under its ``ImportError``; tests/test_import_guards.py)."""
    import sys

    found = {
        (p.name, m.split(".")[0]) for p in (ROOT / "client" / "oomscope_client").rglob("*.py") for m in web_imports(p)
    }
    allowed = set(sys.stdlib_module_names) | {"oomscope_client", "torch"}
    assert {(f, m) for f, m in found if m not in allowed} <= {("joblog.py", "analysis")}


def test_only_the_charts_module_imports_bokeh() -> None:
    found = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "webapp").rglob("*.py")
        if any(m.split(".")[0] == "bokeh" for m in web_imports(p))
    }
    assert found == {"webapp/snapshots/charts.py"}


def test_the_models_import_nothing_above_them_but_the_known_list() -> None:
    above = web_graph()["webapp.snapshots.models"]
    assert above <= KNOWN_UPWARD_FROM_MODELS, f"models.py imports {sorted(above - KNOWN_UPWARD_FROM_MODELS)}"
    assert above >= KNOWN_UPWARD_FROM_MODELS, "fixed: take it off KNOWN_UPWARD_FROM_MODELS"


def test_no_import_circle_but_the_known_one_and_it_does_not_grow() -> None:
    found = circles(web_graph())
    assert all(part <= KNOWN_CIRCLE for part in found), [sorted(p - KNOWN_CIRCLE) for p in found]
    left = set().union(*found) if found else set()
    assert left == KNOWN_CIRCLE, f"out of the circle now, take them off KNOWN_CIRCLE: {sorted(KNOWN_CIRCLE - left)}"


def test_the_circle_finder_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [{"a", "b", "c"}]
