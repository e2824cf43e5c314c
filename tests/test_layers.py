"""The layers inside ``analysis/``, as tests: the allocator package never imports upward.

Base modules (the model, its errors, the allocator's configuration and step windows) import nothing
of the analyses; ``analysis.allocator`` imports only itself and the base; every import is counted,
the ones inside functions too (a lazy import is still a dependency), and the allocator package has
none at all.
"""

from __future__ import annotations

import ast
import re
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


# -- webapp/ and client/ (issue 31 items 4 and 5) ------------------------------------------------------
#
# webapp/ stands on floors, written down once, in docs/architecture.md ("webapp/ in layers"): each
# module of webapp/ (a package, ``teams/``, stands for all of its modules) on one floor, and an import
# goes to the same floor or one below, never up, and never round in a circle.
WEB_PACKAGES = ("webapp", "client/oomscope_client")
# models.py imports nothing above it (its signal receiver went to signals.py); the list may not grow.
KNOWN_UPWARD_FROM_MODELS: set[str] = set()
# The two package roots: no floor, and nothing in them.
WEB_ROOTS = {"webapp", "webapp.snapshots"}
ARCHITECTURE = ROOT / "docs" / "architecture.md"
FLOOR_ROW = re.compile(r"^\| (\d+) \| [^|]+ \| (.+) \|$")


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
    # A module's own package is imported before it anyway: no edge back up to it; and ``from pkg import
    # mod`` is an arrow to ``pkg.mod``, not to the package as well.
    graph = {}
    for name, path in files.items():
        targets = web_imports(path) & set(files)
        graph[name] = {
            m for m in targets if not name.startswith(m + ".") and not any(t.startswith(m + ".") for t in targets)
        } - {name}
    return graph


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


def test_only_the_charts_package_imports_bokeh() -> None:
    found = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "webapp").rglob("*.py")
        if any(m.split(".")[0] == "bokeh" for m in web_imports(p))
    }
    assert {p for p in found if not p.startswith("webapp/snapshots/pages/charts/")} == set()
    assert "webapp/snapshots/pages/charts/common.py" in found  # the walk sees the package's own imports


def test_the_charts_rooms_stand_on_common_alone() -> None:
    """Each room of the charts package (a chart family) imports only ``common`` of the package, and ``common``
    none of it; only ``__init__`` gathers the rooms (its docstring says so)."""
    package = "webapp.snapshots.pages.charts."
    rooms = {
        p.stem: {m.removeprefix(package).split(".")[0] for m in web_imports(p) if m.startswith(package)}
        for p in sorted((ROOT / "webapp" / "snapshots" / "pages" / "charts").glob("*.py"))
        if p.stem != "__init__"
    }
    assert {"common", "timeline", "compare"} <= set(rooms)
    assert {room: used for room, used in rooms.items() if used - ({"common"} if room != "common" else set())} == {}


def test_the_models_import_nothing_above_them_but_the_known_list() -> None:
    above = web_graph()["webapp.snapshots.models"]
    assert above <= KNOWN_UPWARD_FROM_MODELS, f"models.py imports {sorted(above - KNOWN_UPWARD_FROM_MODELS)}"
    assert above >= KNOWN_UPWARD_FROM_MODELS, "fixed: take it off KNOWN_UPWARD_FROM_MODELS"


def documented_floors(doc: str) -> dict[str, int]:
    """docs/architecture.md's floors of webapp/: a module (``models``, ``webapp.health``) or a package
    (``teams/``) of ``webapp.snapshots`` -> its floor, from the table of "webapp/ in layers"."""
    section = doc.split("### webapp/ in layers", 1)[1].split("\n#", 1)[0]
    floors: dict[str, int] = {}
    for line in section.splitlines():
        row = FLOOR_ROW.match(line.strip())
        if row:
            floors.update((name, int(row.group(1))) for name in re.findall(r"`([\w./]+)`", row.group(2)))
    return floors


def floor_of(module: str, floors: dict[str, int]) -> int | None:
    short = module.removeprefix("webapp.snapshots.")
    package = short.split(".")[0] + "/"
    return floors.get(package, floors.get(short))


def web_side(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: {t for t in to if t.startswith("webapp")} for m, to in graph.items() if m.startswith("webapp")}


