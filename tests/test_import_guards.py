"""No ``except ImportError`` (nor ``except Exception``) around our own modules (issue 17, item 6; issue 31).

A guard around ``webapp.snapshots.pages.charts`` or ``analysis.reader`` turned a broken install into pages
without charts, or an upload sniffed by half its rules, and no error anywhere. Our modules are part
of the repository: importing them either works or must fail loudly. The two exceptions are the
compiled extensions, which a machine without a compiler does not build: the compiled reader
(docs/reader.md; the reference reader then reads every file) and the compiled replay loops
(``analysis.allocator.compiled``; the Python loops, the reference, then run).

A broader handler hides a broken import just as well: ``except Exception`` (or ``BaseException``, or
a bare ``except``) and ``contextlib.suppress`` of any of these count as guards too (the charts'
import in the analysis child was one, issue 31).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OURS = ("analysis", "webapp", "oomscope_client")
# Built by `make install`, absent without a compiler.
ALLOWED = {
    ("analysis/fastread.py", "analysis._snapread"),
    ("analysis/allocator/compiled.py", "analysis.allocator._replaycore"),
    # The client on a training machine: the analysis library only where the repository is installed
    # beside it (the job log's verdict made there; else the site's).
    ("client/oomscope_client/joblog.py", "analysis.report.build_report"),
}


# Exceptions an import error is one of: a handler of any of them swallows a broken import.
CATCHES_IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError", "Exception", "BaseException")


def _names(node: ast.expr | None) -> list[ast.expr]:
    return list(node.elts) if isinstance(node, ast.Tuple) else [node] if node is not None else []


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:  # a bare except
        return True
    return any(isinstance(n, ast.Name) and n.id in CATCHES_IMPORT_ERRORS for n in _names(handler.type))


def _suppresses_import_error(item: ast.withitem) -> bool:
    """``with contextlib.suppress(...)`` (or a bare ``suppress``) of an exception an import error is."""
    call = item.context_expr
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name == "suppress" and any(isinstance(a, ast.Name) and a.id in CATCHES_IMPORT_ERRORS for a in call.args)


def _imported(body: list[ast.stmt]) -> set[str]:
    found: set[str] = set()
    for node in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def guarded_imports(path: Path) -> set[str]:
    """The modules of ours that ``path`` imports under an ``except ImportError``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        guarded = (isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers)) or (
            isinstance(node, ast.With) and any(_suppresses_import_error(item) for item in node.items)
        )
        if guarded:
            out.update(name for name in _imported(node.body) if name.split(".")[0] in OURS)
    return out


def test_no_module_of_ours_is_imported_under_an_import_error_guard() -> None:
    found = {
        (path.relative_to(ROOT).as_posix(), name)
        for package in ("analysis", "webapp", "client")
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in guarded_imports(path)
    }
    assert found == ALLOWED


def test_the_check_sees_a_guard(tmp_path: Path) -> None:
    guarded = tmp_path / "views.py"
    guarded.write_text(
        "try:\n    from webapp.snapshots.pages import charts\nexcept (ImportError, ValueError):\n    charts = None\n"
    )
    assert guarded_imports(guarded) == {"webapp.snapshots.pages.charts"}
    broad = tmp_path / "child.py"
    broad.write_text(
        "def charts():\n    try:\n        from webapp.snapshots.pages.charts import build_charts\n"
        "    except Exception:\n        return {}\n"
    )
    assert guarded_imports(broad) == {"webapp.snapshots.pages.charts.build_charts"}
    bare = tmp_path / "bare.py"
    bare.write_text("try:\n    import analysis.reader\nexcept:\n    pass\n")
    assert guarded_imports(bare) == {"analysis.reader"}
    suppressed = tmp_path / "thread.py"
    suppressed.write_text(
        "import contextlib\nwith contextlib.suppress(Exception):\n    import webapp.snapshots.pages.charts\n"
    )
    assert guarded_imports(suppressed) == {"webapp.snapshots.pages.charts"}
    plain = tmp_path / "other.py"
    plain.write_text("try:\n    import numpy\nexcept ImportError:\n    numpy = None\n")
    assert guarded_imports(plain) == set()