def test_every_module_of_webapp_stands_on_a_documented_floor() -> None:
    graph = web_side(web_graph())
    floors = documented_floors(ARCHITECTURE.read_text())
    assert not any(graph[root] for root in WEB_ROOTS), "the package roots import nothing"
    unplaced = sorted(m for m in graph if m not in WEB_ROOTS and floor_of(m, floors) is None)
    assert not unplaced, f"put them on a floor in docs/architecture.md, 'webapp/ in layers': {unplaced}"
    named = {n.rstrip("/") if n.endswith("/") else n for n in floors}
    shorts = {m.removeprefix("webapp.snapshots.") for m in graph}
    assert named <= shorts, f"the doc's floors name modules that are gone: {sorted(named - shorts)}"


def arrows_up(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    return sorted(
        f"{a} ({floor_of(a, floors)}) -> {b} ({floor_of(b, floors)})"
        for a, targets in graph.items()
        for b in targets
        if a not in WEB_ROOTS and (floor_of(b, floors) or 0) > (floor_of(a, floors) or 0)
    )


def test_no_import_goes_up_a_floor() -> None:
    floors = documented_floors(ARCHITECTURE.read_text())
    assert arrows_up(web_side(web_graph()), floors) == []


def test_the_floor_check_sees_an_arrow_up() -> None:
    floors = documented_floors(ARCHITECTURE.read_text())
    assert floors["models"] == 0 and floors["worker/"] > floors["intake/"]
    graph = {"webapp.snapshots.models": {"webapp.snapshots.worker.tasks"}, "webapp.snapshots.worker.tasks": set()}
    assert arrows_up(graph, floors) == [
        f"webapp.snapshots.models (0) -> webapp.snapshots.worker.tasks ({floors['worker/']})"
    ]


def test_no_import_circle_in_webapp_or_the_client() -> None:
    assert circles(web_graph()) == []


def test_the_circle_finder_sees_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [{"a", "b", "c"}]


# -- what holds the floors apart (issue 31 item 4): one root for user errors, one queue publisher ----
#
# Read with ``ast``. Failures that are not the user's keep their own classes: a webhook that did not go
# through, the analysis child's crash or kill (``ChildRefused`` is the analysis' ``SnapshotError``), a
# result parked for later.
NOT_USER_ERRORS = {"WebhookError", "ChildCrashed", "ChildKilled", "ChildRefused", "ResultParked"}
SNAPSHOTS = ROOT / "webapp" / "snapshots"
# The worker's own tasks may re-queue the task they run (a deferral, the sweep, the backfill).
PUBLISHERS = {"publish.py", "worker/tasks.py", "worker/runtasks.py"}


def exception_classes(path: Path) -> dict[str, list[str]]:
    """Class -> its bases' names, for the classes a file defines whose name says error or refusal or
    whose bases include an exception."""
    out: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            bases = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
            if "Schema" in bases:  # an API document's shape (api/schemas.py), not an exception
                continue
            if any(b.endswith(("Exception", "Error", "Exceeded")) for b in bases) or node.name.endswith("Error"):
                out[node.name] = bases
    return out


def test_every_user_error_is_defined_in_errors_py_under_one_root() -> None:
    errors = exception_classes(SNAPSHOTS / "errors.py")
    assert errors.pop("UserError") == ["Exception"]
    roots = {name: bases for name, bases in errors.items() if "UserError" in bases}
    # Each one is a UserError, directly or through another of the module (IntakeError < LimitExceeded).
    assert all(set(bases) <= set(errors) | {"UserError"} for bases in errors.values()), errors
    assert {"LimitExceeded", "TeamError", "ProjectRefused", "ExploreError", "Refusal"} <= set(roots)
    elsewhere = {
        f"{p.relative_to(SNAPSHOTS)}::{name}"
        for p in sorted(SNAPSHOTS.rglob("*.py"))
        if p.name != "errors.py" and "migrations" not in p.parts
        for name in exception_classes(p)
        if name not in NOT_USER_ERRORS
    }
    assert not elsewhere, f"a user error belongs in errors.py, under UserError: {sorted(elsewhere)}"


def publishes(path: Path) -> list[str]:
    """The calls of a file that put a message on the queue."""
    return [
        ast.unparse(node.func)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"delay", "apply_async", "send_task", "delay_on_commit"}
    ]


def test_only_publish_py_puts_messages_on_the_queue() -> None:
    found = {
        p.relative_to(SNAPSHOTS).as_posix(): publishes(p)
        for p in sorted(SNAPSHOTS.rglob("*.py"))
        if "migrations" not in p.parts and publishes(p)
    }
    assert set(found) <= PUBLISHERS, {f: calls for f, calls in found.items() if f not in PUBLISHERS}
    assert "publish.py" in found


def test_the_publisher_check_sees_a_publish(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from x import t\n\ndef f():\n    t.delay(1)\n    t.apply_async((1,))\n")
    assert publishes(probe) == ["t.delay", "t.apply_async"]
